"""The drafter's side of the cost model: its latency and graph memory per width from the profile's drafter rows,
the graphs it captures for a capture list and what its passes cost in each engine step, by vLLM 0.33's rules
(`tuner.engines.vllm.drafter`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tuner.engines.vllm.drafter import EAGLE_METHODS, capture_sequence, drafter_graphs
from tuner.engines.vllm.memory import GraphCost
from tuner.profile.curve import Curve, memory_curve
from tuner.profile.table import Profile

__all__ = ["DRAFTER_MODES", "DrafterCost", "DrafterLayer"]

DRAFTER_MODES = ("drafter_eager", "drafter_full", "drafter_piecewise")
"""Profile modes of the drafter's rows: one drafter forward pass over that many tokens, eagerly, as a FULL graph,
as PIECEWISE graphs (each with its own logits, as the drafter samples its drafts)."""


@dataclass
class DrafterLayer:
    """One term of the step latency the exact solver weighs by gaps between list members (see tuner.search.exact):
    each step of the layer has a key; a `member` layer's step is served by the smallest member >= its key (at most
    `cap`), a `window` layer's by the FULL decode window of that member; unserved steps pay `eager`."""

    kind: str
    """`member` or `window`."""
    steps: np.ndarray
    """Indices of the workload steps the layer covers."""
    keys: np.ndarray
    """Each covered step's key (tokens or requests)."""
    eager: np.ndarray
    """Each covered step's latency when no graph serves it (ms)."""
    lat: np.ndarray
    """Per candidate: the latency of a step served by its graph (ms)."""
    cap: float = math.inf
    """`member`: candidates above it serve no step."""
    pad: np.ndarray | None = None
    """`window`: per candidate, the latency when a step pads to its mixed graph (its window has no FULL graph);
    None: such steps run eager."""


