"""`cgtune validate RUN_DIR`: capture the run's default and tuned lists on the GPU, replay the workload, compare."""

from __future__ import annotations

import argparse
import math
import shlex
from pathlib import Path

from tuner.cli import Command, UsageError
from tuner.commands.common import positive_int

__all__ = ["ValidateCommand"]

GIB = 1 << 30


class ValidateCommand(Command):
    help = "capture the default and tuned lists on the GPU, replay the workload, compare with the cost model"
    description = (
        "For a run directory of `cgtune search` or `cgtune tune`: build the workload's decode model once on\n"
        "this machine's CUDA GPU; for vLLM's default, the tuned list and the exact optimum (when different)\n"
        "capture exactly that list's graphs in one shared pool in vLLM's order, read the pool's memory,\n"
        "replay the same seeded trace of workload steps (padded graph or eager, as vLLM dispatches) timing\n"
        "every step with CUDA events, and release the graphs. Writes validation.json and a section of\n"
        "report.md with a predicted-vs-measured plot. A tuned list whose measured memory leaves too little\n"
        "KV cache is replaced in the vLLM files by the fastest measured list that fits. Needs a CUDA GPU and\n"
        "no optuna: with --workload and --profile it first writes RUN_DIR itself from the exact solver\n"
        "(an optuna-free `cgtune search`), so a fresh profile is validated on the machine that measured it.\n\n"
        "examples:\n"
        "  cgtune validate runs/dflash\n"
        "  cgtune validate runs/dflash-h200 --workload workloads/dflash-llama-3.1-8b.yaml --profile P.csv\n"
        "  cgtune validate runs/suffix --steps 5000 --seed 1"
    )

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("run_dir", type=Path, help="output directory of `cgtune search` or `cgtune tune`")
        p.add_argument("--steps", type=positive_int, default=3000, metavar="N",
                       help="steps in the replayed trace (default 3000)")
        p.add_argument("--seed", type=int, default=0, help="trace seed (default 0)")
        p.add_argument("--workload", metavar="YAML", help="with --profile: write RUN_DIR from the exact solver first")
        p.add_argument("--profile", type=Path, metavar="CSV", help="with --workload: recorded profile (CSV + JSON)")
        p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                       help="cuda (default); cpu only rehearses the run where there is no GPU (graph steps run "
                            "eagerly, the record says these are no validation numbers)")
        p.add_argument("--no-emit", action="store_true",
                       help="never rewrite the vLLM files, even when the tuned list does not fit")
        p.add_argument("--allow-mismatch", action="store_true",
                       help="the run's profile was measured for another q, context length, compute capability or "
                            "compile setting: use it anyway (RUN_DIR is first re-rendered under that setting, as "
                            "`cgtune report --allow-mismatch` does, unless its search already recorded it)")

    def run(self, args: argparse.Namespace) -> int:
        from tuner.validate.validation import ValidationError, exact_run, require_cuda, validate_run

        run = args.run_dir
        if (args.workload is None) != (args.profile is None):
            raise UsageError("--workload and --profile go together (they write RUN_DIR from the exact solver)")
        if args.profile is not None:
            from tuner.commands.common import check_out_dir

            check_out_dir(run, "run_dir")  # missing parents are created, as every command's --out
            if not args.profile.is_file():
                raise UsageError(f"--profile: {str(args.profile)!r} is not a file")
            from tuner.commands.common import load_workload_arg

            load_workload_arg(args.workload)  # a bad workload is a one-line usage error, before anything is written
            try:
                if args.device == "cuda":
                    require_cuda()  # before writing RUN_DIR: a failed command leaves nothing behind
                exact_run(args.workload, args.profile, run, allow_mismatch=args.allow_mismatch, command=shlex.join(
                    ["cgtune", "validate", str(run), "--workload", str(args.workload), "--profile", str(args.profile)]
                    + (["--allow-mismatch"] if args.allow_mismatch else [])))
            except ValidationError as exc:
                raise UsageError(str(exc)) from None
            print(f"validate: wrote {run}/ from the exact solver on {args.profile}")
        if not run.is_dir():
            raise UsageError(f"run_dir: {str(run)!r} is not a directory")
        for name in ("profile.csv", "workload.yaml", "search.json"):
            if not (run / name).is_file():
                raise UsageError(f"run_dir: {str(run)!r} has no {name} (not a cgtune search or tune output directory)")
        try:
            if args.device == "cuda":
                require_cuda()
        except ValidationError as exc:
            raise UsageError(str(exc)) from None
        if args.allow_mismatch:
            _record_allow_mismatch(run)
        command = shlex.join(["cgtune", "validate", str(run), "--steps", str(args.steps), "--seed", str(args.seed)]
                             + (["--allow-mismatch"] if args.allow_mismatch else [])
                             + (["--device", "cpu"] if args.device == "cpu" else []))
        try:
            record = validate_run(run, num_steps=args.steps, seed=args.seed, command=command, emit=not args.no_emit,
                                  progress=lambda msg: print(f"validate: {msg}", flush=True), device=args.device)
        except ValidationError as exc:
            raise UsageError(str(exc)) from None
        _print_table(record)
        print(f"wrote {run / 'validation.json'} and the validation section of {run / 'report.md'}")
        return 0


def _record_allow_mismatch(run: Path) -> None:
    """Re-render RUN_DIR with allow_mismatch recorded in its summary.json (as `cgtune report --allow-mismatch`), so
    validation, which loads the run as recorded, uses the profile; nothing to do when its search recorded it."""
    from tuner.model.costmodel import ModelError
    from tuner.decision.record import decide
    from tuner.decision.run_dir import load_run, recorded_model_settings
    from tuner.report.run import write_run
    from tuner.workload.spec import WorkloadError

    if recorded_model_settings(run).get("allow_mismatch"):
        return
    try:
        model, search = load_run(run, allow_mismatch=True)
    except (ModelError, WorkloadError) as exc:
        raise UsageError(str(exc).splitlines()[0]) from None
    write_run(run, model, decide(model, search), command=f"cgtune validate {run} --allow-mismatch", copy_inputs=False)


def _fmt(x: object, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def _print_table(record: dict) -> None:
    print(f"device {record.get('device_name')}, {record['trace']['steps']} steps (seed {record['trace']['seed']})")
    print(f"{'list':<10} {'pred GiB':>9} {'meas GiB':>9} {'err':>7} {'pred ms':>9} {'meas ms':>9} {'err':>7} "
          f"{'p99 ms':>9} {'fits':>5}")
    for name in record["lists"]:
        r = record[name]
        mem = r["measured_graph_bytes"]
        print(f"{name:<10} {r['predicted_graph_bytes'] / GIB:>9.3f} {_fmt(mem and mem / GIB, '.3f'):>9} "
              f"{_fmt(r['memory_error'], '+.1%'):>7} {_fmt(r['predicted_trace_step_ms'], '.4f'):>9} "
              f"{_fmt(r['measured_step_ms'], '.4f'):>9} {_fmt(r['latency_error'], '+.1%'):>7} "
              f"{_fmt(r['p99_step_ms'], '.4f'):>9} {'yes' if r['fits'] else 'NO':>5}")
    if record.get("measured_speedup_tuned_over_default") is not None:
        print(f"measured speedup tuned over default: {record['measured_speedup_tuned_over_default']:.3f}x "
              f"(predicted {record['predicted_speedup_tuned_over_default']:.3f}x); emitted: {record.get('emitted')}")
    for w in record.get("warnings", []):
        print(f"WARNING: {w}")
