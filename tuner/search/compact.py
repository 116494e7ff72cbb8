"""The compact choice: the capture list with the least graph memory, as the engine's memory rule counts it, whose
expected step is within a tolerance of the fastest list: the exact solver under a cap on that memory, keeping its
least memory levels within the tolerance (`exact_solve(memory_cap_bytes=..., keep_within_ms=...)`), and capped
solves below the answer whose lower bounds prove where no such list is."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tuner.model.costmodel import CostModel, Evaluation
from tuner.search.exact import DEFAULT_WORK, ExactResult, SearchError, exact_solve
from tuner.search.exact_program import counted_bytes


__all__ = ["DEFAULT_TOLERANCE", "RECOMMEND_SAVING", "CompactChoice", "choose_compact", "counted_bytes"]

DEFAULT_TOLERANCE = 0.01
"""`--tolerance`: the compact list may be this share slower than the fastest list (1%)."""
RECOMMEND_SAVING = 0.25
"""The report recommends the compact list when it saves at least this share of the tuned list's counted memory."""
_SLACK = 1e-12
"""ms: a list this close above the limit is within it (the same sums in another order differ by float noise)."""
FLOOR_PROBES = 4
"""Capped solves below the compact list, at most, looking for a proven floor where the first solve proves none."""


@dataclass(frozen=True)
class CompactChoice:
    """The compact list, what it was chosen against, and how much of its choice is proven."""

    evaluation: Evaluation
    """The compact list under the cost model."""
    tolerance: float
    """Its expected step may be at most this share above `fastest_ms`."""
    fastest_ms: float
    """Expected step of the fastest fitting list known (the exact solver's answer, or a faster one given)."""
    proven: bool
    """The choice is what brute force would give: the fastest list is the proven optimum, no fitting list within the
    tolerance counts less memory (`floor_bytes` is the compact list's own), and none counting as much is faster."""
    floor_bytes: int
    """Proven: no fitting list within the tolerance of `fastest_ms` counts fewer bytes (0 when nothing is proven)."""
    fastest_proven: bool = False
    """`fastest_ms` is the proven optimum's (else the fastest found: the true optimum may be a little faster)."""
    stopped_early: bool = False
    """The work budget (or a wall-clock one, where given) ran out before the choice was proven or its floor found."""
    solves: int = 0
    """Capped exact solves it took."""
    work: int = 0
    """Steps of work its solves took (`tuner.search.exact_answer.DEFAULT_WORK`): the same on any machine."""

    @property
    def limit_ms(self) -> float:
        """The slowest expected step the compact list may have."""
        return self.fastest_ms * (1 + self.tolerance)

    def saved_share(self, model: CostModel, tuned: Evaluation) -> float:
        """Share of the tuned list's counted memory the compact list saves (0 when the tuned list counts none)."""
        tuned_bytes = counted_bytes(model, tuned)
        return 1 - counted_bytes(model, self.evaluation) / tuned_bytes if tuned_bytes > 0 else 0.0

    def recommended(self, model: CostModel, tuned: Evaluation) -> bool:
        """It saves at least RECOMMEND_SAVING of the tuned list's counted memory."""
        return self.saved_share(model, tuned) >= RECOMMEND_SAVING

    def to_dict(self) -> dict[str, Any]:
        return {"capture_sizes": list(self.evaluation.capture_sizes), "tolerance": self.tolerance,
                "fastest_ms": self.fastest_ms, "proven": self.proven, "floor_bytes": self.floor_bytes,
                "fastest_proven": self.fastest_proven, "stopped_early": self.stopped_early, "solves": self.solves,
                "work": self.work}

    @classmethod
    def from_dict(cls, data: dict[str, Any], model: CostModel) -> CompactChoice:
        # Runs written before the floor was kept claim none.
        return cls(model.evaluate(data["capture_sizes"]), float(data["tolerance"]), float(data["fastest_ms"]),
                   bool(data["proven"]), int(data.get("floor_bytes", 0)), bool(data.get("fastest_proven", False)),
                   bool(data.get("stopped_early", False)), int(data.get("solves", 0)), int(data.get("work", 0)))


