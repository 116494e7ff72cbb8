"""Read a vLLM server's request metrics (finished-request counter, prompt and output length histograms, speculative
decoding counters) over an interval into the figures of a workload's `traffic.load`, saying where each came from."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from tuner.workload.traffic.metrics import (
    LabelKey,
    MetricAbsent,
    TokenHistogram,
    TrafficError,
    combine,
    exposition_families,
    interval,
    parse_exposition,
    select_series,
)

__all__ = [
    "GENERATION_TOKENS",
    "PROMPT_TOKENS",
    "REQUEST_SUCCESS",
    "SPEC_ACCEPTED_TOKENS",
    "SPEC_DRAFTS",
    "Counted",
    "ObservedLoad",
    "PlacedLengths",
    "Scrapes",
    "fit_model_len",
    "observed_load",
    "parse_counter",
    "read_counter",
    "read_histogram",
    "representative_lengths",
]

REQUEST_SUCCESS = "vllm:request_success"
"""vLLM's counter of finished requests, one series per `finished_reason` (stop, length, abort, error, repetition)."""
PROMPT_TOKENS = "vllm:request_prompt_tokens"
"""vLLM's histogram of each finished request's prompt length (tokens); buckets 1, 2, 5, 10, 20, 50, ... up to
max_model_len by default (vllm/v1/metrics/buckets.py `build_1_2_5_buckets`)."""
GENERATION_TOKENS = "vllm:request_generation_tokens"
"""vLLM's histogram of each finished request's output length (tokens generated), with the same buckets."""
SPEC_DRAFTS = "vllm:spec_decode_num_drafts"
"""vLLM's counter of speculative drafts (one per request per decode step that drafted)."""
SPEC_ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens"
"""vLLM's counter of accepted draft tokens."""


@dataclass(frozen=True)
class Scrapes:
    """The exposition text(s) one `cgtune workload from-metrics` run reads, and the series it selects."""

    after: str
    """The later scrape (or the only one)."""
    where: str
    """How errors name the later scrape (a file, `stdin`, a URL)."""
    before: str | None = None
    """The earlier scrape of an interval; None: everything since the server started counts."""
    before_where: str = "--before"
    """How errors name the earlier scrape."""
    interval_where: str = "--before"
    """How errors about the pair (counts that went down) name it."""
    elapsed_s: float | None = None
    """Seconds between the two scrapes (measured with --wait, given with --elapsed); None: not known."""
    engine: str | None = None
    """Only series with label engine=this (--engine); None: all summed."""
    model_name: str | None = None
    """Only series with label model_name=this (--model-name); None: all summed."""


# --------------------------------------------------------------------------- counters
def parse_counter(text: str, name: str, *, where: str = "metrics") -> dict[LabelKey, float]:
    """Every series of counter `name` (as vLLM declares it, e.g. `vllm:request_success`): the samples named
    `<name>_total`, which is how prometheus_client exports a counter and its text parser reads it back."""
    sample_name = f"{name}_total"
    out: dict[LabelKey, float] = {}
    for family in exposition_families(text, where=where):
        for sample in family.samples:
            if sample.name != sample_name:
                continue
            key: LabelKey = tuple(sorted(sample.labels.items()))
            value = float(sample.value)
            shown = sample_name + ("{" + ",".join(f'{k}="{v}"' for k, v in key) + "}" if key else "")
            if not math.isfinite(value) or value < 0:
                raise TrafficError(f"{where}: {shown} is {value:g} (a counter must be finite and >= 0)")
            out[key] = value
    if not out:
        raise MetricAbsent(f"{where}: no {sample_name} counter")
    return out


@dataclass(frozen=True)
class Counted:
    """A counter's total over the selected series (and the interval, when there is one)."""

    total: float
    """The sum over the selected series."""
    series: tuple[LabelKey, ...]
    """The label sets summed."""


