"""Lower bounds on the exact solver's program, in bytes, by Lagrangian relaxation: for many columns (a pass and a
price λ in ms per byte) at once, the cheapest chains under latency + λ x memory, forward and backward over the
candidates. A chain within a budget M costs at least its relaxed cost - λ M, so the columns bound the latency of
every fitting list through a node or an edge, and the chains they pick are lists to start from."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tuner.search.exact_program import ANY, C0, NODES, Edge, Program

__all__ = ["Bounds", "Columns", "EdgeBounds", "Relaxation", "TimeUp", "float_slack", "relax", "sweep_back"]

_INF = math.inf


class TimeUp(Exception):
    """The time budget ran out in the middle of a sweep."""


@dataclass
class Columns:
    """The (pass, λ) pairs relaxed together."""

    cls: np.ndarray
    """Per column, the pass's class (-1: nothing charged below the top; ANY: every class at its least value)."""
    lam: np.ndarray
    """Per column, the price of a byte in ms."""
    per_graph: np.ndarray
    """Per column, the bytes each per-graph charge costs."""

    def __len__(self) -> int:
        return len(self.lam)

    @staticmethod
    def join(parts: Sequence[Columns]) -> Columns:
        return Columns(*(np.concatenate([getattr(p, k) for p in parts]) for k in ("cls", "lam", "per_graph")))


@dataclass
class Relaxation:
    """Forward (and, once swept back, backward) costs of every node under each column."""

    cols: Columns
    f: np.ndarray
    """(NODES, n + 1, columns): the cheapest relaxed chain from the start to the node."""
    lat: np.ndarray
    """The latency of that chain."""
    mem: np.ndarray
    """Its bytes."""
    back_pos: np.ndarray
    back_node: np.ndarray
    close: np.ndarray
    """(2, n, columns): relaxed cost of the cheapest chain closed at candidate j in state 0/1 (the tail added, less
    λ x the budget of a list topped there); inf where no list may end so."""
    h: np.ndarray
    """(NODES, n + 1, columns): the cheapest relaxed completion from the node to a close, less λ x its budget (inf
    for columns not swept back yet)."""

    def join(self, other: Relaxation) -> Relaxation:
        """Two relaxations of one program as one, column sets side by side."""
        parts = {k: np.concatenate([getattr(self, k), getattr(other, k)], axis=-1)
                 for k in ("f", "lat", "mem", "back_pos", "back_node", "close", "h")}
        return Relaxation(Columns.join([self.cols, other.cols]), **parts)

    def lower_bound(self) -> np.ndarray:
        """Per column: a lower bound on the latency of every fitting chain of its pass."""
        return self.close.min(axis=(0, 1))

    def close_cut(self, cols: np.ndarray) -> float:
        """A lower bound on every fitting chain of a pass the columns `cols` all relax: per top (and state) the best
        column's, the least over tops."""
        return float(self.close[:, :, cols].max(axis=2).min())

    def chain(self, col: int, program: Program, mem_extra: np.ndarray, limit: np.ndarray
              ) -> tuple[tuple[int, ...], float, float, bool]:
        """The column's cheapest closed chain: (its widths, its latency, its bytes, whether they fit its budget)."""
        st, j = np.unravel_index(int(np.argmin(self.close[:, :, col])), self.close.shape[:2])
        if not np.isfinite(self.close[st, j, col]):
            return (), _INF, _INF, False
        node, pos = C0 + int(st), int(j) + 1
        lat = float(self.lat[node, pos, col] + program.close_tail[st, j])
        mem = float(self.mem[node, pos, col] + mem_extra[j])
        members = []
        while pos > 0:
            members.append(int(program.c[pos - 1]))
            node, pos = int(self.back_node[node, pos, col]), int(self.back_pos[node, pos, col])
        return tuple(sorted(members)), lat, mem, mem <= limit[j]


