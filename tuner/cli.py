"""`cgtune` command line: subcommands are small classes registered in one dict, each calling the library."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from tuner import __version__

__all__ = ["Command", "UsageError", "main"]


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2, nothing written."""


class Command:
    """One subcommand: `add_arguments` declares its flags, `run` does the work and returns an exit code."""

    help = ""
    description = ""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        pass

    def run(self, args: argparse.Namespace) -> int:
        raise NotImplementedError


# name -> "module:Class"; imported only when used, so `cgtune defaults` never imports torch.
_COMMANDS: dict[str, str] = {
    "check": "tuner.commands.check:CheckCommand",
    "defaults": "tuner.commands.defaults:DefaultsCommand",
    "example": "tuner.commands.example:ExampleCommand",
    "fleet": "tuner.commands.fleet:FleetCommand",
    "profile": "tuner.commands.profile:ProfileCommand",
    "report": "tuner.commands.report:ReportCommand",
    "search": "tuner.commands.search:SearchCommand",
    "status": "tuner.commands.status:StatusCommand",
    "tune": "tuner.commands.tune:TuneCommand",
    "validate": "tuner.commands.validate:ValidateCommand",
    "worker": "tuner.commands.worker:WorkerCommand",
    "workload": "tuner.commands.workload:WorkloadCommand",
}


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the flag and value (exit 2), not a usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


_COMMON = "tuner.commands.common"
"""Every command's shared flags (`--vllm-version`), loaded by name as the commands are."""


def _common() -> Any:
    return importlib.import_module(_COMMON)


def _load(spec: str) -> Command:
    module, cls = spec.split(":")
    return getattr(importlib.import_module(module), cls)()


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Command]]:
    parser = _Parser(
        prog="cgtune",
        description="Measure and tune vLLM's cudagraph_capture_sizes for one GPU, model and workload.",
    )
    parser.add_argument("--version", action="version", version=f"cgtune {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    commands = {}
    for name, spec in _COMMANDS.items():
        command = _load(spec)
        p = sub.add_parser(name, help=command.help, description=command.description or command.help,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        command.add_arguments(p)
        _common().add_common_arguments(p)
        commands[name] = command
    return parser, commands


def main(argv: Sequence[str] | None = None) -> int:
    parser, commands = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(message)s")
    with _common().common_arguments_applied(args):
        return _run(commands[args.command], args)


def _run(command: Command, args: argparse.Namespace) -> int:
    try:
        return command.run(args)
    except (UsageError, ValueError) as exc:
        # Library validation errors (WorkloadError, vLLM-rule ValueErrors) are user input errors too.
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"cgtune {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        # A command that keeps something (a study, a sweep) re-raises with one line saying what and how to resume.
        print(f"cgtune {args.command}: {exc.args[0] if exc.args else 'interrupted'}", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # Output piped into `head` and closed early: not an error worth a traceback.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps interpreter shutdown from flushing again
        return 0


if __name__ == "__main__":
    # Run through the imported module: command modules import `tuner.cli`, and under `python -m tuner.cli`
    # this file is a second module (`__main__`) whose UsageError they would not raise.
    from tuner import cli as _cli

    sys.exit(_cli.main())
