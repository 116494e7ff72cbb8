"""The exact solver's program: a capture list as a path through the sorted candidate widths, its latency as costs of
the gaps between consecutive members (per latency layer) and its memory as figures charged per transition, with
the passes that split vLLM's per-graph estimate term; shared by the bounds (`tuner.search.exact_bounds`) and the dynamic
program over memory levels (`tuner.search.exact_levels`)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from tuner.engines.vllm.memory import MIB
from tuner.model.costmodel import CostModel, Evaluation

__all__ = ["A0", "ANY", "C0", "C1", "FIGURES", "NODES", "Edge", "Layer", "Memory", "Prefix", "Program",
           "counted_bytes", "latency_layers", "memory_axis", "memory_figures", "round_up", "window_query_len"]

A0, A1, C0, C1 = 0, 1, 2, 3
"""Nodes of a position, phase * 2 + state. Phases: A (windows, or members, still charged the pass's per-graph term)
and C (the top placed: no further charged graph). States: 0 ordinary, 1 the chain's top window has no FULL decode
graph."""
NODES = 4
FIGURES = ("member", "window", "first", "extra", "added")
"""The per-candidate memory figures a transition can charge (see Memory)."""


def round_up(x: np.ndarray | int, q: int) -> np.ndarray:
    return -(-np.asarray(x) // q) * q


class Prefix:
    """Prefix sums of step probability and probability x eager latency over sorted widths."""

    def __init__(self, widths: np.ndarray, probs: np.ndarray, eager: np.ndarray) -> None:
        order = np.argsort(widths, kind="stable")
        self.w = widths[order]
        self.p = np.concatenate([[0.0], np.cumsum(probs[order])])
        self.pe = np.concatenate([[0.0], np.cumsum((probs * eager)[order])])

    def mass(self, x: object) -> np.ndarray:
        """Probability of steps of width <= x."""
        return self.p[np.searchsorted(self.w, x, side="right")]

    def eager(self, x: object) -> np.ndarray:
        """Sum of p x eager latency of steps of width <= x."""
        return self.pe[np.searchsorted(self.w, x, side="right")]

    @property
    def eager_total(self) -> float:
        return float(self.pe[-1])


@dataclass
class Layer:
    """One term of the step latency, weighed by gaps between list members: each of the layer's steps has a key; a
    `member` layer's step is served by the smallest member >= its key (members above `cap` serve none), a `window`
    layer's by the FULL decode window of that member (or, where the window has no FULL graph, the member's mixed
    graph at `pad`); an unserved step pays its eager latency."""

    kind: str
    """`member`, `window`, or `exact` (a step is served only by a member of exactly its key)."""
    steps: Prefix
    """The layer's steps by key: probability and eager latency prefix sums."""
    lat: np.ndarray
    """Per candidate: the latency of a step its graph serves."""
    cap: float = math.inf
    """`member`: candidates above it serve no step of the layer."""
    pad: np.ndarray | None = None
    """`window`: per candidate, the latency of a step padded to its mixed graph; None: such steps run eager."""


def window_query_len(model: CostModel) -> int:
    """The query length of the FULL decode windows the program follows: the runner's one decode query length. Under a
    V2 dynamic schedule of several tiers, each tier's graphs can shadow another's: the program then follows the tier
    with the most decode traffic and says its answer is not proven (see `latency_layers`)."""
    tiers = model.decode_tiers
    if len(tiers) == 1:
        return tiers[0]
    (_, _, probs, _, utc, *_), _ = model.program_steps()
    mass = {ql: float(probs[utc == ql].sum()) for ql in tiers}
    return max(tiers, key=lambda ql: (mass[ql], ql))


