"""What an exact solve answers, whichever program found it (`tuner.search.exact` for one list, `tuner.search.exact_split`
for two): the answer, its front and what is proven of it, and the helpers both use."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tuner.model.costmodel import CostModel, Evaluation

__all__ = ["APPROXIMATED", "DEFAULT_WORK", "KEPT", "ROUNDED", "ExactResult", "SearchError", "improve_locally",
           "pareto_front", "spent"]

APPROXIMATED = ("the program approximates the step latency (several speculative tiers, or DFlash under cudagraph_mode "
                "FULL; its answer is then improved one width at a time)")
"""Why an answer whose latency layers are not the cost model's is not proven (and has no bound)."""
ROUNDED = "memory figures rounded to units of"
"""How an answer says its memory was rounded (one of `ExactResult.unproven`)."""
KEPT = 16
"""`keep_within_ms`: at most this many of the least memory levels keep their fastest list."""
DEFAULT_WORK = 5_000_000
"""`--exact-work`: the steps (a candidate swept by a pass of a program, a row of a dynamic program, counted by its
predecessors) one exact solve may take before it answers with the best list found and a proven bound. Work, not
seconds: the answer is the same on a loaded machine as on a quiet one."""


def spent(work: int | None, seconds: float | None, what: str) -> str:
    """Why a solve stopped before its proof: the budget it spent."""
    if what == "seconds":
        return f"stopped at its time budget of {seconds or 0:g} s (--exact-seconds)"
    return f"stopped at its work budget of {work or 0:,} steps (--exact-work)"


class SearchError(ValueError):
    """The search cannot run (e.g. not even the empty list leaves the required KV cache); one line."""


@dataclass(frozen=True)
class ExactResult:
    """The exact solver's answer under the cost model."""

    best: Evaluation
    """Fastest list that fits both of vLLM's memory conditions (past the time budget: the fastest found)."""
    front: list[Evaluation]
    """Latency/graph-memory Pareto front of fitting lists found, by increasing memory."""
    memory_unit_bytes: int
    """Memory was counted in units of this many bytes (exact when `exact_memory`, else rounded to the nearest
    unit and the answer re-checked in bytes)."""
    exact_memory: bool
    """True when the answer is the optimum, not just a fitting list: the unit divides every memory figure, the
    condition the program does not carry (the real capture beside the estimate) cannot bind, the latency layers are
    the cost model's, and the solver finished within its time budget."""
    num_candidates: int
    """Candidate widths the program ran over."""
    resource: str = "estimate"
    """What the program's memory axis counted: vLLM's `estimate` or the `real` pool."""
    lower_bound_ms: float | None = None
    """A proven lower bound on the optimum's expected step latency (the answer's own when proven); None where none
    is proven (the program approximates several decode tiers)."""
    stopped_early: bool = False
    """The time budget ran out before the optimum was proven."""
    seconds: float = 0.0
    """Wall time the solver took (not written with a run: it would make the files differ from run to run)."""
    passes: int = 1
    """Passes of the program (one per value of vLLM's extrapolated per-graph term, and one without a second)."""
    level_solves: int = 0
    """Passes the dynamic program over memory levels solved (0: the bounds alone proved the answer, or stopped)."""
    unproven: tuple[str, ...] = ()
    """Why the answer is not proven optimal (empty when it is)."""
    kept: tuple[Evaluation, ...] = ()
    """With `keep_within_ms`: the fastest fitting list of each of the least memory levels whose fastest list is
    within it (at most KEPT, by level). Proven (`exact_memory`), the first counts the least memory (`counted_bytes`)
    of any fitting list within it, and no list counting that little is faster."""
    work: int = 0
    """Steps of work the solve took (see DEFAULT_WORK): the same on any machine, unlike `seconds`."""

    @property
    def rounded(self) -> bool:
        """Memory was rounded to units: the levels count it only up to a unit."""
        return any(why.startswith(ROUNDED) for why in self.unproven)

    @property
    def gap(self) -> float | None:
        """Proven bound on how much slower the answer is than the optimum (0 when proven; None: no bound)."""
        if self.exact_memory:
            return 0.0
        if self.lower_bound_ms is None or self.lower_bound_ms <= 0:
            return None
        return max(0.0, self.best.expected_step_ms / self.lower_bound_ms - 1.0)

    def caveat(self, subject: str = "the exact solver's answer") -> str:
        """One sentence on an answer not proven optimal: why, and how far from the optimum it can be ("" if proven)."""
        if self.exact_memory:
            return ""
        gap = self.gap
        bound = ("no bound on its gap is proven" if gap is None or self.lower_bound_ms is None else
                 f"it is within {gap:.2%} of the optimum (a proven lower bound: {self.lower_bound_ms:.4f} ms)")
        return f"{subject} fits both memory conditions but is not proven optimal ({'; '.join(self.unproven)}): {bound}"


def improve_locally(model: CostModel, start: Evaluation, candidates: Sequence[int],
                    evaluations: int = 4096, fits: Callable[[Evaluation], bool] | None = None) -> Evaluation:
    """Where the program's layers only approximate the cost model (several V2 decode tiers shadowing each other), the
    best fitting list one candidate away, repeatedly, until none is faster or `evaluations` lists were costed: a
    better answer, still not proven optimal. `fits`: what fitting means (default: both memory conditions)."""
    best = start
    for _ in range(max(1, evaluations // max(1, len(candidates)))):
        members = set(best.capture_sizes)
        moves = [model.evaluate(members ^ {c}) for c in candidates]
        better = [e for e in moves if (fits(e) if fits else e.feasible)
                  and e.expected_step_ms < best.expected_step_ms - 1e-12]
        if not better:
            return best
        best = min(better, key=lambda e: e.expected_step_ms)
    return best


def pareto_front(evals: Sequence[Evaluation]) -> list[Evaluation]:
    """Non-dominated (expected_step_ms, graph_memory_bytes) points, by increasing memory."""
    out: list[Evaluation] = []
    for e in sorted(evals, key=lambda e: (e.graph_memory_bytes, e.expected_step_ms)):
        if not out or e.expected_step_ms < out[-1].expected_step_ms - 1e-12:
            out.append(e)
    return out
