"""The cliff: a list can settle at two operating points under one load (SGLang issue 33483: eager steps above the
largest graph cost ~4x per token, requests pile up, the wider steps run eager too, and the server never recovers), so
a load is simulated from empty and from saturated and the two steady states compared; and the highest rate a list
holds with one operating point that meets a TPOT target.

The cliff rule: the two starts' steady states are TWO operating points when their mean step widths or their TPOT
medians differ by more than `tolerance` (default 10%) relative to the smaller, or when one start keeps up with the
arrivals and the other does not (`LoadResult.keeps_up`), and the saturated start stays apart. Otherwise the
operating point is unique. A saturated start that ends its window back at the empty start's point
(`LoadResult.came_back_to`), or still working its backlog off (`LoadResult.working_off`: fewer requests in the system
by more than a house of seats), has a window that mixes its backlog with where it goes: it is simulated again, twice
as long each time (the warm-up cut moving with it), `SETTLE_ROUNDS` times at most. Back at the empty start's point by
the end of the last run, the operating point is unique (its window still carries the backlog); still working it off
and not back, it is one operating point NOT SETTLED (`OperatingPoints.settled` false), which no rate holds; neither is
ever called a cliff.

`max_stable_rate` bisects the rate geometrically over a bracket, to a stated relative precision (default 2%), taking
a rate as held when its operating point is unique, both starts keep up, and the worse of their TPOT p99 meets the
target. It assumes what holds at a rate holds below it (one crossing in the bracket); every rate it tried is recorded.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tuner.load.scheduler import simulate
from tuner.workload.load import Load, LoadError
from tuner.load.steady_state import LoadResult
from tuner.model.costmodel import CostModel

__all__ = ["CLIFF_TOLERANCE", "SETTLE_ROUNDS", "OperatingPoints", "RateProbe", "StableRate", "compare_starts",
           "max_stable_rate", "operating_points", "rate_ceiling"]

CLIFF_TOLERANCE = 0.10
"""Relative difference (to the smaller) of mean step width or TPOT p50 above which two starts are two points."""
SATURATED_SEATS = 2
"""A saturated start fills the waiting queue with this many times max_num_seqs requests."""
SETTLE_ROUNDS = 2
"""Times a saturated start still draining its backlog is simulated again, each twice as long as the one before."""


def _relative(a: float | None, b: float | None) -> float | None:
    """|a - b| relative to the smaller; None when either is missing."""
    if a is None or b is None:
        return None
    small = min(abs(a), abs(b))
    if small == 0:
        return 0.0 if a == b else math.inf
    return abs(a - b) / small


@dataclass(frozen=True)
class OperatingPoints:
    """One load under one list, started empty and started saturated, and whether they settle apart (a cliff)."""

    rate_per_s: float | None
    """The load's arrival rate (requests/s); None for given arrivals."""
    empty: LoadResult
    """The steady state started with nothing waiting."""
    saturated: LoadResult
    """The steady state started with `saturated.initial_waiting` requests waiting."""
    tolerance: float
    """The cliff rule's relative tolerance."""
    width_difference: float | None
    """Mean step widths' difference, relative to the smaller."""
    tpot_difference: float | None
    """TPOT p50s' difference, relative to the smaller."""
    cliff: bool
    """Two operating points (module docstring's rule)."""
    why: str
    """The rule's figures in words."""
    settled: bool = True
    """The saturated start settled in its window (False: still working off its backlog after the longest run)."""

    @property
    def unique(self) -> bool:
        return not self.cliff

    @property
    def points(self) -> tuple[LoadResult, ...]:
        """The operating points to report: the empty start's alone, or both."""
        return (self.empty, self.saturated) if self.cliff else (self.empty,)

    def as_dict(self) -> dict[str, object]:
        return {"rate_per_s": self.rate_per_s, "cliff": self.cliff, "settled": self.settled, "why": self.why,
                "tolerance": self.tolerance,
                "width_difference": self.width_difference, "tpot_difference": self.tpot_difference,
                "empty": self.empty.as_dict(), "saturated": self.saturated.as_dict()}