def read_counter(scrapes: Scrapes, name: str) -> Counted:
    """Counter `name` summed over the selected series: its increase between the scrapes, or its value since the
    server started without an earlier scrape. A series that went down, or vanished, means the server restarted."""
    metric = f"{name}_total"
    late = select_series(parse_counter(scrapes.after, name, where=scrapes.where), engine=scrapes.engine,
                         model_name=scrapes.model_name, where=scrapes.where, metric=metric)
    if scrapes.before is None:
        return Counted(sum(late.values()), tuple(sorted(late)))
    try:
        early = select_series(parse_counter(scrapes.before, name, where=scrapes.before_where), engine=scrapes.engine,
                              model_name=scrapes.model_name, where=scrapes.before_where, metric=metric)
    except MetricAbsent:
        early = {}  # the counter (or the selected series) had no samples yet at the earlier scrape
    for key, value in early.items():
        labels = "{" + ",".join(f'{k}="{v}"' for k, v in key) + "}" if key else ""
        if key not in late:
            raise TrafficError(f"{scrapes.interval_where}: {metric}{labels} is in the earlier scrape but not the "
                               "later one (server restarted, or the scrapes are swapped?)")
        if late[key] < value:
            raise TrafficError(f"{scrapes.interval_where}: {metric}{labels} went down between the scrapes "
                               f"({value:g} -> {late[key]:g}: server restarted, or the scrapes are swapped?)")
    # A series new in the later scrape started after the earlier one: all of its count is new.
    return Counted(sum(v - early.get(k, 0.0) for k, v in late.items()), tuple(sorted(late)))


def read_histogram(scrapes: Scrapes, metric: str) -> TokenHistogram:
    """Histogram `metric` summed over the selected series, only what was observed between the scrapes when there
    are two."""
    series = select_series(parse_exposition(scrapes.after, metric, where=scrapes.where), engine=scrapes.engine,
                           model_name=scrapes.model_name, where=scrapes.where, metric=metric)
    if scrapes.before is not None:
        early = parse_exposition(scrapes.before, metric, where=scrapes.before_where)
        try:
            early = select_series(early, engine=scrapes.engine, model_name=scrapes.model_name,
                                  where=scrapes.before_where, metric=metric)
        except MetricAbsent:
            early = {}  # the selected series had no observations yet at the earlier scrape
        series = interval(series, early, where=scrapes.interval_where)
    return combine(series, where=scrapes.where, metric=metric)


# --------------------------------------------------------------------------- lengths
@dataclass(frozen=True)
class PlacedLengths:
    """A length histogram's requests, each bucket's at one length, and what had to be moved to get there."""

    counts: dict[int, float]
    """Length -> requests."""
    notes: list[str] = field(default_factory=list)
    """Sentences on what was clipped or moved."""


def representative_lengths(hist: TokenHistogram, max_model_len: int, *, metric: str = PROMPT_TOKENS,
                           where: str = "metrics") -> PlacedLengths:
    """Each bucket's requests at one length: the middle whole length of the bucket, rounded down, i.e.
    `(first + last) // 2` over the whole lengths `first..last` inside `(lower, upper]` (vLLM's 1-2-5 bounds give
    the midpoint of the bounds: (10, 20] -> 15, (20, 50] -> 35), the `+Inf` bucket ending at max_model_len.
    A bucket reaching past max_model_len ends there; one wholly above it (a server with a longer max_model_len
    than the base spec) sits at max_model_len; requests of 0 tokens (a bucket le=0) count as 1 token."""
    counts: dict[int, float] = {}
    notes: list[str] = []
    for lower, upper, requests in hist.buckets():
        if requests <= 0:
            continue
        if upper < 1:
            counts[1] = counts.get(1, 0.0) + requests
            notes.append(f"{requests:g} requests of {metric} in bucket le={upper:g} (no tokens) counted at 1 token.")
            continue
        first = math.floor(lower) + 1
        last = math.floor(upper) if math.isfinite(upper) else max_model_len
        if first > last and math.isfinite(upper):
            raise TrafficError(f"{where}: {requests:g} requests of {metric} fall in bucket ({lower:g}, {upper:g}], "
                               "which holds no whole token count")
        if first > max_model_len:
            counts[max_model_len] = counts.get(max_model_len, 0.0) + requests
            notes.append(f"{requests:g} requests of {metric} longer than {lower:g} tokens, above the base spec's "
                         f"serving.max_model_len={max_model_len}, counted at {max_model_len}.")
            continue
        if not math.isfinite(upper):
            notes.append(f"{requests:g} requests of {metric} above its largest bound ({lower:g}) counted at "
                         f"{(first + max_model_len) // 2}, the middle of {first}..max_model_len={max_model_len}.")
        elif last > max_model_len:
            notes.append(f"{requests:g} requests of {metric} in bucket ({lower:g}, {upper:g}] counted at "
                         f"{(first + max_model_len) // 2}, the middle of {first}..max_model_len={max_model_len}.")
        last = min(last, max_model_len)
        length = (first + last) // 2
        counts[length] = counts.get(length, 0.0) + requests
    return PlacedLengths(counts, notes)


