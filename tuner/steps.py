"""The step distribution every later stage weighs latencies by: the traffic a workload describes (decode requests,
mixed steps, observed widths or a trace) turned into kinds of engine step with their probabilities, each decode step
carrying its requests and query length (a dynamic speculative schedule's tier)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from collections.abc import Sequence

__all__ = [
    "Distribution",
    "Step",
    "Traffic",
    "decode_steps_by_width",
    "mix_steps",
    "step_distribution",
    "uniform_decode_steps",
]


@dataclass(frozen=True)
class Distribution:
    """A distribution over positive integers: uniform over [min, max] or a weighted histogram."""

    kind: str
    """`uniform` or `histogram`."""
    min: int = 1
    """Smallest value (uniform)."""
    max: int = 1
    """Largest value (uniform)."""
    counts: tuple[tuple[int, float], ...] = ()
    """`(value, weight)` pairs (histogram); weights need not sum to 1."""

    def pmf(self) -> dict[int, float]:
        """Probability of each value."""
        if self.kind == "uniform":
            n = self.max - self.min + 1
            return {v: 1.0 / n for v in range(self.min, self.max + 1)}
        total = sum(w for _, w in self.counts)
        return {v: w / total for v, w in self.counts if w > 0}

    @property
    def largest(self) -> int:
        return self.max if self.kind == "uniform" else max(v for v, w in self.counts if w > 0)


@dataclass(frozen=True)
class Step:
    """One kind of engine step, what vLLM needs to dispatch it, and how often it happens."""

    num_tokens: int
    """Tokens in the step (its width)."""
    uniform_decode: bool
    """A decode step: no request is prefilling and every request has `query_len` tokens (FULL decode graphs of that
    query length apply). False: a mixed step, with a prompt chunk (or query lengths that differ)."""
    probability: float
    """Share of steps of this kind."""
    query_len: int | None = None
    """Tokens every request has: a decode step's 1 + K (a dynamic schedule's tier, or q when None); on a mixed step
    the prompt chunks' length when every request has it (vLLM V1 counts q such tokens as uniform), else None."""
    num_reqs: int | None = None
    """Requests in the step; None where the traffic does not say (a mixed step drawn by tokens)."""

    @property
    def sort_key(self) -> tuple[int, bool, int, int]:
        """Steps sort by width, mixed before decode (as `(width, uniform)` tuples sort), then query length."""
        return self.num_tokens, self.uniform_decode, self.query_len or 0, self.num_reqs or 0


@dataclass(frozen=True)
class Traffic:
    """What the engine's steps look like."""

    requests: Distribution | None = None
    """Requests in a uniform decode step (width = requests x q)."""
    mixed_share: float = 0.0
    """Share of steps that are mixed (prefill chunks with decodes): no uniform decode graph applies."""
    mixed_tokens: Distribution | None = None
    """Tokens in a mixed step."""
    mean_context_len: int = 2048
    """Mean tokens already in each request's KV cache during decode (attention cost)."""
    widths: Distribution | None = None
    """Observed step widths (tokens per step), e.g. from vLLM's iteration-tokens histogram."""
    trace: tuple[tuple[int, bool, int | None], ...] = ()
    """Per-step `(num_tokens, uniform_decode, num_reqs)` rows from a CSV trace (num_reqs None where the trace leaves
    it empty)."""
    source_note: str = ""
    """How the traffic was obtained and what was assumed (free text)."""


def decode_steps_by_width(query_lens: Sequence[int]) -> dict[int, tuple[int, int]]:
    """Width -> `(requests, query length)` of every uniform decode step of 1..R requests (`query_lens[n]`: the query
    length of a decode step of n requests, index 0 unused); the fewest requests win a width two tiers share."""
    return {n * query_lens[n]: (n, query_lens[n]) for n in range(len(query_lens) - 1, 0, -1)}


def step_distribution(traffic: Traffic, query_lens: Sequence[int]) -> list[Step]:
    """The traffic's kinds of step with probabilities summing to 1, sorted by width; `query_lens[n]` is the query
    length of a decode step of n requests (index 0 unused), as the engine resolves its speculative settings."""
    t = traffic
    by_width = decode_steps_by_width(query_lens)
    probs: dict[Step, float] = {}

    def add(width: int, uniform: bool, p: float, reqs: int | None = None) -> None:
        """A decode step carries its requests and query length (a dynamic schedule's tier), read off its width; a
        mixed step the requests its trace row names (the drafter's passes run at that many), else None."""
        if p > 0:
            n, query_len = (by_width.get(width) if uniform else None) or (reqs, None)
            kind = Step(width, uniform, 0.0, query_len, n)
            probs[kind] = probs.get(kind, 0.0) + p

    if t.trace:
        for width, uniform, reqs in t.trace:
            add(width, uniform, 1.0 / len(t.trace), reqs)
    elif t.widths is not None:
        # A width histogram does not say which steps were pure decode; assume the widths of a decode step of
        # max_num_seqs requests or fewer were (vLLM's metric has no such label).
        for width, p in t.widths.pmf().items():
            add(width, width in by_width, p)
    else:
        decode_share = 1.0 - t.mixed_share
        if t.requests is not None:
            for n, p in t.requests.pmf().items():
                # A dynamic schedule's tier steps are decode steps at their own query length.
                kind = Step(n * query_lens[n], True, 0.0, query_lens[n], n)
                probs[kind] = probs.get(kind, 0.0) + decode_share * p
        if t.mixed_tokens is not None:
            for width, p in t.mixed_tokens.pmf().items():
                add(width, False, t.mixed_share * p)
    return sorted((replace(kind, probability=p) for kind, p in probs.items() if p > 0), key=lambda st: st.sort_key)


def uniform_decode_steps(query_lens: Sequence[int], max_num_batched_tokens: int) -> list[Step]:
    """Decode traffic when no workload says (and the off-peak traffic a search may mix in): uniform decode steps of
    1..R requests within the token budget, each equally likely, each at its query length `query_lens[n]`."""
    kept = [n for n in range(1, len(query_lens)) if n * query_lens[n] <= max_num_batched_tokens]
    return [Step(n * query_lens[n], True, 1.0 / len(kept), query_lens[n], n) for n in kept]


def mix_steps(a: list[Step], b: list[Step], weight_b: float) -> list[Step]:
    """(1 - weight_b) x a + weight_b x b, merged by kind (everything a step says but its probability)."""
    out: dict[Step, float] = {}
    for steps, w in ((a, 1.0 - weight_b), (b, weight_b)):
        for st in steps:
            key = replace(st, probability=0.0)
            out[key] = out.get(key, 0.0) + w * st.probability
    return sorted((replace(k, probability=p) for k, p in out.items() if p > 0), key=lambda st: st.sort_key)