def float_slack(program: Program, fig: dict[str, np.ndarray], limit: np.ndarray, cols: Columns) -> np.ndarray:
    """Per column, more than the float error of its bounds: two sums of up to n + 2 terms, each term at most the
    latency of the empty list plus λ x every byte a list could take or be allowed."""
    most = sum(float(np.abs(a).sum()) for a in fig.values()) + float(np.abs(limit).max(initial=0.0))
    return 2.0 * (program.n + 2) * np.finfo(float).eps * (program.base + cols.lam * (most + cols.per_graph * program.n))


def relax(program: Program, fig: dict[str, np.ndarray], limit: np.ndarray, cols: Columns, *,
          check: Callable[[int], None]) -> Relaxation:
    """Sweep forward: the cheapest relaxed chain to every node under every column. `fig`: memory figures in bytes;
    `limit`: per candidate, the bytes a list topped by it may take (< 0: none may top there); `check` raises TimeUp
    when the time budget is spent. Bounds come out lowered by more than their float error."""
    n, C = program.n, len(cols)
    f = np.full((NODES, n + 1, C), _INF)
    lat = np.zeros((NODES, n + 1, C))
    mem = np.zeros((NODES, n + 1, C))
    back_pos = np.zeros((NODES, n + 1, C), dtype=np.int32)
    back_node = np.zeros((NODES, n + 1, C), dtype=np.int8)
    every = np.arange(C)
    for node in program.starts(-1):
        f[node, 0, :] = 0.0 if node != C0 else np.where(cols.cls == -1, 0.0, _INF)
    for j in range(n):
        check(j + 1)  # a candidate's transitions from its predecessors
        k = j + 1
        for e in program.edges(j):
            if e.hi <= e.lo:
                continue
            block = f[e.frm, e.lo:e.hi, :] + e.cost[e.lo:e.hi, None]
            if e.placing:
                block = np.where(program.placing_mask(e.lo, e.hi, cols.cls), block, _INF)
            arg = np.argmin(block, axis=0)
            charge = e.base(fig, j) + (cols.per_graph if e.per_graph else 0.0)
            val = block[arg, every] + cols.lam * charge
            if not e.enabled(-1):
                val = np.where(cols.cls == -1, _INF, val)
            better = val < f[e.to, k]
            if not better.any():
                continue
            pred = e.lo + arg
            f[e.to, k] = np.where(better, val, f[e.to, k])
            lat[e.to, k] = np.where(better, lat[e.frm, pred, every] + e.cost[pred], lat[e.to, k])
            mem[e.to, k] = np.where(better, mem[e.frm, pred, every] + charge, mem[e.to, k])
            back_pos[e.to, k] = np.where(better, pred, back_pos[e.to, k])
            back_node[e.to, k] = np.where(better, e.frm, back_node[e.to, k])
    ends = _ends(program, fig, limit, cols)
    close = f[C0:C0 + 2, 1:, :] + ends
    return Relaxation(cols, f, lat, mem, back_pos, back_node, np.where(np.isfinite(close), close, _INF),
                      h=np.full((NODES, n + 1, C), _INF))


def _ends(program: Program, fig: dict[str, np.ndarray], limit: np.ndarray, cols: Columns) -> np.ndarray:
    """(2, n, columns): what closing at candidate j in state 0/1 adds to a relaxed chain: the tail, λ x (the top's
    extra bytes - the budget of a list topped there), less the float slack; inf where no list may end so."""
    fits = fig["extra"] <= limit
    ends = np.empty((2, program.n, len(cols)))
    for st in (0, 1):
        tail = np.where(fits, program.close_tail[st], _INF)
        ends[st] = tail[:, None] + cols.lam[None, :] * (fig["extra"] - limit)[:, None]
    return np.where(np.isfinite(ends), ends - float_slack(program, fig, limit, cols)[None, None, :], _INF)


