"""The load-aware search (`--rate`): the capture list chosen where the step distribution and the list agree. The
expected-step search weighs a list by a distribution taken as given, but the distribution is what vLLM's scheduler
makes of the arrivals under the list (a slower list widens the steps that follow), so the search iterates: the exact
solver's list for a distribution, the load simulated under that list (`tuner.load`), that simulation's steps as the
next distribution, (where the list has two operating points, both
starts' steps) until the list repeats (the fixed point), comes back to an earlier one (a cycle) or the iterations
run out. Iteration 0 is the expected-step answer on the workload's own traffic.

The list chosen is the iterate whose simulation at the rate serves best: first one that keeps up from both starts with
one operating point, then the lowest TPOT p99 (the worse of the two starts), ties to the later iterate (the fixed
point). So its simulated TPOT p99 is never worse than the expected-step answer's, which is one of the iterates."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tuner.load.cliff import OperatingPoints, operating_points
from tuner.load.scheduler import DEFAULT_DURATION_S
from tuner.load.steady_state import LoadResult
from tuner.search.exact import ExactResult, exact_solve

if TYPE_CHECKING:
    from tuner.model.costmodel import CostModel
    from tuner.workload.load import Load

__all__ = ["DEFAULT_ITERATIONS", "LoadIteration", "LoadSearch", "RecordedIteration", "RecordedLoadSearch", "averaged",
           "load_aware_search", "next_rows", "recorded_load_search", "serves", "step_rows"]

DEFAULT_ITERATIONS = 8
"""Fixed-point iterations at most after the expected-step answer."""


def step_rows(result: LoadResult) -> list[list[Any]]:
    """A simulation's window as `CostModel.load_steps` rows: (width, uniform, query length, requests, share)."""
    total = sum(k[4] for k in result.step_kinds)
    return [[w, u, ql, n, c / total] for w, u, ql, n, c in result.step_kinds]


def next_rows(points: OperatingPoints) -> list[list[Any]]:
    """The distribution the next iteration solves for: the empty start's steps, or, where the list has two operating
    points, both starts' steps weighed equally (the deployment may sit at either, and a list that serves only the
    narrow one leaves the wide one eager)."""
    if not points.cliff:
        return step_rows(points.empty)
    return averaged([step_rows(points.empty), step_rows(points.saturated)])


def averaged(distributions: Sequence[Sequence[Sequence[Any]]]) -> list[list[Any]]:
    """The mean of step distributions (rows as `step_rows` gives them), each weighed equally."""
    rows: dict[tuple[Any, ...], float] = {}
    for dist in distributions:
        for w, u, ql, n, p in dist:
            rows[(w, u, ql, n)] = rows.get((w, u, ql, n), 0.0) + p / len(distributions)
    return [[*key, p] for key, p in sorted(rows.items())]


def serves(points: OperatingPoints) -> tuple[bool, float]:
    """How well a list serves a load, as a sort key (smaller is better): not (one settled operating point that keeps
    up from both starts), then the worse TPOT p99 of the two starts (inf when no request finished decoding)."""
    held = points.unique and points.settled and points.empty.keeps_up and points.saturated.keeps_up
    p99s = [r.tpot_p99_ms for r in (points.empty, points.saturated)]
    worst = float("inf") if None in p99s else max(float(p) for p in p99s if p is not None)
    return (not held, worst)


@dataclass(frozen=True)
class LoadIteration:
    """One step of the fixed point: the exact solver's list on a distribution, and the load simulated under it."""

    index: int
    """0: the expected-step answer on the workload's traffic; k: the answer on the steps iteration k - 1 simulated."""
    capture_sizes: tuple[int, ...]
    added: tuple[int, ...]
    """Widths this list has that the previous iteration's had not (iteration 0: none)."""
    removed: tuple[int, ...]
    """Widths the previous iteration's list had that this one has not."""
    expected_step_ms: float
    """Its expected step on the distribution it was solved for."""
    points: OperatingPoints
    """The load at the rate under this list, started empty and started saturated."""

    @property
    def tpot_p99_ms(self) -> float:
        return serves(self.points)[1]

    def as_dict(self) -> dict[str, object]:
        e, s = self.points.empty, self.points.saturated
        return {"index": self.index, "capture_sizes": list(self.capture_sizes), "added": list(self.added),
                "removed": list(self.removed), "expected_step_ms": self.expected_step_ms,
                "tpot_p99_ms": None if self.tpot_p99_ms == float("inf") else self.tpot_p99_ms,
                "tpot_p50_ms": e.tpot_p50_ms, "mean_step_width": e.mean_step_width,
                "saturated_mean_step_width": s.mean_step_width, "keeps_up": e.keeps_up and s.keeps_up,
                "cliff": self.points.cliff}


