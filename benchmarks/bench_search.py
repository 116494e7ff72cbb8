"""Search benchmark (not a test): optuna study time for 300 trials over ~400 candidate widths, and exact-solver
time, on a synthetic profile. The profile's numbers are made up to give the solver a realistic shape; they are
timing fixtures, never measurements. Targets: study <= 10 s, exact solver <= 2 s.

    python benchmarks/bench_search.py [--trials 300] [--storage sqlite|memory] [--repeat 3]
    python benchmarks/bench_search.py --quality     # study gap to the exact optimum over workloads x budgets
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

from tuner.costmodel import CostModel
from tuner.profile_table import ProfileRow, write_profile
from tuner.search import SearchConfig, exact_solve, run_search
from tuner.workload import load_workload

__all__ = ["main", "synthetic_profile"]

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20
GIB = 1 << 30


def synthetic_profile(out_dir: Path, workload_path: Path, *, stride: int = 32) -> tuple[Path, int]:
    """A profile over vLLM's default grid, every decode width n*q and a `stride` grid above the ceiling, with
    made-up latency (launch overhead plus work) and memory; returns (csv path, number of widths)."""
    wl = load_workload(workload_path)
    s = wl.serving
    q = s.decode_query_len
    widths = set(wl.engine.defaults().sizes) | {n * q for n in range(1, s.max_num_seqs + 1)}
    widths |= set(range(512 + stride, s.max_num_batched_tokens + 1, stride))
    widths = sorted(w for w in widths if w <= s.max_num_batched_tokens)
    rows = []
    for w in widths:
        eager = 6.0 + 0.004 * w  # synthetic: ~6 ms of launches, work growing with width
        graph = 1.5 + 0.004 * w + 0.0004 * (w % 64)  # synthetic: launches gone, a little padding noise
        rows.append(ProfileRow(w, "eager", "ok", latency_ms=eager, latency_iqr_ms=0.0))
        rows.append(ProfileRow(w, "full", "ok", latency_ms=graph, latency_iqr_ms=0.0,
                               capture_delta_bytes=2 * MIB + 4096 * w, standalone_bytes=64 * MIB + 600_000 * w,
                               capture_s=0.05))
        if wl.drafter is not None:  # synthetic drafter passes: a fifth of the target's work
            rows.append(ProfileRow(w, "drafter_eager", "ok", latency_ms=eager / 5, latency_iqr_ms=0.0))
            rows.append(ProfileRow(w, "drafter_full", "ok", latency_ms=graph / 5, latency_iqr_ms=0.0,
                                   capture_delta_bytes=MIB + 1024 * w, standalone_bytes=16 * MIB + 150_000 * w,
                                   capture_s=0.01))
    metadata = {
        "device_name": "synthetic benchmark fixture (not a measurement)",
        "total_memory_bytes": 141 * GIB, "weights_bytes": wl.model.weight_bytes(),
        "activation_peak_bytes": 4 * GIB, "kv_cache_bytes": None, "compute_capability": None,
        "torch_version": None, "cuda_version": None, "driver_version": None, "compiled": True, "device": "synthetic",
        "decode_query_len": q, "context_len": wl.traffic.mean_context_len,
        "workload": {"name": wl.name, "hash": wl.content_hash}, "created_at": None,
        "command": "benchmarks/bench_search.py",
        "model": {"preset": wl.model.preset, "shape": wl.model.shape.as_dict(), "dtype": wl.model.dtype,
                  "tensor_parallel_size": wl.model.tensor_parallel_size},
    }
    return write_profile(out_dir, "synthetic", rows, metadata), len(widths)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", type=Path, default=ROOT / "workloads/dflash-llama-3.1-8b.yaml")
    p.add_argument("--trials", type=int, default=300)
    p.add_argument("--storage", choices=("sqlite", "memory"), default="sqlite")
    p.add_argument("--repeat", type=int, default=3, help="exact-solver repetitions (median reported)")
    p.add_argument("--required-kv-gib", type=float, default=None,
                   help="override the workload's required KV so the graph budget binds (default: as the workload)")
    p.add_argument("--quality", action="store_true",
                   help="instead: the study's gap to the exact optimum for four shipped workloads x graph budgets "
                        "of 0.3, 1 and 3 GiB and the unconstrained one (in-memory storage)")
    args = p.parse_args()
    if args.quality:
        return _quality(args.trials)

    with tempfile.TemporaryDirectory() as tmp:
        csv_path, n_widths = synthetic_profile(Path(tmp), args.workload)
        wl = load_workload(args.workload)
        model = CostModel.from_files(csv_path, wl)
        if args.required_kv_gib is not None:
            import dataclasses

            model.budget = dataclasses.replace(model.budget, required_kv_bytes=int(args.required_kv_gib * GIB))
        exact_times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            exact = exact_solve(model)
            exact_times.append(time.perf_counter() - t0)
        storage = None if args.storage == "sqlite" else ""
        config = SearchConfig(n_trials=args.trials, progress=False, storage=storage)
        t0 = time.perf_counter()
        result = run_search(model, config, run_dir=Path(tmp) / "run" if args.storage == "sqlite" else None)
        total_s = time.perf_counter() - t0
        # run_search solves exactly once more before the study; report the study's share separately.
        study_s = total_s - statistics.median(exact_times)
        report = {
            "machine": f"{platform.node()} ({platform.processor() or platform.machine()}), Python "
                       f"{platform.python_version()}",
            "workload": wl.name,
            "steps": len(model.steps),
            "candidates": len(model.candidates),
            "profile_widths": n_widths,
            "graph_budget_gib": round(model.budget.estimate_budget_bytes / GIB, 3),
            "exact_proven_optimal": exact.exact_memory,
            "exact_solver_s_median": round(statistics.median(exact_times), 3),
            "exact_solver_s_all": [round(t, 3) for t in exact_times],
            "exact_memory_unit_bytes": exact.memory_unit_bytes,
            "storage": args.storage,
            "trials": result.trials,
            "study_s": round(study_s, 2),
            "run_search_total_s": round(total_s, 2),
            "study_gap_to_exact": None if result.gap is None else round(result.gap, 5),
            "source": result.source,
            "targets": {"study_s": 10, "exact_solver_s": 2},
        }
    print(json.dumps(report, indent=2))
    return 0


def _quality(trials: int) -> int:
    import dataclasses

    rows = []
    for name in ("dflash-llama-3.1-8b", "suffix-llama-3.1-8b", "mtp1-qwen3-8b", "eagle-llama-3.2-1b"):
        path = ROOT / "workloads" / f"{name}.yaml"
        with tempfile.TemporaryDirectory() as tmp:
            csv_path, _ = synthetic_profile(Path(tmp), path)
            model = CostModel.from_files(csv_path, load_workload(path))
            unconstrained = model.budget
            for budget_gib in (0.3, 1.0, 3.0, None):
                model.budget = unconstrained if budget_gib is None else dataclasses.replace(
                    unconstrained, required_kv_bytes=unconstrained.kv_available_bytes(0) - int(budget_gib * GIB))
                t0 = time.perf_counter()
                result = run_search(model, SearchConfig(n_trials=trials, progress=False, storage=""))
                rows.append({"workload": name, "candidates": len(model.candidates), "graph_budget_gib": budget_gib,
                             "gap_to_exact": None if result.gap is None else round(result.gap, 5),
                             "source": result.source, "graphs": len(result.chosen.capture_sizes),
                             "seconds": round(time.perf_counter() - t0, 2)})
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
