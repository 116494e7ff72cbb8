"""`cgtune example`: a whole run with no GPU, on the shipped synthetic profile (search, report, check)."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from tuner.cli import Command, UsageError
from tuner.commands.common import check_out_dir, positive_int

__all__ = ["ExampleCommand"]


class ExampleCommand(Command):
    help = "a whole run with no GPU on the shipped SYNTHETIC profile: search, report, a start-up log, check"
    description = (
        "Run, one after the other and printed as they run, the commands a deployment goes through after\n"
        "`cgtune profile`, on the shipped DFlash workload and a shipped SYNTHETIC profile at H200 scale (made-up\n"
        "numbers, never a measurement; its metadata, the report, the plots and the deployment files say so):\n"
        "  cgtune search WORKLOAD --profile PROFILE --out DIR   the tuned and compact lists, the deployment files\n"
        "  cgtune report DIR                                    report.md and plots/\n"
        "  (a vLLM start-up log for the shipped list, DIR/vllm-startup.synthetic.log, written from the run's own\n"
        "   predictions with made-up errors: KV cache -2%, real graph pool +5%; it stands in for `vllm serve`)\n"
        "  cgtune check DIR --vllm-log DIR/vllm-startup.synthetic.log   cgtune's figures against the log's\n"
        "Run it from a cgtune checkout (the workload and profile paths are relative to it). On a GPU,\n"
        "`cgtune tune WORKLOAD --out DIR` measures the profile instead and validates the list.\n\n"
        "examples:\n"
        "  cgtune example\n"
        "  cgtune example --out runs/example --force"
    )

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        from tuner.check.example import EXAMPLE_PROFILE, EXAMPLE_WORKLOAD

        p.add_argument("--out", type=Path, default=Path("runs/example"), metavar="DIR",
                       help="the run directory to write (default runs/example)")
        p.add_argument("--workload", default=str(EXAMPLE_WORKLOAD), metavar="FILE",
                       help=f"the workload to search (default {EXAMPLE_WORKLOAD}); the profile must be for it")
        p.add_argument("--profile", type=Path, default=EXAMPLE_PROFILE, metavar="CSV",
                       help=f"the profile to search on (default {EXAMPLE_PROFILE}, synthetic)")
        p.add_argument("--trials", type=positive_int, default=300, metavar="N",
                       help="optuna trials of the search (default 300, as `cgtune search`)")
        p.add_argument("--force", action="store_true", help="clear an earlier run of another workload in DIR")
        p.add_argument("--no-progress", action="store_true", help="no progress bar")

    def run(self, args: argparse.Namespace) -> int:
        from tuner.check.example import LOG_NAME, MADE_UP_ERRORS, example_log
        from tuner.profile.table import atomic_write_text

        for flag, path in (("--workload", Path(args.workload)), ("--profile", args.profile),
                           ("--profile", args.profile.with_suffix(".json"))):
            if not path.is_file():
                raise UsageError(f"{flag}: {str(path)!r} not found (run cgtune example from a cgtune checkout, or "
                                 f"name the file)")
        check_out_dir(args.out, "--out")
        log_path = args.out / LOG_NAME
        search = ["search", args.workload, "--profile", str(args.profile), "--out", str(args.out),
                  "--trials", str(args.trials)] + ["--force"] * args.force + ["--no-progress"] * args.no_progress
        code = _step(search) or _step(["report", str(args.out)])
        if code:
            return code
        # The start-up log `vllm serve` would print, stood in for.
        atomic_write_text(log_path, example_log(args.out))
        print(f"\n== wrote {log_path}: a SYNTHETIC vLLM start-up log for the shipped list, from the run's own "
              f"predictions with made-up errors (KV cache {MADE_UP_ERRORS['kv_error']:+.0%}, real graph pool "
              f"{MADE_UP_ERRORS['pool_error']:+.0%})", flush=True)
        code = _step(["check", str(args.out), "--vllm-log", str(log_path)])
        if code:
            return code
        print(f"\n== done: every number above is SYNTHETIC (made-up profile, written log). {args.out}/ holds the "
              f"deployment files (vllm-serve.yaml, compilation_config.json, vllm-flags.txt), report.md, plots/ and "
              f"summary.json. On a GPU: cgtune tune {args.workload} --out DIR")
        return 0


def _step(argv: list[str]) -> int:
    """`cgtune ARGV`, printed first as the user would type it: its exit code."""
    from tuner.cli import main

    print(f"\n== cgtune {shlex.join(argv)}", flush=True)
    return main(argv)
