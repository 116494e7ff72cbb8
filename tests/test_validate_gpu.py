"""On a CUDA device: a small list captured in vLLM's order and replayed step by step as validation dispatches it
gives the eager step's logits, and `cgtune validate` measures a pool and gives it back (skipped without CUDA; run
by scripts/gpu_run.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/handmade_profiles.py (import-mode=importlib)
from handmade_profiles import handmade_profile  # noqa: E402

from tuner.cli import main  # noqa: E402
from tuner.measure.decoder import build_model  # noqa: E402
from tuner.model.costmodel import CostModel  # noqa: E402
from tuner.decision.record import decide  # noqa: E402
from tuner.report.run import write_run  # noqa: E402
from tuner.search.study import SearchResult, exact_solve  # noqa: E402
from tuner.validate.backend import TorchBackend  # noqa: E402
from tuner.validate.trace import plan_trace, sample_trace  # noqa: E402
from tuner.workload.spec import parse_workload  # noqa: E402

pytestmark = pytest.mark.gpu


def _workload(dtype: str = "float32"):
    # Small model with GQA, q = 4, mixed steps: FULL decode, PIECEWISE and eager dispatches all occur.
    return parse_workload({
        "name": "gpu-validate-test",
        "model": {"hidden_size": 256, "num_layers": 2, "num_attention_heads": 8, "num_kv_heads": 2, "head_dim": 32,
                  "intermediate_size": 512, "vocab_size": 1024, "dtype": dtype},
        "serving": {"max_num_seqs": 16, "num_speculative_tokens": 3, "max_num_batched_tokens": 96,
                    "max_model_len": 1024},
        "traffic": {"requests": {"kind": "uniform", "min": 1, "max": 16}, "mixed_share": 0.2,
                    "mixed_tokens": {"kind": "uniform", "min": 1, "max": 96}, "mean_context_len": 128},
    })


def test_small_list_replayed_as_dispatched_equals_eager() -> None:
    workload = _workload()
    sizes = (4, 8, 16, 40)
    dispatcher = workload.engine.dispatcher(sizes)
    backend = TorchBackend(build_model(workload, 96, "cuda"))
    capture = backend.capture(dispatcher.graphs())
    assert capture.oom is None and capture.graphs == len(dispatcher.graphs())
    assert capture.free_delta_bytes is not None and capture.free_delta_bytes > 0
    plan = plan_trace(sample_trace(workload.steps(), 400, seed=0), dispatcher)
    assert {p.runtime_mode for p in plan} == {"FULL", "PIECEWISE", "NONE"}
    model = backend.model
    seen = set()
    for p in plan:
        if p.key + (p.num_tokens,) in seen:
            continue
        seen.add(p.key + (p.num_tokens,))
        eager = model.step(p.num_tokens).float().clone()
        model.hidden_out.zero_()  # a replay that wrote nothing would otherwise read the eager step's output
        got = backend._step_fn(p)().float()
        assert got.shape == eager.shape
        torch.testing.assert_close(got, eager, rtol=1e-3, atol=1e-3,
                                   msg=lambda m, p=p: f"{p.runtime_mode} at {p.num_tokens}/{p.run_width}: {m}")
    samples = backend.time_steps(plan)
    assert len(samples) == len(plan) and all(s > 0 for s in samples)
    residual = backend.release()
    assert residual is not None and residual < 64 << 20  # the pool went back (allocator slack aside)


def test_cgtune_validate_on_a_run_directory(tmp_path, capsys) -> None:
    workload = _workload("bfloat16")
    widths = sorted({1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 64, 96})
    # Test fixture predictions (not measurements): the command must run end to end and measure a real pool.
    path = handmade_profile(tmp_path / "p", workload, widths, total_memory_bytes=torch.cuda.get_device_properties(0)
                            .total_memory, weights_bytes=1 << 20, activation_peak_bytes=1 << 20)
    model = CostModel.from_files(path, workload)
    exact = exact_solve(model)
    search = SearchResult(chosen=exact.best, source="exact", exact=exact, study_best=None,
                          default=model.evaluate(model.default_sizes), study_name="none", storage="none",
                          objective="latency", trials={}, pareto=exact.front, notes=[])
    run = tmp_path / "run"
    write_run(run, model, decide(model, search), command="pytest", plots=False)
    assert main(["validate", str(run), "--steps", "500"]) == 0
    out = capsys.readouterr().out
    record = json.loads((run / "validation.json").read_text())
    # The printed summary carries the record's own measured and predicted speedups and the list emitted.
    assert (f"measured speedup tuned over default: {record['measured_speedup_tuned_over_default']:.3f}x (predicted "
            f"{record['predicted_speedup_tuned_over_default']:.3f}x); emitted: {record['emitted']}") in out
    assert record["device_name"] == torch.cuda.get_device_name(0)
    for name in ("default", "tuned"):
        r = record[name]
        assert r["measured_graph_bytes"] and r["measured_graph_bytes"] > 0
        assert 0 < r["p50_step_ms"] <= r["p99_step_ms"]
        assert r["dispatch"]["FULL"] > 0
    assert "Validation on the device" in (run / "report.md").read_text()
