"""SGLang and TensorRT-LLM through cgtune's one interface: their lists in token widths, what they really capture,
their dispatch, their memory rule, and the exact solver held to brute force under each."""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/handmade_profiles.py (import-mode=importlib)
from handmade_profiles import MIB, handmade_profile, handmade_workload  # noqa: E402

from test_exact import assert_matches_brute_force  # noqa: E402

from tuner.search.exact import brute_force, exact_solve  # noqa: E402
from tuner.model.costmodel import CostModel  # noqa: E402
from tuner.engines.engine import Speculation  # noqa: E402
from tuner.workload.spec import WorkloadError  # noqa: E402

TRAFFIC = {"requests": {"kind": "uniform", "min": 1, "max": 8}, "mixed_share": 0.2,
           "mixed_tokens": {"kind": "uniform", "min": 1, "max": 32}}


def test_engine_names_map_onto_the_shared_settings():
    wl = handmade_workload(engine="trtllm", max_num_seqs=8, num_speculative_tokens=3, max_num_batched_tokens=64,
                           enable_padding=True, speculative={"method": "mtp"})
    s, e = wl.serving, wl.engine
    assert s.engine == "trtllm" and s.decode_query_len == 4 and e.runner == "v2"
    # TensorRT-LLM's padded default [1, 2, 4, 8, ...] is cut at max_batch_size 8 (and 64 // 4 tokens): 4 graphs,
    # in tokens x 4.
    assert e.runs_as(e.defaults().sizes) == (4, 8, 16, 32)
    with pytest.raises(WorkloadError, match="serving.cudagraph_mode: a vLLM setting"):
        handmade_workload(engine="sglang", cudagraph_mode="FULL")
    with pytest.raises(WorkloadError, match="give max_batch_size or max_num_seqs, not both"):
        from tuner.workload.spec import parse_workload

        parse_workload({"name": "x", "engine": "trtllm", "model": {"preset": "tiny"},
                        "serving": {"max_batch_size": 8, "max_num_seqs": 8},
                        "traffic": {"requests": {"kind": "uniform", "min": 1, "max": 8}}})


def test_sglang_caps_its_list_at_the_request_pool():
    wl = handmade_workload(engine="sglang", max_num_seqs=6, num_speculative_tokens=3,
                           speculative={"method": "eagle"}, gpu_memory_mib=143771, mem_fraction_static=0.8)
    s, e = wl.serving, wl.engine
    assert s.decode_query_len == 4  # speculative_num_draft_tokens = steps + 1 with topk 1
    # A written list above the pool: SGLang drops the sizes above it and appends the pool (6 requests).
    assert e.runs_as([4, 8, 40]) == (4, 8, 24)
    d = e.dispatcher([4, 8, 24])
    assert d.dispatch(12, uniform_decode=True).padded_size == 24
    assert d.dispatch(12, uniform_decode=False).eager  # mixed steps never replay a decode graph


def trtllm_model(tmp_path, *, padding, total=1000 * MIB, **kwargs):
    wl = handmade_workload(engine="trtllm", max_num_seqs=8, num_speculative_tokens=0, max_num_batched_tokens=32,
                           traffic=TRAFFIC, enable_padding=padding)
    return CostModel.from_files(handmade_profile(tmp_path, wl, list(range(1, 33)), total_memory_bytes=total,
                                                 **kwargs), wl)


def test_each_engine_resolves_the_speculative_settings_in_its_own_words():
    # SGLang names MTP NEXTN and at topk 1 forces speculative_num_draft_tokens = steps + 1; above topk 1 the draft
    # tokens are the workload's. TensorRT-LLM names its decoding type, one token more than max_draft_len; vLLM keeps
    # its method and 1 + K.
    sglang = dict(engine="sglang", max_num_seqs=6, gpu_memory_mib=143771)
    assert handmade_workload(**sglang, num_speculative_tokens=3, speculative={"method": "mtp"}).engine.speculation \
        == Speculation("NEXTN", 4)
    assert handmade_workload(**sglang, num_speculative_tokens=3, speculative_eagle_topk=4,
                             speculative_num_draft_tokens=8, speculative={"method": "eagle"}).engine.speculation \
        == Speculation("EAGLE", 8)
    assert handmade_workload(engine="trtllm", num_speculative_tokens=3,
                             speculative={"method": "eagle3"}).engine.speculation == Speculation("Eagle3", 4)
    assert handmade_workload(num_speculative_tokens=2, speculative={"method": "ngram"}).engine.speculation \
        == Speculation("ngram", 3)
    assert handmade_workload(engine="sglang").engine.speculation == Speculation(None, 1)


