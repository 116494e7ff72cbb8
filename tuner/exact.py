"""The exact solver: the fastest capture list that vLLM starts with (its graph-memory ESTIMATE leaves the required
KV cache) and whose real capture fits, under the cost model; the yardstick every optuna study is held to.

Lagrangian bounds (`tuner.exact_bounds`) over the program of `tuner.exact_program` find good lists and rule out
nearly every transition that cannot lead to a better one; a dynamic program over memory levels
(`tuner.exact_levels`) over what is left proves the optimum. Past a time budget the best list found is returned with
a proven lower bound on the optimum."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from tuner.costmodel import GIB, CostModel, Evaluation
from tuner.exact_bounds import Columns, EdgeBounds, Relaxation, TimeUp, float_slack, relax, sweep_back
from tuner.exact_levels import Levels
from tuner.exact_program import (ANY, C0, FIGURES, Edge, Program, latency_layers, memory_figures, round_up,
                                 window_query_len)

__all__ = ["APPROXIMATED", "ExactResult", "SearchError", "brute_force", "exact_solve", "pareto_front", "round_up"]

log = logging.getLogger(__name__)

_INF = math.inf
_TIE = 2e-14
"""Lists within this share of the list to beat (or within twice the float error of a sum over the candidates) are
ties, not worth proving faster: the same sums in another order differ by about as much."""
_GRID = np.concatenate([[0.0], np.logspace(-3, 4, 15)])
"""Prices of a byte tried first, in units of the empty list's latency per budget byte (steps of 10^0.5)."""
_NEAR = 10.0 ** np.array([-1 / 3, -1 / 6, 0.0, 1 / 6, 1 / 3])
"""Prices tried per pass, as multiples of the best first price of the relaxation it belongs to."""
_TINY = 1e-6
"""A price (in the units of _GRID) that only breaks ties between chains of equal latency."""
APPROXIMATED = ("the program approximates the step latency (several speculative tiers, or DFlash under cudagraph_mode "
                "FULL)")
"""Why an answer whose latency layers are not the cost model's is not proven (and has no bound)."""


class SearchError(ValueError):
    """The search cannot run (e.g. not even the empty list leaves the required KV cache); one line."""


@dataclass(frozen=True)
class ExactResult:
    """The exact solver's answer under the cost model."""

    best: Evaluation
    """Fastest list that fits both of vLLM's memory conditions (past the time budget: the fastest found)."""
    front: list[Evaluation]
    """Latency/graph-memory Pareto front of fitting lists found, by increasing memory."""
    memory_unit_bytes: int
    """Memory was counted in units of this many bytes (exact when `exact_memory`, else rounded to the nearest
    unit and the answer re-checked in bytes)."""
    exact_memory: bool
    """True when the answer is the optimum, not just a fitting list: the unit divides every memory figure, the
    condition the program does not carry (the real capture beside the estimate) cannot bind, the latency layers are
    the cost model's, and the solver finished within its time budget."""
    num_candidates: int
    """Candidate widths the program ran over."""
    resource: str = "estimate"
    """What the program's memory axis counted: vLLM's `estimate` or the `real` pool."""
    lower_bound_ms: float | None = None
    """A proven lower bound on the optimum's expected step latency (the answer's own when proven); None where none
    is proven (the program approximates several decode tiers)."""
    stopped_early: bool = False
    """The time budget ran out before the optimum was proven."""
    seconds: float = 0.0
    """Wall time the solver took."""
    passes: int = 1
    """Passes of the program (one per value of vLLM's extrapolated per-graph term, and one without a second)."""
    level_solves: int = 0
    """Passes the dynamic program over memory levels solved (0: the bounds alone proved the answer, or stopped)."""
    unproven: tuple[str, ...] = ()
    """Why the answer is not proven optimal (empty when it is)."""

    @property
    def gap(self) -> float | None:
        """Proven bound on how much slower the answer is than the optimum (0 when proven; None: no bound)."""
        if self.exact_memory:
            return 0.0
        if self.lower_bound_ms is None or self.lower_bound_ms <= 0:
            return None
        return max(0.0, self.best.expected_step_ms / self.lower_bound_ms - 1.0)

    def caveat(self) -> str:
        """One sentence on an answer not proven optimal: why, and how far from the optimum it can be ("" if proven)."""
        if self.exact_memory:
            return ""
        gap = self.gap
        bound = ("no bound on its gap is proven" if gap is None or self.lower_bound_ms is None else
                 f"it is within {gap:.2%} of the optimum (a proven lower bound: {self.lower_bound_ms:.4f} ms)")
        return f"the exact solver's answer fits both memory conditions but is not proven optimal " \
               f"({'; '.join(self.unproven)}): {bound}"


