"""vLLM 0.34's KV cache to the block, worked by hand from extensible_kv_cache.py (`measure_kv_cache_bytes`,
`blocks_within`) and kv_cache_planning.py (the capacity, `finalize_extensible_kv_cache`'s min), on a Llama-3.1-8B-like
layout (32 layers of 8 KV heads of 128, bf16: 64 KiB a layer per block, 2 MiB a block); and what a profile measured
through vLLM 0.34 records for it, and how the cost model's rule takes it. tests/vllm034/test_kv_blocks_034.py holds
the same arithmetic to vLLM's own functions on random layouts."""

from __future__ import annotations

import types

from tuner.engines.engine import KvFacts
from tuner.engines.serving import ServingConfig
from tuner.engines.vllm.v034.engine import Vllm034Engine
from tuner.engines.vllm.v034.kv_layout import KvGeometry, KvLayer, KvLayout
from tuner.engines.vllm.v034.memory import ExtensibleKvRule
from tuner.measure.vllm_engine.worker import extensible_kv_figures

GIB, MIB, KIB = 1 << 30, 1 << 20, 1 << 10
LLAMA = KvLayout(tuple([KvLayer("full", 8, 128, 2)] * 32)).geometry


def _rule(**kw: object) -> ExtensibleKvRule:
    figures = {"total_memory_bytes": 141 * GIB, "gpu_memory_utilization": 1.0, "non_kv_cache_bytes": 20 * GIB,
               "required_kv_bytes": 0, "geometry": LLAMA, "peak_bytes": 6 * GIB, "start_free_bytes": 140 * GIB, **kw}
    return ExtensibleKvRule(**figures)  # type: ignore[arg-type]


def test_the_blocks_kept_after_capture_by_hand():
    assert (LLAMA.pool_bytes_per_block, LLAMA.segment_strides) == (2 * MIB, (64 * KIB,) * 32)
    # held after warm-up = 20 - 6 = 14 GiB, + a 4 GiB pool = 18; margin max(1, 0.75 x 6) = 4.5 GiB;
    # min(141 - 18, 140 - 18 - 4.5) = 117.5 GiB, less max(peak 6, growth 0) = 111.5 GiB = 57,088 blocks of 2 MiB
    assert _rule().measured_bytes(4 * GIB) == int(111.5 * GIB) and _rule().kv_blocks(4 * GIB) == 57_088
    # torch's reserve growth above the peak is kept free instead: 117.5 - 7 = 110.5 GiB = 56,576 blocks
    assert _rule(torch_reserve_growth_bytes=7 * GIB).kv_blocks(4 * GIB) == 56_576
    # the capacity reserved before capture bounds it: (141 x 0.5 - 20) GiB = 25,856 blocks
    assert _rule(gpu_memory_utilization=0.5).kv_blocks(0) == 25_856
    # nothing left: 0 blocks, never a negative KV cache
    assert _rule().measured_bytes(200 * GIB) == 0 and _rule().kv_available_bytes(real_bytes=200 * GIB) == 0
    # the bytes are the blocks': kv_capacity's bytes // (16 x bytes per token) gives the same count back
    assert _rule().kv_available_bytes(real_bytes=4 * GIB) == 57_088 * 2 * MIB


def test_granules_cost_the_blocks_a_segment_does_not_fill():
    # 3 layers of 80 KiB a block; 10 MiB + 1 byte: 42 blocks by bytes (42 x 240 KiB = 9.84 MiB), but each segment
    # rounds 42 x 80 KiB = 3.28 MiB up to 4 MiB (12 MiB in all); 25 blocks (2 MiB each segment, 6 MiB) fit, 26 do not
    g = KvLayout(tuple([KvLayer("full", 10, 128, 2)] * 3)).geometry
    assert g.segment_strides == (80 * KIB,) * 3
    assert g.blocks_within(10 * MIB + 1, 10**6) == 25 and g.physical_bytes_for(26) == 12 * MIB
    assert g.blocks_within(12 * MIB, 10**6) == 51 and g.blocks_within(12 * MIB, 40) == 40


