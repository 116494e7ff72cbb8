"""The whole run without a GPU (`cgtune example`): the shipped synthetic profile through search, report and `check`
against a vLLM start-up log written for the list the run ships.

Every number in it is made up: the profile is a fixture (`benchmarks/bench_search.py --write-profile` wrote it; its
metadata says `device: synthetic`, and so do the report, the plots and the deployment files' comments), and the
start-up log is written from the run's own predictions with fixed, made-up errors put in (`MADE_UP_ERRORS`), so the
check's table shows what a disagreement with vLLM looks like. It shows a newcomer every output before renting a GPU;
it measures nothing, and the check agrees by construction, to within the errors put in.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tuner.engines.vllm.log_writer import VllmWorker, startup_log
from tuner.decision.run_dir import load_run_workload

__all__ = ["EXAMPLE_PROFILE", "EXAMPLE_WORKLOAD", "LOG_HEADER", "LOG_NAME", "MADE_UP_ERRORS", "example_log",
           "predicted_log", "run_predictions"]

EXAMPLE_WORKLOAD = Path("workloads/dflash-llama-3.1-8b.yaml")
"""The shipped DFlash workload (V2 runner, one H200, K = 16), relative to a cgtune checkout."""
EXAMPLE_PROFILE = Path("workloads/profiles/synthetic-dflash-llama-3.1-8b.csv")
"""The shipped synthetic profile for it (CSV, with its JSON beside it)."""
LOG_NAME = "vllm-startup.synthetic.log"
"""The start-up log's name in the run directory: it says what it is."""
MADE_UP_ERRORS = {"kv_error": -0.02, "pool_error": 0.05}
"""What the written log puts in against the run's predictions: vLLM's KV cache 2% smaller, its real pool 5% larger."""
LOG_HEADER = ("# SYNTHETIC: not vLLM's output. cgtune example wrote this start-up log in vLLM {version}'s format from "
              "the run's own predictions, with made-up errors put in (KV cache {kv_error:+.0%}, real graph pool "
              "{pool_error:+.0%}); `cgtune check` reads it as it reads a real one.\n")
"""The log's first line; `version` is the run's vLLM release."""


def _shipped_key(summary: dict[str, Any]) -> str:
    """summary.json's key of the list the run's files carry (the compact list, or the fastest: `tuned`)."""
    return "compact" if summary["shipped"]["list"] == "compact" else "tuned"


def run_predictions(run_dir: Path) -> dict[str, Any]:
    """What a run directory predicts for the list it ships (summary.json) and that list (compilation_config.json, as
    the run's engine reads it: vLLM 0.34's two lists as keys). `kv_cache` is the KV cache the engine keeps, `kv` what
    its "Available KV cache memory" line shows (the same in vLLM 0.33; 0.34's extensible KV cache logs the capacity it
    reserves before capture there), as the run's engine says (`kv_line_figure`)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    shipped = summary[_shipped_key(summary)]
    engine = load_run_workload(run_dir).engine
    _, kv_line = engine.kv_line_figure(shipped["kv_available_bytes"], requested_bytes=summary["requested_bytes"],
                                       non_kv_cache_bytes=summary["non_kv_cache_bytes"])
    sizes = engine.read_compilation_config(json.loads((run_dir / "compilation_config.json").read_text()))
    return {"sizes": list(sizes),
            "estimate": shipped["vllm_graph_estimate_bytes"], "kv": kv_line, "kv_cache": shipped["kv_available_bytes"],
            "pool": shipped["graph_memory_bytes"], "capture_s": shipped["capture_s"],
            "requested": summary["requested_bytes"], "total": summary["total_memory_bytes"],
            "kv_bytes_per_token": summary["kv_bytes_per_token"], "max_model_len": summary["max_model_len"],
            "non_kv": summary["non_kv_cache_bytes"],
            "kv_sized_after_capture": bool(summary.get("kv_sized_after_capture"))}


def predicted_log(run_dir: Path, *, kv_error: float, pool_error: float, tp: int = 1,
                  worst_pool_error: float | None = None, capture_s: float | None = None, **overrides: Any) -> str:
    """vLLM's start-up log for the run's shipped list, BUILT FROM THE RUN'S OWN PREDICTIONS with the errors given
    put in (KV cache: the figure of the "Available KV cache memory" line and the KV cache kept alike; real pool; the
    estimate and the capture time as predicted unless `capture_s` says otherwise), vLLM counting the KV cache in
    whole 16-token blocks; with `tp` > 1 every worker but the first off by `worst_pool_error`. The log is of the run's
    vLLM release (its engine's), with the run's KV-cache sizing. `overrides` go to `startup_log` (another list,
    runner, ...); `kv_cache_memory_bytes=N` among them writes a pinned start-up, its KV cache N (the reserved line
    prints the setting as it is; `kv_error` then moves only the KV size line's tokens). A fixture, never a
    measurement."""
    p = run_predictions(run_dir)
    kv = p["kv"] * (1 + kv_error)
    pin = overrides.get("kv_cache_memory_bytes")
    kept = p["kv_cache"] if pin is None else pin
    tokens = int(kept * (1 + kv_error) // p["kv_bytes_per_token"]) // 16 * 16
    errors = [pool_error] + [worst_pool_error if worst_pool_error is not None else pool_error] * (tp - 1)
    workers = [VllmWorker(kv, p["estimate"], p["pool"] * (1 + err),
                          capture_s=p["capture_s"] if capture_s is None else capture_s,
                          process=(f"Worker_TP{i}", 7000 + i) if tp > 1 else ("EngineCore", 4100),
                          requested_bytes=p["requested"], total_bytes=p["total"]) for i, err in enumerate(errors)]
    wl = load_run_workload(run_dir)
    spec: dict[str, Any] = dict(method=wl.serving.speculative_method, k=wl.serving.num_speculative_tokens,
                                max_num_seqs=wl.serving.max_num_seqs, runner=wl.engine.runner,
                                gpu_memory_utilization=wl.serving.gpu_memory_utilization,
                                max_model_len=p["max_model_len"], capture_sizes=p["sizes"],
                                version=f"{wl.engine.version}.0", extensible=p["kv_sized_after_capture"],
                                record=wl.engine.key_widths(p["sizes"]))
    spec.update(overrides)
    return startup_log(workers, kv_tokens=tokens, max_concurrency=tokens / spec["max_model_len"], **spec)


def example_log(run_dir: Path) -> str:
    """The log `cgtune example` writes: LOG_HEADER naming the run's vLLM release, then `predicted_log` with
    MADE_UP_ERRORS."""
    version = load_run_workload(run_dir).engine.version
    return LOG_HEADER.format(version=version, **MADE_UP_ERRORS) + predicted_log(run_dir, **MADE_UP_ERRORS)
