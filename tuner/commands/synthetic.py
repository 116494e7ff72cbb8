"""`cgtune profile --synthetic`: a made-up profile for any workload, with no device (`tuner.workload.synthetic_profile`),
for planning and trying cgtune on one's own model: its flags, and writing it."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from tuner.cli import UsageError
from tuner.commands.common import check_out_dir, load_workload_arg

__all__ = ["add_synthetic_arguments", "run_synthetic"]

MIB = 1 << 20
_MEASURING = ("sizes", "max_widths", "dry_run", "max_seconds", "warmup_ms", "rep_ms", "min_reps", "rounds")
"""Flags of a measurement that a synthetic profile has no use for: refused beside --synthetic."""


_FLAGS = {"eager_base_ms": "--eager-ms A", "eager_per_token_ms": "--eager-ms B", "full_saving_ms": "--full-saving-ms",
          "piecewise_saving_ms": "--piecewise-saving-ms", "delta_base_bytes": "--graph-delta (bytes)",
          "delta_per_token_bytes": "--graph-delta BYTES", "standalone_base_bytes": "--graph-alone (bytes)",
          "standalone_per_token_bytes": "--graph-alone BYTES", "capture_s": "--capture-s",
          "total_memory_gib": "--total-memory-gib"}
"""SyntheticModel's fields by the flag that sets them, for a refusal's one line."""


def add_synthetic_arguments(p: argparse.ArgumentParser) -> None:
    """--synthetic and the numbers it makes the profile from (the defaults: an 8B-class model on a 141 GiB GPU)."""
    g = p.add_argument_group(
        "synthetic profile (no GPU)",
        "--synthetic writes OUT/<name>.csv and .json with MADE-UP numbers for the workload, at any scale and under "
        "either vLLM release, touching no device: an eager step of A + B x width ms, a FULL graph C ms faster, a "
        "PIECEWISE graph D ms faster, graph memory growing with width, a fixed capture time per graph. `cgtune search` "
        "and `tune --profile` accept it; every report, plot and file made from it says SYNTHETIC. For planning and "
        "trying cgtune on a model without a GPU: never a measurement, never a result to ship.")
    g.add_argument("--synthetic", action="store_true", help="write a synthetic profile instead of measuring")
    g.add_argument("--dense", action="store_true",
                   help="with --synthetic: every width 1..max_num_batched_tokens (default: vLLM's default graphs, "
                        "every decode width and a --stride grid above the 512 ceiling)")
    g.add_argument("--eager-ms", type=float, nargs=2, default=(7.0, 0.003), metavar=("A", "B"),
                   help="eager step latency A + B x width ms (default 7 0.003)")
    g.add_argument("--full-saving-ms", type=float, default=1.0, metavar="C",
                   help="a FULL graph's step is C ms faster than the eager one (default 1)")
    g.add_argument("--piecewise-saving-ms", type=float, default=0.6, metavar="D",
                   help="a PIECEWISE graph's step is D ms faster than the eager one (default 0.6)")
    g.add_argument("--graph-delta", type=float, nargs=2, default=(2.0, 1024), metavar=("MIB", "BYTES"),
                   help="a graph's capture delta in the shared pool: MIB MiB + BYTES per token (default 2 1024)")
    g.add_argument("--graph-alone", type=float, nargs=2, default=(128.0, 200_000), metavar=("MIB", "BYTES"),
                   help="a graph's footprint captured alone (its activations): MIB MiB + BYTES per token (default "
                        "128 200000)")
    g.add_argument("--capture-s", type=float, default=0.05, metavar="S",
                   help="seconds one graph's capture takes (default 0.05)")
    g.add_argument("--total-memory-gib", type=float, default=141.0, metavar="GIB",
                   help="the device's memory (default 141)")


def run_synthetic(args: argparse.Namespace) -> int:
    """Write the synthetic profile; every bad number or flag is one line naming it, before anything is written."""
    from tuner.workload.synthetic_profile import SyntheticModel, write_synthetic_profile

    workload = load_workload_arg(args.workload)
    name = args.name or f"{workload.name}.synthetic"
    if any(c in name for c in "/\\") or not name.strip():
        raise UsageError(f"--name: {name!r} must be a plain file stem")
    for flag in _MEASURING:
        if getattr(args, flag, None) not in (None, False):
            raise UsageError(f"--{flag.replace('_', '-')}: measures a device; --synthetic makes its numbers up")
    check_out_dir(args.out)
    try:
        model = SyntheticModel(
            eager_base_ms=args.eager_ms[0], eager_per_token_ms=args.eager_ms[1], full_saving_ms=args.full_saving_ms,
            piecewise_saving_ms=args.piecewise_saving_ms, delta_base_bytes=int(args.graph_delta[0] * MIB),
            delta_per_token_bytes=int(args.graph_delta[1]), standalone_base_bytes=int(args.graph_alone[0] * MIB),
            standalone_per_token_bytes=int(args.graph_alone[1]), capture_s=args.capture_s,
            total_memory_gib=args.total_memory_gib)
    except (ValueError, OverflowError) as exc:
        text = str(exc)
        for field, flag in _FLAGS.items():
            text = text.replace(f"{field}=", f"{flag} ")
        raise UsageError(f"--synthetic: {text}") from None
    command = shlex.join(["cgtune", "profile", str(args.workload), "--synthetic", "--out", str(args.out)]
                         + (["--dense"] if args.dense else []) + (["--name", args.name] if args.name else []))
    csv, widths = write_synthetic_profile(Path(args.out), workload, model=model, stride=args.stride,
                                          dense=args.dense, name=name, command=command)
    print(f"SYNTHETIC profile (made-up numbers, not a measurement): {csv} and {csv.with_suffix('.json')}, "
          f"{widths} widths up to {workload.serving.max_num_batched_tokens} tokens")
    print(f"search it: cgtune search {shlex.quote(str(args.workload))} --profile {shlex.quote(str(csv))} "
          f"--out DIR")
    return 0
