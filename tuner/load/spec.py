"""The load a deployment will see, as data: how requests arrive (Poisson at a rate, or given arrival times), how long
their prompts and outputs are, and how many tokens speculation accepts per step; validated once here so the
simulator reads plain numbers."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["Lengths", "Load", "LoadError"]


class LoadError(ValueError):
    """A load that cannot be simulated; the message names the field and its value on one line."""


@dataclass(frozen=True)
class Lengths:
    """Token lengths of requests: fixed (`min == max`) or uniform over min..max inclusive, drawn with the seed."""

    min: int
    """Shortest length (tokens), >= 1."""
    max: int | None = None
    """Longest length (tokens), >= min; None: fixed at `min`."""

    def __post_init__(self) -> None:
        if self.max is None:
            object.__setattr__(self, "max", self.min)
        if not isinstance(self.min, int) or self.min < 1:
            raise LoadError(f"Lengths.min={self.min!r} must be an integer >= 1")
        if not isinstance(self.max, int) or self.max < self.min:
            raise LoadError(f"Lengths.max={self.max!r} must be an integer >= min={self.min}")

    @property
    def mean(self) -> float:
        assert self.max is not None
        return (self.min + self.max) / 2

    def as_dict(self) -> dict[str, object]:
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

