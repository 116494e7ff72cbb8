"""SGLang 0.5.23's decode-graph dispatch: which captured graph (or eager) a decode batch of `bs` requests runs."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Dispatch", "Dispatcher", "decode_tokens_per_request"]


def decode_tokens_per_request(*, speculative_algorithm: str | None = None,
                              speculative_num_draft_tokens: int | None = None,
                              dllm_block_size: int | None = None) -> int:
    """`captured_req_width` of the target decode runner (`ModelRunner.decode_num_tokens_per_req`,
    model_executor/model_runner.py:876-897): speculative_num_draft_tokens for target verify, the dLLM block size for
    diffusion LMs, else 1. Draft-worker graphs (EAGLE draft decode/extend, DSPARK's N-1) are not modelled here."""
    if speculative_algorithm is not None:
        if speculative_num_draft_tokens is None or speculative_num_draft_tokens < 1:
            raise ValueError(f"speculative_num_draft_tokens={speculative_num_draft_tokens} must be >= 1 when "
                             f"speculative_algorithm={speculative_algorithm!r}")
        return speculative_num_draft_tokens
    if dllm_block_size is not None:
        if dllm_block_size < 1:
            raise ValueError(f"dllm_block_size={dllm_block_size} must be >= 1")
        return dllm_block_size
    return 1


@dataclass(frozen=True)
class Dispatch:
    """What SGLang runs for one decode (or target-verify) batch."""

    padded_bs: int | None
    """Batch size of the graph replayed (the batch is padded up to it); None when the batch runs eager."""
    num_tokens: int | None
    """Token width of that graph: padded_bs x tokens per request; None when eager."""

    @property
    def eager(self) -> bool:
        return self.padded_bs is None


class Dispatcher:
    """Maps decode batches to the captured decode graphs of one runner (DecodeCudaGraphRunner.can_run_graph,
    decode_cuda_graph_runner.py:845-924, and `_pad_to_bucket`, base_cuda_graph_runner.py:165-180).

    Only DECODE, TARGET_VERIFY, IDLE and DLLM_EXTEND batches may use these graphs; EXTEND and MIXED (chunked
    prefill + decode) batches never do (they try the separate prefill graphs, else run eager). Under DP attention
    pass the largest request count over the DP ranks, which is what SGLang keys the replay on.
    """

    def __init__(self, captured_batch_sizes: Sequence[int], *, tokens_per_request: int = 1,
                 disable_padding: bool = False) -> None:
        if tokens_per_request < 1:
            raise ValueError(f"tokens_per_request={tokens_per_request} must be >= 1")
        self.batch_sizes = sorted({int(bs) for bs in captured_batch_sizes})
        self.tokens_per_request = tokens_per_request
        self.disable_padding = disable_padding

    @property
    def max_bs(self) -> int:
        return self.batch_sizes[-1] if self.batch_sizes else 0

    def graph_widths(self) -> list[int]:
        """Token width of every captured decode graph, ascending."""
        return [bs * self.tokens_per_request for bs in self.batch_sizes]

    def dispatch(self, bs: int) -> Dispatch:
        """The graph a decode batch of `bs` requests replays: the smallest captured size >= bs (`bisect_left`), or
        eager above the largest; with --disable-cuda-graph-padding only an exactly captured size replays."""
        if bs < 1:
            raise ValueError(f"bs={bs} must be >= 1")
        if self.disable_padding:
            padded = bs if bs in self.batch_sizes else None
        elif bs > self.max_bs:
            padded = None
        else:
            padded = self.batch_sizes[bisect.bisect_left(self.batch_sizes, bs)]
        return Dispatch(padded, None if padded is None else padded * self.tokens_per_request)
