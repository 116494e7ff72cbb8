"""The Lagrangian relaxation of the two-list program (`tuner.search.exact_split`): memory, capture seconds and graphs
priced per member (latency + lambda x bytes + mu x seconds + nu x graphs, `Prices`), the cheapest pair of lists,
exactly, in O(n log n) per decode top: a prefill chain's segment cost `body[j] x (M[j] - M[i]) + L[j] - L[i]` is linear
in `body[j]`, so its program is the lower envelope of one line per member (`cheapest_chain`), and decode tops whose
lower bound cannot beat the best pair found are never solved."""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Prices", "Relaxation", "cheapest_chain"]

_INF = math.inf


@dataclass(frozen=True)
class Prices:
    """What a member costs beyond its latency, in ms per unit of each resource."""

    memory: float = 0.0
    """ms per byte of the pool."""
    seconds: float = 0.0
    """ms per second of graph capture at start-up."""
    graphs: float = 0.0
    """ms per graph captured at start-up."""

    def bound(self, value: float, budget_bytes: float, seconds: float | None, graphs: int | None) -> float:
        """A lower bound on the latency of every pair within the budgets, from the relaxed optimum `value` at these
        prices (an unlimited resource must be priced 0)."""
        return value - self.memory * budget_bytes - self.seconds * (seconds or 0.0) - self.graphs * (graphs or 0)


