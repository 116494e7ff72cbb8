"""Read a histogram (vLLM's `vllm:iteration_tokens_total` by default) out of a Prometheus text exposition (file, stdin
or URL)."""

from __future__ import annotations

import functools
import http.client
import math
import sys
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

__all__ = [
    "ITERATION_TOKENS",
    "LabelKey",
    "MetricAbsent",
    "TokenHistogram",
    "TrafficError",
    "combine",
    "exposition_families",
    "interval",
    "parse_exposition",
    "read_source",
    "select_series",
]

ITERATION_TOKENS = "vllm:iteration_tokens_total"
"""vLLM's histogram of tokens per engine step (a histogram despite the `_total` in its name)."""

LabelKey = tuple[tuple[str, str], ...]
"""One series' labels (all but `le`), sorted, so series from two scrapes can be matched."""


class TrafficError(ValueError):
    """Traffic input that cannot be used; the message is one line saying what is wrong with which input."""


class MetricAbsent(TrafficError):
    """The scrape lacks a metric (or the selected series of it): not corrupt input, just a server that exports less
    (an older vLLM, no speculative decoding), so a reader of an optional metric can carry on without it."""


_Series = TypeVar("_Series")


@dataclass(frozen=True)
class TokenHistogram:
    """A cumulative histogram of tokens per step: counts of steps with width <= each bound."""

    bounds: tuple[float, ...]
    """Finite upper bounds (`le`), ascending; the `+Inf` bucket is implied."""
    cumulative: tuple[float, ...]
    """Steps with width <= each bound, non-decreasing."""
    count: float
    """All steps (the `+Inf` bucket)."""
    sum: float | None = None
    """Total tokens over all steps (`_sum`), when exported."""
    series: tuple[LabelKey, ...] = ()
    """Label sets this histogram sums."""

    def buckets(self) -> list[tuple[float, float, float]]:
        """Non-cumulative `(lower, upper, steps)` per bucket, `lower < width <= upper`; the last upper is inf."""
        out = []
        lower, below = 0.0, 0.0
        for bound, cum in zip(self.bounds, self.cumulative):
            out.append((lower, bound, cum - below))
            lower, below = bound, cum
        out.append((lower, math.inf, self.count - below))
        return out

    @property
    def mean_width(self) -> float | None:
        return self.sum / self.count if self.sum is not None and self.count > 0 else None


def _label_text(key: LabelKey) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in key) + "}" if key else "(no labels)"


# --------------------------------------------------------------------------- reading
def read_source(source: str, *, timeout_s: float = 5.0, stdin: Iterable[str] | None = None) -> str:
    """The text behind SOURCE: `-` (stdin), an http(s):// URL (fetched with a short timeout) or a file path."""
    if source == "-":
        try:
            return "".join(stdin if stdin is not None else sys.stdin)
        except UnicodeDecodeError:
            raise TrafficError("stdin: not text (Prometheus exposition is UTF-8 text)") from None
    if source.startswith(("http://", "https://")):
        return _fetch(source, timeout_s)
    path = Path(source)
    if not path.is_file():
        raise TrafficError(f"{source}: no such file (give a file, '-' for stdin, or an http://host:port/metrics URL)")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise TrafficError(f"{source}: not text (Prometheus exposition is UTF-8 text)") from None
    except OSError as exc:
        raise TrafficError(f"{source}: cannot read ({exc.strerror or exc})") from None


