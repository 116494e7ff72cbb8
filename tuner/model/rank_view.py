"""The workload's steps as one rank of a LoRA or data-parallel deployment runs them: the adapter mix split over the
steps, the data-parallel ranks' joint draws (the agreed step a rank replays is the widest rank's), and their latency
under a list by the engine's rules: the LoRA case each step's adapters dispatch to, priced from the profile's rows of
that case where it measured them (`lora<c>_eager`, `lora<c>_full`, `lora<c>_piecewise`), else at the eager step on every
list (no saving is claimed for a case nothing measured), and the ranks' agreement (all eager where any rank is)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
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
    rows = {int(c): lora_rows(profile, int(c)) for c in sorted(set(cases.tolist())) if c > 0}
    unmeasured = [c for c, r in rows.items() if r is None]
    if unmeasured:
        notes.append(f"LoRA case{'s' if len(unmeasured) > 1 else ''} {', '.join(map(str, unmeasured))}: no "
                     f"lora<case>_eager rows in the profile, so its steps are charged the eager step at their width on "
                     f"every list (no saving is claimed for them), their graphs' memory in full")
    return steps, RankView(cases, own_tokens, own_utc, widest_utc, widest_tokens, rows)


def price(view: RankView, engine: Engine, d: GraphDispatcher | None, widths: np.ndarray, utc: np.ndarray,
          logits: np.ndarray, eager_ms: Curve, logits_at: object, graph_body_ms: object
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(latency, mode, padded width (0: eager)) of the view's steps under dispatcher `d` (None: no graphs)."""
    n = len(widths)
    if d is None:
        modes, padded, eager_w = np.full(n, "NONE", dtype=object), np.zeros(n, dtype=np.int64), view.own_tokens
    elif view.data_parallel:
        modes, padded, eager_w = engine.dispatch_ranks(d, widths, utc, view.own_tokens, view.own_utc,
                                                       view.widest_utc, view.widest_tokens)  # type: ignore[arg-type]
    else:
        modes, padded, _ = d.dispatch_steps(widths, utc)
        eager_w = widths
    no_graph = view.cases < 0
    modes = np.where(no_graph, "NONE", modes).astype(object)
    padded = np.where(no_graph, 0, padded)
    eager_w = np.where(no_graph, view.own_tokens, eager_w)
    # An eager step (padded to the agreed width where the ranks agreed on one) computes logits for its real tokens.
    out = eager_ms(eager_w) - logits_at(eager_w) + logits  # type: ignore[operator]
    for mode in ("FULL", "PIECEWISE"):
        hit = modes == mode
        if np.any(hit):
            out[hit] = graph_body_ms(padded[hit], mode) + logits[hit]  # type: ignore[operator]
    for case, rows in view.rows.items():
        sel = view.cases == case
        if rows is None:  # nothing measured for the case: the eager step at its width on every list
            out[sel] = eager_ms(view.own_tokens[sel])
            continue
        lat = rows.eager(eager_w[sel]) - logits_at(eager_w[sel]) + logits[sel]  # type: ignore[operator]
        for mode, curve in rows.graphs.items():
            hit = modes[sel] == mode
            lat[hit] = curve(padded[sel][hit]) - logits_at(padded[sel][hit]) + logits[sel][hit]  # type: ignore
        unmeasured = np.isin(modes[sel], [m for m in ("FULL", "PIECEWISE") if m not in rows.graphs])
        lat[unmeasured] = rows.eager(view.own_tokens[sel][unmeasured])  # a graph nothing timed: no saving claimed
        out[sel] = lat
    return out, modes, padded