def cheapest_chain(body: np.ndarray, mass: np.ndarray, lin: np.ndarray, price: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """f[j] = min over i < j of f[i] + body[j] x (mass[j] - mass[i]) + lin[j] - lin[i] + price[j], f[0] = 0, and the
    minimising i (index 0: the empty start). `mass` must not decrease: each i is the line -mass[i] x + f[i] - lin[i],
    added in order of falling slope to the lower envelope, which a query at x = body[j] reads by bisection over its
    breakpoints."""
    n = len(body) - 1
    bl, ml, ll, pl = body.tolist(), mass.tolist(), lin.tolist(), price.tolist()
    f = [0.0] * (n + 1)
    back = [0] * (n + 1)
    slopes, heights, owners, breaks = [-ml[0]], [-ll[0]], [0], [-_INF]
    for j in range(1, n + 1):
        x = bl[j]
        k = bisect_right(breaks, x) - 1
        value = x * ml[j] + ll[j] + pl[j] + heights[k] + slopes[k] * x
        f[j], back[j] = value, owners[k]
        a, b = -ml[j], value - ll[j]
        while slopes:
            a2, b2 = slopes[-1], heights[-1]
            if a >= a2:  # the same slope (no mass between them): the lower line alone counts
                if b >= b2:
                    break
            else:
                cross = (b - b2) / (a2 - a)  # from here on the new line lies below the last
                if cross > breaks[-1]:
                    slopes.append(a)
                    heights.append(b)
                    owners.append(j)
                    breaks.append(cross)
                    break
            slopes.pop()
            heights.pop()
            owners.pop()
            breaks.pop()
        if not slopes:
            slopes, heights, owners, breaks = [a], [b], [j], [-_INF]
    return np.array(f), np.array(back, dtype=np.int64)


def _walk(sizes: np.ndarray, back: np.ndarray, j: int) -> list[int]:
    out = []
    while j > 0:
        out.append(int(sizes[j]))
        j = int(back[j])
    return out


def _free_chain(chain: Any, price: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The decode chain's program without memory (at most max_num_seqs members: a dense matrix): f[j], the least cost
    of a chain topped by j (members priced), and the member before j."""
    n = len(chain.sizes) - 1
    f = np.full(n + 1, _INF)
    f[0] = 0.0
    back = np.zeros(n + 1, dtype=np.int64)
    for j in range(1, n + 1):
        cand = f[:j] + chain.cost[:j, j]
        i = int(np.argmin(cand))
        f[j], back[j] = cand[i] + price[j], i
    return f, back


class Relaxation:
    """The cheapest pair at any prices, for one problem: the decode chain as a dense program, the prefill chain per
    decode top by `cheapest_chain`, each top solved only where a lower bound (the prefill chain without the decode
    steps its top leaves to it, plus the least each of those steps can cost) could beat the best pair found. `p`:
    `tuner.search.exact_split`'s problem (its chains and step sums), which imports this module."""

    def __init__(self, p: Any, seconds_of: Callable[[str, np.ndarray], np.ndarray],
                 count: Callable[[int], None]) -> None:
        self.p, self.count = p, count
        self.dchain = dchain = p.decode_chain()
        self.tops = tops = np.array([0] + list(p.pre), dtype=np.int64)
        self.body = p.token_body(tops)
        self.mass = p._at(p._mw, p._mp, tops)
        self.lin = p._at(p._mw, p._ml, tops)
        self.eag = p._at(p._mw, p._me, tops)
        self.tok_delta, self.tok_alone = p.token_bytes(tops)
        self.tok_extra = np.maximum(self.tok_alone - self.tok_delta, 0.0)
        self.tok_extra[0] = 0.0
        q = p.q
        self.spills = [0.0] + [float(q * -k) for k in dchain.sizes[1:]]
        """Per decode top (0: none), the width above which decode steps spill to the prefill chain."""
        self.none = [p.spill_eager(s) for s in self.spills]
        dec_widths = np.array([q * -k for k in dchain.sizes[1:]], dtype=np.int64)
        # Capture seconds and graphs per member: each decode size its FULL graph, each prefill size its graph of the
        # mixed mode (the drafter's graphs are not priced: the bound holds with less charged than a list captures).
        self.dec_seconds = np.concatenate([[0.0], seconds_of("FULL", dec_widths)]) if len(dec_widths) else \
            np.zeros(1)
        self.tok_seconds = np.concatenate([[0.0], seconds_of(p.token_mode, tops[1:])]) if len(tops) > 1 else \
            np.zeros(1)
        self.dec_graphs = np.concatenate([[0.0], np.ones(len(dec_widths))])
        self.tok_graphs = np.concatenate([[0.0], np.ones(len(tops) - 1)])
        self._spill_floor = self._spilled_floor()

    def _spilled_floor(self) -> list[float]:
        """Per decode top, the least the decode steps it spills can cost in the prefill chain: each its eager step or
        the cheapest prefill graph at or above its width (a segment's latency is at least that), whichever is less."""
        p = self.p
        n = len(p._dw)
        if n == 0:
            return [0.0] * len(self.spills)
        mass, lin, eager = np.diff(p._dp), np.diff(p._sl), np.diff(p._de)
        suffix = np.minimum.accumulate(self.body[1:][::-1])[::-1] if len(self.body) > 1 else np.zeros(0)
        at = np.searchsorted(self.tops[1:], p._dw, side="left")  # the first prefill size >= each step's width
        graph = np.where(at < len(suffix), mass * np.append(suffix, _INF)[at] + lin, _INF)
        least = np.minimum(eager, graph)
        tail = np.concatenate([np.cumsum(least[::-1])[::-1], [0.0]])
        return [float(tail[np.searchsorted(p._dw, s, side="right")]) for s in self.spills]

    def solve(self, prices: Prices) -> tuple[float, list[int]]:
        """The cheapest pair's relaxed cost (latency + its priced resources) and keys."""
        p, dchain, lam = self.p, self.dchain, prices.memory
        pd = lam * dchain.delta + prices.seconds * self.dec_seconds + prices.graphs * self.dec_graphs
        pd[0] = 0.0
        fd, bd = _free_chain(dchain, pd)
        self.count(len(dchain.sizes))
        fixed = dchain.fixed if dchain.fixed is not None else np.zeros(len(dchain.sizes))
        fd = fd + dchain.tail + fixed * lam  # a decode list ending at its top
        extra_d = np.maximum(dchain.alone - dchain.delta - fixed, 0.0)
        extra_d[0] = 0.0
        fa = fd + extra_d * lam
        pt = lam * self.tok_delta + prices.seconds * self.tok_seconds + prices.graphs * self.tok_graphs
        pt[0] = 0.0
        base = self._token(pt, lam, np.inf, 0.0)[0] if len(self.tops) > 1 else _INF
        c0 = p.const_none
        # Per top: what is known exactly (the decode list alone, or no lists) and the bound with a prefill chain.
        options: list[tuple[float, float, int]] = []  # (bound with a prefill chain, exact without, top)
        best: tuple[float, list[int]] = (_INF, [])
        for t in range(len(self.spills)):
            with_tok = base + self._spill_floor[t] if math.isfinite(base) else _INF
            if t == 0:
                alone, bound = self.none[0] + c0, with_tok + c0
                keys: list[int] = []
            else:
                alone, bound = fa[t] + self.none[t], fd[t] + with_tok
                keys = _walk(dchain.sizes, bd, t)
            if alone < best[0]:
                best = (alone, keys)
            options.append((bound, alone, t))
        for bound, _, t in sorted(options):
            if bound >= best[0]:
                break
            tok, tok_keys = self._token(pt, lam, self.spills[t], float(extra_d[t]))
            value = tok + (c0 if t == 0 else fd[t])
            if value < best[0]:
                best = (value, (_walk(dchain.sizes, bd, t) if t else []) + tok_keys)
        return best

    def _token(self, price: np.ndarray, lam: float, spill: float, extra_d: float) -> tuple[float, list[int]]:
        """The prefill chain's least relaxed cost with the decode steps wider than `spill` in it (inf: none), the
        pair's widest activations at least `extra_d`, and its keys ([] and inf: no chain beats none)."""
        p = self.p
        # The decode steps a chain member serves: those between its predecessor's width (at least `spill`) and its own.
        dm = np.maximum(p._at(p._dw, p._dp, self.tops), p._at(p._dw, p._dp, spill))
        dl = np.maximum(p._at(p._sw, p._sl, self.tops), p._at(p._sw, p._sl, spill))
        eager_d = np.maximum(p._at(p._dw, p._de, self.tops), p._at(p._dw, p._de, spill))
        f, back = cheapest_chain(self.body, self.mass + dm, self.lin + dl, price)
        self.count(len(self.tops))
        tail = (p._me[-1] - self.eag) + (p._de[-1] - eager_d)
        ends = f + lam * np.maximum(self.tok_extra, extra_d) + tail
        j = int(np.argmin(ends[1:])) + 1
        return float(ends[j]), _walk(self.tops, back, j)

