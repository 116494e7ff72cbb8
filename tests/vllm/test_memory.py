"""vLLM's graph-memory estimate (both runners, every cudagraph mode, 1, 2 and many graphs, the 1 MiB floor),
the real pool and the KV cache vLLM sizes from the estimate, on hand-computable profiles."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/handmade_profiles.py
from handmade_profiles import MIB, handmade_workload  # noqa: E402

from tuner.engines.vllm.memory import (  # noqa: E402
    GraphCost,
    KvRule,
    estimate_bytes,
    estimate_v1_bytes,
    estimate_v2_bytes,
    pool_bytes,
)
from tuner.model.costmodel import CostModel  # noqa: E402
from tuner.profile.table import ProfileRow, write_profile  # noqa: E402


def two_mode_profile(tmp_path: Path, workload, widths=range(1, 9)) -> Path:
    """PIECEWISE graphs: standalone 10 w MiB, delta 2 w MiB; FULL graphs: standalone 8 w MiB, delta w MiB, except
    width 1's FULL delta of 0.5 MiB (below vLLM's 1 MiB floor). A hand-made fixture, not a measurement."""
    rows = []
    for w in widths:
        rows.append(ProfileRow(w, "eager", "ok", latency_ms=1.0 + 0.01 * w, latency_iqr_ms=0.0))
        rows.append(ProfileRow(w, "piecewise", "ok", latency_ms=0.8 + 0.01 * w, latency_iqr_ms=0.0,
                               capture_delta_bytes=2 * w * MIB, standalone_bytes=10 * w * MIB, capture_s=0.0))
        rows.append(ProfileRow(w, "full", "ok", latency_ms=0.5 + 0.01 * w, latency_iqr_ms=0.0,
                               capture_delta_bytes=MIB // 2 if w == 1 else w * MIB, standalone_bytes=8 * w * MIB,
                               capture_s=0.0))
    shape = workload.model.shape.as_dict()
    meta = {"device_name": "hand-made fixture (not a measurement)", "total_memory_bytes": 1000 * MIB,
            "non_kv_cache_bytes": 300 * MIB, "compiled": True, "decode_query_len": 1, "context_len": 2048,
            "capture_order": "piecewise-then-full",
            "model": {"preset": "tiny", "shape": shape, "dtype": "float32", "tensor_parallel_size": 1}}
    return write_profile(tmp_path, "two-mode", rows, meta)


def model(tmp_path, mode: str, runner: str) -> CostModel:
    wl = handmade_workload(cudagraph_mode=mode, model_runner=runner)
    return CostModel.from_files(two_mode_profile(tmp_path, wl), wl)


# (mode, list) -> (real pool, V2 estimate, V1 estimate), in MiB, worked by hand from the fixture's numbers.
CASES = {
    # PIECEWISE 8, 4, 2 then FULL 8, 4, 2: real 80 + 8 + 4 + 8 + 4 + 2; V2 counts PIECEWISE in full, then FULL as
    # 8 + 2 x max(4, 1); V1: max(80, 64) + 2 x max(8, 1) + 2 x max(4, 1).
    ("FULL_AND_PIECEWISE", (2, 4, 8)): (106, 108, 104),
    ("FULL_AND_PIECEWISE", (8,)): (88, 88, 80),  # one graph per mode: no extrapolation
    ("FULL_AND_PIECEWISE", (4, 8)): (100, 100, 92),
    ("FULL_AND_PIECEWISE", (1, 8)): (90.5, 91, 83),  # the second FULL delta 0.5 MiB is floored at 1 MiB
    ("FULL_AND_PIECEWISE", tuple(range(1, 9))): (80 + 2 * 28 + 8 + 27 + 0.5, 80 + 56 + 8 + 7 * 7, 80 + 7 * 14 + 7 * 7),
    ("FULL", (2, 4, 8)): (70, 72, 72),  # FULL graphs at every size, the first one alone in the pool
    ("FULL", (8,)): (64, 64, 64),
    ("FULL", (1, 8)): (64.5, 65, 65),
    ("FULL_DECODE_ONLY", (2, 4, 8)): (70, 72, 72),
    ("FULL_DECODE_ONLY", (4, 8)): (68, 68, 68),
    ("PIECEWISE", (2, 4, 8)): (92, 92, 96),  # V2 measures PIECEWISE graphs in full
    ("PIECEWISE", (8,)): (80, 80, 80),
    ("PIECEWISE", tuple(range(1, 9))): (80 + 56, 80 + 56, 80 + 7 * 14),
    ("NONE", (2, 4, 8)): (0, 0, 0),
}


@pytest.mark.parametrize(("mode", "sizes"), list(CASES))
def test_estimates_and_real_pool_by_hand(tmp_path, mode, sizes):
    real, v2, v1 = CASES[(mode, sizes)]
    m2, m1 = model(tmp_path / "v2", mode, "v2"), model(tmp_path / "v1", mode, "v1")
    assert m2.graph_memory_bytes(sizes) == m1.graph_memory_bytes(sizes) == real * MIB
    assert m2.graph_estimate_bytes(sizes) == v2 * MIB
    assert m1.graph_estimate_bytes(sizes) == v1 * MIB


def test_v2_estimate_counts_drafter_graphs_in_full():
    g = [GraphCost("target", "PIECEWISE", 8, 80 * MIB, 16 * MIB), GraphCost("target", "FULL", 8, 64 * MIB, 8 * MIB),
         GraphCost("target", "FULL", 4, 32 * MIB, 4 * MIB), GraphCost("target", "FULL", 2, 16 * MIB, 0.0),
         GraphCost("drafter", "FULL", 8, 10 * MIB, 3 * MIB)]
    # Only the two largest target FULL graphs are captured (8 + 4), the drafter's graph at its delta; then the
    # FULL graphs are extrapolated: 8 + 2 x max(4, 1).
    assert estimate_v2_bytes(g) == (80 + 8 + 2 * 4 + 3) * MIB
    assert pool_bytes(g) == (80 + 8 + 4 + 0 + 3) * MIB


def test_v1_estimate_puts_a_drafter_graph_into_the_sample_it_follows():
    g = [GraphCost("target", "PIECEWISE", 8, 80 * MIB, 16 * MIB), GraphCost("drafter", "PIECEWISE", 8, 9 * MIB, 3 * MIB),
         GraphCost("target", "PIECEWISE", 4, 40 * MIB, 8 * MIB), GraphCost("drafter", "PIECEWISE", 4, 5 * MIB, 2 * MIB),
         GraphCost("target", "PIECEWISE", 2, 20 * MIB, 4 * MIB), GraphCost("drafter", "PIECEWISE", 2, 3 * MIB, 1 * MIB)]
    # First sample: 80 + 3 (the drafter captured with it); second: 8 + 2 = 10 per graph, x (3 - 1).
    assert estimate_v1_bytes(g) == (83 + 2 * 10) * MIB


def test_an_unknown_runner_is_named_with_its_value():
    with pytest.raises(ValueError) as err:
        estimate_bytes([GraphCost("target", "FULL", 8, 8 * MIB, MIB)], "v3")
    assert str(err.value) == "runner='v3' must be v1 or v2"


def test_kv_rule():
    rule = KvRule(total_memory_bytes=1001, gpu_memory_utilization=0.5, non_kv_cache_bytes=100, required_kv_bytes=300)
    assert rule.requested_bytes == 501  # ceil(1001 x 0.5)
    assert rule.kv_available_bytes(50) == 501 - 100 - 50
    assert rule.estimate_budget_bytes == 101
    assert rule.capture_headroom_bytes(50, 200) == 50 + 500 - 200
    assert rule.utilization_for_kv(351, 50) == pytest.approx(501 / 1001)
    off = KvRule(1001, 0.5, 100, 300, estimate_enabled=False)
    assert off.kv_available_bytes(50) == 401
    assert off.capture_headroom_bytes(50, 200) == 500 - 200
    assert math.isclose(off.utilization_for_kv(401, 50), 501 / 1001)


# ---------------------------------------------------------------------------------------------- by hand
def test_kv_capacity_and_the_start_minimum_in_whole_blocks_by_hand():
    from tuner.engines.vllm.memory import kv_capacity, start_kv_bytes

    # 100 bytes a token, 16-token blocks of 1600 bytes: 16,000 bytes are 10 blocks; a 40-token request takes
    # cdiv(40, 16) = 3 blocks, so 10 / 3 = 3.33x concurrency and int(3.33 x 40) = 133 tokens, as vLLM logs them.
    tokens, concurrency = kv_capacity(16_000, 100, 40)
    assert concurrency == pytest.approx(10 / 3) and tokens == 133
    assert kv_capacity(16_000 + 1599, 100, 40)[1] == pytest.approx(10 / 3)  # a part block holds nothing
    assert kv_capacity(-5, 100, 40) == (0, 0.0)  # nothing available: no block
    # vLLM starts only with one max_model_len request's whole blocks plus the null block: (3 + 1) x 1600.
    assert start_kv_bytes(40, 100) == 6400 and start_kv_bytes(48, 100) == 6400 and start_kv_bytes(49, 100) == 8000


def test_the_estimate_samples_each_runner_captures_by_hand():
    from tuner.engines.vllm.memory import estimate_samples

    graphs = [("PIECEWISE", 64), ("PIECEWISE", 32), ("PIECEWISE", 8), ("FULL", 48), ("FULL", 16), ("FULL", 4)]
    # V2: every PIECEWISE graph and the two largest FULL graphs, in capture order, into one pool.
    assert estimate_samples(graphs, "v2") == [[("PIECEWISE", 64), ("PIECEWISE", 32), ("PIECEWISE", 8),
                                                ("FULL", 48), ("FULL", 16)]]
    # V1: each mode's two largest, each mode into its own scratch pool.
    assert estimate_samples(graphs, "v1") == [[("PIECEWISE", 64), ("PIECEWISE", 32)], [("FULL", 48), ("FULL", 16)]]
    assert estimate_samples([("FULL", 8)], "v2") == [[("FULL", 8)]]


def test_the_kv_rule_budget_headroom_and_available_by_hand():
    from tuner.engines.vllm.memory import KvRule

    mib = 1 << 20
    rule = KvRule(total_memory_bytes=1000 * mib, gpu_memory_utilization=0.9, non_kv_cache_bytes=100 * mib,
                  required_kv_bytes=300 * mib)
    # requested = 900 MiB: 800 MiB beside the non-KV memory; an estimate of 50 MiB leaves 750 MiB of KV.
    assert rule.kv_available_bytes(50 * mib, real_bytes=999 * mib, top=7) == 750 * mib
    assert rule.graph_budget() == (500 * mib, "largest estimate that leaves the required KV")
    # The real capture runs in the estimate plus the 100 MiB vLLM does not request: 150 - 120 = 30 MiB left.
    assert rule.capture_headroom_bytes(50 * mib, 120 * mib) == 30 * mib
    off = KvRule(total_memory_bytes=1000 * mib, gpu_memory_utilization=0.9, non_kv_cache_bytes=100 * mib,
                 required_kv_bytes=300 * mib, estimate_enabled=False)
    assert off.kv_available_bytes(50 * mib) == 800 * mib
    assert off.capture_headroom_bytes(50 * mib, 120 * mib) == -20 * mib
    assert off.graph_budget() == (100 * mib, "memory vLLM does not request")
