"""The load a deployment will see, as data: how requests arrive (Poisson at a rate, or given arrival times), how long
their prompts and outputs are, and how many tokens speculation accepts per step; validated once here (the workload's
`traffic.load` section is read into it by `parse_load`) so the simulator (`tuner.load`) reads plain numbers."""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tuner.fields import FieldReader, WorkloadError

__all__ = ["Lengths", "Load", "LoadError", "parse_load"]


class LoadError(ValueError):
    """A load that cannot be simulated; the message names the field and its value on one line."""


@dataclass(frozen=True)
class Lengths:
    """Token lengths of requests: fixed (`min == max`), uniform over min..max inclusive, or a weighted histogram
    (`counts`, e.g. vLLM's `vllm:request_prompt_tokens` read by `cgtune workload from-metrics`), drawn with the
    seed."""

    min: int
    """Shortest length (tokens), >= 1 (a histogram: its smallest value)."""
    max: int | None = None
    """Longest length (tokens), >= min; None: fixed at `min` (a histogram: its largest value)."""
    counts: tuple[tuple[int, float], ...] = ()
    """`(length, weight)` pairs of a histogram, ascending, weights >= 0 and not all 0; () for fixed or uniform."""

    def __post_init__(self) -> None:
        if self.counts:
            pairs = tuple(sorted((v, float(w)) for v, w in self.counts))
            bad = [v for v, w in pairs if isinstance(v, bool) or not isinstance(v, int) or v < 1]
            if bad:
                raise LoadError(f"Lengths.counts holds length {bad[0]!r}: every length must be an integer >= 1")
            if any(not math.isfinite(w) or w < 0 for _, w in pairs) or not sum(w for _, w in pairs) > 0:
                raise LoadError(f"Lengths.counts={self.counts!r}: weights must be finite, >= 0 and not all 0")
            pairs = tuple((v, w) for v, w in pairs if w > 0)
            object.__setattr__(self, "counts", pairs)
            object.__setattr__(self, "min", pairs[0][0])
            object.__setattr__(self, "max", pairs[-1][0])
        if self.max is None:
            object.__setattr__(self, "max", self.min)
        if not isinstance(self.min, int) or isinstance(self.min, bool) or self.min < 1:
            raise LoadError(f"Lengths.min={self.min!r} must be an integer >= 1")
        if not isinstance(self.max, int) or isinstance(self.max, bool) or self.max < self.min:
            raise LoadError(f"Lengths.max={self.max!r} must be an integer >= min={self.min}")

    @property
    def mean(self) -> float:
        if self.counts:
            total = sum(w for _, w in self.counts)
            return sum(v * w for v, w in self.counts) / total
        assert self.max is not None
        return (self.min + self.max) / 2

    def as_dict(self) -> dict[str, object]:
        if self.counts:
            return {"kind": "histogram", "counts": {v: w for v, w in self.counts}}
        return {"min": self.min, "max": self.max}


@dataclass(frozen=True)
class Load:
    """Arrivals, lengths and acceptance of one load. Exactly one of `rate_per_s` and `arrival_times_s` is set."""

    prompt_tokens: Lengths
    """Prompt length of each request (tokens)."""
    output_tokens: Lengths
    """Output length of each request (tokens generated, the first token included)."""
    rate_per_s: float | None = None
    """Poisson arrival rate (requests/s), > 0; None when `arrival_times_s` gives the arrivals."""
    arrival_times_s: tuple[float, ...] | None = None
    """Given arrival times (s, >= 0, sorted here), e.g. a trace's; None for Poisson arrivals."""
    acceptance: float = 1.0
    """Mean tokens a decode step advances a request by (the first token of the step plus accepted draft tokens):
    >= 1, at most the workload's q = 1 + num_speculative_tokens; 1 without speculation."""
    seed: int = 0
    """Seed of every draw (gaps, lengths, acceptance); two simulations with one seed share their random numbers."""
    notes: tuple[str, ...] = field(default=(), compare=False)
    """Where the load came from (free text, carried into the result)."""

    def __post_init__(self) -> None:
        if (self.rate_per_s is None) == (self.arrival_times_s is None):
            raise LoadError(f"Load.rate_per_s={self.rate_per_s!r}: give exactly one of rate_per_s and arrival_times_s")
        if self.rate_per_s is not None:
            rate = self.rate_per_s
            if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate <= 0:
                raise LoadError(f"Load.rate_per_s={rate!r} must be a finite number > 0")
        if self.arrival_times_s is not None:
            times = tuple(float(t) for t in self.arrival_times_s)
            bad = [t for t in times if not math.isfinite(t) or t < 0]
            if bad:
                raise LoadError(f"Load.arrival_times_s holds {bad[0]!r}: every arrival time must be finite and >= 0")
            if not times:
                raise LoadError("Load.arrival_times_s=() must hold at least one arrival")
            object.__setattr__(self, "arrival_times_s", tuple(sorted(times)))
        acc = self.acceptance
        if isinstance(acc, bool) or not isinstance(acc, (int, float)) or not math.isfinite(acc) or acc < 1:
            raise LoadError(f"Load.acceptance={acc!r} must be >= 1 (mean tokens per decode step; 1 without "
                            f"speculation)")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise LoadError(f"Load.seed={self.seed!r} must be an integer")

    def check_query_len(self, q: int) -> None:
        """The acceptance cannot exceed what a decode step schedules (q tokens per request)."""
        if self.acceptance > q:
            raise LoadError(f"Load.acceptance={self.acceptance!r} must be <= q={q} (1 + num_speculative_tokens)")

    def at_rate(self, rate_per_s: float) -> Load:
        """This load's lengths, acceptance and seed at another Poisson rate."""
        return Load(self.prompt_tokens, self.output_tokens, rate_per_s=rate_per_s, acceptance=self.acceptance,
                    seed=self.seed, notes=self.notes)

    def as_dict(self) -> dict[str, object]:
        return {"rate_per_s": self.rate_per_s,
                "arrivals": "poisson" if self.rate_per_s is not None else f"{len(self.arrival_times_s or ())} given",
                "prompt_tokens": self.prompt_tokens.as_dict(), "output_tokens": self.output_tokens.as_dict(),
                "acceptance": self.acceptance, "seed": self.seed}



