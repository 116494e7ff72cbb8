"""The compact choice: the capture list with the least graph memory, as the engine's memory rule counts it, whose
expected step is within a tolerance of the fastest list, read off the exact solver's front on that memory."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tuner.costmodel import CostModel, Evaluation
from tuner.exact import exact_solve

if TYPE_CHECKING:
    from tuner.search import SearchResult

__all__ = ["DEFAULT_TOLERANCE", "RECOMMEND_SAVING", "CompactChoice", "choose_compact", "compact_of", "counted_bytes"]

DEFAULT_TOLERANCE = 0.01
"""`--tolerance`: the compact list may be this share slower than the fastest list (1%)."""
RECOMMEND_SAVING = 0.25
"""The report recommends the compact list when it saves at least this share of the tuned list's counted memory."""
_EVERY_POINT = 1 << 30
"""`front_points` that thins nothing: every memory level where the best latency drops is a point of the front."""


def counted_bytes(model: CostModel, e: Evaluation) -> int:
    """The graph memory the engine's memory rule counts a list by, which the compact choice minimises: vLLM's
    graph-memory ESTIMATE, since it is what the KV cache pays for (vLLM subtracts it before capturing); the real pool
    where the rule counts that instead (vLLM with the estimate switched off: the pool must fit in the memory vLLM does
    not request; SGLang: in the slack beside its KV cache; TensorRT-LLM: it is taken from the KV cache)."""
    return e.graph_estimate_bytes if model.budget.estimate_enabled else e.graph_memory_bytes


@dataclass(frozen=True)
class CompactChoice:
    """The compact list, and what it was chosen against."""

    evaluation: Evaluation
    """The compact list under the cost model."""
    tolerance: float
    """Its expected step may be at most this share above `fastest_ms`."""
    fastest_ms: float
    """Expected step of the fastest fitting list known (the exact solver's answer, or a faster one given)."""
    proven: bool
    """The exact solver counted memory exactly, so no fitting list within the tolerance has less counted memory;
    else it is the least up to `memory_unit_bytes`, the unit the solver rounded memory to."""
    memory_unit_bytes: int
    """The exact solver's memory unit."""

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
                "fastest_ms": self.fastest_ms, "proven": self.proven, "memory_unit_bytes": self.memory_unit_bytes}

    @classmethod
    def from_dict(cls, data: dict[str, Any], model: CostModel) -> CompactChoice:
        return cls(model.evaluate(data["capture_sizes"]), float(data["tolerance"]), float(data["fastest_ms"]),
                   bool(data["proven"]), int(data["memory_unit_bytes"]))


def _counting(model: CostModel) -> CostModel:
    """The model with every evaluation's `graph_memory_bytes` set to its counted memory. The exact solver keeps, of
    the lists it finds at each memory level, those no other is faster than with no more `graph_memory_bytes`; handed
    this model, it keeps them on the memory its levels count (vLLM's estimate, which the real pool need not follow),
    so no list the compact choice needs is dropped. Latency and both memory conditions are unchanged."""
    if not model.budget.estimate_enabled:
        return model  # the rule counts the real pool: the solver's front is already on it
    counting = copy.copy(model)
    evaluate = model.evaluate

    def counted(capture_sizes: Iterable[int]) -> Evaluation:
        e = evaluate(capture_sizes)
        return dataclasses.replace(e, graph_memory_bytes=counted_bytes(model, e))

    counting.evaluate = counted  # type: ignore[method-assign]
    return counting


def choose_compact(model: CostModel, tolerance: float = DEFAULT_TOLERANCE, *, known: Sequence[Evaluation] = (),
                   memory_buckets: int = 2048, candidates: Sequence[int] | None = None,
                   seconds: float | None = None) -> CompactChoice:
    """The fitting list with the least counted memory (`counted_bytes`) whose expected step is at most `tolerance`
    above the fastest fitting list's (ties: the faster); `known`: fitting lists found elsewhere (the study's best), in
    the running for both. The exact solver's memory levels are the counted memory, and at each it finds the fastest
    fitting list: the least level whose list is within the tolerance is the answer, so its front is read whole
    (not thinned). `candidates`: the widths lists are drawn from (default: the model's). Raises SearchError when not
    even the empty list fits."""
    if not tolerance >= 0 or tolerance == float("inf"):
        raise ValueError(f"tolerance={tolerance} must be a finite number >= 0")
    solved = exact_solve(_counting(model), memory_buckets=memory_buckets, candidates=candidates,
                         front_points=_EVERY_POINT, seconds=seconds)
    pool = [model.evaluate(e.capture_sizes) for e in (*solved.front, solved.best)] + list(known)
    fitting = [e for e in pool if e.feasible]
    fastest_ms = min(e.expected_step_ms for e in fitting)
    limit_ms = fastest_ms * (1 + tolerance)
    within = [e for e in fitting if e.expected_step_ms <= limit_ms + 1e-12]
    best = min(within, key=lambda e: (counted_bytes(model, e), e.expected_step_ms, len(e.capture_sizes)))
    return CompactChoice(best, tolerance, fastest_ms, solved.exact_memory, solved.memory_unit_bytes)


def compact_of(model: CostModel, search: SearchResult, tolerance: float | None = None, *,
               memory_buckets: int = 2048, seconds: float | None = None) -> CompactChoice:
    """The search's compact choice at `tolerance` (None: the one it holds, else DEFAULT_TOLERANCE): the one it holds
    when chosen at that tolerance, else chosen now against the search's own fitting lists and kept on it (search.json
    records it, so a re-render does not solve again)."""
    held = search.compact
    if held is None or (tolerance is not None and held.tolerance != tolerance):
        known = [e for e in (search.chosen, search.study_best, search.exact.best) if e is not None]
        search.compact = choose_compact(model, DEFAULT_TOLERANCE if tolerance is None else tolerance, known=known,
                                        memory_buckets=memory_buckets, seconds=seconds)
    return search.compact
