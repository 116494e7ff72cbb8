"""`cgtune status`: the studies in a storage, their trials done, running and failed, and the best so far."""

from __future__ import annotations

import argparse
import json

from tuner.cli import Command, UsageError

__all__ = ["StatusCommand"]


class StatusCommand(Command):
    help = "studies in an optuna storage: trials done/running/failed and the best so far"
    description = (
        "One line per study in the storage (or only --study): trials complete, running, waiting, failed\n"
        "(a failed trial whose worker died is retried: `retried` counts the reruns), the planned budget of a\n"
        "fleet study, and the best feasible expected step latency so far with its capture list.\n"
        "optuna-dashboard reads the same storage: `optuna-dashboard \"$CGTUNE_STORAGE\"`.\n"
        "The URL comes from --storage or $CGTUNE_STORAGE and is printed with its password hidden.\n\n"
        "examples:\n"
        "  cgtune status --storage sqlite:///runs/dflash/study.db\n"
        "  CGTUNE_STORAGE=postgresql+psycopg2://u:PASSWORD@db/cgtune cgtune status --study NAME --json"
    )

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--storage", metavar="URL",
                       help="optuna RDB storage URL (default: $CGTUNE_STORAGE)")
        p.add_argument("--study", metavar="NAME", help="only this study")
        p.add_argument("--json", action="store_true", help="print JSON instead of lines")

    def run(self, args: argparse.Namespace) -> int:
        from tuner.fleet import FleetError, resolve_storage, study_status
        from tuner.storage_url import display_url, sqlite_file

        try:
            url = resolve_storage(args.storage)
            # Reading must not create: SQLite would make an empty database of a mistyped path and report 0 studies.
            if (db := sqlite_file(url)) is not None and not db.is_file():
                raise FleetError(f"--storage: {display_url(url)} names no database file ({db} does not exist)")
            studies = study_status(url, args.study)
        except FleetError as exc:
            raise UsageError(str(exc)) from None
        if args.json:
            print(json.dumps({"storage": display_url(url), "studies": [
                {**s.__dict__, "done": s.done} for s in studies]}, indent=2))
            return 0
        print(f"storage {display_url(url)}: {len(studies)} {'study' if len(studies) == 1 else 'studies'}")
        for s in studies:
            c = s.counts
            budget = f"/{s.planned} planned" if s.planned is not None else ""
            state = ("done" if s.done else "in progress") if s.fleet else "single-process"
            best = "no feasible trial yet" if s.best_value is None else (
                f"best {s.best_value:.4f} ms, {len(s.best_sizes or [])} graphs, max "
                f"{(s.best_sizes or [0])[-1] if s.best_sizes else 0}")
            print(f"{s.name}: {c['complete']} complete{budget}, {c['running']} running, {c['waiting']} waiting, "
                  f"{c['failed']} failed ({c['retried']} retried)"
                  + (f", {c['gpu_validated']} GPU-validated lists" if c["gpu_validated"] else "")
                  + f"; {best} [{state}]")
        return 0
