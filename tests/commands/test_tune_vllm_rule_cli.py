"""`cgtune tune` on the shipped DFlash-like and suffix-like workloads with hand-made profiles whose vLLM estimate
runs above the real pool: what it emits always starts in vLLM (its estimate leaves the required KV cache) and, on the
V1 runner, survives V1's rewrite."""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/handmade_profiles.py (import-mode=importlib)
from handmade_profiles import MIB, handmade_profile  # noqa: E402

from tuner.cli import main  # noqa: E402
from tuner.model.costmodel import CostModel  # noqa: E402
from tuner.workload.spec import load_workload  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30


def candidate_widths(wl) -> list[int]:
    s = wl.serving
    q = s.decode_query_len
    widths = set(wl.engine.defaults().sizes) | {n * q for n in range(1, s.max_num_seqs + 1)}
    widths |= set(range(512 + 64, s.max_num_batched_tokens + 1, 256))
    return sorted(w for w in widths if w <= s.max_num_batched_tokens)


@pytest.mark.parametrize("name", ["dflash-llama-3.1-8b-shared", "suffix-llama-3.1-8b"])
@pytest.mark.slow
def test_tune_never_emits_a_list_vllm_would_refuse(tmp_path, capsys, name):
    src = ROOT / "workloads" / f"{name}.yaml"
    wl_path = tmp_path / src.name
    shutil.copyfile(src, wl_path)
    wl = load_workload(wl_path)
    widths = candidate_widths(wl)
    # Hand-made fixture (not a measurement): FULL deltas grow with width, so vLLM's estimate, which extrapolates every
    # FULL graph from the second largest, runs well above the real pool for long lists.
    kwargs = dict(standalone_bytes=lambda w: 40 * MIB + w * MIB // 10, delta_bytes=lambda w: w * MIB // 100,
                  eager_ms=lambda w: 8.0 + 0.01 * w, full_ms=lambda w: 1.0 + 0.01 * w,
                  piecewise_ms=lambda w: 4.0 + 0.01 * w, total_memory_bytes=141 * GIB, activation_peak_bytes=GIB)
    probe = CostModel.from_files(handmade_profile(tmp_path / "probe", wl, widths, **kwargs), wl)
    decode = [w for w in widths if w % wl.serving.decode_query_len == 0 and w <= probe.decode_limit]
    real, estimate = probe.memory(decode)
    assert estimate > 1.3 * real  # the fixture's point: the real pool would call far more lists "fits"
    # Weights that leave a graph budget between the two: vLLM's rule is what binds.
    requested = math.ceil(141 * GIB * wl.serving.gpu_memory_utilization)
    weights = requested - GIB - wl.required_kv_bytes - wl.drafter_weight_bytes() - (real + estimate) // 2
    profile = handmade_profile(tmp_path / "profiles", wl, widths, weights_bytes=weights, **kwargs)
    out = tmp_path / "run"
    code = main(["tune", str(wl_path), "--profile", str(profile), "--out", str(out), "--trials", "20",
                 "--no-progress"])
    _, err = capsys.readouterr()
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    tuned = summary["compact" if summary["shipped"]["list"] == "compact" else "tuned"]  # the list the files carry
    assert tuned["kv_available_bytes"] >= summary["required_kv_bytes"] and tuned["feasible"]
    emitted = json.loads((out / "compilation_config.json").read_text())["cudagraph_capture_sizes"]
    model = CostModel.from_files(profile, wl)
    e = model.evaluate(emitted)
    assert e.starts and e.capture_fits and e.kv_available_bytes == tuned["kv_available_bytes"]
    assert list(e.runs_as) == emitted  # V1 (suffix decoding) runs it unchanged: cgtune emits what will run
    # Every decode width: the old rule (the real pool against the budget) called it fine; vLLM refuses to start.
    every = model.evaluate(decode)
    assert model.budget.kv_available_bytes(0) - every.graph_memory_bytes >= summary["required_kv_bytes"]
    assert not every.starts and "vLLM would not start" in every.why_infeasible
