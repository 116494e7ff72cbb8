"""The step distribution every later stage weighs latencies by: the traffic a workload describes (decode requests,
mixed steps, observed widths or a trace) turned into kinds of engine step with their probabilities, each decode step
carrying its requests and query length (a dynamic speculative schedule's tier)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

__all__ = [
    "DP_DRAWS",
    "Distribution",
    "RankSync",
    "Step",
    "Traffic",
    "agree",
    "decode_steps_by_width",
    "mix_steps",
    "rank_steps",
    "step_distribution",
    "uniform_decode_steps",
    "with_active_adapters",
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
class RankSync:
    """One joint draw of data-parallel ranks' steps, from one rank's point of view: what the engine's agreement needs
    beyond the agreed step (`tuner.engines.vllm.data_parallel`)."""

    own_tokens: int
    """This rank's own step width."""
    own_utc: int
    """The uniform token count this rank's own step dispatches with (0: none)."""
    widest: tuple[tuple[int, int], ...]
    """`(uniform token count (0: none), widest width)` of each kind of step among the ranks, this one's included."""


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
    loras: int = 0
    """Distinct LoRA adapters active in the step (0: none, or no LoRA)."""
    ranks: RankSync | None = None
    """Under data parallelism: the ranks' joint draw this step stands for (then `num_tokens` is the widest rank's and
    `uniform_decode` / `query_len` what every rank shares); None: one rank."""

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
    active_loras: tuple[tuple[int, float], ...] = ()
    """`(distinct LoRA adapters active, weight)` over steps (a LoRA deployment's adapter mix); empty: no LoRA."""


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


def with_active_adapters(steps: list[Step], mix: Sequence[tuple[int, float]]) -> list[Step]:
    """Each step split by the adapter mix `(active adapters, weight)`: a step of n requests has at most n adapters
    active, so its draws above n count as n."""
    total = sum(w for _, w in mix)
    out: dict[Step, float] = {}
    for st in steps:
        for active, w in mix:
            if w > 0:
                kind = replace(st, probability=0.0, loras=min(active, st.num_reqs or active))
                out[kind] = out.get(kind, 0.0) + st.probability * w / total
    return sorted((replace(k, probability=p) for k, p in out.items() if p > 0), key=lambda st: st.sort_key)


DP_DRAWS = 20_000
"""Joint draws of the ranks' steps when there are too many joint steps to list (`rank_steps`)."""
_EXACT_JOINT = 50_000
"""Most joint steps `rank_steps` lists one by one."""


def rank_steps(steps: list[Step], ranks: int, utc: Sequence[int], *, seed: int = 0, draws: int = DP_DRAWS
               ) -> list[Step]:
    """One rank's steps under data parallelism over `ranks` ranks, each drawing its step from `steps` independently:
    every joint draw as the agreed step (the widest rank's width; decode at the query length every rank shares, else
    mixed) carrying this rank's own requests and adapters, and the draw's `RankSync`. `utc[i]`: the uniform token count
    step i dispatches with (0: none). Every joint step is listed while there are at most _EXACT_JOINT of them; beyond,
    `draws` seeded joint draws stand for the distribution."""
    if ranks <= 1 or not steps:
        return steps
    probs = np.array([st.probability for st in steps], dtype=float)
    probs = probs / probs.sum()
    n = len(steps)
    if n ** ranks <= _EXACT_JOINT:
        grid = np.indices((n,) * ranks).reshape(ranks, -1).T
        weights = np.prod(probs[grid], axis=1)
    else:
        grid = np.random.default_rng(seed).choice(n, size=(draws, ranks), p=probs)
        weights = np.full(draws, 1.0 / draws)
    keys = [(st.num_tokens, int(u)) for st, u in zip(steps, utc)]
    out: dict[Step, float] = {}
    for row, w in zip(grid.tolist(), weights.tolist()):
        own = steps[row[0]]
        width, agreed, sync = agree([keys[i] for i in row])
        kind = Step(width, agreed > 0, 0.0, agreed or None, own.num_reqs, own.loras, sync)
        out[kind] = out.get(kind, 0.0) + w
    return sorted((replace(k, probability=p) for k, p in out.items() if p > 0), key=lambda st: st.sort_key)


def agree(draw: Sequence[tuple[int, int]], own: int = 0) -> tuple[int, int, RankSync]:
    """(agreed width, agreed uniform token count (0: none), the summary) of the ranks' `(width, uniform token count)`
    steps, for rank `own`: the widest rank's width, the count every rank shares (else none), and each kind's widest."""
    widest: dict[int, int] = {}
    for width, utc in draw:
        widest[utc] = max(widest.get(utc, 0), width)
    agreed = draw[0][1] if len(widest) == 1 else 0
    width, utc = draw[own]
    return max(w for w, _ in draw), agreed, RankSync(width, utc, tuple(sorted(widest.items())))