def sweep_back(program: Program, fig: dict[str, np.ndarray], limit: np.ndarray, rel: Relaxation, sel: np.ndarray, *,
               check: Callable[[int], None],
               on_placing: Callable[[Edge, int, np.ndarray], None] | None = None) -> None:
    """Sweep backward for the columns `sel`: the cheapest relaxed completion of every node (into `rel.h`). At each
    placing edge, once the completions past it are known, `on_placing(edge, j, bounds)` gets the bound through each
    predecessor lo..hi-1 under each column of `sel`."""
    n = program.n
    cols = Columns(rel.cols.cls[sel], rel.cols.lam[sel], rel.cols.per_graph[sel])
    h = np.full((NODES, n + 1, len(sel)), _INF)
    h[C0:C0 + 2, 1:, :] = _ends(program, fig, limit, cols)
    f = rel.f[:, :, sel]
    for j in range(n - 1, -1, -1):
        check(j + 1)
        k = j + 1
        for e in program.edges(j):
            if e.hi <= e.lo:
                continue
            charge = e.base(fig, j) + (cols.per_graph if e.per_graph else 0.0)
            ahead = cols.lam * charge + h[e.to, k]
            if not e.enabled(-1):
                ahead = np.where(cols.cls == -1, _INF, ahead)
            block = e.cost[e.lo:e.hi, None] + ahead[None, :]
            if e.placing:
                block = np.where(program.placing_mask(e.lo, e.hi, cols.cls), block, _INF)
                if on_placing is not None:
                    on_placing(e, j, f[e.frm, e.lo:e.hi, :] + block)
            np.minimum(h[e.frm, e.lo:e.hi], block, out=h[e.frm, e.lo:e.hi])
    assert rel.h is not None
    rel.h[:, :, sel] = h


class EdgeBounds:
    """Lower bounds through the transitions of one pass, from the columns `sel` of a relaxation (all relaxing that
    pass, all swept back), sliced once."""

    def __init__(self, rel: Relaxation, program: Program, fig: dict[str, np.ndarray], sel: np.ndarray) -> None:
        self.program, self.fig = program, fig
        self.f, self.h = rel.f[:, :, sel], rel.h[:, :, sel]
        self.lam, self.cls, self.per_graph = rel.cols.lam[sel], rel.cols.cls[sel], rel.cols.per_graph[sel]

    def __call__(self, e: Edge, j: int, preds: np.ndarray) -> np.ndarray:
        """Per predecessor position in `preds`, a bound on every fitting chain of the pass through the edge from it:
        the best column's."""
        charge = e.base(self.fig, j) + (self.per_graph if e.per_graph else 0.0)
        ahead = self.lam * charge + self.h[e.to, j + 1]
        block = self.f[e.frm, preds] + e.cost[preds][:, None] + ahead[None, :]
        if e.placing:
            pred_cls, cls = self.program.pred_cls[preds][:, None], self.cls[None, :]
            block = np.where((pred_cls == cls) | ((cls == ANY) & (pred_cls >= 0)), block, _INF)
        if not e.enabled(-1):
            block = np.where(self.cls[None, :] == -1, _INF, block)
        return block.max(axis=1)


GRID = np.concatenate([[0.0], np.logspace(-3, 4, 15)])
"""Prices of a byte tried for every pass, in units of the empty list's latency per budget byte (steps of 10^0.5)."""
NEAR = 10.0 ** np.array([-1 / 3, -1 / 6, 0.0, 1 / 6, 1 / 3])
"""Prices tried per pass still open, as multiples of the best grid price of the relaxation it belongs to."""
FRONT = np.array([5, 7, 9, 11, 13])
"""The grid prices (10^-1 .. 10^3) every solve relaxes, for a front of lists even where price 0 settles it."""
TINY = 1e-6
"""A price (in GRID's units) too small to trade latency for memory: it only breaks ties between equally fast chains
(graphs no step uses) toward less memory."""

Found = Callable[[Relaxation, range, int], None]
"""(relaxation, new columns, how many of their fastest fitting chains to try as the list to beat)."""


