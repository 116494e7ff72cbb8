"""The exact solver for an engine whose list is two lists (vLLM 0.34: decode graphs by request count, prefill graphs by
token count), both costed against one KV cache sized after capture: the fastest pair whose REAL pool leaves the
required KV cache, proven, or the best found with a proven lower bound on the optimum.

The step latency separates. A decode step of n requests replays the decode graph of the smallest decode size >= n; one
of more requests than the largest decode size (or any step, with no decode graphs) replays the token-keyed graph at the
smallest prefill size >= its tokens, or runs eager. So with the decode list's top fixed, each list is a chain of
padded segments (`_chain`), the decode steps above that top joining the prefill list's steps; and the real pool is
additive (every graph its capture delta, the first captured, the widest token-keyed graph or without one the widest
decode graph, its standalone footprint). Per decode top, a dynamic program over memory units solves each list, and
the two are joined over the budget; where that is too much work, a Lagrangian relaxation of the budget (latency + lambda
x bytes, both chains free of memory) gives a proven lower bound and lists that fit, improved one key at a time."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from tuner.engines.vllm.v034.drafter_cost import Drafter034
from tuner.model.costmodel import CostModel, Evaluation
from tuner.search.exact_answer import (DEFAULT_WORK, KEPT, ROUNDED, ExactResult, SearchError, improve_locally,
                                       pareto_front, spent)
from tuner.search.exact_split_relax import Prices, Relaxation

__all__ = ["EXACT_WORK", "LAGRANGIAN", "split_solve"]

EXACT_WORK = 3e8
"""Most array cells the exact dynamic programs may touch (decode tops x prefill sizes^2 x memory units); beyond it
the Lagrangian bound answers."""
LAGRANGIAN = "too many candidates for the program over memory units: a Lagrangian bound answers"
"""Why an answer found through the Lagrangian relaxation alone is not proven (its gap is given)."""
_TIE_PRICE = 1e-21
"""ms per byte: 1e-9 ms for a TB, so lists of one latency are told apart by their memory alone."""
_WIDEST = ("a graph below a list's top holds wider activations than the top (standalone footprints that do not grow "
           "with width): the program counts the pool above and below it, and the answer is bounded")
_MULTI_TIER = "several decode query lengths (a dynamic speculative schedule): the program covers one"
_DRAFTER = "a draft model's first pass and its K + 2 graphs are not in the program"
_STARTUP = ("the start-up budget binds: the program prices capture seconds and graphs (a Lagrangian bound), it does "
            "not count them")
_LOCAL_CANDIDATES = 1024
"""Up to this many candidates, an unproven answer is improved one key at a time (a full evaluation per candidate and
round: beyond, the rounds cost more than the relaxation's own gap)."""
_INF = math.inf


class _TimeUp(Exception):
    pass


@dataclass
class _Chain:
    """One list as a chain of padded segments over sorted candidates (index 0: the start, no graph): `cost(i, j)` is
    what the steps between candidates i and j pay replaying j's graph, `tail(j)` what the steps above j pay eager."""

    sizes: np.ndarray
    """The candidates' keys, ascending by width (index k + 1 is candidate k)."""
    delta: np.ndarray
    """Capture delta of each candidate's graph (bytes), index 0 unused."""
    alone: np.ndarray
    """Standalone footprint (bytes) of each candidate's graph as the first captured, index 0 unused."""
    cost: np.ndarray
    """(n + 1, n + 1) segment costs, inf where i >= j."""
    tail: np.ndarray
    """(n + 1,) eager cost above each candidate (index 0: every step of the chain eager)."""
    fixed: np.ndarray | None = None
    """(n + 1,) bytes the chain brings once when it has any member (counted in `alone`, not in the widest
    activations); None: none."""


class _Problem:
    """The steps, candidates and figures of one split solve, the drafter's passes and graphs folded into each chain
    where 0.34's drafter adds per member (`Drafter034`): DFlash's query passes on the decode sizes' graphs, keyed by
    requests (a decode step's, or a mixed step's min(max_num_seqs, ceil(T / q))); EAGLE's step 0 on the graph its
    target step replays, in whichever chain; EAGLE's later one-token steps and their graphs, which depend only on
    whether there is a decode list."""

    def __init__(self, model: CostModel, cands: Sequence[int], drafter: Drafter034 | None = None) -> None:
        self.model = model
        self.q = int(model.q)
        (widths, uniform, probs, eager, utc, reqs, ks, logits), fixed_ms = model.program_steps()
        self.has_decode = bool(model.separate_decode and model.decode_mode == "FULL")
        self.token_mode = model.mixed_mode
        decode = self.has_decode & (utc == self.q) if self.has_decode else np.zeros(len(widths), dtype=bool)
        self.pre = sorted(k for k in cands if k > 0) if self.token_mode != "NONE" else []
        self.dec = sorted(-k for k in cands if k < 0) if self.has_decode else []
        self.dr = drafter
        self.dflash = drafter is not None and drafter.method == "dflash"
        self.eagle = drafter is not None and not self.dflash
        self.dr_token = self.eagle and not drafter.multi_module and self.token_mode != "NONE"  # type: ignore[union-attr]
        """EAGLE's step 0 replays a drafter graph at the target's prefill size (multi-module MTP has none)."""
        w = widths.astype(np.int64)
        add, eag = logits.copy(), eager.copy()
        self._token_extra = np.zeros(len(w))
        if self.eagle:  # step 0 follows the target: eager with it, or on the same graph (a per-step cost without one)
            dr_eager = drafter.eager_ms(w)  # type: ignore[union-attr]
            eag = eag + dr_eager
            if not self.dr_token:
                self._token_extra = dr_eager
        # Per class (decode steps by width, the rest by width): mass, per-step costs and eager sums at each width.
        self._dw, self._dp, self._dl, self._de = self._sorted(w[decode], probs[decode], add[decode], eag[decode])
        self._mw, self._mp, self._ml, self._me = self._sorted(w[~decode], probs[~decode],
                                                               (add + self._token_extra)[~decode], eag[~decode])
        # A decode step the prefill chain serves pays the per-step cost it pays there (EAGLE's eager step 0 included).
        self._sw, _, self._sl, _ = self._sorted(w[decode], probs[decode], (add + self._token_extra)[decode],
                                                eag[decode])
        self.const_none = 0.0
        """What the drafter's passes cost that no member serves, with no decode list."""
        self.const_decode = 0.0
        """... and with one (EAGLE's later one-token steps on their graphs)."""
        self.decode_list_bytes = 0.0
        """The graphs a decode list brings with it whatever its sizes (EAGLE's one-token draft decode graphs)."""
        if drafter is not None:
            if self.dflash:  # its query pass of N x q tokens, keyed by N as a decode graph of N requests holds it
                key = reqs.astype(np.int64) * self.q
                self._fw, self._fp, _, self._fe = self._sorted(key, probs, np.zeros(len(w)),
                                                               drafter.eager_ms(key))
                self.const_none = float(self._fe[-1])
            later_none, _ = drafter.later_steps(reqs, ks, with_decode=False)
            later_dec, self.decode_list_bytes = drafter.later_steps(reqs, ks, with_decode=bool(self.dec))
            self.const_none += float(np.dot(probs, later_none))
            self.const_decode = float(np.dot(probs, later_dec))
        # The steps no list changes (LoRA cases charged their eager step), in every answer once.
        self.const_none += fixed_ms
        self.const_decode += fixed_ms
        self.decode_top_width = self.q * max(self.dec) if self.dec else 0

    @staticmethod
    def _sorted(w: np.ndarray, p: np.ndarray, lg: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, ...]:
        order = np.argsort(w, kind="stable")
        w, p, lg, e = w[order], p[order], lg[order], e[order]
        return w, np.concatenate([[0.0], np.cumsum(p)]), np.concatenate([[0.0], np.cumsum(p * lg)]), \
            np.concatenate([[0.0], np.cumsum(p * e)])

    @staticmethod
    def _at(w: np.ndarray, cum: np.ndarray, x: np.ndarray | float) -> np.ndarray:
        """Cumulative sum over the steps of width <= x."""
        return cum[np.searchsorted(w, x, side="right")]

    def token_body(self, tops: np.ndarray) -> np.ndarray:
        """A prefill graph's replay at each width, the drafter's step 0 there with it (EAGLE); index 0: none."""
        if len(tops) <= 1:
            return np.zeros(1)
        body = self.model.graph_body_ms(tops[1:], self.token_mode)
        if self.dr_token:
            body = body + self.dr.graph_ms(tops[1:], self.token_mode)  # type: ignore[union-attr]
        return np.concatenate([[0.0], body])

    def _bytes(self, mode: str, widths: np.ndarray, drafter: bool) -> tuple[np.ndarray, np.ndarray]:
        """(standalone, delta) of the target's graphs of `mode` at `widths`, the drafter's graph's delta beside each."""
        sa, de = self.model.graph_bytes(mode, widths)
        if drafter and len(widths):
            curve = self.dr.full_de if mode == "FULL" else self.dr.pw_de  # type: ignore[union-attr]
            if curve is not None:
                de = de + np.rint(curve(widths))
                sa = sa + np.rint(curve(widths))
        return sa, de

    def decode_chain(self) -> _Chain:
        """The decode list over decode steps, which all its sizes serve (steps above its top spill to the other);
        its tail: the drafter's passes above its top (DFlash eager) and the later draft steps it brings on."""
        m, q = self.model, self.q
        n = len(self.dec)
        tops = np.array([0] + [r * q for r in self.dec], dtype=np.int64)
        body = np.concatenate([[0.0], m.graph_body_ms(tops[1:], "FULL")]) if n else np.zeros(1)
        if self.eagle and n:
            body[1:] += self.dr.graph_ms(tops[1:], "FULL")  # type: ignore[union-attr]
        mass = self._at(self._dw, self._dp, tops)
        lgs = self._at(self._dw, self._dl, tops)
        cost = np.full((n + 1, n + 1), _INF)
        tail = np.zeros(n + 1)
        if self.dflash and n:
            dr_body = np.concatenate([[0.0], self.dr.graph_ms(tops[1:], "FULL")])  # type: ignore[union-attr]
            fm, fe = self._at(self._fw, self._fp, tops), self._at(self._fw, self._fe, tops)
            tail[1:] = self._fe[-1] - fe[1:]
        for j in range(1, n + 1):
            cost[:j, j] = body[j] * (mass[j] - mass[:j]) + (lgs[j] - lgs[:j])
            if self.dflash:
                cost[:j, j] += dr_body[j] * (fm[j] - fm[:j])
        tail[1:] += self.const_decode
        sa, de = self._bytes("FULL", tops[1:], self.dr is not None and self.dr.decode_full) if n else \
            (np.zeros(0), np.zeros(0))
        alone = np.concatenate([[0.0], sa + self.decode_list_bytes])  # the draft decode graphs count once, at the top
        return _Chain(np.array([0] + [-r for r in self.dec]), np.concatenate([[0.0], de]), alone, cost, tail,
                      np.concatenate([[0.0], np.full(n, self.decode_list_bytes)]))

    def token_chain(self, spill_width: float) -> _Chain:
        """The prefill list over the other steps and the decode steps wider than `spill_width` (the decode list's top
        in tokens; 0: every decode step), each served by the graph at the smallest prefill size >= its width."""
        n = len(self.pre)
        tops = np.array([0] + self.pre, dtype=np.int64)
        body = self.token_body(tops)
        mass = self._at(self._mw, self._mp, tops)
        lgs = self._at(self._mw, self._ml, tops)
        eag = self._at(self._mw, self._me, tops)
        dm, dl, de = (np.maximum(self._at(w, c, tops), self._at(w, c, spill_width))
                      for w, c in ((self._dw, self._dp), (self._sw, self._sl), (self._dw, self._de)))
        cost = np.full((n + 1, n + 1), _INF)
        for j in range(1, n + 1):
            seg_mass = (mass[j] - mass[:j]) + (dm[j] - dm[:j])
            cost[:j, j] = body[j] * seg_mass + (lgs[j] - lgs[:j]) + (dl[j] - dl[:j])
        tail = (self._me[-1] - eag) + (self._de[-1] - de)
        dd, sa = self.token_bytes(tops)
        return _Chain(tops, dd, sa, cost, tail)

    def token_bytes(self, tops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(delta, standalone) of the prefill graphs at `tops[1:]`, the drafter's beside each; index 0: none."""
        if len(tops) <= 1:
            return np.zeros(1), np.zeros(1)
        sa, dd = self._bytes(self.token_mode, tops[1:], self.dr_token)
        return np.concatenate([[0.0], dd]), np.concatenate([[0.0], sa])

    def drafter_extra_bytes(self) -> float:
        """The most any drafter graph a candidate makes holds beyond its delta (its activations, standalone less
        delta)."""
        dr, q = self.dr, self.q
        widths = [r * q for r in self.dec] + list(self.pre) + list(getattr(dr, "grid", []))
        out = 0.0
        for sa, de in ((dr.full_sa, dr.full_de), (dr.pw_sa, dr.pw_de)):  # type: ignore[union-attr]
            if sa is not None and de is not None and widths:
                out = max(out, float(np.max(sa(widths) - de(widths))))
        return out

    def spill_eager(self, spill_width: float) -> float:
        """What the steps the prefill list would serve pay with no prefill graph: all eager."""
        return float(self._me[-1] + self._de[-1] - self._at(self._dw, self._de, spill_width))


def _levels(chain: _Chain, delta_u: np.ndarray, top_u: np.ndarray, B: int,
            check: Callable[[int], None]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The chain's dynamic program over memory units: `best[j, m]`, the least cost of a chain whose largest member is j
    in at most m units (the top at `top_u`, the others at `delta_u`), its tail included; `back[i, m]` (the member before
    i, a non-top member in at most m units) and `back_top[j, m]` (the member before the top) for `_backtrack`."""
    n = len(chain.sizes) - 1
    g = np.full((n + 1, B + 1), _INF)
    g[0, :] = 0.0
    back = np.zeros((n + 1, B + 1), dtype=np.int32)
    best = np.full((n + 1, B + 1), _INF)
    back_top = np.zeros((n + 1, B + 1), dtype=np.int32)
    for j in range(1, n + 1):
        check(j)  # a row of j predecessors over the levels
        for target, units, pointers in ((g, int(delta_u[j]), back), (best, int(top_u[j]), back_top)):
            if units > B:
                continue
            cand = g[:j, : B + 1 - units] + chain.cost[:j, j][:, None]
            arg = np.argmin(cand, axis=0)
            target[j, units:] = cand[arg, np.arange(B + 1 - units)]
            pointers[j, units:] = arg
        best[j] += chain.tail[j]
    return best, back, back_top


def _backtrack(chain: _Chain, delta_u: np.ndarray, top_u: np.ndarray, back: np.ndarray, back_top: np.ndarray,
               j: int, m: int) -> list[int]:
    """The keys of the chain `_levels` found topped by j in at most m units."""
    members, i = [j], int(back_top[j, m])
    m -= int(top_u[j])
    while i > 0:
        members.append(i)
        i, m = int(back[i, m]), m - int(delta_u[i])
    return [int(chain.sizes[k]) for k in members]


def _fixed(chain: _Chain) -> np.ndarray:
    return chain.fixed if chain.fixed is not None else np.zeros(len(chain.sizes))


def _extra(chain: _Chain, safe: bool) -> np.ndarray:
    """What a chain's top costs beyond its delta (and its `fixed` bytes) when the chain holds the pair's widest
    activations (standalone less delta): the top's own (a lower bound when a member below has more), or, `safe`, the
    most of any member up to it."""
    extra = np.maximum(chain.alone - chain.delta - _fixed(chain), 0)
    extra[0] = 0.0
    return np.maximum.accumulate(extra) if safe else extra


def _min_plus(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """c[m] = min over m1 <= m of a[m1] + b[m - m1], for a nonincreasing `a` (only where it drops can it help)."""
    c = np.full(len(b), _INF)
    drops = np.flatnonzero(np.isfinite(a) & (np.concatenate([[_INF], a[:-1]]) > a))
    for m1 in drops:
        np.minimum(c[m1:], a[m1] + b[: len(b) - m1], out=c[m1:])
    return c


@dataclass
class _Levels:
    """One chain solved over memory units, with what backtracking needs."""

    chain: _Chain
    delta_u: np.ndarray
    top_u: np.ndarray
    best: np.ndarray
    back: np.ndarray
    back_top: np.ndarray

    @classmethod
    def solve(cls, chain: _Chain, unit: int, B: int, rounding: Callable[[np.ndarray], np.ndarray],
              top_extra: np.ndarray | float, check: Callable[[int], None]) -> _Levels:
        """`top_extra`: what the chain's top costs beyond its delta (bytes, per candidate): the widest activations the
        pool holds once, where this chain holds the pair's widest graph (0: the other chain does)."""
        du = rounding(np.maximum(chain.delta, 0) / unit).astype(np.int64)
        tu = rounding(np.maximum(chain.delta + top_extra, 0) / unit).astype(np.int64)
        return cls(chain, du, tu, *_levels(chain, du, tu, B, check))

    def any_top(self) -> np.ndarray:
        """The least cost in at most m units over every top (inf with no member)."""
        return self.best[1:].min(axis=0) if len(self.best) > 1 else np.full(self.best.shape[1], _INF)

    def keys(self, m: int, top: int | None = None) -> list[int]:
        """The keys of the cheapest chain in at most m units (topped by `top` when given)."""
        j = int(np.argmin(self.best[1:, m])) + 1 if top is None else top
        return _backtrack(self.chain, self.delta_u, self.top_u, self.back, self.back_top, j, m)


class _Split:
    """One solve (see the module docstring)."""

    def __init__(self, model: CostModel, *, memory_buckets: int, candidates: Sequence[int] | None,
                 front_points: int, work: int | None, seconds: float | None, clock: Callable[[], float],
                 incumbents: Sequence[Sequence[int]], cap: int | None, keep_ms: float | None) -> None:
        self.model, self.cap, self.keep_ms, self.front_points = model, cap, keep_ms, front_points
        self.cands = sorted({int(c) for c in (model.candidates if candidates is None else candidates)})
        self.buckets, self.incumbents, self.clock = memory_buckets, incumbents, clock
        self.started = clock()
        self.budget_s, self.work_limit = seconds, work
        self.deadline = None if seconds is None else self.started + seconds
        self.seen: dict[tuple[int, ...], Evaluation] = {}
        self.kept: list[Evaluation] = []
        self.stopped = False
        self.spent_on = ""
        """What ran out when `stopped`: `work` or `seconds`."""
        self.work = 0
        self.solves = 0
        self.monotone = True
        self.startup_binds = False
        """The fastest pair within memory is over the start-up budget: the budget prices the program's members."""

    def check(self, steps: int = 1) -> None:
        """Count `steps` of work (a candidate swept, a row of a program); past the work budget or the optional
        wall-clock one, stop."""
        self.work += steps
        if self.work_limit is not None and self.work > self.work_limit:
            self.spent_on = "work"
            raise _TimeUp
        if self.deadline is not None and self.clock() > self.deadline:
            self.spent_on = "seconds"
            raise _TimeUp

    def within_cap(self, e: Evaluation) -> bool:
        return self.cap is None or e.graph_memory_bytes <= self.cap

    def fits(self, e: Evaluation) -> bool:
        return e.feasible and self.within_cap(e)

    def consider(self, keys: Sequence[int]) -> Evaluation:
        sizes = tuple(sorted(set(keys)))
        e = self.seen.get(sizes)
        if e is None:
            e = self.seen[sizes] = self.model.evaluate(sizes)
        if self.fits(e) and e.expected_step_ms < self.best.expected_step_ms - 1e-12:
            self.best = e
        return e

    # ------------------------------------------------------------------------------------------------ answer
    def run(self) -> ExactResult:
        model = self.model
        empty = model.evaluate(())
        if not empty.feasible:
            raise SearchError(model.nothing_fits(empty))
        self.best = empty
        self.seen[()] = empty
        keep_empty = self.keep_ms is not None and empty.expected_step_ms <= self.keep_ms + 1e-12
        if model.cudagraph_mode == "NONE" or not self.cands:
            return ExactResult(empty, [empty], 1, True, 0, "real", empty.expected_step_ms,
                               kept=(empty,) if keep_empty else ())
        allowed = set(self.cands)
        for sizes in [model.default_sizes, *self.incumbents]:
            self.consider(sorted({int(w) for w in sizes} & allowed))
        unproven: list[str] = []
        lower: float | None = None
        drafter = model.drafter if isinstance(model.drafter, Drafter034) else None
        unproven += model.program_gaps
        if len(model.decode_tiers) > 1:
            unproven.append(_MULTI_TIER)
        elif model.drafter is not None and (drafter is None or drafter.method == "draft_model"):
            unproven.append(_DRAFTER)
        exact_units, unit, exact_ran = True, 1, False
        try:
            if not unproven:
                self.p = _Problem(model, self.cands, drafter)
                budget = int(model.budget.real_budget_bytes())
                if self.cap is not None:
                    budget = min(budget, self.cap)
                if budget < 0:
                    raise SearchError(f"no capture list fits: {model.evaluate(()).why_infeasible or 'no budget'}")
                exact_units, unit = self._units(budget)
                work = (len(self.p.dec) + 1) * (len(self.p.pre) + 1) ** 2 * (budget // unit + 1)
                self.relax = Relaxation(self.p, model.graph_capture_s, self.check)
                lower = float(self._lagrangian(budget))
                if self._met(lower):  # the relaxation answered: its price sweep leaves the front beside it
                    self._front_sweep()
                if not self._met(lower) and work <= EXACT_WORK:  # the program over memory units proves it
                    exact_ran = True
                    lower = max(lower, self._exact(budget, unit, exact_units))
                elif not self._met(lower):
                    unproven.append(LAGRANGIAN)
        except _TimeUp:
            self.stopped = True
        if not self._met(lower) and len(self.cands) <= _LOCAL_CANDIDATES:
            self.best = improve_locally(model, self.best, self.cands, fits=self.fits)
        # A lower bound the answer meets proves it, however the bound was found (rounded units, the relaxation).
        proven = self._met(lower)
        reasons = [] if proven else self._reasons(unproven, exact_ran and not exact_units, unit)
        if lower is not None:
            lower = min(lower, self.best.expected_step_ms)
        self.best = self._without_idle(self.best)
        if keep_empty and empty not in self.kept:
            self.kept = ([empty] + self.kept)[:KEPT]
        front = pareto_front([e for e in self.seen.values() if self.fits(e)] + [self.best])
        if len(front) > self.front_points:
            keep = np.unique(np.linspace(0, len(front) - 1, max(self.front_points, 1)).round().astype(int))
            front = [front[i] for i in keep]
        return ExactResult(self.best, front, unit, proven, len(self.cands), "real",
                           self.best.expected_step_ms if proven else lower, self.stopped,
                           self.clock() - self.started, 1, self.solves, tuple(reasons), tuple(self.kept),
                           work=self.work)

    def _met(self, lower: float | None) -> bool:
        """The answer is at or below a proven lower bound (to float noise): it is the optimum."""
        return lower is not None and bool(self.best.expected_step_ms <= lower + 1e-12 * max(1.0, abs(lower)))

    def _reasons(self, unproven: list[str], rounded: bool, unit: int) -> list[str]:
        """Why the answer is not proven optimal, most telling first."""
        out = [why for why, yes in (
            (spent(self.work_limit, self.budget_s, self.spent_on), self.stopped),
            (_STARTUP, self.startup_binds),
            (f"{ROUNDED} {unit / (1 << 20):.3f} MiB", rounded)) if yes]
        out += unproven
        return out or [_WIDEST if not self.monotone else "its lower bound stays below it"]

    # ------------------------------------------------------------------------------------------------ relaxation
    def _lagrangian(self, budget: int) -> float:
        """The pair's resources priced (`Prices`), one at a time, the price of each that the fastest pair overruns
        raised by bisection until it no longer does, every relaxed optimum a proven lower bound (`Prices.bound`) and
        every pair met a candidate answer; with `keep_ms`, the memory price then raised while the pair stays within
        it (the least memory within a latency, for the compact choice). Returns the best bound."""
        m = self.model
        limits = {"memory": float(budget), "seconds": m.max_capture_s, "graphs": m.max_graphs}
        self.lower = -_INF

        def probe(prices: Prices) -> Evaluation:
            value, keys = self.relax.solve(prices)
            self.solves += 1
            self.lower = max(self.lower, prices.bound(value, limits["memory"], limits["seconds"], limits["graphs"]))
            if prices.memory == 0:  # ties broken toward less memory: a price too small to trade any latency
                keys = self.relax.solve(replace(prices, memory=_TIE_PRICE))[1]
            return self.consider(keys)

        prices = Prices()
        e = probe(prices)
        for _ in range(2 * len(limits)):
            over = [r for r in ("graphs", "seconds", "memory") if self._over(e, r)]
            if not over:
                break
            if over[0] != "memory":
                self.startup_binds = True
            prices, e = self._raise(probe, prices, over[0], lambda x, r=over[0]: not self._over(x, r))
        if self.keep_ms is not None:
            keep = self.keep_ms
            _, _ = self._raise(probe, prices, "memory", lambda x: x.expected_step_ms > keep + 1e-12 or not self.fits(x),
                               keep=True)
        return self.lower

    def _over(self, e: Evaluation, resource: str) -> bool:
        """Whether a pair overruns one resource: the memory (both conditions, the cap) or the start-up budget."""
        m = self.model
        if resource == "memory":
            return not (e.fits_memory and self.within_cap(e))
        if resource == "seconds":
            return m.max_capture_s is not None and e.capture_s is not None and e.capture_s > m.max_capture_s + 1e-9
        return m.max_graphs is not None and e.num_graphs > m.max_graphs

    def _raise(self, probe: Callable[[Prices], Evaluation], prices: Prices, resource: str,
               done: Callable[[Evaluation], bool], *, keep: bool = False,
               iterations: int = 32) -> tuple[Prices, Evaluation]:
        """The least price of `resource` (the others as they are) whose relaxed optimum is `done`, by doubling then
        bisection in log scale; (those prices, that pair). `keep`: instead the greatest price whose pair is not yet
        done, every such pair that fits kept (the compact choice's least memory within its latency)."""
        field = {"memory": "memory", "seconds": "seconds", "graphs": "graphs"}[resource]
        start = getattr(prices, field)
        lo, hi, e_hi = start, None, None
        x = start * 2 if start > 0 else self._scale(resource)
        for _ in range(64):
            e = probe(replace(prices, **{field: x}))
            if keep and not done(e):
                self._keep(e)
            if done(e):
                hi, e_hi = x, e
                break
            lo, x = x, x * 8
        if hi is None:
            return prices, self.best
        for _ in range(iterations):
            mid = math.sqrt(lo * hi) if lo > 0 else hi / 1024
            if hi <= mid * (1 + 1e-6):
                break
            e = probe(replace(prices, **{field: mid}))
            if done(e):
                hi, e_hi = mid, e
            else:
                lo = mid
                if keep:
                    self._keep(e)
        return replace(prices, **{field: hi}), e_hi

    def _keep(self, e: Evaluation) -> None:
        """A pair within `keep_ms` that fits joins the kept lists (the least memory first)."""
        if self.keep_ms is not None and e.expected_step_ms <= self.keep_ms + 1e-12 and self.fits(e) \
                and e not in self.kept:
            self.kept = sorted(self.kept + [e], key=lambda x: (x.graph_memory_bytes, x.expected_step_ms))[:KEPT]

    def _scale(self, resource: str) -> float:
        """A first price for a resource: the empty list's step over what every member together takes of it (a price
        at which no member's saving can pay for it is a few doublings above)."""
        r, base = self.relax, self.seen[()].expected_step_ms
        total = {"memory": float(r.dchain.delta.sum() + r.tok_delta.sum()),
                 "seconds": float(r.dec_seconds.sum() + r.tok_seconds.sum()),
                 "graphs": float(r.dec_graphs.sum() + r.tok_graphs.sum())}[resource]
        return base / max(total, 1e-300) if total > 0 else 1.0

    def _units(self, budget: int) -> tuple[bool, int]:
        """(exact, unit): one unit divides every figure and the budget spans at most `buckets` of them, or the unit
        that makes it span that many (figures then rounded, the answer re-checked in bytes)."""
        dchain = self.p.decode_chain()
        figures = [dchain.delta[1:], dchain.alone[1:], *(x[1:] for x in self.p.token_bytes(
            np.array([0] + self.p.pre, dtype=np.int64)))]
        values = np.rint(np.concatenate(figures)).astype(np.int64)
        values = values[values > 0]
        gcd = int(np.gcd.reduce(values)) if len(values) else 1
        span = max(1, min(budget, int(values.sum()) if len(values) else 1))
        if span // gcd <= self.buckets:
            return True, gcd
        return False, -(-span // self.buckets)

    # ------------------------------------------------------------------------------------------------ exact
    def _exact(self, budget: int, unit: int, exact_units: bool) -> float:
        """The program over memory units, per decode top: figures rounded up (every answer fits), and, where the unit
        rounds, rounded down too (a proven lower bound). Returns the lower bound."""
        value = self._solve_levels(budget, unit, safe=True)
        chains = (self.p.decode_chain(), self.p.token_chain(0.0))
        extras = [np.maximum(c.alone - c.delta - _fixed(c), 0)[1:] for c in chains]
        self.monotone = all(np.all(np.diff(x) >= 0) for x in extras)
        if self.p.dr is not None:  # the pool's widest activations must be a target graph's, as the program counts
            least = min((float(x.min()) for x in extras if len(x)), default=0.0)
            self.monotone &= self.p.drafter_extra_bytes() <= least
        return value if exact_units and self.monotone else self._solve_levels(budget, unit, safe=False)

    def _solve_levels(self, budget: int, unit: int, *, safe: bool) -> float:
        """Every decode top (none, or each decode size): the decode chain topped there (its steps above that top
        spilled into the prefill chain), joined with the prefill chain over the budget. Returns the least latency
        in the budget. `safe`: figures rounded up and the widest activations taken as the most any member below the
        top has (every answer counts at least its memory: it fits), its answer, front and kept lists evaluated; else
        rounded down and the top's own (at most its memory: a lower bound)."""
        p, B = self.p, max(0, budget // unit)
        rounding = np.ceil if safe else np.floor
        dchain = p.decode_chain()
        extra_d = _extra(dchain, safe)
        dec = _Levels.solve(dchain, unit, B, rounding, _fixed(dchain), self.check)
        dec_alone = _Levels.solve(dchain, unit, B, rounding, extra_d + _fixed(dchain), self.check)
        self.solves += 2
        tops: dict[int, tuple[np.ndarray, _Levels, float]] = {}
        for t in range(len(dchain.sizes)):
            self.check()
            spill = 0.0 if t == 0 else float(p.q * -dchain.sizes[t])
            tchain = p.token_chain(spill)
            tok = _Levels.solve(tchain, unit, B, rounding, np.maximum(_extra(tchain, safe), extra_d[t]), self.check)
            self.solves += 1
            none_p = p.spill_eager(spill)
            tok_any = tok.any_top()
            if t == 0:  # no decode graph: the prefill list alone, or nothing (the drafter's passes all eager)
                combined = np.minimum(tok_any, none_p) + p.const_none
            else:  # both (the decode graphs at their deltas, the widest prefill graph first), or the decode list alone
                combined = np.minimum(_min_plus(dec.best[t], tok_any), dec_alone.best[t] + none_p)
            tops[t] = (combined, tok, none_p)
        totals = np.min(np.stack([c for c, _, _ in tops.values()]), axis=0)
        if not math.isfinite(totals[B]):
            return _INF
        if safe:
            self.consider(self._pair(dec, dec_alone, tops, B))
            drops = [m for m in range(B + 1) if math.isfinite(totals[m]) and (m == 0 or totals[m] < totals[m - 1]
                                                                               - 1e-12)]
            picks = drops if len(drops) <= self.front_points else [
                drops[i] for i in np.unique(np.linspace(0, len(drops) - 1, self.front_points).round().astype(int))]
            within = ([m for m in drops if totals[m] <= self.keep_ms + 1e-12][:4 * KEPT]
                      if self.keep_ms is not None else [])
            for m in sorted(set(picks) | set(within)):
                self.check()
                e = self.consider(self._pair(dec, dec_alone, tops, m))
                if m in within and self.fits(e) and e not in self.kept and len(self.kept) < KEPT:
                    self.kept.append(e)
            self.kept.sort(key=lambda e: (e.graph_memory_bytes, e.expected_step_ms))
        return float(totals[B])

    @staticmethod
    def _pair(dec: _Levels, dec_alone: _Levels, tops: dict[int, tuple[np.ndarray, _Levels, float]],
              m: int) -> list[int]:
        """The keys of the cheapest pair in at most m units (the decode top that reaches it, then how)."""
        t = min(tops, key=lambda k: tops[k][0][m])
        combined, tok, none_p = tops[t]
        tok_any = tok.any_top()
        if t == 0:
            return tok.keys(m) if tok_any[m] < none_p else []  # the drafter's constant is the same either way
        if dec_alone.best[t, m] + none_p <= combined[m] + 1e-12 * max(1.0, abs(combined[m])):
            return dec_alone.keys(m, t)
        row = dec.best[t]
        m1 = min((k for k in range(m + 1) if math.isfinite(row[k])), key=lambda k: row[k] + tok_any[m - k])
        return dec.keys(m1, t) + tok.keys(m - m1)

    def _front_sweep(self, prices: int = 24) -> None:
        """Where the relaxation answered, no program over memory ran to leave a front: its memory price spread over
        four decades around the answer's trade (its saving over the empty list per byte) gives the lists on the
        front's lower hull, each considered."""
        empty, best = self.seen[()], self.best
        if best.graph_memory_bytes <= 0 or empty.expected_step_ms <= best.expected_step_ms:
            return
        trade = (empty.expected_step_ms - best.expected_step_ms) / best.graph_memory_bytes
        for lam in trade * np.logspace(-2.0, 2.0, prices):
            self.consider(self.relax.solve(Prices(memory=float(lam)))[1])

    def _without_idle(self, e: Evaluation) -> Evaluation:
        """The answer less every graph that saves nothing (a tie the relaxation's tie price is too small to break
        through rounding, e.g. a prefill graph no step replays): each key dropped, widest graphs first, while the
        expected step stays the same to 1e-12 and the list still fits."""
        for key in sorted(e.capture_sizes, key=lambda k: -abs(k)):
            if key not in e.capture_sizes:
                continue
            without = self.consider([k for k in e.capture_sizes if k != key])
            if (self.fits(without) and without.graph_memory_bytes < e.graph_memory_bytes and
                    without.expected_step_ms <= e.expected_step_ms + 1e-12 * max(1.0, e.expected_step_ms)):
                e = without
        return e


def split_solve(model: CostModel, *, memory_buckets: int = 2048, candidates: Sequence[int] | None = None,
                front_points: int = 40, work: int | None = DEFAULT_WORK, seconds: float | None = None,
                clock: Callable[[], float] = time.monotonic, incumbents: Sequence[Sequence[int]] = (),
                memory_cap_bytes: int | None = None, keep_within_ms: float | None = None) -> ExactResult:
    """The fastest pair of lists over `candidates` (default: the model's keys) whose real pool leaves the required KV
    cache (and, with `memory_cap_bytes`, is at most that), as `tuner.search.exact.exact_solve` answers for one list:
    proven where `exact_memory`, else with a lower bound and the reasons (`unproven`)."""
    if memory_cap_bytes is not None and memory_cap_bytes < 0:
        raise ValueError(f"memory_cap_bytes={memory_cap_bytes} must be >= 0")
    return _Split(model, memory_buckets=memory_buckets, candidates=candidates, front_points=front_points,
                  work=work, seconds=seconds, clock=clock, incumbents=incumbents, cap=memory_cap_bytes,
                  keep_ms=keep_within_ms).run()
