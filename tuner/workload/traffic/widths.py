"""Turn a bucketed step-width histogram into per-width step counts, spreading each bucket by the serving config."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tuner.workload.spec import ServingConfig
from tuner.workload.traffic.buckets import candidate_widths, decode_widths, unresolved_widths
from tuner.workload.traffic.metrics import TokenHistogram, TrafficError

__all__ = ["SpreadWidths", "spread_histogram"]


@dataclass(frozen=True)
class SpreadWidths:
    """Per-width step counts made from a histogram, and what had to be assumed to make them."""

    counts: dict[int, float]
    """Width (tokens per step) -> expected number of steps; sums to the histogram's step count."""
    steps: float
    """Steps the histogram observed."""
    assumptions: list[str] = field(default_factory=list)
    """Sentences saying how buckets were spread (they go into `traffic.source_note`)."""
    unresolved: list[int] = field(default_factory=list)
    """Candidate capture sizes that fall inside a bucket instead of on a bound."""
    candidates: int = 0
    """How many candidate capture sizes the serving config has."""

    @property
    def mean_width(self) -> float:
        return sum(w * c for w, c in self.counts.items()) / self.steps


def _add_even(counts: dict[int, float], widths: list[int] | range, steps: float) -> None:
    share = steps / len(widths)
    for w in widths:
        counts[w] = counts.get(w, 0.0) + share


def spread_histogram(hist: TokenHistogram, serving: ServingConfig, *, where: str = "metrics") -> SpreadWidths:
    """Spread every bucket `(lower, upper]` over the integer widths inside it.

    A step-width histogram says nothing about which steps were pure decode, so: widths up to the widest decode
    batch (max_num_seqs x q) are taken as uniform decode steps and sit at the decode widths (multiples of q) in
    the bucket; wider ones are mixed steps, spread evenly over every integer width. A bucket straddling the
    widest decode batch is split between the two parts in proportion to how many widths each covers.
    """
    if hist.count <= 0:
        raise TrafficError(f"{where}: the histogram holds zero steps (no traffic yet, or nothing between the scrapes)")
    budget = serving.max_num_batched_tokens
    q = serving.decode_query_len
    decode = decode_widths(serving)
    widest_decode = decode[-1] if decode else 0
    decode_set = set(decode)
    counts: dict[int, float] = {}
    assumptions: list[str] = []
    for lower, upper, steps in hist.buckets():
        if steps <= 0:
            continue
        first = math.floor(lower) + 1
        last = min(budget, math.floor(upper) if math.isfinite(upper) else budget)
        if first > budget:
            raise TrafficError(
                f"{where}: {steps:g} steps are wider than {lower:g} tokens, above max_num_batched_tokens={budget} "
                "of the base spec (its serving section does not match the server)"
            )
        if first > last:
            raise TrafficError(f"{where}: {steps:g} steps fall in bucket ({lower:g}, {upper:g}], "
                               "which holds no whole token count")
        if not math.isfinite(upper):
            assumptions.append(
                f"{steps:g} steps above the largest bucket bound ({lower:g}) were spread up to "
                f"max_num_batched_tokens={budget}."
            )
        decode_part = range(first, min(last, widest_decode) + 1)
        mixed_part = range(max(first, widest_decode + 1), last + 1)
        span = len(decode_part) + len(mixed_part)
        if decode_part:
            targets = [w for w in decode_part if w in decode_set] or list(decode_part)
            _add_even(counts, targets, steps * len(decode_part) / span)
        if mixed_part:
            _add_even(counts, mixed_part, steps * len(mixed_part) / span)

    if q > 1:
        assumptions.insert(0, (
            f"Within each bucket, steps up to the widest decode batch (max_num_seqs x q = {widest_decode} tokens) "
            f"are assumed to be pure decode steps and sit evenly at the multiples of q={q} in the bucket "
            "(speculative decoding: each request carries q tokens); wider steps are mixed (prefill) steps, "
            "spread evenly over every width in the bucket."
        ))
    else:
        assumptions.insert(0, (
            "Within each bucket, steps are spread evenly over every width in the bucket (q=1: any width up to "
            f"max_num_seqs={serving.max_num_seqs} may be a pure decode step)."
        ))
    candidates = candidate_widths(serving)
    unresolved = unresolved_widths(hist.bounds, candidates)
    return SpreadWidths(counts=counts, steps=hist.count, assumptions=assumptions, unresolved=unresolved,
                        candidates=len(candidates))