class DrafterCost:
    """The drafter of one workload under one runner and cudagraph mode, with curves from the profile."""

    def __init__(self, profile: Profile, method: str, *, runner: str, cudagraph_mode: str, decode_mode: str,
                 mixed_mode: str, num_speculative_tokens: int, max_num_seqs: int, parallel_drafting: bool,
                 name: str, notes: list[str], dynamic_ks: Sequence[int] | None = None) -> None:
        self.method, self.runner, self.cudagraph_mode = method, runner, cudagraph_mode
        self.dynamic_ks = sorted(set(dynamic_ks)) if dynamic_ks is not None else None
        """The k values of the dynamic schedule in force (its graphs are per tier), None without one."""
        self.decode_mode, self.mixed_mode = decode_mode, mixed_mode
        self.k, self.R, self.q = num_speculative_tokens, max_num_seqs, num_speculative_tokens + 1
        self.parallel = parallel_drafting
        eager = profile.by_mode("drafter_eager")
        full = profile.by_mode("drafter_full")
        piecewise = profile.by_mode("drafter_piecewise")
        if not eager:
            raise ValueError(f"{name}: no drafter rows (mode drafter_eager) for the {method} drafter the workload "
                             f"runs; profile the workload again (cgtune profile measures its drafter)")
        self.eager_ms = Curve({w: r.latency_ms for w, r in eager.items()}, monotone=True)  # type: ignore[misc]
        self.full_ms = Curve({w: r.latency_ms for w, r in full.items()}, monotone=True) if full else None  # type: ignore[misc]
        self.piecewise_ms = (Curve({w: r.latency_ms for w, r in piecewise.items()}, monotone=True)  # type: ignore[misc]
                             if piecewise else None)
        self.full_sa, self.full_de = memory_curve(full, "standalone_bytes"), memory_curve(full, "capture_delta_bytes")
        self.pw_sa = memory_curve(piecewise, "standalone_bytes")
        self.pw_de = memory_curve(piecewise, "capture_delta_bytes")
        if self.piecewise_ms is None:
            self.pw_sa, self.pw_de = self.full_sa, self.full_de
        # Which graph modes the drafter captures for lists of the profile's widths (the runner's rules).
        modes = {g.mode for g in self.graphs(profile.widths())}
        if "FULL" in modes and self.full_ms is None:
            raise ValueError(f"{name}: no drafter_full rows with status ok (the drafter's FULL graphs were not "
                             f"measured; a CPU profile?)")
        if "PIECEWISE" in modes and self.piecewise_ms is None:
            if self.full_ms is None:
                raise ValueError(f"{name}: no drafter_piecewise (or drafter_full) rows with status ok (the drafter's "
                                 f"PIECEWISE graphs were not measured; a CPU profile?)")
            notes.append(f"no drafter_piecewise rows in {name}: the drafter's PIECEWISE graphs are costed at its "
                         f"eager latency, their memory taken from its full rows")
        if self.k > 1 and method in EAGLE_METHODS + ("draft_model",):
            notes.append("the drafter's N-token decode passes are costed from its rows at width N, measured as steps "
                         "of q tokens per request: their attention over N one-token requests is under-counted")
        if method == "dflash":
            notes.append("DFlash's eager context-KV precompute (the target's hidden states into the drafter's KV "
                         "cache) is not measured and not costed; it is the same under every list on V2")
        if self.k > 1 and method in EAGLE_METHODS and runner == "v2":
            notes.append("a fused V2 EAGLE decode graph (all K-1 draft steps in one replay) is costed at K-1 times "
                      "one step's graph latency and at one step's graph memory")
        notes.append("a mixed step's drafter passes assume min(max_num_seqs, ceil(T / q)) requests (the workload "
                     "does not say how many requests a mixed step holds)"
                     + (" and num_speculative_tokens drafts" if self.dynamic_ks is not None else ""))

    # ------------------------------------------------------------------ graphs
    def graphs(self, runs: Sequence[int]):
        """The drafter's graphs for the list the runner runs, in its capture order."""
        if self.cudagraph_mode == "NONE" or not runs:
            return []
        return drafter_graphs(self.method, runner=self.runner, capture_sizes=list(runs),
                              cudagraph_mode=self.cudagraph_mode, num_speculative_tokens=self.k,
                              max_num_seqs=self.R, dynamic_ks=self.dynamic_ks)

    def _curves(self, mode: str) -> tuple[Curve, Curve]:
        sa, de = (self.full_sa, self.full_de) if mode == "FULL" else (self.pw_sa, self.pw_de)
        assert sa is not None and de is not None
        return sa, de

    def graph_costs(self, runs: Sequence[int], target: list[GraphCost]) -> list[GraphCost]:
        """Target and drafter graphs in the order they enter the one shared pool."""
        drafter = self.graphs(runs)
        if not drafter:
            return target
        order = capture_sequence(runner=self.runner, target_graphs=[(g.mode, g.num_tokens) for g in target],
                                 drafter=drafter)
        by_key = {(g.mode, g.num_tokens): g for g in target}
        # The drafter's memory per (mode, width), read off its curves once per mode, all widths at a time.
        drafter_bytes: dict[tuple[str, int], tuple[float, float]] = {}
        for mode in {m for owner, m, _ in order if owner == "drafter"}:
            widths = sorted({w for owner, m, w in order if owner == "drafter" and m == mode})
            sa, de = self._curves(mode)
            drafter_bytes.update(((mode, w), (float(a), float(d)))
                                 for w, a, d in zip(widths, np.rint(sa(widths)), np.rint(de(widths))))
        return [by_key[(mode, width)] if owner == "target" else GraphCost("drafter", mode, width,
                                                                           *drafter_bytes[(mode, width)])
                for owner, mode, width in order]

    # ------------------------------------------------------------------ latency
    def graph_ms(self, widths: np.ndarray | Sequence[int] | int, mode: str) -> np.ndarray:
        """The drafter's pass at each width replayed as a graph of `mode`."""
        if mode == "FULL":
            assert self.full_ms is not None
            return self.full_ms(widths)
        return self.piecewise_ms(widths) if self.piecewise_ms is not None else self.eager_ms(widths)

    def _padded(self, graphs: Sequence[int], x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(served, padded width) for each x over the sorted graph widths."""
        g = np.array(sorted(set(graphs)), dtype=np.int64)
        if not len(g):
            return np.zeros(len(x), dtype=bool), np.zeros(len(x), dtype=np.int64)
        i = np.searchsorted(g, x, side="left")
        served = i < len(g)
        return served, np.where(served, g[np.minimum(i, len(g) - 1)], 0)

    def _pass(self, graphs: Sequence[int], mode: str, x: np.ndarray) -> np.ndarray:
        served, padded = self._padded(graphs, x)
        out = self.eager_ms(x)
        if np.any(served):
            out = np.where(served, self.graph_ms(np.where(served, padded, 1), mode), out)
        return out

    def step_latencies(self, runs: Sequence[int], widths: np.ndarray, uniform: np.ndarray, target_mode: np.ndarray,
                       target_padded: np.ndarray, requests: np.ndarray, ks: np.ndarray) -> np.ndarray:
        """What the drafter's passes add to each step (facts §3) over the graphs `drafter_graphs` captures:
        `target_mode`/`target_padded` say what the target replayed (NONE: eager at the step's own width), `requests`
        the step's N, `ks` the K it drafts (a dynamic tier's; DFlash always drafts num_speculative_tokens)."""
        n, q = requests, self.q
        later = np.maximum(ks - 1, 0)  # draft steps after the first
        runs = sorted(runs) if self.cudagraph_mode != "NONE" else []
        graphs = self.graphs(runs)
        if self.runner == "v2":
            if self.method == "draft_model":
                return self.eager_ms(widths + n) + later * self.eager_ms(n)
            if self.method == "dflash":
                # One query pass of N x (K+1), dispatched uniform at K+1 over its manager's FULL graphs (per tier).
                x = n * q
                at, held = self._full_pad([(g.num_tokens, g.uniform_query_len or 0) for g in graphs], x, q)
                return np.where(held, self.graph_ms(np.where(held, at, 1), "FULL"), self.eager_ms(x))
            # EAGLE/EAGLE3/MTP: draft step 0 replays what the target replayed; steps 1..k-1 FULL at s >= N, s <= R.
            out = self.eager_ms(widths)
            for mode in ("FULL", "PIECEWISE"):
                sel = target_mode == mode
                if np.any(sel):
                    out = np.where(sel, self.graph_ms(np.where(sel, target_padded, 1), mode), out)
            decode = [g.num_tokens for g in graphs if g.role == "decode"]
            return out + later * self._pass(decode, "FULL", n)
        # V1: every pass PIECEWISE at the smallest drafter graph >= its width, eager above (facts §2a, §3).
        widths_v1 = [g.num_tokens for g in graphs]
        if self.method == "dflash":
            return self._pass(widths_v1, "PIECEWISE", n * q)
        if self.parallel:
            return self._pass(widths_v1, "PIECEWISE", widths + (ks if self.method == "draft_model" else ks - 1) * n)
        first = widths + n if self.method == "draft_model" else widths
        return self._pass(widths_v1, "PIECEWISE", first) + later * self._pass(widths_v1, "PIECEWISE", n)

    @staticmethod
    def _full_pad(pairs: Sequence[tuple[int, int]], x: np.ndarray, query_len: int) -> tuple[np.ndarray, np.ndarray]:
        """(padded width, replays a FULL graph) of passes of `x` tokens at `query_len` per request over a V2 manager's
        FULL graphs `(width, query length)`: the graphs at the smallest width >= x must hold that query length."""
        widths = np.array(sorted({w for w, _ in pairs}), dtype=np.int64)
        if not len(widths):
            return np.zeros(len(x), dtype=np.int64), np.zeros(len(x), dtype=bool)
        at = widths[np.minimum(np.searchsorted(widths, x, side="left"), len(widths) - 1)]
        held = {w for w, ql in pairs if ql == query_len}
        return at, (at >= x) & np.isin(at, sorted(held))

    # ------------------------------------------------------------------ the exact solver's view
    def layers(self, c: np.ndarray, r: np.ndarray, widths: np.ndarray, windowed: np.ndarray, requests: np.ndarray,
               ks: np.ndarray, *, sep: bool, target_mixed_mode: str, tiers: Sequence[int],
               ) -> tuple[list[DrafterLayer], np.ndarray, bool]:
        """The drafter's latency as gap layers over the candidates `c` (FULL windows `r`, at the one decode query
        length of `tiers`), the steps' latency no list changes, and whether the layers are exact (False: a combination
        the solver only approximates). `windowed`: the steps the target dispatches against its FULL windows;
        `requests`, `ks`: each step's N and K."""
        n, q = requests, self.q
        later = np.maximum(ks - 1, 0)
        all_steps = np.arange(len(widths))
        const = np.zeros(len(widths))
        layers: list[DrafterLayer] = []

        def repeated(keys: np.ndarray, lat: np.ndarray, cap: float) -> list[DrafterLayer]:
            """The k - 1 later draft steps as member layers, one per k (a layer's latency is per candidate)."""
            return [DrafterLayer("member", sel, keys[sel], times * self.eager_ms(keys[sel]), times * lat, cap=cap)
                    for times in sorted(set(later.tolist()) - {0}) for sel in [np.flatnonzero(later == times)]]

        if self.cudagraph_mode == "NONE":
            return layers, self.step_latencies([], widths, windowed, np.full(len(widths), "NONE"),
                                               np.zeros(len(widths), dtype=np.int64), n, ks), True
        if self.runner == "v2":
            if self.method == "draft_model":
                return layers, self.eager_ms(widths + n) + later * self.eager_ms(n), True
            if self.method == "dflash":
                if self.decode_mode != "FULL" or q not in tiers:
                    return layers, self.eager_ms(n * q), True  # no FULL graph ever holds its query length
                if not sep or len(tiers) > 1:
                    return layers, self.eager_ms(n * q), False  # windows the solver does not follow: approximated
                # Its FULL query graphs are the target's decode windows: windowed steps key on their width, the others
                # on their query width N x q; both eager where the window has no FULL graph.
                keys = np.where(windowed, widths, n * q)
                layers.append(DrafterLayer("window", all_steps, keys, self.eager_ms(n * q),
                                           self.graph_ms(r, "FULL"), pad=None))
                return layers, const, True
            # EAGLE family: step 0 follows the target's own dispatch, at the same widths.
            mixed_lat = self.graph_ms(c, target_mixed_mode) if target_mixed_mode != "NONE" else None
            if sep:
                mixed = np.flatnonzero(~windowed)
                dec = np.flatnonzero(windowed)
                layers.append(DrafterLayer("member", mixed, widths[mixed], self.eager_ms(widths[mixed]),
                                           mixed_lat if mixed_lat is not None else np.zeros(len(c)),
                                           cap=math.inf if mixed_lat is not None else 0))
                layers.append(DrafterLayer("window", dec, widths[dec], self.eager_ms(widths[dec]),
                                           self.graph_ms(r, "FULL"), pad=mixed_lat))
            else:
                layers.append(DrafterLayer("member", all_steps, widths, self.eager_ms(widths),
                                           mixed_lat if mixed_lat is not None else np.zeros(len(c)),
                                           cap=math.inf if mixed_lat is not None else 0))
            if self.decode_copies() and self.decode_mode == "FULL":
                layers += repeated(n, self.graph_ms(c, "FULL"), self.R)
            else:
                const = const + later * self.eager_ms(n)
            return layers, const, len(tiers) == 1
        # V1: member layers over the drafter's PIECEWISE graphs, which are the list's sizes when the target's mixed
        # mode is PIECEWISE (DFlash's pad(min(s, R q)) serves a query width <= R q as the plain padding does).
        has = self.mixed_mode == "PIECEWISE"
        lat = self.graph_ms(c, "PIECEWISE") if has else np.zeros(len(c))
        cap = math.inf if has else 0

        def member(keys: np.ndarray) -> DrafterLayer:
            return DrafterLayer("member", all_steps, keys, self.eager_ms(keys), lat, cap=cap)

        if self.method == "dflash":
            return [member(n * q)], const, True
        if self.parallel:
            return [member(widths + (ks if self.method == "draft_model" else ks - 1) * n)], const, True
        layers.append(member(widths + n if self.method == "draft_model" else widths))
        return layers + repeated(n, lat, cap), const, True

    def decode_copies(self) -> int:
        """V2 EAGLE decode graphs captured per width: one, or under a dynamic schedule (fused decode) one per k in the
        schedule above 1; none when K is 1 (no later draft steps)."""
        if self.k < 2:
            return 0
        if self.dynamic_ks is None:
            return 1
        return len(set(self.dynamic_ks) - {0, 1})

    def memory_terms(self, c: np.ndarray, r: np.ndarray, *, sep: bool) -> tuple[np.ndarray, np.ndarray]:
        """(per member, per FULL decode window) bytes the drafter's graphs add (facts §2): they enter the pool after
        the target's larger graphs, so each costs its delta. V1's drafter graphs sit inside the target's PIECEWISE
        samples of its estimate, V2's count in full."""
        zero = np.zeros(len(c))
        if self.cudagraph_mode == "NONE" or (self.runner == "v2" and self.method == "draft_model"):
            return zero, zero
        if self.runner == "v1":
            if self.mixed_mode != "PIECEWISE":
                return zero, zero
            return np.rint(self._curves("PIECEWISE")[1](c)), zero
        full_window = np.rint(self._curves("FULL")[1](r)) if self.decode_mode == "FULL" and sep else zero
        if self.method == "dflash":
            return zero, full_window
        member = np.rint(self._curves(self.mixed_mode)[1](c)) if self.mixed_mode != "NONE" else zero.copy()
        if self.decode_mode == "FULL":  # the decode manager: FULL at every size <= max_num_seqs (per k, fused)
            member = member + self.decode_copies() * np.where(c <= self.R, np.rint(self._curves("FULL")[1](c)), 0.0)
        return member, full_window

