"""`cgtune status`: the studies in a storage, their trials done, running and failed, and the best so far."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tuner.cli import Command, UsageError
from tuner.commands.common import storage_url

__all__ = ["SHIP_RULE", "StatusCommand", "shipped"]

SHIP_RULE = ("decided when `cgtune search`/`tune` writes the run directory: the study's best if within 1% of the exact "
             "optimum (the exact solver's list if that is as fast with no more graph memory), else the exact list; "
             "summary.json's `source` says which")
"""What `status` says ships when it finds no run directory of the study (a fleet storage, or none written yet)."""


def shipped(url: str, study: str) -> dict[str, Any] | None:
    """What the run directory beside an SQLite study (`cgtune search`'s default storage, DIR/study.db) ships: the
    list's source, graphs and why it, not the study's best (`tuner.report.decision.ship_reason`); None when the storage
    is no SQLite file with a summary.json of this study beside it."""
    from sqlalchemy.engine import make_url

    from tuner.report.decision import ship_reason

    try:
        parsed = make_url(url)
    except Exception:  # any URL optuna accepts that sqlalchemy does not parse: nothing to look beside
        return None
    if not parsed.drivername.startswith("sqlite") or not parsed.database:
        return None
    summary = Path(parsed.database).parent / "summary.json"
    try:
        data = json.loads(summary.read_text())
        if data["study"]["name"] != study:
            return None
        source, gap = str(data["source"]), data["study"].get("gap_to_exact")
        proven = bool(data.get("exact_memory"))
        graphs = len(data["capture_sizes"])
        deployed = data.get("shipped") or {"list": "fastest"}  # runs before --ship shipped the fastest list
    except (OSError, ValueError, KeyError, TypeError):
        return None
    why = ship_reason(source, gap, proven) or {
        "gpu-validated": "measured fastest on the GPU by `cgtune tune --validate`",
        "default": "vLLM's default: nothing found was faster"}.get(source, source)
    deployed_sizes = deployed.get("capture_sizes") or data["capture_sizes"]
    shape = _shape_of(summary.parent)
    return {"source": source, "num_graphs": graphs, "exact_num_graphs": (data.get("exact") or {}).get("num_graphs"),
            "reason": why.replace("**", ""), "summary": str(summary), "deployed": deployed["list"],
            "deployed_num_graphs": len(deployed_sizes), "deployed_why": deployed.get("why"),
            "shape": shape(data["capture_sizes"]), "deployed_shape": shape(deployed_sizes)}


def _shape_of(run_dir: Path) -> Any:
    """How the run's engine words a list (`Engine.list_shape`: a vLLM 0.34 list's decode and prefill graphs), read from
    the run's workload under its recorded release; `N graphs` where the workload cannot be read."""
    from tuner.decision.run_dir import load_run_workload
    from tuner.engines.vllm.versions import VersionConflict

    try:
        engine = load_run_workload(run_dir).engine
    except VersionConflict:  # --vllm-version naming another release than the run's: refused in its own line
        raise
    except (OSError, ValueError):
        return lambda sizes: f"{len(sizes)} graphs"
    return engine.list_shape


