"""How long the engine takes to capture a list's graphs, predicted from the profile's per-graph `capture_s`: the
start-up cost a list adds, shown beside its latency and memory."""

from __future__ import annotations

from collections.abc import Sequence

from tuner.model.costmodel import CostModel

__all__ = ["predicted_capture_s"]


def predicted_capture_s(model: CostModel, runs: Sequence[int]) -> float | None:
    """Seconds the capture of the list's graphs takes by the profile's `capture_s` (`CostModel.capture_seconds`);
    None when the profile records no capture time for a mode the list captures. `runs`: the list the runner
    captures."""
    return model.capture_seconds(model.graph_costs(tuple(runs)))
