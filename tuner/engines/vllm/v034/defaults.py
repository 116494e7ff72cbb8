"""vLLM 0.34's capture sizes, reproduced exactly: the prefill graphs' token counts and the decode graphs' request
counts, each resolved from its own explicit sizes, cap or default and never from the other's
(`VllmConfig._split_cudagraph_capture_sizes`, vllm/config/vllm.py), the grids they default to
(vllm/config/compilation.py), the SM100 wide defaults, and the record every graph's token count is written into.
The shared (deprecated) list is still resolved first, exactly as 0.33 resolves it (`tuner.engines.vllm.defaults`)."""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tuner.engines.vllm.defaults import (
    CUDAGRAPH_MODES,
    PERFORMANCE_MODES,
    default_capture_sizes,
    dense_speculative_schedule,
)
from tuner.engines.vllm.dispatch import mode_parts

__all__ = ["DRAFT_DECODE_METHODS", "WIDE_DECODE_TOKENS", "WIDE_PREFILL_TOKENS", "SplitSizes", "decode_grid",
           "decode_query_lens", "decode_shapes", "prefill_grid", "resolve_capture_sizes", "varlen_grid"]

WIDE_PREFILL_TOKENS = 8192
"""The prefill grid's default top on SM100 (and under a decode-only cap): `prefill_cudagraph_capture_grid(8192)`."""
WIDE_DECODE_TOKENS = 8192
"""`max_decode_cudagraph_capture_tokens` as SM100's wide defaults set it (vllm.py:2607-2611)."""
DRAFT_DECODE_METHODS = ("eagle", "eagle3", "mtp", "draft_model")
"""Methods whose draft steps after the first are one-token decodes with FULL graphs of their own
(`get_draft_decode_cudagraph_request_sizes`)."""