class Bounds:
    """Every bound the solver uses on one program, built in rounds that stop as soon as they prove the list to beat:
    price 0 for every pass together (where the fastest chains fit, nothing else is needed), a grid of prices, the
    sweep back (bounds per node, transition and pass), then the passes still open on prices near their best.
    `found` gets the chains of each round's columns, `beat()` is the bound at or above which nothing is worth
    proving, `check(steps)` counts work and raises TimeUp past the budget (the forward sweeps of the first two rounds always run to
    their end: they are the bound of last resort)."""

    def __init__(self, program: Program, fig: dict[str, np.ndarray], limit: np.ndarray, budget_bytes: int,
                 classes: np.ndarray, per_graph: np.ndarray, *, found: Found, beat: Callable[[], float],
                 check: Callable[[int], None], front: bool = True) -> None:
        self.program, self.fig, self.limit = program, fig, limit
        self.found, self.beat, self.check, self.front = found, beat, check, front
        self.lam0 = program.base / max(float(budget_bytes), 1.0)
        self.classes = sorted(set(classes.tolist())) if program.kind != "real" else []
        self.class_of = classes
        self.p_bytes = {cls: float(per_graph[classes == cls].min()) for cls in self.classes}
        self.groups = [(-1, 0.0)] + ([(ANY, min(self.p_bytes.values()))] if self.classes else [])
        """The relaxations of every pass: the -1 pass, and every class pass at once (ANY)."""
        self.rel: Relaxation | None = None
        self.relax_cols: dict[int, np.ndarray] = {}
        """Per relaxation (-1, ANY), its columns."""
        self.relax_lb: dict[int, float] = {}
        """Per relaxation, a lower bound on every fitting list it relaxes."""
        self.pass_cols: dict[int, np.ndarray] = {}
        """Per pass, the columns that relax it (once swept back)."""
        self.pass_lb: dict[int, float] = {}
        """Per pass, a lower bound on every fitting list of it (once swept back)."""

    def pass_bound(self, cls: int, same: bool = True) -> float:
        """A lower bound on every list of a pass (its own where `same`: the pass has this program's classes)."""
        if same and cls in self.pass_lb:
            return self.pass_lb[cls]
        return self.relax_lb.get(-1 if cls == -1 else ANY, -_INF)

    def edges(self, cls: int, same: bool = True) -> EdgeBounds | None:
        """Bounds through the transitions of a pass (None before the sweep back)."""
        if self.rel is None or not self.pass_cols:
            return None
        sel = self.pass_cols[cls] if same and cls in self.pass_cols else self.relax_cols[-1 if cls == -1 else ANY]
        return EdgeBounds(self.rel, self.program, self.fig, sel)

    def run(self) -> None:
        if self._first() and self._back():
            self._open_passes()

    def _columns(self, groups: Sequence[tuple[int, float]], lams: np.ndarray) -> Columns:
        return Columns.join([Columns(np.full(len(lams), cls), lams, np.full(len(lams), pg)) for cls, pg in groups])

    def _relax(self, cols: Columns, check: Callable[[int], None]) -> Relaxation:
        """The columns relaxed, joined to those before; `found` gets their chains."""
        new = relax(self.program, self.fig, self.limit, cols, check=check)
        self.rel = new if self.rel is None else self.rel.join(new)
        self.found(self.rel, range(len(self.rel.cols) - len(cols), len(self.rel.cols)), 4)
        return self.rel

    def _first(self) -> bool:
        """Price 0 (and a tiny one) for every relaxation, with a few grid prices for the last (lists that trade
        latency for memory, for the front, even where price 0 settles it); then the rest of the grid where price 0
        does not settle it. False when settled."""
        last, front = self.groups[-1], GRID[FRONT] if self.front else np.zeros(0)
        first = Columns.join([self._columns(self.groups, np.array([0.0, self.lam0 * TINY])),
                              self._columns([last], self.lam0 * front)])
        rel = self._relax(first, lambda _: None)
        if min(rel.lower_bound()[rel.cols.lam == 0]) < self.beat():
            rest = [self._columns([(cls, pg)], self.lam0 * np.setdiff1d(GRID[1:], front if cls == last[0] else []))
                    for cls, pg in self.groups]
            rel = self._relax(Columns.join(rest), lambda _: None)
        self.relax_cols = {cls: np.flatnonzero(rel.cols.cls == cls) for cls, _ in self.groups}
        self.relax_lb = {cls: rel.close_cut(cols) for cls, cols in self.relax_cols.items()}
        return min(self.relax_lb.values()) < self.beat()

    def _back(self) -> bool:
        """Sweep the first columns back. Every list of a class pass places its top over its second, every list of
        the -1 pass over the start or never: the least bound over those placing edges bounds the pass. False when
        every pass is ruled out."""
        self.check(1)
        rel, program, classes = self.rel, self.program, self.classes
        assert rel is not None
        slot = {cls: i for i, cls in enumerate(classes)}
        cut = np.full(len(classes) + 1, _INF)  # per class, the -1 pass last
        none_cols, any_cols = self.relax_cols[-1], self.relax_cols.get(ANY, np.zeros(0, dtype=np.int64))

        def on_placing(e: Edge, j: int, through: np.ndarray) -> None:
            cut[-1] = min(cut[-1], float(through[:, none_cols].max(axis=1).min()))
            if len(any_cols):
                rows = through[:, any_cols].max(axis=1)
                pred = program.pred_cls[e.lo:e.hi]
                ok = pred >= 0
                np.minimum.at(cut, np.array([slot[int(p)] for p in pred[ok]], dtype=np.int64), rows[ok])

        sweep_back(program, self.fig, self.limit, rel, np.arange(len(rel.cols)), check=self.check,
                   on_placing=on_placing if program.kind != "real" else None)
        self.pass_cols[-1] = none_cols
        self.pass_lb[-1] = self.relax_lb[-1] if program.kind == "real" else \
            max(self.relax_lb[-1], min(cut[-1], float(rel.h[C0, 0, none_cols].max())))
        for cls in classes:
            self.pass_cols[cls] = any_cols
            self.pass_lb[cls] = max(self.relax_lb[ANY], float(cut[slot[cls]]))
        return any(lb < self.beat() for lb in self.pass_lb.values())

    def _open_passes(self) -> None:
        """The passes still open, each on prices near the best of the relaxation it belongs to, swept back."""
        self.check(1)
        rel, program = self.rel, self.program
        assert rel is not None
        still = [cls for cls in self.pass_lb if self.pass_lb[cls] < self.beat()]
        before = len(rel.cols)
        lower = rel.lower_bound()
        near = {}
        for cls in still:
            cols = self.relax_cols[-1 if cls == -1 else ANY]
            lam = float(rel.cols.lam[cols[int(np.argmax(lower[cols]))]])
            near[cls] = lam * NEAR if lam > 0 else self.lam0 * GRID[1] * np.array([0.0, 0.01, 0.03, 0.1, 0.3])
        rel = self._relax(Columns.join([self._columns([(cls, self.p_bytes.get(cls, 0.0))], near[cls])
                                        for cls in still]), self.check)
        own, offset = {}, before
        for cls in still:
            own[cls] = np.arange(offset, offset + len(near[cls]))
            offset += len(near[cls])
        cut = {cls: _INF for cls in still}
        # The first columns' bounds through a placing edge, per predecessor (the same for every class pass).
        first = {cls: EdgeBounds(rel, program, self.fig, cols) for cls, cols in self.relax_cols.items()}

        def on_placing(e: Edge, j: int, through: np.ndarray) -> None:
            preds = np.arange(e.lo, e.hi)
            first_bound = {cls: bound(e, j, preds) for cls, bound in first.items()}
            for cls in still:
                rows = np.maximum(through[:, own[cls] - before].max(axis=1), first_bound[-1 if cls == -1 else ANY])
                cut[cls] = min(cut[cls], float(rows.min()))

        sweep_back(program, self.fig, self.limit, rel, np.arange(before, len(rel.cols)), check=self.check,
                   on_placing=on_placing if program.kind != "real" else None)
        for cls in still:
            sel = np.concatenate([self.pass_cols[cls], own[cls]])
            lb = max(self.pass_lb[cls], rel.close_cut(sel))
            if program.kind != "real":
                lb = max(lb, cut[cls] if cls != -1 else min(cut[cls], float(rel.h[C0, 0, sel].max())))
            self.pass_cols[cls], self.pass_lb[cls] = sel, lb
