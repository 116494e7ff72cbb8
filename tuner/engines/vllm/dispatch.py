"""vLLM's runtime CUDA-graph dispatch: the graphs a capture list makes each runner capture, and which of them (or
none) a step replays, from its tokens, its per-request query length and whether a request is prefilling."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from tuner.engines.vllm.defaults import CUDAGRAPH_MODES

__all__ = ["Dispatch", "Dispatcher", "dispatch_steps", "full_decode_sizes", "manager_graphs", "mode_parts",
           "uniform_token_count"]

# (decode_mode, mixed_mode, separate decode routine) per CUDAGraphMode, as vLLM's enum defines them.
_MODE_PARTS: dict[str, tuple[str, str, bool]] = {
    "NONE": ("NONE", "NONE", False),
    "PIECEWISE": ("PIECEWISE", "PIECEWISE", False),
    "FULL": ("FULL", "FULL", False),
    "FULL_DECODE_ONLY": ("FULL", "NONE", True),
    "FULL_AND_PIECEWISE": ("FULL", "PIECEWISE", True),
}


def mode_parts(cudagraph_mode: str) -> tuple[str, str, bool]:
    """`(decode_mode, mixed_mode, separate_routine)` of a cudagraph mode, as `CUDAGraphMode` defines them."""
    if cudagraph_mode not in _MODE_PARTS:
        raise ValueError(f"cudagraph_mode={cudagraph_mode!r} must be one of {', '.join(CUDAGRAPH_MODES)}")
    return _MODE_PARTS[cudagraph_mode]


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def full_decode_sizes(
    capture_sizes: Sequence[int], decode_query_len: int, max_num_seqs: int
) -> list[int]:
    """FULL uniform-decode graph widths at one query length: each size rounded up to a multiple of q, kept only while
    the rounded width stays within the max capture size and `q * max_num_seqs` (at most max_num_seqs requests)."""
    if not capture_sizes:
        return []
    max_size = max(capture_sizes)
    limit = min(max_size, decode_query_len * max_num_seqs)
    return sorted({r for s in capture_sizes if (r := _round_up(s, decode_query_len)) <= limit})


def manager_graphs(
    capture_sizes: Sequence[int], cudagraph_mode: str, decode_query_lens: Sequence[int], max_decode_tokens: int,
    max_num_seqs: int,
) -> list[tuple[str, int, int | None]]:
    """`(mode, width, uniform query length or None)` of every graph one V2 `CudaGraphManager` captures, in capture
    order (`_init_candidates`, v1/worker/gpu/cudagraph_utils.py): a mixed-mode graph at every size, and under a
    separate FULL decode routine a FULL graph per decode query length ql at round_up(s, ql), kept while it is at most
    `max_decode_tokens`, the largest size and ql x max_num_seqs; duplicates dropped. PIECEWISE first, then FULL,
    each largest first, equal widths in vLLM's insertion order (sizes ascending, query lengths ascending)."""
    sizes = sorted(set(capture_sizes))
    if not sizes or cudagraph_mode == "NONE":
        return []
    decode_mode, mixed_mode, separate = mode_parts(cudagraph_mode)
    by_mode: dict[str, list[tuple[str, int, int | None]]] = {"PIECEWISE": [], "FULL": []}
    if separate and decode_mode == "FULL" and len(decode_query_lens):
        by_mode["FULL"] = _decode_graphs(sizes, decode_query_lens, max_decode_tokens, max_num_seqs)
    if mixed_mode != "NONE":  # separate decode leaves the mixed graphs PIECEWISE (or none): the lists never mix
        by_mode[mixed_mode] = [(mixed_mode, s, None) for s in reversed(sizes)]
    return by_mode["PIECEWISE"] + by_mode["FULL"]


