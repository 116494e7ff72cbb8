"""vLLM's runtime CUDA-graph dispatch: which captured graph (or none) a step of T tokens replays."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from tuner.vllm.defaults import CUDAGRAPH_MODES

__all__ = ["Dispatch", "Dispatcher", "full_decode_sizes"]

# (decode_mode, mixed_mode, separate decode routine) per CUDAGraphMode, as vLLM's enum defines them.
_MODE_PARTS: dict[str, tuple[str, str, bool]] = {
    "NONE": ("NONE", "NONE", False),
    "PIECEWISE": ("PIECEWISE", "PIECEWISE", False),
    "FULL": ("FULL", "FULL", False),
    "FULL_DECODE_ONLY": ("FULL", "NONE", True),
    "FULL_AND_PIECEWISE": ("FULL", "PIECEWISE", True),
}


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def full_decode_sizes(
    capture_sizes: Sequence[int], decode_query_len: int, max_num_seqs: int
) -> list[int]:
    """FULL uniform-decode graph widths: each size rounded up to a multiple of q, kept only while the
    rounded width stays within the max capture size and `q * max_num_seqs` (at most max_num_seqs requests)."""
    if not capture_sizes:
        return []
    max_size = max(capture_sizes)
    limit = min(max_size, decode_query_len * max_num_seqs)
    return sorted({r for s in capture_sizes if (r := _round_up(s, decode_query_len)) <= limit})


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
    """Maps steps to graphs for one capture list, cudagraph mode and serving config."""

    def __init__(
        self,
        capture_sizes: Sequence[int],
        *,
        cudagraph_mode: str = "FULL_AND_PIECEWISE",
        decode_query_len: int = 1,
        max_num_seqs: int,
    ) -> None:
        if cudagraph_mode not in _MODE_PARTS:
            raise ValueError(f"cudagraph_mode={cudagraph_mode!r} must be one of {', '.join(CUDAGRAPH_MODES)}")
        if decode_query_len < 1:
            raise ValueError(f"decode_query_len={decode_query_len} must be >= 1")
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs={max_num_seqs} must be >= 1")
        self.capture_sizes = sorted(set(capture_sizes))
        self.cudagraph_mode = cudagraph_mode
        self.decode_query_len = decode_query_len
        self.max_num_seqs = max_num_seqs
        self.decode_mode, self.mixed_mode, self.separate_decode = _MODE_PARTS[cudagraph_mode]

    @property
    def max_size(self) -> int:
        return self.capture_sizes[-1] if self.capture_sizes and self.cudagraph_mode != "NONE" else 0

    @cached_property
    def decode_graph_sizes(self) -> list[int]:
        """Widths of the separately captured FULL uniform-decode graphs (empty without a separate routine)."""
        if self.cudagraph_mode == "NONE" or not (self.separate_decode and self.decode_mode == "FULL"):
            return []
        return full_decode_sizes(self.capture_sizes, self.decode_query_len, self.max_num_seqs)

    @cached_property
    def mixed_graph_sizes(self) -> list[int]:
        """Widths of the general (mixed-batch) graphs: every capture size, unless mixed runs eager."""
        return [] if self.mixed_mode == "NONE" else list(self.capture_sizes)

    def graphs(self) -> list[tuple[str, int]]:
        """Every graph vLLM captures, in capture order: mixed graphs first, then FULL decode, largest first."""
        mixed = [(self.mixed_mode, s) for s in reversed(self.mixed_graph_sizes)]
        return mixed + [("FULL", s) for s in reversed(self.decode_graph_sizes)]

    @staticmethod
    def _pad(sizes: list[int], num_tokens: int) -> int | None:
        i = bisect.bisect_left(sizes, num_tokens)
        return sizes[i] if i < len(sizes) else None

    def dispatch(self, num_tokens: int, *, uniform_decode: bool = False) -> Dispatch:
        """The graph a step of `num_tokens` replays; `uniform_decode` means every request has exactly q tokens."""
        if num_tokens < 1:
            raise ValueError(f"num_tokens={num_tokens} must be >= 1")
        if uniform_decode and self.decode_graph_sizes:
            padded = self._pad(self.decode_graph_sizes, num_tokens)
            if padded is not None:
                return Dispatch("FULL", padded)
        mode = self.decode_mode if uniform_decode and not self.separate_decode else self.mixed_mode
        if mode == "NONE":
            return Dispatch("NONE", None)
        padded = self._pad(self.mixed_graph_sizes, num_tokens)
        if padded is None:
            return Dispatch("NONE", None)
        return Dispatch(mode, padded)