def test_trtllm_without_padding_replays_only_exact_sizes(tmp_path):
    m = trtllm_model(tmp_path, padding=False)
    assert m.step_latency_ms(5, True, (4, 8)) == pytest.approx(1.05)  # eager: 5 is no graph of its own
    assert m.step_latency_ms(4, True, (4, 8)) == pytest.approx(0.54)
    padded = trtllm_model(tmp_path / "pad", padding=True)
    assert padded.step_latency_ms(5, True, (4, 8)) == pytest.approx(0.58)


def test_trtllm_kv_cache_pays_for_graphs_at_its_fraction(tmp_path):
    m = trtllm_model(tmp_path, padding=True, standalone_bytes=lambda w: 10 * w * MIB, delta_bytes=lambda w: MIB)
    e = m.evaluate((4, 8))
    assert e.graph_memory_bytes == (80 + 1) * MIB
    non_kv = (100 + 50) * MIB
    assert e.kv_available_bytes == int((1000 * MIB - non_kv - 81 * MIB) * 0.9)
    assert m.evaluate(()).kv_available_bytes - e.kv_available_bytes == pytest.approx(0.9 * 81 * MIB, abs=1)
    # A deployment's own kv_cache_config.free_gpu_memory_fraction: KV = (1000 - 150 - 81 MiB) x 0.8.
    wl = handmade_workload(engine="trtllm", max_num_seqs=8, num_speculative_tokens=0, max_num_batched_tokens=32,
                           traffic=TRAFFIC, enable_padding=True, free_gpu_memory_fraction=0.8)
    own = CostModel.from_files(handmade_profile(tmp_path / "own", wl, list(range(1, 33)),
                                                standalone_bytes=lambda w: 10 * w * MIB, delta_bytes=lambda w: MIB), wl)
    assert own.evaluate((4, 8)).kv_available_bytes == int((1000 * MIB - non_kv - 81 * MIB) * 0.8)


def test_sglang_memory_rule_by_hand(tmp_path):
    wl = handmade_workload(engine="sglang", max_num_seqs=8, max_num_batched_tokens=32, traffic=TRAFFIC,
                           mem_fraction_static=0.8)
    m = CostModel.from_files(handmade_profile(tmp_path, wl, list(range(1, 33)), weights_bytes=100 * MIB,
                                              activation_peak_bytes=50 * MIB,
                                              standalone_bytes=lambda w: 10 * w * MIB, delta_bytes=lambda w: MIB), wl)
    e = m.evaluate((4, 8))
    # KV is sized before capture: total x 0.8 - weights; graphs and activations share total x 0.2.
    assert e.kv_available_bytes == int(1000 * MIB * 0.8) - 100 * MIB
    assert e.capture_headroom_bytes == pytest.approx(1000 * MIB * 0.2 - 50 * MIB - 81 * MIB, abs=1)
    assert m.evaluate((16,)).runs_as == (8,)  # above the request pool of 8: SGLang captures the pool instead
    wide = CostModel.from_files(handmade_profile(tmp_path / "wide", wl, list(range(1, 33)), weights_bytes=100 * MIB,
                                                 activation_peak_bytes=50 * MIB,
                                                 standalone_bytes=lambda w: 20 * w * MIB), wl)
    assert not wide.evaluate((8,)).feasible  # 160 MiB of graphs do not fit beside 50 MiB of activations in 200
    assert "capture would run out of memory" in wide.evaluate((8,)).why_infeasible


def test_sglang_automatic_fraction_moves_with_the_lists_max(tmp_path):
    # A 141 GiB device: SGLang's automatic fraction reserves 2 MiB per request of max(bs) (in 0.001 steps).
    wl = handmade_workload(engine="sglang", max_num_seqs=512, max_num_batched_tokens=512,
                           traffic={"requests": {"kind": "uniform", "min": 1, "max": 512}}, gpu_memory_mib=10240)
    m = CostModel.from_files(handmade_profile(tmp_path, wl, [1, 8, 64, 512], total_memory_bytes=10240 * MIB), wl)
    # By hand (facts file 1.5, auto mfs; chunked_prefill_size is max_num_batched_tokens 512): reserved = 512
    # + 1.5 x max(512, 2048) + tp x pp / 8 x 1024 + 2 x max_bs + 8 x 30 prefill buckets (4..32 by 4, 48..256 by 16,
    # 288..512 by 32) = 3952 + 2 x max_bs MiB, no 10 GiB floor on a 10240-MiB GPU. max_bs 8: 3968 MiB,
    # round(6272 / 10240, 3) = round(0.6125, 3) = 0.613 (the float 0.6125 lies just above the half); max_bs 512:
    # 4976 MiB, round(5264 / 10240, 3) = round(0.51406, 3) = 0.514.
    assert (m.budget.fraction(8), m.budget.fraction(512)) == (0.613, 0.514)
    # KV = pre-load available x mfs - ...: the list's max moves KV by 10240 MiB x (0.613 - 0.514), about 1014 MiB.
    assert m.evaluate((1, 8)).kv_available_bytes - m.evaluate((1, 512)).kv_available_bytes == \
        int(10240 * MIB * 0.613) - int(10240 * MIB * 0.514)


