"""`cgtune check RUN_DIR --vllm-log FILE`: hold a run's predictions to the start-up log of vLLM running its list."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.cli import Command, UsageError
from tuner.commands.common import non_negative_float

if TYPE_CHECKING:  # the library loads when the command runs, not when the CLI is built
    from tuner.check.predictions import CheckResult

__all__ = ["CheckCommand"]

GIB = 1 << 30


def _figure(unit: str, value: float, scale: float | None = None) -> str:
    """A figure in its unit; bytes in GiB, or in MiB when the row's figures (`scale`) are below 1 GiB."""
    if unit == "bytes":
        big = abs(scale if scale is not None else value) >= GIB
        return f"{value / GIB:.3f} GiB" if big else f"{value / (1 << 20):.1f} MiB"
    if unit == "tokens":
        return f"{value:,.0f}"
    if unit == "x":
        return f"{value:.2f}x"
    return f"{value:.1f} s"


class CheckCommand(Command):
    help = "compare a run's memory predictions with vLLM's own start-up log (the last step of the workflow)"
    description = (
        "Start vLLM once with the run's vllm-serve.yaml (and the workload's --speculative-config), keep its log, and\n"
        "hand it here: the capture list and settings vLLM ran with must be the run's (else one line, exit 2); then\n"
        "for vLLM's graph-memory estimate, the KV cache it sized (bytes, tokens, max concurrency), the real graph\n"
        "pool, the capture time and its non-KV memory: cgtune's prediction, vLLM's figure, the error\n"
        "(logged / predicted - 1) and whether the log line's rounding or cgtune's stated tolerance covers it.\n"
        "A run pinned by `cgtune validate --pin-kv` (summary.json's kv_pin) must be checked against vLLM started with\n"
        "its --kv-cache-memory-bytes, and an unpinned run against vLLM started without one; pinned, vLLM makes no\n"
        "estimate and logs no non-KV memory, and the KV cache, tokens and concurrency are the pin's.\n"
        "Exit 0 when it could compare, whatever the errors (1 with --fail-over), 2 on bad input.\n\n"
        "examples:\n"
        "  vllm serve --config runs/dflash/vllm-serve.yaml 2>&1 | tee vllm.log\n"
        "  cgtune check runs/dflash --vllm-log vllm.log\n"
        "  cgtune check runs/dflash --vllm-log - --json --fail-over 5 < vllm.log\n"
        "  cgtune check runs/dflash --vllm-log vllm.log --calibrate profiles/dflash-vllm.json\n"
        "  cgtune search W.yaml --profile profiles/dflash-vllm.csv --out runs/dflash-calibrated"
    )

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("run_dir", type=Path, help="output directory of `cgtune search` or `cgtune tune`")
        p.add_argument("--vllm-log", required=True, metavar="FILE",
                       help="vLLM's whole start-up log (`-`: stdin); any prefixes, other lines ignored")
        p.add_argument("--json", action="store_true", help="print the comparison as JSON")
        p.add_argument("--fail-over", type=non_negative_float, metavar="PCT",
                       help="exit 1 when any figure is more than PCT percent off its prediction and the log line's "
                            "rounding does not explain it (for a deployment's CI)")
        p.add_argument("--calibrate", type=Path, metavar="OUT.json",
                       help="write a calibrated profile: OUT.json (the run's profile metadata, non-KV memory and a "
                            "graph-memory scale from vLLM's log) and OUT.csv (the run's profile table) beside it, for "
                            "`cgtune search --profile OUT.csv`")
        p.add_argument("--force", action="store_true", help="replace an existing --calibrate pair")

    def run(self, args: argparse.Namespace) -> int:
        import tuner
        from tuner.check.predictions import CheckError, write_calibration
        from tuner.engines.vllm.startup_log import LogError

        if not args.run_dir.is_dir():
            raise UsageError(f"run_dir: {str(args.run_dir)!r} is not a directory")
        self._check_calibrate_path(args)
        try:
            result = tuner.check_log(args.run_dir, args.vllm_log,
                                     data=sys.stdin.buffer.read() if args.vllm_log == "-" else None)
        except (LogError, CheckError) as exc:
            raise UsageError(str(exc)) from None
        calibration = None
        if args.calibrate is not None:
            command = shlex.join(["cgtune", "check", str(args.run_dir), "--vllm-log", args.vllm_log, "--calibrate",
                                  str(args.calibrate)])
            try:
                calibration = write_calibration(result, args.calibrate, command=command)
            except CheckError as exc:
                raise UsageError(str(exc)) from None
        if args.json:
            print(json.dumps({**result.as_dict(), "calibration": calibration}, indent=2))
        else:
            self._print(args, result, calibration)
        over = result.over(args.fail_over) if args.fail_over is not None else []
        if over:
            print(f"cgtune check: {', '.join(over)} more than {args.fail_over:g}% off (--fail-over)", file=sys.stderr)
            return 1
        return 0

    @staticmethod
    def _check_calibrate_path(args: argparse.Namespace) -> None:
        out = args.calibrate
        if out is None:
            return
        from tuner.commands.common import check_out_dir

        if out.suffix != ".json":
            raise UsageError(f"--calibrate: {str(out)!r} must end in .json (OUT.csv is written beside it)")
        if out.with_suffix(".csv").resolve() == (args.run_dir / "profile.csv").resolve():
            raise UsageError(f"--calibrate: {str(out)!r} is the run's own profile; write the calibrated pair elsewhere")
        for path in (out, out.with_suffix(".csv")):
            if path.exists() and not args.force:
                raise UsageError(f"--calibrate: {path} exists (pass --force to replace it)")
            check_out_dir(path, "--calibrate", directory=False)

    @staticmethod
    def _print(args: argparse.Namespace, result: CheckResult, calibration: dict | None) -> None:
        log, model = result.log, result.model
        sizes = log.capture_sizes
        workers = ", ".join(w.tag or "untagged" for w in log.workers)
        print(f"cgtune check {args.run_dir} against vLLM {log.vllm_version}'s log {log.source}")
        print(f"capture list: vLLM ran the run's list {result.list_kind} ({len(sizes)} sizes, max "
              f"{model.engine.tops_text(sizes)}); "
              f"runner {(log.runner or '?').upper()} (predicted {model.runner.upper()}); {len(log.workers)} "
              f"worker(s): {workers}")
        if result.kv_pin is not None:
            pin = int(result.kv_pin["bytes"])
            print(f"KV cache: pinned, --kv-cache-memory-bytes {pin} ({pin / GIB:.3f} GiB per rank), as the run's "
                  f"summary.json records for its {result.kv_pin.get('list') or 'shipped'} list")
        print()
        print(f"{'quantity':<27} {'predicted':>14} {'vLLM logged':>14} {'error':>9}  within")
        for q in result.quantities.values():
            error = "-" if q.error is None else f"{100 * q.error:+.2f}%"
            row = max(abs(q.predicted), abs(q.logged))
            within = {"rounding": f"rounding (+-{_figure(q.unit, q.resolution, row)})",
                      "tolerance": f"tolerance ({100 * (q.tolerance or 0):g}%)", "neither": "no"}[q.within]
            print(f"{q.name:<27} {_figure(q.unit, q.predicted, row):>14} {_figure(q.unit, q.logged, row):>14} "
                  f"{error:>9}  {within}")
            if len(set(q.workers.values())) > 1:  # the workers disagree: show each
                print(f"{'':<27} per worker: "
                      + ", ".join(f"{t}: {_figure(q.unit, v, row)}" for t, v in q.workers.items()))
        print()
        from tuner.validate.validation import MEMORY_GOAL

        print(f"error = vLLM's figure / cgtune's prediction - 1; rounding: what the log line's last digit (and vLLM's "
              f"whole KV blocks) cannot resolve; tolerance: {MEMORY_GOAL:.0%} for graph memory (cgtune's validation "
              f"goal), none stated for the others")
        for note in result.notes:
            print(f"note: {note}")
        if calibration is not None:
            print(f"calibrated profile: {calibration['csv']} + {calibration['json']} (from vLLM's log: "
                  f"{', '.join(calibration['from_vllm_log'])}, scale {calibration['graph_memory_scale']:.4f}; from the "
                  f"profile: {', '.join(calibration['from_profile'])}); re-plan with `cgtune search WORKLOAD "
                  f"--profile {calibration['csv']} --out DIR`")
            again = calibration["repredicted"]
            print("with it, this list re-predicts: " + ", ".join(
                f"{name} {_figure('bytes', v['predicted'])} (vLLM {_figure('bytes', v['logged'])})"
                for name, v in again.items()))
