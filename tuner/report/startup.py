"""The lines a report and the console open with: a synthetic profile said loudly, the start-up budget (how many graphs
and seconds of capture the shipped list adds to every start-up, against `--max-capture-seconds` and `--max-graphs`),
and the exact solver's row named for what is proven of it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.workload.synthetic_profile import is_synthetic

if TYPE_CHECKING:
    from tuner.decision.record import Decision
    from tuner.model.costmodel import CostModel, Evaluation

__all__ = ["LOUD_CAPTURE_S", "exact_row_label", "startup_lines", "synthetic_lines"]

LOUD_CAPTURE_S = 100.0
"""A shipped list whose capture takes this long or longer is said as a WARNING in the first lines."""


def synthetic_lines(model: CostModel) -> list[str]:
    """One loud line when the profile's numbers are made up (`cgtune profile --synthetic`, a benchmark's or a test's
    fixture): nothing the run says is a measurement."""
    if not is_synthetic(model.profile.metadata):
        return []
    return ["**SYNTHETIC PROFILE: every latency, memory and capture figure below is made up (`cgtune profile "
            "--synthetic`, a benchmark's or a fixture's numbers), not measured on a GPU: for planning and trying "
            "cgtune, never a measured result to ship.**"]


def _capture(e: Evaluation) -> str:
    return "? s (the profile records no capture time)" if e.capture_s is None else f"{e.capture_s:.1f} s"


def _budget(model: CostModel) -> str:
    parts = []
    if model.max_capture_s is not None:
        parts.append(f"at most {model.max_capture_s:g} s of capture (--max-capture-seconds)")
    if model.max_graphs is not None:
        parts.append(f"at most {model.max_graphs} graphs (--max-graphs)")
    return " and ".join(parts) if parts else "none (no list was held to a start-up time)"


def startup_lines(model: CostModel, dec: Decision) -> list[str]:
    """The shipped list's start-up cost against the budget every list was searched under, and a WARNING where it is
    hundreds of seconds or over the budget (a list from `--ship` or a GPU validation is not held to it)."""
    ship = dec.ship.evaluation
    line = (f"start-up: the shipped ({dec.ship.name}) list makes the engine capture {ship.num_graphs} graphs in "
            f"{_capture(ship)} at every start-up; budget: {_budget(model)}")
    out = [line]
    if ship.over_startup:
        out.insert(0, f"WARNING: the shipped list is {ship.over_startup}")
    elif ship.capture_s is not None and ship.capture_s >= LOUD_CAPTURE_S:
        out.insert(0, f"WARNING: the shipped list adds {ship.capture_s:.0f} s of graph capture to every start-up "
                      f"(restarts, autoscaling, failover); lower --max-capture-seconds to trade latency for it")
    return out


def exact_row_label(dec: Decision) -> str:
    """The exact solver's row: `exact optimum` only when proven; else its best list and the proven bound on its gap
    (or the start-up budget it was held to)."""
    ex = dec.exact
    if ex.exact_memory:
        return "exact optimum (proven)"
    held = " within the start-up budget" if any("start-up budget" in why for why in ex.unproven) else ""
    bound = f"within {ex.gap:.4%} of the optimum{held}" if ex.gap is not None else "no bound on its gap"
    return f"exact solver's best{held} (not proven optimal: {bound})"
