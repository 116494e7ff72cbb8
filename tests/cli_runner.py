"""Run `cgtune` in-process for CLI tests: exit code, stdout and stderr of one command."""

from __future__ import annotations

from typing import Any

from tuner.cli import main

__all__ = ["run"]


def run(capsys: Any, *argv: object) -> tuple[int, str, str]:
    """`cgtune ARGV...` (each argument str()-ed): (exit code, stdout, stderr)."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err
