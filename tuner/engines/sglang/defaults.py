"""SGLang 0.5.23's default CUDA-graph batch-size lists and GPU-memory capacity defaults, reproduced exactly."""

from __future__ import annotations

__all__ = [
    "DEFAULT_MAX_PREFILL_TOKENS",
    "UNKNOWN_GPU_MAX_BS",
    "default_chunked_prefill_size",
    "default_decode_batch_sizes",
    "default_decode_max_bs",
    "default_prefill_batch_sizes",
    "default_prefill_max_tokens",
]

UNKNOWN_GPU_MAX_BS = 160
"""Decode max_bs when the GPU memory cannot be read (`handle_gpu_memory_settings`' fallback branch)."""

DEFAULT_MAX_PREFILL_TOKENS = 16384
"""`--max-prefill-tokens` default (arg_groups/fields/schedule.py)."""

_PP_PREFILL_MAX_TOKENS = 8192
"""`_DEFAULT_PP_PREFILL_CUDA_GRAPH_MAX_TOKENS`: prefill cap for pp > 1 with breakable prefill graphs."""

# (upper bound in MiB, exclusive; chunked_prefill_size; max_bs for tp < 4; max_bs for tp >= 4), in the order of
# the if/elif chain in arg_groups/memory_hook.py:89-188. The last row (>= 160 GiB) ignores tp.
_GPU_TIERS: tuple[tuple[float, int, int, int], ...] = (
    (20 * 1024, 2048, 8, 8),          # T4, 4080
    (35 * 1024, 4096, 48, 160),       # A10, 4090, 5090
    (60 * 1024, 4096, 32, 160),       # A100-40GB, L40
    (90 * 1024, 8192, 256, 512),      # H100, A100-80GB
    (160 * 1024, 8192, 256, 512),     # H20, H200
    (float("inf"), 16384, 512, 512),  # B200, MI300
)


def _tier(gpu_memory_mib: float) -> tuple[float, int, int, int]:
    return next(t for t in _GPU_TIERS if gpu_memory_mib < t[0])


def default_chunked_prefill_size(gpu_memory_mib: float | None) -> int:
    """`--chunked-prefill-size` when unset: 2048/4096/4096/8192/8192/16384 by GPU memory, 4096 when unknown."""
    if gpu_memory_mib is None:
        return 4096
    return _tier(gpu_memory_mib)[1]


def default_decode_max_bs(gpu_memory_mib: float | None, tp_size: int = 1, *,
                          max_running_requests: int | None = None) -> int:
    """Decode `max_bs` when neither `max_bs` nor `bs` is given (memory_hook.py:89-188).

    `gpu_memory_mib` is the smallest `nvidia-smi memory.total` over the visible GPUs (None: unknown GPU). A user-set
    `--max-running-requests` below the defaulted max_bs lowers it to that value; the speculative rule that sets
    max_running_requests=48 runs later and does NOT pass through here (see `tuner.engines.sglang.speculative`).
    """
    if tp_size < 1:
        raise ValueError(f"tp_size={tp_size} must be >= 1")
    if gpu_memory_mib is None:
        max_bs = UNKNOWN_GPU_MAX_BS
    else:
        _, _, small_tp, large_tp = _tier(gpu_memory_mib)
        # The >= 160 GiB branch sets 512 regardless of tp; its two columns are equal.
        max_bs = small_tp if tp_size < 4 else large_tp
    if max_running_requests is not None and max_bs > max_running_requests:
        max_bs = max_running_requests
    return max_bs


def default_decode_batch_sizes(max_bs: int, *, speculative: bool = False, disable_padding: bool = False) -> list[int]:
    """`generate_decode_cuda_graph_batch_sizes` (arg_groups/cuda_graph_hook.py:500-532): the decode list, in
    requests, ascending, always ending at `max_bs` (appended when the grid misses it)."""
    if max_bs < 1:
        # SGLang would return [0] (or [max_bs]) here and then fail its capture-time assert `capture_bs[0] > 0`.
        raise ValueError(f"max_bs={max_bs} must be >= 1 (SGLang asserts a positive batch size at capture)")
    if disable_padding:
        capture_bs = list(range(1, max_bs + 1))
    elif not speculative:
        capture_bs = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16)) + list(
            range(512, max_bs + 1, 32))
    else:
        # Speculative decoding: less padding for small batches.
        capture_bs = (list(range(1, 9)) + list(range(10, 33, 2)) + list(range(40, 65, 4)) + list(range(72, 257, 8))
                      + list(range(272, max_bs + 1, 16)))
    capture_bs = [bs for bs in capture_bs if bs <= max_bs]
    if max_bs not in capture_bs:
        capture_bs.append(max_bs)
    return capture_bs


def default_prefill_max_tokens(chunked_prefill_size: int, *, use_mla: bool = False, pp_size: int = 1,
                               prefill_backend: str = "breakable", max_total_tokens: int | None = None,
                               model_path: str = "") -> int:
    """Prefill-graph max token bucket when `max_bs` is unset for the prefill phase (memory_hook.py:233-268)."""
    max_tokens = chunked_prefill_size if not use_mla else min(8192, chunked_prefill_size)
    if pp_size > 1 and prefill_backend == "breakable" and max_tokens > _PP_PREFILL_MAX_TOKENS:
        max_tokens = _PP_PREFILL_MAX_TOKENS
    if max_total_tokens is not None:
        max_tokens = min(max_tokens, max_total_tokens)
    if "llama-2" in model_path.lower():
        max_tokens = min(max_tokens, 4096)
    return max_tokens


def default_prefill_batch_sizes(max_tokens: int) -> list[int]:
    """`generate_prefill_cuda_graph_batch_sizes` (cuda_graph_hook.py:480-497): prefill buckets in TOKENS; unlike the
    decode list, `max_tokens` itself is NOT appended (3000 ends at 2816, and 2 gives [])."""
    capture_sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
                     + list(range(576, 1024 + 1, 64)) + list(range(1280, 4096 + 1, 256))
                     + list(range(4608, max_tokens + 1, 512)))
    return [s for s in capture_sizes if s <= max_tokens]