def _cap(counts: Mapping[int, float], limit: int) -> tuple[dict[int, float], float]:
    out: dict[int, float] = {}
    moved = 0.0
    for length, requests in counts.items():
        if length > limit:
            moved += requests
        kept = min(length, limit)
        out[kept] = out.get(kept, 0.0) + requests
    return out, moved


def fit_model_len(prompt: Mapping[int, float], output: Mapping[int, float], max_model_len: int
                  ) -> tuple[dict[int, float], dict[int, float], str | None]:
    """Lengths whose longest prompt plus longest output fit max_model_len (the workload loader demands it: vLLM
    refuses a longer request, and the simulator draws prompt and output independently). When they do not, the
    two longest are cut in proportion to their lengths: prompts above P = floor(max_model_len x longest prompt /
    (longest prompt + longest output)) count at P, outputs above max_model_len - P at that; the sentence says so."""
    longest_prompt, longest_output = max(prompt), max(output)
    if longest_prompt + longest_output <= max_model_len:
        return dict(prompt), dict(output), None
    if max_model_len < 2:
        raise TrafficError(f"serving.max_model_len={max_model_len}: a request needs at least 1 prompt and 1 output "
                           "token")
    prompt_cap = max_model_len * longest_prompt // (longest_prompt + longest_output)
    prompt_cap = min(max(prompt_cap, 1), max_model_len - 1)
    output_cap = max_model_len - prompt_cap
    new_prompt, moved_prompt = _cap(prompt, prompt_cap)
    new_output, moved_output = _cap(output, output_cap)
    moved = [f"{n:g} requests' {what} counted at {cap} tokens"
             for n, what, cap in ((moved_prompt, "prompts", prompt_cap), (moved_output, "outputs", output_cap)) if n]
    note = (f"The longest prompt ({longest_prompt}) and output ({longest_output}) exceed serving.max_model_len="
            f"{max_model_len} together, so they were cut in proportion to their lengths to {prompt_cap} + "
            f"{output_cap}: {', '.join(moved)}.")
    return new_prompt, new_output, note


def _six(value: float) -> float | int:
    """Six significant digits: as the widths' weights, more would only pretend precision."""
    rounded = float(f"{value:.6g}")
    return int(rounded) if rounded.is_integer() else rounded


def _mean(counts: Mapping[int, float]) -> float:
    return sum(v * w for v, w in counts.items()) / sum(counts.values())


# --------------------------------------------------------------------------- the load
@dataclass(frozen=True)
class ObservedLoad:
    """The `traffic.load` the scrapes support, or why they support none."""

    section: dict[str, object] | None
    """The `traffic.load` mapping (rate_per_s, prompt_tokens, output_tokens, acceptance when speculating); None
    when the scrapes lack something it needs."""
    facts: list[str] = field(default_factory=list)
    """Sentences saying where each figure came from (for traffic.source_note and the file's header)."""
    missing: str | None = None
    """Why there is no load (one line), None when there is one."""


def _absent(reason: str) -> ObservedLoad:
    return ObservedLoad(None, missing=reason)


