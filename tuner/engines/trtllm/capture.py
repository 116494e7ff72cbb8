"""What TensorRT-LLM's PyTorch backend really captures: the model engine's batch-size filter, the draft length of
the graphs, and the whole resolution from LLM-API options to the captured list."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tuner.engines.trtllm.defaults import (
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_MAX_NUM_TOKENS,
    resolve_cuda_graph_config,
)

__all__ = [
    "CudaGraphs",
    "captured_batch_sizes",
    "filter_cuda_graph_batch_sizes",
    "graph_count",
    "graph_draft_len",
    "resolve_cuda_graphs",
]


def filter_cuda_graph_batch_sizes(cuda_graph_batch_sizes: Sequence[int], max_batch_size: int, max_num_tokens: int,
                                  tokens_per_request: int, enable_padding: bool) -> list[int]:
    """`_filter_cuda_graph_batch_sizes` (_torch/pyexecutor/model_engine.py), line for line.

    cap = min(LLM max_batch_size, max_num_tokens // tokens_per_request); [] when cap < 1. Sizes <= cap are kept
    (the input is assumed sorted); at the first size above cap the walk stops, after appending cap when padding is on
    and the last kept size is not already cap.
    """
    if tokens_per_request < 1:
        raise ValueError(f"tokens_per_request={tokens_per_request} must be >= 1")
    max_cuda_graph_bs = min(max_batch_size, max_num_tokens // tokens_per_request)
    if max_cuda_graph_bs < 1:
        return []
    result: list[int] = []
    for i, bs in enumerate(cuda_graph_batch_sizes):
        if bs <= max_cuda_graph_bs:
            result.append(bs)
        else:
            if enable_padding and (i == 0 or result[i - 1] != max_cuda_graph_bs):
                result.append(max_cuda_graph_bs)
            break
    return result


def captured_batch_sizes(batch_sizes: Sequence[int], *, max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
                         max_num_tokens: int = DEFAULT_MAX_NUM_TOKENS, max_total_draft_tokens: int = 0,
                         enable_padding: bool = False) -> list[int]:
    """The engine's `_cuda_graph_batch_sizes` for a validated (sorted) list: the filter with
    tokens_per_request = 1 + max_total_draft_tokens, and [] for an empty list."""
    if max_total_draft_tokens < 0:
        raise ValueError(f"max_total_draft_tokens={max_total_draft_tokens} must be >= 0")
    if not batch_sizes:
        return []
    return filter_cuda_graph_batch_sizes(batch_sizes, max_batch_size, max_num_tokens, 1 + max_total_draft_tokens,
                                         enable_padding)


def graph_draft_len(max_draft_len: int = 0, max_total_draft_tokens: int | None = None, *,
                    linear_tree: bool = True) -> int:
    """Draft length in the key of the target model's graphs (`_get_graphs_to_capture`, case 3): max_draft_len for
    linear-tree speculation, max_total_draft_tokens for tree decoding; 0 without speculation."""
    if max_draft_len < 0:
        raise ValueError(f"max_draft_len={max_draft_len} must be >= 0")
    total = max_draft_len if max_total_draft_tokens is None else max_total_draft_tokens
    return max_draft_len if linear_tree else total


def graph_count(captured: Sequence[int], *, draft_lengths: int = 1, one_engine_speculative: bool = False,
                short_long_sparse: bool = False) -> int:
    """Graphs captured for a list (`_capture_generation_cuda_graphs`): one per (size, draft length), doubled for
    one-engine speculative decoding (greedy + advanced-sampling pass) and for sparse attention that needs separate
    short/long-sequence graphs (DSA). `draft_lengths` is 2 for a two-model run with `max_concurrency` set.
    Dynamic draft-length schedules are not modelled here."""
    if draft_lengths < 1:
        raise ValueError(f"draft_lengths={draft_lengths} must be >= 1")
    count = len(captured) * draft_lengths
    return count * (2 if one_engine_speculative else 1) * (2 if short_long_sparse else 1)


@dataclass(frozen=True)
class CudaGraphs:
    """TensorRT-LLM's generation-only CUDA graphs for one LLM-API configuration."""

    config_batch_sizes: list[int]
    """`cuda_graph_config.batch_sizes` after validation (explicit and sorted, or generated)."""
    config_max_batch_size: int
    """`cuda_graph_config.max_batch_size` after validation (max of the list)."""
    batch_sizes: list[int]
    """What the model engine captures after its filter, ascending, in requests (x beam width)."""
    enable_padding: bool
    """Whether batches round up to the next captured size (else only exact sizes replay)."""
    draft_len: int
    """Draft length of the target graphs (0 without speculation)."""

    @property
    def tokens_per_request(self) -> int:
        return self.draft_len + 1

    @property
    def max_supported_batch_size(self) -> int:
        """The largest captured size (0 when none): wider generation steps run eager."""
        return self.batch_sizes[-1] if self.batch_sizes else 0

    @property
    def widths(self) -> list[int]:
        """Token width of each graph: bs x (draft_len + 1)."""
        return [bs * self.tokens_per_request for bs in self.batch_sizes]


def resolve_cuda_graphs(
    *,
    batch_sizes: Sequence[int] | None = None,
    cuda_graph_max_batch_size: int = 0,
    enable_padding: bool = False,
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    max_num_tokens: int = DEFAULT_MAX_NUM_TOKENS,
    max_draft_len: int = 0,
    max_total_draft_tokens: int | None = None,
    linear_tree: bool = True,
) -> CudaGraphs:
    """From `cuda_graph_config` and the top-level options to the captured graphs: the config validator, then the
    engine filter with tokens per request = 1 + max_total_draft_tokens (max_draft_len for linear speculation)."""
    for name, value in (("max_batch_size", max_batch_size), ("max_num_tokens", max_num_tokens)):
        if value < 1:
            raise ValueError(f"{name}={value} must be >= 1")
    config_sizes, config_max = resolve_cuda_graph_config(batch_sizes, cuda_graph_max_batch_size,
                                                         enable_padding=enable_padding)
    total = max_draft_len if max_total_draft_tokens is None else max_total_draft_tokens
    captured = captured_batch_sizes(config_sizes, max_batch_size=max_batch_size, max_num_tokens=max_num_tokens,
                                    max_total_draft_tokens=total, enable_padding=enable_padding)
    return CudaGraphs(config_batch_sizes=config_sizes, config_max_batch_size=config_max, batch_sizes=captured,
                      enable_padding=enable_padding,
                      draft_len=graph_draft_len(max_draft_len, max_total_draft_tokens, linear_tree=linear_tree))
