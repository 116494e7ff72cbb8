"""The exact solver: the fastest capture list that vLLM starts with (its graph-memory ESTIMATE leaves the required
KV cache) and whose real capture fits, under the cost model, by dynamic programming over the sorted candidate
widths; the yardstick every optuna study is held to."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import numpy as np

from tuner.costmodel import GIB, CostModel, Evaluation
from tuner.vllm.memory import MIB

__all__ = ["ExactResult", "SearchError", "brute_force", "exact_solve", "pareto_front", "round_up"]

log = logging.getLogger(__name__)

_INF = math.inf
_A, _C = 0, 1
"""Phases of a chain (see exact_solve): windows still charged the extrapolated per-graph estimate (A) or the
top graph placed (C)."""


class SearchError(ValueError):
    """The search cannot run (e.g. not even the empty list leaves the required KV cache); one line."""


@dataclass(frozen=True)
class ExactResult:
    """The exact solver's answer under the cost model."""

    best: Evaluation
    """Fastest list that fits both of vLLM's memory conditions."""
    front: list[Evaluation]
    """Latency/graph-memory Pareto front of fitting lists, by increasing memory."""
    memory_unit_bytes: int
    """Memory was counted in units of this many bytes (exact when `exact_memory`, else rounded to the nearest
    unit and the answer re-checked in bytes)."""
    exact_memory: bool
    """True when the answer is the optimum, not just a fitting list: the unit divides every memory figure and the
    condition the program does not carry (the real capture beside the estimate) cannot bind."""
    num_candidates: int
    """Candidate widths the program ran over."""
    resource: str = "estimate"
    """What the program's memory axis counted: vLLM's `estimate` or the `real` pool."""


