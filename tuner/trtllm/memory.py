"""How TensorRT-LLM's graphs meet the KV cache: graphs are captured in the estimation run BEFORE the KV cache is
sized, so their memory is in the measured peak and each graph byte costs free_gpu_memory_fraction bytes of KV."""

from __future__ import annotations

from tuner.trtllm.defaults import DEFAULT_FREE_GPU_MEMORY_FRACTION

__all__ = ["kv_cache_bytes", "kv_cache_bytes_with_graphs", "kv_cost_of_graph_bytes"]


def _check_fraction(fraction: float) -> None:
    if not 0 < fraction <= 1:
        raise ValueError(f"free_gpu_memory_fraction={fraction} must be in (0, 1]")


def kv_cache_bytes(*, total_gpu_memory_bytes: int, peak_memory_bytes: int, estimation_kv_bytes: int = 0,
                   free_gpu_memory_fraction: float = DEFAULT_FREE_GPU_MEMORY_FRACTION,
                   max_tokens_bytes: int | None = None, max_gpu_total_bytes: int | None = None) -> int:
    """KV cache bytes (`KvCacheCreator._cal_max_memory` and `configure_kv_cache_capacity`, _torch/pyexecutor/_util.py).

    int((total - peak + estimation_kv) x fraction), where peak = torch peak + memory outside torch (NCCL, CUDA
    graphs) of the estimation run and estimation_kv the small KV cache that run allocated; then the min with the
    bytes of `kv_cache_config.max_tokens` and with `max_gpu_total_bytes` when those are set (> 0).
    """
    _check_fraction(free_gpu_memory_fraction)
    kv_bytes = int((total_gpu_memory_bytes - peak_memory_bytes + estimation_kv_bytes) * free_gpu_memory_fraction)
    if max_tokens_bytes is not None:
        kv_bytes = min(kv_bytes, max_tokens_bytes)
    if max_gpu_total_bytes is not None and max_gpu_total_bytes > 0:
        kv_bytes = min(kv_bytes, max_gpu_total_bytes)
    return kv_bytes


def kv_cache_bytes_with_graphs(*, total_gpu_memory_bytes: int, peak_without_graphs_bytes: int,
                               graph_memory_bytes: int, estimation_kv_bytes: int = 0,
                               free_gpu_memory_fraction: float = DEFAULT_FREE_GPU_MEMORY_FRACTION,
                               max_tokens_bytes: int | None = None, max_gpu_total_bytes: int | None = None) -> int:
    """KV cache bytes when the captured graphs hold `graph_memory_bytes` (their shared pool, sized by the largest
    graph, plus each graph's own overhead) on top of the estimation run's peak without them."""
    if graph_memory_bytes < 0:
        raise ValueError(f"graph_memory_bytes={graph_memory_bytes} must be >= 0")
    return kv_cache_bytes(total_gpu_memory_bytes=total_gpu_memory_bytes,
                          peak_memory_bytes=peak_without_graphs_bytes + graph_memory_bytes,
                          estimation_kv_bytes=estimation_kv_bytes, free_gpu_memory_fraction=free_gpu_memory_fraction,
                          max_tokens_bytes=max_tokens_bytes, max_gpu_total_bytes=max_gpu_total_bytes)


def kv_cost_of_graph_bytes(graph_memory_bytes: float,
                           free_gpu_memory_fraction: float = DEFAULT_FREE_GPU_MEMORY_FRACTION) -> float:
    """KV bytes lost to `graph_memory_bytes` of graph memory while no cap binds: fraction x graph bytes (0.9x by
    default), since graph memory enters the peak before the fraction is applied."""
    _check_fraction(free_gpu_memory_fraction)
    return free_gpu_memory_fraction * graph_memory_bytes
