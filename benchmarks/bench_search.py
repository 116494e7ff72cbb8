"""Search benchmark (not a test): optuna study time for 300 trials over ~400 candidate widths, and exact-solver
time, on a synthetic profile; then the rest of a tune on it (the compact choice, the decision, the run directory
with report.md and plots), each stage's seconds as summary.json's `timings` records them. The profile's numbers
are made up to give the solver a realistic shape; they are timing fixtures, never measurements. Targets (TARGETS):
study <= 10 s, exact solver <= 2 s at ~400 widths, exact-solver time growing close to linearly with the widths
(2072 widths at most 10x the time of 295), and issue 34's dense case (`--dense`: every width 1..8192 with eager,
FULL and PIECEWISE rows, the V2 n-gram fixture benchmarks/dense-ngram-v2.yaml, 64 x 25) tuned end to end in
at most 120 s.

    python benchmarks/bench_search.py [--trials 300] [--storage sqlite|memory] [--repeat 3] [--stride S] [--dense]
    python benchmarks/bench_search.py --scaling [--repeat 2] [--graph-budget-gib G]   # exact solver per stride
    python benchmarks/bench_search.py --quality     # study gap to the exact optimum over workloads x budgets
    python benchmarks/bench_search.py --write-profile DIR [--dense] [--name N]   # the synthetic profile
    python benchmarks/bench_search.py --write-profile workloads/profiles --name synthetic-dflash-llama-3.1-8b
                                                    # the shipped example's (`cgtune example`; a test holds it so)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from tuner.decision.record import decide
from tuner.model.costmodel import CostModel
from tuner.report.run import write_run
from tuner.search.study import ExactResult, SearchConfig, compact_of, exact_solve, run_search
from tuner.workload.spec import load_workload
from tuner.workload.synthetic_profile import EXAMPLE, SyntheticModel, write_synthetic_profile

__all__ = ["machine", "main", "synthetic_profile"]

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20
GIB = 1 << 30
TARGETS = {"study_s": 10, "exact_solver_s": 2, "scaling_ratio": 10, "dense_tune_s": 120}
"""Speed goals: a 300-trial study and the exact solver at ~400 widths (stride 32), the exact solver's time at
2072 widths (stride 4) over its time at 295 (stride 64), measured in one run, and `--dense`'s whole tune (the
search, the compact choice, the decision and the run directory, the exact solver's repetitions not counted)."""
DENSE_WORKLOAD = ROOT / "benchmarks/dense-ngram-v2.yaml"
"""issue 34's case: V2, 64 requests x q 25, 4 GiB of KV cache required, no drafter."""
STRIDES = (64, 32, 16, 8, 4)
"""`--scaling`: 295, 413, 650, 1124 and 2072 widths with the shipped DFlash workload."""


