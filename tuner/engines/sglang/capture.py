"""What SGLang 0.5.23 really captures: the request pool, the alignment filter at capture, and the whole resolution
from serving flags to the captured decode list."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tuner.engines.sglang.defaults import default_decode_batch_sizes, default_decode_max_bs
from tuner.engines.sglang.dispatch import decode_tokens_per_request
from tuner.engines.sglang.speculative import effective_max_running_requests, normalize_algorithm

__all__ = [
    "DecodeGraphs",
    "batch_size_alignment",
    "captured_batch_sizes",
    "request_pool_size",
    "resolve_decode_graphs",
]


def _ceil_align(x: int, y: int) -> int:
    return -(-x // y) * y


def batch_size_alignment(*, two_batch_overlap: bool = False, gathered_buffer: bool = False, attn_tp_size: int = 1,
                         attn_cp_size: int = 1, is_hip: bool = False) -> int:
    """`get_cuda_graph_batch_size_alignment` (utils/common.py:4159-4181), the `mul_base` of the capture filter.

    x2 with two-batch overlap; x attn_tp_size when a gathered buffer is needed (MoE A2A, dense-TP or DP-attention
    layouts); x attn_cp_size when not already divisible by it (not on HIP).
    """
    for name, value in (("attn_tp_size", attn_tp_size), ("attn_cp_size", attn_cp_size)):
        if value < 1:
            raise ValueError(f"{name}={value} must be >= 1")
    alignment = 1
    if two_batch_overlap:
        alignment *= 2
    if gathered_buffer:
        alignment *= attn_tp_size
    if not is_hip and alignment % attn_cp_size != 0:
        alignment *= attn_cp_size
    return alignment


def request_pool_size(*, max_running_requests: int | None, token_capacity: int | None = None,
                      context_len: int | None = None, attn_dp_size: int = 1) -> int:
    """`req_to_token_pool.size` per DP rank (`resolve_max_num_reqs`, mem_cache/kv_cache_configurator.py:3119-3132).

    With --max-running-requests: max(1, mrr // attn_dp_size), capped at token_capacity // 2 when the KV capacity is
    known. Without it: clamp(int(token_capacity / context_len * 512), 2048, 4096), capped at token_capacity // 2,
    so both token_capacity and context_len are needed. Mamba-state caps are not modelled.
    """
    if attn_dp_size < 1:
        raise ValueError(f"attn_dp_size={attn_dp_size} must be >= 1")
    if token_capacity is not None and token_capacity < 1:
        raise ValueError(f"token_capacity={token_capacity} must be >= 1")
    if max_running_requests is not None:
        if max_running_requests < 1:
            raise ValueError(f"max_running_requests={max_running_requests} must be >= 1")
        pool = max(1, max_running_requests // attn_dp_size)
        return pool if token_capacity is None else min(pool, token_capacity // 2)
    if token_capacity is None or context_len is None:
        raise ValueError(f"token_capacity={token_capacity}, context_len={context_len}: both are needed to size the "
                         f"request pool when max_running_requests is unset")
    if context_len < 1:
        raise ValueError(f"context_len={context_len} must be >= 1")
    estimated = max(min(int(token_capacity / context_len * 512), 4096), 2048)
    return min(estimated, token_capacity // 2)


def captured_batch_sizes(batch_sizes: Sequence[int], pool_size: int, *, mul_base: int = 1,
                         captured_req_width: int = 1, two_batch_overlap: bool = False) -> list[int]:
    """`get_batch_sizes_to_capture` (model_executor/runner/base_cuda_graph_runner.py:65-110): the decode list SGLang
    really captures for a request pool of `pool_size` (per DP rank).

    The pool is rounded up to a multiple of `mul_base`; if the list goes above the pool, the pool itself is added;
    sizes whose token count `bs x width` is not a multiple of `mul_base` are dropped (width is 1 under two-batch
    overlap), as are sizes above the pool. Raises ValueError where SGLang's assert would stop the server.
    """
    if not batch_sizes:
        raise ValueError("batch_sizes=[] must hold at least one size")
    if pool_size < 1:
        raise ValueError(f"pool_size={pool_size} must be >= 1")
    if mul_base < 1 or captured_req_width < 1:
        raise ValueError(f"mul_base={mul_base}, captured_req_width={captured_req_width} must be >= 1")
    capture_bs = [int(bs) for bs in batch_sizes]
    alignment_width = 1 if two_batch_overlap else captured_req_width
    num_max_requests = _ceil_align(pool_size, mul_base)
    if max(capture_bs) > num_max_requests:
        capture_bs += [num_max_requests]
    capture_bs = [bs for bs in capture_bs if bs * alignment_width % mul_base == 0]
    capture_bs = sorted({bs for bs in capture_bs if bs <= num_max_requests})
    if not capture_bs or capture_bs[0] <= 0:
        raise ValueError(f"batch_sizes={list(batch_sizes)}: nothing capturable for pool_size={pool_size}, "
                         f"mul_base={mul_base} (SGLang asserts a non-empty positive list)")
    return capture_bs


@dataclass(frozen=True)
class DecodeGraphs:
    """SGLang's decode CUDA graphs for one serving configuration, from flags to what is captured."""

    requested_batch_sizes: list[int]
    """`cuda_graph_config.decode.bs` after `handle_gpu_memory_settings` (explicit or generated), in requests."""
    max_bs: int
    """`cuda_graph_config.decode.max_bs`: max(requested list); what the auto mem_fraction_static reserve counts."""
    max_running_requests: int | None
    """max_running_requests after speculative resolution (48 when unset for the EAGLE family etc.)."""
    pool_size: int
    """Request pool per DP rank (`req_to_token_pool.size`)."""
    batch_sizes: list[int]
    """The decode batch sizes really captured (requests per DP rank), ascending."""
    tokens_per_request: int
    """Tokens each request puts in a graph: 1 for normal decode, speculative_num_draft_tokens for target verify."""

    @property
    def widths(self) -> list[int]:
        """Token width of each captured graph: bs x tokens_per_request."""
        return [bs * self.tokens_per_request for bs in self.batch_sizes]

    @property
    def max_captured(self) -> int:
        return self.batch_sizes[-1]

    @property
    def eager_batch_sizes(self) -> range:
        """Decode batch sizes the pool admits but no graph covers: they run eager (pitfall 1 of the facts file)."""
        return range(self.max_captured + 1, self.pool_size + 1)


def resolve_decode_graphs(
    *,
    gpu_memory_mib: float | None,
    tp_size: int = 1,
    max_running_requests: int | None = None,
    speculative_algorithm: str | None = None,
    speculative_num_draft_tokens: int | None = None,
    cuda_graph_bs: Sequence[int] | None = None,
    cuda_graph_max_bs: int | None = None,
    disable_padding: bool = False,
    attn_dp_size: int = 1,
    mul_base: int = 1,
    two_batch_overlap: bool = False,
    token_capacity: int | None = None,
    context_len: int | None = None,
) -> DecodeGraphs:
    """SGLang's decode graphs in its own resolution order (arg_groups/pipeline.py): GPU-memory defaults and the list
    (`handle_gpu_memory_settings`), then speculative decoding (max_running_requests=48 when unset), then the pool
    and the capture filter.

    `cuda_graph_bs` is `--cuda-graph-bs-decode`, `cuda_graph_max_bs` is `--cuda-graph-max-bs-decode`. Speculative
    target-verify graphs need `speculative_num_draft_tokens` (after `resolve_eagle_params` for the EAGLE family).
    """
    algorithm = normalize_algorithm(speculative_algorithm)
    if cuda_graph_bs is not None:
        requested = [int(bs) for bs in cuda_graph_bs]
        if not requested or min(requested) < 1:
            raise ValueError(f"cuda_graph_bs_decode={requested} must hold sizes >= 1")
        max_bs = max(requested)
    else:
        # The defaulted max_bs sees only the user's max_running_requests: the speculative 48 comes later.
        max_bs = cuda_graph_max_bs if cuda_graph_max_bs is not None else default_decode_max_bs(
            gpu_memory_mib, tp_size, max_running_requests=max_running_requests)
        requested = default_decode_batch_sizes(max_bs, speculative=algorithm is not None,
                                               disable_padding=disable_padding)
    mrr = effective_max_running_requests(algorithm, max_running_requests)
    pool = request_pool_size(max_running_requests=mrr, token_capacity=token_capacity, context_len=context_len,
                             attn_dp_size=attn_dp_size)
    width = decode_tokens_per_request(speculative_algorithm=algorithm,
                                      speculative_num_draft_tokens=speculative_num_draft_tokens)
    captured = captured_batch_sizes(requested, pool, mul_base=mul_base, captured_req_width=width,
                                    two_batch_overlap=two_batch_overlap)
    return DecodeGraphs(requested_batch_sizes=requested, max_bs=max_bs, max_running_requests=mrr, pool_size=pool,
                        batch_sizes=captured, tokens_per_request=width)
