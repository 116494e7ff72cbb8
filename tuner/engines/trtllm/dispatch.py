"""TensorRT-LLM's generation-step dispatch (`CUDAGraphRunner`): which captured graph a step replays, or eager."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from tuner.engines.trtllm.defaults import DEFAULT_MAX_BATCH_SIZE

__all__ = ["Dispatch", "Dispatcher"]


@dataclass(frozen=True)
class Dispatch:
    """What TensorRT-LLM runs for one iteration."""

    padded_bs: int | None
    """Batch size of the graph replayed (padding requests fill the gap); None when the step runs eager."""
    num_tokens: int | None
    """Token width of that graph: padded_bs x (draft_len + 1); None when eager."""

    @property
    def eager(self) -> bool:
        return self.padded_bs is None


class Dispatcher:
    """Maps iterations to the captured generation graphs of one model engine.

    Only iterations with no context (prefill) request can replay (`ScheduledRequests.can_run_cuda_graph`; mixed
    encoder-decoder batches are not modelled). Graphs are captured only during warmup: a batch size without a graph
    never gets one later. Under attention DP pass the largest batch over the ranks, which is what the runner pads to.
    """

    def __init__(self, captured_batch_sizes: Sequence[int], *, draft_len: int = 0, enable_padding: bool = False,
                 max_batch_size: int = DEFAULT_MAX_BATCH_SIZE) -> None:
        if draft_len < 0:
            raise ValueError(f"draft_len={draft_len} must be >= 0")
        self.batch_sizes = sorted({int(bs) for bs in captured_batch_sizes})
        self.draft_len = draft_len
        self.enable_padding = enable_padding
        self.max_batch_size = max_batch_size

    @property
    def max_supported_batch_size(self) -> int:
        return self.batch_sizes[-1] if self.batch_sizes else 0

    def graph_widths(self) -> list[int]:
        """Token width of every captured graph, ascending."""
        return [bs * (self.draft_len + 1) for bs in self.batch_sizes]

    def _padded(self, bs: int, dummy_request_fits: bool) -> int:
        """`_get_padded_batch` + `_round_up_batch_size`: the size to run at, `bs` itself when nothing pads."""
        if not self.enable_padding or bs > self.max_supported_batch_size:
            return bs
        i = bisect.bisect_left(self.batch_sizes, bs)
        padded = self.batch_sizes[i]
        if padded > self.max_batch_size or (padded != bs and not dummy_request_fits):
            # Padding would exceed the LLM's max_batch_size, or the KV cache cannot hold the dummy request.
            return bs
        return padded

    def dispatch(self, bs: int, *, has_context_requests: bool = False, dummy_request_fits: bool = True) -> Dispatch:
        """The graph a generation step of `bs` requests replays: with padding the smallest captured size >= bs
        (`bisect_left`), without padding only an exactly captured size; eager above the largest captured size, for
        any step holding a context request, and when the padding dummy request finds no free KV block."""
        if bs < 1:
            raise ValueError(f"bs={bs} must be >= 1")
        if has_context_requests:
            return Dispatch(None, None)
        run_bs = self._padded(bs, dummy_request_fits)
        if run_bs not in self.batch_sizes:
            return Dispatch(None, None)
        return Dispatch(run_bs, run_bs * (self.draft_len + 1))
