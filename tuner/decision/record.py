"""The decision record: everything a search decided, made once (`decide`) and read by every renderer (report.md,
summary.json, plots, the deployment files, the console lines), so rendering re-decides nothing. The record holds
each list compared under the cost model, the shipped and the other list and why, what the tuned list changes against
the engine's default per width, off-peak figures, the saving's interval, the compact choice's facts, the lists under
the load (`--rate`) and the search's own facts (how it was found, the exact solver's proof), all as plain typed data."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from tuner.decision.compare import OffPeak, WhatChanged, comparison, off_peak, what_changed
from tuner.decision.load_facts import LoadFacts, load_facts
from tuner.search.compact import RECOMMEND_SAVING
from tuner.search.exact_program import memory_axis
from tuner.search.saving_interval import SavingInterval, saving_interval
from tuner.search.study import SearchConfig, compact_of

if TYPE_CHECKING:
    from tuner.model.costmodel import CostModel, Evaluation
    from tuner.search.study import SearchResult

__all__ = ["CompactFacts", "Decision", "ExactFacts", "Shipping", "alternative_name", "decide", "search_facts"]

STUDY_TOLERANCE = SearchConfig.tolerance
"""The study's best ships when within this share of the exact optimum."""


@dataclass(frozen=True)
class Shipping:
    """The list a run's deployment files carry, and the other one, whose files stand beside them."""

    name: str
    """`compact` or `fastest` (the tuned list)."""
    evaluation: Evaluation
    why: str
    """Why this one, in a sentence (the files' comments, the report, summary.json)."""
    other: tuple[str, Evaluation] | None
    """The list not shipped (its files take the suffix `.<name>`), None when both are the same list."""


@dataclass(frozen=True)
class CompactFacts:
    """The compact choice (`tuner.search.compact.CompactChoice`) as decided: its figures against the tuned list and
    what is proven of it."""

    tolerance: float
    """Its expected step may be at most this share above `fastest_ms`."""
    fastest_ms: float
    """Expected step of the fastest fitting list known."""
    limit_ms: float
    """The slowest expected step it may have."""
    saved_share: float
    """Share of the tuned list's counted memory it saves (0 when the tuned list counts none)."""
    recommended: bool
    """It saves at least `recommend_saving` of the tuned list's counted memory."""
    recommend_saving: float
    """The share that recommends it."""
    proven: bool
    """The choice is what brute force would give."""
    floor_bytes: int
    """Proven: no fitting list within the tolerance counts fewer bytes (0 when nothing is proven)."""
    fastest_proven: bool
    """`fastest_ms` is the proven optimum's."""
    stopped_early: bool
    """The time budget ran out before the choice was proven or its floor found."""
    solves: int
    """Capped exact solves it took."""
    work: int = 0
    """Steps of work its solves took (`--exact-work`): the same on any machine."""


@dataclass(frozen=True)
class ExactFacts:
    """What the exact solver proved of its answer."""

    num_candidates: int
    memory_unit_bytes: int
    """The unit its memory axis counts in."""
    exact_memory: bool
    """Every memory figure is a whole number of units: its answer is the proven optimum."""
    resource: str
    """What its memory axis counts: `estimate` (vLLM's graph-memory estimate) or `real` (the pool)."""
    lower_bound_ms: float | None
    gap: float | None
    """Proven bound on how much slower its answer is than the optimum (0 when proven; None: no bound)."""
    stopped_early: bool
    unproven: tuple[str, ...]
    """Why its answer is not proven optimal."""
    caveat: str
    """One sentence on an answer not proven optimal, with "its answer" as subject ("" if proven)."""
    work: int = 0
    """Steps of work the solve took (`--exact-work`): the same on any machine."""


@dataclass(frozen=True)
class Decision:
    """Everything a search decided, for the renderers."""

    table: dict[str, Evaluation]
    """Every list compared, in the side-by-side table's order: default, tuned, compact, exact, widest, the peer
    engines' rows, ideal (`tuner.decision.compare.comparison`)."""
    changed: WhatChanged
    """The tuned list against the engine's default, width by width."""
    off_peak: OffPeak
    """Both lists under off-peak decode traffic alone."""
    interval: SavingInterval
    """The bootstrap interval of what the tuned list saves against the default."""
    no_graphs: Evaluation
    """The empty list: the expected step with no graphs at all."""
    memory_axis: str
    """What the compact choice and the solver count: `estimate` or `real` (`tuner.search.exact_program.memory_axis`)."""
    compact: CompactFacts
    ship: Shipping
    ship_policy: str
    """`--ship`: auto, fastest or compact."""
    source: str
    """How the tuned list was found (`SearchResult.source`)."""
    gap: float | None
    """The study's best over the exact solver's list, minus 1 (None: no feasible trial)."""
    exact: ExactFacts
    study_name: str
    storage: str
    objective: str
    trials: dict[str, int]
    notes: tuple[str, ...]
    front: tuple[Evaluation, ...]
    """The latency/graph-memory front: the study's (objective pareto) or else the exact solver's."""
    search_record: dict[str, Any]
    """search.json: the search's lists and counts (`SearchResult.to_dict`), the compact choice included."""
    timings: dict[str, float] = field(default_factory=dict)
    """Wall seconds of each stage that made the decision: the search's (`SearchResult.timings`: exact_s, study_s,
    compact_s, load_search_s) and the decision's own (compare_s, what_changed_s, off_peak_s, interval_s, load_s)."""
    load: LoadFacts | None = None
    """The lists under the load (`--rate`: at the rate, over the sweep, the highest held rates); None without it."""

    @property
    def default(self) -> Evaluation:
        return self.table["default"]

    @property
    def tuned(self) -> Evaluation:
        return self.table["tuned"]

    def counted(self, e: Evaluation) -> int:
        """A list's graph memory on the solver's memory axis (what `tuner.search.compact.counted_bytes` counts)."""
        return e.graph_estimate_bytes if self.memory_axis == "estimate" else e.graph_memory_bytes


