"""vLLM 0.33's memory accounting for CUDA graphs (`gpu_worker.determine_available_memory`): the graph-memory
ESTIMATE each runner makes before the real capture, the real pool, and the KV cache sized from the estimate.

Graph costs are given per graph in capture order: what the graph needs captured alone into a fresh pool
(`standalone_bytes`) and what it adds to a pool already holding the larger graphs captured before it
(`delta_bytes`). The first graph into a pool costs its standalone footprint, every later one its delta."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "MIB",
    "BLOCK_SIZE_TOKENS",
    "GraphCost",
    "KvRule",
    "kv_capacity",
    "start_kv_bytes",
    "estimate_bytes",
    "estimate_samples",
    "estimate_v1_bytes",
    "estimate_v2_bytes",
    "pool_bytes",
]

MIB = 1 << 20
"""vLLM floors the extrapolated per-graph estimate at 1 MiB."""
BLOCK_SIZE_TOKENS = 16
"""vLLM's KV block (`CacheConfig.DEFAULT_BLOCK_SIZE`, vllm/config/cache.py:185): it sizes, checks and logs the KV
cache in whole blocks of this many tokens (every attention layer's, the drafter's too, in one block)."""


@dataclass(frozen=True)
class GraphCost:
    """One captured graph and its memory."""

    owner: str
    """`target` or `drafter`."""
    mode: str
    """`FULL` or `PIECEWISE`."""
    num_tokens: int
    """Width it is captured at."""
    standalone_bytes: float
    """Memory it takes captured alone into a fresh pool."""
    delta_bytes: float
    """Memory it adds to a pool that already holds the larger graphs captured before it."""


def start_kv_bytes(max_model_len: int, kv_bytes_per_token: int) -> int:
    """The least KV memory vLLM starts with: the null block BlockPool holds back plus the whole blocks one
    max_model_len request takes, `(cdiv(L, 16) + 1) x bytes per block` (`check_enough_kv_cache_memory`,
    v1/core/kv_cache_planning.py:151-185: available - one block must hold `cdiv(L, 16)` blocks, else ValueError)."""
    return (-(-max_model_len // BLOCK_SIZE_TOKENS) + 1) * BLOCK_SIZE_TOKENS * kv_bytes_per_token


def kv_capacity(kv_available_bytes: int, kv_bytes_per_token: int, max_model_len: int) -> tuple[int, float]:
    """(tokens, concurrency) as vLLM logs them ("GPU KV cache size: N tokens, Maximum concurrency for L tokens per
    request: X.XXx"): `available // bytes per block` blocks (kv_cache_planning.py:681, the null block among them),
    over the `cdiv(L, 16)` blocks a request takes, and `int(concurrency x L)` tokens
    (v1/core/kv_cache_utils.py:1061-1127)."""
    blocks = max(0, kv_available_bytes) // (BLOCK_SIZE_TOKENS * kv_bytes_per_token)
    concurrency = blocks / -(-max_model_len // BLOCK_SIZE_TOKENS)
    return int(concurrency * max_model_len), concurrency


def pool_bytes(graphs: Sequence[GraphCost]) -> float:
    """Memory of `graphs` captured in this order into one fresh pool: the first graph's standalone footprint
    plus every later graph's delta."""
    if not graphs:
        return 0.0
    return float(graphs[0].standalone_bytes + sum(g.delta_bytes for g in graphs[1:]))


def estimate_v2_bytes(graphs: Sequence[GraphCost]) -> float:
    """Model Runner V2's `profile_cudagraph_memory`: the real capture into a throwaway pool in the real order,
    except that only the two largest FULL graphs of the target are captured; the target's FULL graphs are then
    extrapolated as `first + (n - 1) * max(second, 1 MiB)`, everything else (PIECEWISE, drafter) counts at what
    it really took."""
    fulls = [i for i, g in enumerate(graphs) if g.owner == "target" and g.mode == "FULL"]
    skipped = set(fulls[2:])
    kept = [g for i, g in enumerate(graphs) if i not in skipped]
    if len(fulls) < 2:
        return pool_bytes(kept)
    # The second FULL sample is the delta it added in the throwaway pool: the first FULL graph precedes it there.
    sampled = graphs[fulls[1]].delta_bytes
    return pool_bytes(kept) - sampled + (len(fulls) - 1) * max(sampled, MIB)


def estimate_v1_bytes(graphs: Sequence[GraphCost]) -> float:
    """The V1 runner's `profile_cudagraph_memory` (gpu_model_runner.py): per runtime mode, only the two largest graphs
    are captured, into ONE profiling pool the modes share and never clear: PIECEWISE first, then FULL on top of the
    PIECEWISE samples already there, so FULL's first sample is an increment, not a standalone footprint;
    `max(first over modes) + sum over modes of max(second, 1 MiB) * (n_mode - 1)`. A drafter graph V1 captures
    during a target PIECEWISE capture (right after it) belongs to that sample."""
    samples: dict[str, list[float]] = {}
    counts: dict[str, int] = {}
    last_target: str | None = None
    pool_empty = True
    for g in graphs:
        if g.owner == "target":
            last_target = g.mode
            counts[g.mode] = counts.get(g.mode, 0) + 1
            taken = samples.setdefault(g.mode, [])
            if len(taken) < 2:
                # The first sample into the profiling pool costs its standalone footprint, every later one its delta.
                taken.append(g.standalone_bytes if pool_empty else g.delta_bytes)
                pool_empty = False
            else:
                last_target = None  # not sampled: its drafter graph is not either
        elif last_target is not None and counts[last_target] <= 2:
            samples[last_target][-1] += g.delta_bytes
    if not samples:
        return 0.0
    first = max(s[0] for s in samples.values())
    rest = sum(max(s[1], MIB) * (counts[m] - 1) for m, s in samples.items() if len(s) > 1)
    return float(first + rest)


def estimate_bytes(graphs: Sequence[GraphCost], runner: str) -> float:
    """vLLM's graph-memory estimate for the runner (`v1` or `v2`)."""
    if runner == "v1":
        return estimate_v1_bytes(graphs)
    if runner == "v2":
        return estimate_v2_bytes(graphs)
    raise ValueError(f"runner={runner!r} must be v1 or v2")


def estimate_samples(graphs: Sequence[tuple[str, int]], runner: str) -> list[list[tuple[str, int]]]:
    """The captures the runner's estimate is measured from, each list into its own throwaway pool, for graphs
    `(mode, width)` in capture order: V2 captures every PIECEWISE graph and the two largest FULL graphs in the real
    order (and extrapolates the FULL ones); V1 captures each mode's two largest graphs into a scratch pool."""
    if runner == "v2":
        fulls = [g for g in graphs if g[0] == "FULL"]
        return [[g for g in graphs if g[0] != "FULL" or g in fulls[:2]]]
    return [[g for g in graphs if g[0] == mode][:2] for mode in ("PIECEWISE", "FULL")]


@dataclass(frozen=True)
class KvRule:
    """How vLLM sizes the KV cache on one rank: `requested - non_kv - estimate`, before the real capture."""

    total_memory_bytes: int
    """Device memory (cudaMemGetInfo's total, not free memory)."""
    gpu_memory_utilization: float
    """Share of it vLLM may use."""
    non_kv_cache_bytes: int
    """Weights, persistent buffers, non-torch memory and the transient peak of vLLM's profiling step."""
    required_kv_bytes: int
    """KV bytes the deployment needs, never below what vLLM starts with (`start_kv_bytes`: one max_model_len request's
    whole blocks and the null block)."""
    estimate_enabled: bool = True
    """`VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS` (default 1); off, the estimate is 0."""

    @property
    def requested_bytes(self) -> int:
        """`ceil(total x gpu_memory_utilization)`."""
        return math.ceil(self.total_memory_bytes * self.gpu_memory_utilization)

    @property
    def slack_bytes(self) -> int:
        """Memory vLLM does not request (`total - requested`): where a real capture above its estimate goes."""
        return self.total_memory_bytes - self.requested_bytes

    def applied_estimate(self, estimate_bytes: float) -> int:
        """The estimate vLLM subtracts (0 with the estimate switched off)."""
        return int(round(estimate_bytes)) if self.estimate_enabled else 0

    def kv_available_bytes(self, estimate_bytes: float, *, real_bytes: float = 0.0, top: int = 0) -> int:
        """What vLLM logs as "Available KV cache memory" (`real_bytes` and `top` are for the other engines' rules,
        which size the KV cache from the real pool or the list's max; vLLM's uses the estimate alone)."""
        return self.requested_bytes - self.non_kv_cache_bytes - self.applied_estimate(estimate_bytes)

    def capture_headroom_bytes(self, estimate_bytes: float, real_pool_bytes: float, *, top: int = 0) -> int:
        """Memory left when the real capture runs beside the KV cache: `estimate + total - requested - real`;
        below 0 the capture itself runs out of memory."""
        return int(self.applied_estimate(estimate_bytes) + self.slack_bytes - round(real_pool_bytes))

    @property
    def estimate_budget_bytes(self) -> int:
        """Largest estimate that still leaves the required KV cache (< 0: not even no graphs start)."""
        return self.requested_bytes - self.non_kv_cache_bytes - self.required_kv_bytes

    def graph_budget(self, top: int = 0) -> tuple[int, str]:
        """(the most graph memory the rule charges a list may take, what that is in words): the largest estimate that
        leaves the required KV cache; with the estimate off, the memory vLLM does not request, where the real capture
        goes (`top` is for the other engines' rules)."""
        if self.estimate_enabled:
            return self.estimate_budget_bytes, "largest estimate that leaves the required KV"
        return self.slack_bytes, "memory vLLM does not request"

    def utilization_for_kv(self, kv_bytes: int, estimate_bytes: float, *, real_bytes: float = 0.0) -> float:
        """The gpu_memory_utilization that gives `kv_bytes` of KV cache with this estimate (`real_bytes`: for a rule
        that sizes the KV cache after capture)."""
        return (kv_bytes + self.non_kv_cache_bytes + self.applied_estimate(estimate_bytes)) / self.total_memory_bytes