def round_up(x: np.ndarray | int, q: int) -> Any:
    return -(-np.asarray(x) // q) * q


class _Prefix:
    """Prefix sums of step probability and probability x eager latency over sorted widths."""

    def __init__(self, widths: np.ndarray, probs: np.ndarray, eager: np.ndarray) -> None:
        order = np.argsort(widths, kind="stable")
        self.w = widths[order]
        self.p = np.concatenate([[0.0], np.cumsum(probs[order])])
        self.pe = np.concatenate([[0.0], np.cumsum((probs * eager)[order])])

    def mass(self, x: Any) -> Any:
        """Probability of steps of width <= x."""
        return self.p[np.searchsorted(self.w, x, side="right")]

    def eager(self, x: Any) -> Any:
        """Sum of p x eager latency of steps of width <= x."""
        return self.pe[np.searchsorted(self.w, x, side="right")]

    @property
    def eager_total(self) -> float:
        return float(self.pe[-1])


@dataclass
class _Memory:
    """Per-candidate memory figures (bytes) of one formulation of vLLM's rule; see exact_solve."""

    kind: str
    """`real` (additive real pool), `window` (V2 with FULL decode windows) or `count` (top/second form)."""
    member: np.ndarray
    """Charged when a candidate joins a list below its top (`real`/`window`: its mixed graph's delta)."""
    window: np.ndarray
    """Charged when a candidate opens a FULL decode window: `real` the window graphs' deltas, `window` the
    drafter's window graph (the target's FULL windows are the extrapolated part)."""
    first: np.ndarray
    """`window`: the top FULL window's sample; `count`: the top's whole first term."""
    extra: np.ndarray
    """`real`/`window`: added at the top (the first-captured graph's standalone footprint minus its delta)."""
    per_graph: np.ndarray
    """`window`: max(FULL delta at the window, 1 MiB); `count`: the per-graph term a candidate sets as second."""
    added: np.ndarray
    """`count`: bytes charged per member on top of its estimate term (V2's drafter graphs, counted in full)."""
    top_budget: np.ndarray | None = None
    """Per candidate, the most memory a list topped by it may take (SGLang: its max moves the KV budget); None: the
    program's one budget; < 0: no list may top there."""
    real_member: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Real-pool bytes a candidate adds below the top (for the capture-headroom bound)."""
    real_top: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Real-pool bytes of a candidate as the top (for the capture-headroom bound)."""


def _memory_figures(model: CostModel, c: np.ndarray, r: np.ndarray) -> tuple[_Memory, int, str]:
    """The formulation of vLLM's memory rule the program runs, its budget in bytes, and what it counts."""
    b = model.budget
    sep, has_mixed = model.separate_decode, model.mixed_mode != "NONE"
    n = len(c)
    zero = np.zeros(n)
    top_mode = model.mixed_mode if has_mixed else "FULL"
    sa_top, de_top = model.graph_bytes(top_mode, c)
    d_mix = model.graph_bytes(model.mixed_mode, c)[1] if has_mixed else zero
    sa_full_r, d_full_r = model.graph_bytes("FULL", r) if sep else (zero, zero)
    windows = d_full_r if sep else zero
    # The drafter's graphs enter the pool after the target's larger ones: each costs its delta, per list member or
    # per FULL window (tuner.vllm.drafter_cost); V1 captures them inside the target's PIECEWISE samples.
    dr_member, dr_window = model.drafter.memory_terms(c, r, sep=sep) if model.drafter is not None else (zero, zero)
    real_member = d_mix + windows + dr_member + dr_window
    real_top = sa_top + (windows if sep and has_mixed else zero) + dr_member + dr_window
    form = model.engine.estimate_form(model.probe, b.estimate_enabled)  # the shape of the engine's memory rule
    if form == "none":
        # SGLang and TensorRT-LLM count the real pool: TensorRT-LLM against one budget, SGLang against one per list
        # max (its automatic memory fraction moves with max(bs)).
        top_budget = np.array([b.real_budget_bytes(top=int(-(-w // model.q))) for w in c], dtype=float)
        return _Memory("real", d_mix + dr_member, windows + dr_window, zero, np.maximum(0.0, sa_top - de_top), zero,
                       zero, top_budget=top_budget, real_member=real_member, real_top=real_top), \
            int(max(top_budget.max(), 0)), "real"
    if form == "real":
        # The estimate is 0 (the real capture must fit in what vLLM does not request), or equals the real pool.
        budget = b.slack_bytes if not b.estimate_enabled else b.estimate_budget_bytes
        return _Memory("real", d_mix + dr_member, windows + dr_window, zero, np.maximum(0.0, sa_top - de_top), zero,
                       zero, real_member=real_member, real_top=real_top), budget, "real"
    floor = float(MIB)
    if form == "windows":
        # PIECEWISE and drafter graphs count at their real pool size; the target's FULL windows as
        # first + (n - 1) * max(second, 1 MiB).
        first = d_full_r if has_mixed else sa_full_r
        extra = np.maximum(0.0, sa_top - de_top) if has_mixed else zero
        return _Memory("window", d_mix + dr_member, dr_window, first, extra, np.maximum(d_full_r, floor), zero,
                       real_member=real_member, real_top=real_top), b.estimate_budget_bytes, "estimate"
    # V1 (every mode) and V2 without separate decode graphs (FULL): first + (k - 1) * per-graph, with every
    # candidate a graph of each mode the list captures (V1's candidates are multiples of q up to the widest decode
    # batch, so each is its own FULL decode window).
    if form == "per_graph":  # V2 FULL: one FULL graph per member, largest first; V2's drafter graphs in full
        sa_f, d_f = model.graph_bytes("FULL", c)
        first, per, added = sa_f, np.maximum(d_f, floor), dr_member
    else:  # per_mode (V1): a drafter graph belongs to the PIECEWISE sample it is captured with
        sas, pers = [], []
        for i, mode in enumerate(([model.mixed_mode] if has_mixed else []) + (["FULL"] if sep else [])):
            sa, de = model.graph_bytes(mode, c)
            extra_dr = dr_member if mode == "PIECEWISE" else zero
            # One profiling pool for every mode: FULL's first sample lands on the PIECEWISE samples (its delta).
            sas.append((sa if i == 0 else de) + extra_dr)
            pers.append(np.maximum(de + extra_dr, floor))
        first, per, added = np.maximum.reduce(sas), sum(pers), zero
    return _Memory("count", zero, zero, first, zero, per, added, real_member=real_member, real_top=real_top), \
        b.estimate_budget_bytes, "estimate"


def exact_solve(model: CostModel, *, memory_buckets: int = 2048, candidates: Sequence[int] | None = None,
                front_points: int = 40) -> ExactResult:
    """Fastest capture list over `candidates` (default: the model's) that fits vLLM's two memory conditions.

    A dynamic program over the sorted candidates. A list's latency splits into per-gap terms between consecutive
    members (steps padded up to the upper one), FULL decode graphs into q-wide windows (a window's graph is the
    rounded width of its lowest member); the top window is special in vLLM (its rounded graph may exceed the max and
    is then not captured), so states carry a flag for it.

    Memory. vLLM sizes the KV cache from its graph-memory ESTIMATE, which depends on a list only through additive
    real-pool terms, graph counts and the two largest graphs of each extrapolated mode. The program's memory axis
    counts that estimate against `requested - non_kv - required_kv`:
    - V2 with FULL decode windows: every PIECEWISE graph at its real delta (the top at its standalone footprint);
      FULL windows as `first + (n - 1) * max(second, 1 MiB)`. For each value p of the per-graph term, one pass
      charges every window p while a chain is in phase A; a chain places its top window (phase C: no further window)
      at its own sample, and only when the window below it (the second) has per-graph term p. A list is thus costed
      exactly in the pass of its own p.
    - V1 (every mode; its lists are multiples of q up to the widest decode batch) and V2 FULL mode: `f(top) +
      (k - 1) * g(second)`; per value p of g, members cost p and the top is placed (phase C) at f(top) only over a
      second member whose g is p.
    - the estimate switched off (or equal to the real pool): the real pool, additive, against what vLLM does not
      request.
    The other condition, that the real capture fits beside the estimate (`real - estimate <= total - requested`),
    is bounded per pass: when even the worst list cannot break it, the answer is exact in both; otherwise the
    answer is re-checked and the result says it is not proven optimal.
    Memory is counted in units of `memory_unit_bytes`: exact when one unit divides every figure and the budget spans
    at most `memory_buckets` of them, else rounded to the nearest unit with the answer re-checked in bytes
    (re-solved under a lower budget on an overshoot, a rounded-up pass last), so the answer always fits.
    """
    cands = sorted({int(c) for c in (model.candidates if candidates is None else candidates)})
    empty = model.evaluate(())
    if not empty.feasible:
        raise SearchError(
            f"no capture list fits, not even the empty one: KV cache {empty.kv_available_bytes / GIB:.2f} GiB without "
            f"graphs < required {model.budget.required_kv_bytes / GIB:.2f} GiB"
        )
    if model.cudagraph_mode == "NONE" or not cands:
        return ExactResult(empty, [empty], 1, True, 0)

    sep = model.separate_decode
    q = _window_query_len(model) if sep else model.q
    decode_limit = q * model.serving.max_num_seqs
    c = np.array(cands, dtype=np.int64)
    n = len(c)
    r = round_up(c, q) if sep else c.copy()
    layers, constant, layers_exact = _latency_layers(model, c, r, q)
    mem, budget_bytes, resource = _memory_figures(model, c, r)

    # Memory in units: when one unit divides every figure (the gcd) and the budget spans few enough of them, the
    # program is exact. Otherwise figures are rounded to the nearest unit (errors cancel instead of adding up) and
    # the answer is checked in exact bytes; if it overshoots, the budget is lowered by the overshoot and re-solved.
    arrays = (mem.member, mem.window, mem.first, mem.extra, mem.per_graph, mem.added)
    figures = np.rint(np.concatenate(arrays)).astype(np.int64)
    gcd = int(np.gcd.reduce(figures[figures > 0])) if np.any(figures > 0) else 1
    everything = int(mem.member.sum() + mem.window.sum() + mem.extra.max() + mem.first.max()
                     + mem.per_graph.max() * n + mem.added.sum())  # no list can need more than this
    span = max(1, min(budget_bytes, everything))
    exact_memory = span // gcd <= memory_buckets
    unit = gcd if exact_memory else -(-span // memory_buckets)

    def to_units(x: np.ndarray, how: str) -> np.ndarray:
        x = np.rint(x).astype(np.int64)
        if how == "ceil":
            return -(-x // unit)
        return x // unit if exact_memory else np.rint(x / unit).astype(np.int64)

    slack = getattr(model.budget, "slack_bytes", 0)

    def headroom_can_break(p_bytes: float) -> bool:
        """Whether some list of this pass could have its real capture exceed estimate + slack."""
        if resource == "real":
            return False  # the program counts the real pool itself (or it equals the estimate)
        if mem.kind == "window":
            # real - estimate = sum over the FULL windows below the top two of (delta - p), minus (p - second).
            windows = np.unique(r[r <= decode_limit])
            worst = float(np.maximum(0.0, model.graph_bytes("FULL", windows)[1] - p_bytes).sum())
        else:
            worst = float(np.max(mem.real_top - mem.first) + np.maximum(0.0, mem.real_member - p_bytes).sum())
        return worst > slack

    def programs(how: str, lowered: int) -> list[tuple[_Program, float]]:
        """One program per value of the per-graph term (a single one when the rule has none); `lowered`: bytes the
        budgets were lowered by after an overshoot."""
        units = {k: to_units(a, how) for k, a in (("member", mem.member), ("window", mem.window),
                                                   ("first", mem.first), ("extra", mem.extra),
                                                   ("per_graph", mem.per_graph), ("added", mem.added))}
        if mem.top_budget is not None:
            top = mem.top_budget - lowered
            units["top"] = np.where(top >= 0, np.floor(np.maximum(top, 0) / unit), -1).astype(np.int64)
        if mem.kind == "real":
            return [(_Program(mem.kind, units, None, ctx), 0.0)]
        out = []
        for p in sorted(set(units["per_graph"].tolist())):
            p_bytes = float(np.max(mem.per_graph[units["per_graph"] == p]))
            out.append((_Program(mem.kind, units, int(p), ctx), p_bytes))
        return out

    ctx = _Context(c=c, r=r, q=q, decode_limit=decode_limit, sep=sep, layers=layers, base=empty.expected_step_ms,
                   constant=constant)

    proven = exact_memory and layers_exact
    budget_limit = budget_bytes
    how = "nearest"
    best: Evaluation = empty
    solved: list[tuple[np.ndarray, Callable[[int], tuple[int, ...]]]] = []
    B = 0
    for attempt in range(5):
        if attempt == 4:
            how = "ceil"  # last resort: every figure rounded up, which always fits the estimate
            budget_limit = budget_bytes
        max_units = int(to_units(np.array([everything]), "ceil")[0])
        B = int(max(0, min(budget_limit // unit, max_units)))
        solved = []
        for program, p_bytes in programs(how, budget_bytes - budget_limit):
            if headroom_can_break(p_bytes):
                proven = False
            solved.append(program.solve(B))
        totals = np.min(np.stack([t for t, _ in solved]), axis=0)
        which = np.argmin(np.stack([t for t, _ in solved]), axis=0)
        best = model.evaluate(solved[int(which[B])][1](B))
        if best.feasible:
            break
        if not best.reason and best.starts and not best.capture_fits:
            # The condition the program does not carry bound: the fastest list of any pass and level that fits
            # both is the answer, feasible but not proven optimal.
            proven = False
            best = _fastest_fitting(model, solved, B, empty)
            break
        budget_limit -= max(unit, -best.kv_margin_bytes)
    if not best.feasible:
        best = empty
        proven = False
    if not layers_exact:
        best = _improve_locally(model, best, cands)
    totals = np.min(np.stack([t for t, _ in solved]), axis=0)
    which = np.argmin(np.stack([t for t, _ in solved]), axis=0)
    front: list[Evaluation] = []
    if B > 0:
        # The front: memory levels where the best latency drops; thinned to `front_points` evaluations.
        drops = [m for m in range(B + 1) if m == 0 or totals[m] < totals[m - 1] - 1e-12]
        if len(drops) > front_points:
            picks = np.unique(np.linspace(0, len(drops) - 1, front_points).round().astype(int))
            drops = [drops[i] for i in picks]
        seen: set[tuple[int, ...]] = set()
        for m in drops + [B]:
            sizes = solved[int(which[m])][1](m)
            if sizes not in seen:
                seen.add(sizes)
                e = model.evaluate(sizes)
                if e.feasible:
                    front.append(e)
    front.append(best)
    return ExactResult(best, pareto_front(front), unit, bool(proven), n, resource)


@dataclass
class _Layer:
    """One term of the step latency, weighed by gaps between list members: each of the layer's steps has a key; a
    `member` layer's step is served by the smallest member >= its key (members above `cap` serve none), a `window`
    layer's by the FULL decode window of that member (or, where the window has no FULL graph, the member's mixed
    graph at `pad`); an unserved step pays its eager latency."""

    kind: str
    """`member`, `window`, or `exact` (a step is served only by a member of exactly its key)."""
    steps: _Prefix
    """The layer's steps by key: probability and eager latency prefix sums."""
    lat: np.ndarray
    """Per candidate: the latency of a step its graph serves."""
    cap: float = math.inf
    """`member`: candidates above it serve no step of the layer."""
    pad: np.ndarray | None = None
    """`window`: per candidate, the latency of a step padded to its mixed graph; None: such steps run eager."""


def _window_query_len(model: CostModel) -> int:
    """The query length of the FULL decode windows the program follows: the runner's one decode query length. Under a
    V2 dynamic schedule of several tiers, each tier's graphs can shadow another's: the program then follows the tier
    with the most decode traffic and says its answer is not proven (see `_latency_layers`)."""
    tiers = model.decode_tiers
    if len(tiers) == 1:
        return tiers[0]
    _, _, probs, _ = model.step_arrays()
    utc = model.step_dispatch_keys()[0]
    mass = {ql: float(probs[utc == ql].sum()) for ql in tiers}
    return max(tiers, key=lambda ql: (mass[ql], ql))


def _latency_layers(model: CostModel, c: np.ndarray, r: np.ndarray, q: int) -> tuple[list[_Layer], float, bool]:
    """The target's latency layers (its mixed graphs by member, its FULL decode graphs by window of query length q),
    the drafter's, the expected latency no list changes (logits of the real tokens, eager drafter passes), and whether
    the layers reproduce the cost model exactly (not under several decode tiers: the steps of the other tiers are
    taken as mixed steps, and their graphs are left out)."""
    sep, has_mixed = model.separate_decode, model.mixed_mode != "NONE"
    widths, _, probs, eager = model.step_arrays()
    utc, requests, ks = model.step_dispatch_keys()
    # The steps the runner dispatches against the FULL windows (V2: decode steps of this query length; V1: any step
    # of q tokens per request); every other step meets the mixed graphs only.
    uniform = utc == q
    logits = model.logits_at_steps()
    body = eager - logits  # logits run after every step for its real tokens, whatever it replays
    constant = float(np.dot(probs, logits))
    lat_mix = model.graph_body_ms(c, model.mixed_mode) if has_mixed else np.zeros(len(c))
    mixed_cap = math.inf if has_mixed else 0.0

    def steps(sel: np.ndarray) -> _Prefix:
        return _Prefix(widths[sel], probs[sel], body[sel])

    layers: list[_Layer] = []
    if model.probe.exact:
        # TensorRT-LLM without padding: a decode step replays only a graph of exactly its width.
        layers.append(_Layer("member", steps(~uniform), lat_mix, mixed_cap))
        layers.append(_Layer("exact", steps(uniform), model.graph_body_ms(r, "FULL")))
    elif sep:
        layers.append(_Layer("member", steps(~uniform), lat_mix, mixed_cap))
        layers.append(_Layer("window", steps(uniform), model.graph_body_ms(r, "FULL"),
                             pad=lat_mix if has_mixed else None))
    else:
        layers.append(_Layer("member", steps(np.ones(len(widths), dtype=bool)), lat_mix, mixed_cap))
    exact = not sep or len(model.decode_tiers) == 1
    if model.drafter is not None:
        dl, const, drafter_exact = model.drafter.layers(c, r, widths, uniform, requests, ks, sep=sep,
                                                        target_mixed_mode=model.mixed_mode, tiers=model.decode_tiers)
        exact = exact and drafter_exact
        constant += float(np.dot(probs, const))
        for layer in dl:
            layers.append(_Layer(layer.kind, _Prefix(layer.keys, probs[layer.steps], layer.eager), layer.lat,
                                 layer.cap, layer.pad))
    return layers, constant, exact


@dataclass
class _Context:
    """The latency side of the program, shared by every pass."""

    c: np.ndarray
    r: np.ndarray
    q: int
    decode_limit: int
    sep: bool
    layers: list[_Layer]
    base: float
    constant: float


class _Program:
    """One pass of the dynamic program (one value of the per-graph term, or none)."""

    def __init__(self, kind: str, units: dict[str, np.ndarray], p: int | None, ctx: _Context) -> None:
        self.kind, self.u, self.p, self.ctx = kind, units, p, ctx

    def solve(self, B: int) -> tuple[np.ndarray, Callable[[int], tuple[int, ...]]]:
        """Best expected latency per memory level 0..B and a backtrack from a level to its list."""
        x, u, p, kind = self.ctx, self.u, self.p, self.kind
        c, n = x.c, len(x.c)
        pos = np.concatenate([[0], c])  # position 0 is the empty start (width 0), position i+1 is candidate i
        r_pos = np.concatenate([[0], x.r])
        self._pos, self._r_pos = pos, r_pos
        self._member_at = [(layer, layer.steps.mass(pos), layer.steps.eager(np.minimum(pos, layer.cap)))
                           for layer in x.layers if layer.kind in ("member", "exact")]
        self._window_at = [(layer, layer.steps.mass(r_pos), layer.steps.eager(r_pos))
                           for layer in x.layers if layer.kind == "window"]

        # value[phase][state][k][m]: best latency (without the tail above the top) of chains ending at position k
        # using at most m memory units.
        # Phases: A (windows charged p; in `count` passes: members charged p) and C (top placed / no more windows).
        # States: 0 ordinary, 1 the chain's top window has no FULL decode graph. `back` holds the predecessor.
        value = np.full((2, 2, n + 1, B + 1), _INF)
        back = np.full((2, 2, n + 1, B + 1, 3), -1, dtype=np.int32)  # predecessor phase*2+state, position, level
        value[:, 0, 0, :] = 0.0  # the empty start, at every level: values are "using at most m units"
        scratch = np.empty((n + 1, B + 1))
        levels = np.arange(B + 1)
        inf = np.float64(_INF)

        def relax(to: tuple[int, int], j: int, lo: int, hi: int, frm: tuple[int, int], cost: np.ndarray,
                  units: int, mask: np.ndarray | None = None) -> None:
            """Chains in `frm` ending at positions lo..hi-1 (contiguous: positions are sorted; with `mask`, only
            those it allows) extended by j."""
            if hi <= lo or units > B or units < 0:
                return
            width = B + 1 - units
            if mask is None:
                rows = value[frm[0], frm[1], lo:hi, :width]
                cost, where = cost[lo:hi], None
            else:  # a gather of the allowed predecessors: a second-member check usually allows few
                where = lo + np.flatnonzero(mask[lo:hi])
                if not len(where):
                    return
                rows, cost = value[frm[0], frm[1], where, :width], cost[where]
            block = scratch[: len(cost), :width]
            np.add(rows, cost[:, None], out=block)
            arg = np.argmin(block, axis=0)
            best = block[arg, levels[:width]]
            cur = value[to[0], to[1], j, units:]
            better = best < cur
            cur[better] = best[better]
            bk = back[to[0], to[1], j, units:]
            bk[better, 0] = frm[0] * 2 + frm[1]
            bk[better, 1] = (lo + arg[better]) if where is None else where[arg[better]]
            bk[better, 2] = levels[:width][better]

        for j in range(n):
            k = j + 1
            member = int(u["member"][j])
            added = int(u["added"][j])
            # Second-member check of the placing transitions: the predecessor's per-graph class is this pass's p.
            ok = np.concatenate([[True], u["per_graph"][: k - 1] == p]) if p is not None else None
            for to_state, lo, hi, frm_state, cost, opens in self._transitions(j, k):
                if kind == "real":
                    relax((_C, to_state), k, lo, hi, (_C, frm_state), cost,
                          member + (int(u["window"][j]) if opens else 0))
                elif kind == "count":
                    # Members are charged p; the top is placed at its whole first term over a second of class p.
                    relax((_A, to_state), k, lo, hi, (_A, frm_state), cost, int(p) + added)
                    relax((_C, to_state), k, lo, hi, (_A, frm_state), cost, int(u["first"][j]) + added, ok)
                elif opens:  # window: a new FULL window, charged p, or placed as the top window over a second of p
                    drafter_window = int(u["window"][j])
                    relax((_A, 0), k, lo, hi, (_A, 0), cost, member + drafter_window + int(p))
                    relax((_C, 0), k, lo, hi, (_A, 0), cost, member + drafter_window + int(u["first"][j]), ok)
                elif to_state == 0:  # same window: no new graph to charge
                    for ph in (_A, _C):
                        relax((ph, 0), k, lo, hi, (ph, 0), cost, member)
                else:  # no FULL graph for j's window: only above the top window
                    relax((_C, 1), k, lo, hi, (_C, frm_state), cost, member)

        # Close: the first-captured graph's extra footprint and the steps above the top (eager).
        totals = np.full(B + 1, x.base)
        total_from = np.full((B + 1, 3), -1, dtype=np.int64)  # state, position, level before the extra
        for j in range(n):
            k = j + 1
            member_tail = sum(float(layer.steps.eager_total - layer.steps.eager(min(c[j], layer.cap)))
                              for layer, _, _ in self._member_at)
            closes = []
            if not x.sep:
                closes.append((0, 0.0))
            else:
                r_j = x.r[j]
                window_tail = {st: sum(float(layer.steps.eager_total - layer.steps.eager(top))
                                       for layer, _, _ in self._window_at) for st, top in ((0, c[j]), (1, r_j))}
                if r_j == c[j] and c[j] <= x.decode_limit:
                    closes.append((0, window_tail[0]))
                if r_j > c[j] or r_j > x.decode_limit:
                    closes.append((1, window_tail[1]))
            extra = int(u["extra"][j])
            # A list topped by j may take at most `limit` units (its own budget where the engine's depends on it).
            limit = min(B, int(u["top"][j])) if "top" in u else B
            if extra > limit:
                continue
            # Levels above the limit take the best within it ("at most m units").
            src = np.minimum(levels[: B + 1 - extra], limit - extra)
            for state, tail in closes:
                cand = value[_C, state, k, src] + tail + member_tail + x.constant
                cur = totals[extra:]
                better = cand < cur - 1e-15
                cur[better] = cand[better]
                total_from[extra:][better] = np.stack(
                    [np.full(better.sum(), state), np.full(better.sum(), k), src[better]], axis=1)

        def backtrack(m: int) -> tuple[int, ...]:
            state, k, level = (int(v) for v in total_from[m])
            if k < 0:
                return ()
            phase, members = _C, []
            while k > 0:
                members.append(int(c[k - 1]))
                code, pk, plevel = (int(v) for v in back[phase, state, k, level])
                phase, state = divmod(code, 2)
                k, level = pk, plevel
            return tuple(sorted(members))

        return totals, backtrack

    def _transitions(self, j: int, k: int) -> list[tuple[int, int, int, int, np.ndarray, bool]]:
        """(to_state, lo, hi, from_state, latency cost, opens a FULL window) for adding candidate j on top of the
        chains ending at positions lo..hi-1, window by window as vLLM dispatches; costs are over positions 0..k-1.

        Positions are sorted, so those in j's window are a tail [first_same, k) and those whose window lies beyond
        max_num_seqs requests a range [first_beyond, first_same). State 1 means j's window has no FULL graph (its
        rounded width exceeds the max, so j is the top, or the window is beyond max_num_seqs requests)."""
        x = self.ctx
        c_j = x.c[j]
        members = np.zeros(k)
        for layer, mass_pos, eager_pos in self._member_at:
            st = layer.steps
            if layer.kind == "exact":
                # Steps up to c_j above the predecessor run eager, except those of exactly c_j: j's graph.
                point_mass = st.mass(c_j) - st.mass(c_j - 1)
                point_eager = st.eager(c_j) - st.eager(c_j - 1)
                members = members + (st.eager(c_j) - eager_pos[:k]) - point_eager + point_mass * layer.lat[j]
            elif c_j <= layer.cap:
                members = members + (layer.steps.mass(c_j) - mass_pos[:k]) * layer.lat[j]
            else:  # j serves none of this layer's steps: those up to the cap above the predecessor run eager
                members = members + (layer.steps.eager(layer.cap) - eager_pos[:k])
        if not x.sep:
            return [(0, 0, k, 0, members, False)]
        r_pos, r_j = self._r_pos, x.r[j]
        first_same = int(np.searchsorted(r_pos[:k], r_j, side="left"))
        first_beyond = min(first_same, int(np.searchsorted(r_pos[:k], x.decode_limit, side="right")))
        normal = np.zeros(k)
        flag = np.zeros(k)
        below = r_j - x.q
        for layer, mass_rpos, eager_rpos in self._window_at:
            st = layer.steps
            normal = normal + (st.mass(r_j) - mass_rpos[:k]) * layer.lat[j]
            if layer.pad is not None:
                pad = (st.mass(below) - mass_rpos[:k]) * layer.pad[j]
            else:
                pad = st.eager(below) - eager_rpos[:k]
            flag = flag + pad + (st.eager(r_j) - st.eager(below))
        out = []
        if r_j <= x.decode_limit:
            out += [(0, first_same, k, 0, members, False), (0, 0, first_same, 0, members + normal, True)]
        if r_j > x.c[j] or r_j > x.decode_limit:
            # A chain in state 1 at j can only close (j is the top of a window with no FULL graph) or grow beyond
            # max_num_seqs requests; when j's window is its own width within the limit, neither can happen.
            out += [(1, first_same, k, 1, members, False), (1, 0, first_same, 0, members + flag, False),
                    (1, first_beyond, first_same, 1, members + flag, False)]
        return out


def _fastest_fitting(model: CostModel, solved: list[tuple[np.ndarray, Callable[[int], tuple[int, ...]]]], B: int,
                     empty: Evaluation, limit: int = 400) -> Evaluation:
    """The fastest list, over every pass's memory levels where its latency drops, that fits both conditions."""
    best = empty
    seen: set[tuple[int, ...]] = set()
    for totals, backtrack in solved:
        drops = [m for m in range(B + 1) if m == 0 or totals[m] < totals[m - 1] - 1e-12]
        for m in drops[::-1][:limit]:
            sizes = backtrack(m)
            if sizes in seen:
                continue
            seen.add(sizes)
            e = model.evaluate(sizes)
            if e.feasible and e.expected_step_ms < best.expected_step_ms - 1e-12:
                best = e
    return best


def _improve_locally(model: CostModel, start: Evaluation, candidates: Sequence[int],
                     evaluations: int = 4096) -> Evaluation:
    """Where the program's layers only approximate the cost model (several V2 decode tiers), the best fitting list
    one candidate away, repeatedly, until none is faster or `evaluations` lists were costed: a better answer, still
    not proven optimal."""
    best = start
    for _ in range(max(1, evaluations // max(1, len(candidates)))):
        members = set(best.capture_sizes)
        moves = [model.evaluate(members ^ {c}) for c in candidates]
        better = [e for e in moves if e.feasible and e.expected_step_ms < best.expected_step_ms - 1e-12]
        if not better:
            return best
        best = min(better, key=lambda e: e.expected_step_ms)
    return best


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
