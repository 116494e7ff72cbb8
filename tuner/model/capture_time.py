"""How long the engine takes to capture a list's graphs, predicted from the profile's per-graph `capture_s`: the
start-up cost a list adds, shown beside its latency and memory."""

from __future__ import annotations

from collections.abc import Sequence

from tuner.model.costmodel import CostModel
from tuner.profile.curve import Curve

__all__ = ["predicted_capture_s"]


def predicted_capture_s(model: CostModel, runs: Sequence[int]) -> float | None:
    """Seconds the capture of the list's graphs takes by the profile's `capture_s` (each graph's own capture, read
    off its mode's rows, the drafter's graphs from the drafter's rows; PIECEWISE graphs from the FULL rows when the
    profile has no PIECEWISE times, as their memory is); None when the profile records no capture time for a mode
    the list captures. `runs`: the list the runner captures."""
    curves: dict[str, Curve | None] = {}
    for mode in ("full", "piecewise", "drafter_full", "drafter_piecewise"):
        points = {w: float(r.capture_s) for w, r in model.profile.by_mode(mode).items() if r.capture_s is not None}
        curves[mode] = Curve(points, monotone=False) if points else None
    total = 0.0
    for g in model.graph_costs(tuple(runs)):
        prefix = "drafter_" if g.owner == "drafter" else ""
        curve = curves[prefix + g.mode.lower()] or curves[prefix + "full"]
        if curve is None:
            return None
        total += max(0.0, float(curve(g.num_tokens)))
    return total
