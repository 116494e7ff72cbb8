"""vLLM 0.34's V2 runtime dispatch: the graphs its `CudaGraphManager` captures for the two lists (uniform decode
graphs by request count, per decode query length; token-keyed graphs at the prefill sizes), in capture order, and which
of them (or none) a step replays (`_init_candidates` and `dispatch`, vllm/v1/worker/gpu/cudagraph_utils.py).

A decode batch of n requests at query length q replays the smallest decode graph of ITS OWN q holding n requests (no
other q's graph shadows it); above the largest, or not uniform, a step replays the token-keyed graph at the smallest
prefill size at or above its tokens (PIECEWISE under FULL_AND_PIECEWISE, FULL under FULL), else runs eager. Inside
cgtune a 0.34 list is one set of keys: a positive key is a prefill graph's token count, a negative key -n the decode
graphs of n requests (`split_keys`)."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property

import numpy as np

from tuner.engines.vllm.dispatch import Dispatch, mode_parts
from tuner.engines.vllm.v034.defaults import SplitSizes, decode_shapes

__all__ = ["Dispatcher034", "join_keys", "split_keys"]


def split_keys(keys: Iterable[int]) -> tuple[list[int], list[int]]:
    """(prefill token sizes, decode request sizes) of a 0.34 list's keys, each ascending and unique."""
    keys = {int(k) for k in keys}
    return sorted(k for k in keys if k > 0), sorted(-k for k in keys if k < 0)


def join_keys(prefill_token_sizes: Iterable[int], decode_request_sizes: Iterable[int]) -> tuple[int, ...]:
    """The keys of a 0.34 list (decode request counts negated), ascending."""
    return tuple(sorted({int(t) for t in prefill_token_sizes} | {-int(n) for n in decode_request_sizes}))