def _parse_lengths(r: FieldReader, key: str) -> Lengths:
    """A length field: a whole number (fixed), `{min, max}` (uniform) or `{kind: histogram, counts: {length: weight}}`."""
    value = r.raw(key)
    where = r.at(key)
    if value is None:
        raise WorkloadError(f"{where}: missing (a length in tokens, {{min, max}} or a histogram)")
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise WorkloadError(f"{where}: {value} must be >= 1")
        return Lengths(value)
    sub = FieldReader(value, where)
    kind = sub.str("kind", "uniform", choices=("uniform", "histogram"))
    if kind == "uniform":
        lo = sub.int("min", minimum=1)
        hi = sub.int("max", lo, minimum=1)
        if hi < lo:
            raise WorkloadError(f"{sub.at('max')}: {hi} must be >= min={lo}")
        sub.done()
        return Lengths(lo, hi)
    counts = sub.raw("counts")
    if not isinstance(counts, Mapping) or not counts:
        raise WorkloadError(f"{sub.at('counts')}: {counts!r} must be a non-empty mapping of length: weight")
    pairs = []
    for length, weight in counts.items():
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise WorkloadError(f"{sub.at('counts')}.{length}: the length must be an integer >= 1")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight < 0:
            raise WorkloadError(f"{sub.at('counts')}.{length}: {weight!r} must be a weight >= 0")
        pairs.append((length, float(weight)))
    if not sum(w for _, w in pairs) > 0:
        raise WorkloadError(f"{sub.at('counts')}: weights must not all be 0")
    sub.done()
    return Lengths(pairs[0][0], counts=tuple(pairs))


def _read_arrivals(path: Path, where: str) -> tuple[float, ...]:
    """A CSV with an `arrival_s` column (seconds from the trace's start), one row per request."""
    if not path.is_file():
        raise WorkloadError(f"{where}: {str(path)!r} is not a file")
    times: list[float] = []
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        if not reader.fieldnames or "arrival_s" not in reader.fieldnames:
            raise WorkloadError(f"{where}: {path.name} needs an arrival_s column")
        for line, row in enumerate(reader, start=2):
            try:
                t = float(row["arrival_s"])
            except (TypeError, ValueError):
                raise WorkloadError(f"{where}: {path.name} line {line}: arrival_s={row['arrival_s']!r} is not a "
                                    f"number") from None
            if not math.isfinite(t) or t < 0:
                raise WorkloadError(f"{where}: {path.name} line {line}: arrival_s={t!r} must be finite and >= 0")
            times.append(t)
    if not times:
        raise WorkloadError(f"{where}: {path.name} holds no arrivals")
    return tuple(times)


def parse_load(r: FieldReader, q: int, max_model_len: int, base_dir: Path) -> Load:
    """The workload's `traffic.load` section: `rate_per_s` (Poisson) or `arrivals` (a CSV of arrival times, relative
    to the workload file), `prompt_tokens`, `output_tokens`, `acceptance` (required when speculating: q > 1) and
    `seed`; every error names the field."""
    rate = r.float("rate_per_s", None, minimum=0.0, exclusive_minimum=True)
    arrivals = None
    if r.has("arrivals"):
        if rate is not None:
            raise WorkloadError(f"{r.at('arrivals')}: give rate_per_s or arrivals, not both")
        arrivals = _read_arrivals(base_dir / r.str("arrivals"), r.at("arrivals"))
    elif rate is None:
        raise WorkloadError(f"{r.at('rate_per_s')}: missing (requests/s of Poisson arrivals, or arrivals: a CSV of "
                            f"arrival times)")
    prompt = _parse_lengths(r, "prompt_tokens")
    output = _parse_lengths(r, "output_tokens")
    if q > 1 and not r.has("acceptance"):
        raise WorkloadError(f"{r.at('acceptance')}: missing (mean tokens a decode step advances a request by, 1..q={q}:"
                            f" 1 + accepted draft tokens; `cgtune workload from-metrics` reads it from "
                            f"vllm:spec_decode_*)")
    acceptance = r.float("acceptance", 1.0, minimum=1.0, maximum=float(q))
    seed = r.int("seed", 0)
    r.done()
    assert prompt.max is not None and output.max is not None
    if prompt.max + output.max > max_model_len:
        # vLLM refuses such a request; the simulator, which keeps no length limit, would serve it.
        raise WorkloadError(f"{r.at('output_tokens')}: the longest prompt ({prompt.max}) and output ({output.max}) "
                            f"exceed serving.max_model_len={max_model_len} (vLLM would refuse the request)")
    return Load(prompt, output, rate_per_s=rate, arrival_times_s=arrivals, acceptance=acceptance, seed=seed)
