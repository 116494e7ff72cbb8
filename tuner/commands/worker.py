"""`cgtune worker`: claim and run trials of a shared fleet study until its planned budget has run."""

from __future__ import annotations

import argparse
import re

from tuner.cli import Command, UsageError
from tuner.commands.common import positive_int, storage_url

__all__ = ["WorkerCommand", "device_arg"]

_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")


def device_arg(text: str) -> str:
    """argparse type: `cpu`, `cuda` or `cuda:N`."""
    if not _DEVICE.match(text):
        raise argparse.ArgumentTypeError(f"{text!r} must be cpu, cuda or cuda:N")
    return text


class WorkerCommand(Command):
    help = "run trials of a shared study (optuna RDB storage) until its budget is spent"
    description = (
        "Join a fleet study created by `cgtune tune --storage URL --workers N` (N may be 0: plan only) and run\n"
        "its waiting trials until none is waiting or running; run one worker per GPU, on any number of hosts.\n"
        "The study carries the workload, the profile and the objective, so a worker needs only the storage\n"
        "URL and the study name. Optuna heartbeats mark a trial whose worker died; the next worker fails it\n"
        "and reruns it (optuna's RetryFailedTrialCallback), so nothing is lost or counted twice.\n"
        "The URL comes from --storage or from $CGTUNE_STORAGE (better: keeps a password out of `ps` and\n"
        "shell history); it is never printed with its password.\n\n"
        "examples:\n"
        "  export CGTUNE_STORAGE=postgresql+psycopg2://cgtune:PASSWORD@db-host/cgtune\n"
        "  cgtune status                                        # study names\n"
        "  CUDA_VISIBLE_DEVICES=0 cgtune worker --study NAME --device cuda:0 &\n"
        "  CUDA_VISIBLE_DEVICES=1 cgtune worker --study NAME --device cuda:1 &"
    )

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--storage", metavar="URL", type=storage_url,
                       help="optuna RDB storage URL (default: $CGTUNE_STORAGE), e.g. postgresql+psycopg2://u:p@h/db")
        p.add_argument("--study", required=True, metavar="NAME",
                       help="study to work on (printed by `cgtune tune --storage URL` and `cgtune status`)")
        p.add_argument("--device", type=device_arg, metavar="DEV",
                       help="this worker's device (cpu, cuda, cuda:N), recorded with each trial it runs; the "
                            "cost-model trials of a tune study run on the CPU")
        p.add_argument("--max-trials", type=positive_int, metavar="N",
                       help="stop after running N trials (default: until the study's budget has run)")
        p.add_argument("--poll", type=float, default=0.5, metavar="S",
                       help="seconds between checks while other workers' trials run (default 0.5)")
        p.add_argument("--no-progress", action="store_true", help="no progress bar")

    def run(self, args: argparse.Namespace) -> int:
        from tuner.search.workers import FleetError, resolve_storage, run_worker

        try:
            url = resolve_storage(args.storage)
            counts = run_worker(url, args.study, device=args.device, poll_s=max(0.05, args.poll),
                                max_trials=args.max_trials, progress=not args.no_progress)
        except FleetError as exc:
            raise UsageError(str(exc)) from None
        print(f"worker done: {counts['complete']} trials complete, {counts['failed']} failed (study {args.study})")
        return 0