class Dispatcher034:
    """Maps steps to the graphs vLLM 0.34's target `CudaGraphManager` captures for one resolved pair of lists."""

    exact = False
    """A step pads up to a graph."""
    runner = "v2"

    def __init__(self, prefill_token_sizes: Sequence[int], decode_request_sizes: Sequence[int], *,
                 cudagraph_mode: str, decode_query_lens: Mapping[int, int], max_num_seqs: int,
                 decode_max_tokens: int, uniform_decode_query_len: int) -> None:
        self.decode_mode, self.mixed_mode, self.separate_decode = mode_parts(cudagraph_mode)
        self.cudagraph_mode = cudagraph_mode
        self.prefill_token_sizes = sorted(set(prefill_token_sizes))
        self.decode_request_sizes = sorted(set(decode_request_sizes))
        self.max_num_seqs = max_num_seqs
        self.decode_query_len = uniform_decode_query_len
        # The manager caps each query length's requests at max_num_seqs (`decode_max_reqs`).
        self.decode_max_reqs = {q: min(n, max_num_seqs) for q, n in sorted(decode_query_lens.items())}
        self.decode_query_lens = sorted(self.decode_max_reqs)
        self.decode_max_tokens = decode_max_tokens
        self.capture_sizes = sorted({*self.prefill_token_sizes, *self.decode_graph_sizes})
        """Every graph's token count (0.34's record of the target's graphs)."""

    @classmethod
    def from_split(cls, split: SplitSizes, *, max_num_seqs: int, uniform_decode_query_len: int) -> Dispatcher034:
        """The target manager of a resolved config (`resolve_capture_sizes`)."""
        return cls(split.prefill_token_sizes, split.decode_request_sizes, cudagraph_mode=split.cudagraph_mode,
                   decode_query_lens=split.decode_query_lens, max_num_seqs=max_num_seqs,
                   decode_max_tokens=split.decode_max_tokens, uniform_decode_query_len=uniform_decode_query_len)

    @property
    def max_size(self) -> int:
        return self.capture_sizes[-1] if self.capture_sizes and self.cudagraph_mode != "NONE" else 0

    @cached_property
    def decode_shapes(self) -> list[tuple[int, int]]:
        """`(requests, query length)` of every uniform decode graph, as `decode_cudagraph_capture_shapes` orders them
        (by query length, then requests)."""
        if self.cudagraph_mode == "NONE" or not (self.separate_decode and self.decode_mode != "NONE"):
            return []
        return decode_shapes(self.decode_request_sizes, self.decode_max_reqs, self.decode_max_tokens)

    def manager_graphs(self) -> list[tuple[str, int, int | None, int | None]]:
        """`(mode, tokens, uniform token count, requests)` of every graph in capture order: PIECEWISE, then FULL, each
        widest first, equal widths in vLLM's insertion order (decode graphs before token-keyed ones)."""
        if self.cudagraph_mode == "NONE":
            return []
        descs: list[tuple[str, int, int | None, int | None]] = [
            (self.decode_mode, n * q, q, n) for n, q in self.decode_shapes]
        if self.mixed_mode != "NONE":
            reqs = (lambda t: min(t, self.max_num_seqs)) if self.mixed_mode == "FULL" else (lambda t: None)
            descs += [(self.mixed_mode, t, None, reqs(t)) for t in self.prefill_token_sizes]
        out = []
        for mode in ("PIECEWISE", "FULL"):
            out += sorted((d for d in descs if d[0] == mode), key=lambda d: d[1], reverse=True)
        return out

    @cached_property
    def decode_graphs(self) -> list[tuple[int, int]]:
        """`(width, query length)` of every uniform decode graph, in capture order."""
        return [(t, q) for mode, t, q, _ in self.manager_graphs() if q is not None]

    @cached_property
    def decode_graph_sizes(self) -> list[int]:
        return sorted({w for w, _ in self.decode_graphs})

    @cached_property
    def mixed_graph_sizes(self) -> list[int]:
        """Widths of the token-keyed graphs: every prefill size, unless mixed batches run eager."""
        return [] if self.mixed_mode == "NONE" or self.cudagraph_mode == "NONE" else list(self.prefill_token_sizes)

    @property
    def full_pad_sizes(self) -> list[int]:
        """The widths a uniform step's decode graph is looked for at: the decode graphs' (per query length, by
        requests)."""
        return self.decode_graph_sizes

    def graphs(self) -> list[tuple[str, int]]:
        """Every graph vLLM captures, one entry per graph, in capture order."""
        return [(mode, t) for mode, t, _, _ in self.manager_graphs()]

    @cached_property
    def _tables(self) -> dict[int, list[int]]:
        """Per query length, the request counts of its decode graphs, ascending (entry i: the i-th smallest)."""
        tables: dict[int, list[int]] = {}
        for n, q in self.decode_shapes:
            tables.setdefault(q, []).append(n)
        return {q: sorted(ns) for q, ns in tables.items()}

    def uniform_token_counts(self, query_lens: np.ndarray, uniform: np.ndarray) -> np.ndarray:
        """Per step, the query length a decode step is dispatched at (0: not a decode step)."""
        return np.where(uniform, query_lens, 0)

    def uniform_token_count(self, query_len: int | None, uniform_decode: bool) -> int | None:
        return query_len if uniform_decode and query_len is not None else None

    def _token_keyed(self, num_tokens: int) -> int | None:
        sizes = self.mixed_graph_sizes
        i = bisect.bisect_left(sizes, num_tokens)
        return sizes[i] if i < len(sizes) else None

    def dispatch_desc(self, num_reqs: int, num_tokens: int,
                      uniform_token_count: int | None) -> tuple[str, int, int | None]:
        """`CudaGraphManager.dispatch`: (mode, padded tokens, padded requests or None); eager: ("NONE", num_tokens,
        num_reqs)."""
        if self.cudagraph_mode == "NONE" or num_tokens < 1:
            return "NONE", num_tokens, num_reqs
        if uniform_token_count is not None:
            table = self._tables.get(uniform_token_count, [])
            n = -(-num_tokens // uniform_token_count)
            i = bisect.bisect_left(table, n)
            if i < len(table) and table[i] >= num_reqs:
                return self.decode_mode, table[i] * uniform_token_count, table[i]
        padded = self._token_keyed(num_tokens)
        if padded is not None:
            if self.mixed_mode != "FULL":
                return self.mixed_mode, padded, None  # PIECEWISE: no request padding
            # A FULL token-keyed graph (mode FULL) holds min(tokens, max_num_seqs) requests, any uniform count.
            reqs = min(padded, self.max_num_seqs)
            if reqs >= num_reqs:
                return "FULL", padded, reqs
        return "NONE", num_tokens, num_reqs

    def dispatch(self, num_tokens: int, *, uniform_decode: bool = False, query_len: int | None = None) -> Dispatch:
        """The graph a step of `num_tokens` replays (`Dispatch`): a decode step (`uniform_decode`, every request
        `query_len` tokens, by default q) of ceil(tokens / query length) requests, or a mixed step."""
        if num_tokens < 1:
            raise ValueError(f"num_tokens={num_tokens} must be >= 1")
        if uniform_decode and query_len is None:
            query_len = self.decode_query_len
        utc = self.uniform_token_count(query_len, uniform_decode)
        reqs = -(-num_tokens // utc) if utc else 1
        mode, padded, _ = self.dispatch_desc(reqs, num_tokens, utc)
        return Dispatch(mode, None if mode == "NONE" else padded)

    def dispatch_steps(self, widths: np.ndarray, utc: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`dispatch` of many steps (uniform token count 0: not a decode step): (mode, padded width (0: eager), the
        decode width looked up (0: none))."""
        n = len(widths)
        modes = np.full(n, "NONE", dtype=object)
        padded = np.zeros(n, dtype=np.int64)
        full_at = np.zeros(n, dtype=np.int64)
        if self.cudagraph_mode == "NONE" or n == 0:
            return modes, padded, full_at
        pending = np.ones(n, dtype=bool)
        for q, table in self._tables.items():
            sel = np.flatnonzero(utc == q)
            if not len(sel):
                continue
            reqs = np.array(table, dtype=np.int64)
            need = -(-widths[sel] // q)
            idx = np.searchsorted(reqs, need, side="left")
            ok = idx < len(reqs)
            hit = sel[ok]
            at = reqs[idx[ok]] * q
            modes[hit], padded[hit], full_at[hit] = self.decode_mode, at, at
            pending[hit] = False
        mixed = np.array(self.mixed_graph_sizes, dtype=np.int64)
        if len(mixed):
            idx = np.searchsorted(mixed, widths, side="left")
            sel = pending & (idx < len(mixed))
            modes[sel], padded[sel] = self.mixed_mode, mixed[idx[sel]]
        return modes, padded, full_at
