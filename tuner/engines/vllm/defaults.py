"""vLLM 0.33's default CUDA-graph capture sizes (`VllmConfig._set_cudagraph_sizes`), reproduced exactly."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CUDAGRAPH_MODES",
    "PERFORMANCE_MODES",
    "CaptureDefaults",
    "InvalidScheduleError",
    "capture_ceiling",
    "default_capture_sizes",
    "dense_speculative_schedule",
    "request_count_grid",
    "uniform_decode_tiers",
    "validate_schedule",
    "widest_decode_batch",
]

CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
"""vLLM's `CUDAGraphMode` names, as `--compilation-config` spells them."""

PERFORMANCE_MODES = ("balanced", "interactivity", "throughput")
"""vLLM's `performance_mode` values; only `interactivity` changes the capture grid."""


class InvalidScheduleError(ValueError):
    """A dynamic speculative schedule that vLLM's validator rejects."""


@dataclass(frozen=True)
class CaptureDefaults:
    """What vLLM would capture for one serving config."""

    sizes: list[int]
    """Capture sizes (token widths), ascending and unique."""
    max_size: int
    """Final `max_cudagraph_capture_size` (the last size, 0 when nothing is captured)."""
    uniform_decode_sizes_without_graph: list[int] = field(default_factory=list)
    """Uniform decode widths `n * q` (n <= the tier's max requests) above `max_size`: they run eager."""
    warnings: list[str] = field(default_factory=list)
    """vLLM's warnings for this config (e.g. the silent truncation of a user max)."""
    split: Any = None
    """vLLM 0.34: both lists as its config resolves them (`tuner.engines.vllm.v034.defaults.SplitSizes`); `sizes`
    then holds their keys (decode request counts negated)."""


def capture_ceiling(gpu_capability: tuple[int, int]) -> int:
    """PR 54418's platform ceiling: 1024 tokens on data-center Blackwell (CC 10.x), else 512."""
    return 1024 if gpu_capability[0] == 10 else 512


def request_count_grid(max_requests: int, ceiling: int) -> list[int]:
    """vLLM's request-count grid for speculative decode tiers (1, 2, 4, 8.., 256+16.., and the max)."""
    r = min(max_requests, ceiling)
    grid = [n for n in (1, 2, 4) if n <= r]
    grid += range(8, min(r + 1, 256), 8)
    grid += range(256, r + 1, 16)
    grid.append(r)
    return list(dict.fromkeys(grid))


def validate_schedule(schedule: object) -> list[tuple[int, int, int]]:
    """vLLM's `validate_and_normalize_dynamic_sd_schedule` (`vllm/v1/spec_decode/dynamic/utils.py`) for 3-item
    `(range_start, range_end, K)` entries: the entries sorted by start; InvalidScheduleError where vLLM raises.

    vLLM runs it whenever the schedule is used (scheduler, CUDA-graph manager), so a schedule it rejects stops the
    engine from starting. Gaps between ranges are valid: the dense lookup carries the previous K across them."""
    where = f"speculative_schedule {schedule!r}"
    # vLLM accepts only a list at the top level (entries may be lists or tuples).
    if not isinstance(schedule, list) or not schedule:
        raise InvalidScheduleError(f"{where}: must be a non-empty list of [range_start, range_end, K]")
    parsed: list[tuple[int, int, int]] = []
    for entry in schedule:
        if not isinstance(entry, list | tuple) or len(entry) != 3:
            raise InvalidScheduleError(f"{where}: entry {entry!r} must be [range_start, range_end, K]")
        try:
            lo, hi, k = (int(x) for x in entry)
        except (TypeError, ValueError) as exc:
            raise InvalidScheduleError(f"{where}: entry {entry!r} must hold integers") from exc
        if lo <= 0 or hi <= 0:
            raise InvalidScheduleError(f"{where}: batch-size range ({lo}, {hi}) must be positive")
        if lo > hi:
            raise InvalidScheduleError(f"{where}: batch-size range start must be <= end for ({lo}, {hi}, {k})")
        if k < 0:
            raise InvalidScheduleError(f"{where}: K={k} in ({lo}, {hi}, {k}) must be >= 0")
        parsed.append((lo, hi, k))
    parsed.sort(key=lambda e: e[0])  # vLLM sorts by start only (a stable sort)
    previous: tuple[int, int, int] | None = None
    for entry in parsed:
        if previous is not None and entry[0] <= previous[1]:
            raise InvalidScheduleError(f"{where}: batch-size ranges ({previous[0]}, {previous[1]}) and "
                                       f"({entry[0]}, {entry[1]}) overlap (vLLM: ranges must be non-overlapping)")
        previous = entry
    if parsed[0][0] != 1:
        raise InvalidScheduleError(f"{where}: the first batch-size range starts at {parsed[0][0]}; it must start at 1 "
                                   f"so every runtime batch size has a defined schedule")
    return parsed


