"""Evaluate, once and after the search, every list a search is judged against (vLLM's default, the compact list,
the exact optimum, PR 50488's widest capture, peer engines' lists, the memory-blind ideal) and what the tuned list
changes against vLLM's default, for the decision record (`tuner.decision.record`) the report renders."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tuner.model.costmodel import CostModel, Evaluation
from tuner.model.reference_lists import PEER_LISTS, sglang_default_sizes, sglang_sizes, widest_sizes
from tuner.search.study import compact_of

if TYPE_CHECKING:
    from tuner.search.study import SearchResult

__all__ = [
    "LIST_SAVING_SHARE",
    "PEER_LISTS",
    "OffPeak",
    "WhatChanged",
    "WidthChange",
    "comparison",
    "feasible_cell",
    "kv_tokens",
    "listed_and_rest",
    "max_concurrency",
    "off_peak",
    "sglang_default_sizes",
    "sglang_sizes",
    "what_changed",
    "widest_sizes",
]


def comparison(model: CostModel, search: SearchResult) -> dict[str, Evaluation]:
    """Every list of the side-by-side table, on the same profile and budget, in table order."""
    table = {
        "default": search.default,
        "tuned": search.chosen,
        "compact": compact_of(model, search).evaluation,
        "exact": search.exact.best,
        "widest": model.evaluate(widest_sizes(model.serving)),
    }
    for name in model.engine.peer_rows:
        table[name] = model.evaluate(PEER_LISTS[name](model))
    table["ideal"] = model.ideal()
    return table


def kv_tokens(model: CostModel, e: Evaluation) -> int:
    """Tokens the KV cache the engine allocates for the list holds, as it logs them (vLLM: "GPU KV cache size", whole
    blocks over whole-block requests; 0 when it would not start)."""
    return model.engine.kv_capacity(e.kv_available_bytes, model.kv_bytes_per_token)[0]


def feasible_cell(name: str, e: Evaluation) -> str:
    """The side-by-side table's feasible column: yes, or why not; the ideal row ignores memory, so it says so."""
    if name == "ideal":
        return "memory ignored" + ("" if e.feasible else " (it would not fit)")
    return "yes" if e.feasible else f"no: {e.why_infeasible}"


def max_concurrency(model: CostModel, e: Evaluation) -> float:
    """How many max_model_len requests the KV cache holds at once, as the engine logs it (vLLM: "Maximum concurrency
    for L tokens per request: X.XXx")."""
    return model.engine.kv_capacity(e.kv_available_bytes, model.kv_bytes_per_token)[1]


@dataclass(frozen=True)
class WidthChange:
    """One width the tuned list adds above vLLM's default max, and what it is worth on this workload."""

    num_tokens: int
    """The width added."""
    real_bytes: int
    """Real graph pool the tuned list holds with it, minus without it."""
    estimate_bytes: int
    """vLLM's graph-memory estimate with it, minus without it (KV cache it takes)."""
    saved_ms: float
    """Expected step latency without it, minus with it (> 0: it saves time)."""


@dataclass(frozen=True)
class WhatChanged:
    """The tuned list against vLLM's default, as the runner captures them (V1 rewrites both when speculating; V2 keeps
    them as written)."""

    added: tuple[int, ...]
    """Widths the tuned list has and the default has not."""
    removed: tuple[int, ...]
    """Widths the default has and the tuned list has not."""
    default_max: int
    """The default list's largest width (0: no graphs)."""
    above_max: tuple[WidthChange, ...]
    """Each added width above `default_max`, with the memory it adds and the latency it saves."""


def what_changed(model: CostModel, default: Evaluation, tuned: Evaluation) -> WhatChanged:
    """Widths added and removed (in the lists that run); for each width added above the default's max, the tuned list
    evaluated with and without it (so each row is that width's own marginal cost and saving, the rest kept)."""
    d, t = set(default.runs_as), set(tuned.runs_as)
    top = max(d, default=0)
    above = model.engine.added_above(sorted(d), sorted(t - d))
    # Each width's list without it, one pass over the list's graphs each (CostModel.without_each), not a full
    # evaluation: a tuned list of thousands of widths made this quadratic (issue 34).
    without = model.without_each(tuned, above)
    rows = [WidthChange(num_tokens=w, real_bytes=tuned.graph_memory_bytes - without[w][1],
                        estimate_bytes=tuned.graph_estimate_bytes - without[w][2],
                        saved_ms=without[w][0] - tuned.expected_step_ms) for w in above]
    return WhatChanged(tuple(sorted(t - d)), tuple(sorted(d - t)), top, tuple(rows))


LIST_SAVING_SHARE = 0.001
"""The report lists, one row each, the added widths that save at least this share of the tuned list's expected step;
the others are summed in one line."""


def listed_and_rest(rows: tuple[WidthChange, ...], step_ms: float
                    ) -> tuple[tuple[WidthChange, ...], tuple[WidthChange, ...]]:
    """(rows saving at least LIST_SAVING_SHARE of `step_ms`, the rest), each in width order."""
    listed = tuple(w for w in rows if w.saved_ms >= LIST_SAVING_SHARE * step_ms)
    return listed, tuple(w for w in rows if w not in listed)


@dataclass(frozen=True)
class OffPeak:
    """Expected step latency of the default and tuned lists under off-peak decode traffic alone (uniform over
    1..max_num_seqs requests), whatever traffic the search weighed."""

    default_step_ms: float
    """vLLM's default list."""
    tuned_step_ms: float
    """The tuned list."""
    one_request_width: int
    """Width of a one-request decode step (q tokens)."""
    default_pads_to: int | None
    """Graph width a one-request decode step replays under the default (None: eager)."""
    tuned_pads_to: int | None
    """The same under the tuned list."""

    @property
    def tuned_slower(self) -> bool:
        """The tuned list is slower than vLLM's default off-peak (beyond float noise)."""
        return self.tuned_step_ms > self.default_step_ms * (1 + 1e-9)


def _pads_to(model: CostModel, sizes: tuple[int, ...], width: int) -> int | None:
    try:  # a one-request decode step: `width` tokens
        return model.engine.dispatcher(sizes).dispatch(width, uniform_decode=True, query_len=width).padded_size
    except ValueError:  # a list the runner refuses captures nothing: the step runs eager
        return None


def off_peak(model: CostModel, default: Evaluation, tuned: Evaluation) -> OffPeak:
    """Both lists under off-peak traffic (`CostModel.off_peak_step_ms`)."""
    width = model.engine.decode_query_lens()[1]  # a dynamic speculative schedule may give one request another q
    return OffPeak(
        default_step_ms=model.off_peak_step_ms(default.capture_sizes),
        tuned_step_ms=model.off_peak_step_ms(tuned.capture_sizes),
        one_request_width=width,
        default_pads_to=_pads_to(model, default.capture_sizes, width),
        tuned_pads_to=_pads_to(model, tuned.capture_sizes, width),
    )
