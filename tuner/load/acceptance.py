"""How many tokens a decode step advances a request by under speculation: the mean is the load's acceptance, and the
spread is that of draft tokens accepted in a chain (each of the q - 1 drafts accepted with one probability while all
before it were, the first rejection ending the run), which is how speculative verification accepts a prefix."""

from __future__ import annotations

import numpy as np

from tuner.workload.load import LoadError

__all__ = ["AcceptanceDraws", "accepted_probabilities"]

_BLOCK = 1 << 16
"""Draws made at a time: one numpy call per block instead of one per step."""


def _chain_mean(p: float, drafts: int) -> float:
    return float(sum(p ** j for j in range(drafts + 1)))


def accepted_probabilities(acceptance: float, q: int) -> np.ndarray:
    """P(a step advances a request by 1..q tokens): the chain model whose mean is `acceptance` (its per-draft
    probability found by bisection to 1e-12, the mean rising from 1 at p = 0 to q at p = 1)."""
    if not 1 <= acceptance <= q:
        raise LoadError(f"acceptance={acceptance!r} must be in 1..q={q}")
    drafts = q - 1
    if drafts == 0:
        return np.ones(1)
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _chain_mean(mid, drafts) < acceptance else (lo, mid)
    p = (lo + hi) / 2
    # P(exactly j drafts accepted) = p^j (1 - p) before the last, p^drafts for all of them.
    probs = np.array([p ** j * (1 - p) for j in range(drafts)] + [p ** drafts])
    return probs / probs.sum()


class AcceptanceDraws:
    """Tokens each scheduled decode advances a request by, drawn in blocks from the chain model, seeded."""

    def __init__(self, acceptance: float, q: int, seed: np.random.SeedSequence) -> None:
        self.probabilities = accepted_probabilities(acceptance, q)
        self._cdf = np.cumsum(self.probabilities)
        self._cdf[-1] = 1.0
        self._rng = np.random.default_rng(seed)
        self._buf = np.empty(0, dtype=np.int64)
        self._pos = 0

    def take(self, n: int) -> np.ndarray:
        """`n` draws, each in 1..q."""
        if self._pos + n > len(self._buf):
            fresh = np.searchsorted(self._cdf, self._rng.random(max(_BLOCK, n)), side="right") + 1
            self._buf = np.concatenate([self._buf[self._pos:], fresh.astype(np.int64)])
            self._pos = 0
        out = self._buf[self._pos:self._pos + n]
        self._pos += n
        return out