def exact_solve(model: CostModel, *, memory_buckets: int = 2048, candidates: Sequence[int] | None = None,
                front_points: int = 40, seconds: float | None = None, clock: Callable[[], float] = time.monotonic,
                incumbents: Sequence[Sequence[int]] = (), bounds: bool = True) -> ExactResult:
    """Fastest capture list over `candidates` (default: the model's) that fits vLLM's two memory conditions.

    The program (`tuner.exact_program`): a list is a path through the sorted candidates. Its latency splits into
    per-gap terms between consecutive members (steps padded up to the upper one), FULL decode graphs into q-wide
    windows (a window's graph is the rounded width of its lowest member); the top window is special in vLLM (its
    rounded graph may exceed the max and is then not captured), so nodes carry a flag for it.

    Memory. vLLM sizes the KV cache from its graph-memory ESTIMATE, which depends on a list only through additive
    real-pool terms, graph counts and the two largest graphs of each extrapolated mode. The program counts that
    estimate against `requested - non_kv - required_kv`:
    - V2 with FULL decode windows: every PIECEWISE graph at its real delta (the top at its standalone footprint);
      FULL windows as `first + (n - 1) * max(second, 1 MiB)`. For each value p of the per-graph term, one pass
      charges every window p while a chain is in phase A; a chain places its top window (phase C: no further window)
      at its own sample, over a second window of per-graph term p. Lists with no window below the top have a pass
      of their own. A list is thus costed exactly in the pass of its own p.
    - V1 (every mode; its lists are multiples of q up to the widest decode batch) and V2 FULL mode: `f(top) +
      (k - 1) * g(second)`; per value p of g, members cost p and the top is placed (phase C) at f(top) only over a
      second member whose g is p.
    - the estimate switched off (or equal to the real pool): the real pool, additive, against what vLLM does not
      request.
    The other condition, that the real capture fits beside the estimate (`real - estimate <= total - requested`),
    is bounded per pass: when even the worst list cannot break it, the answer is exact in both; otherwise the
    answer is re-checked and the result says it is not proven optimal.

    Search. Lagrangian relaxations in bytes (latency + λ x memory, for a grid of λ, every pass at once) give lower
    bounds per pass, per top and per transition, and lists that fit; with the best of those (and `incumbents`, and
    vLLM's default within the candidates) as the list to beat, passes and transitions whose bound cannot beat it are
    dropped, and a dynamic program over memory levels solves what is left, pass by pass from the most promising.
    Levels count `memory_unit_bytes`: exact when one unit divides every figure and the budget spans at most
    `memory_buckets` of them, else rounded to the nearest unit with the answer re-checked in bytes (re-solved under
    a lower budget on an overshoot, a rounded-up pass last), so the answer always fits.

    Time. Past `seconds` (None: no limit; read with `clock`), the fastest fitting list found so far is returned with
    `stopped_early` and a proven lower bound on the optimum (one forward sweep of the bounds always runs first).
    `bounds=False` skips the bounds: every pass over every transition (the reference the pruning is tested against).
    """
    return _Solve(model, memory_buckets=memory_buckets, candidates=candidates, front_points=front_points,
                  seconds=seconds, clock=clock, incumbents=incumbents, bounds=bounds).run()


