"""The exact solver: the fastest capture list that vLLM starts with (its graph-memory ESTIMATE leaves the required
KV cache) and whose real capture fits, under the cost model; the yardstick every optuna study is held to.

Lagrangian bounds (`tuner.search.exact_bounds`) over the program of `tuner.search.exact_program` find good lists and
rule out the passes and transitions that cannot lead to a better one; a dynamic program over memory levels
(`tuner.search.exact_levels`) over what is left proves the optimum. This module sets the program up, runs the two, and
answers: past a time budget, the best list found with a proven lower bound on the optimum."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from itertools import combinations

import numpy as np

from tuner.model.costmodel import GIB, CostModel, Evaluation
from tuner.model.reference_lists import reference_lists
from tuner.search.exact_answer import (APPROXIMATED, DEFAULT_WORK, KEPT, ROUNDED, ExactResult, SearchError,
                                       improve_locally, pareto_front, spent)
from tuner.search.exact_bounds import Bounds, Columns, Relaxation, TimeUp, float_slack
from tuner.search.exact_levels import Levels
from tuner.search.exact_startup import within_startup
from tuner.search.exact_program import (FIGURES, Edge, Program, counted_bytes, latency_layers, memory_figures, round_up,
                                 window_query_len)

__all__ = ["APPROXIMATED", "DEFAULT_WORK", "KEPT", "ROUNDED", "ExactResult", "SearchError", "brute_force", "exact_solve",
           "pareto_front", "round_up"]

log = logging.getLogger(__name__)

_TIE = 2e-14
"""Lists within this share of the list to beat (or within twice the float error of a sum over the candidates) are
ties, not worth proving faster: the same sums in another order differ by about as much."""
def exact_solve(model: CostModel, *, memory_buckets: int = 2048, candidates: Sequence[int] | None = None,
                front_points: int = 40, work: int | None = DEFAULT_WORK, seconds: float | None = None,
                clock: Callable[[], float] = time.monotonic, incumbents: Sequence[Sequence[int]] = (),
                bounds: bool = True, memory_cap_bytes: int | None = None,
                keep_within_ms: float | None = None) -> ExactResult:
    """Fastest capture list over `candidates` (default: the model's) that fits vLLM's two memory conditions (and,
    with `memory_cap_bytes`, counts at most that many bytes on the program's memory axis: `counted_bytes`).

    The program (`tuner.search.exact_program`): a list is a path through the sorted candidates. Its latency splits into
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

    Work. Past `work` steps (`DEFAULT_WORK`; None: no limit), or past `seconds` of wall time where given (None, the
    default: no limit; read with `clock`; the answer then depends on the machine's load), the fastest fitting list
    found so far is returned with `stopped_early` and a proven lower bound on the optimum (the bounds' first forward sweeps, at price 0 and on
    the grid, always run to their end: they are that bound).
    `bounds=False` skips the bounds: every pass over every transition (the reference the pruning is tested against).

    Cap. `memory_cap_bytes` lowers the program's budget (each top's, where the rule has one per top) to the cap, and
    a list fits only when its counted memory is within it too: the answer and its lower bound are then those of the
    lists under the cap (`tuner.search.compact` asks for the fastest list under a cap to find the least memory within a
    tolerance of the fastest).

    Keep. `keep_within_ms`: nothing that could still be within that latency is pruned (only what can neither beat
    the answer nor be within it), and the dynamic program's every memory level is read: the least levels whose
    fastest list is within it keep that list (`ExactResult.kept`), so one solve finds the least memory within a
    latency (`tuner.search.compact`'s compact list) where the levels count memory exactly.
    """
    if memory_cap_bytes is not None and memory_cap_bytes < 0:
        raise ValueError(f"memory_cap_bytes={memory_cap_bytes} must be >= 0")
    # The lists the report compares the answer with start the search: no answer is beaten by a row of its report.
    incumbents = [*reference_lists(model).values(), *incumbents]
    if model.engine.split_lists:  # two lists against a KV cache sized after capture (vLLM 0.34)
        from tuner.search.exact_split import split_solve

        return split_solve(model, memory_buckets=memory_buckets, candidates=candidates, front_points=front_points,
                           work=work, seconds=seconds, clock=clock, incumbents=incumbents,
                           memory_cap_bytes=memory_cap_bytes, keep_within_ms=keep_within_ms)

    def solve(cap: int | None, steps: int | None, seeds: Sequence[Sequence[int]]) -> ExactResult:
        return _Solve(model, memory_buckets=memory_buckets, candidates=candidates, front_points=front_points,
                      work=steps, seconds=seconds, clock=clock, incumbents=seeds, bounds=bounds, cap=cap,
                      keep_ms=keep_within_ms).run()

    return within_startup(model, solve, memory_cap_bytes, work, incumbents)


class _Solve:
    """One exact solve: the program, its bounds, the dynamic program over levels, and the answer."""

    def __init__(self, model: CostModel, *, memory_buckets: int, candidates: Sequence[int] | None,
                 front_points: int, work: int | None, seconds: float | None, clock: Callable[[], float],
                 incumbents: Sequence[Sequence[int]], bounds: bool, cap: int | None, keep_ms: float | None) -> None:
        self.model, self.use_bounds, self.cap, self.keep_ms = model, bounds, cap, keep_ms
        self.kept: list[Evaluation] = []
        self.cands = sorted({int(c) for c in (model.candidates if candidates is None else candidates)})
        self.memory_buckets, self.front_points, self.incumbents = memory_buckets, front_points, incumbents
        self.clock = clock
        self.started = clock()
        self.budget_s, self.work_limit, self.work, self.spent_on = seconds, work, 0, ""
        self.deadline = None if seconds is None else self.started + seconds
        self.seen: dict[tuple[int, ...], Evaluation] = {}
        self.pool: dict[tuple[int, ...], float] = {}
        """Lists the relaxations found that fit their budget in bytes, with their bytes (for the front)."""
        self.stopped = self.dp_failed = self.capture_binds = False
        self.tie = 0.0
        self.passes = 1
        self.level_solves = 0
        self.solved: dict[int, float] = {}

    def check(self, steps: int = 1) -> None:
        """Count `steps` of work (a candidate's transitions from that many predecessors); past the work budget or the
        optional wall-clock one, stop."""
        self.work += steps
        if self.work_limit is not None and self.work > self.work_limit:
            self.spent_on = "work"
            raise TimeUp
        if self.deadline is not None and self.clock() > self.deadline:
            self.spent_on = "seconds"
            raise TimeUp

    def over_cap(self, e: Evaluation) -> int:
        """Bytes the list counts beyond the cap (<= 0: within it, or no cap)."""
        return 0 if self.cap is None else counted_bytes(self.model, e) - self.cap

    def fits(self, e: Evaluation) -> bool:
        """Both memory conditions, and the cap (the start-up budget is `within_startup`'s)."""
        return e.fits_memory and self.over_cap(e) <= 0

    # ------------------------------------------------------------------------------------------------ answer
    def run(self) -> ExactResult:
        model = self.model
        empty = model.evaluate(())
        if not empty.feasible:
            raise SearchError(model.nothing_fits(empty))
        if model.cudagraph_mode == "NONE" or not self.cands:
            kept = (empty,) if self.keep_ms is not None and empty.expected_step_ms <= self.keep_ms + 1e-12 else ()
            return ExactResult(empty, [empty], 1, True, 0, lower_bound_ms=empty.expected_step_ms, kept=kept)
        if model.program_gaps:  # the program's latency or memory is not the model's: the lists given, improved
            self.best = empty
            self.seen[()] = empty
            allowed = set(self.cands)
            for sizes in [model.default_sizes, *self.incumbents]:
                key = tuple(sorted({int(w) for w in sizes} & allowed))
                e = self.seen[key] = self.seen.get(key) or model.evaluate(key)
                if self.fits(e) and e.expected_step_ms < self.best.expected_step_ms:
                    self.best = e
            # One sweep of the candidates per pass, a few passes: the lists given are the study's and vLLM's.
            self.best = improve_locally(model, self.best, self.cands, evaluations=4 * len(self.cands), fits=self.fits)
            front = pareto_front([e for e in self.seen.values() if self.fits(e)] + [self.best])
            return ExactResult(self.best, front, 1, False, len(self.cands), lower_bound_ms=None,
                               seconds=self.clock() - self.started, unproven=tuple(model.program_gaps))
        self._setup(empty)
        self.best, self.ub = empty, empty.expected_step_ms  # the list to beat, and its latency in program terms
        self.seen[()] = empty
        allowed = set(self.cands)
        for sizes in [model.default_sizes, *self.incumbents]:
            self._consider(tuple(sorted({int(w) for w in sizes} & allowed)))
        try:
            if self.use_bounds:
                self.bounds.run()
            self._levels()
        except TimeUp:
            self.stopped = True
        if not self.layers_exact:
            self.best = improve_locally(self.model, self.best, self.cands, fits=self.fits)
        proven = (self.exact_memory and self.layers_exact and not self.headroom and not self.stopped
                  and not self.dp_failed and not self.capture_binds)
        seconds = self.clock() - self.started
        if self.stopped:
            log.info("exact solver: %s, after %.1f s", spent(self.work_limit, self.budget_s, self.spent_on), seconds)
        unproven = [why for why, yes in (
            (spent(self.work_limit, self.budget_s, self.spent_on), self.stopped),
            (f"{ROUNDED} {self.unit / (1 << 20):.3f} MiB", not self.exact_memory),
            ("the real capture could outgrow vLLM's estimate by more than the memory vLLM does not request",
             self.headroom or self.capture_binds),
            (APPROXIMATED, not self.layers_exact),
            ("no rounded answer fit in bytes", self.dp_failed)) if yes]
        return ExactResult(self.best, self._front(), self.unit, bool(proven), len(self.cands), self.resource,
                           self._lower_bound(proven), self.stopped, seconds, self.passes, self.level_solves,
                           () if proven else tuple(unproven), tuple(self.kept), work=self.work)

    def _consider(self, sizes: tuple[int, ...], program_ms: float | None = None) -> Evaluation:
        """Evaluate a list; if it fits, it may become the answer and the latency to beat (`program_ms`: its latency
        in the program's terms, which are the cost model's when the layers are exact)."""
        e = self.seen.get(sizes)
        if e is None:
            e = self.seen[sizes] = self.model.evaluate(sizes)
        if self.fits(e):
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
        if not self.use_bounds:
            return None
        parts = [self.ub]
        if self.bounds.pass_lb:
            for cls, lb in self.bounds.pass_lb.items():
                solved = self.solved.get(cls)
                parts.append(solved if self.exact_memory and solved is not None else lb)
        else:
            parts += list(self.bounds.relax_lb.values())
        return float(min(min(parts), self.best.expected_step_ms))

    def _front(self) -> list[Evaluation]:
        """Non-dominated fitting lists found (the relaxations' lists spread over memory, those evaluated anyway),
        thinned to `front_points`, ending at the answer."""
        pool = sorted(self.pool, key=self.pool.__getitem__)
        if len(pool) > self.front_points:
            pool = [pool[i] for i in np.unique(np.linspace(0, len(pool) - 1, self.front_points).round().astype(int))]
        for sizes in pool:
            self._consider(sizes)
        front = pareto_front([e for e in self.seen.values() if self.fits(e)] + [self.best])
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
        if self.cap is not None:  # before the units: a lower budget is counted in finer ones
            self.budget_bytes = min(self.budget_bytes, self.cap)
            if mem.top_budget is not None:
                mem.top_budget = np.minimum(mem.top_budget, float(self.cap))
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
        self.tie = 2.0 * float(float_slack(self.program, self.fig, self.limit,  # at price 0: latency sums only
                                           Columns(np.array([-1]), np.zeros(1), np.zeros(1)))[0])
        self.bounds = Bounds(self.program, self.fig, self.limit, self.budget_bytes, self.classes, mem.per_graph,
                             found=self._chains, beat=self._beat, check=self.check, front=self.front_points > 1)
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
    def _beat(self) -> float:
        """A bound at or above this rules a list out: it cannot beat the list to beat by more than float noise (nor,
        with `keep_ms`, be within that latency)."""
        beat = self.ub - max(_TIE * self.ub, self.tie)
        return beat if self.keep_ms is None else max(beat, self.keep_ms + max(_TIE * self.keep_ms, self.tie))

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
            read: list[tuple[np.ndarray, Callable[[int], tuple[int, ...]]]] = []  # per pass, every level (keep)
            for cls, p in sorted(passes, key=lambda cp: self.bounds.pass_bound(cp[0], same)):
                if self.bounds.pass_bound(cls, same) >= self._beat():
                    continue  # no list of the pass can beat the list to beat
                levels = Levels(program, units, cls, p, B, pred_cls, alive=self._alive(cls, same), check=self.check)
                self.level_solves += 1
                if self.keep_ms is not None and attempt == 0:
                    totals, backtrack = levels.best_levels(limit)
                    read.append((totals, backtrack))
                    value, sizes = (float(totals[B]), backtrack(B)) if math.isfinite(totals[B]) else (math.inf, ())
                else:
                    value, sizes = levels.best(limit)
                if attempt == 0:
                    self.solved[cls] = value
                if math.isfinite(value):
                    results.append((value, sizes))
                    self._consider(sizes, value)
            if self.keep_ms is not None and attempt == 0:
                self._keep(read)
            if not results or min(results)[0] >= self._beat():
                return  # nothing the program finds beats the list to beat
            value, sizes = min(results)
            e = self._consider(sizes)
            if self.fits(e):
                return
            if not e.reason and e.starts and not e.capture_fits and self.over_cap(e) <= 0:
                # The condition the program does not carry bound: the fastest list of any pass and level that fits
                # both is the answer, feasible but not proven optimal.
                self.capture_binds = True
                self._fastest_fitting(units, B, passes, limit, pred_cls)
                return
            budget_limit -= max(self.unit, -e.kv_margin_bytes, self.over_cap(e))
        self.dp_failed = True

    def _keep(self, read: list[tuple[np.ndarray, Callable[[int], tuple[int, ...]]]]) -> None:
        """The fastest list of each of the least levels where the fastest over every pass drops to within `keep_ms`,
        evaluated, the first KEPT that fit kept (program latency is the model's where the layers are)."""
        assert self.keep_ms is not None
        if read:
            totals = np.min(np.stack([t for t, _ in read]), axis=0)
            levels = [m for m in np.flatnonzero(totals <= self.keep_ms + 1e-12).tolist()
                      if m == 0 or totals[m] < totals[m - 1] - 1e-15]  # a drop: the level's list needs all of it
            for m in levels[:4 * KEPT]:  # lists the real capture does not fit are passed over, a few levels at most
                if len(self.kept) == KEPT:
                    break
                self.check()
                _, backtrack = read[int(np.argmin([t[m] for t, _ in read]))]
                e = self._consider(backtrack(m), float(totals[m]))
                if self.fits(e):
                    self.kept.append(e)
        empty = self.seen[()]  # no closed chain, so no level holds it: it counts nothing, first but for a faster 0
        if empty.expected_step_ms <= self.keep_ms + 1e-12:
            zero = [e for e in self.kept[:1] if counted_bytes(self.model, e) == 0
                    and e.expected_step_ms < empty.expected_step_ms]
            self.kept = (zero + [empty] + [e for e in self.kept if e not in zero])[:KEPT]

    def _alive(self, cls: int, same: bool) -> Callable[[Edge, int, np.ndarray], np.ndarray] | None:
        """Which transitions of a pass may still lead to a list faster than the one to beat."""
        bound = self.bounds.edges(cls, same)
        if bound is None:
            return None
        threshold = self._beat()
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


def brute_force(model: CostModel, candidates: Sequence[int] | None = None) -> Evaluation:
    """Every subset of the candidates (keep to <= 12 of them), for tests: the fastest feasible list."""
    cands = sorted(model.candidates if candidates is None else candidates)
    if len(cands) > 16:
        raise ValueError(f"brute_force over {len(cands)} candidates would take 2^{len(cands)} evaluations")
    best = model.evaluate(())
    if not best.feasible:
        raise SearchError(model.nothing_fits(best))
    for size in range(1, len(cands) + 1):
        for subset in combinations(cands, size):
            e = model.evaluate(subset)
            if e.feasible and e.expected_step_ms < best.expected_step_ms - 1e-12:
                best = e
    return best
