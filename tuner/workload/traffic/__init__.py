"""Traffic from outside cgtune: vLLM's iteration-tokens histogram, the buckets that resolve it, step traces, and the
load (request rate, prompt and output lengths, acceptance) read from vLLM's request metrics."""

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
                                            MetricAbsent,
                                            TokenHistogram,
                                            TrafficError,
                                            combine,
                                            interval,
                                            parse_exposition,
                                            read_source,
                                            select_series,
)
from tuner.workload.traffic.requests import (
                                            GENERATION_TOKENS,
                                            PROMPT_TOKENS,
                                            REQUEST_SUCCESS,
                                            SPEC_ACCEPTED_TOKENS,
                                            SPEC_DRAFTS,
                                            Counted,
                                            ObservedLoad,
                                            PlacedLengths,
                                            Scrapes,
                                            fit_model_len,
                                            observed_load,
                                            parse_counter,
                                            read_counter,
                                            read_histogram,
                                            representative_lengths,
)
from tuner.workload.traffic.spec import derived_spec, render_workload, write_workload
from tuner.workload.traffic.widths import SpreadWidths, spread_histogram

__all__ = [
    "GENERATION_TOKENS",
    "ITERATION_TOKENS",
    "PROMPT_TOKENS",
    "REQUEST_SUCCESS",
    "SPEC_ACCEPTED_TOKENS",
    "SPEC_DRAFTS",
    "Counted",
    "LabelKey",
    "MetricAbsent",
    "ObservedLoad",
    "PlacedLengths",
    "Scrapes",
    "SpreadWidths",
    "TokenHistogram",
    "TrafficError",
    "bucket_bounds",
    "buckets_json",
    "candidate_widths",
    "combine",
    "decode_widths",
    "derived_spec",
    "fit_model_len",
    "interval",
    "observed_load",
    "parse_counter",
    "parse_exposition",
    "read_counter",
    "read_histogram",
    "read_source",
    "render_workload",
    "representative_lengths",
    "select_series",
    "spread_histogram",
    "unresolved_widths",
    "write_workload",
]