@dataclass(frozen=True)
class LoadSearch:
    """The fixed point's iterations and the list it chose."""

    load: Load
    """The load at the rate searched for."""
    duration_s: float
    """Simulated seconds per start."""
    iterations: tuple[LoadIteration, ...]
    converged: bool
    """The last iteration's list is the one before it: a fixed point."""
    why: str
    """How the iteration ended, in a sentence."""
    chosen: int
    """Index of the iteration whose list is chosen (`serves`)."""
    model: CostModel
    """The cost model on the distribution the chosen list was solved for (iteration 0: the workload's traffic), the
    model the full search then runs on."""
    exact: ExactResult
    """The exact solver's answer on `model` (the chosen iteration's solve), so the full search need not solve again."""
    tpot_slo_ms: float | None = None
    """`--tpot-slo`: the TPOT p99 target the decision finds each list's highest held rate for (None: none)."""

    @property
    def rate_per_s(self) -> float:
        assert self.load.rate_per_s is not None
        return self.load.rate_per_s

    def as_dict(self) -> dict[str, object]:
        return {"rate_per_s": self.rate_per_s, "tpot_slo_ms": self.tpot_slo_ms, "duration_s": self.duration_s,
                "converged": self.converged, "why": self.why, "chosen": self.chosen,
                "iterations": [it.as_dict() for it in self.iterations]}


@dataclass(frozen=True)
class RecordedIteration:
    """An iteration as search.json holds it: its list (the simulation is not stored, so it runs again)."""

    capture_sizes: tuple[int, ...]
    points: OperatingPoints | None = None


@dataclass(frozen=True)
class RecordedLoadSearch:
    """A fixed point read back from search.json (`SearchResult.load_record`): what a re-decision needs to put its
    lists under the same load again (`cgtune validate` emitting another list than the search chose), the record
    itself kept as it was written."""

    record: dict[str, Any]
    load: Load
    """The workload's load at the recorded rate."""

    @property
    def rate_per_s(self) -> float:
        return float(self.record["rate_per_s"])

    @property
    def duration_s(self) -> float:
        return float(self.record["duration_s"])

    @property
    def tpot_slo_ms(self) -> float | None:
        return self.record["tpot_slo_ms"]

    @property
    def iterations(self) -> tuple[RecordedIteration, ...]:
        return tuple(RecordedIteration(tuple(it["capture_sizes"])) for it in self.record["iterations"])

    def as_dict(self) -> dict[str, object]:
        return self.record


def recorded_load_search(model: CostModel, record: dict[str, Any]) -> RecordedLoadSearch:
    """The fixed point `record` (search.json's `load`) describes, on `model`'s workload's `traffic.load`."""
    load = model.workload.load
    if load is None:
        raise ValueError("search.json records a search under a load, but the run's workload has no traffic.load")
    return RecordedLoadSearch(record, load.at_rate(float(record["rate_per_s"])))


def load_aware_search(model: CostModel, load: Load, *, rate_per_s: float, max_iterations: int = DEFAULT_ITERATIONS,
                      duration_s: float = DEFAULT_DURATION_S, memory_buckets: int = 2048,
                      exact_seconds: float | None = None, tpot_slo_ms: float | None = None,
                      first: ExactResult | None = None,
                      progress: Callable[[LoadIteration], None] | None = None) -> LoadSearch:
    """The fixed point of (distribution -> exact solver's list -> simulated distribution) at `rate_per_s` (module
    docstring). `model` weighs the workload's traffic; `first`: the exact solver's answer on it, when the caller has
    it already (the same arguments); `progress` hears each iteration as it ends."""
    at_rate = load.at_rate(rate_per_s)
    iterations: list[LoadIteration] = []
    models: list[CostModel] = []
    solves: list[ExactResult] = []
    dist_model = model
    previous: Sequence[int] = ()
    why = ""
    converged = False
    seen: list[list[list[Any]]] = []
    for index in range(max_iterations + 1):
        solved = (first if index == 0 and first is not None else
                  exact_solve(dist_model, memory_buckets=memory_buckets, seconds=exact_seconds))
        solves.append(solved)
        best = solved.best
        sizes = tuple(best.capture_sizes)
        # The list of the iteration before, again: its simulation (one seed) would be the same to the bit.
        points = (iterations[-1].points if iterations and sizes == tuple(previous) else
                  operating_points(model, sizes, at_rate, duration_s=duration_s))
        it = LoadIteration(index, sizes, tuple(sorted(set(sizes) - set(previous))) if index else (),
                           tuple(sorted(set(previous) - set(sizes))) if index else (), best.expected_step_ms, points)
        iterations.append(it)
        models.append(dist_model)
        if progress is not None:
            progress(it)
        if index and sizes == tuple(previous):
            converged = True
            why = f"converged: iteration {index} gave the list iteration {index - 1} was simulated under"
            break
        earlier = [j for j, other in enumerate(iterations[:-1]) if other.capture_sizes == sizes]
        if earlier:
            why = (f"cycled: iteration {index} gave iteration {earlier[0]}'s list again "
                   f"({index - earlier[0]} lists alternate)")
            break
        if index == max_iterations:
            why = f"stopped after {max_iterations} iterations without a fixed point"
            break
        previous = sizes
        seen.append(next_rows(points))
        dist_model = model.with_load_steps(averaged(seen))
    # Ties go to the later iterate: min over reversed indices keeps the last of equal keys.
    chosen = min(reversed(range(len(iterations))), key=lambda i: serves(iterations[i].points))
    return LoadSearch(at_rate, float(duration_s), tuple(iterations), converged, why, chosen, models[chosen],
                      solves[chosen], tpot_slo_ms)
