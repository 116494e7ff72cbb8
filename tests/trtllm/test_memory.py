"""TensorRT-LLM's KV sizing: graphs are in the estimation peak, so each graph byte costs the fraction in KV."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ helpers (import-mode=importlib)
from handmade_profiles import handmade_workload  # noqa: E402

from tuner.engines.trtllm import kv_cache_bytes, kv_cache_bytes_with_graphs, kv_cost_of_graph_bytes  # noqa: E402
from tuner.engines.trtllm.engine import TrtllmKvRule  # noqa: E402

GIB = 1 << 30
MIB = 1 << 20


def test_kv_bytes_formula_with_hand_numbers():
    # (80 - 20 + 1) GiB x 0.9 = 54.9 GiB
    assert kv_cache_bytes(total_gpu_memory_bytes=80 * GIB, peak_memory_bytes=20 * GIB,
                          estimation_kv_bytes=1 * GIB) == int(61 * GIB * 0.9)


def test_one_gib_of_graphs_costs_nine_tenths_of_a_gib_of_kv():
    without = kv_cache_bytes_with_graphs(total_gpu_memory_bytes=80 * GIB, peak_without_graphs_bytes=20 * GIB,
                                         graph_memory_bytes=0)
    with_graphs = kv_cache_bytes_with_graphs(total_gpu_memory_bytes=80 * GIB, peak_without_graphs_bytes=20 * GIB,
                                             graph_memory_bytes=GIB)
    assert without - with_graphs == pytest.approx(0.9 * GIB, abs=1)
    assert kv_cost_of_graph_bytes(GIB) == 0.9 * GIB
    assert kv_cost_of_graph_bytes(GIB, 0.5) == 0.5 * GIB


def test_caps_bind_after_the_fraction():
    kw = dict(total_gpu_memory_bytes=80 * GIB, peak_memory_bytes=20 * GIB)
    assert kv_cache_bytes(**kw, max_tokens_bytes=10 * GIB) == 10 * GIB
    assert kv_cache_bytes(**kw, max_gpu_total_bytes=5 * GIB) == 5 * GIB
    # max_gpu_total_bytes <= 0 means unset.
    assert kv_cache_bytes(**kw, max_gpu_total_bytes=0) == int(60 * GIB * 0.9)


def test_bad_fraction_and_negative_graph_memory_are_refused():
    with pytest.raises(ValueError, match=r"^free_gpu_memory_fraction=0 must be in \(0, 1\]$"):
        kv_cost_of_graph_bytes(1, 0)
    with pytest.raises(ValueError, match=r"^graph_memory_bytes=-1 must be >= 0$"):
        kv_cache_bytes_with_graphs(total_gpu_memory_bytes=1, peak_without_graphs_bytes=0, graph_memory_bytes=-1)


@pytest.mark.parametrize(("fraction", "required_mib"), [(0.9, 360), (0.5, 200), (1.0, 400)])
def test_the_graph_budget_by_hand_leaves_exactly_the_required_kv(fraction, required_mib):
    # The rule, by hand: KV = fraction x (total - peak without graphs - real pool). On a 1000 MiB device with a 500 MiB
    # peak, the KV cache keeps `required` while fraction x (500 MiB - pool) >= required: the pool may be 100 MiB.
    rule = TrtllmKvRule(1000 * MIB, 500 * MIB, required_mib * MIB, fraction)
    assert rule.real_budget_bytes() == 100 * MIB
    assert rule.graph_budget()[0] == 100 * MIB
    assert rule.kv_available_bytes(real_bytes=100 * MIB) == required_mib * MIB  # exactly the required KV
    assert rule.kv_available_bytes(real_bytes=101 * MIB) < required_mib * MIB  # one MiB more falls short
    assert rule.kv_available_bytes(real_bytes=0) == int(500 * MIB * fraction)
    assert rule.capture_headroom_bytes(0.0, 100 * MIB) == 400 * MIB  # the device is not what binds
    # What summary.json and the report state is the same figure.
    engine = handmade_workload(engine="trtllm").engine
    assert engine.summary_fields(rule, 0, 0)["real_pool_budget_bytes"] == 100 * MIB
    words, _ = engine.memory_rule_words(rule, 0, 0, lambda b: f"{b / MIB:g} MiB")
    assert words.endswith("so the real pool may be at most 100 MiB")


def test_with_graphs_the_estimation_kv_and_both_caps_still_apply():
    # The graphs join the peak; everything else of the formula is as without them: (80 - 20 - 1 + 2) GiB x 0.9, then
    # the caps (min with max_tokens' bytes and max_gpu_total_bytes).
    kw = dict(total_gpu_memory_bytes=80 * GIB, peak_without_graphs_bytes=20 * GIB, graph_memory_bytes=GIB)
    assert kv_cache_bytes_with_graphs(**kw, estimation_kv_bytes=2 * GIB) == int(61 * GIB * 0.9)
    assert kv_cache_bytes_with_graphs(**kw, max_tokens_bytes=10 * GIB) == 10 * GIB
    assert kv_cache_bytes_with_graphs(**kw, max_gpu_total_bytes=5 * GIB) == 5 * GIB
    # Without an estimation KV cache: exactly the fraction of what is left.
    assert kv_cache_bytes(total_gpu_memory_bytes=80 * GIB, peak_memory_bytes=20 * GIB) == int(60 * GIB * 0.9)


def test_a_fraction_above_one_is_refused_and_a_budget_never_goes_below_zero():
    with pytest.raises(ValueError, match=r"^free_gpu_memory_fraction=1.5 must be in \(0, 1\]$"):
        kv_cost_of_graph_bytes(1, 1.5)
    # Required KV the device cannot hold even without graphs: no graph memory is allowed, not a negative amount.
    rule = TrtllmKvRule(1000 * MIB, 500 * MIB, 600 * MIB, 0.9)
    assert rule.real_budget_bytes() < 0 and rule.graph_budget()[0] == 0