def _shipping(model: CostModel, search: SearchResult, compact: CompactFacts, c: Evaluation) -> Shipping:
    """Which list ships under `search.ship`: `auto` ships the compact list when it is recommended (it saves at least
    RECOMMEND_SAVING of the fastest list's counted memory within the tolerance), else the fastest; a list measured
    fastest on the GPU (`cgtune tune --validate`) ships as measured."""
    t = search.chosen
    if c.capture_sizes == t.capture_sizes:
        return Shipping("fastest", t, "the fastest list is also the compact one", None)
    what = "vLLM estimate" if memory_axis(model) == "estimate" else "real pool"
    slower = c.expected_step_ms / t.expected_step_ms - 1 if t.expected_step_ms > 0 else 0.0
    saving = (f"the compact list saves {compact.saved_share:.0%} of the fastest list's {what} for {slower:+.2%} of "
              f"expected step")
    if search.source == "gpu-validated":
        return Shipping("fastest", t, "measured fastest on the GPU (`cgtune tune --validate`)", ("compact", c))
    if search.ship == "compact":
        return Shipping("compact", c, f"--ship compact: {saving}", ("fastest", t))
    if search.ship == "fastest":
        return Shipping("fastest", t, f"--ship fastest ({saving})", ("compact", c))
    if compact.recommended:
        return Shipping("compact", c, f"recommended (--ship auto): {saving}, at least {RECOMMEND_SAVING:.0%}",
                        ("fastest", t))
    return Shipping("fastest", t, f"--ship auto: {saving}, less than the {RECOMMEND_SAVING:.0%} that would "
                                  f"recommend it", ("compact", c))


def alternative_name(filename: str, list_name: str) -> str:
    """The file of the list not shipped: `vllm-serve.yaml` -> `vllm-serve.fastest.yaml`."""
    stem, dot, ext = filename.rpartition(".")
    return f"{stem}.{list_name}.{ext}" if dot else f"{filename}.{list_name}"


_T = TypeVar("_T")


def _timed(timings: dict[str, float], name: str, make: Callable[[], _T]) -> _T:
    started = time.perf_counter()
    out = make()
    timings[name] = time.perf_counter() - started
    return out


def decide(model: CostModel, search: SearchResult) -> Decision:
    """The decision record of a search: the lists compared, the compact choice (chosen now when the search holds
    none), what changed, off-peak figures, the saving's interval (a seeded bootstrap) and the list shipped, with the
    seconds each took."""
    choice = compact_of(model, search)  # before search.to_dict: the record keeps the choice
    timings: dict[str, float] = {}
    table = _timed(timings, "compare_s", lambda: comparison(model, search))
    d, t = table["default"], table["tuned"]
    compact = CompactFacts(
        tolerance=choice.tolerance, fastest_ms=choice.fastest_ms, limit_ms=choice.limit_ms,
        saved_share=choice.saved_share(model, t), recommended=choice.recommended(model, t),
        recommend_saving=RECOMMEND_SAVING, proven=choice.proven, floor_bytes=choice.floor_bytes,
        fastest_proven=choice.fastest_proven, stopped_early=choice.stopped_early, solves=choice.solves,
        work=choice.work)
    changed = _timed(timings, "what_changed_s", lambda: what_changed(model, d, t))
    peak = _timed(timings, "off_peak_s", lambda: off_peak(model, d, t))
    interval = _timed(timings, "interval_s", lambda: saving_interval(model, d.capture_sizes, t.capture_sizes))
    load = None
    fixed_point = search.load_search
    if fixed_point is not None:
        lists = {"default": d.capture_sizes, "tuned": t.capture_sizes,
                 "compact": choice.evaluation.capture_sizes,
                 "expected-step": fixed_point.iterations[0].capture_sizes}
        load = _timed(timings, "load_s", lambda: load_facts(model, fixed_point, lists))
    return Decision(
        table=table, changed=changed, off_peak=peak, interval=interval, no_graphs=model.evaluate(()),
        memory_axis=memory_axis(model), compact=compact, ship=_shipping(model, search, compact, choice.evaluation),
        **search_facts(search), timings={**search.timings, **timings}, load=load)


def search_facts(search: SearchResult) -> dict[str, Any]:
    """The Decision's fields that restate the search (how the list was found, the exact solver's proof, the study,
    search.json), as keyword arguments."""
    ex = search.exact
    exact = ExactFacts(
        num_candidates=ex.num_candidates, memory_unit_bytes=ex.memory_unit_bytes, exact_memory=ex.exact_memory,
        resource=ex.resource, lower_bound_ms=ex.lower_bound_ms, gap=ex.gap, stopped_early=ex.stopped_early,
        unproven=tuple(ex.unproven), caveat=ex.caveat("its answer"), work=ex.work)
    return {"ship_policy": search.ship, "source": search.source, "gap": search.gap, "exact": exact,
            "study_name": search.study_name, "storage": search.storage, "objective": search.objective,
            "trials": dict(search.trials), "notes": tuple(search.notes), "front": tuple(search.pareto or ex.front),
            "search_record": search.to_dict()}