def latency_layers(model: CostModel, c: np.ndarray, r: np.ndarray, q: int) -> tuple[list[Layer], float, bool]:
    """The target's latency layers (its mixed graphs by member, its FULL decode graphs by window of query length q),
    the drafter's, the expected latency no list changes (logits of the real tokens, eager drafter passes), and whether
    the layers reproduce the cost model exactly (not under several decode tiers: the steps of the other tiers are
    taken as mixed steps, and their graphs are left out)."""
    sep, has_mixed = model.separate_decode, model.mixed_mode != "NONE"
    (widths, _, probs, eager, utc, requests, ks, logits), fixed_ms = model.program_steps()
    # The steps the runner dispatches against the FULL windows (V2: decode steps of this query length; V1: any step
    # of q tokens per request); every other step meets the mixed graphs only.
    uniform = utc == q
    body = eager - logits  # logits run after every step for its real tokens, whatever it replays
    constant = float(np.dot(probs, logits)) + fixed_ms
    lat_mix = model.graph_body_ms(c, model.mixed_mode) if has_mixed else np.zeros(len(c))
    mixed_cap = math.inf if has_mixed else 0.0

    def steps(sel: np.ndarray) -> Prefix:
        return Prefix(widths[sel], probs[sel], body[sel])

    layers: list[Layer] = []
    if model.probe.exact:
        # TensorRT-LLM without padding: a decode step replays only a graph of exactly its width.
        layers.append(Layer("member", steps(~uniform), lat_mix, mixed_cap))
        layers.append(Layer("exact", steps(uniform), model.graph_body_ms(r, "FULL")))
    elif sep:
        layers.append(Layer("member", steps(~uniform), lat_mix, mixed_cap))
        layers.append(Layer("window", steps(uniform), model.graph_body_ms(r, "FULL"),
                            pad=lat_mix if has_mixed else None))
    else:
        layers.append(Layer("member", steps(np.ones(len(widths), dtype=bool)), lat_mix, mixed_cap))
    exact = not sep or len(model.decode_tiers) == 1
    if model.drafter is not None:
        dl, const, drafter_exact = model.drafter.layers(c, r, widths, uniform, requests, ks, sep=sep,
                                                        target_mixed_mode=model.mixed_mode, tiers=model.decode_tiers)
        exact = exact and drafter_exact
        constant += float(np.dot(probs, const))
        for layer in dl:
            layers.append(Layer(layer.kind, Prefix(layer.keys, probs[layer.steps], layer.eager), layer.lat,
                                layer.cap, layer.pad))
    return layers, constant, exact


@dataclass
class Memory:
    """Per-candidate memory figures (bytes) of one formulation of vLLM's rule; see `memory_figures`."""

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


def memory_axis(model: CostModel) -> str:
    """What the program's memory axis counts under the engine's rule: vLLM's graph-memory `estimate`, or the `real`
    pool (SGLang and TensorRT-LLM; vLLM with the estimate switched off, or an estimate that is the real capture)."""
    form = model.engine.estimate_form(model.probe, model.budget.estimate_enabled)
    return "real" if form in ("none", "real") else "estimate"


def counted_bytes(model: CostModel, e: Evaluation) -> int:
    """A list's graph memory on the program's memory axis (`memory_axis`): what the engine's rule charges it, the
    memory a cap on that axis (`exact_solve`'s `memory_cap_bytes`) bounds."""
    return e.graph_estimate_bytes if memory_axis(model) == "estimate" else e.graph_memory_bytes


