"""How vLLM 0.34 lays its KV cache out in blocks, for the attention layers cgtune knows (full attention, sliding window,
MLA; a drafter's layers among them): the KV cache groups (`get_kv_cache_groups`, v1/core/kv_cache_planning.py), the
bytes one block takes in the pool (`_get_kv_cache_bytes_per_block`, the divisor of every block count), and the
segments the extensible KV cache maps in 2 MiB granules (`ExtensibleKVCache._segments`, one per layer offset), under
the layout the engine core resolves for FlashAttention's layers (LBNHC: layer-outermost, block-compact)."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property

__all__ = ["BLOCK_SIZE_TOKENS", "GRANULE_BYTES", "KvGeometry", "KvLayer", "KvLayout", "LayoutError"]

BLOCK_SIZE_TOKENS = 16
"""`CacheConfig.block_size` by default."""
GRANULE_BYTES = 2 << 20
"""The CUDA VMM allocation granularity the extensible KV cache rounds each segment up to (2 MiB on H100/H200/B200)."""

KINDS = ("full", "sliding", "mla")


class LayoutError(ValueError):
    """A set of layers vLLM 0.34 cannot group (it raises too), or one this module does not lay out."""


@dataclass(frozen=True)
class KvLayer:
    """One attention layer's KV cache spec as vLLM 0.34 builds it (`FullAttentionSpec`, `SlidingWindowSpec`,
    `MLAAttentionSpec`), on one rank."""

    kind: str
    """`full`, `sliding` or `mla`."""
    num_kv_heads: int
    """KV heads on the rank (1 for MLA)."""
    head_size: int
    """Head size (MLA: kv_lora_rank + qk_rope_head_dim, with no separate V)."""
    dtype_bytes: int
    """Bytes per element of the KV cache dtype."""
    sliding_window: int | None = None
    """The window of a sliding-window layer."""
    block_size: int = BLOCK_SIZE_TOKENS
    page_size_padded: int | None = None
    """A page padded up to another layer's (`unify_kv_cache_spec_page_size`)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise LayoutError(f"kind={self.kind!r} must be one of {', '.join(KINDS)}")
        if (self.kind == "sliding") != (self.sliding_window is not None):
            raise LayoutError("a sliding-window layer, and only one, has a sliding_window")

    @property
    def page_bytes(self) -> int:
        """`page_size_bytes`: heads x block tokens x (K + V) x dtype (MLA: the one latent vector)."""
        if self.page_size_padded is not None:
            return self.page_size_padded
        per_head = self.head_size * (1 if self.kind == "mla" else 2)
        return self.num_kv_heads * self.block_size * per_head * self.dtype_bytes

    @property
    def _base(self) -> str:
        """The registry's uniform-type base spec (MLA groups with full attention)."""
        return "sliding" if self.kind == "sliding" else "full"


def _merges(specs: Sequence[KvLayer]) -> bool:
    """Whether `type(specs[0]).merge(specs)` succeeds: MLA and sliding-window specs merge only when equal, full
    attention ones when equal and none is MLA."""
    first = specs[0]
    if first.kind == "full" and any(s.kind == "mla" for s in specs):
        return False
    return all(s == first for s in specs)


def _uniform_type(layers: Sequence[KvLayer]) -> bool:
    """`UniformTypeKVCacheSpecs.is_uniform_type`: one block size, and every layer of the first one's base type
    (sliding windows: the same window)."""
    first = layers[0]
    return len({s.block_size for s in layers}) == 1 and all(
        s._base == first._base and (first.kind != "sliding" or s.sliding_window == first.sliding_window)
        for s in layers)


