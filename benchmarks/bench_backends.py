"""Benchmark (not a test): one workload profiled through both instruments on the same device, side by side: how far the
stand-in decoder is from the step vLLM's own runner runs.

    python benchmarks/bench_backends.py workloads/tiny-llama-cpu.yaml --device cpu --sizes 1 4 16 64 128
    python benchmarks/bench_backends.py workloads/dflash-llama-3.1-8b.yaml --max-widths 24   # a GPU host with vLLM

Each backend runs as its own `cgtune profile` process (vLLM's import sets process-wide options the other must not
inherit) into --out (default: a temporary directory), at the same widths and budgets; then, per width, each one's
eager and graph (FULL, else PIECEWISE) latency, the saving a graph brings (eager - graph), the graph memory vLLM's
capture order gives it, and stand-in / vLLM ratios. Every figure is read from the two profiles it writes.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.profile.table import Profile, read_profile  # noqa: E402

__all__ = ["main", "side_by_side"]

BACKENDS = ("stand-in", "vllm")


def _profile(backend: str, args: argparse.Namespace, out: Path) -> Path:
    cmd = [sys.executable, "-c", "from tuner.cli import main; raise SystemExit(main())", "profile", args.workload,
           "--backend", backend, "--device", args.device, "--out", str(out / backend), "--no-progress", "--fresh"]
    if args.sizes:
        cmd += ["--sizes", *map(str, args.sizes)]
    if args.max_widths:
        cmd += ["--max-widths", str(args.max_widths)]
    for flag in ("warmup_ms", "rep_ms", "min_reps"):
        if getattr(args, flag) is not None:
            cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    if args.no_compile:
        cmd.append("--no-compile")
    print(f"== {backend}: {' '.join(cmd[3:])}", flush=True)
    proc = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1], text=True, capture_output=True)
    if proc.returncode != 0:
        raise SystemExit(f"{backend} profile failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    return next((out / backend).glob("*.csv"))


def _ms(profile: Profile, mode: str, w: int) -> float | None:
    row = profile.by_mode(mode).get(w)
    return row.latency_ms if row is not None else None


def _graph(profile: Profile, w: int) -> tuple[str, float | None, int | None]:
    for mode in ("full", "piecewise"):
        row = profile.by_mode(mode).get(w)
        if row is not None:
            return mode, row.latency_ms, row.capture_delta_bytes
    return "-", None, None


def _cell(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}"


def side_by_side(stand_in: Profile, vllm: Profile) -> str:
    """The per-width table of the two profiles (widths both measured)."""
    widths = sorted(set(stand_in.by_mode("eager")) & set(vllm.by_mode("eager")))
    lines = [f"{'tokens':>7} | {'eager ms s-i':>12} {'vLLM':>8} {'ratio':>6} | {'graph ms s-i':>12} {'vLLM':>8} "
             f"{'ratio':>6} | {'saving s-i':>10} {'vLLM':>8} | {'graph MiB s-i':>13} {'vLLM':>8} {'ratio':>6}"]
    for w in widths:
        e_s, e_v = _ms(stand_in, "eager", w), _ms(vllm, "eager", w)
        _, g_s, m_s = _graph(stand_in, w)
        _, g_v, m_v = _graph(vllm, w)
        save_s = None if g_s is None or e_s is None else e_s - g_s
        save_v = None if g_v is None or e_v is None else e_v - g_v
        mib = (lambda b: None if b is None else b / 2**20)
        lines.append(f"{w:>7} | {_cell(e_s, '.3f'):>12} {_cell(e_v, '.3f'):>8} {_ratio(e_s, e_v):>6} | "
                     f"{_cell(g_s, '.3f'):>12} {_cell(g_v, '.3f'):>8} {_ratio(g_s, g_v):>6} | "
                     f"{_cell(save_s, '.3f'):>10} {_cell(save_v, '.3f'):>8} | {_cell(mib(m_s), '.1f'):>13} "
                     f"{_cell(mib(m_v), '.1f'):>8} {_ratio(m_s, m_v):>6}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload", help="workload YAML (a model both backends can build: dense, or given by config.json)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="device both run on (default cuda)")
    p.add_argument("--sizes", type=int, nargs="+", metavar="N", help="exactly these widths")
    p.add_argument("--max-widths", type=int, metavar="N", help="thin the candidates to N widths")
    p.add_argument("--warmup-ms", type=float, help="warm-up budget per width and mode (both)")
    p.add_argument("--rep-ms", type=float, help="timed budget per width and mode (both)")
    p.add_argument("--min-reps", type=int, help="at least N timed repetitions (both)")
    p.add_argument("--no-compile", action="store_true", help="both plain eager (vLLM: enforce_eager)")
    p.add_argument("--out", type=Path, help="keep both profiles here (default: a temporary directory)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        profiles = {b: read_profile(_profile(b, args, out)) for b in BACKENDS}
        meta = profiles["vllm"].metadata
        b = meta.get("backend") or {}
        print(f"\n{meta.get('device_name')} | vLLM {b.get('version')} ({b.get('distribution')}), runner "
              f"{b.get('runner')}, attention {b.get('attention_backend')} | "
              f"{'compiled' if meta.get('compiled') else 'not compiled'} | workload {args.workload}")
        print(side_by_side(profiles["stand-in"], profiles["vllm"]))
        print("ratio: stand-in / vLLM; graph: FULL where measured, else PIECEWISE; saving: eager - graph")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
