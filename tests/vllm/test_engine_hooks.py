"""The CUDA-only parts of the vLLM-backed profile, held to vLLM 0.33's own classes on CPU (tests/vllm/engine_hooks_check.py
in a process of its own): each capture's memory read per batch descriptor in vLLM's real capture order (V2's
`CudaGraphManager.capture`, V1's `_capture_cudagraphs`) over the oracle's simulated pool; the forced dispatch over vLLM's
real `dispatch`; the KV bytes per token over vLLM's real `FullAttentionSpec`; and every private name the adapter
touches present in the 0.33.0 wheel. Skipped where vllm==0.33.0 is not installed, unless CGTUNE_REQUIRE_VLLM=1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from vllm_code import require_vllm_033

HERE = Path(__file__).resolve().parent
REQUIRED = os.environ.get("CGTUNE_REQUIRE_VLLM") == "1"


def _last_json(proc: subprocess.CompletedProcess) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def checks() -> dict[str, Any]:
    require_vllm_033()
    data = _last_json(subprocess.run([sys.executable, str(HERE / "engine_hooks_check.py")], capture_output=True,
                                     text=True, timeout=600, cwd=HERE.parents[1]))
    if data["status"] != "ok":
        pytest.fail(data["reason"]) if REQUIRED else pytest.skip(data["reason"])
    return data


@pytest.mark.parametrize("runner", ["v2", "v1"])
def test_each_capture_reads_its_own_graph_in_vllms_order(checks, runner):
    got = checks[runner]
    # The first graph into the empty pool costs its standalone bytes, every later one its delta: a reading shifted by
    # one descriptor, or one that missed a capture, reads another graph's figure.
    assert got["read"] == got["expected"]
    modes = [m for m, _, _ in got["read"]]
    assert modes == sorted(modes, key=lambda m: m != "piecewise")  # PIECEWISE first, then FULL, as vLLM captures
    assert all(uniform == (mode == "full") for mode, _, uniform in got["uniform"])


def test_v1_estimate_captures_are_read_too_so_the_real_capture_is_the_last(checks):
    assert checks["v1"]["estimate_captures"] > 0


def test_forced_dispatch_runs_the_mode_asked_with_vllms_own_padding(checks):
    forced = checks["v2"]["forced"]
    for width in checks["v2"]["sizes"]:
        got = forced[str(width)]
        assert got["none"] == ["NONE", width] and got["piecewise"] == ["PIECEWISE", width]
        assert got["full"] == ["FULL", width] and got["restored"]
    # 10 tokens: vLLM pads a mixed batch to the PIECEWISE graph of 12; no FULL graph serves a non-uniform batch.
    assert forced["10"]["piecewise"] == ["PIECEWISE", 12] and forced["10"]["full"].startswith("LookupError")
    # Above the largest graph nothing is captured: only eager.
    assert forced["40"]["vllm"] == "NONE" and forced["40"]["none"] == ["NONE", 40]
    assert forced["40"]["piecewise"].startswith("LookupError") and forced["40"]["full"].startswith("LookupError")


def _by_hand(captured: list[list[Any]], mode: str, num_reqs: int, num_tokens: int, uniform: int | None,
             ubatches: int) -> list[Any] | str:
    """The graph of `mode` a batch replays, from the rule alone: the narrowest captured graph of that mode at least as
    wide, holding at least its requests (None: any), of its uniform token count (None: any), for its microbatches."""
    fits = [d for d in captured if d[0] == mode.upper() and d[1] >= num_tokens and (d[2] is None or d[2] >= num_reqs)
            and (d[3] is None or d[3] == uniform) and d[6] == ubatches]
    return min(fits, key=lambda d: d[1]) if fits else "LookupError"


def test_forced_dispatch_passes_requests_and_tokens_where_vllm_reads_them(checks):
    # Issue 44 (3): a wrapper that hands vLLM's dispatch, its compatibility test or the eager descriptor its counts in
    # another order times another graph, or an eager step of another width. Every batch of the grid has more tokens than
    # requests (but one-token ones), and the wrapper is called both ways vLLM's runner calls `dispatch`.
    grid = checks["v2"]["grid"]
    captured, rows = grid["captured"], grid["rows"]
    assert {d[0] for d in captured} == {"FULL", "PIECEWISE"}
    lookups = 0
    for num_reqs, num_tokens, uniform, ubatches, way, own, forced in rows:
        where = (num_reqs, num_tokens, uniform, ubatches, way)
        # Eager: vLLM's own NONE descriptor for the batch, every field as vLLM's dispatch would build it.
        assert forced["none"] == ["NONE", num_tokens, num_reqs, None, None, 0, ubatches], where
        for mode in ("piecewise", "full"):
            assert forced[mode] == _by_hand(captured, mode, num_reqs, num_tokens, uniform, ubatches), (where, mode)
            lookups += forced[mode] == "LookupError"
        # Where vLLM itself picks a mode, forcing that mode is vLLM's own choice, to the field.
        assert forced[own[0].lower()] == own, where
    assert 0 < lookups < 2 * len(rows)
    # Both calling conventions reach the same graphs.
    by_way: dict[str, list[Any]] = {}
    for row in rows:
        by_way.setdefault(row[4], []).append(row[:4] + row[5:])
    assert by_way["positional"] == by_way["keywords"]


def test_kv_bytes_per_token_is_vllms_page_size_over_its_block(checks):
    for case in checks["kv"]:
        by_hand = 2 * case["layers"] * case["heads"] * case["head_dim"] * {"float32": 4}.get(case["dtype"], 2)
        assert case["summary"] == case["oracle"] == by_hand


def test_every_private_name_the_adapter_touches_is_in_the_033_wheel():
    require_vllm_033()
    code = "from tuner.measure.vllm_engine.api import check_api; import json; print(json.dumps(check_api()))"
    problems = _last_json(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                                         cwd=HERE.parents[1]))
    assert problems == []
