"""How TensorRT-LLM's graphs meet the KV cache: graphs are captured in the estimation run BEFORE the KV cache is
sized, so their memory is in the measured peak and each graph byte costs free_gpu_memory_fraction bytes of KV."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tuner.engines.trtllm.defaults import DEFAULT_FREE_GPU_MEMORY_FRACTION

__all__ = ["TrtllmKvRule", "kv_cache_bytes", "kv_cache_bytes_with_graphs", "kv_cost_of_graph_bytes"]


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


@dataclass(frozen=True)
class TrtllmKvRule:
    """TensorRT-LLM captures every graph before it sizes the KV cache: KV = fraction x (total - peak), the peak
    holding the graphs, so each graph costs fraction x its memory in KV."""

    total_memory_bytes: int
    """Device memory."""
    non_kv_cache_bytes: int
    """The estimation run's peak without graphs (torch peak + non-torch)."""
    required_kv_bytes: int
    """KV bytes the deployment needs."""
    free_gpu_memory_fraction: float = DEFAULT_FREE_GPU_MEMORY_FRACTION
    """kv_cache_config.free_gpu_memory_fraction."""

    estimate_enabled: bool = False
    """TensorRT-LLM measures its graphs before sizing the KV cache: the real pool is what counts."""

    @property
    def requested_bytes(self) -> int:
        return self.total_memory_bytes

    def kv_available_bytes(self, estimate_bytes: float = 0.0, *, real_bytes: float = 0.0, top: int = 0) -> int:
        return kv_cache_bytes_with_graphs(
            total_gpu_memory_bytes=self.total_memory_bytes, peak_without_graphs_bytes=self.non_kv_cache_bytes,
            graph_memory_bytes=int(round(real_bytes)), free_gpu_memory_fraction=self.free_gpu_memory_fraction)

    def capture_headroom_bytes(self, estimate_bytes: float, real_pool_bytes: float, *, top: int = 0) -> int:
        return int(self.total_memory_bytes - self.non_kv_cache_bytes - round(real_pool_bytes))

    def applied_estimate(self, profiled_bytes: int) -> int:
        """TensorRT-LLM makes no estimate: the figure charged is the real pool."""
        return profiled_bytes

    def graph_budget(self, top: int = 0) -> tuple[int, str]:
        """(the most real graph memory a list topped at `top` requests may take, what that is in words)."""
        return max(0, self.real_budget_bytes(top)), "most graph memory the engine's KV rule allows"

    def real_budget_bytes(self, top: int = 0) -> int:
        """Most real graph memory any list may take while the KV cache keeps what is required."""
        return int(math.floor(self.total_memory_bytes - self.non_kv_cache_bytes
                              - self.required_kv_bytes / self.free_gpu_memory_fraction))