def _walk_grid(limit: int, step: Callable[[int], float]) -> list[int]:
    """vLLM's `_walk_grid`: 1, then each next size the next multiple of the largest power of two not above
    step(size), then the limit itself."""
    grid, size = [], 1
    while size < limit:
        grid.append(size)
        stride = 1 << max(0, math.floor(math.log2(max(1.0, step(size)))))
        size = (size // stride + 1) * stride
    return [*grid, limit] if limit else []


def prefill_grid(max_tokens: int, dense_head: bool = False) -> list[int]:
    """`prefill_cudagraph_capture_grid`: 1, 2, 4, every 8 to 64, four per doubling to 1024, every 256, every 512 once
    7% of the size passes 512 (54 sizes at 8192); `dense_head` (interactivity) adds every count up to 32."""
    grid = _walk_grid(max_tokens, lambda t: min(t, max(8, t / 4), 0.07 * max(t, 4096)))
    if dense_head:
        grid = sorted({*grid, *(t for t in range(1, 33) if t < max_tokens)})
    return grid


def varlen_grid(max_tokens: int, dense_head: bool = False) -> list[int]:
    """`varlen_decode_cudagraph_capture_grid` (adaptive verification's decode graphs, token counts)."""
    grid = set(range(1, 33)) if dense_head else {1, 2, 4}
    low = 8
    grid.add(low)
    while low < 1024:
        grid.update(range(low + low // 4, 2 * low + 1, low // 4))
        low *= 2
    grid.update(range(1024, 4096, 128), range(4096, max_tokens, 256))
    return sorted({s for s in grid if s < max_tokens} | {max_tokens}) if max_tokens else []


def decode_grid(max_requests: int) -> list[int]:
    """`decode_cudagraph_capture_grid`: every request count to 6, then strides of 2 from 8, 4 from 16, 8 from 48,
    16 from 128, 32 from 352 (64 sizes at 1024)."""
    return _walk_grid(max_requests, lambda n: 0.65 * n ** (2 / 3))


def decode_shapes(sizes: Iterable[int], query_lens: Mapping[int, int], max_tokens: int) -> list[tuple[int, int]]:
    """`decode_cudagraph_capture_shapes`: the `(requests, query length)` decode graphs of the request counts `sizes`,
    per query length up to the most requests it maps to and `max_tokens` tokens; the first size at or above that limit
    is captured at the limit (a batch pads to the smallest graph that holds it), larger ones are unreachable."""
    ordered = sorted(set(sizes))
    shapes: set[tuple[int, int]] = set()
    for q, max_reqs in query_lens.items():
        limit = min(max_reqs, max_tokens // q)
        reachable = ordered[: bisect.bisect_left(ordered, limit) + 1]
        shapes.update((min(n, limit), q) for n in reachable if limit >= 1)
    return sorted(shapes, key=lambda shape: (shape[1], shape[0]))


def decode_query_lens(max_num_seqs: int, num_speculative_tokens: int,
                      speculative_schedule: object = None) -> dict[int, int]:
    """`get_decode_cudagraph_query_lens(1 + K)`: each decode query length mapped to the most requests its batches
    have: `{q: max_num_seqs}`, or under a dynamic schedule `1 + K(n)` for each batch size n, the widest kept."""
    q = 1 + num_speculative_tokens
    if speculative_schedule is None or num_speculative_tokens <= 0:
        return {q: max_num_seqs}
    dense = dense_speculative_schedule(speculative_schedule, max_num_seqs, num_speculative_tokens)
    return {k + 1: batch for batch, k in enumerate(dense) if batch > 0}


@dataclass(frozen=True)
class SplitSizes:
    """What vLLM 0.34 captures for one serving config, as its config resolves it."""

    prefill_token_sizes: list[int]
    """`prefill_cudagraph_capture_token_sizes`: token counts of the mixed (prefill) graphs, ascending."""
    decode_request_sizes: list[int]
    """`decode_cudagraph_capture_request_sizes`: request counts of the uniform decode graphs, ascending."""
    record: list[int]
    """`cudagraph_capture_sizes` after resolution: every graph's token count (a record, no longer an input)."""
    max_record: int
    """`max_cudagraph_capture_size` after resolution: the record's max (0: no graph)."""
    cudagraph_mode: str
    """The cudagraph mode after resolution: NONE when no size is left."""
    max_decode_tokens: int | None
    """`max_decode_cudagraph_capture_tokens` as resolved (8192 under SM100's wide defaults; None: no budget)."""
    decode_query_lens: dict[int, int]
    """Decode query length -> the most requests its batches have (`get_decode_cudagraph_query_lens`)."""
    draft_decode_request_sizes: list[int] = field(default_factory=list)
    """`get_draft_decode_cudagraph_request_sizes()`: the drafter's one-token decode graphs (request counts)."""
    warnings: list[str] = field(default_factory=list)
    """vLLM's warnings for this config (the deprecation, sizes dropped, a truncated max)."""
    legacy: bool = False
    """Only the deprecated `cudagraph_capture_sizes` / `max_cudagraph_capture_size` were set."""
    wide_defaults: bool = False
    """SM100's wide defaults applied (no deprecated field set, capability 10.x)."""

    @property
    def decode_max_tokens(self) -> int:
        """`decode_cudagraph_capture_max_tokens`: the most tokens a decode graph holds as the runner builds it (the
        record's max, within the decode token budget)."""
        top = self.max_record or 0
        return min(top, self.max_decode_tokens or top)


def _explicit(sizes: Sequence[int], limit: int, cap: int | None, name: str, cap_name: str,
              warnings: list[str]) -> list[int]:
    """An explicit list as vLLM keeps it: values outside [1, limit] dropped with a warning; ValueError when the
    largest kept value is above its cap."""
    kept = sorted({s for s in sizes if 1 <= s <= limit})
    if len(kept) < len(set(sizes)):
        warnings.append(f"Dropping {sorted(set(sizes) - set(kept))} from {name}: outside [1, {limit}].")
    if cap is not None and kept and kept[-1] > cap:
        raise ValueError(f"{name} holds {kept[-1]}, above {cap_name}={cap}.")
    return kept


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def resolve_capture_sizes(
    *,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    num_speculative_tokens: int = 0,
    speculative_method: str | None = None,
    speculative_schedule: object = None,
    gpu_capability: tuple[int, int] = (9, 0),
    performance_mode: str = "balanced",
    cudagraph_mode: str = "FULL_AND_PIECEWISE",
    enforce_eager: bool = False,
    cudagraph_capture_sizes: Sequence[int] | None = None,
    max_cudagraph_capture_size: int | None = None,
    prefill_token_sizes: Sequence[int] | None = None,
    max_prefill_tokens: int | None = None,
    decode_request_sizes: Sequence[int] | None = None,
    max_decode_requests: int | None = None,
    max_decode_tokens: int | None = None,
    multi_module_mtp: bool = False,
) -> SplitSizes:
    """Both lists and the record vLLM 0.34 settles on (`_set_cudagraph_sizes`, then `_split_cudagraph_capture_sizes`);
    ValueError where vLLM raises. `multi_module_mtp`: an MTP drafter of several modules (not Gemma 4's), which takes
    no one-token draft decode graphs."""
    if cudagraph_mode not in CUDAGRAPH_MODES:
        raise ValueError(f"cudagraph_mode={cudagraph_mode!r} must be one of {', '.join(CUDAGRAPH_MODES)}")
    if performance_mode not in PERFORMANCE_MODES:
        raise ValueError(f"performance_mode={performance_mode!r} must be one of {', '.join(PERFORMANCE_MODES)}")
    for name, value in (("max_prefill_cudagraph_capture_tokens", max_prefill_tokens),
                        ("max_decode_cudagraph_capture_requests", max_decode_requests)):
        if value is not None and value < 0:  # pydantic `ge=0`
            raise ValueError(f"{name}={value} must be >= 0")
    if max_decode_tokens is not None and max_decode_tokens < 1:  # pydantic `ge=1`
        raise ValueError(f"max_decode_cudagraph_capture_tokens={max_decode_tokens} must be >= 1")
    query_lens = decode_query_lens(max_num_seqs, num_speculative_tokens, speculative_schedule)
    if enforce_eager or cudagraph_mode == "NONE":
        return SplitSizes([], [], [], 0, "NONE", max_decode_tokens, query_lens)

    legacy_sizes = max_cudagraph_capture_size is not None or cudagraph_capture_sizes is not None
    uses_split = any(x is not None for x in (prefill_token_sizes, max_prefill_tokens, decode_request_sizes,
                                             max_decode_requests))
    shared = default_capture_sizes(
        max_num_seqs, num_speculative_tokens, max_num_batched_tokens, gpu_capability=gpu_capability,
        performance_mode=performance_mode, cudagraph_mode=cudagraph_mode,
        max_cudagraph_capture_size=max_cudagraph_capture_size, cudagraph_capture_sizes=cudagraph_capture_sizes,
        speculative_schedule=speculative_schedule)
    warnings = list(shared.warnings)
    if cudagraph_capture_sizes is not None and len(shared.sizes) < len(cudagraph_capture_sizes):
        warnings.append(f"cudagraph_capture_sizes specified in compilation_config {list(cudagraph_capture_sizes)} is "
                        f"overridden by config {shared.sizes}")
    if legacy_sizes and not uses_split:
        warnings.append("cudagraph_capture_sizes and max_cudagraph_capture_size are deprecated. Set the token counts "
                        "of prefill CUDA graphs with prefill_cudagraph_capture_token_sizes or "
                        "max_prefill_cudagraph_capture_tokens, and the request counts of decode CUDA graphs with "
                        "decode_cudagraph_capture_request_sizes or max_decode_cudagraph_capture_requests.")
    shared_sizes, shared_max = shared.sizes, shared.max_size
    mnbt = max_num_batched_tokens
    wide = not legacy_sizes and gpu_capability[0] == 10
    if wide and max_decode_tokens is None:
        max_decode_tokens = WIDE_DECODE_TOKENS

    if prefill_token_sizes is not None:
        prefill = _explicit(prefill_token_sizes, mnbt, max_prefill_tokens, "prefill_cudagraph_capture_token_sizes",
                            "max_prefill_cudagraph_capture_tokens", warnings)
    elif max_prefill_tokens is not None or wide:
        top = WIDE_PREFILL_TOKENS if max_prefill_tokens is None else max_prefill_tokens
        prefill = prefill_grid(min(top, mnbt), performance_mode == "interactivity")
    else:
        prefill = list(shared_sizes)

    if decode_request_sizes is not None:
        decode = _explicit(decode_request_sizes, max_num_seqs, max_decode_requests,
                           "decode_cudagraph_capture_request_sizes", "max_decode_cudagraph_capture_requests", warnings)
    elif max_decode_requests is not None or wide:
        decode = decode_grid(max_num_seqs if max_decode_requests is None else min(max_decode_requests, max_num_seqs))
    else:  # the request counts each query length rounds the shared sizes up to, within the shared bound
        decode = sorted({min(_cdiv(s, q), max_num_seqs) for s in shared_sizes for q in query_lens
                         if _cdiv(s, q) * q <= shared_max})

    draft = (decode_grid(max_num_seqs) if decode and num_speculative_tokens >= 2
             and speculative_method in DRAFT_DECODE_METHODS and not multi_module_mtp else [])
    budget = min(mnbt, max_decode_tokens or mnbt)
    decode_tokens = {n * q for n, q in decode_shapes(decode, query_lens, budget)}
    decode_tokens |= {n for n, _ in decode_shapes(draft, {1: max_num_seqs}, budget)}
    record = decode_tokens | set(prefill)
    if not (legacy_sizes and not uses_split) and mode_parts(cudagraph_mode)[1] == "NONE":
        record = set(decode_tokens)  # FULL_DECODE_ONLY captures no prefill graph
    if legacy_sizes and uses_split:
        # vLLM accepts both kinds only when re-resolving a config it resolved itself (the record matches).
        if shared_sizes not in (sorted(decode_tokens | set(prefill)), sorted(decode_tokens)):
            raise ValueError("The deprecated cudagraph_capture_sizes and max_cudagraph_capture_size cannot be combined "
                             "with the prefill and decode CUDA graph capture sizes; set only the latter.")
        record = set(shared_sizes)
    mode = cudagraph_mode if record else "NONE"
    return SplitSizes(prefill_token_sizes=prefill, decode_request_sizes=decode, record=sorted(record),
                      max_record=max(record, default=0), cudagraph_mode=mode, max_decode_tokens=max_decode_tokens,
                      decode_query_lens=query_lens, draft_decode_request_sizes=draft, warnings=warnings,
                      legacy=legacy_sizes and not uses_split, wide_defaults=wide)
