"""Candidate capture sizes of a serving config, and the `--custom-histogram-buckets` that make vLLM resolve them."""

from __future__ import annotations

import json
from collections.abc import Iterable

from tuner.workload.candidates import candidate_widths, decode_widths
from tuner.workload.spec import ServingConfig

__all__ = ["bucket_bounds", "buckets_json", "candidate_widths", "decode_widths", "unresolved_widths"]


def bucket_bounds(serving: ServingConfig) -> list[int]:
    """Histogram upper bounds: every candidate width, plus the token budget so no real step lands in +Inf."""
    return sorted(set(candidate_widths(serving)) | {serving.max_num_batched_tokens})


def buckets_json(serving: ServingConfig) -> str:
    """The value for vLLM's `--custom-histogram-buckets`."""
    return json.dumps({"iteration_tokens": bucket_bounds(serving)}, separators=(",", ":"))


def unresolved_widths(bounds: Iterable[float], candidates: Iterable[int]) -> list[int]:
    """Candidate widths that are not a bucket bound: the histogram cannot tell steps at them from narrower ones."""
    present = {float(b) for b in bounds}
    return [w for w in candidates if float(w) not in present]
