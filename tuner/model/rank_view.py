"""The workload's steps as one rank of a LoRA or data-parallel deployment runs them: the adapter mix split over the
steps, the data-parallel ranks' joint draws (the agreed step a rank replays is the widest rank's), and their latency
under a list by the engine's rules: the LoRA case each step's adapters dispatch to, priced from the profile's rows of
that case where it measured them (`lora<c>_eager`, `lora<c>_full`, `lora<c>_piecewise`), else at the eager step on every
list (no saving is claimed for a case nothing measured), and the ranks' agreement (all eager where any rank is)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from tuner.profile.curve import Curve
from tuner.profile.table import Profile, lora_mode
from tuner.steps import Step, rank_steps, with_active_adapters

if TYPE_CHECKING:
    from tuner.engines.engine import Engine, GraphDispatcher

__all__ = ["LoraRows", "RankView", "price", "rank_view"]


@dataclass
class LoraRows:
    """The profile's rows of one LoRA case: its eager step, and its graphs' replays where measured."""

    eager: Curve
    graphs: dict[str, Curve]
    """`FULL` / `PIECEWISE` -> latency of a replay with the case's adapters active."""


def lora_rows(profile: Profile, case: int) -> LoraRows | None:
    """The case's rows (None where the profile has no `lora<case>_eager` row with status ok)."""
    eager = profile.by_mode(lora_mode(case, "eager"))
    if not eager:
        return None
    graphs = {}
    for base in ("full", "piecewise"):
        rows = profile.by_mode(lora_mode(case, base))
        if rows:
            graphs[base.upper()] = Curve({w: r.latency_ms for w, r in rows.items()}, monotone=True)  # type: ignore
    return LoraRows(Curve({w: r.latency_ms for w, r in eager.items()}, monotone=True), graphs)  # type: ignore


@dataclass
class RankView:
    """The workload's steps' LoRA cases and data-parallel draws, as arrays beside the cost model's step arrays."""

    cases: np.ndarray
    """Per step, the LoRA case its adapters dispatch to (0: none; -1: no graph was captured for it, eager)."""
    own_tokens: np.ndarray
    """Per step, this rank's own width (the agreed width without data parallelism)."""
    own_utc: np.ndarray
    """Per step, this rank's own uniform token count."""
    widest_utc: np.ndarray | None
    """(steps, kinds): each kind of step's uniform token count among the ranks (None: one rank)."""
    widest_tokens: np.ndarray | None
    """(steps, kinds): each kind's widest rank's width (0: no such kind in the draw)."""
    rows: dict[int, LoraRows | None]
    """LoRA case -> its profile rows (None: not measured)."""
    fixed: np.ndarray
    """Per step, whether no list changes its latency (a LoRA case no graph holds, or one nothing measured)."""

    @property
    def data_parallel(self) -> bool:
        return self.widest_tokens is not None


@lru_cache(maxsize=16)
def _rank_steps(steps: tuple[Step, ...], ranks: int, utc: tuple[int, ...]) -> tuple[Step, ...]:
    """`tuner.steps.rank_steps`, once per distribution (a bootstrap refits the model hundreds of times)."""
    return tuple(rank_steps(list(steps), ranks, utc))


