"""vLLM 0.34's KV-cache sizing around the graphs. With the extensible KV cache (the default on CUDA) the graphs are
captured first, with only the null block committed, and the KV cache gets what is measured free after warm-up and
capture (`measure_kv_cache_blocks`, vllm/v1/worker/extensible_kv_cache.py): every captured graph takes its REAL pool
out of the KV cache, and no estimate is made. Without it (or with `--kv-cache-memory-bytes`), 0.33's V2 estimate rule
applies (`tuner.engines.vllm.memory.KvRule`), with 0.34's default utilization."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["GIB", "MARGIN_FLOOR_BYTES", "PEAK_MARGIN_SHARE", "ExtensibleKvRule"]

GIB = 1 << 30
MARGIN_FLOOR_BYTES = GIB
"""`measure_kv_cache_blocks` keeps at least this much free beside the KV cache on CUDA (3 GiB on ROCm)."""
PEAK_MARGIN_SHARE = 0.75
"""... or 0.75 x the transient activation peak, when that is more."""


@dataclass(frozen=True)
class ExtensibleKvRule:
    """The KV cache 0.34 sizes after capture: `min(requested - non_kv, total - non_kv - margin) - real pool`, where
    non_kv is what the profile measured beside the graphs (weights, persistent buffers, non-torch memory and the
    transient peak, as 0.33's rule counts it) and margin = max(1 GiB, 0.75 x peak)."""

    total_memory_bytes: int
    """Device memory (cudaMemGetInfo's total)."""
    gpu_memory_utilization: float
    """Share of it vLLM may use (1.0 by default in 0.34 with the extensible KV cache)."""
    non_kv_cache_bytes: int
    """Memory the engine holds besides the KV cache and the graphs, the transient peak included."""
    required_kv_bytes: int
    """KV bytes the deployment needs (at least one max_model_len request's blocks and the null block)."""
    peak_bytes: int = 0
    """The transient activation peak of the warm-up steps (0: not measured; the margin is then its 1 GiB floor)."""
    estimate_enabled: bool = False
    """No graph-memory estimate is made (`profile_cudagraph_memory()` returns 0 under the extensible cache)."""

    @property
    def requested_bytes(self) -> int:
        return math.ceil(self.total_memory_bytes * self.gpu_memory_utilization)

    @property
    def margin_bytes(self) -> int:
        """Memory kept free beside the KV cache for transient activations."""
        return max(MARGIN_FLOOR_BYTES, int(PEAK_MARGIN_SHARE * self.peak_bytes))

    @property
    def kv_room_bytes(self) -> int:
        """KV cache with no graph at all: the requested memory or the device less the margin, whichever is less."""
        return min(self.requested_bytes - self.non_kv_cache_bytes,
                   self.total_memory_bytes - self.non_kv_cache_bytes - self.margin_bytes)

    def applied_estimate(self, estimate_bytes: float) -> int:
        """0.34 subtracts no estimate: the graphs are measured."""
        return 0

    def kv_available_bytes(self, estimate_bytes: float = 0.0, *, real_bytes: float = 0.0, top: int = 0) -> int:
        """The KV cache vLLM sizes after capturing graphs whose real pool is `real_bytes`."""
        return int(self.kv_room_bytes - round(real_bytes))

    def capture_headroom_bytes(self, estimate_bytes: float, real_pool_bytes: float, *, top: int = 0) -> int:
        """Memory left while the graphs are captured (only the null block committed): the device less the non-KV
        memory and the pool."""
        return int(self.total_memory_bytes - self.non_kv_cache_bytes - round(real_pool_bytes))

    def real_budget_bytes(self, top: int = 0) -> int:
        """The most real graph memory that leaves the required KV cache."""
        return self.kv_room_bytes - self.required_kv_bytes

    def graph_budget(self, top: int = 0) -> tuple[int, str]:
        return self.real_budget_bytes(), "most real graph memory the KV cache, sized after capture, leaves required"

    def utilization_for_kv(self, kv_bytes: int, estimate_bytes: float = 0.0, *, real_bytes: float = 0.0) -> float:
        """The gpu_memory_utilization that gives `kv_bytes` of KV cache beside a real pool of `real_bytes` (above 1
        where the margin the device keeps free would have to go)."""
        if kv_bytes > self.total_memory_bytes - self.non_kv_cache_bytes - self.margin_bytes - real_bytes:
            return math.inf
        return (kv_bytes + self.non_kv_cache_bytes + real_bytes) / self.total_memory_bytes

    @property
    def slack_bytes(self) -> int:
        return self.total_memory_bytes - self.requested_bytes