def memory_figures(model: CostModel, c: np.ndarray, r: np.ndarray) -> tuple[Memory, int, str]:
    """The formulation of vLLM's memory rule the program runs, its budget in bytes, and what it counts
    (`memory_axis`)."""
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
    # per FULL window (tuner.engines.vllm.drafter_cost); V1 captures them inside the target's PIECEWISE samples.
    dr_member, dr_window = model.drafter.memory_terms(c, r, sep=sep) if model.drafter is not None else (zero, zero)
    real_member = d_mix + windows + dr_member + dr_window
    real_top = sa_top + (windows if sep and has_mixed else zero) + dr_member + dr_window
    form = model.engine.estimate_form(model.probe, b.estimate_enabled)  # the shape of the engine's memory rule
    if form == "none":
        # SGLang and TensorRT-LLM count the real pool: TensorRT-LLM against one budget, SGLang against one per list
        # max (its automatic memory fraction moves with max(bs)).
        top_budget = np.array([b.real_budget_bytes(top=int(-(-w // model.q))) for w in c], dtype=float)
        return Memory("real", d_mix + dr_member, windows + dr_window, zero, np.maximum(0.0, sa_top - de_top), zero,
                      zero, top_budget=top_budget, real_member=real_member, real_top=real_top), \
            int(max(top_budget.max(), 0)), "real"
    if form == "real":
        # The estimate is 0 (the real capture must fit in what vLLM does not request), or equals the real pool.
        budget = b.slack_bytes if not b.estimate_enabled else b.estimate_budget_bytes
        return Memory("real", d_mix + dr_member, windows + dr_window, zero, np.maximum(0.0, sa_top - de_top), zero,
                      zero, real_member=real_member, real_top=real_top), budget, "real"
    floor = float(MIB)
    if form == "windows":
        # PIECEWISE and drafter graphs count at their real pool size; the target's FULL windows as
        # first + (n - 1) * max(second, 1 MiB).
        first = d_full_r if has_mixed else sa_full_r
        extra = np.maximum(0.0, sa_top - de_top) if has_mixed else zero
        return Memory("window", d_mix + dr_member, dr_window, first, extra, np.maximum(d_full_r, floor), zero,
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
    return Memory("count", zero, zero, first, zero, per, added, real_member=real_member, real_top=real_top), \
        b.estimate_budget_bytes, "estimate"


ANY = -2
"""Passes are named by the per-graph class of their second (the window, or member, just below the top): the lists
whose second has that class, each charged graph below the top costing its value; -1 names the lists with nothing
charged below the top (one window or member, or none), the only pass of a `real` program. ANY (bounds only): every
pass with a second at once, each charged graph at the least per-graph value."""


@dataclass
class Edge:
    """Transitions that add candidate j to chains ending at positions lo..hi-1 (position 0 is the empty start,
    position i + 1 is candidate i), all with one target node and charge."""

    to: int
    frm: int
    lo: int
    hi: int
    cost: np.ndarray
    """Latency added, per predecessor position 0..j (only lo..hi-1 used)."""
    terms: tuple[str, ...]
    """The memory figures of candidate j charged (names in FIGURES)."""
    per_graph: bool = False
    """Also charges the pass's per-graph term."""
    placing: bool = False
    """Places the top (A -> C): its predecessor is the second, of the pass's class (position 0 in the -1 pass)."""

    def base(self, fig: dict[str, np.ndarray], j: int) -> float:
        """Memory the transition charges besides the pass's per-graph term, in the figures' unit."""
        return sum(float(fig[t][j]) for t in self.terms)

    def enabled(self, cls: int) -> bool:
        """Whether a pass of class `cls` has these transitions: the -1 pass charges nothing below the top, so no
        chain of it is in phase A past the start."""
        return not (cls == -1 and self.to in (A0, A1))


class Program:
    """Candidates, latency layers and memory kind of one exact solve: transitions per candidate and closes."""

    CACHE_FLOATS = 32 << 20
    """Transitions are kept between sweeps while their costs take at most this many floats (256 MiB)."""

    def __init__(self, kind: str, c: np.ndarray, r: np.ndarray, q: int, decode_limit: int, sep: bool,
                 layers: list[Layer], base: float, constant: float, classes: np.ndarray) -> None:
        self.kind, self.c, self.r, self.q, self.decode_limit, self.sep = kind, c, r, q, decode_limit, sep
        self.layers, self.base, self.constant = layers, base, constant
        self.n = n = len(c)
        pos = np.concatenate([[0], c])
        self.r_pos = r_pos = np.concatenate([[0], r])
        self.pred_cls = np.concatenate([[-1], classes]).astype(np.int64)
        """Per position, the per-graph class of the candidate there (-1: the empty start)."""
        # Each layer's prefix sums read once at every position and candidate: a transition only indexes them.
        self._member_at = []
        for layer in layers:
            if layer.kind in ("member", "exact"):
                st = layer.steps
                at = {"mass": st.mass(c), "eager": st.eager(c), "eager_pos": st.eager(np.minimum(pos, layer.cap)),
                      "mass_pos": st.mass(pos), "eager_cap": float(st.eager(layer.cap)) if layer.cap < math.inf
                      else 0.0}
                if layer.kind == "exact":  # steps of exactly c_j: j's own graph
                    at["point_mass"], at["point_eager"] = at["mass"] - st.mass(c - 1), at["eager"] - st.eager(c - 1)
                self._member_at.append((layer, at))
        self._window_at = [(layer, {"mass_pos": layer.steps.mass(r_pos), "eager_pos": layer.steps.eager(r_pos),
                                    "mass": layer.steps.mass(r), "eager": layer.steps.eager(r),
                                    "mass_below": layer.steps.mass(r - q), "eager_below": layer.steps.eager(r - q)})
                           for layer in layers if layer.kind == "window"]
        # Positions are sorted: those in j's window are a tail [first_same, j + 1), those whose window lies beyond
        # max_num_seqs requests a range [first_beyond, first_same).
        self._first_same = np.searchsorted(r_pos, r, side="left")
        self._first_beyond = np.minimum(self._first_same, np.searchsorted(r_pos, decode_limit, side="right"))
        self.close_tail = self._close_tails()
        self._cache: list[list[Edge]] | None = [] if 1.5 * n * n <= self.CACHE_FLOATS else None

    def starts(self, cls: int) -> tuple[int, ...]:
        """Nodes a chain of the pass may start from at position 0 (the empty start): phase A, and phase C (a list
        with no charged graph below the top, only in the -1 pass)."""
        return (A0, C0) if cls == -1 else (A0,)

    def placing_mask(self, lo: int, hi: int, cls: np.ndarray) -> np.ndarray:
        """(hi - lo) x len(cls): which predecessors may be the second under passes of classes `cls`."""
        pred = self.pred_cls[lo:hi, None]
        cls = np.asarray(cls)[None, :]
        return (pred == cls) | ((cls == ANY) & (pred >= 0))

    def edges(self, j: int) -> list[Edge]:
        """The transitions that add candidate j, grouped by target node, predecessor range and charge (computed once
        and kept while they fit, as every sweep goes over them all)."""
        cache = self._cache
        if cache is not None and j < len(cache):
            return cache[j]
        out = list(self._edges(j))
        if cache is not None and j == len(cache):
            cache.append(out)
        return out

    def _edges(self, j: int) -> Iterator[Edge]:
        kind = self.kind
        for to_state, lo, hi, frm_state, cost, opens in self._transitions(j):
            if kind == "real":
                yield Edge(C0 + to_state, C0 + frm_state, lo, hi, cost, ("member", "window") if opens else ("member",))
            elif kind == "count":
                # Members are charged the per-graph term; the top is placed at its whole first term over a second of
                # the pass's class.
                yield Edge(A0 + to_state, A0 + frm_state, lo, hi, cost, ("added",), per_graph=True)
                yield Edge(C0 + to_state, A0 + frm_state, lo, hi, cost, ("first", "added"), placing=True)
            elif opens:  # window: a new FULL window, charged p, or placed as the top window over a second of p
                yield Edge(A0, A0, lo, hi, cost, ("member", "window"), per_graph=True)
                yield Edge(C0, A0, lo, hi, cost, ("member", "window", "first"), placing=True)
            elif to_state == 0:  # same window: no new graph to charge
                yield Edge(A0, A0, lo, hi, cost, ("member",))
                yield Edge(C0, C0, lo, hi, cost, ("member",))
            else:  # no FULL graph for j's window: only above the top window
                yield Edge(C1, C0 + frm_state, lo, hi, cost, ("member",))

    def _close_tails(self) -> np.ndarray:
        """(2, n): latency a chain in state 0/1 adds when candidate j is its top (the steps above it, eager, and the
        latency no list changes); inf where a chain cannot end so."""
        member_tail = sum((layer.steps.eager_total - layer.steps.eager(np.minimum(self.c, layer.cap))
                           for layer, _ in self._member_at), np.zeros(self.n))
        if not self.sep:
            return np.stack([member_tail + self.constant, np.full(self.n, math.inf)])
        tails = np.full((2, self.n), math.inf)
        within = self.r <= self.decode_limit
        for st, top, allowed in ((0, self.c, (self.r == self.c) & within), (1, self.r, (self.r > self.c) | ~within)):
            window_tail = sum((layer.steps.eager_total - layer.steps.eager(top) for layer, _ in self._window_at),
                              np.zeros(self.n))
            tails[st] = np.where(allowed, window_tail + member_tail + self.constant, math.inf)
        return tails

    def _transitions(self, j: int) -> list[tuple[int, int, int, int, np.ndarray, bool]]:
        """(to_state, lo, hi, from_state, latency cost, opens a FULL window) for adding candidate j on top of the
        chains ending at positions lo..hi-1, window by window as vLLM dispatches; costs are over positions 0..j.
        State 1 means j's window has no FULL graph (its rounded width exceeds the max, so j is the top, or the window
        is beyond max_num_seqs requests)."""
        k = j + 1
        members = np.zeros(k)
        for layer, at in self._member_at:
            if layer.kind == "exact":
                # Steps up to c_j above the predecessor run eager, except those of exactly c_j: j's graph.
                members += (at["eager"][j] - at["eager_pos"][:k]) - at["point_eager"][j] + \
                    at["point_mass"][j] * layer.lat[j]
            elif self.c[j] <= layer.cap:
                members += (at["mass"][j] - at["mass_pos"][:k]) * layer.lat[j]
            else:  # j serves none of this layer's steps: those up to the cap above the predecessor run eager
                members += at["eager_cap"] - at["eager_pos"][:k]
        if not self.sep:
            return [(0, 0, k, 0, members, False)]
        first_same, first_beyond = int(self._first_same[j]), int(self._first_beyond[j])
        normal = np.zeros(k)
        flag = np.zeros(k)
        for layer, at in self._window_at:
            normal += (at["mass"][j] - at["mass_pos"][:k]) * layer.lat[j]
            if layer.pad is not None:
                flag += (at["mass_below"][j] - at["mass_pos"][:k]) * layer.pad[j]
            else:
                flag += at["eager_below"][j] - at["eager_pos"][:k]
            flag += at["eager"][j] - at["eager_below"][j]
        out = []
        r_j, c_j = self.r[j], self.c[j]
        if r_j <= self.decode_limit:
            out += [(0, first_same, k, 0, members, False), (0, 0, first_same, 0, members + normal, True)]
        if r_j > c_j or r_j > self.decode_limit:
            # A chain in state 1 at j can only close (j is the top of a window with no FULL graph) or grow beyond
            # max_num_seqs requests; when j's window is its own width within the limit, neither can happen.
            out += [(1, first_same, k, 1, members, False), (1, 0, first_same, 0, members + flag, False),
                    (1, first_beyond, first_same, 1, members + flag, False)]
        return out
