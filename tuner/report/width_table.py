"""The per-width table of a run (`cgtune report --csv`): one row per measured width, for a user who analyses in a
notebook (`pandas.read_csv`).

Columns: `num_tokens`; per mode the profile measured, `<mode>_ms` (the median step latency as measured, empty where
that mode was not measured at the width) and, for graph modes, `<mode>_capture_delta_bytes` and
`<mode>_standalone_bytes`; `full_saving_ms` (eager minus FULL graph latency at the width, both measured); `noisy`
(the width's timing was flagged noisy) and `outlier` (the columns flagged wildly off their neighbours, `;`-joined,
whether dropped or kept); `in_<list>` for each list of the report (default, tuned, compact, exact, widest, the peer
rows) and `in_shipped` (the list the deployment files carry): whether the list captures a graph of that many tokens
(`Engine.graph_kinds`; under vLLM 0.34 a decode size of n requests marks n x q tokens). Values are the profile's own
(outliers included, as read), so the table is the measurement the decision rests on, never the cost model's interpolation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from tuner.profile.table import MODES

if TYPE_CHECKING:
    from tuner.model.costmodel import CostModel, Evaluation
    from tuner.profile.table import Profile

__all__ = ["width_table"]

_GRAPH_MODES = ("full", "piecewise", "drafter_full", "drafter_piecewise")


def width_table(model: CostModel, profile: Profile, table: dict[str, Evaluation], shipped: tuple[int, ...]
                ) -> pd.DataFrame:
    """The run's per-width table (see the module docstring): `profile` as read (before outliers are dropped),
    `table` the report's lists, `shipped` the list the files carry."""
    widths = profile.widths()
    frame = pd.DataFrame({"num_tokens": pd.array(widths, dtype="Int64")})
    modes = [m for m in MODES if any(r.mode == m and r.status == "ok" for r in profile.rows)]
    for mode in modes:
        rows = profile.by_mode(mode)
        frame[f"{mode}_ms"] = pd.array([rows[w].latency_ms if w in rows else None for w in widths], dtype="Float64")
        if mode in _GRAPH_MODES:
            for column in ("capture_delta_bytes", "standalone_bytes"):
                frame[f"{mode}_{column}"] = pd.array([getattr(rows[w], column) if w in rows else None for w in widths],
                                                     dtype="Int64")
    if "eager_ms" in frame and "full_ms" in frame:
        frame["full_saving_ms"] = frame["eager_ms"] - frame["full_ms"]
    noisy = set(model.noisy_widths)
    frame["noisy"] = [w in noisy for w in widths]
    flagged: dict[int, list[str]] = {}
    for o in model.outliers:
        flagged.setdefault(o.num_tokens, []).append(f"{o.mode} {o.column}")
    frame["outlier"] = pd.array([";".join(flagged.get(w, [])) for w in widths], dtype="string")
    for name, e in table.items():
        if name != "ideal":  # the ideal row is no list: every step at its own width
            members = _graph_widths(model, e.capture_sizes)
            frame[f"in_{name}"] = [w in members for w in widths]
    members = _graph_widths(model, shipped)
    frame["in_shipped"] = [w in members for w in widths]
    return frame


def _graph_widths(model: CostModel, capture_sizes: tuple[int, ...]) -> set[int]:
    """The token widths at which the list makes a graph (vLLM 0.34: a decode size of n requests at n x q tokens, a
    prefill size at its tokens), as a width's row is counted."""
    return {w for _, _, ws in model.engine.graph_kinds(capture_sizes) for w in ws}
