"""`cgtune report`: re-render a run directory's report.md, plots, summary.json and vLLM files from its files."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.cli import Command, UsageError
from tuner.commands.common import check_out_dir

if TYPE_CHECKING:
    from tuner.model.costmodel import CostModel
    from tuner.decision.record import Decision

__all__ = ["ReportCommand"]


class ReportCommand(Command):
    help = "re-render report.md, plots and summary.json of a `cgtune search`/`tune` run directory"
    description = (
        "Rebuild the cost model from the run directory's own copies (profile.csv/.json, workload.yaml),\n"
        "re-evaluate the lists in search.json, and write report.md, plots/*.png, summary.json and the vLLM\n"
        "files again: report.md and summary.json come out byte-identical (they name the command and profile\n"
        "that made the run). Needs no GPU and runs no search.\n\n"
        "examples:\n"
        "  cgtune report runs/dflash\n"
        "  cgtune report runs/dflash --csv runs/dflash/widths.csv"
    )

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("run_dir", type=Path, help="output directory of `cgtune search` or `cgtune tune`")
        p.add_argument("--force", action="store_true",
                       help="re-render even when summary.json names another workload or profile than the copies "
                            "(workload.yaml, profile.csv) it is rendered from")
        p.add_argument("--csv", metavar="FILE",
                       help="also write the per-width table (one row per measured width: each mode's latency and "
                            "graph memory as measured, the FULL graph's saving, noisy and outlier flags, and which "
                            "lists hold the width) as CSV to FILE (`-`: stdout), for pandas.read_csv in a notebook")
        p.add_argument("--allow-mismatch", action="store_true",
                       help="use the run's profile even when it was measured for another q, context length, compute "
                            "capability or compile setting (a note in the report; recorded for later re-renders)")

    def run(self, args: argparse.Namespace) -> int:
        from tuner.model.costmodel import ModelError
        from tuner.decision.record import decide
        from tuner.decision.run_dir import load_run, recorded_decision, recorded_origin, run_conflict
        from tuner.report.run import words_of, write_run
        from tuner.workload.spec import WorkloadError

        if not args.run_dir.is_dir():
            raise UsageError(f"run_dir: {str(args.run_dir)!r} is not a directory")
        try:
            model, search = load_run(args.run_dir, allow_mismatch=True if args.allow_mismatch else None)
        except (ModelError, WorkloadError) as exc:
            raise UsageError(str(exc)) from None
        conflict = run_conflict(args.run_dir, model.workload, args.run_dir / "profile.csv")
        if conflict is not None and not args.force:
            raise UsageError(f"run_dir: {conflict} (its files are mixed); pass --force to re-render every output "
                             f"from its workload.yaml and profile.csv")
        check_out_dir(args.run_dir, "run_dir")  # a folder this user may not write in: one line, before any work
        if args.csv not in (None, "-"):
            check_out_dir(Path(args.csv), "--csv", directory=False)
        # The run says what made it: the command and the profile its summary records (a forced re-render of mixed
        # files is a new rendering of its copies, and says so).
        command, profile = recorded_origin(args.run_dir) if conflict is None else (None, None)
        # Rendered from the decision the run recorded (nothing solved or bootstrapped again); decided anew only for
        # mixed files, other model settings (--allow-mismatch) or a summary older than a field.
        recorded = recorded_decision(args.run_dir, model, search) if conflict is None else None
        dec = recorded or decide(model, search)
        try:
            written = write_run(args.run_dir, model, dec, command=command or f"cgtune report {args.run_dir}",
                                copy_inputs=False, profile_name=profile)
        except OSError as exc:  # staged, then moved: nothing is half-written when the folder refuses a file
            raise UsageError(f"run_dir: {str(args.run_dir)!r} cannot be written: {exc.strerror or exc}") from None
        out = sys.stderr if args.csv == "-" else sys.stdout  # stdout then carries the table alone
        print(f"wrote {len(written)} files into {args.run_dir}/: report.md, summary.json, plots/, "
              f"{model.engine.label} files", file=out)
        print(words_of(model.engine).files_shipped_line(model, dec, args.run_dir), file=out)
        if args.csv is not None:
            self._write_csv(args, model, dec)
        return 0

    @staticmethod
    def _write_csv(args: argparse.Namespace, model: CostModel, dec: Decision) -> None:
        from tuner.profile.table import atomic_write_text, read_profile
        from tuner.report.width_table import width_table

        frame = width_table(model, read_profile(args.run_dir / "profile.csv"), dec.table,
                            dec.ship.evaluation.capture_sizes)
        text = frame.to_csv(index=False)
        if args.csv == "-":
            sys.stdout.write(text)
            return
        try:
            atomic_write_text(Path(args.csv), text)
        except OSError as exc:
            raise UsageError(f"--csv: {args.csv!r} cannot be written: {exc.strerror or exc}") from None
        print(f"wrote {args.csv}: {len(frame)} widths x {len(frame.columns)} columns")