def dense_speculative_schedule(
    schedule: object, max_num_seqs: int, num_speculative_tokens: int
) -> list[int]:
    """vLLM's dense `batch size -> K` lookup (`build_dynamic_sd_schedule_lookup`, index 0 unused): gaps and the tail
    carry K forward, K <= max; InvalidScheduleError where vLLM raises (a schedule it rejects, or no speculation)."""
    if num_speculative_tokens <= 0:
        raise InvalidScheduleError(f"speculative_schedule needs num_speculative_tokens >= 1, not "
                                   f"{num_speculative_tokens} (vLLM: vllm_num_speculative_tokens must be > 0)")
    entries = validate_schedule(schedule)
    dense = [0] * (max_num_seqs + 1)
    next_bs = 1
    last_k: int | None = None
    for lo, hi, k in entries:
        if lo > next_bs and last_k is not None:
            for bs in range(next_bs, min(lo, max_num_seqs + 1)):
                dense[bs] = min(num_speculative_tokens, last_k)
        for bs in range(max(lo, next_bs), min(hi, max_num_seqs) + 1):
            dense[bs] = min(num_speculative_tokens, k)
        next_bs = max(next_bs, hi + 1)
        last_k = k
        if next_bs > max_num_seqs:
            break
    if last_k is not None:
        for bs in range(next_bs, max_num_seqs + 1):
            dense[bs] = min(num_speculative_tokens, last_k)
    return dense


def uniform_decode_tiers(
    max_num_seqs: int, num_speculative_tokens: int, speculative_schedule: object = None
) -> list[tuple[int, int]]:
    """`(query_len, widest batch at that query_len)` tiers, ascending; InvalidScheduleError for a schedule vLLM
    rejects (it would not start)."""
    q = 1 + num_speculative_tokens
    if speculative_schedule is None:
        return [(q, max_num_seqs)]
    dense = dense_speculative_schedule(speculative_schedule, max_num_seqs, num_speculative_tokens)
    widest: dict[int, int] = {}
    for bs in range(1, max_num_seqs + 1):
        widest[dense[bs] + 1] = bs
    return sorted(widest.items())


def widest_decode_batch(
    max_num_seqs: int, num_speculative_tokens: int, speculative_schedule: object = None
) -> tuple[int, int]:
    """`(requests, query_len)` of the widest uniform decode step: max_num_seqs x q, or under a dynamic schedule the
    tier whose widest batch carries the most tokens ([[1,16,3],[17,256,1]] at 256 seqs: 256 x 2, not 16 x 4)."""
    tiers = uniform_decode_tiers(max_num_seqs, num_speculative_tokens, speculative_schedule)
    query_len, requests = max(tiers, key=lambda t: (t[0] * t[1], t[1]))
    return requests, query_len