def compare_starts(empty: LoadResult, saturated: LoadResult, tolerance: float = CLIFF_TOLERANCE) -> OperatingPoints:
    """The cliff rule over two steady states of one load."""
    dw = _relative(empty.mean_step_width, saturated.mean_step_width)
    dt = _relative(empty.tpot_p50_ms, saturated.tpot_p50_ms)
    reasons = []
    if dw is not None and dw > tolerance:
        reasons.append(f"mean step width {empty.mean_step_width:.1f} vs {saturated.mean_step_width:.1f} tokens "
                       f"({dw:.0%} apart)")
    if dt is not None and dt > tolerance:
        reasons.append(f"TPOT p50 {empty.tpot_p50_ms:.3f} vs {saturated.tpot_p50_ms:.3f} ms ({dt:.0%} apart)")
    if empty.keeps_up != saturated.keeps_up:
        reasons.append(f"the {'empty' if empty.keeps_up else 'saturated'} start keeps up, the other's queue grows")
    cliff = bool(reasons)
    why = ("two operating points (empty vs saturated start): " + "; ".join(reasons) if cliff else
           f"one operating point: mean step width and TPOT p50 within {tolerance:.0%}, both starts "
           f"{'keep up' if empty.keeps_up else 'fall behind'}")
    return OperatingPoints(empty.rate_per_s, empty, saturated, tolerance, dw, dt, cliff, why)


def operating_points(model: CostModel, capture_sizes: Sequence[int], load: Load, *,
                     initial_waiting: int | None = None, tolerance: float = CLIFF_TOLERANCE,
                     **simulate_kwargs: Any) -> OperatingPoints:
    """`load` under `capture_sizes` from empty and from saturated (`initial_waiting` requests waiting at t = 0,
    default SATURATED_SEATS x max_num_seqs, the load's own arrivals continuing), with one seed, compared by the
    cliff rule. `simulate_kwargs` go to `simulate` (duration_s, max_steps, warmup_share)."""
    if not tolerance > 0:
        raise LoadError(f"tolerance={tolerance!r} must be > 0")
    if initial_waiting is None:
        initial_waiting = SATURATED_SEATS * int(model.serving.max_num_seqs)
    if initial_waiting < 1:
        raise LoadError(f"initial_waiting={initial_waiting!r} must be >= 1 for a saturated start")
    empty = simulate(model, capture_sizes, load, **simulate_kwargs)
    saturated = simulate(model, capture_sizes, load, initial_waiting=initial_waiting, **simulate_kwargs)
    points = compare_starts(empty, saturated, tolerance)
    seats = int(model.serving.max_num_seqs)

    def moving(r: LoadResult) -> bool:
        return r.came_back_to(empty) or r.working_off(seats)

    duration = saturated.end_s
    for _ in range(SETTLE_ROUNDS):
        if not (points.cliff and moving(saturated) and saturated.stopped_by == "duration"
                and load.rate_per_s is not None):
            break
        duration *= 2  # the backlog is being worked off: look again later, the warm-up cut moving with it
        saturated = simulate(model, capture_sizes, load, initial_waiting=initial_waiting,
                             **{**simulate_kwargs, "duration_s": duration})
        points = compare_starts(empty, saturated, tolerance)
    if not (points.cliff and moving(saturated)):
        return points
    back = saturated.came_back_to(empty)
    held = (saturated.waiting_at_cut + saturated.running_at_cut, saturated.waiting_end + saturated.running_end)
    what = "came back to the empty start's point" if back else "was still working off its backlog"
    backlog = (f"the saturated start {what} in a {saturated.end_s:.0f} s run ({held[0]} -> {held[1]} requests in the "
               f"system over its window, the empty start's {empty.mean_in_system:.1f} on average)")
    if back:
        return dataclasses.replace(points, cliff=False, why=(
            f"one operating point: {backlog}, so its window's figures still carry the backlog "
            f"({points.why.split(': ', 1)[1]})"))
    return dataclasses.replace(points, cliff=False, settled=False, why=(
        f"not settled: {backlog}, so it is no second operating point; {points.why.split(': ', 1)[1]}"))


@dataclass(frozen=True)
class RateProbe:
    """One rate `max_stable_rate` tried."""

    rate_per_s: float
    held: bool
    """Unique operating point, both starts keep up, TPOT p99 within the target."""
    tpot_p99_ms: float | None
    """The worse of the two starts' TPOT p99 (None: no request finished decoding in a window)."""
    why: str

    def as_dict(self) -> dict[str, object]:
        return {"rate_per_s": self.rate_per_s, "held": self.held, "tpot_p99_ms": self.tpot_p99_ms, "why": self.why}


