"""Checking against the engine: a run's predictions held to vLLM's own start-up log (`predictions`, `cgtune
check`) and the no-GPU example that writes such a log for the list it ships (`example`, `cgtune example`). Imports
every stage below it."""

from __future__ import annotations

from tuner.face import lazy_face

_FACE = {
    "CheckError": "predictions", "CheckResult": "predictions", "check_run": "predictions",
    "write_calibration": "predictions",
    "EXAMPLE_PROFILE": "example", "EXAMPLE_WORKLOAD": "example",
}
"""Each public name -> the submodule that defines it (imported when the name is first used)."""

__all__ = sorted(_FACE)
__getattr__ = lazy_face(__name__, _FACE)