def random_engine_case(tmp_path: Path, seed: int) -> tuple[CostModel, list[int]]:
    rnd = random.Random(20_000 + seed)
    engine = ("sglang", "trtllm")[seed % 2]
    spec = rnd.choice([0, 1, 3])
    q = spec + 1
    serving = {"speculative": {"method": "eagle", "drafter": {"num_layers": 1}}} if spec else {}
    if engine == "sglang":
        serving["mem_fraction_static"] = rnd.choice([0.8, 0.85])
    else:
        serving["enable_padding"] = rnd.random() < 0.5
    traffic = {"requests": {"kind": "uniform", "min": 1, "max": min(8, 32 // q)}, "mixed_share": 0.2,
               "mixed_tokens": {"kind": "uniform", "min": 1, "max": 32}}
    wl = handmade_workload(engine=engine, num_speculative_tokens=spec, max_num_seqs=8, max_num_batched_tokens=32,
                           traffic=traffic, **serving)
    widths = list(range(1, 33))
    e = {w: rnd.uniform(1, 3) for w in widths}
    f = {w: e[w] * rnd.uniform(0.3, 1.1) for w in widths}
    sa = {w: rnd.randint(2, 12) for w in widths}
    de = {w: rnd.choice([0, 1, 2, 3]) for w in widths}
    path = handmade_profile(tmp_path, wl, widths, total_memory_bytes=1000 * MIB,
                            weights_bytes=rnd.randint(600, 700) * MIB if engine == "sglang" else rnd.randint(700, 790)
                            * MIB, activation_peak_bytes=rnd.randint(100, 170) * MIB if engine == "sglang" else 50 * MIB,
                            eager_ms=e.get, full_ms=f.get, standalone_bytes=lambda w: sa[w] * MIB,
                            delta_bytes=lambda w: de[w] * MIB, name=f"engine{seed}")
    model = CostModel.from_files(path, wl)
    return model, sorted(rnd.sample(model.candidates, min(9, len(model.candidates))))


@pytest.mark.parametrize("seed", range(24))
def test_exact_solver_equals_brute_force_for_sglang_and_trtllm(tmp_path, seed):
    m, candidates = random_engine_case(tmp_path, seed)
    assert_matches_brute_force(m, candidates, proven=True)


def test_engine_cases_are_not_trivial(tmp_path):
    sizes = [len(brute_force(*random_engine_case(tmp_path / str(s), s)).capture_sizes) for s in range(24)]
    assert sum(0 < k for k in sizes) >= 12 and not math.isnan(sum(sizes))


def test_exact_solver_respects_a_budget_that_moves_with_the_lists_max(tmp_path):
    # SGLang's automatic fraction on a 10 GiB device: a larger max(bs) reserves more, so the KV cache shrinks with the
    # list's top. Weights are set so that the KV cache keeps the requirement only while the top stays at 64 requests.
    wl = handmade_workload(engine="sglang", max_num_seqs=512, max_num_batched_tokens=512,
                           traffic={"requests": {"kind": "uniform", "min": 1, "max": 512}}, gpu_memory_mib=10240)
    # Auto mfs by hand (as in the test above): reserved 3952 + 2 x max_bs MiB, so max_bs 64: 4080 MiB,
    # round(6160 / 10240, 3) = round(0.60156, 3) = 0.602; max_bs 256: 4464 MiB, round(5776 / 10240, 3) = 0.564.
    kv64 = int(10240 * MIB * 0.602)
    kv256 = int(10240 * MIB * 0.564)
    weights = (kv64 + kv256) // 2 - wl.required_kv_bytes  # KV >= required at top 64, short at 256
    m = CostModel.from_files(handmade_profile(tmp_path / "m", wl, [1, 64, 256, 512], total_memory_bytes=10240 * MIB,
                                              weights_bytes=weights, activation_peak_bytes=0,
                                              standalone_bytes=lambda w: MIB, delta_bytes=lambda w: MIB), wl)
    assert m.evaluate((64,)).feasible and not m.evaluate((256,)).starts
    exact, brute = exact_solve(m), brute_force(m)
    assert exact.best.capture_sizes == brute.capture_sizes and exact.best.capture_sizes[-1] == 64