def _fetch(url: str, timeout_s: float) -> str:
    # Ask for the classic text format; prometheus_client servers answer OpenMetrics only when asked.
    request = urllib.request.Request(url, headers={"Accept": "text/plain;version=0.0.4"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        raise TrafficError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        raise TrafficError(f"{url}: cannot reach ({exc.reason})") from None
    except (TimeoutError, OSError, http.client.HTTPException) as exc:
        raise TrafficError(f"{url}: cannot reach ({exc or 'timed out'})") from None
    except ValueError as exc:
        raise TrafficError(f"{url}: bad URL ({exc})") from None
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise TrafficError(f"{url}: the response is not text (Prometheus exposition is UTF-8 text)") from None


# --------------------------------------------------------------------------- parsing
def _parser():  # imported when parsing: every command's module loads at start, and a GPU host may lack the package
    from prometheus_client.parser import text_string_to_metric_families

    return text_string_to_metric_families


def _first_bad_line(text: str) -> str:
    """Locate the line the parser rejects, so the error can show it (the parser itself says no line)."""
    text_string_to_metric_families = _parser()
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            list(text_string_to_metric_families(stripped + "\n"))
        except Exception:  # noqa: BLE001 - the parser raises bare ValueError, IndexError, ...
            shown = stripped if len(stripped) <= 60 else stripped[:57] + "..."
            return f"line {number}: {shown!r}"
    return "a TYPE or HELP line"


@functools.lru_cache(maxsize=4)
def _families(text: str) -> tuple:
    # One scrape is read for several metrics (step widths, request lengths, counters): parse it once.
    text_string_to_metric_families = _parser()
    return tuple(text_string_to_metric_families(text))


def exposition_families(text: str, *, where: str = "metrics") -> tuple:
    """The metric families of a Prometheus text exposition; not exposition text, or no samples, is a TrafficError."""
    try:
        families = _families(text)
    except Exception:  # noqa: BLE001 - any parser failure means the input is not exposition text
        raise TrafficError(f"{where}: not Prometheus text exposition ({_first_bad_line(text)})") from None
    if not any(f.samples for f in families):
        raise TrafficError(f"{where}: no samples (not a Prometheus metrics exposition?)")
    return families


def parse_exposition(text: str, metric: str = ITERATION_TOKENS, *, where: str = "metrics") -> dict[LabelKey, TokenHistogram]:
    """Every series of histogram `metric` in a Prometheus text exposition, checked for consistency; a metric the
    scrape lacks is a MetricAbsent."""
    families = exposition_families(text, where=where)

    # Collect by sample name rather than by family: without TYPE lines the parser puts every sample in
    # its own untyped family, and the histogram must still be found.
    buckets: dict[LabelKey, dict[float, float]] = {}
    counts: dict[LabelKey, float] = {}
    sums: dict[LabelKey, float] = {}
    for family in families:
        for sample in family.samples:
            if sample.name not in (f"{metric}_bucket", f"{metric}_count", f"{metric}_sum"):
                continue
            labels = {k: v for k, v in sample.labels.items() if k != "le"}
            key: LabelKey = tuple(sorted(labels.items()))
            value = float(sample.value)
            if math.isnan(value) or math.isinf(value):
                raise TrafficError(f"{where}: {sample.name}{_label_text(key)} is {value} (counts must be finite)")
            if sample.name.endswith("_bucket"):
                if "le" not in sample.labels:
                    raise TrafficError(f"{where}: {sample.name}{_label_text(key)} has no le label")
                try:
                    bound = float(sample.labels["le"])
                except ValueError:
                    raise TrafficError(f"{where}: {sample.name}{_label_text(key)} has le={sample.labels['le']!r}, "
                                       "not a number") from None
                if value < 0:
                    raise TrafficError(f"{where}: {sample.name}{_label_text(key)} le={sample.labels['le']} "
                                       f"is {value:g} (counts must be >= 0)")
                buckets.setdefault(key, {})[bound] = value
            elif sample.name.endswith("_count"):
                if value < 0:
                    raise TrafficError(f"{where}: {sample.name}{_label_text(key)} is {value:g} (counts must be >= 0)")
                counts[key] = value
            else:
                sums[key] = value
    if not buckets:
        present = "only _count/_sum, no _bucket samples" if counts or sums else "not present"
        raise MetricAbsent(f"{where}: {metric} histogram {present} (is this a vLLM server's /metrics?)")

    out: dict[LabelKey, TokenHistogram] = {}
    for key, by_bound in sorted(buckets.items()):
        label = f"{metric}{_label_text(key)}"
        if math.inf not in by_bound:
            raise TrafficError(f"{where}: {label} has no le=\"+Inf\" bucket")
        bounds = sorted(b for b in by_bound if b != math.inf)
        cumulative = [by_bound[b] for b in bounds]
        total = by_bound[math.inf]
        previous, previous_bound = 0.0, None
        for bound, cum in zip([*bounds, math.inf], [*cumulative, total]):
            if cum < previous:
                raise TrafficError(f"{where}: {label} is not cumulative: le={bound:g} holds {cum:g} steps, "
                                   f"fewer than le={previous_bound:g} ({previous:g})")
            previous, previous_bound = cum, bound
        if key in counts and counts[key] != total:
            raise TrafficError(f"{where}: {label} _count={counts[key]:g} differs from its +Inf bucket {total:g}")
        out[key] = TokenHistogram(tuple(bounds), tuple(cumulative), total, sums.get(key), (key,))
    return out


# --------------------------------------------------------------------------- selecting and combining
def select_series(series: Mapping[LabelKey, _Series], *, engine: str | None = None, model_name: str | None = None,
                  where: str = "metrics", metric: str = ITERATION_TOKENS) -> dict[LabelKey, _Series]:
    """The series (of a histogram or a counter) whose `engine` / `model_name` labels match the filters (all of them
    without filters); none matching is a MetricAbsent."""
    chosen = dict(series)
    for label, wanted in (("engine", engine), ("model_name", model_name)):
        if wanted is None:
            continue
        matching = {k: h for k, h in chosen.items() if dict(k).get(label) == wanted}
        if not matching:
            values = sorted({dict(k)[label] for k in series if label in dict(k)})
            have = ", ".join(values) if values else f"no series has a {label} label"
            raise MetricAbsent(f"{where}: no {metric} series with {label}={wanted!r} (found: {have})")
        chosen = matching
    return chosen


def interval(after: Mapping[LabelKey, TokenHistogram], before: Mapping[LabelKey, TokenHistogram], *,
             where: str = "--before") -> dict[LabelKey, TokenHistogram]:
    """Per series, the steps observed between two scrapes; a series that went down means a restart."""
    missing = [k for k in before if k not in after]
    if missing:
        raise TrafficError(f"{where}: series {_label_text(missing[0])} is in the earlier scrape but not the later "
                           "one (server restarted, or the scrapes are swapped?)")
    out = {}
    for key, late in after.items():
        early = before.get(key)
        if early is None:
            out[key] = late  # an engine that started after the first scrape: all of its steps are new
            continue
        if early.bounds != late.bounds:
            raise TrafficError(f"{where}: series {_label_text(key)} has different bucket bounds in the two scrapes "
                               "(server restarted with other buckets?)")
        diffs = [b - a for a, b in zip((*early.cumulative, early.count), (*late.cumulative, late.count))]
        if any(d < 0 for d in diffs):
            raise TrafficError(f"{where}: series {_label_text(key)} counts went down between the scrapes "
                               "(server restarted, or the scrapes are swapped?)")
        total_sum = None if early.sum is None or late.sum is None else late.sum - early.sum
        difference = TokenHistogram(late.bounds, tuple(diffs[:-1]), diffs[-1], total_sum, (key,))
        # A cumulative histogram minus an earlier one must itself be cumulative; anything else is corrupt input.
        for a, b in zip(difference.cumulative, (*difference.cumulative[1:], difference.count)):
            if b < a:
                raise TrafficError(f"{where}: series {_label_text(key)}: the interval's counts are not cumulative "
                                   "(the scrapes do not come from one server run)")
        out[key] = difference
    return out


def combine(series: Mapping[LabelKey, TokenHistogram], *, where: str = "metrics",
            metric: str = ITERATION_TOKENS) -> TokenHistogram:
    """Sum series (engines, models) that share bucket bounds into one histogram."""
    if not series:
        raise TrafficError(f"{where}: no {metric} series selected")
    items = list(series.items())
    bounds = items[0][1].bounds
    for key, hist in items[1:]:
        if hist.bounds != bounds:
            raise TrafficError(f"{where}: series {_label_text(key)} has other bucket bounds than "
                               f"{_label_text(items[0][0])}; pick one with --engine or --model-name")
    cumulative = tuple(sum(h.cumulative[i] for _, h in items) for i in range(len(bounds)))
    sums = [h.sum for _, h in items]
    return TokenHistogram(
        bounds, cumulative, sum(h.count for _, h in items),
        None if any(s is None for s in sums) else sum(s for s in sums if s is not None),
        tuple(k for k, _ in items),
    )
