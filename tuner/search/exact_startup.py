"""The start-up budget around the one-list exact solver (`tuner.search.exact`), whose program counts memory alone: where
the fastest list within memory is over the budget (`CostModel.max_capture_s`, `max_graphs`), the fastest list within it
found by lowering the memory cap (fewer bytes, fewer graphs), its gap bounded by the optimum without the budget."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from tuner.model.costmodel import CostModel, Evaluation
from tuner.search.exact_answer import ExactResult, pareto_front
from tuner.search.exact_program import counted_bytes

__all__ = ["STARTUP", "STARTUP_PROBES", "within_startup"]

STARTUP = ("the start-up budget binds: the program counts memory alone, and the fastest list within the budget was "
           "found under lowered memory caps (by the program's relaxation), its gap bounded by the optimum without the "
           "budget")
"""Why an answer the start-up budget shaped is not proven optimal."""
STARTUP_PROBES = 3
"""Capped solves, at most, between the largest list within the budget and the smallest over it."""
PROBE_WORK = 1
"""Each capped solve's work budget: its first rounds (the relaxation at a grid of prices, which always runs) and no
more; their lists are what a probe is for, the program over levels would only prove a list that is not the answer."""

Solve = Callable[[int | None, int | None, Sequence[Sequence[int]]], ExactResult]
"""(memory cap, work budget, lists to start from) -> the program's answer within memory."""


def within_startup(model: CostModel, solve: Solve, cap: int | None, work: int | None,
                   incumbents: Sequence[Sequence[int]]) -> ExactResult:
    """`solve(cap, work, incumbents)`, held to the model's start-up budget: unchanged where its answer is within it
    (its front and kept lists within it; kept lists are dropped where any was over, as they no longer prove the least
    memory); else the fastest list within the budget among its front, the lists given and capped solves between the
    memory of the largest such list and of the smallest list over it, the first solve's lower bound its bound."""
    first = solve(cap, work, incumbents)
    if not model.startup_budget:
        return first
    kept = tuple(first.kept) if all(e.feasible for e in first.kept) else ()
    front = [e for e in first.front if e.feasible]
    if first.best.feasible:
        return replace(first, front=front or [first.best], kept=kept)
    seen = {e.capture_sizes: e for e in [*first.front, *first.kept, model.evaluate(())]}
    for sizes in incumbents:
        e = model.evaluate(sizes)
        seen.setdefault(e.capture_sizes, e)
    within = [e for e in seen.values() if e.feasible and (cap is None or counted_bytes(model, e) <= cap)]
    best = min(within, key=lambda e: (e.expected_step_ms, counted_bytes(model, e)))
    over = [e for e in seen.values() if e.fits_memory and not e.feasible]
    lo = counted_bytes(model, best)
    hi = min((counted_bytes(model, e) for e in over), default=counted_bytes(model, first.best))
    total_work, seconds, solves = first.work, first.seconds, first.level_solves
    stopped = first.stopped_early
    steps = PROBE_WORK  # each cap's relaxation: its lists, not a proof (the bound is the first solve's)
    nearest = min(over, key=lambda e: counted_bytes(model, e), default=first.best)
    for _ in range(STARTUP_PROBES):
        if hi - lo <= max(1, first.memory_unit_bytes):
            break
        # A cap in proportion to how far the smallest list over the budget overruns it (memory, graphs and capture
        # time grow together), kept between what is known to fit and what is known not to.
        mid = int(min(max(hi * _share_within(model, nearest), lo + (hi - lo) / 8), hi - (hi - lo) / 8))
        r = solve(mid, steps, [best.capture_sizes, *incumbents])
        total_work, seconds, solves = total_work + r.work, seconds + r.seconds, solves + r.level_solves
        stopped = stopped or r.stopped_early
        within += [e for e in [r.best, *r.front] if e.feasible]
        if r.best.feasible:
            lo = max(lo, counted_bytes(model, r.best))
        else:
            hi, nearest = mid, r.best
        best = min(within, key=lambda e: (e.expected_step_ms, counted_bytes(model, e)))
    lower = first.lower_bound_ms
    return ExactResult(best, pareto_front(within), first.memory_unit_bytes, False, first.num_candidates, first.resource,
                       None if lower is None else min(lower, best.expected_step_ms), stopped, seconds, first.passes,
                       solves, (STARTUP, *first.unproven), kept, work=total_work)



def _share_within(model: CostModel, e: Evaluation) -> float:
    """The share of a list's graphs the start-up budget holds (its graphs and its capture time, the tighter)."""
    share = 1.0
    if model.max_graphs is not None and e.num_graphs > 0:
        share = min(share, model.max_graphs / e.num_graphs)
    if model.max_capture_s is not None and e.capture_s:
        share = min(share, model.max_capture_s / e.capture_s)
    return share