def rank_view(engine: Engine, steps: list[Step], utc_of: Callable[[list[Step]], np.ndarray], profile: Profile,
              mix: tuple[tuple[int, float], ...], notes: list[str]) -> tuple[list[Step], RankView | None]:
    """The steps split by the adapter mix `mix` and drawn over the engine's data-parallel ranks (`utc_of`: the uniform
    token count each step dispatches with), and their view; (steps, None) where neither applies."""
    ranks = engine.data_parallel_size
    if not mix and ranks <= 1:
        return steps, None
    if mix:
        steps = with_active_adapters(steps, mix)
    own_utc = utc_of(steps)
    widest_utc = widest_tokens = None
    if ranks > 1:
        steps = list(_rank_steps(tuple(steps), ranks, tuple(int(u) for u in own_utc)))
        notes.append(f"data_parallel_size {ranks}: each step a rank replays is the {ranks} ranks' agreed step (the "
                     f"widest rank's width; decode only where every rank decodes at one query length; all eager where "
                     f"any rank is), over {len(steps)} kinds of joint draw of the ranks' steps")
        syncs = [st.ranks for st in steps]
        kinds = max(len(r.widest) for r in syncs if r is not None)
        widest_utc = np.zeros((len(steps), kinds), dtype=np.int64)
        widest_tokens = np.zeros((len(steps), kinds), dtype=np.int64)
        for i, r in enumerate(syncs):
            for k, (u, w) in enumerate(r.widest):  # type: ignore[union-attr]
                widest_utc[i, k], widest_tokens[i, k] = u, w
        own_tokens = np.array([r.own_tokens for r in syncs], dtype=np.int64)  # type: ignore[union-attr]
        own_utc = np.array([r.own_utc for r in syncs], dtype=np.int64)  # type: ignore[union-attr]
    else:
        own_tokens = np.array([st.num_tokens for st in steps], dtype=np.int64)
    cases = engine.lora_dispatch(np.array([st.loras for st in steps], dtype=np.int64))
    if mix:  # steps that differ only in adapter counts dispatching to one case are one kind of step
        merged: dict[tuple[Step, int], int] = {}
        keep: list[int] = []
        probs: list[float] = []
        for i, (st, case) in enumerate(zip(steps, cases.tolist())):
            j = merged.setdefault((replace(st, probability=0.0, loras=0), case), len(keep))
            if j == len(keep):
                keep.append(i)
                probs.append(0.0)
            probs[j] += st.probability
        steps = [replace(steps[i], probability=probs[j]) for j, i in enumerate(keep)]
        cases, own_tokens, own_utc = cases[keep], own_tokens[keep], own_utc[keep]
        if widest_utc is not None and widest_tokens is not None:
            widest_utc, widest_tokens = widest_utc[keep], widest_tokens[keep]
    rows = {int(c): lora_rows(profile, int(c)) for c in sorted(set(cases.tolist())) if c > 0}
    unmeasured = [c for c, r in rows.items() if r is None]
    if unmeasured:
        notes.append(f"LoRA case{'s' if len(unmeasured) > 1 else ''} {', '.join(map(str, unmeasured))}: no "
                     f"lora<case>_eager rows in the profile, so its steps are charged the eager step at their width on "
                     f"every list (no saving is claimed for them), their graphs' memory in full")
    fixed = (cases < 0) | np.isin(cases, [c for c, r in rows.items() if r is None])
    return steps, RankView(cases, own_tokens, own_utc, widest_utc, widest_tokens, rows, fixed)


def price(view: RankView, engine: Engine, d: GraphDispatcher | None, widths: np.ndarray, utc: np.ndarray,
          logits: np.ndarray, eager_ms: Curve, logits_at: Callable[..., np.ndarray],
          graph_body_ms: Callable[..., np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(latency, mode) of the view's steps under dispatcher `d` (None: no graphs). A step no list changes is charged
    its eager step at its own width (mode NONE here); the others are dispatched (the ranks' agreement under data
    parallelism) and replay their case's graph or run eager."""
    out = eager_ms(view.own_tokens)
    modes = np.full(len(widths), "NONE", dtype=object)
    live = ~view.fixed
    if not np.any(live):
        return out, modes
    own, lg, cases = view.own_tokens[live], logits[live], view.cases[live]
    if d is None:  # no graphs: every rank eager at its own width
        m, padded, eager_w = np.full(len(own), "NONE", dtype=object), np.zeros(len(own), dtype=np.int64), own
    elif view.data_parallel:
        m, padded, eager_w = engine.dispatch_ranks(d, widths[live], utc[live], own, view.own_utc[live],
                                                   view.widest_utc[live], view.widest_tokens[live])  # type: ignore
    else:
        m, padded, _ = d.dispatch_steps(widths[live], utc[live])
        eager_w = widths[live]
    # An eager step (padded to the agreed width where the ranks agreed on one) computes logits for its real tokens.
    lat = eager_ms(eager_w) - logits_at(eager_w) + lg
    for mode in ("FULL", "PIECEWISE"):
        hit = (m == mode) & (cases == 0)
        if np.any(hit):
            lat[hit] = graph_body_ms(padded[hit], mode) + lg[hit]
    for case, rows in view.rows.items():
        sel = cases == case
        if rows is None or not np.any(sel):
            continue
        lat[sel] = rows.eager(eager_w[sel]) - logits_at(eager_w[sel]) + lg[sel]
        for mode in ("FULL", "PIECEWISE"):
            hit = sel & (m == mode)
            curve = rows.graphs.get(mode)
            # a replay nothing timed: the case's eager step at its own width, no saving claimed
            lat[hit] = (curve(padded[hit]) - logits_at(padded[hit]) + lg[hit]) if curve is not None \
                else rows.eager(own[hit])
    out[live], modes[live] = lat, m
    return out, modes