@dataclass(frozen=True)
class StableRate:
    """The highest rate a list holds: one operating point that keeps up and meets the TPOT target."""

    rate_per_s: float | None
    """The highest rate found held; None when even the bracket's low end fails."""
    tpot_slo_ms: float
    """The TPOT p99 target."""
    bracket: tuple[float, float]
    """The rates searched between (requests/s)."""
    precision: float
    """The search stops when the held and the failed rate are within this ratio - 1 of each other."""
    capped: bool
    """The bracket's high end held: the list's limit lies above the bracket, `rate_per_s` is a lower bound."""
    probes: tuple[RateProbe, ...]
    """Every rate tried, in order."""
    at_rate: OperatingPoints | None
    """The operating point at `rate_per_s`."""

    def as_dict(self) -> dict[str, object]:
        return {"rate_per_s": self.rate_per_s, "tpot_slo_ms": self.tpot_slo_ms, "bracket": list(self.bracket),
                "precision": self.precision, "capped": self.capped, "probes": [p.as_dict() for p in self.probes],
                "at_rate": self.at_rate.as_dict() if self.at_rate is not None else None}


def rate_ceiling(model: CostModel, capture_sizes: Sequence[int], load: Load) -> float:
    """An upper bound of the rate a list can serve, for the search's bracket: the best over 1..max_num_seqs
    decoding requests of (requests x acceptance) output tokens per uniform decode step, over the step's latency
    under the list, divided by the mean output length (prompts' prefill left out, so it bounds from above)."""
    q = int(model.q)
    sizes = sorted({int(x) for x in capture_sizes})
    best = 0.0
    for n in range(1, int(model.serving.max_num_seqs) + 1):
        if n * q > model.serving.max_num_batched_tokens:
            break
        ms = model.step_latency_ms(n * q, True, sizes, query_len=q, num_reqs=n)
        best = max(best, n * load.acceptance / ms * 1000.0)
    return best / load.output_tokens.mean


def _probe(model: CostModel, capture_sizes: Sequence[int], load: Load, rate: float, tpot_slo_ms: float,
           simulate_kwargs: dict[str, Any]) -> tuple[RateProbe, OperatingPoints]:
    points = operating_points(model, capture_sizes, load.at_rate(rate), **simulate_kwargs)
    p99s = [r.tpot_p99_ms for r in (points.empty, points.saturated)]
    worst = None if None in p99s else max(p for p in p99s if p is not None)
    if points.cliff or not points.settled:
        held, why = False, points.why
    elif not (points.empty.keeps_up and points.saturated.keeps_up):
        held, why = False, "the waiting queue grows (overload)"
    elif worst is None:
        held, why = False, "no request finished decoding in the window"
    elif worst > tpot_slo_ms:
        held, why = False, f"TPOT p99 {worst:.3f} ms > target {tpot_slo_ms:g} ms"
    else:
        held, why = True, f"one operating point, TPOT p99 {worst:.3f} ms <= {tpot_slo_ms:g} ms"
    return RateProbe(rate, held, worst, why), points


def max_stable_rate(model: CostModel, capture_sizes: Sequence[int], tpot_slo_ms: float, load: Load, *,
                    bracket: tuple[float, float] | None = None, precision: float = 0.02,
                    **simulate_kwargs: Any) -> StableRate:
    """The highest Poisson rate of `load` (its lengths, acceptance and seed; its rate is replaced) at which the list
    holds (module docstring), by geometric bisection over `bracket` (default: rate_ceiling / 64 .. rate_ceiling)
    until the held and the failed rate are within `precision` (relative). `simulate_kwargs` go to
    `operating_points` (duration_s, max_steps, warmup_share, initial_waiting, tolerance)."""
    if not (isinstance(tpot_slo_ms, (int, float)) and tpot_slo_ms > 0):
        raise LoadError(f"tpot_slo_ms={tpot_slo_ms!r} must be > 0")
    if not precision > 0:
        raise LoadError(f"precision={precision!r} must be > 0")
    if bracket is None:
        high = rate_ceiling(model, capture_sizes, load)
        bracket = (high / 64, high)
    lo, hi = float(bracket[0]), float(bracket[1])
    if not 0 < lo < hi:
        raise LoadError(f"bracket={bracket!r} must be two rates with 0 < low < high")
    span = (lo, hi)
    probes: list[RateProbe] = []

    def attempt(rate: float) -> tuple[bool, OperatingPoints]:
        probe, points = _probe(model, capture_sizes, load, rate, tpot_slo_ms, simulate_kwargs)
        probes.append(probe)
        return probe.held, points

    held, best = attempt(lo)
    if not held:
        return StableRate(None, float(tpot_slo_ms), span, precision, False, tuple(probes), None)
    top_held, top = attempt(hi)
    if top_held:
        return StableRate(hi, float(tpot_slo_ms), span, precision, True, tuple(probes), top)
    while hi / lo > 1 + precision:
        mid = math.sqrt(lo * hi)
        ok, points = attempt(mid)
        if ok:
            lo, best = mid, points
        else:
            hi = mid
    return StableRate(lo, float(tpot_slo_ms), span, precision, False, tuple(probes), best)