class StatusCommand(Command):
    help = "studies in an optuna storage: trials done/running/failed and the best so far"
    description = (
        "One line per study in the storage (or only --study): trials complete, running, waiting, failed\n"
        "(a failed trial whose worker died is retried: `retried` counts the reruns), the planned budget of a\n"
        "fleet study, and the best feasible expected step latency so far with its capture list; then which\n"
        "list ships and why (the study's best or the exact solver's, from the summary.json beside an SQLite\n"
        "study; for other storages, the rule).\n"
        "optuna-dashboard reads the same storage: `optuna-dashboard \"$CGTUNE_STORAGE\"`.\n"
        "The URL comes from --storage or $CGTUNE_STORAGE and is printed with its password hidden.\n\n"
        "examples:\n"
        "  cgtune status runs/dflash                  # the run directory's own study.db\n"
        "  cgtune status --storage sqlite:///runs/dflash/study.db\n"
        "  CGTUNE_STORAGE=postgresql+psycopg2://u:PASSWORD@db/cgtune cgtune status --study NAME --json"
    )

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("run_dir", nargs="?", type=Path, metavar="RUN_DIR",
                       help="a run directory of `cgtune search`/`tune`: its study (RUN_DIR/study.db), instead of "
                            "--storage")
        p.add_argument("--storage", metavar="URL", type=storage_url,
                       help="optuna RDB storage URL (default: $CGTUNE_STORAGE)")
        p.add_argument("--study", metavar="NAME", help="only this study")
        p.add_argument("--json", action="store_true", help="print JSON instead of lines")

    def run(self, args: argparse.Namespace) -> int:
        from tuner.search.workers import FleetError, resolve_storage, study_status
        from tuner.search.storage_url import display_url, sqlite_file

        if args.run_dir is not None:
            if args.storage is not None:
                raise UsageError("RUN_DIR: give a run directory or --storage, not both")
            if not (args.run_dir / "study.db").is_file():
                raise UsageError(f"RUN_DIR: {str(args.run_dir)!r} holds no study.db (a run of `cgtune search` with "
                                 f"its default storage; for another storage pass --storage URL)")
            args.storage = f"sqlite:///{args.run_dir / 'study.db'}"
        try:
            url = resolve_storage(args.storage)
            # Reading must not create: SQLite would make an empty database of a mistyped path and report 0 studies.
            if (db := sqlite_file(url)) is not None and not db.is_file():
                raise FleetError(f"--storage: {display_url(url)} names no database file ({db} does not exist)")
            studies = study_status(url, args.study)
        except FleetError as exc:
            raise UsageError(str(exc)) from None
        ships = {s.name: shipped(url, s.name) for s in studies}
        if args.json:
            print(json.dumps({"storage": display_url(url), "studies": [
                {**s.__dict__, "done": s.done, "ships": ships[s.name] or {"rule": SHIP_RULE}} for s in studies]},
                indent=2))
            return 0
        print(f"storage {display_url(url)}: {len(studies)} {'study' if len(studies) == 1 else 'studies'}")
        for s in studies:
            c = s.counts
            budget = f"/{s.planned} planned" if s.planned is not None else ""
            state = ("done" if s.done else "in progress") if s.fleet else "single-process"
            # The list in its engine's words as the trial recorded them (a 0.34 list's decode graphs by requests);
            # a study from before they were recorded: its size count alone, which holds for every engine.
            best = "no feasible trial yet" if s.best_value is None else (
                f"best {s.best_value:.4f} ms, " + (s.best_shape or f"{len(s.best_sizes or [])} sizes"))
            print(f"{s.name}: {c['complete']} complete{budget}, {c['running']} running, {c['waiting']} waiting, "
                  f"{c['failed']} failed ({c['retried']} retried)"
                  + (f", {c['gpu_validated']} GPU-validated lists" if c["gpu_validated"] else "")
                  + f"; {best} [{state}]")
            ship = ships[s.name]
            if ship is None:
                print(f"  ships: {SHIP_RULE}")
                continue
            exact = ship["exact_num_graphs"]
            what = {"study": "the study's best", "exact": "the exact solver's list"}.get(ship["source"],
                                                                                      f"the {ship['source']} list")
            beside = (f"; the exact optimum has {exact} sizes" if ship["source"] == "study" and exact is not None else
                      ", not the study's best above" if ship["source"] == "exact" and s.best_value is not None else "")
            print(f"  tuned: {what}, {ship['shape']}{beside} ({ship['summary']}): {ship['reason']}")
            if ship["deployed"] == "compact":
                print(f"  ships: the compact list, {ship['deployed_shape']}, in the run's files: "
                      f"{ship['deployed_why']}")
            else:
                why = f": {ship['deployed_why']}" if ship["deployed_why"] else ""
                print(f"  ships: the tuned list in the run's files{why}")
        return 0