class _Search:
    """The least counted memory of a fitting list within the limit: one capped solve that keeps its least levels
    within the limit (`exact_solve(keep_within_ms=...)`), then probes below the answer for a proven floor. `hi` is the
    least counted memory of a list within the limit found so far, `floor` one above the highest cap proven to hold
    none (a capped solve's lower bound above the limit)."""

    def __init__(self, model: CostModel, limit_ms: float, best: Evaluation,
                 solve: Callable[[int, bool], ExactResult]) -> None:
        self.model, self.limit_ms, self.solve = model, limit_ms, solve
        self.best, self.hi = best, counted_bytes(model, best)
        self.best_is_fastest_at_hi = False
        """`best` is proven the fastest list counting at most `hi`."""
        self.floor, self.solves, self.stopped, self.work = 0, 0, False, 0

    def within(self, e: Evaluation) -> bool:
        return e.expected_step_ms <= self.limit_ms + _SLACK

    def probe(self, cap: int, keep: bool = False) -> ExactResult:
        """Solve under `cap` (`keep`: reading its least levels within the limit): a list within the limit lowers `hi`;
        a proven answer raises the floor (to the kept list's memory, or past the cap when none is within it)."""
        r = self.solve(cap, keep)
        self.solves += 1
        self.stopped = r.stopped_early
        self.work += r.work
        for e in [*r.kept, r.best, *r.front]:  # every fitting list it found is a candidate answer
            if self.within(e) and counted_bytes(self.model, e) < self.hi:
                self.best, self.hi, self.best_is_fastest_at_hi = e, counted_bytes(self.model, e), False
        if r.exact_memory and r.kept:
            # Proven: no list within the limit counts less than the first kept, and none counting as much is faster.
            first = r.kept[0]
            self.best, self.hi = first, counted_bytes(self.model, first)
            self.floor, self.best_is_fastest_at_hi = self.hi, True
        elif self.within(r.best) and counted_bytes(self.model, r.best) == self.hi:
            # The fastest list under the cap: proven, none counting at most `hi` is faster.
            self.best_is_fastest_at_hi = self.best_is_fastest_at_hi or r.exact_memory
            if r.best.expected_step_ms < self.best.expected_step_ms:
                self.best = r.best
        elif not self.within(r.best) and r.lower_bound_ms is not None and r.lower_bound_ms > self.limit_ms + _SLACK:
            self.floor = max(self.floor, cap + 1)
        return r

    def run(self, probes: int) -> None:
        """The keep solve under the least memory known; where it is not proven, up to `probes` solves below the
        answer, one byte below first where memory was counted exactly (a proof there closes the floor onto it), then
        1/256, 1/64, 1/16 of it below (a floor within that share), each stopping at the first proof; and, the floor
        closed, one at the answer itself where the fastest list at that memory is not proven yet."""
        if self.stopped:
            return
        r = self.probe(self.hi, keep=True)
        steps = ([1] if not r.rounded else []) + [self.hi >> k for k in (8, 6, 4)]
        for step in steps[:probes]:
            if self.floor >= self.hi or self.stopped or not 0 < step <= self.hi:
                break
            floor = self.floor
            self.probe(self.hi - step)
            if self.floor > floor:
                break
        if self.floor >= self.hi and not self.best_is_fastest_at_hi and not self.stopped:
            self.probe(self.hi)


def choose_compact(model: CostModel, tolerance: float = DEFAULT_TOLERANCE, *, known: Sequence[Evaluation] = (),
                   memory_buckets: int = 2048, candidates: Sequence[int] | None = None,
                   work: int | None = DEFAULT_WORK, seconds: float | None = None,
                   clock: Callable[[], float] = time.monotonic, fastest: ExactResult | None = None) -> CompactChoice:
    """The fitting list with the least counted memory (`counted_bytes`) whose expected step is at most `tolerance`
    above the fastest fitting list's (ties: the faster); `known`: fitting lists found elsewhere (the study's best), in
    the running for both.

    The exact solver finds the fastest list (`fastest`: its answer over these candidates, solved already); the least
    counted memory of a list within the tolerance among its front and `known` caps a second solve, which keeps the
    fastest list of its least memory levels within the tolerance: where its levels count memory exactly, the first is
    the answer, proven. Else (memory rounded to units, the real capture could outgrow the estimate, or the two-list
    relaxation) the least found, and capped solves below it (`_Search.run`) prove a floor: no list within the
    tolerance counts less. `work` bounds it all, in the solver's steps (every solve shares it; None: no limit), so the
    choice is the same on a loaded machine as on a quiet one; `seconds` (None, the default: none) adds a wall-clock
    limit, which makes it depend on the machine's load. Past either, the least found so far, with the floor proven so
    far. Raises SearchError when not even the empty list fits."""
    if not tolerance >= 0 or tolerance == float("inf"):
        raise ValueError(f"tolerance={tolerance} must be a finite number >= 0")
    deadline = None if seconds is None else clock() + seconds
    spent = [0]

    def left() -> float | None:
        return None if deadline is None else max(0.0, deadline - clock())

    def work_left() -> int | None:
        return None if work is None else max(0, work - spent[0])

    solved = fastest or exact_solve(model, memory_buckets=memory_buckets, candidates=candidates, work=work_left(),
                                    seconds=left(), clock=clock)
    if fastest is None:
        spent[0] += solved.work
    pool = [solved.best, *solved.front, *known, model.evaluate(())]  # the empty list: what the rest is held to
    fitting = [e for e in pool if e.feasible]
    if not fitting:
        raise SearchError("no capture list fits, not even the empty one")
    fastest_ms = min(e.expected_step_ms for e in fitting)
    limit_ms = fastest_ms * (1 + tolerance)
    start = min((e for e in fitting if e.expected_step_ms <= limit_ms + _SLACK),
                key=lambda e: (counted_bytes(model, e), e.expected_step_ms, len(e.capture_sizes)))
    seeds = [e.capture_sizes for e in fitting]

    def capped(cap: int, keep: bool) -> ExactResult:
        r = exact_solve(model, memory_buckets=memory_buckets, candidates=candidates, work=work_left(), seconds=left(),
                        clock=clock, incumbents=seeds, memory_cap_bytes=cap,
                        keep_within_ms=limit_ms if keep else None)
        spent[0] += r.work
        return r

    search = _Search(model, limit_ms, start, capped)
    search.stopped = left() == 0.0 or work_left() == 0  # the first solve spent the budget
    search.run(FLOOR_PROBES)
    fastest_proven = solved.exact_memory and fastest_ms == solved.best.expected_step_ms
    proven = fastest_proven and search.floor >= search.hi and search.best_is_fastest_at_hi
    return CompactChoice(search.best, tolerance, fastest_ms, proven, min(search.floor, search.hi), fastest_proven,
                         search.stopped, search.solves, spent[0])