def test_the_real_budget_leaves_the_required_blocks_granules():
    # 64 required blocks map 64 x 64 KiB = 4 MiB in each of 32 segments: 128 MiB of the room
    rule = _rule(required_kv_bytes=64 * 2 * MIB)
    budget = rule.real_budget_bytes()
    assert budget == rule.kv_room_bytes - 128 * MIB
    assert rule.kv_available_bytes(real_bytes=budget) >= rule.required_kv_bytes
    assert rule.kv_available_bytes(real_bytes=budget + 1) < rule.required_kv_bytes


def test_the_utilization_advised_for_a_kv_cache_gives_it_and_a_granule_less_does_not():
    # The utilization the report advises (vLLM's default's KV cache beside the tuned pool) is read back through the
    # rule itself: at it vLLM keeps the blocks; one granule of memory less and it keeps fewer. 3 layers of 80 KiB a
    # block: 26 blocks cost 3 x 4 MiB of granules, not 26 x 240 KiB; held 14 GiB, transient 6 GiB, a 4 GiB pool.
    g = KvLayout(tuple([KvLayer("full", 10, 128, 2)] * 3)).geometry
    rule = _rule(geometry=g)
    kv, real = 26 * g.pool_bytes_per_block, 4 * GIB
    u = rule.utilization_for_kv(kv, real_bytes=real)
    assert u == (12 * MIB + 14 * GIB + 4 * GIB + 6 * GIB) / (141 * GIB)
    assert _rule(geometry=g, gpu_memory_utilization=u).kv_available_bytes(real_bytes=real) >= kv
    less = u - 2 * MIB / (141 * GIB)
    assert _rule(geometry=g, gpu_memory_utilization=less).kv_available_bytes(real_bytes=real) < kv
    # past what the device can give beside its margin (140 GiB free less 4.5 GiB): no utilization does it
    assert rule.utilization_for_kv(120 * GIB, real_bytes=real) == float("inf")
    # a part of a block costs a whole one: 25 blocks and a byte are 26 blocks, two granules a segment, though 25.00001
    # blocks' bytes (2000 KiB a segment) would fit in one
    assert rule.utilization_for_kv(25 * g.pool_bytes_per_block + 1, real_bytes=real) == u
    # a layout with no KV segments (nothing known of it) is priced at the bytes asked for
    bare = _rule(geometry=KvGeometry((), 0))
    assert bare.utilization_for_kv(kv, real_bytes=real) == (kv + 14 * GIB + 4 * GIB + 6 * GIB) / (141 * GIB)


