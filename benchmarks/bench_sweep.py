"""Benchmark (not a test): how long `cgtune profile` spends per width, for sizing sweeps against the target of
~150 widths of Llama-3.1-8B in 5 minutes on one H200.

    PYTHONPATH=. python3 benchmarks/bench_sweep.py workloads/dflash-llama-3.1-8b.yaml --widths 150
    PYTHONPATH=. python3 benchmarks/bench_sweep.py workloads/tiny-cpu.yaml --device cpu --widths 40

Runs a fresh sweep into a temporary directory (or --out) and prints the wall time per width, split by
width range, from the sweep's own timestamps; nothing here is an estimate except the last line, which
says what a 150-width sweep would take at the measured mean rate.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.measure.profile import SweepOptions, candidate_widths, profile_workload, thin_widths  # noqa: E402
from tuner.workload.spec import load_workload  # noqa: E402

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload", help="workload YAML")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="device to sweep on (default cuda)")
    p.add_argument("--widths", type=int, default=150, help="thin the candidates to this many widths (default 150)")
    p.add_argument("--warmup-ms", type=float, default=None, help="warm-up budget per width and mode")
    p.add_argument("--rep-ms", type=float, default=None, help="timed budget per width and mode")
    p.add_argument("--no-standalone", action="store_true", help="skip the standalone captures")
    p.add_argument("--no-compile", action="store_true", help="sweep plain eager (default: compiled, as the profile)")
    p.add_argument("--out", type=Path, help="keep the profile here (default: a temporary directory)")
    args = p.parse_args(argv)

    workload = load_workload(args.workload)
    widths = thin_widths(candidate_widths(workload), args.widths, keep=[512])
    gpu = args.device == "cuda"
    options = SweepOptions(
        warmup_ms=args.warmup_ms if args.warmup_ms is not None else (25.0 if gpu else 2.0),
        rep_ms=args.rep_ms if args.rep_ms is not None else (100.0 if gpu else 10.0),
        min_reps=5 if gpu else 3,
        standalone=not args.no_standalone,
    )
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        t0 = time.perf_counter()
        result = profile_workload(workload, out, widths=widths, device=args.device,
                                  compile=False if args.no_compile else None,
                                  options=options, resume=False, command="benchmarks/bench_sweep.py")
        total_s = time.perf_counter() - t0
    per_width = {int(w): d["seconds"] for w, d in result.metadata["measurements"].items() if "seconds" in d}
    seconds = list(per_width.values())
    meta = result.metadata
    print(f"{meta['device_name']} | {workload.name} | {len(seconds)} widths {min(per_width)}..{max(per_width)} | "
          f"compiled={meta['compiled']} standalone={options.standalone} "
          f"warmup/rep {options.warmup_ms}/{options.rep_ms} ms")
    compile_s = f"{meta['compile_s']:.1f} s" if meta.get("compile_s") is not None else "none"
    print(f"wall time {total_s:.1f} s (setup included; compilation {compile_s}), sweep loop {sum(seconds):.1f} s")
    print(f"per width: mean {statistics.mean(seconds):.3f} s, median {statistics.median(seconds):.3f} s, "
          f"max {max(seconds):.3f} s (at {max(per_width, key=per_width.get)} tokens)")
    edges = [0, 64, 512, 2048, 4096, 10**9]
    for lo, hi in zip(edges, edges[1:]):
        bucket = [s for w, s in per_width.items() if lo < w <= hi]
        if bucket:
            print(f"  widths {lo + 1:>5}..{min(hi, max(per_width)):>5}: {len(bucket):>4} widths, "
                  f"{statistics.mean(bucket):.3f} s each, {sum(bucket):.1f} s in all")
    print(f"at the measured mean rate, 150 widths would take {150 * statistics.mean(seconds):.0f} s of sweep loop")
    return 0


if __name__ == "__main__":
    sys.exit(main())
