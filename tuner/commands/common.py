"""Argument types and helpers shared by subcommands."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tuner.cli import UsageError
from tuner.engines.vllm.defaults import InvalidScheduleError, validate_schedule
from tuner.engines.vllm.versions import DEFAULT_VERSION, VERSION_ENV, VERSIONS, flag_version
from tuner.workload.spec import Workload, WorkloadError, load_workload

__all__ = ["add_common_arguments", "capability", "check_out_dir", "common_arguments_applied", "load_workload_arg",
           "non_negative_float", "non_negative_int", "positive_float", "positive_int", "request_count", "schedule_json",
           "storage_url"]


def _int_at_least(minimum: int, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{value} must be >= {minimum}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _int_at_least(1, text)


def request_count(text: str) -> int:
    """argparse type: a number of requests per step, 1..MAX_NUM_SEQS (`tuner.engines.serving.check_max_num_seqs`)."""
    from tuner.engines.serving import check_max_num_seqs

    value = _int_at_least(1, text)
    try:
        return check_max_num_seqs(value, "value")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("value: ")) from None


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _int_at_least(0, text)


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (a rate, a time, a target)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 < value < float("inf"):  # also refuses nan
        raise argparse.ArgumentTypeError(f"{value:g} must be a finite number > 0")
    return value


def non_negative_float(text: str) -> float:
    """argparse type: a finite number >= 0 (a time budget, a percentage)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{value} must be a finite number >= 0")
    return value


def capability(text: str) -> tuple[int, int]:
    """argparse type: compute capability written `major.minor` (9.0, 10.0)."""
    from tuner.engines.serving import parse_capability

    try:
        return parse_capability(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} {exc}") from None


def storage_url(text: str) -> str:
    """argparse type: an optuna storage URL; a plain path (runs/x/study.db) is refused with the URL it should be."""
    if "://" not in text:
        raise argparse.ArgumentTypeError(f"{text!r} is a path, not a storage URL: an SQLite file is "
                                         f"sqlite:///{text}" + (" (`cgtune status DIR` takes a run directory)"
                                                                if text.endswith(".db") else ""))
    return text


def schedule_json(text: str) -> list[list[int]]:
    """argparse type: a JSON list of [start, end, K] triples (vLLM's num_speculative_tokens_per_batch_size)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON (expected [[1,16,3],[17,256,1]])") from None
    if not isinstance(value, list) or not value or not all(
        isinstance(e, list) and len(e) == 3 and all(isinstance(x, int) and not isinstance(x, bool) for x in e)
        for e in value
    ):
        raise argparse.ArgumentTypeError(f"{text!r} must be a list of [start, end, K] integer triples")
    try:
        validate_schedule(value)  # vLLM's own validator: it refuses to start on what it rejects
    except InvalidScheduleError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def load_workload_arg(path: str | Path) -> Workload:
    """Load a workload for a command; errors become one-line usage errors."""
    try:
        return load_workload(path)
    except WorkloadError as exc:
        raise UsageError(f"{path}: {exc}") from None


def check_out_dir(path: Path, flag: str = "--out", *, directory: bool = True) -> Path:
    """Every command's --out: missing parent folders are created when it writes (as `mkdir -p` would), so here, before
    anything is written, refuse in one line what could not be: an existing non-directory (or, for a file, an existing
    directory), a parent that is a file, or a folder this user may not write in."""
    if path.exists() and path.is_dir() != directory:
        raise UsageError(f"{flag}: {str(path)!r} exists and is not a {'directory' if directory else 'file'}")
    ancestor = path.parent if not path.exists() or not directory else path
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if ancestor.exists() and not ancestor.is_dir():
        raise UsageError(f"{flag}: {str(path)!r} cannot be created: {str(ancestor)!r} is a file")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise UsageError(f"{flag}: {str(path)!r} cannot be written: {str(ancestor)!r} is not writable")
    # Permission bits are not the whole story (root in /proc, a read-only mount): a folder made and removed at once
    # says whether the filesystem takes new entries there, leaving nothing behind.
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".cgtune-probe-", dir=ancestor))
    except OSError as exc:
        raise UsageError(f"{flag}: {str(path)!r} cannot be written: {exc.strerror or exc} ({str(ancestor)!r} takes "
                         f"no new files)") from None
    return path


def add_common_arguments(p: argparse.ArgumentParser, *, nested: bool = False) -> None:
    """The flags every command takes: `--vllm-version`, also after a command's own action (`cgtune workload buckets
    X --vllm-version 0.33`): each action's parser takes it too, without a default of its own that would overwrite the
    command's."""
    p.add_argument("--vllm-version", choices=("auto", *VERSIONS), default=argparse.SUPPRESS if nested else None,
                   help=f"the vLLM release whose rules a vLLM workload runs under when its serving.vllm_version does "
                        f"not pin one (auto, the default: the vLLM installed here if cgtune speaks it, else "
                        f"{DEFAULT_VERSION}); cgtune speaks {', '.join(VERSIONS)}. A workload that pins another "
                        f"release, or a run directory made under another, refuses it")
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                add_common_arguments(sub, nested=True)


@contextlib.contextmanager
def common_arguments_applied(args: argparse.Namespace) -> Iterator[None]:
    """`--vllm-version` in force while the command runs (read when workloads are parsed, and by the processes it
    starts); an in-process caller (a notebook, a test) gets its own environment back."""
    saved = os.environ.get(VERSION_ENV)
    given = getattr(args, "vllm_version", None)
    if given not in (None, "auto"):
        os.environ[VERSION_ENV] = given
    try:
        # A command a command runs (`cgtune example`'s search) keeps the flag its caller was given.
        with flag_version(given) if given not in (None, "auto") else contextlib.nullcontext():
            yield
    finally:
        if saved is None:
            os.environ.pop(VERSION_ENV, None)
        else:
            os.environ[VERSION_ENV] = saved
