"""Decision benchmark (not a test): what the compact choice and the saving's bootstrap interval cost and give on the
shipped DFlash workload, on bench_search.py's synthetic profile with seeded timing samples added (every eager and
full reading: `--samples` draws of a `--spread` relative normal). The numbers are made up to give the solver a
realistic shape: timing fixtures, never measurements.

    python benchmarks/bench_decision.py [--workload W.yaml] [--spread 0.02] [--samples 15] [--tolerance 0.01]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_search import ROOT, machine, synthetic_profile

from tuner.model.capture_time import predicted_capture_s
from tuner.model.costmodel import CostModel
from tuner.profile.table import read_profile, write_profile
from tuner.search.compact import choose_compact, counted_bytes
from tuner.search.exact import exact_solve
from tuner.search.saving_interval import saving_interval
from tuner.workload.spec import load_workload

__all__ = ["main", "with_samples"]

GIB = 1 << 30


def with_samples(csv_path: Path, *, spread: float, samples: int, seed: int = 3) -> Path:
    """The profile with seeded raw samples for every eager and full reading in its metadata's `measurements`, each
    reading's latency their median, as `cgtune profile` records it (spread 0: the profile as it is)."""
    if spread <= 0:
        return csv_path
    profile = read_profile(csv_path)
    rng = np.random.default_rng(seed)
    measurements: dict[str, dict[str, dict[str, list[float]]]] = {}
    rows = []
    for r in profile.rows:
        if r.mode in ("eager", "full") and r.status == "ok" and r.latency_ms is not None:
            drawn = r.latency_ms * (1 + spread * rng.standard_normal(samples))
            measurements.setdefault(str(r.num_tokens), {})[r.mode] = {"samples_ms": [float(x) for x in drawn]}
            r = dataclasses.replace(r, latency_ms=float(np.median(drawn)),
                                    latency_iqr_ms=float(np.percentile(drawn, 75) - np.percentile(drawn, 25)))
        rows.append(r)
    return write_profile(csv_path.parent, csv_path.stem, rows, {**profile.metadata, "measurements": measurements})


def _figures(model: CostModel, sizes: tuple[int, ...]) -> dict[str, object]:
    e = model.evaluate(sizes)
    return {"graphs": len(e.capture_sizes), "max": e.capture_sizes[-1] if e.capture_sizes else 0,
            "expected_step_ms": round(e.expected_step_ms, 4), "counted_gib": round(counted_bytes(model, e) / GIB, 3),
            "real_pool_gib": round(e.graph_memory_bytes / GIB, 3), "kv_gib": round(e.kv_available_bytes / GIB, 3),
            "capture_s": round(predicted_capture_s(model, e.runs_as) or 0.0, 2)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", type=Path, default=ROOT / "workloads/dflash-llama-3.1-8b.yaml")
    p.add_argument("--spread", type=float, default=0.02,
                   help="relative spread of the samples (default 0.02; 0: no samples, the synthetic profile as is)")
    p.add_argument("--samples", type=int, default=15, help="samples per reading (default 15)")
    p.add_argument("--tolerance", type=float, default=0.01, help="the compact list's tolerance (default 0.01)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        csv_path, n_widths = synthetic_profile(Path(tmp), args.workload)
        csv_path = with_samples(csv_path, spread=args.spread, samples=args.samples)
        model = CostModel.from_files(csv_path, load_workload(args.workload))
        t0 = time.perf_counter()
        exact = exact_solve(model)
        exact_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        choice = choose_compact(model, args.tolerance, fastest=exact)  # as `cgtune search` does, after its solve
        compact_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        interval = saving_interval(model, model.default_sizes, exact.best.capture_sizes)
        interval_s = time.perf_counter() - t0
        report = {
            "machine": machine(),
            "profile": f"benchmarks/bench_search.py's synthetic profile ({n_widths} widths)"
                       + (f" with seeded samples (spread {args.spread}, {args.samples} per eager and full reading, "
                          f"each reading their median)" if args.spread > 0 else "") + ": not a measurement",
            "workload": model.workload.name,
            "exact_solver_s": round(exact_s, 2), "exact_proven": exact.exact_memory,
            "exact_gap_bound": None if exact.gap is None else round(exact.gap, 6),
            "compact_choice_s": round(compact_s, 2),
            "saving_interval_s": round(interval_s, 2),
            "tuned_is_the_exact_optimum": _figures(model, exact.best.capture_sizes),
            "compact": {**_figures(model, choice.evaluation.capture_sizes), "tolerance": args.tolerance,
                        "saved_share": round(choice.saved_share(model, exact.best), 3),
                        "recommended": choice.recommended(model, exact.best), "proven": choice.proven,
                        "proven_floor_gib": round(choice.floor_bytes / GIB, 3),
                        "fastest_proven": choice.fastest_proven, "capped_solves": choice.solves},
            "default": _figures(model, model.default_sizes),
            "saving_ms": round(interval.point_ms, 4),
            "saving_interval_ms": [round(interval.low_ms, 4), round(interval.high_ms, 4)],
            "interval": interval.as_dict(),
        }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
