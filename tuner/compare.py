"""Evaluate, once and beside the search, every list a search is judged against (vLLM's default, the exact optimum,
PR 50488's widest capture, peer engines' lists, the memory-blind ideal) and what the tuned list changes against
vLLM's default, so the report only renders."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tuner.model import CostModel, Evaluation
from tuner.vllm.defaults import default_capture_sizes, request_count_grid
from tuner.workload import ServingConfig

if TYPE_CHECKING:
    from tuner.search import SearchResult

__all__ = [
    "LABELS",
    "PEER_LISTS",
    "OffPeak",
    "WhatChanged",
    "WidthChange",
    "comparison",
    "kv_tokens",
    "max_concurrency",
    "off_peak",
    "sglang_sizes",
    "what_changed",
    "widest_sizes",
]

LABELS = {
    "default": "vLLM default",
    "tuned": "tuned",
    "exact": "exact optimum",
    "widest": "widest capture (PR 50488)",
    "sglang": "SGLang-style",
    "ideal": "ideal (every width, memory ignored)",
}
"""How each list of the comparison is named in reports."""


def widest_sizes(serving: ServingConfig) -> tuple[int, ...]:
    """PR 50488's behaviour: the default grid with the ceiling lifted to the widest uniform decode batch
    (max_num_seqs x q), so every decode batch has a graph."""
    q = serving.decode_query_len
    top = min(serving.max_num_seqs * q, serving.max_num_batched_tokens)
    grid = default_capture_sizes(serving.max_num_seqs, serving.num_speculative_tokens,
                                 serving.max_num_batched_tokens, max_cudagraph_capture_size=top).sizes
    decode = {n * q for n in request_count_grid(serving.max_num_seqs, serving.max_num_seqs) if n * q <= top}
    return tuple(sorted(set(grid) | decode | {top}))


def sglang_sizes(serving: ServingConfig) -> tuple[int, ...]:
    """An SGLang-STYLE list, not SGLang's own default: SGLang's batch-size grid (1, 2, 4, 8, 12, 16..256 step 8,
    272..496 step 16, 512.. step 32) up to max_num_seqs, plus max_num_seqs, each times q tokens (SGLang captures by
    batch size)."""
    mns, q = serving.max_num_seqs, serving.decode_query_len
    grid = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 497, 16), *range(512, mns + 1, 32)]
    return tuple(sorted({b * q for b in grid + [mns] if b <= mns and b * q <= serving.max_num_batched_tokens}))


PEER_LISTS: dict[str, Callable[[ServingConfig], tuple[int, ...]]] = {"sglang": sglang_sizes}
"""Other engines' lists, evaluated as vLLM capture lists under the same model: the seam where an engine's real
default (e.g. `tuner.sglang`'s rulebook) replaces a style approximation; the key names the row (see LABELS)."""


def comparison(model: CostModel, search: SearchResult) -> dict[str, Evaluation]:
    """Every list of the side-by-side table, on the same profile and budget, in table order."""
    table = {
        "default": search.default,
        "tuned": search.chosen,
        "exact": search.exact.best,
        "widest": model.evaluate(widest_sizes(model.serving)),
    }
    for name, sizes in PEER_LISTS.items():
        table[name] = model.evaluate(sizes(model.serving))
    table["ideal"] = model.ideal()
    return table


def kv_tokens(model: CostModel, e: Evaluation) -> int:
    """Tokens the KV cache vLLM allocates for the list holds: KV bytes // KV bytes per token (0 when it would not
    start). vLLM counts whole KV blocks, so the figure it logs ("GPU KV cache size") can be a block lower."""
    return max(0, e.kv_available_bytes) // model.kv_bytes_per_token


def max_concurrency(model: CostModel, e: Evaluation) -> float:
    """KV tokens / max_model_len: how many max_model_len requests fit at once, as vLLM logs it ("Maximum
    concurrency for L tokens per request: X.XXx")."""
    return kv_tokens(model, e) / model.serving.max_model_len


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
    rows = []
    for w in sorted(t - d):
        if w <= top:
            continue
        without = model.evaluate(t - {w})
        rows.append(WidthChange(
            num_tokens=w,
            real_bytes=tuned.graph_memory_bytes - without.graph_memory_bytes,
            estimate_bytes=tuned.graph_estimate_bytes - without.graph_estimate_bytes,
            saved_ms=without.expected_step_ms - tuned.expected_step_ms,
        ))
    return WhatChanged(tuple(sorted(t - d)), tuple(sorted(d - t)), top, tuple(rows))


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


def _pads_to(model: CostModel, sizes: tuple[int, ...], width: int, uniform: bool) -> int | None:
    try:
        return model.serving.dispatcher(sizes).dispatch(width, uniform_decode=uniform).padded_size
    except ValueError:  # a list the runner refuses captures nothing: the step runs eager
        return None


def off_peak(model: CostModel, default: Evaluation, tuned: Evaluation) -> OffPeak:
    """Both lists under off-peak traffic (`CostModel.off_peak_step_ms`)."""
    s = model.serving
    width = s.decode_query_lens()[1]  # a dynamic speculative schedule may give one request another q
    uniform = width == s.decode_query_len
    return OffPeak(
        default_step_ms=model.off_peak_step_ms(default.capture_sizes),
        tuned_step_ms=model.off_peak_step_ms(tuned.capture_sizes),
        one_request_width=width,
        default_pads_to=_pads_to(model, default.capture_sizes, width, uniform),
        tuned_pads_to=_pads_to(model, tuned.capture_sizes, width, uniform),
    )
