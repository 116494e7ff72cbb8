"""TensorRT-LLM (PyTorch backend) `cuda_graph_config` defaults and validator, reproduced exactly from
`tensorrt_llm/llmapi/llm_args.py` (BaseCudaGraphConfig, main after PR #12895, the +64 padding grid)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

__all__ = [
    "DEFAULT_CUDA_GRAPH_MAX_BATCH_SIZE",
    "DEFAULT_FREE_GPU_MEMORY_FRACTION",
    "DEFAULT_MAX_BATCH_SIZE",
    "DEFAULT_MAX_NUM_TOKENS",
    "default_batch_sizes",
    "generate_batch_sizes",
    "merge_schedule_keys",
    "resolve_cuda_graph_config",
]

DEFAULT_CUDA_GRAPH_MAX_BATCH_SIZE = 128
"""Graph max when neither `batch_sizes` nor `cuda_graph_config.max_batch_size` is set; independent of the LLM's
`max_batch_size`, so batches above 128 run eager by default."""

DEFAULT_MAX_BATCH_SIZE = 2048
"""`BaseLlmArgs.max_batch_size` default (the LLM-level request cap)."""

DEFAULT_MAX_NUM_TOKENS = 8192
"""`BaseLlmArgs.max_num_tokens` default."""

DEFAULT_FREE_GPU_MEMORY_FRACTION = 0.9
"""`KvCacheConfig.free_gpu_memory_fraction` default."""


def generate_batch_sizes(max_batch_size: int, enable_padding: bool) -> list[int]:
    """`BaseCudaGraphConfig._generate_cuda_graph_batch_sizes`.

    Padding: [1, 2, 4, 8, 16, ..., 128] then +64 steps while <= max (PR #12895; the releases before it doubled
    instead, and which release first ships +64 is [UNCONFIRMED], so only the confirmed main-branch rule is here).
    No padding: 1..31, 32, 64, 128 and the powers of two from 256 below max. Then sizes <= max, sorted, and max
    appended when missing.
    """
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size={max_batch_size} must be >= 1")
    if enable_padding:
        batch_sizes = [1, 2, 4] + [i * 8 for i in range(1, 17)]
        while batch_sizes[-1] + 64 <= max_batch_size:
            batch_sizes.append(batch_sizes[-1] + 64)
    else:
        batch_sizes = list(range(1, 32)) + [32, 64, 128]
        # math.log(x, 2) as TensorRT-LLM writes it, float rounding included.
        batch_sizes += [2**i for i in range(8, math.ceil(math.log(max_batch_size, 2)))]
    batch_sizes = sorted(size for size in batch_sizes if size <= max_batch_size)
    if not batch_sizes or max_batch_size != batch_sizes[-1]:
        batch_sizes.append(max_batch_size)
    return batch_sizes


def resolve_cuda_graph_config(batch_sizes: Sequence[int] | None = None, max_batch_size: int = 0, *,
                              enable_padding: bool = False) -> tuple[list[int], int]:
    """`validate_base_cuda_graph_config`: (batch_sizes, max_batch_size) as TensorRT-LLM stores them.

    An explicit non-empty list is sorted and sets max := max(list); a different explicit non-zero
    `cuda_graph_config.max_batch_size` is a ValueError, as in TensorRT-LLM. Otherwise (None or []) the list is
    generated from max_batch_size, or 128 when that is 0.
    """
    if max_batch_size < 0:
        raise ValueError(f"cuda_graph_config.max_batch_size={max_batch_size} must be >= 0")
    if batch_sizes:
        values = sorted(int(s) for s in batch_sizes)
        derived_max = values[-1]
        if max_batch_size not in (0, derived_max):
            raise ValueError(f"cuda_graph_config.max_batch_size={max_batch_size} must equal max(batch_sizes)="
                             f"{derived_max} when both are given (TensorRT-LLM rejects the config)")
        return values, derived_max
    resolved_max = max_batch_size or DEFAULT_CUDA_GRAPH_MAX_BATCH_SIZE
    return generate_batch_sizes(resolved_max, enable_padding), resolved_max


def default_batch_sizes(max_batch_size: int | None = None, *, enable_padding: bool = False) -> list[int]:
    """The list TensorRT-LLM generates for `cuda_graph_config: {max_batch_size: N, enable_padding: P}` without
    `batch_sizes`; None (or 0) is the default max of 128. Sorted, in requests."""
    return resolve_cuda_graph_config(None, max_batch_size or 0, enable_padding=enable_padding)[0]


def merge_schedule_keys(batch_sizes: Sequence[int], schedule: Mapping[int, int]) -> list[int]:
    """`DecodeCudaGraphConfig._merge_schedule_keys`: every `speculative_config.draft_len_schedule` key up to the
    list's max gets a graph. (TorchLlmArgs also turns `enable_padding` on when a schedule is set.)"""
    values = list(batch_sizes)
    if not values:
        raise ValueError("batch_sizes=[] must hold at least one size")
    extra = sorted(bs for bs in schedule if bs <= values[-1])
    if not extra:
        return values
    # The two-pointer merge of the original, kept as is: equal entries collapse, everything else is kept.
    merged: list[int] = []
    i = j = 0
    while i < len(values) and j < len(extra):
        if values[i] < extra[j]:
            merged.append(values[i])
            i += 1
        elif values[i] > extra[j]:
            merged.append(extra[j])
            j += 1
        else:
            merged.append(values[i])
            i += 1
            j += 1
    return merged + values[i:] + extra[j:]