def test_a_profile_measured_through_vllm_034_records_what_its_extensible_cache_sized_from():
    kv = types.SimpleNamespace(segment_strides=[64 * KIB] * 32, buffer=types.SimpleNamespace(granularity=2 * MIB),
                               reserved_headroom_bytes=5 * GIB, torch_reserve_growth_bytes=6 * GIB,
                               capacity_blocks=60_000, num_committed_blocks=55_000)
    tensor = types.SimpleNamespace(size=60_000 * 2 * MIB, host_resident=False)
    runner = types.SimpleNamespace(extensible_kv_cache=kv,
                                   kv_cache_config=types.SimpleNamespace(kv_cache_tensors=[tensor], num_blocks=60_000))
    worker = types.SimpleNamespace(model_runner=runner, init_snapshot=types.SimpleNamespace(free_memory=139 * GIB))
    figures = extensible_kv_figures(worker)
    assert figures is not None and {k: figures[k] for k in (
        "segment_strides", "pool_bytes_per_block", "granule_bytes", "transient_peak_bytes",
        "torch_reserve_growth_bytes", "init_free_memory_bytes")} == {
        "segment_strides": [64 * KIB] * 32, "pool_bytes_per_block": 2 * MIB, "granule_bytes": 2 * MIB,
        "transient_peak_bytes": 5 * GIB, "torch_reserve_growth_bytes": 6 * GIB, "init_free_memory_bytes": 139 * GIB}
    assert extensible_kv_figures(types.SimpleNamespace(model_runner=types.SimpleNamespace())) is None
    # the rule takes them over the workload's layers and the profile's other figures
    engine = Vllm034Engine(ServingConfig(max_num_seqs=8, vllm_version="0.34", gpu_memory_utilization=1.0))
    notes: list[str] = []
    rule = engine.kv_rule(total_memory_bytes=141 * GIB, non_kv_cache_bytes=20 * GIB, weights_bytes=lambda: 0,
                          required_kv_bytes=0, tensor_parallel_size=1, notes=notes, activation_peak_bytes=GIB,
                          kv=KvFacts(((4, 1, 16, 2),), None, None, {**figures, "segment_strides": [32 * KIB] * 64}))
    assert isinstance(rule, ExtensibleKvRule)
    assert rule.geometry == KvGeometry((32 * KIB,) * 64, 2 * MIB)
    assert (rule.peak_bytes, rule.torch_reserve_growth_bytes, rule.start_free_bytes) == (5 * GIB, 6 * GIB, 139 * GIB)
    assert not [n for n in notes if "records no" in n]
    # without them: the workload's layers, and a note for each figure the profile lacks
    notes = []
    rule = engine.kv_rule(total_memory_bytes=141 * GIB, non_kv_cache_bytes=20 * GIB, weights_bytes=lambda: 0,
                          required_kv_bytes=0, tensor_parallel_size=1, notes=notes,
                          kv=KvFacts(((32, 8, 128, 2), (1, 8, 128, 2)), 33 * 2 * 8 * 128 * 2))
    assert rule.geometry == KvGeometry((64 * KIB,) * 33, 33 * 64 * KIB)
    assert sum("records no" in n for n in notes) == 3


def test_an_mla_workload_is_laid_out_as_mla_layers():
    # DeepSeek-V3 (MLA: one latent of kv_lora_rank 512 + rope 64, bf16, whole on every TP rank) and its MTP module:
    # the workload's layer groups say K/V heads, its bytes per token the latent; the geometry must be 62 MLA pages
    # of 16 x 576 x 2 bytes, not the groups' K/V arithmetic.
    from pathlib import Path

    from tuner.workload.spec import load_workload

    w = load_workload(Path(__file__).parents[1] / "workloads" / "mtp1-deepseek-v3-tp8.yaml")
    engine = Vllm034Engine(ServingConfig(max_num_seqs=256))
    got = engine.kv_geometry(KvFacts(w.kv_layer_groups(), w.kv_bytes_per_token()))
    assert got == KvLayout(tuple([KvLayer("mla", 1, 576, 2)] * 62)).geometry
    assert got.pool_bytes_per_block == 62 * 16 * 576 * 2


def test_the_kv_layout_laid_out_from_the_workload_keeps_each_layers_page_and_a_measured_byte_count():
    # Without the engine's own figures the layout comes from the workload's layers: a target of 32 layers (8 heads of
    # 128, bf16: 64 KiB a 16-token page) and a drafter layer of 4 heads of 64 (16 KiB) keep their own pages when the
    # bytes per token are the layers' own; a profile that measured other bytes (an FP8 KV cache: half) pads every
    # layer's page to its share of them.
    engine = Vllm034Engine(ServingConfig(max_num_seqs=8, vllm_version="0.34"))
    own = 2 * (32 * 8 * 128 + 4 * 64) * 2
    g = engine.kv_geometry(KvFacts(((32, 8, 128, 2), (1, 4, 64, 2)), own))
    assert sorted(g.segment_strides) == [16 * KIB] + [64 * KIB] * 32 and g.pool_bytes_per_block == 16 * own
    fp8 = engine.kv_geometry(KvFacts(((32, 8, 128, 2),), 32 * 8 * 128 * 2))
    assert fp8.segment_strides == (32 * KIB,) * 32 and fp8.pool_bytes_per_block == MIB
