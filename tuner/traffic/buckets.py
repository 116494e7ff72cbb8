"""Candidate capture sizes of a serving config, and the `--custom-histogram-buckets` that make vLLM resolve them."""

from __future__ import annotations

import json
from collections.abc import Iterable

from tuner.vllm.defaults import default_capture_sizes, uniform_decode_tiers
from tuner.workload import ServingConfig

__all__ = ["bucket_bounds", "buckets_json", "candidate_widths", "decode_widths", "unresolved_widths"]


def decode_widths(serving: ServingConfig) -> list[int]:
    """Every uniform decode width (requests x query length, per speculative tier) within the token budget."""
    widths = {
        n * query_len
        for query_len, tier_max in uniform_decode_tiers(
            serving.max_num_seqs, serving.num_speculative_tokens,
            [list(e) for e in serving.speculative_schedule] if serving.speculative_schedule else None,
        )
        for n in range(1, tier_max + 1)
    }
    return sorted(w for w in widths if w <= serving.max_num_batched_tokens)


def candidate_widths(serving: ServingConfig) -> list[int]:
    """Widths the tuner may capture: vLLM's default grid (and any user list), every decode width, and vLLM's
    stride grid continued above the ceiling up to the widest decode batch."""
    defaults = serving.defaults().sizes
    decode = decode_widths(serving)
    widest = max([*decode, *defaults, 1])
    # vLLM's own grid with the ceiling lifted: what `max_cudagraph_capture_size=widest` would capture, i.e.
    # the 16-token stride vLLM uses from 256 up, continued to where decode batches end. Graph mode and any
    # user list are dropped here because candidates are about what *could* be captured.
    lifted = default_capture_sizes(
        serving.max_num_seqs,
        serving.num_speculative_tokens,
        serving.max_num_batched_tokens,
        gpu_capability=serving.gpu_capability,
        performance_mode=serving.performance_mode,
        max_cudagraph_capture_size=min(widest, serving.max_num_batched_tokens),
    ).sizes
    return sorted(set(defaults) | set(decode) | set(lifted))


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
