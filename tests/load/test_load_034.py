"""The load model over a vLLM 0.34 pair of lists (keys: prefill token sizes, decode request sizes negated): each step
the scheduler makes is costed under 0.34's dispatch, worked by hand on a hand-made profile (a test fixture, never a
measurement), and `--rate` searches and writes both lists."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ helpers (import-mode=importlib)
from handmade_profiles import handmade_profile, handmade_spec, write_handmade_inputs  # noqa: E402
from cli_runner import run  # noqa: E402

from tuner.load.scheduler import schedule  # noqa: E402
from tuner.model.costmodel import CostModel  # noqa: E402
from tuner.workload.load import Lengths, Load  # noqa: E402
from tuner.workload.spec import parse_workload  # noqa: E402

SPEC = dict(max_num_seqs=8, num_speculative_tokens=3, max_num_batched_tokens=32, vllm_version="0.34",
            gpu_memory_utilization=1.0)


def test_each_step_is_costed_under_034s_dispatch_by_hand(tmp_path):
    # q = 4; lists: decode sizes [2] (one graph of 2 requests, 8 tokens), prefill sizes [8]. Profile: eager 1 + 0.01 w,
    # FULL 0.5 + 0.01 w, PIECEWISE 0.8 + 0.01 w (no logits rows). By hand:
    #  a decode step of 1 or 2 requests pads to the 2-request graph: FULL 8 = 0.58 ms;
    #  one of 3 requests (12 tokens) is above the decode graphs and no prefill graph holds 12 tokens: eager 1.12 ms;
    #  a prompt chunk of 5 tokens replays the prefill graph of 8 tokens: PIECEWISE 8 = 0.88 ms.
    wl = parse_workload(handmade_spec(**SPEC))
    m = CostModel.from_files(handmade_profile(tmp_path, wl, list(range(1, 33)), piecewise_ms=lambda w: 0.8 + 0.01 * w,
                                              total_memory_bytes=4 << 30), wl)
    keys = (-2, 8)
    assert m.step_latency_ms(8, True, keys, query_len=4, num_reqs=2) == pytest.approx(0.58)
    assert m.step_latency_ms(4, True, keys, query_len=4, num_reqs=1) == pytest.approx(0.58)
    assert m.step_latency_ms(12, True, keys, query_len=4, num_reqs=3) == pytest.approx(1.12)
    assert m.step_latency_ms(5, False, keys) == pytest.approx(0.88)
    # One request, prompt 5, output 3, every draft accepted: a 5-token prefill (first token), then a 4-token decode.
    run_ = schedule(m, keys, Load(Lengths(5), Lengths(3), arrival_times_s=(0.0,), acceptance=4.0))
    assert run_.steps.tokens == [5, 4] and run_.steps.uniform == [False, True]
    assert run_.steps.step_ms == pytest.approx([0.88, 0.58])


def test_rate_searches_both_lists_of_034(tmp_path, capsys):
    spec = handmade_spec(**SPEC, traffic={
        "requests": {"kind": "uniform", "min": 1, "max": 8}, "mixed_share": 0.2,
        "mixed_tokens": {"kind": "uniform", "min": 4, "max": 32},
        "load": {"rate_per_s": 400, "prompt_tokens": {"min": 4, "max": 24}, "output_tokens": {"min": 4, "max": 16},
                 "acceptance": 2.0}})
    wl_path, profile, _ = write_handmade_inputs(tmp_path, spec, list(range(1, 33)), total_memory_bytes=4 << 30,
                                                piecewise_ms=lambda w: 0.8 + 0.01 * w)
    code, out, err = run(capsys, "search", wl_path, "--profile", profile, "--out", tmp_path / "run", "--rate", 400,
                         "--trials", 4, "--no-progress")
    assert code == 0, err
    assert "under the load at 400 req/s" in out and "decode sizes" in out
    cc = (tmp_path / "run" / "compilation_config.json").read_text()
    assert "decode_cudagraph_capture_request_sizes" in cc and "prefill_cudagraph_capture_token_sizes" in cc
