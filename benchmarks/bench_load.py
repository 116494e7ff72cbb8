"""Load-model benchmark (not a test): how fast the scheduler simulation steps, issue 31's speed goal being 10^5 steps
in a few seconds. A Llama-3.1-8B workload (256 seqs, 8192 tokens a step) on a synthetic profile (bench_search.py's
formula: made-up latency, a timing fixture, never a measurement), under vLLM's default list, at a busy Poisson rate
(70% of the list's rate ceiling); and the same with speculation (q = 4, acceptance 2.5), where each decode draws its
accepted tokens. Prints steps/s, the distinct steps the cost model was asked about and the seconds those calls took
(timed by wrapping `CostModel.step_latency_ms` here), and the machine's load.

    python benchmarks/bench_load.py [--steps 100000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

from tuner.load.cliff import rate_ceiling
from tuner.load.scheduler import schedule
from tuner.workload.load import Lengths, Load
from tuner.model.costmodel import CostModel
from tuner.profile.table import ProfileRow, write_profile
from tuner.workload.spec import Workload, parse_workload

__all__ = ["machine", "main"]

MIB = 1 << 20
GIB = 1 << 30


def machine() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    return (f"{platform.node()} ({platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average "
            f"{load}), Python {platform.python_version()}")


def workload(num_speculative_tokens: int) -> Workload:
    return parse_workload({
        "name": f"bench-load-k{num_speculative_tokens}",
        "model": {"preset": "llama-3.1-8b", "dtype": "bfloat16"},
        "serving": {"max_num_seqs": 256, "max_num_batched_tokens": 8192, "max_model_len": 8192,
                    "num_speculative_tokens": num_speculative_tokens},
        "traffic": {"requests": {"kind": "uniform", "min": 1, "max": 256}},
    })


def synthetic_profile(out_dir: Path, wl: Workload) -> Path:
    """Eager and FULL rows on a 16-token grid up to the token budget (bench_search.py's made-up formula)."""
    rows = []
    for w in [1, 2, 4, 8] + list(range(16, wl.serving.max_num_batched_tokens + 1, 16)):
        rows.append(ProfileRow(w, "eager", "ok", latency_ms=6.0 + 0.004 * w, latency_iqr_ms=0.0))
        rows.append(ProfileRow(w, "full", "ok", latency_ms=1.5 + 0.004 * w, latency_iqr_ms=0.0,
                               capture_delta_bytes=2 * MIB + 4096 * w, standalone_bytes=64 * MIB + 600_000 * w,
                               capture_s=0.05))
    metadata = {
        "device_name": "synthetic benchmark fixture (not a measurement)",
        "total_memory_bytes": 141 * GIB, "weights_bytes": wl.model.weight_bytes(), "activation_peak_bytes": 4 * GIB,
        "kv_cache_bytes": None, "compute_capability": None, "torch_version": None, "cuda_version": None,
        "driver_version": None, "compiled": True, "device": "synthetic",
        "decode_query_len": wl.serving.decode_query_len,
        "context_len": wl.traffic.mean_context_len, "workload": {"name": wl.name, "hash": wl.content_hash},
        "created_at": None, "command": "benchmarks/bench_load.py",
        "model": {"preset": wl.model.preset, "shape": wl.model.shape.as_dict(), "dtype": wl.model.dtype,
                  "tensor_parallel_size": wl.model.tensor_parallel_size},
    }
    return write_profile(out_dir, wl.name, rows, metadata)


def _timed_latency(model: CostModel) -> list[float]:
    """Wrap the model's step latency so the seconds spent in it add up in the returned one-element list."""
    spent = [0.0]
    inner = model.step_latency_ms

    def timed(*args: object, **kwargs: object) -> float:
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            spent[0] += time.perf_counter() - t0

    model.step_latency_ms = timed  # type: ignore[method-assign]
    return spent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=100_000, help="steps a run simulates")
    p.add_argument("--repeat", type=int, default=3, help="runs of each case (best and all reported)")
    args = p.parse_args()
    print(f"machine: {machine()}")
    print("| case | rate (req/s) | steps | distinct steps costed | seconds per run (best; all) | of which cost model "
          "(s, best run) | steps/s (best) |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for k, acceptance in ((0, 1.0), (3, 2.5)):
            wl = workload(k)
            model = CostModel.from_files(synthetic_profile(Path(tmp), wl), wl)
            sizes = list(model.default_sizes)
            load = Load(Lengths(128, 1024), Lengths(64, 512), rate_per_s=1.0, acceptance=acceptance, seed=0)
            load = load.at_rate(0.7 * rate_ceiling(model, sizes, load))
            costed = _timed_latency(model)
            times, in_model = [], []
            for _ in range(args.repeat):
                costed[0] = 0.0
                t0 = time.perf_counter()
                run = schedule(model, sizes, load, duration_s=1e9, max_steps=args.steps)
                times.append(time.perf_counter() - t0)
                in_model.append(costed[0])
            steps = len(run.steps.start_s)
            best = min(times)
            print(f"| q={1 + k}, acceptance {acceptance:g}, default list (max {max(sizes)}) | {load.rate_per_s:.1f} | "
                  f"{steps} | {run.latencies_costed} | {best:.2f}; {', '.join(f'{t:.2f}' for t in times)} | "
                  f"{in_model[times.index(best)]:.2f} | {steps / best:,.0f} |")
    print(f"machine after: {machine()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