def synthetic_profile(out_dir: Path, workload_path: Path, *, stride: int = 32, dense: bool = False,
                      name: str = "synthetic", model: SyntheticModel | None = None) -> tuple[Path, int]:
    """The synthetic profile (`tuner.workload.synthetic_profile`, as `cgtune profile --synthetic` writes it) over the
    workload's default graphs, every decode width and a `stride` grid above the ceiling (`dense`: every width from 1 to
    max_num_batched_tokens): by default the shipped example's numbers (`EXAMPLE`), with PIECEWISE rows when `dense`;
    returns (csv path, number of widths)."""
    if model is None:
        model = dataclasses.replace(EXAMPLE, piecewise_saving_ms=2.25) if dense else EXAMPLE
    return write_synthetic_profile(out_dir, load_workload(workload_path), model=model, stride=stride, dense=dense,
                                   name=name, command="benchmarks/bench_search.py",
                                   device_name="synthetic benchmark fixture (not a measurement)",
                                   record_numbers=model is not EXAMPLE)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", type=Path, default=None,
                   help="workload file (default: workloads/dflash-llama-3.1-8b.yaml; with --dense "
                        "benchmarks/dense-ngram-v2.yaml)")
    p.add_argument("--trials", type=int, default=300)
    p.add_argument("--storage", choices=("sqlite", "memory"), default="sqlite")
    p.add_argument("--repeat", type=int, default=3, help="exact-solver repetitions (median reported; --scaling: best)")
    p.add_argument("--stride", type=int, default=32, help="width grid above the ceiling (default 32: ~400 widths)")
    p.add_argument("--dense", action="store_true", help="every width from 1 to max_num_batched_tokens")
    p.add_argument("--required-kv-gib", type=float, default=None,
                   help="override the workload's required KV so the graph budget binds (default: as the workload)")
    p.add_argument("--graph-budget-gib", type=float, default=None,
                   help="instead: the required KV that leaves this much for graphs (a budget that binds)")
    p.add_argument("--exact-seconds", type=float, default=None, help="the exact solver's time budget (default none)")
    p.add_argument("--quality", action="store_true",
                   help="instead: the study's gap to the exact optimum for four shipped workloads x graph budgets "
                        "of 0.3, 1 and 3 GiB and the unconstrained one (in-memory storage)")
    p.add_argument("--scaling", action="store_true",
                   help="instead: the exact solver alone at strides " + ", ".join(map(str, STRIDES))
                        + " (best of --repeat), and the ratio of the widest profile's time to the narrowest's")
    p.add_argument("--write-profile", type=Path, metavar="DIR",
                   help="instead: write the synthetic profile (CSV + JSON) for the workload into DIR and exit")
    p.add_argument("--name", default="synthetic",
                   help="--write-profile: the file name, without .csv (default synthetic)")
    args = p.parse_args()
    if args.workload is None:
        args.workload = DENSE_WORKLOAD if args.dense else ROOT / "workloads/dflash-llama-3.1-8b.yaml"
    if args.quality:
        return _quality(args.trials)
    if args.scaling:
        return _scaling(args)
    if args.write_profile is not None:
        csv_path, n_widths = synthetic_profile(args.write_profile, args.workload, stride=args.stride,
                                               dense=args.dense, name=args.name)
        print(f"{csv_path} ({n_widths} widths; synthetic timing fixture, not a measurement)")
        return 0

    with tempfile.TemporaryDirectory() as tmp:
        csv_path, n_widths = synthetic_profile(Path(tmp), args.workload, stride=args.stride, dense=args.dense)
        wl = load_workload(args.workload)
        model = _model(csv_path, wl, args)
        exact, exact_times = _time_exact(model, args)
        storage = None if args.storage == "sqlite" else ""
        config = SearchConfig(n_trials=args.trials, progress=False, storage=storage, exact_seconds=args.exact_seconds)
        t0 = time.perf_counter()
        result = run_search(model, config, run_dir=Path(tmp) / "run" if args.storage == "sqlite" else None)
        total_s = time.perf_counter() - t0
        # run_search solves exactly once more before the study; report the study's share separately.
        study_s = total_s - statistics.median(exact_times)
        compact_of(model, result, seconds=args.exact_seconds)
        decision = decide(model, result)
        t1 = time.perf_counter()
        write_run(Path(tmp) / "run", model, decision, command="benchmarks/bench_search.py")
        write_s = time.perf_counter() - t1
        tune_s = time.perf_counter() - t0
        report = {
            "machine": machine(),
            "workload": wl.name,
            "steps": len(model.steps),
            "candidates": len(model.candidates),
            "profile_widths": n_widths,
            "graph_budget_gib": round(model.budget.estimate_budget_bytes / GIB, 3),
            "exact_proven_optimal": exact.exact_memory,
            "exact_gap_bound": exact.gap,
            "exact_stopped_early": exact.stopped_early,
            "exact_solver_s_median": round(statistics.median(exact_times), 3),
            "exact_solver_s_all": [round(t, 3) for t in exact_times],
            "exact_memory_unit_bytes": exact.memory_unit_bytes,
            "storage": args.storage,
            "trials": result.trials,
            "study_s": round(study_s, 2),
            "run_search_total_s": round(total_s, 2),
            "study_gap_to_exact": None if result.gap is None else round(result.gap, 5),
            "source": result.source,
            "tuned_graphs": len(result.chosen.capture_sizes),
            "widths_added_above_default": len(decision.changed.above_max),
            "timings_s": {k: round(v, 2) for k, v in decision.timings.items()},
            "write_run_s": round(write_s, 2),
            "tune_total_s": round(tune_s, 2),
            "targets": {k: TARGETS[k] for k in ("study_s", "exact_solver_s", "dense_tune_s")},
        }
    print(json.dumps(report, indent=2))
    return 0