def observed_load(scrapes: Scrapes, *, q: int, max_model_len: int) -> ObservedLoad:
    """The load between two scrapes: rate = finished requests / elapsed seconds (in a steady state requests
    arrive as fast as they finish), prompt and output lengths from vLLM's per-request histograms (each bucket at
    `representative_lengths`), and when speculating (q > 1) vLLM's mean acceptance length
    1 + accepted tokens / drafts, clipped to [1, q]. Missing metrics give no load and a reason; corrupt ones, or
    counts that went down between the scrapes, are a TrafficError."""
    if scrapes.before is None:
        return _absent("one scrape gives no request rate (use --wait SECONDS, or --before EARLIER with --elapsed "
                       "SECONDS)")
    if scrapes.elapsed_s is None:
        return _absent("--before without --elapsed: the seconds between the two scrapes are unknown, so there is "
                       "no request rate (give --elapsed SECONDS)")
    if not (math.isfinite(scrapes.elapsed_s) and scrapes.elapsed_s > 0):
        raise TrafficError(f"--elapsed: {scrapes.elapsed_s!r} must be a number of seconds > 0")
    elapsed = scrapes.elapsed_s
    try:
        finished = read_counter(scrapes, REQUEST_SUCCESS)
    except MetricAbsent as exc:
        return _absent(f"{exc} (the finished-request counter the rate comes from)")
    if finished.total <= 0:
        return _absent(f"no request finished between the scrapes ({REQUEST_SUCCESS}_total did not grow)")
    rate = finished.total / elapsed

    placed: dict[str, PlacedLengths] = {}
    observed_means: dict[str, float | None] = {}
    requests: dict[str, float] = {}
    for metric in (PROMPT_TOKENS, GENERATION_TOKENS):
        try:
            hist = read_histogram(scrapes, metric)
        except MetricAbsent as exc:
            return _absent(f"{exc} (an older vLLM, or not a vLLM server?)")
        if hist.count <= 0:
            return _absent(f"{metric} observed no request between the scrapes")
        placed[metric] = representative_lengths(hist, max_model_len, metric=metric, where=scrapes.where)
        observed_means[metric] = hist.sum / hist.count if hist.sum is not None else None
        requests[metric] = hist.count

    acceptance = None
    acceptance_fact = None
    if q > 1:
        try:
            drafts = read_counter(scrapes, SPEC_DRAFTS)
            accepted = read_counter(scrapes, SPEC_ACCEPTED_TOKENS)
        except MetricAbsent as exc:
            return _absent(f"the base spec speculates (q={q}) but {exc}, so the acceptance is unknown "
                           "(is speculative decoding on in the server?)")
        if drafts.total <= 0:
            return _absent(f"the base spec speculates (q={q}) but {SPEC_DRAFTS}_total did not grow between the "
                           "scrapes, so the acceptance is unknown")
        raw = 1 + accepted.total / drafts.total
        acceptance = min(max(raw, 1.0), float(q))
        acceptance_fact = (f"traffic.load.acceptance: 1 + {accepted.total:g} accepted draft tokens / {drafts.total:g} "
                           f"drafts ({SPEC_ACCEPTED_TOKENS}_total / {SPEC_DRAFTS}_total, vLLM's mean acceptance "
                           f"length) = {raw:.4g} tokens per decode step")
        acceptance_fact += "." if acceptance == raw else f", clipped to {acceptance:g} (1..q={q})."

    prompt, output, fit_note = fit_model_len(placed[PROMPT_TOKENS].counts, placed[GENERATION_TOKENS].counts,
                                             max_model_len)
    section: dict[str, object] = {
        "rate_per_s": _six(rate),
        "prompt_tokens": {"kind": "histogram", "counts": {v: _six(w) for v, w in sorted(prompt.items())}},
        "output_tokens": {"kind": "histogram", "counts": {v: _six(w) for v, w in sorted(output.items())}},
    }
    if acceptance is not None:
        section["acceptance"] = _six(acceptance)

    facts = [(f"traffic.load.rate_per_s: {finished.total:g} requests finished ({REQUEST_SUCCESS}_total, every "
              f"finished_reason summed) in {elapsed:.6g} s = {rate:.6g} requests/s (in a steady state requests "
              "arrive as fast as they finish).")]
    facts.append(f"Lengths: each bucket's requests at its middle whole length, rounded down ((first + last) // 2 "
                 f"of the whole lengths in the bucket; the +Inf bucket ends at max_model_len={max_model_len}).")
    parts = (("prompt_tokens", PROMPT_TOKENS, prompt), ("output_tokens", GENERATION_TOKENS, output))
    for key, metric, lengths in parts:
        seen = observed_means[metric]
        mean = f"mean {seen:.1f} tokens observed (_sum/_count), {_mean(lengths):.1f} here" if seen is not None \
            else f"mean {_mean(lengths):.1f} tokens here"
        facts.append(f"traffic.load.{key}: {metric} of {requests[metric]:g} requests; {mean}.")
        facts += placed[metric].notes
    if fit_note:
        facts.append(fit_note)
    if acceptance_fact:
        facts.append(acceptance_fact)
    return ObservedLoad(section, facts)
