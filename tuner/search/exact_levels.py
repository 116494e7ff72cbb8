"""The exact solver's dynamic program over memory levels for one pass: the fastest chain to every node of the
program using at most m memory units, over the transitions a filter leaves alive (those the bounds cannot rule
out), and the list behind any level, found again by recomputing its transitions instead of storing a predecessor
per cell."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from tuner.search.exact_program import C0, NODES, Edge, Program

__all__ = ["Levels"]

_INF = math.inf
_CHUNK = 512
"""Predecessor rows added up at once (a block of at most this many rows x levels)."""

Alive = Callable[[Edge, int, np.ndarray], np.ndarray]
"""(edge, candidate j, predecessor positions) -> which of them may still lead to a better list."""


class Levels:
    """One pass swept over the candidates: per node, the best latency at each memory level 0..B (rows are kept only
    for nodes some chain reaches)."""

    def __init__(self, program: Program, units: dict[str, np.ndarray], cls: int, per_graph: int, B: int,
                 pred_cls: np.ndarray, *, alive: Alive | None = None, check: Callable[[int], None] = lambda _: None
                 ) -> None:
        self.program, self.units, self.cls, self.per_graph, self.B = program, units, cls, per_graph, B
        self.pred_cls = pred_cls
        """Per position, the per-graph class (in this program's units) of the candidate there; -1 at the start."""
        self.alive = alive
        n = program.n
        self.row_of = np.full((NODES, n + 1), -1, dtype=np.int64)
        self.rows = np.full((64, B + 1), _INF)
        self.used = 0
        for node in program.starts(cls):
            row = self._row(node, 0)
            self.rows[row] = 0.0  # the empty start at every level: values are "at most m units"
        for j in range(n):
            check(j + 1)  # a candidate's transitions from its predecessors
            for e, units, preds in self._edges(j):
                row = self._row(e.to, j + 1)  # may grow the rows: index them after
                target = self.rows[row, units:]
                for at in range(0, len(preds), _CHUNK):  # a bounded block, however many predecessors are alive
                    some = preds[at:at + _CHUNK]
                    block = self.rows[self.row_of[e.frm, some], : B + 1 - units] + e.cost[some, None]
                    np.minimum(target, block.min(axis=0), out=target)

    def _row(self, node: int, pos: int) -> int:
        row = int(self.row_of[node, pos])
        if row < 0:
            # The last row is never handed out: a row index of -1 (no row) then reads inf, never a node's values.
            if self.used == len(self.rows) - 1:
                self.rows = np.concatenate([self.rows, np.full_like(self.rows, _INF)])
            row = self.used
            self.used += 1
            self.row_of[node, pos] = row
        return row

    def _edges(self, j: int) -> list[tuple[Edge, int, np.ndarray]]:
        """The alive transitions adding candidate j: (edge, units it charges, predecessor positions with rows)."""
        out = []
        for e in self.program.edges(j):
            if e.hi <= e.lo or not e.enabled(self.cls):
                continue
            units = int(round(e.base(self.units, j))) + (self.per_graph if e.per_graph else 0)
            if units > self.B:
                continue
            have = self.row_of[e.frm, e.lo:e.hi] >= 0
            if e.placing:
                have &= self.pred_cls[e.lo:e.hi] == self.cls
            preds = e.lo + np.flatnonzero(have)
            if len(preds) and self.alive is not None:
                preds = preds[self.alive(e, j, preds)]
            if len(preds):
                out.append((e, units, preds))
        return out

    def best(self, limit: np.ndarray) -> tuple[float, tuple[int, ...]]:
        """The fastest closed chain within B units and its widths (inf, () when none), for `limit`: per candidate, the
        most units a list topped by it may take (< 0: none may top there)."""
        totals, where = self._close(limit, np.array([self.B]))
        if not np.isfinite(totals[0]):
            return _INF, ()
        return float(totals[0]), self.backtrack(*(int(w) for w in where[0]))

    def best_levels(self, limit: np.ndarray) -> tuple[np.ndarray, Callable[[int], tuple[int, ...]]]:
        """Every level's fastest closed chain: (latency per level 0..B, level -> its widths)."""
        totals, where = self._close(limit, np.arange(self.B + 1))
        return totals, lambda m: self.backtrack(*(int(w) for w in where[m])) if where[m][0] >= 0 else ()

    def _close(self, limit: np.ndarray, levels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per level in `levels`: the best closed chain using at most that many units, and (node, position, level)
        of the top it closes at (-1 where none)."""
        B, p = self.B, self.program
        totals = np.full(len(levels), _INF)
        where = np.full((len(levels), 3), -1, dtype=np.int64)
        extra = self.units["extra"]
        for j in range(p.n):
            e_j = int(round(extra[j]))
            cap = min(B, int(limit[j]))
            if e_j > cap:
                continue
            for st in (0, 1):
                row = int(self.row_of[C0 + st, j + 1])
                if row < 0 or not np.isfinite(p.close_tail[st, j]):
                    continue
                ok = np.flatnonzero(levels >= e_j)
                src = np.minimum(levels[ok] - e_j, cap - e_j)  # levels above the cap take the best within it
                cand = self.rows[row, src] + p.close_tail[st, j]
                better = cand < totals[ok] - 1e-15
                if better.any():
                    at = ok[better]
                    totals[at] = cand[better]
                    where[at] = np.stack([np.full(len(at), C0 + st), np.full(len(at), j + 1), src[better]], axis=1)
        return totals, where

    def backtrack(self, node: int, pos: int, level: int) -> tuple[int, ...]:
        """The widths of the chain behind a node's level: each step re-derives the transition that set the value."""
        members = []
        while pos > 0:
            members.append(int(self.program.c[pos - 1]))
            value = self.rows[self.row_of[node, pos], level]
            found = None
            for e, units, preds in self._edges(pos - 1):
                if e.to != node or units > level:
                    continue
                cand = self.rows[self.row_of[e.frm, preds], level - units] + e.cost[preds]
                i = int(np.argmin(cand))
                if found is None or cand[i] < found[0]:
                    found = (float(cand[i]), e.frm, int(preds[i]), level - units)
            assert found is not None and found[0] <= value, "backtrack lost its chain"
            _, node, pos, level = found
        return tuple(sorted(members))
