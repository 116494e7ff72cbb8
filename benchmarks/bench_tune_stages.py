"""Tune-stage benchmark (not a test): what each stage of `cgtune tune --profile` costs on dense synthetic profiles
(every width 1..W, eager, FULL and PIECEWISE rows: `cgtune profile --synthetic --dense`, made-up numbers, never a
measurement) at W = 2048, 8192 and 16384 under vLLM 0.33 and 0.34, issue 34's case scaled (V2 n-gram, 64 requests x
25 tokens, 4 GiB of KV cache required, 5% mixed steps spread over 256..W). Per stage: wall and process CPU seconds
(user + sys; the machine may be shared, so CPU time is what compares), and each stage's growth exponent over W
(the slope of log seconds over log W). Target (TARGET_S): the whole tune within 120 s at W = 8192 under each release.

    python benchmarks/bench_tune_stages.py [--widths 2048 8192 16384] [--releases 0.33 0.34] [--trials 300]
    python benchmarks/bench_tune_stages.py --write-profiles DIR     # the profiles and workloads alone, then exit
    PYTHONPATH=OTHER_TREE python benchmarks/bench_tune_stages.py --profiles DIR   # time another tree's code on them

The stages: `exact` (the exact solver), `study` (the optuna study, in memory), `compact` (the compact choice),
`compare`, `what_changed`, `off_peak` and `interval` (the decision record's), `report` (the run directory with
report.md) and `plots`. With --profiles the profiles are read from DIR (written by --write-profiles with this tree),
so an older tree without the synthetic generator (or the start-up budget, or work budgets) is timed on the same
inputs: its own defaults then apply.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
BASE_WORKLOAD = ROOT / "benchmarks/dense-ngram-v2.yaml"
WIDTHS = (2048, 8192, 16384)
RELEASES = ("0.33", "0.34")
TARGET_S = 120.0
"""The dense tune at W = 8192 within this many seconds on 2 cores, under each release."""
STAGES = ("exact", "study", "compact", "compare", "what_changed", "off_peak", "interval", "report", "plots")


def machine() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    return (f"{platform.node()} ({platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average "
            f"{load}), Python {platform.python_version()}")


def workload_file(out_dir: Path, width: int) -> Path:
    """issue 34's dense case with max_num_batched_tokens W and mixed steps of 256..W tokens (W/8.. for small W)."""
    spec = yaml.safe_load(BASE_WORKLOAD.read_text())
    spec["name"] = f"dense-ngram-v2-{width}"
    spec["serving"]["max_num_batched_tokens"] = width
    spec["serving"]["max_model_len"] = max(8192, width)
    spec["traffic"]["mixed_tokens"] = {"kind": "uniform", "min": min(256, width // 8), "max": width}
    path = out_dir / f"dense-{width}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def write_profiles(out_dir: Path, widths: tuple[int, ...]) -> None:
    """Each scale's workload and dense synthetic profile (one profile serves both releases: token widths)."""
    from tuner.workload.spec import load_workload
    from tuner.workload.synthetic_profile import write_synthetic_profile

    out_dir.mkdir(parents=True, exist_ok=True)
    for width in widths:
        wl_path = workload_file(out_dir, width)
        csv, n = write_synthetic_profile(out_dir, load_workload(wl_path), dense=True, name=f"dense-{width}",
                                         command="benchmarks/bench_tune_stages.py --write-profiles")
        print(f"{csv} ({n} widths)", flush=True)


class Clock:
    """Wall and process CPU seconds of each stage run through it."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    def __call__(self, name: str, make: Callable[[], Any]) -> Any:
        w, c = time.perf_counter(), time.process_time()
        out = make()
        self.wall[name] = time.perf_counter() - w
        self.cpu[name] = time.process_time() - c
        return out


def _supported(fn: Callable[..., Any], **kwargs: Any) -> dict[str, Any]:
    """The keyword arguments `fn` takes (an older tree takes fewer)."""
    params = inspect.signature(fn).parameters
    return {k: v for k, v in kwargs.items() if k in params}


def tune_stages(profile_dir: Path, width: int, release: str, trials: int,
                at_pool_bytes: int | None = None) -> dict[str, Any]:
    """One dense tune, stage by stage, as `cgtune tune --profile` runs it (in-memory study). `at_pool_bytes`: also
    the fastest list this release's exact solver finds within that real graph pool (the other release's shipped
    list's), to compare the releases' answers at no more memory (where the tree's solver takes a cap and counts the
    real pool: 0.34)."""
    os.environ["CGTUNE_VLLM_VERSION"] = release
    from tuner.decision import compare
    from tuner.model.costmodel import CostModel
    from tuner.report.plots import render_plots
    from tuner.report.run import write_run
    from tuner.search import saving_interval, study
    from tuner.workload.spec import load_workload

    wl = load_workload(profile_dir / f"dense-{width}.yaml")
    model = CostModel.from_files(profile_dir / f"dense-{width}.csv", wl,
                                 **_supported(CostModel, max_capture_s=60.0, max_graphs=1024))
    clock = Clock()
    exact = clock("exact", lambda: study.exact_solve(model))
    config = study.SearchConfig(n_trials=trials, progress=False, storage="")
    result = clock("study", lambda: study.run_search(model, config, exact=exact))
    clock("compact", lambda: study.compact_of(model, result))
    from tuner.decision import record

    # The decision record's stages, each timed where `decide` calls it (the names it imported, wrapped for the call).
    for stage, name in (("compare", "comparison"), ("what_changed", "what_changed"), ("off_peak", "off_peak"),
                        ("interval", "saving_interval")):
        original = getattr(record, name)
        setattr(record, name, lambda *a, _f=original, _s=stage, **k: clock(_s, lambda: _f(*a, **k)))
    try:
        decision = record.decide(model, result)
    finally:
        for name, module in (("comparison", compare), ("what_changed", compare), ("off_peak", compare),
                             ("saving_interval", saving_interval)):
            setattr(record, name, getattr(module, name))
    table, d = decision.table, decision.default
    with tempfile.TemporaryDirectory() as tmp:
        clock("report", lambda: write_run(Path(tmp) / "run", model, decision, plots=False))
        clock("plots", lambda: render_plots(model, decision, Path(tmp) / "plots"))
    ship = decision.ship.evaluation
    gap = d.expected_step_ms - table["ideal"].expected_step_ms

    def words(e: Any) -> dict[str, Any]:
        # graphs: None where the tree does not count them (before issue 50)
        return {"sizes": len(e.capture_sizes), "graphs": getattr(e, "num_graphs", None),
                "step_ms": round(e.expected_step_ms, 4),
                "pool_gib": round(e.graph_memory_bytes / (1 << 30), 3),
                "gap_share": round((d.expected_step_ms - e.expected_step_ms) / gap, 4) if gap else None}

    row = {"width": width, "release": release, "candidates": len(model.candidates),
           "wall_s": clock.wall, "cpu_s": clock.cpu, "shipped": words(ship)}
    if at_pool_bytes is not None and _counts_the_real_pool(model):
        # Not a stage of the tune: the release's front at the other's shipped memory, seeded with the lists it found.
        seeds = [e.capture_sizes for e in table.values() if e.feasible]
        capped = study.exact_solve(model, memory_cap_bytes=at_pool_bytes, incumbents=seeds).best
        row["at_other_pool"] = {**words(capped), "cap_gib": round(at_pool_bytes / (1 << 30), 3)}
    return row


def _counts_the_real_pool(model: Any) -> bool:
    """The tree's exact solver takes a memory cap and counts the real graph pool on it (0.34; 0.33 counts vLLM's
    estimate)."""
    try:
        from tuner.search.exact_program import memory_axis
    except ImportError:  # an older tree
        return False
    return memory_axis(model) != "estimate"


def exponents(rows: list[dict[str, Any]], key: str) -> dict[str, float | None]:
    """Per stage, the slope of log seconds over log W from the narrowest to the widest scale."""
    rows = sorted(rows, key=lambda r: r["width"])
    lo, hi = rows[0], rows[-1]
    out: dict[str, float | None] = {}
    for stage in STAGES:
        a, b = lo[key].get(stage), hi[key].get(stage)
        out[stage] = (round(math.log(b / a) / math.log(hi["width"] / lo["width"]), 2)
                      if a and b and a > 0 and b > 0 and hi["width"] > lo["width"] else None)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--widths", type=int, nargs="+", default=list(WIDTHS))
    p.add_argument("--releases", nargs="+", default=list(RELEASES), choices=RELEASES)
    p.add_argument("--trials", type=int, default=300)
    p.add_argument("--write-profiles", type=Path, metavar="DIR", help="write the inputs into DIR and exit")
    p.add_argument("--profiles", type=Path, metavar="DIR", help="read the inputs from DIR (--write-profiles)")
    args = p.parse_args()
    widths = tuple(args.widths)
    if args.write_profiles is not None:
        write_profiles(args.write_profiles, widths)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        profile_dir = args.profiles or Path(tmp)
        if args.profiles is None:
            write_profiles(profile_dir, widths)
        print(f"machine: {machine()}", flush=True)
        rows = []
        for release in args.releases:
            for width in widths:
                other = [r for r in rows if r["width"] == width]  # 0.33's row, where it ran first
                pool = round(other[0]["shipped"]["pool_gib"] * (1 << 30)) if other else None
                row = tune_stages(profile_dir, width, release, args.trials, at_pool_bytes=pool)
                rows.append(row)
                total_w, total_c = sum(row["wall_s"].values()), sum(row["cpu_s"].values())
                print(f"| {release} | {width} | " + " | ".join(
                    f"{row['cpu_s'][s]:.1f} ({row['wall_s'][s]:.1f})" for s in STAGES)
                    + f" | **{total_c:.1f} ({total_w:.1f})** | {json.dumps(row['shipped'])} |", flush=True)
                if "at_other_pool" in row:
                    print(f"  {release} at {width}: the fastest list within the other release's shipped pool: "
                          f"{json.dumps(row['at_other_pool'])}", flush=True)
        for release in args.releases:
            mine = [r for r in rows if r["release"] == release]
            if len(mine) > 1:
                print(f"growth exponents, {release} (CPU): {json.dumps(exponents(mine, 'cpu_s'))}")
        print(f"load average after: {machine()}")
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
