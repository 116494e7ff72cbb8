"""Validation: the chosen list captured and timed on the GPU, measured memory and latency held to the model,
what ships (`validation`); the GPU side (`backend`: capture a list, measure the estimate, time a trace) and the trace
replayed as the engine dispatches it (`trace`). Imports the stages below it, the report included (it re-writes the
run)."""

from __future__ import annotations

from tuner.face import lazy_face

_FACE = {
    "MEMORY_GOAL": "validation", "ValidationError": "validation", "require_cuda": "validation",
    "validate_candidates": "validation", "validate_run": "validation",
}
"""Each public name -> the submodule that defines it (imported when the name is first used)."""

__all__ = sorted(_FACE)
__getattr__ = lazy_face(__name__, _FACE)