def _decode_graphs(sizes: list[int], decode_query_lens: Sequence[int], max_decode_tokens: int, max_num_seqs: int
                   ) -> list[tuple[str, int, int | None]]:
    """`manager_graphs`' FULL decode graphs, largest first: for each size (ascending) and each query length (in
    order), round_up(size, ql) where it is at most `max_decode_tokens`, the largest size and ql x max_num_seqs, the
    first of equal (width, ql) kept; equal widths keep that insertion order (vLLM's stable list.sort(reverse=True)).
    Vectorised: thousands of sizes made the loop the cost model's hot spot (issue 34)."""
    s = np.asarray(sizes, dtype=np.int64)[:, None]
    ql = np.asarray(decode_query_lens, dtype=np.int64)[None, :]
    rounded = (-(-s // ql) * ql).ravel()  # row-major: the insertion order, sizes outer and query lengths inner
    qls = np.broadcast_to(ql, (len(sizes), ql.shape[1])).ravel()
    pos = np.flatnonzero((rounded <= max_decode_tokens) & (rounded <= sizes[-1]) & (rounded // qls <= max_num_seqs))
    # The first occurrence of each (width, ql), in insertion order.
    _, first = np.unique(rounded[pos] * (int(qls.max()) + 1) + qls[pos], return_index=True)
    kept = pos[np.sort(first)]
    order = kept[np.argsort(-rounded[kept], kind="stable")]
    return [("FULL", int(r), int(q)) for r, q in zip(rounded[order].tolist(), qls[order].tolist())]


def uniform_token_count(runner: str, decode_query_len: int, query_len: int | None, uniform_decode: bool) -> int | None:
    """The per-request token count a runner dispatches a step with (None: not a uniform batch). `query_len`: the
    tokens every request has when they all have the same (None: they differ); `uniform_decode`: besides, no request
    is prefilling (a decode step; vLLM V2 runs a one-token continuation chunk as a decode, so that one counts too).

    V2 (`get_uniform_decode_token_count`, v1/worker/utils.py): that query length for a decode step, so a decode step
    at a dynamic tier's query length is uniform at it, and a fresh q-token prompt is not. V1 (`_is_uniform_decode`,
    gpu_model_runner.py): uniform only at q = 1 + num_speculative_tokens, prompt chunks of q tokens included."""
    if query_len is None:
        return None
    if runner == "v1":
        return query_len if query_len == decode_query_len else None
    return query_len if uniform_decode else None


def dispatch_steps(d: object, widths: np.ndarray, utc: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`dispatch` of many steps for a dispatcher shaped like `Dispatcher` (its `decode_graphs`, `full_pad_sizes`,
    `mixed_graph_sizes`, `mixed_mode`, `exact`): (mode, padded width (0: eager), FULL pad width (0: none)). A uniform
    step (utc > 0) pads to its FULL pad width (V2: the smallest FULL width >= T; V1: the next size of the list) and
    replays FULL only if a graph there holds its uniform token count; the rest replay the mixed graph at the smallest
    size >= T, or run eager."""
    n = len(widths)
    modes = np.full(n, "NONE", dtype=object)
    padded = np.zeros(n, dtype=np.int64)
    full_at = np.zeros(n, dtype=np.int64)
    pending = np.ones(n, dtype=bool)
    decode_graphs = d.decode_graphs  # type: ignore[attr-defined]
    if decode_graphs:
        pad_to = np.array(d.full_pad_sizes, dtype=np.int64)  # type: ignore[attr-defined]
        idx = np.minimum(np.searchsorted(pad_to, widths, side="left"), len(pad_to) - 1)
        at = pad_to[idx]
        full_at = np.where((at >= widths) & (utc > 0), at, 0)
        big = int(max(max(q for _, q in decode_graphs), int(utc.max(initial=0)))) + 1
        held = np.array([width * big + ql for width, ql in decode_graphs], dtype=np.int64)
        hit = (at >= widths) & (utc > 0) & np.isin(at * big + utc, held)
        if d.exact:  # type: ignore[attr-defined]  # TensorRT-LLM without padding: only an exactly captured width
            hit &= at == widths
        modes[hit], padded[hit] = "FULL", at[hit]
        pending &= ~hit
    mixed = np.array(d.mixed_graph_sizes, dtype=np.int64)  # type: ignore[attr-defined]
    mixed_mode = d.mixed_mode  # type: ignore[attr-defined]
    if len(mixed) and mixed_mode != "NONE":
        idx = np.searchsorted(mixed, widths, side="left")
        sel = pending & (idx < len(mixed))
        modes[sel], padded[sel] = mixed_mode, mixed[idx[sel]]
    return modes, padded, full_at


@dataclass(frozen=True)
class Dispatch:
    """What vLLM runs for one step."""

    runtime_mode: str
    """`FULL`, `PIECEWISE` or `NONE` (eager: the compiled model without a graph)."""
    padded_size: int | None
    """Width of the graph replayed (the step is padded up to it); None when eager."""

    @property
    def eager(self) -> bool:
        return self.runtime_mode == "NONE"


class Dispatcher:
    """Maps steps to graphs for one capture list (as the runner runs it), cudagraph mode, runner and serving config.

    `decode_query_len` is q = 1 + num_speculative_tokens; `decode_query_lens` the query lengths V2 captures FULL decode
    graphs at (a dynamic speculative schedule's tiers, `1 + k` for each k the dense schedule holds; default [q])."""

    exact = False
    """A decode step pads up to a graph (TensorRT-LLM without padding replays only its own width)."""

    def __init__(
        self,
        capture_sizes: Sequence[int],
        *,
        cudagraph_mode: str = "FULL_AND_PIECEWISE",
        decode_query_len: int = 1,
        max_num_seqs: int,
        runner: str = "v2",
        decode_query_lens: Sequence[int] | None = None,
    ) -> None:
        self.decode_mode, self.mixed_mode, self.separate_decode = mode_parts(cudagraph_mode)
        if decode_query_len < 1:
            raise ValueError(f"decode_query_len={decode_query_len} must be >= 1")
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs={max_num_seqs} must be >= 1")
        if runner not in ("v1", "v2"):
            raise ValueError(f"runner={runner!r} must be v1 or v2")
        lens = sorted(set(decode_query_lens)) if decode_query_lens is not None else [decode_query_len]
        if not lens or lens[0] < 1 or lens[-1] > decode_query_len:
            raise ValueError(f"decode_query_lens={lens} must be non-empty, each within 1..q={decode_query_len}")
        if runner == "v1" and lens != [decode_query_len]:
            raise ValueError(f"decode_query_lens={lens}: the V1 runner captures FULL decode graphs at q="
                             f"{decode_query_len} only (it runs dynamic schedules PIECEWISE)")
        self.capture_sizes = sorted(set(capture_sizes))
        self.cudagraph_mode = cudagraph_mode
        self.decode_query_len = decode_query_len
        self.decode_query_lens = lens
        self.max_num_seqs = max_num_seqs
        self.runner = runner

    @property
    def max_size(self) -> int:
        return self.capture_sizes[-1] if self.capture_sizes and self.cudagraph_mode != "NONE" else 0

    @cached_property
    def decode_graphs(self) -> list[tuple[int, int]]:
        """`(width, query length)` of every separately captured FULL uniform-decode graph, in capture order. V2: per
        decode query length, the sizes rounded up to it (`manager_graphs`); V1 (`CudagraphDispatcher`): the sizes x
        with q <= x <= q x max_num_seqs, not rounded (V1 rewrote the list to multiples of q first)."""
        if self.cudagraph_mode == "NONE" or not (self.separate_decode and self.decode_mode == "FULL"):
            return []
        q = self.decode_query_len
        if self.runner == "v1":
            return [(x, q) for x in reversed(self.capture_sizes) if q <= x <= q * self.max_num_seqs]
        return [(w, ql) for mode, w, ql in manager_graphs(self.capture_sizes, self.cudagraph_mode,
                                                           self.decode_query_lens, q * self.max_num_seqs,
                                                           self.max_num_seqs)
                if mode == "FULL"]

    @cached_property
    def decode_graph_sizes(self) -> list[int]:
        """Widths of the FULL uniform-decode graphs, ascending and unique."""
        return sorted({w for w, _ in self.decode_graphs})

    @cached_property
    def _decode_pairs(self) -> frozenset[tuple[int, int]]:
        return frozenset(self.decode_graphs)

    @cached_property
    def mixed_graph_sizes(self) -> list[int]:
        """Widths of the general (mixed-batch) graphs: every capture size, unless mixed runs eager."""
        return [] if self.mixed_mode == "NONE" or self.cudagraph_mode == "NONE" else list(self.capture_sizes)

    def graphs(self) -> list[tuple[str, int]]:
        """Every graph vLLM captures, one entry per graph, in capture order: mixed graphs first, then FULL decode,
        each largest first (a width holding FULL graphs of two query lengths appears twice)."""
        mixed = [(self.mixed_mode, s) for s in reversed(self.mixed_graph_sizes)]
        return mixed + [("FULL", w) for w, _ in self.decode_graphs]

    @property
    def full_pad_sizes(self) -> list[int]:
        """The widths a uniform step pads up to before its FULL decode graph is looked for: V2 the FULL graphs'
        widths, V1 the next size of the list."""
        return self.capture_sizes if self.runner == "v1" else self.decode_graph_sizes

    def dispatch_steps(self, widths: np.ndarray, utc: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`dispatch` of many steps at once (`dispatch_steps`)."""
        return dispatch_steps(self, widths, utc)

    def uniform_token_counts(self, query_lens: np.ndarray, uniform: np.ndarray) -> np.ndarray:
        """`uniform_token_count` of many steps at once (0: not uniform), for steps' query lengths (0: they differ)
        and decode flags."""
        if self.runner == "v1":
            return np.where(query_lens == self.decode_query_len, self.decode_query_len, 0)
        return np.where(uniform, query_lens, 0)

    @staticmethod
    def _pad(sizes: list[int], num_tokens: int) -> int | None:
        i = bisect.bisect_left(sizes, num_tokens)
        return sizes[i] if i < len(sizes) else None

    def uniform_token_count(self, query_len: int | None, uniform_decode: bool) -> int | None:
        """The per-request token count this runner dispatches such a step with (see `uniform_token_count`)."""
        return uniform_token_count(self.runner, self.decode_query_len, query_len, uniform_decode)

    def dispatch(self, num_tokens: int, *, uniform_decode: bool = False, query_len: int | None = None) -> Dispatch:
        """The graph a step of `num_tokens` replays. `uniform_decode`: a decode step (no request prefilling, every
        request `query_len` tokens, by default q); otherwise `query_len` is a prompt chunk's length when every request
        has it (None: the lengths differ).

        V2 (`CudaGraphManager.dispatch`): the FULL graphs at the smallest FULL width >= T come first, and one of them
        replays only if it holds the step's uniform query length (another tier's graph there shadows a wider one of
        the step's own); then the mixed graph at the smallest size >= T; else eager. V1 (`CudagraphDispatcher`): T
        pads to the next size of the list; FULL where a uniform step's padded size has a FULL decode graph, else the
        mixed graph there; eager above the largest size."""
        if num_tokens < 1:
            raise ValueError(f"num_tokens={num_tokens} must be >= 1")
        if uniform_decode and query_len is None:
            query_len = self.decode_query_len
        utc = self.uniform_token_count(query_len, uniform_decode)
        if self.decode_graphs and utc is not None:
            padded = self._pad(self.full_pad_sizes, num_tokens)
            if padded is not None and (padded, utc) in self._decode_pairs:
                return Dispatch("FULL", padded)
        if self.mixed_mode == "NONE":
            return Dispatch("NONE", None)
        padded = self._pad(self.mixed_graph_sizes, num_tokens)
        if padded is None:
            return Dispatch("NONE", None)
        return Dispatch(self.mixed_mode, padded)