class _Solve:
    """One exact solve: the program, its bounds, the dynamic program over levels, and the answer."""

    def __init__(self, model: CostModel, *, memory_buckets: int, candidates: Sequence[int] | None,
                 front_points: int, seconds: float | None, clock: Callable[[], float],
                 incumbents: Sequence[Sequence[int]], bounds: bool) -> None:
        self.model, self.bounds = model, bounds
        self.cands = sorted({int(c) for c in (model.candidates if candidates is None else candidates)})
        self.memory_buckets, self.front_points, self.incumbents = memory_buckets, front_points, incumbents
        self.clock = clock
        self.started = clock()
        self.deadline = None if seconds is None else self.started + seconds
        self.seen: dict[tuple[int, ...], Evaluation] = {}
        self.pool: dict[tuple[int, ...], float] = {}
        """Lists the relaxations found that fit their budget in bytes, with their bytes (for the front)."""
        self.stopped = self.dp_failed = self.capture_binds = False
        self.tie = 0.0
        self.passes = 1
        self.level_solves = 0
        self.rel: Relaxation | None = None
        self.relax_cols: dict[int, np.ndarray] = {}
        self.relax_lb: dict[int, float] = {}
        self.pass_cols: dict[int, np.ndarray] = {}
        self.pass_lb: dict[int, float] = {}
        self.solved: dict[int, float] = {}

    def check(self) -> None:
        if self.deadline is not None and self.clock() > self.deadline:
            raise TimeUp

    # ------------------------------------------------------------------------------------------------ answer
    def run(self) -> ExactResult:
        model = self.model
        empty = model.evaluate(())
        if not empty.feasible:
            raise SearchError(
                f"no capture list fits, not even the empty one: KV cache {empty.kv_available_bytes / GIB:.2f} GiB "
                f"without graphs < required {model.budget.required_kv_bytes / GIB:.2f} GiB"
            )
        if model.cudagraph_mode == "NONE" or not self.cands:
            return ExactResult(empty, [empty], 1, True, 0, lower_bound_ms=empty.expected_step_ms)
        self._setup(empty)
        self.best, self.ub = empty, empty.expected_step_ms  # the list to beat, and its latency in program terms
        self.seen[()] = empty
        allowed = set(self.cands)
        for sizes in [model.default_sizes, *self.incumbents]:
            self._consider(tuple(sorted({int(w) for w in sizes} & allowed)))
        try:
            if self.bounds:
                self._bounds()
            self._levels()
        except TimeUp:
            self.stopped = True
        proven = (self.exact_memory and self.layers_exact and not self.headroom and not self.stopped
                  and not self.dp_failed and not self.capture_binds)
        seconds = self.clock() - self.started
        if self.stopped:
            log.info("exact solver: stopped at its time budget after %.1f s", seconds)
        unproven = [why for why, yes in (
            (f"stopped at its time budget after {seconds:.1f} s", self.stopped),
            (f"memory figures rounded to units of {self.unit / (1 << 20):.3f} MiB", not self.exact_memory),
            ("the real capture could outgrow vLLM's estimate by more than the memory vLLM does not request",
             self.headroom or self.capture_binds),
            (APPROXIMATED, not self.layers_exact),
            ("no rounded answer fit in bytes", self.dp_failed)) if yes]
        return ExactResult(self.best, self._front(), self.unit, bool(proven), len(self.cands), self.resource,
                           self._lower_bound(proven), self.stopped, seconds, self.passes, self.level_solves,
                           () if proven else tuple(unproven))

    def _consider(self, sizes: tuple[int, ...], program_ms: float | None = None) -> Evaluation:
        """Evaluate a list; if it fits, it may become the answer and the latency to beat (`program_ms`: its latency
        in the program's terms, which are the cost model's when the layers are exact)."""
        e = self.seen.get(sizes)
        if e is None:
            e = self.seen[sizes] = self.model.evaluate(sizes)
        if e.feasible:
            if e.expected_step_ms < self.best.expected_step_ms - 1e-12:
                self.best = e
            if program_ms is not None:
                self.ub = min(self.ub, program_ms)
            elif self.layers_exact:
                self.ub = min(self.ub, e.expected_step_ms)
        return e

    def _lower_bound(self, proven: bool) -> float | None:
        """A proven lower bound on the optimum: per pass the exact optimum where the program over levels solved it
        exactly, else its Lagrangian bound; never above the latency to beat (a fitting list's)."""
        if not self.layers_exact:
            return None  # the program's latency is not the cost model's: nothing it bounds holds for the model
        if proven:
            return self.best.expected_step_ms
        if not self.bounds:
            return None
        parts = [self.ub]
        if self.pass_lb:
            for cls, lb in self.pass_lb.items():
                solved = self.solved.get(cls)
                parts.append(solved if self.exact_memory and solved is not None else lb)
        else:
            parts += list(self.relax_lb.values())
        return float(min(min(parts), self.best.expected_step_ms))

    def _front(self) -> list[Evaluation]:
        """Non-dominated fitting lists found (the relaxations' lists spread over memory, those evaluated anyway),
        thinned to `front_points`, ending at the answer."""
        pool = sorted(self.pool, key=self.pool.__getitem__)
        if len(pool) > self.front_points:
            pool = [pool[i] for i in np.unique(np.linspace(0, len(pool) - 1, self.front_points).round().astype(int))]
        for sizes in pool:
            self._consider(sizes)
        front = pareto_front([e for e in self.seen.values() if e.feasible] + [self.best])
        if len(front) > self.front_points:
            keep = np.unique(np.linspace(0, len(front) - 1, self.front_points).round().astype(int))
            front = [front[i] for i in keep]
        return front

    # ------------------------------------------------------------------------------------------------ setup
    def _setup(self, empty: Evaluation) -> None:
        model = self.model
        sep = model.separate_decode
        q = window_query_len(model) if sep else model.q
        decode_limit = q * model.serving.max_num_seqs
        c = np.array(self.cands, dtype=np.int64)
        n = len(c)
        r = round_up(c, q) if sep else c.copy()
        layers, constant, self.layers_exact = latency_layers(model, c, r, q)
        mem, self.budget_bytes, self.resource = memory_figures(model, c, r)
        self.mem = mem

        # Memory in units: when one unit divides every figure (the gcd) and the budget spans few enough of them, the
        # program is exact. Otherwise figures are rounded to the nearest unit (errors cancel instead of adding up) and
        # the answer is checked in exact bytes; if it overshoots, the budget is lowered by the overshoot and re-solved.
        arrays = (mem.member, mem.window, mem.first, mem.extra, mem.per_graph, mem.added)
        figures = np.rint(np.concatenate(arrays)).astype(np.int64)
        gcd = int(np.gcd.reduce(figures[figures > 0])) if np.any(figures > 0) else 1
        self.everything = int(mem.member.sum() + mem.window.sum() + mem.extra.max() + mem.first.max()
                              + mem.per_graph.max() * n + mem.added.sum())  # no list can need more than this
        span = max(1, min(self.budget_bytes, self.everything))
        self.exact_memory = span // gcd <= self.memory_buckets
        self.unit = gcd if self.exact_memory else -(-span // self.memory_buckets)

        self.fig = {name: np.rint(getattr(mem, name)).astype(float) for name in FIGURES}  # bytes, for the bounds
        self.limit = (np.asarray(mem.top_budget, dtype=float) if mem.top_budget is not None
                      else np.full(n, float(self.budget_bytes)))
        self.classes = self.to_units(mem.per_graph, "nearest") if mem.kind != "real" else np.zeros(n, np.int64)
        self.program = Program(mem.kind, c, r, q, decode_limit, sep, layers, empty.expected_step_ms, constant,
                               self.classes)
        classes = sorted(set(self.classes.tolist())) if mem.kind != "real" else []
        self.passes = 1 + len(classes)
        self.headroom = any(self._headroom_can_break(float(np.max(mem.per_graph[self.classes == p]))) for p in classes)

    def to_units(self, x: np.ndarray, how: str) -> np.ndarray:
        x = np.rint(x).astype(np.int64)
        if how == "ceil":
            return -(-x // self.unit)
        return x // self.unit if self.exact_memory else np.rint(x / self.unit).astype(np.int64)

    def _headroom_can_break(self, p_bytes: float) -> bool:
        """Whether some list of a pass could have its real capture exceed estimate + slack."""
        model, mem = self.model, self.mem
        if self.resource == "real":
            return False  # the program counts the real pool itself (or it equals the estimate)
        slack = getattr(model.budget, "slack_bytes", 0)
        if mem.kind == "window":
            # real - estimate = sum over the FULL windows below the top two of (delta - p), minus (p - second).
            p = self.program
            windows = np.unique(p.r[p.r <= p.decode_limit])
            worst = float(np.maximum(0.0, model.graph_bytes("FULL", windows)[1] - p_bytes).sum())
        else:
            worst = float(np.max(mem.real_top - mem.first) + np.maximum(0.0, mem.real_member - p_bytes).sum())
        return worst > slack

    # ------------------------------------------------------------------------------------------------ bounds
    def _bounds(self) -> None:
        """Relax every pass at once on a wide grid of prices (always run to the end: the bound of last resort), sweep
        back for bounds per pass, node and transition, then relax the passes still open on prices near their best."""
        program, kind = self.program, self.program.kind
        lam0 = program.base / max(float(self.budget_bytes), 1.0)
        classes = sorted(set(self.classes.tolist())) if kind != "real" else []
        p_bytes = {cls: float(self.mem.per_graph[self.classes == cls].min()) for cls in classes}
        groups = [(-1, 0.0)] + ([(ANY, min(p_bytes.values()))] if classes else [])
        # Price 0 first (the fastest chains, memory aside): where they fit, nothing else is needed. Beside it a price
        # too small to trade any latency for memory, which breaks price 0's ties (graphs no step uses) toward less.
        first = Columns.join([Columns(np.array([cls, cls]), np.array([0.0, lam0 * _TINY]), np.array([pg, pg]))
                              for cls, pg in groups])
        rel = self.rel = relax(program, self.fig, self.limit, first, check=lambda: None)
        self.tie = 2.0 * float(float_slack(program, self.fig, self.limit, first)[0])  # at λ = 0: latency sums only
        self._chains(rel, range(len(first)))
        if min(rel.lower_bound()[rel.cols.lam == 0]) < self._beat():
            more = Columns.join([Columns(np.full(len(_GRID) - 1, cls), lam0 * _GRID[1:], np.full(len(_GRID) - 1, pg))
                                 for cls, pg in groups])
            rel = self.rel = _joined(rel, relax(program, self.fig, self.limit, more, check=lambda: None))
            self._chains(rel, range(len(first), len(rel.cols)))
            first = rel.cols
        self.relax_cols = {cls: np.flatnonzero(rel.cols.cls == cls) for cls, _ in groups}
        self.relax_lb = {cls: rel.close_cut(cols) for cls, cols in self.relax_cols.items()}
        if min(self.relax_lb.values()) >= self._beat():
            if len(first) == 2 * len(groups) and self.front_points > 1:
                # Settled at price 0: a few prices more, only for lists that trade latency for memory (the front).
                cls, pg = groups[-1]
                lams = lam0 * np.logspace(-1, 3, 8)
                more = relax(program, self.fig, self.limit, Columns(np.full(8, cls), lams, np.full(8, pg)),
                             check=self.check)
                self._chains(more, range(8), best=0)
            return  # the list to beat is the optimum
        self.check()

        # Back over the first columns. Every list of a pass places its top over its second (a class pass), or over
        # the start or never (the -1 pass): the least bound over those placing edges bounds the pass.
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

        sweep_back(program, self.fig, self.limit, rel, np.arange(len(first)), check=self.check,
                   on_placing=on_placing if kind != "real" else None)
        self.pass_cols[-1] = none_cols
        self.pass_lb[-1] = self.relax_lb[-1] if kind == "real" else \
            max(self.relax_lb[-1], min(cut[-1], float(rel.h[C0, 0, none_cols].max())))
        for cls in classes:
            self.pass_cols[cls] = any_cols
            self.pass_lb[cls] = max(self.relax_lb[ANY], float(cut[slot[cls]]))
        still = [cls for cls in self.pass_lb if self.pass_lb[cls] < self._beat()]
        if not still:
            return
        self.check()

        # The passes still open, on prices near the best of the relaxation each belongs to.
        at_best = {cls: float(first.lam[cols[int(np.argmax(rel.lower_bound()[cols]))]])
                   for cls, cols in self.relax_cols.items()}
        near = {cls: (lambda lam: lam * _NEAR if lam > 0 else lam0 * _GRID[1] * np.array([0.0, 0.01, 0.03, 0.1, 0.3]))(
            at_best[-1 if cls == -1 else ANY]) for cls in still}
        second = Columns.join([Columns(np.full(len(near[cls]), cls), near[cls],
                                       np.full(len(near[cls]), p_bytes.get(cls, 0.0))) for cls in still])
        rel = self.rel = _joined(rel, relax(program, self.fig, self.limit, second, check=self.check))
        own, offset = {}, len(first)
        for cls in still:
            own[cls] = np.arange(offset, offset + len(near[cls]))
            offset += len(near[cls])
        new = np.arange(len(first), len(rel.cols))
        cut2 = {cls: _INF for cls in still}

        # The first columns' bounds through a placing edge, per predecessor (the same for every class pass).
        relaxed = {cls: EdgeBounds(rel, program, self.fig, cols) for cls, cols in self.relax_cols.items()}

        def on_placing_own(e: Edge, j: int, through: np.ndarray) -> None:
            preds = np.arange(e.lo, e.hi)
            first_bound = {cls: bound(e, j, preds) for cls, bound in relaxed.items()}
            for cls in still:
                at = own[cls] - len(first)
                rows = np.maximum(through[:, at].max(axis=1), first_bound[-1 if cls == -1 else ANY])
                cut2[cls] = min(cut2[cls], float(rows.min()))

        sweep_back(program, self.fig, self.limit, rel, new, check=self.check,
                   on_placing=on_placing_own if kind != "real" else None)
        for cls in still:
            sel = np.concatenate([self.pass_cols[cls], own[cls]])
            lb = max(self.pass_lb[cls], rel.close_cut(sel))
            if kind != "real":
                lb = max(lb, cut2[cls] if cls != -1 else min(cut2[cls], float(rel.h[C0, 0, sel].max())))
            self.pass_cols[cls], self.pass_lb[cls] = sel, lb
        self._chains(rel, range(len(first), len(rel.cols)))

    def _beat(self) -> float:
        """A bound at or above this rules a list out: it cannot beat the list to beat by more than float noise."""
        return self.ub - max(_TIE * self.ub, self.tie)

    def _chains(self, rel: Relaxation, cols: range, best: int = 4) -> None:
        """The columns' cheapest chains that fit in bytes: the `best` fastest evaluated (the list to beat), all kept
        for the front."""
        found: dict[tuple[int, ...], tuple[float, float]] = {}
        for col in cols:
            sizes, lat, mem, fits = rel.chain(col, self.program, self.fig["extra"], self.limit)
            if fits and (sizes not in found or lat < found[sizes][0]):
                found[sizes] = (lat, mem)
        for sizes in sorted(found, key=lambda s: found[s][0])[:best]:
            self._consider(sizes, found[sizes][0])
        self.pool.update((sizes, mem) for sizes, (_, mem) in found.items())

    # ------------------------------------------------------------------------------------------------ levels
    def _levels(self) -> None:
        """The dynamic program over memory levels, pass by pass from the lowest bound, over the transitions the bounds
        leave alive; re-solved under a lower budget when the rounded answer overshoots in bytes."""
        program, mem, n = self.program, self.mem, self.program.n
        budget_limit = self.budget_bytes
        how = "nearest"
        for attempt in range(5):
            if attempt == 4:
                how = "ceil"  # last resort: every figure rounded up, which always fits the estimate
                budget_limit = self.budget_bytes
            units = {name: self.to_units(getattr(mem, name), how).astype(float) for name in FIGURES}
            max_units = int(self.to_units(np.array([self.everything]), "ceil")[0])
            B = int(max(0, min(budget_limit // self.unit, max_units)))
            if mem.top_budget is not None:
                top = mem.top_budget - (self.budget_bytes - budget_limit)
                limit = np.where(top >= 0, np.floor(np.maximum(top, 0) / self.unit), -1).astype(np.int64)
            else:
                limit = np.full(n, B, dtype=np.int64)
            classes = self.to_units(mem.per_graph, how) if program.kind != "real" else np.zeros(n, np.int64)
            same = bool(np.array_equal(classes, self.classes))
            pred_cls = np.concatenate([[-1], classes]).astype(np.int64)
            passes = [(-1, 0)] + ([(int(p), int(p)) for p in sorted(set(classes.tolist()))]
                                  if program.kind != "real" else [])
            results = []
            for cls, p in sorted(passes, key=lambda cp: self._pass_bound(cp[0], same)):
                if self._pass_bound(cls, same) >= self._beat():
                    continue  # no list of the pass can beat the list to beat
                levels = Levels(program, units, cls, p, B, pred_cls, alive=self._alive(cls, same), check=self.check)
                self.level_solves += 1
                value, sizes = levels.best(limit)
                if attempt == 0:
                    self.solved[cls] = value
                if math.isfinite(value):
                    results.append((value, sizes))
                    self._consider(sizes, value)
            if not results or min(results)[0] >= self._beat():
                return  # nothing the program finds beats the list to beat
            value, sizes = min(results)
            e = self._consider(sizes)
            if e.feasible:
                return
            if not e.reason and e.starts and not e.capture_fits:
                # The condition the program does not carry bound: the fastest list of any pass and level that fits
                # both is the answer, feasible but not proven optimal.
                self.capture_binds = True
                self._fastest_fitting(units, B, passes, limit, pred_cls)
                return
            budget_limit -= max(self.unit, -e.kv_margin_bytes)
        self.dp_failed = True

    def _pass_bound(self, cls: int, same: bool) -> float:
        """The bound on every list of a pass (its own where the bounds' classes are this attempt's)."""
        if same and cls in self.pass_lb:
            return self.pass_lb[cls]
        return self.relax_lb.get(-1 if cls == -1 else ANY, -_INF)

    def _alive(self, cls: int, same: bool) -> Callable[[Edge, int, np.ndarray], np.ndarray] | None:
        """Which transitions of a pass may still lead to a list faster than the one to beat."""
        rel = self.rel
        if rel is None:
            return None
        sel = self.pass_cols[cls] if same and cls in self.pass_cols else self.relax_cols[-1 if cls == -1 else ANY]
        threshold, bound = self._beat(), EdgeBounds(rel, self.program, self.fig, sel)
        return lambda e, j, preds: bound(e, j, preds) < threshold

    def _fastest_fitting(self, units: dict[str, np.ndarray], B: int, passes: list[tuple[int, int]],
                         limit: np.ndarray, pred_cls: np.ndarray, per_pass: int = 400) -> None:
        """Every pass over every level, nothing ruled out: the fastest list where a pass's latency drops that fits
        both conditions."""
        for cls, p in passes:
            totals, backtrack = Levels(self.program, units, cls, p, B, pred_cls, check=self.check).best_levels(limit)
            self.level_solves += 1
            drops = [m for m in range(B + 1) if m == 0 or totals[m] < totals[m - 1] - 1e-12]
            for m in drops[::-1][:per_pass]:
                if math.isfinite(totals[m]):
                    self._consider(backtrack(m))


def _joined(a: Relaxation, b: Relaxation) -> Relaxation:
    """Two forward relaxations of one program as one, column sets side by side."""
    parts = {k: np.concatenate([getattr(a, k), getattr(b, k)], axis=-1)
             for k in ("f", "lat", "mem", "back_pos", "back_node", "close", "h")}
    return Relaxation(Columns.join([a.cols, b.cols]), **parts)


def pareto_front(evals: Sequence[Evaluation]) -> list[Evaluation]:
    """Non-dominated (expected_step_ms, graph_memory_bytes) points, by increasing memory."""
    out: list[Evaluation] = []
    for e in sorted(evals, key=lambda e: (e.graph_memory_bytes, e.expected_step_ms)):
        if not out or e.expected_step_ms < out[-1].expected_step_ms - 1e-12:
            out.append(e)
    return out


def brute_force(model: CostModel, candidates: Sequence[int] | None = None) -> Evaluation:
    """Every subset of the candidates (keep to <= 12 of them), for tests: the fastest feasible list."""
    cands = sorted(model.candidates if candidates is None else candidates)
    if len(cands) > 16:
        raise ValueError(f"brute_force over {len(cands)} candidates would take 2^{len(cands)} evaluations")
    best = model.evaluate(())
    if not best.feasible:
        raise SearchError("no capture list fits, not even the empty one")
    for size in range(1, len(cands) + 1):
        for subset in combinations(cands, size):
            e = model.evaluate(subset)
            if e.feasible and e.expected_step_ms < best.expected_step_ms - 1e-12:
                best = e
    return best
