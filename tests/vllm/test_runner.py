"""Which model runner vLLM 0.33 uses, and the list it really captures (V1's rewrite when speculating)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.engines.vllm.defaults import default_capture_sizes
from tuner.engines.vllm.runner import (
    effective_cudagraph_mode,
    resolve_model_runner,
    runs_as,
    v1_rewrite_applies,
    v1_rewritten_sizes,
)
from tuner.workload.spec import load_workload

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("method", "parallel", "runner"), [
    (None, False, "v2"), ("eagle", False, "v2"), ("dflash", False, "v2"), ("mtp", False, "v2"),
    ("suffix", False, "v1"), ("custom_class", False, "v1"),
    ("eagle", True, "v1"),  # P-EAGLE
    ("draft_model", True, "v1"),  # PARD
    ("dflash", True, "v2"),  # DFlash drafts in parallel on V2
])
def test_auto_picks_vllms_runner(method, parallel, runner):
    assert resolve_model_runner("auto", method, parallel_drafting=parallel) == runner


def test_a_pinned_runner_wins():
    assert resolve_model_runner("v1", "eagle") == "v1"
    assert resolve_model_runner("v1", "suffix") == "v1"
    assert resolve_model_runner("v2", "dflash", parallel_drafting=True) == "v2"
    with pytest.raises(ValueError, match="model_runner='v3'"):
        resolve_model_runner("v3", None)


@pytest.mark.parametrize(("method", "parallel", "lacks"), [
    ("suffix", False, "speculative method 'suffix'"), ("custom_class", False, "speculative method 'custom_class'"),
    ("eagle", True, "parallel drafting with method 'eagle'"),
])
def test_v2_pinned_where_v2_lacks_the_setup_is_refused(method, parallel, lacks):
    # With VLLM_USE_V2_MODEL_RUNNER=1 vLLM does not fall back to V1, so the setup would not run as modelled.
    with pytest.raises(ValueError, match=rf"^model_runner='v2': vLLM 0.33 has no V2 support for {lacks}"):
        resolve_model_runner("v2", method, parallel_drafting=parallel)


def test_v1_rewrite_on_vllms_own_example():
    # The facts file's CPU simulation of adjust_cudagraph_sizes_for_spec_decode: K = 2 rounds to multiples of 3
    # and drops 66 (above the old max 64); K = 3 keeps 64.
    grid = [1, 2, 4, 8, 16, 24, 32, 48, 64]
    assert v1_rewritten_sizes(grid, 3) == [3, 6, 9, 18, 24, 33, 48]
    assert v1_rewritten_sizes(grid, 4) == [4, 8, 16, 24, 32, 48, 64]


def test_v1_rewrite_edge_cases():
    # Nothing survives rounding but q fits the old max: vLLM keeps [q]; below q it refuses to start.
    assert v1_rewritten_sizes([6, 7], 4) == [4]  # 8 > 7 is dropped; q = 4 fits the old max
    with pytest.raises(ValueError, match="max_cudagraph_capture_size=3 < q"):
        v1_rewritten_sizes([1, 3], 4)
    assert v1_rewritten_sizes([5, 1], 1) == [1, 5]  # q = 1: untouched


def test_rewrite_applies_only_on_v1_with_full_decode_and_speculation():
    assert v1_rewrite_applies("v1", "FULL_AND_PIECEWISE", 3)
    assert v1_rewrite_applies("v1", "FULL_DECODE_ONLY", 3)
    assert v1_rewrite_applies("v1", "FULL", 3)
    assert not v1_rewrite_applies("v1", "PIECEWISE", 3)
    assert not v1_rewrite_applies("v1", "FULL_AND_PIECEWISE", 1)
    assert not v1_rewrite_applies("v2", "FULL_AND_PIECEWISE", 3)
    assert runs_as([1, 2, 4, 8], runner="v2", cudagraph_mode="FULL_AND_PIECEWISE", decode_query_len=3) == [1, 2, 4, 8]


def test_v1_drops_full_graphs_under_a_dynamic_schedule():
    assert effective_cudagraph_mode("FULL_AND_PIECEWISE", "v1", dynamic_schedule=True) == "PIECEWISE"
    assert effective_cudagraph_mode("FULL_AND_PIECEWISE", "v2", dynamic_schedule=True) == "FULL_AND_PIECEWISE"
    assert effective_cudagraph_mode("FULL_AND_PIECEWISE", "v1", dynamic_schedule=False) == "FULL_AND_PIECEWISE"


def test_suffix_workload_runs_a_rewritten_default():
    wl = load_workload(ROOT / "workloads" / "suffix-llama-3.1-8b.yaml")
    s, e = wl.serving, wl.engine
    assert e.runner == "v1" and "suffix" in e.runner_reason
    written = default_capture_sizes(s.max_num_seqs, s.num_speculative_tokens, s.max_num_batched_tokens).sizes
    assert written[-1] == 512
    # q = 25: every size rounds up to a multiple of 25; 525 > 512 is dropped, so the max becomes 500.
    assert e.runs_as(written) == tuple(range(25, 501, 25))
    # DFlash runs on V2, which keeps the list as written.
    dflash = load_workload(ROOT / "workloads" / "dflash-llama-3.1-8b.yaml").engine
    sizes = dflash.defaults().sizes
    assert dflash.runner == "v2" and dflash.runs_as(sizes) == tuple(sizes)
