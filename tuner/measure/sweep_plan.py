"""Which widths a sweep measures first and which it drops when time runs short: key widths first, the others spread
evenly, and each width's cost estimated from what the widths already measured took."""

from __future__ import annotations

import math
from itertools import zip_longest
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tuner.workload.spec import Workload

__all__ = ["fit_to_seconds", "interpolate", "key_widths", "measure_seconds", "priority_order", "spread_order"]


def key_widths(workload: Workload) -> tuple[list[int], list[int]]:
    """(the widths no thinning drops, in priority order: the smallest step, the widest decode batch, the capture
    ceiling and the default list's largest size; the decode widths of the workload's own request counts). Widths
    here need not be candidates: callers keep those that are."""
    from tuner.engines.vllm.defaults import capture_ceiling

    s = workload.serving
    widest_decode = min(s.max_num_batched_tokens, s.decode_query_len * s.max_num_seqs)
    ends = [1, widest_decode, capture_ceiling(s.gpu_capability), workload.engine.defaults().max_size]
    requests = sorted({step.num_tokens for step in workload.steps() if step.uniform_decode})
    return list(dict.fromkeys(ends)), requests


def spread_order(widths: Iterable[int]) -> list[int]:
    """`widths` sorted so that every prefix is spread as evenly as it can be over their range: both ends first, then
    the middle, then the middles of the two halves, and so on (by rank, not by value)."""
    ordered = sorted(set(widths))
    if len(ordered) <= 2:
        return ordered
    out = [ordered[0], ordered[-1]]
    intervals = [(0, len(ordered) - 1)]
    while intervals:
        split = []
        for lo, hi in intervals:
            if hi - lo < 2:
                continue
            mid = (lo + hi) // 2
            out.append(ordered[mid])
            split += [(lo, mid), (mid, hi)]
        intervals = split
    return out


def priority_order(widths: Iterable[int], ends: Sequence[int], requests: Iterable[int] = ()) -> list[int]:
    """Every width of `widths`, most important first: those of `ends` in their order, then the decode widths of the
    workload's request counts (`requests`) and the others taken alternately, each group spread evenly (so neither
    the decode range nor the grid below it goes without widths). A sweep that times in this order and stops early
    keeps the ends and an even spread, not only the widest widths."""
    pool = set(widths)
    first = [w for w in dict.fromkeys(ends) if w in pool]
    decode = spread_order(set(requests) & pool - set(first))
    others = spread_order(pool - set(first) - set(decode))
    alternate = [w for pair in zip_longest(decode, others) for w in pair if w is not None]
    return first + alternate


def interpolate(measured: Mapping[int, float], width: int) -> float | None:
    """The value at `width`, linear between the measured widths either side of it (a step's time grows about
    linearly with its tokens), the nearest measured one's outside them; None when nothing is measured."""
    if not measured:
        return None
    below = [w for w in measured if w <= width]
    above = [w for w in measured if w >= width]
    if not below or not above:
        return measured[min(above)] if above else measured[max(below)]
    lo, hi = max(below), min(above)
    if lo == hi:
        return measured[lo]
    return measured[lo] + (measured[hi] - measured[lo]) * (width - lo) / (hi - lo)


def measure_seconds(step_s: float, *, warmup_ms: float, rep_ms: float, min_reps: int, max_reps: int) -> float:
    """Seconds `tuner.measure.timing.measure` spends on a step of `step_s`: one estimating call, warm-up calls for
    `warmup_ms`, then the timed repetitions (`rep_ms`, between `min_reps` and `max_reps`)."""
    step_ms = max(step_s * 1e3, 1e-6)
    warmup = min(max_reps, max(0, math.ceil(warmup_ms / step_ms) - 1))
    reps = min(max_reps, max(min_reps, math.ceil(rep_ms / step_ms)))
    return step_s * (1 + warmup + reps)


def fit_to_seconds(order: Sequence[int], cost_s: Callable[[int], float], seconds: float) -> list[int]:
    """The widths of `order` taken greedily in that order while their summed `cost_s` stays within `seconds` (a width
    too expensive is skipped, cheaper later ones may still fit); in `order`'s order."""
    kept, spent = [], 0.0
    for w in order:
        cost = cost_s(w)
        if spent + cost <= seconds:
            kept.append(w)
            spent += cost
    return kept
