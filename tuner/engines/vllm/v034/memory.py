"""vLLM 0.34's KV-cache sizing around the graphs, to the block. With the extensible KV cache (the default on CUDA) the
graphs are captured first, with only the null block committed, and the KV cache gets what is measured free after
warm-up and capture: `measure_kv_cache_bytes` (the requested memory or the device's headroom less a margin, whichever
is less, less the larger of the transient peak and torch's reserved-memory growth, never below 0), then
`ExtensibleKVCache.blocks_within` (each layer segment rounded up to 2 MiB granules) and `finalize_extensible_kv_cache`
(no more than the capacity reserved before capture). Every captured graph takes its REAL pool out of the KV cache; no
estimate is made (vllm/v1/worker/extensible_kv_cache.py, v1/core/kv_cache_planning.py). Without it (or with
`--kv-cache-memory-bytes`), 0.33's V2 estimate rule applies (`tuner.engines.vllm.memory.KvRule`), with 0.34's default
utilization."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tuner.engines.vllm.v034.kv_layout import GRANULE_BYTES, KvGeometry

__all__ = ["GIB", "MARGIN_FLOOR_BYTES", "PEAK_MARGIN_SHARE", "ExtensibleKvRule"]

GIB = 1 << 30
MARGIN_FLOOR_BYTES = GIB
"""`KV_CACHE_MARGIN_FLOOR_BYTES`: the least `measure_kv_cache_bytes` keeps free beside the KV cache on CUDA (3 GiB on
ROCm)."""
PEAK_MARGIN_SHARE = 0.75
"""`KV_CACHE_MARGIN_FRACTION`: ... or this share of the transient activation peak, when that is more."""


@dataclass(frozen=True)
class ExtensibleKvRule:
    """The KV cache 0.34 sizes after capture, in whole blocks. In the profile's terms: the memory vLLM holds after
    warm-up besides the KV cache is the non-KV memory less the transient peak (which warm-up releases) plus the real
    pool; `measure_kv_cache_bytes` then gives `min(requested - held, start free - held - margin) - max(peak, torch
    growth)`, margin = max(1 GiB, 0.75 x peak), clamped at 0; `blocks_within` fits the granule-rounded segments in it,
    and the capacity reserved before capture (`requested - non-KV`, whole pool blocks) bounds the count."""

    total_memory_bytes: int
    """Device memory (cudaMemGetInfo's total)."""
    gpu_memory_utilization: float
    """Share of it vLLM may use (1.0 by default in 0.34 with the extensible KV cache)."""
    non_kv_cache_bytes: int
    """vLLM's non-KV memory as its profiling measures it: weights, persistent buffers, non-torch memory and the
    transient peak."""
    required_kv_bytes: int
    """KV bytes the deployment needs (at least one max_model_len request's blocks and the null block)."""
    geometry: KvGeometry
    """The KV cache's segments and pool bytes per block (`tuner.engines.vllm.v034.kv_layout`)."""
    peak_bytes: int = 0
    """The transient activation peak of the warm-up steps (`reserved_headroom_bytes`; 0: not measured, the margin is
    then its 1 GiB floor)."""
    torch_reserve_growth_bytes: int = 0
    """How far a sizing step grew torch's reserved memory beyond what it kept (`torch_reserve_growth_bytes`,
    fragmentation included; 0: not measured)."""
    start_free_bytes: int | None = None
    """Free device memory when the worker started (`init_snapshot.free_memory`; None: the whole device)."""
    granule_bytes: int = GRANULE_BYTES
    """The allocation granularity each segment is rounded up to."""
    estimate_enabled: bool = False
    """No graph-memory estimate is made (`profile_cudagraph_memory()` returns 0 under the extensible cache)."""

    @property
    def requested_bytes(self) -> int:
        """`request_memory`: ceil(total x gpu_memory_utilization)."""
        return math.ceil(self.total_memory_bytes * self.gpu_memory_utilization)

    @property
    def start_bytes(self) -> int:
        return self.total_memory_bytes if self.start_free_bytes is None else self.start_free_bytes

    @property
    def margin_bytes(self) -> int:
        """Memory kept free beside the KV cache for what the measurement does not show."""
        return max(MARGIN_FLOOR_BYTES, int(PEAK_MARGIN_SHARE * self.peak_bytes))

    @property
    def transient_bytes(self) -> int:
        """Kept free in full for the steps' transients: max(peak, torch's reserve growth)."""
        return max(self.peak_bytes, self.torch_reserve_growth_bytes)

    @property
    def held_bytes(self) -> int:
        """Memory vLLM holds after warm-up besides the KV cache and the graphs (the non-KV memory without the peak)."""
        return self.non_kv_cache_bytes - self.peak_bytes

    @property
    def kv_room_bytes(self) -> int:
        """What `measure_kv_cache_bytes` gives with no graph at all (before the clamp at 0)."""
        return (min(self.requested_bytes - self.held_bytes, self.start_bytes - self.held_bytes - self.margin_bytes)
                - self.transient_bytes)

    @property
    def capacity_blocks(self) -> int:
        """The blocks reserved before capture: "Available KV cache memory" (requested - non-KV, no estimate) in whole
        pool blocks."""
        return self.geometry.blocks_for(self.requested_bytes - self.non_kv_cache_bytes)

    def applied_estimate(self, estimate_bytes: float) -> int:
        """0.34 subtracts no estimate: the graphs are measured."""
        return 0

    def measured_bytes(self, real_bytes: float) -> int:
        """`measure_kv_cache_bytes` after graphs whose real pool is `real_bytes`."""
        return max(0, self.kv_room_bytes - int(round(real_bytes)))

    def kv_blocks(self, real_bytes: float) -> int:
        """The KV cache blocks vLLM keeps: `blocks_within` the measured bytes, no more than the capacity."""
        capacity = self.capacity_blocks
        return min(self.geometry.blocks_within(self.measured_bytes(real_bytes), capacity, self.granule_bytes), capacity)

    def kv_available_bytes(self, estimate_bytes: float = 0.0, *, real_bytes: float = 0.0, top: int = 0) -> int:
        """The KV cache vLLM sizes after capturing graphs whose real pool is `real_bytes`: its blocks' bytes."""
        return self.kv_blocks(real_bytes) * self.geometry.pool_bytes_per_block

    def capture_headroom_bytes(self, estimate_bytes: float, real_pool_bytes: float, *, top: int = 0) -> int:
        """Memory left while the graphs are captured (only the null block committed): the free memory at start less
        the non-KV memory and the pool."""
        return int(self.start_bytes - self.non_kv_cache_bytes - round(real_pool_bytes))

    def real_budget_bytes(self, top: int = 0) -> int:
        """The most real graph memory that leaves the required KV cache: the room less the granule-rounded footprint
        of the blocks it needs (-1 where the capacity itself holds fewer)."""
        bpb = self.geometry.pool_bytes_per_block
        need = -(-self.required_kv_bytes // bpb) if bpb else 0
        if need > self.capacity_blocks:
            return -1
        return self.kv_room_bytes - self.geometry.physical_bytes_for(need, self.granule_bytes)

    def graph_budget(self, top: int = 0) -> tuple[int, str]:
        return self.real_budget_bytes(), "most real graph memory the KV cache, sized after capture, leaves required"

    def utilization_for_kv(self, kv_bytes: int, estimate_bytes: float = 0.0, *, real_bytes: float = 0.0) -> float:
        """The gpu_memory_utilization that gives `kv_bytes` of KV cache beside a real pool of `real_bytes` (above 1
        where the margin the device keeps free would have to go)."""
        bpb = self.geometry.pool_bytes_per_block
        footprint = self.geometry.physical_bytes_for(-(-kv_bytes // bpb), self.granule_bytes) if bpb else kv_bytes
        needed = footprint + self.held_bytes + real_bytes + self.transient_bytes
        if needed > self.start_bytes - self.margin_bytes:
            return math.inf
        return needed / self.total_memory_bytes

    @property
    def slack_bytes(self) -> int:
        return self.total_memory_bytes - self.requested_bytes