def _unify_pages(layers: Sequence[KvLayer]) -> list[KvLayer]:
    """`unify_kv_cache_spec_page_size`: a smaller page grows its block size where it divides the largest, else a
    non-MLA attention page is padded to it; LayoutError where neither works."""
    top = max(s.page_bytes for s in layers)
    out = []
    for s in layers:
        if s.page_bytes == top:
            out.append(s)
        elif top % s.page_bytes == 0:
            out.append(replace(s, block_size=s.block_size * (top // s.page_bytes)))
        elif s.kind != "mla":
            out.append(replace(s, page_size_padded=top))
        else:
            raise LayoutError("an MLA layer's page does not divide the largest page and cannot be padded (vLLM falls "
                              "back to full allocation)")
    return out


@dataclass(frozen=True)
class KvLayout:
    """The KV cache of a list of layers (in the model's order, the drafter's after the target's), as vLLM 0.34 groups
    and lays it out."""

    layers: tuple[KvLayer, ...]

    @cached_property
    def groups(self) -> list[list[tuple[int, KvLayer]]]:
        """The KV cache groups: `(layer index, its spec as grouped)` (`get_kv_cache_groups`, hybrid manager on)."""
        layers = list(self.layers)
        if not layers:
            return []
        indexed = list(enumerate(layers))
        if _merges(layers) or _uniform_type(layers):
            return [indexed]
        unified = _unify_pages(layers)
        buckets: list[tuple[list[int], list[KvLayer]]] = []
        same: dict[KvLayer, list[int]] = {}
        for i, s in enumerate(unified):
            same.setdefault(s, []).append(i)
        for spec, names in same.items():
            for bucket_names, bucket_specs in buckets:
                if _merges([*bucket_specs, spec]):
                    bucket_names.extend(names)
                    bucket_specs.append(spec)
                    break
            else:
                buckets.append((list(names), [spec]))
        sizes = [len(names) for names, _ in buckets]
        group_size = max(sizes) if max(sizes) < min(sizes) * 1.5 else min(sizes)
        groups = []
        for names, _ in buckets:
            count = -(-len(names) // group_size)
            groups += [[(i, unified[i]) for i in names[k::count]] for k in range(count)]
        return groups

    @cached_property
    def pool_bytes_per_block(self) -> int:
        """`_get_kv_cache_bytes_per_block` under a layer-outermost layout: the largest group's sum of its layers'
        pages. vLLM's block counts are memory divided by it (`get_kv_cache_configs`)."""
        return max((sum(s.page_bytes for _, s in g) for g in self.groups), default=0)

    @cached_property
    def segment_strides(self) -> list[int]:
        """`ExtensibleKVCache.segment_strides`: per distinct layer offset (groups alias from byte 0; within a group the
        layers of each spec sit one after another, `get_kv_cache_config_from_groups`), its block stride."""
        segments: dict[int, int] = {}
        for group in self.groups:
            by_spec: dict[KvLayer, int] = {}
            for _, s in group:
                by_spec[s] = by_spec.get(s, 0) + 1
            offset = 0  # in units of num_blocks bytes
            for s, count in by_spec.items():
                for _ in range(count):
                    if segments.setdefault(offset, s.page_bytes) != s.page_bytes:
                        raise LayoutError("KV cache tensors alias one offset with different block strides")
                    offset += s.page_bytes
        return [segments[k] for k in sorted(segments)]

    @cached_property
    def geometry(self) -> KvGeometry:
        return KvGeometry(tuple(self.segment_strides), self.pool_bytes_per_block)


@dataclass(frozen=True)
class KvGeometry:
    """What vLLM 0.34's block counts depend on: the extensible KV cache's segment strides and the pool's bytes per
    block (derived by `KvLayout`, or recorded by a profile measured through vLLM 0.34)."""

    segment_strides: tuple[int, ...]
    """`ExtensibleKVCache.segment_strides`: each segment's bytes per block."""
    pool_bytes_per_block: int
    """`_pool_bytes_per_block_from_builder`: the divisor of the capacity's block count."""

    @property
    def bytes_per_block(self) -> int:
        """`ExtensibleKVCache.bytes_per_block`: the segments' strides summed."""
        return sum(self.segment_strides)

    def blocks_for(self, available_bytes: int) -> int:
        """Blocks in `available_bytes` of KV memory (`get_kv_cache_configs`: a whole number of pool blocks; 0 where
        nothing is left)."""
        return max(0, available_bytes) // self.pool_bytes_per_block if self.pool_bytes_per_block else 0

    def physical_bytes_for(self, num_blocks: int, granule_bytes: int = GRANULE_BYTES) -> int:
        """`ExtensibleKVCache.physical_bytes_for`: each segment's bytes rounded up to whole granules."""
        return sum(-(-num_blocks * stride // granule_bytes) * granule_bytes for stride in self.segment_strides)

    def blocks_within(self, num_bytes: int, capacity_blocks: int, granule_bytes: int = GRANULE_BYTES) -> int:
        """`ExtensibleKVCache.blocks_within`: the most blocks, within the capacity, whose granule-rounded footprint
        fits `num_bytes` (0 where nothing is left)."""
        if self.bytes_per_block <= 0 or num_bytes <= 0:
            return 0
        top = min(num_bytes // self.bytes_per_block, capacity_blocks)
        # vLLM steps down one block at a time from `top`; the footprint grows with the blocks, so a bisection finds the
        # same count without thousands of steps
        return bisect.bisect_right(range(top + 1), num_bytes,
                                   key=lambda n: self.physical_bytes_for(n, granule_bytes)) - 1