def _model(csv_path: Path, wl: object, args: argparse.Namespace) -> CostModel:
    """The cost model, its required KV overridden as the flags ask."""
    model = CostModel.from_files(csv_path, wl)  # type: ignore[arg-type]
    if args.graph_budget_gib is not None:
        model.budget = dataclasses.replace(
            model.budget, required_kv_bytes=model.budget.kv_available_bytes(0) - int(args.graph_budget_gib * GIB))
    elif args.required_kv_gib is not None:
        model.budget = dataclasses.replace(model.budget, required_kv_bytes=int(args.required_kv_gib * GIB))
    return model


def _time_exact(model: CostModel, args: argparse.Namespace) -> tuple[ExactResult, list[float]]:
    """The exact solver's answer and its wall time in each of --repeat runs."""
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        exact = exact_solve(model, seconds=args.exact_seconds)
        times.append(time.perf_counter() - t0)
    return exact, times


def machine() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    return (f"{platform.node()} ({platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average "
            f"{load}), Python {platform.python_version()}")


def _scaling(args: argparse.Namespace) -> int:
    """The exact solver alone per stride, best of --repeat, all in one run; the widest over the narrowest."""
    wl = load_workload(args.workload)
    rows = []
    print(f"machine: {machine()}")
    print(f"workload: {wl.name}; synthetic profiles (timing fixtures, not measurements); graph budget: "
          f"{'as the workload' if args.graph_budget_gib is None else f'{args.graph_budget_gib:g} GiB'}")
    print("| stride | profile widths | exact solver, best of %d (s) | proven optimal | proven gap | passes (solved over "
          "levels) |" % args.repeat)
    print("|---|---|---|---|---|---|")
    for stride in STRIDES:
        with tempfile.TemporaryDirectory() as tmp:
            csv_path, n_widths = synthetic_profile(Path(tmp), args.workload, stride=stride)
            exact, times = _time_exact(_model(csv_path, wl, args), args)
        gap = "-" if exact.gap is None else f"{exact.gap:.2%}"
        rows.append({"stride": stride, "widths": n_widths, "best_s": min(times), "proven": exact.exact_memory,
                     "gap": exact.gap, "stopped_early": exact.stopped_early})
        print(f"| {stride} | {n_widths} | {min(times):.2f} | {'yes' if exact.exact_memory else 'no'} | {gap}"
              f"{' (stopped at the time budget)' if exact.stopped_early else ''} | {exact.passes} "
              f"({exact.level_solves}) |", flush=True)
    ratio = rows[-1]["best_s"] / rows[0]["best_s"]
    print(f"ratio {rows[-1]['widths']} / {rows[0]['widths']} widths: {ratio:.1f} (target <= "
          f"{TARGETS['scaling_ratio']}; width ratio {rows[-1]['widths'] / rows[0]['widths']:.1f})")
    print(f"load average after: {machine()}")
    return 0


def _quality(trials: int) -> int:
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
                             "exact_proven": result.exact.exact_memory, "exact_gap_bound": result.exact.gap,
                             "source": result.source, "graphs": len(result.chosen.capture_sizes),
                             "seconds": round(time.perf_counter() - t0, 2)})
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
