"""The drafter's side of the cost model under vLLM 0.34 (facts §6), from the profile's drafter rows: the graphs its
managers capture for a pair of lists, in the pool after the target's, and what its passes add to each step.

- DFlash: one query pass of N x (1 + K) tokens a step, replayed on FULL graphs at the target's decode shapes (its
  decode request sizes, at q = 1 + K), eager above them or without them.
- EAGLE, EAGLE3, MTP: draft step 0 in the target's shapes (its prefill manager holds the target's decode and prefill
  graphs), so it replays what the target replayed; the K - 1 later one-token steps on FULL graphs of the request grid up
  to max_num_seqs, which 0.34 captures whenever the target has decode graphs (`get_draft_decode_cudagraph_request_sizes`),
  under a dynamic schedule once for each K of it above 1 (`SpeculatorCudaGraphManager.capture` with
  `specialize_spec_tokens`: FlashAttention updates the draft decode metadata in place).
- a draft model: its first pass over the step plus N tokens runs eager (its prefill manager's K + 2 shapes are not
  modelled), its later steps as EAGLE's.
Model-free methods capture nothing and add nothing. Where the target captures no graph, the runner captures none of the
drafter's either (`GPUModelRunner.capture_model` calls the speculator's capture only after the target's), and its
passes run eager."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tuner.engines.vllm.memory import GraphCost
from tuner.engines.vllm.v034.defaults import DRAFT_DECODE_METHODS, decode_grid, decode_shapes
from tuner.profile.curve import Curve, memory_curve
from tuner.profile.table import Profile

__all__ = ["Drafter034", "DrafterTerms"]


@dataclass(frozen=True)
class DrafterTerms:
    """What the drafter adds per list member, as `tuner.search.exact_split` adds it to each chain: latency per step a
    member's graph serves (ms, for a decode size and for a prefill size), bytes per member, and per step what it pays
    with no graph (and where the decode sizes' graphs do not hold it)."""

    decode_ms: Callable[[np.ndarray], np.ndarray]
    """The drafter's pass at a decode graph of these token widths (n x q), for a decode step it serves."""
    decode_bytes: Callable[[np.ndarray], np.ndarray]
    """The drafter's graph bytes per decode size (at its token width)."""
    prefill_ms: Callable[[np.ndarray], np.ndarray] | None
    """Its pass at a prefill graph of these widths (EAGLE's step 0); None: the prefill sizes do not serve it."""
    prefill_bytes: Callable[[np.ndarray], np.ndarray]
    """Its graph bytes per prefill size (0 where it captures none there)."""


class Drafter034:
    """A 0.34 deployment's drafter with curves from the profile (`dispatcher`: the engine's, for a list's graphs)."""

    runner = "v2"

    def __init__(self, profile: Profile, method: str, *, dispatcher: Callable[[Sequence[int]], object],
                 num_speculative_tokens: int, max_num_seqs: int, decode_mode: str, name: str,
                 notes: list[str], multi_module_mtp: bool = False, dynamic_ks: Sequence[int] | None = None) -> None:
        self.method, self.k, self.R, self.q = method, num_speculative_tokens, max_num_seqs, num_speculative_tokens + 1
        self.dispatcher = dispatcher
        self.dynamic_ks = dynamic_ks
        self.decode_full = decode_mode == "FULL"
        """The target's decode mode is FULL: DFlash's and EAGLE's decode managers capture (0.34: NONE otherwise)."""
        eager, full = profile.by_mode("drafter_eager"), profile.by_mode("drafter_full")
        piecewise = profile.by_mode("drafter_piecewise")
        if not eager:
            raise ValueError(f"{name}: no drafter rows (mode drafter_eager) for the {method} drafter the workload "
                             f"runs; profile the workload again (cgtune profile measures its drafter)")
        self.eager_ms = _curve(eager)
        self.full_ms = _curve(full) if full else None
        self.piecewise_ms = _curve(piecewise) if piecewise else None
        self.full_sa, self.full_de = memory_curve(full, "standalone_bytes"), memory_curve(full, "capture_delta_bytes")
        self.pw_sa, self.pw_de = memory_curve(piecewise, "standalone_bytes"), memory_curve(piecewise,
                                                                                          "capture_delta_bytes")
        if self.piecewise_ms is None:
            self.pw_sa, self.pw_de = self.full_sa, self.full_de
        self._rules(multi_module_mtp)
        if self.full_ms is None and (method == "dflash" or self.grid):
            raise ValueError(f"{name}: no drafter_full rows with status ok (the drafter's FULL graphs were not "
                             f"measured; a CPU profile?)")
        if method == "draft_model":
            notes.append("vLLM 0.34's draft model: its first pass (the step plus N tokens) is costed eager, its prefill "
                         "manager's K + 2 graphs are not modelled")
        notes.append("vLLM 0.34's drafter: its graphs enter the pool after the target's, each at its capture delta; "
                     "a mixed step's drafter pass assumes min(max_num_seqs, ceil(T / q)) requests")

    @classmethod
    def rules(cls, method: str, *, dispatcher: Callable[[Sequence[int]], object], num_speculative_tokens: int,
              max_num_seqs: int, decode_mode: str, multi_module_mtp: bool = False,
              dynamic_ks: Sequence[int] | None = None) -> Drafter034:
        """The drafter's graph rules alone, without a profile's curves (what captures, not what it costs)."""
        self = object.__new__(cls)
        self.method, self.k, self.R = method, num_speculative_tokens, max_num_seqs
        self.q, self.dispatcher, self.decode_full = num_speculative_tokens + 1, dispatcher, decode_mode == "FULL"
        self.dynamic_ks = dynamic_ks
        self._rules(multi_module_mtp)
        return self

    def _rules(self, multi_module_mtp: bool) -> None:
        self.multi_module = multi_module_mtp and self.method == "mtp"
        """An MTP drafter of several modules: its prefill manager drops PIECEWISE graphs, and it takes no one-token
        decode graphs (`get_draft_decode_cudagraph_request_sizes`)."""
        self.grid = (decode_grid(self.R) if self.k >= 2 and self.method in DRAFT_DECODE_METHODS
                     and self.decode_full and not self.multi_module else [])
        """The request counts of the one-token draft decode graphs (while the target has decode graphs)."""
        self.copies = (1,) if self.dynamic_ks is None else tuple(sorted(set(self.dynamic_ks) - {0, 1}, reverse=True))
        """The Ks each one-token draft decode graph is captured for: once without a dynamic schedule; under one, once
        for each K of its dense lookup above 1 (none where every batch drafts 0 or 1)."""

    # ------------------------------------------------------------------ graphs
    def _captures(self, d: object) -> bool:
        """The target captures a graph for the list (the runner captures the drafter's only then)."""
        return bool(d.manager_graphs())  # type: ignore[attr-defined]

    def _decode_shapes(self, runs: Sequence[int]) -> list[tuple[int, int]]:
        """The target's decode graphs `(requests, query length)`; DFlash's at q = 1 + K alone (it always drafts K:
        a dynamic schedule's tiers are not expanded for it)."""
        d = self.dispatcher(runs)
        if not self._captures(d):
            return []
        if self.method == "dflash":  # its own FULL_DECODE_ONLY manager, whatever routine the target runs
            return decode_shapes(d.decode_request_sizes, {self.q: self.R}, d.decode_max_tokens) \
                if d.cudagraph_mode != "NONE" and self.decode_full else []  # type: ignore[attr-defined]
        return list(getattr(d, "decode_shapes", []))

    def graphs(self, runs: Sequence[int]) -> list[tuple[str, int]]:
        """The drafter's graphs `(mode, tokens)` for a pair of lists, in capture order: its prefill (or query)
        manager's, then its decode manager's, each PIECEWISE then FULL, widest first."""
        if not runs:
            return []
        d = self.dispatcher(runs)
        if not self._captures(d):
            return []
        shapes = self._decode_shapes(runs)
        if self.method == "dflash":
            return [("FULL", n * q) for n, q in sorted(shapes, key=lambda s: -s[0] * s[1])] if self.decode_full else []
        if self.method not in DRAFT_DECODE_METHODS:
            return []
        step0 = [(m, w) for m, w in d.graphs()  # type: ignore[attr-defined]  # the target's own shapes
                 if not (self.multi_module and m == "PIECEWISE")]
        if self.method == "draft_model" and d.separate_decode:  # type: ignore[attr-defined]
            # Its prefill manager's decode graphs hold one token more a request than the target's (K + 2 at K).
            lens = {ql + 1: n for ql, n in d.decode_max_reqs.items()}  # type: ignore[attr-defined]
            step0 = [(m, w) for m, w in step0 if m != "FULL"]
            step0 += [("FULL", n * ql) for n, ql in sorted(
                decode_shapes(d.decode_request_sizes, lens, d.decode_max_tokens),  # type: ignore[attr-defined]
                key=lambda s: -s[0] * s[1])] if self.decode_full else []
        return step0 + [("FULL", n) for n in sorted(self._later_sizes(d), reverse=True) for _ in self.copies]

    def _later_sizes(self, d: object) -> list[int]:
        """The request counts of the one-token draft decode graphs for a target dispatcher: the grid, while the target
        has decode sizes, within the decode token budget (`decode_cudagraph_capture_shapes` at q = 1); none where no
        K above 1 captures them or the target captures nothing."""
        if not (self.grid and self.copies and d.decode_request_sizes and self._captures(d)):  # type: ignore[attr-defined]
            return []
        return [n for n, _ in decode_shapes(self.grid, {1: self.R}, d.decode_max_tokens)]  # type: ignore[attr-defined]

    def graph_costs(self, runs: Sequence[int], target: list[GraphCost]) -> list[GraphCost]:
        """Target and drafter graphs in the order they enter the one shared pool (the drafter's after the target's)."""
        drafter = self.graphs(runs)
        out = list(target)
        for mode in ("PIECEWISE", "FULL"):
            widths = [w for m, w in drafter if m == mode]
            if not widths:
                continue
            sa, de = (self.full_sa, self.full_de) if mode == "FULL" else (self.pw_sa, self.pw_de)
            assert sa is not None and de is not None
            by_width = dict(zip(widths, zip(np.rint(sa(widths)).tolist(), np.rint(de(widths)).tolist())))
            out += [GraphCost("drafter", m, w, *by_width[w]) for m, w in drafter if m == mode]
        order = {(m, w): i for i, (m, w) in enumerate(drafter)}
        return out[:len(target)] + sorted(out[len(target):], key=lambda g: order[(g.mode, g.num_tokens)])

    # ------------------------------------------------------------------ latency
    def graph_ms(self, widths: np.ndarray, mode: str) -> np.ndarray:
        if mode == "FULL":
            assert self.full_ms is not None
            return self.full_ms(widths)
        return self.piecewise_ms(widths) if self.piecewise_ms is not None else self.eager_ms(widths)

    def _by_requests(self, sizes: Sequence[int], n: np.ndarray, width: Callable[[np.ndarray], np.ndarray]
                     ) -> np.ndarray:
        """A pass of n requests on FULL graphs of these request counts (the smallest >= n), eager above them."""
        g = np.array(sorted(set(sizes)), dtype=np.int64)
        out = self.eager_ms(width(n))
        if not len(g):
            return out
        i = np.searchsorted(g, n, side="left")
        served = i < len(g)
        return np.where(served, self.graph_ms(width(np.where(served, g[np.minimum(i, len(g) - 1)], 1)), "FULL"), out)

    def step_latencies(self, runs: Sequence[int], widths: np.ndarray, uniform: np.ndarray, target_mode: np.ndarray,
                       target_padded: np.ndarray, requests: np.ndarray, ks: np.ndarray) -> np.ndarray:
        """What the drafter's passes add to each step (module docstring): `target_mode`/`target_padded` say what the
        target replayed, `requests` the step's N, `ks` its K."""
        n, q = requests, self.q
        shapes = self._decode_shapes(runs) if runs else []
        if self.method == "dflash":
            sizes = [r for r, ql in shapes if ql == q] if self.decode_full else []
            return self._by_requests(sizes, n, lambda x: x * q)
        later = np.maximum(ks - 1, 0) * self._by_requests(self._later_sizes(self.dispatcher(runs)) if runs else [],
                                                          n, lambda x: x)
        if self.method == "draft_model":
            return self.eager_ms(widths + n) + later
        out = self.eager_ms(widths)
        for mode in ("FULL", "PIECEWISE"):
            sel = target_mode == mode
            if np.any(sel):
                out = np.where(sel, self.graph_ms(np.where(sel, target_padded, 1), mode), out)
        return out + later

    # ------------------------------------------------------------------ the split solver's view
    def terms(self, q: int) -> DrafterTerms:
        """Per member, what `tuner.search.exact_split` adds to each chain (DFlash and EAGLE's step 0 are additive in the
        members that serve them; the later steps' graphs and passes depend only on whether there are decode graphs)."""
        def full_bytes(w: np.ndarray) -> np.ndarray:
            return np.rint(self.full_de(w)) if self.full_de is not None else np.zeros(len(w))

        if self.method == "dflash":
            return DrafterTerms(lambda w: self.graph_ms(w, "FULL"), full_bytes if self.decode_full else _zero,
                                None, _zero)
        if self.method == "draft_model":
            return DrafterTerms(lambda w: np.zeros(len(w)), _zero, None, _zero)

        def pw_bytes(w: np.ndarray) -> np.ndarray:
            return np.rint(self.pw_de(w)) if self.pw_de is not None else np.zeros(len(w))

        return DrafterTerms(lambda w: self.graph_ms(w, "FULL"), full_bytes, lambda w: self.graph_ms(w, "PIECEWISE"),
                            pw_bytes)

    def later_steps(self, requests: np.ndarray, ks: np.ndarray, with_decode: bool) -> tuple[np.ndarray, float]:
        """(each step's later draft steps' latency, their graphs' bytes), with the target's decode graphs or without."""
        grid = self.grid if with_decode and self.copies else []
        lat = np.maximum(ks - 1, 0) * self._by_requests(grid, requests, lambda x: x) if self.method != "dflash" \
            else np.zeros(len(requests))
        mem = float(np.rint(self.full_de(np.array(grid))).sum()) * len(self.copies) \
            if grid and self.full_de is not None else 0.0
        return lat, mem


def _curve(rows: dict) -> Curve:
    return Curve({w: r.latency_ms for w, r in rows.items()}, monotone=True)  # type: ignore[misc]


def _zero(w: np.ndarray) -> np.ndarray:
    return np.zeros(len(w))
