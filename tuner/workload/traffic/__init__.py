"""Traffic from outside cgtune: vLLM's iteration-tokens histogram, the buckets that resolve it, step traces."""

from __future__ import annotations

from tuner.workload.traffic.buckets import (
                                            bucket_bounds,
                                            buckets_json,
                                            candidate_widths,
                                            decode_widths,
                                            unresolved_widths,
)
from tuner.workload.traffic.metrics import (
                                            ITERATION_TOKENS,
                                            LabelKey,
                                            TokenHistogram,
                                            TrafficError,
                                            combine,
                                            interval,
                                            parse_exposition,
                                            read_source,
                                            select_series,
)
from tuner.workload.traffic.spec import derived_spec, render_workload, write_workload
from tuner.workload.traffic.widths import SpreadWidths, spread_histogram

__all__ = [
    "ITERATION_TOKENS",
    "LabelKey",
    "SpreadWidths",
    "TokenHistogram",
    "TrafficError",
    "bucket_bounds",
    "buckets_json",
    "candidate_widths",
    "combine",
    "decode_widths",
    "derived_spec",
    "interval",
    "parse_exposition",
    "read_source",
    "render_workload",
    "select_series",
    "spread_histogram",
    "unresolved_widths",
    "write_workload",
]
