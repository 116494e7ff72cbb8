"""`cgtune fleet`: profile, search and validate a catalogue of deployments as Ray tasks (`run`), and read the results
store back (`status`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tuner.cli import Command, UsageError
from tuner.commands.common import check_out_dir

__all__ = ["FleetCommand"]

_CATALOGUE_EXAMPLE = """\
catalogue (YAML; paths relative to its folder):
  store: results/fleet            # the results store: a directory every node can write (shared filesystem)
  storage: postgresql+psycopg2://cgtune:PW@db/cgtune   # optional: every search's optuna study goes there
  max_retries: 3                  # Ray retries of a task whose worker or node died (default 3)
  defaults: {max_widths: 40, trials: 100, validate_steps: 3000}
  deployments:
    - {name: dflash-h200, workload: workloads/dflash-llama-3.1-8b.yaml, gpu_kind: H200}
    - {workload: workloads/suffix-llama-3.1-70b-tp2.yaml, gpu_kind: H100}   # 2 GPUs: its tensor_parallel_size
  per deployment (defaults: the same keys but name, workload, search_profile): name (default WORKLOAD-KIND),
  workload, gpu_kind (Ray accelerator type, resource accelerator_type:KIND; `cpu`: --device cpu, no GPU),
  backend (auto|vllm|stand-in), sizes or max_widths, warmup_ms, rep_ms, min_reps, trials (0: exact solver
  only), validate_steps (0: no validation), search_profile (cpu only: a profile with graph rows to search,
  as a rehearsal; a CPU profile has none)"""


class FleetCommand(Command):
    help = "profile, search and validate many deployments as Ray tasks on their GPU kinds; read the results store"
    description = (
        "`cgtune fleet run CATALOGUE` turns each deployment of the catalogue into Ray tasks: a profile asking\n"
        "for tensor_parallel_size GPUs of its kind (Ray resource accelerator_type:KIND), then a search and a\n"
        "validate task on the same kind. Results land in the catalogue's store: per deployment status.json,\n"
        "profile/ (CSV + JSON with the device metadata), run/ (the run directory), and index.json / index.md.\n"
        "A task whose worker or node dies is retried by Ray and its profile resumes from the widths it had; a\n"
        "rerun skips deployments whose result is current (same workload hash, GPU kind, backend and versions,\n"
        "same settings) and redoes stale ones. A GPU kind no node has fails at once with its reason.\n"
        "`cgtune fleet status STORE` prints the index (a run in progress included).\n"
        "For one study's expensive trials shared by workers, see `cgtune worker` (docs/fleet.md).\n\n"
        f"{_CATALOGUE_EXAMPLE}\n\n"
        "examples:\n"
        "  cgtune fleet run fleet.yaml                          # a local Ray cluster on this machine\n"
        "  cgtune fleet run fleet.yaml --address ray-head:6379  # join a running cluster\n"
        "  cgtune fleet status results/fleet --json"
    )

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        sub = p.add_subparsers(dest="fleet_command", metavar="ACTION", required=True)
        run = sub.add_parser("run", help="run a catalogue's deployments on a Ray cluster",
                             description="Run every deployment of CATALOGUE (profile, search, validate) as Ray "
                                         "tasks; prints one line per deployment as it moves, then the index.\n\n"
                                         + _CATALOGUE_EXAMPLE,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
        run.add_argument("catalogue", type=Path, help="catalogue YAML (the store, the deployments)")
        run.add_argument("--address", metavar="ADDR",
                         help="join the Ray cluster at ADDR (host:6379, ray://host:10001, auto); none: start a local "
                              "one for this run (or join $RAY_ADDRESS, as ray.init does) and stop it after")
        run.add_argument("--poll", type=float, default=0.5, metavar="S",
                         help="seconds between looks at the store for progress (default 0.5)")
        run.add_argument("--json", action="store_true", help="print the index as JSON at the end instead of a table")
        status = sub.add_parser("status", help="print a results store's index (deployment, GPU kind, status, "
                                               "shipped list, predicted saving)")
        status.add_argument("store", type=Path, help="the results store (the catalogue's `store:`)")
        status.add_argument("--json", action="store_true", help="the index as JSON")

    def run(self, args: argparse.Namespace) -> int:
        if args.fleet_command == "status":
            return self._status(args)
        return self._run(args)

    @staticmethod
    def _status(args: argparse.Namespace) -> int:
        from tuner.fleet.store import index_table, read_index

        try:
            index = read_index(args.store)
        except ValueError as exc:
            raise UsageError(f"store: {exc}") from None
        print(json.dumps(index, indent=2, default=str) if args.json else index_table(index))
        return 0

    @staticmethod
    def _run(args: argparse.Namespace) -> int:
        from tuner.fleet.catalogue import CatalogueError, load_catalogue
        from tuner.fleet.runner import FleetRunError, run_catalogue
        from tuner.fleet.store import index_table

        if not args.poll > 0:
            raise UsageError(f"--poll: {args.poll} must be > 0")
        try:
            catalogue = load_catalogue(args.catalogue)
        except CatalogueError as exc:
            raise UsageError(str(exc)) from None
        check_out_dir(catalogue.store, "store")
        t0 = time.monotonic()
        try:
            index = run_catalogue(catalogue, address=args.address, poll_s=args.poll,
                                  progress=lambda line: print(line, flush=True))
        except FleetRunError as exc:
            raise UsageError(str(exc)) from None
        except KeyboardInterrupt:
            raise KeyboardInterrupt(f"interrupted: {catalogue.store} keeps each deployment's status and the widths its "
                                    f"profile had; rerun the same command to resume") from None
        print(json.dumps(index, indent=2, default=str) if args.json else index_table(index))
        failed = [e["deployment"] for e in index["deployments"] if e["status"] != "done"]
        print(f"fleet: {len(index['deployments']) - len(failed)} of {len(index['deployments'])} deployments done in "
              f"{time.monotonic() - t0:.0f} s; index {catalogue.store / 'index.json'}", file=sys.stderr)
        return 1 if failed else 0