def default_capture_sizes(
    max_num_seqs: int,
    num_speculative_tokens: int = 0,
    max_num_batched_tokens: int = 8192,
    *,
    gpu_capability: tuple[int, int] = (9, 0),
    performance_mode: str = "balanced",
    cudagraph_mode: str = "FULL_AND_PIECEWISE",
    max_cudagraph_capture_size: int | None = None,
    cudagraph_capture_sizes: Sequence[int] | None = None,
    speculative_schedule: object = None,
    enforce_eager: bool = False,
) -> CaptureDefaults:
    """The capture list and max vLLM 0.33 settles on; raises ValueError where vLLM raises."""
    if cudagraph_mode not in CUDAGRAPH_MODES:
        raise ValueError(f"cudagraph_mode={cudagraph_mode!r} must be one of {', '.join(CUDAGRAPH_MODES)}")
    if performance_mode not in PERFORMANCE_MODES:
        raise ValueError(f"performance_mode={performance_mode!r} must be one of {', '.join(PERFORMANCE_MODES)}")
    if speculative_schedule is not None:  # vLLM checks it at startup whatever the graphs
        dense_speculative_schedule(speculative_schedule, max(max_num_seqs, 1), num_speculative_tokens)
    if enforce_eager or cudagraph_mode == "NONE":
        return CaptureDefaults(sizes=[], max_size=0)
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs={max_num_seqs} must be >= 1")
    if num_speculative_tokens < 0:
        raise ValueError(f"num_speculative_tokens={num_speculative_tokens} must be >= 0")
    if max_num_batched_tokens < 1:
        raise ValueError(f"max_num_batched_tokens={max_num_batched_tokens} must be >= 1")

    q = 1 + num_speculative_tokens
    tiers = uniform_decode_tiers(max_num_seqs, num_speculative_tokens, speculative_schedule)
    uniform_decode_sizes: set[int] = set()
    max_size = max_cudagraph_capture_size
    if max_size is None:
        ceiling = capture_ceiling(gpu_capability)
        max_size = min(max_num_seqs * q * 2, ceiling)
        if q > 1:
            for query_len, tier_max in tiers:
                uniform_decode_sizes |= {
                    n * query_len
                    for n in request_count_grid(tier_max, ceiling)
                    if n * query_len <= max_size
                }
        elif max_num_seqs <= max_size:
            uniform_decode_sizes = {max_num_seqs}
    max_size = min(max_num_batched_tokens, max_size)
    if max_size < 1:
        raise ValueError(
            "Maximum cudagraph size should be greater than or equal to 1 when using cuda graph."
        )

    if cudagraph_capture_sizes is not None:
        if len(cudagraph_capture_sizes) == 0:
            raise ValueError("cudagraph_capture_sizes should contain at least one element when using cuda graph.")
        sizes = sorted({int(s) for s in cudagraph_capture_sizes if s <= max_num_batched_tokens})
    else:
        if performance_mode == "interactivity":
            grid = list(range(1, min(max_size, 32) + 1))
        else:
            grid = [n for n in (1, 2, 4) if n <= max_size]
        if max_size >= 8:
            grid += range(8, min(max_size + 1, 256), 8)
        if max_size >= 256:
            grid += range(256, max_size + 1, 16)
        if max_num_batched_tokens <= max_size:
            grid.append(max_num_batched_tokens)
        grid += (s for s in uniform_decode_sizes if s <= max_num_batched_tokens)
        sizes = sorted(set(grid))

    valid_max = sizes[-1] if sizes else 0
    warnings: list[str] = []
    if max_cudagraph_capture_size is not None and max_cudagraph_capture_size != valid_max:
        if cudagraph_capture_sizes is not None:
            raise ValueError(
                f"customized max_cudagraph_capture_size(={max_cudagraph_capture_size}) should be "
                f"consistent with the max value of cudagraph_capture_sizes(={valid_max})"
            )
        warnings.append(f"Truncating max_cudagraph_capture_size to {valid_max}")

    without_graph = sorted(
        {
            n * query_len
            for query_len, tier_max in tiers
            for n in range(1, tier_max + 1)
            if valid_max < n * query_len <= max_num_batched_tokens
        }
    )
    return CaptureDefaults(
        sizes=sizes, max_size=valid_max, uniform_decode_sizes_without_graph=without_graph, warnings=warnings
    )
