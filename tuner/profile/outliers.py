"""Readings wildly off their neighbours: flagged by width, and kept out of the search unless allowed.

A profile row that reads 1e308 ms, or a graph that took a petabyte, is no measurement the search should rest on: one
such FULL latency turns every wider graph into the slowest step there is (the latency curve is monotone), so the
answer collapses to a one-graph list. A reading is compared with its REFERENCE, the median of the same column over the
`NEIGHBOURS` nearest measured widths of the same mode (a median, so one bad neighbour does not make a good reading
look bad), and flagged when it is more than `FACTOR` times the reference (a latency also when under a `FACTOR`th of
it). Memory moves in allocator blocks (a shared pool's delta is 0 at many widths and a new segment at the next), so a
memory reading is flagged only when it is also more than `FACTOR` times every other reading of its column; the first
capture into the pool (the widest width of its mode, captured first) allocates the pool and is never flagged for its
delta. A column measured at fewer than 4 widths leaves no majority to say which reading is off, and is not judged.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from tuner.profile.table import Profile, ProfileRow

__all__ = ["FACTOR", "NEIGHBOURS", "Outlier", "find_outliers", "without_outliers"]

FACTOR = 10.0
"""How far from its reference a reading must be to be flagged."""
NEIGHBOURS = 4
"""Widths the reference is the median over (fewer where the mode has fewer, but at least 3)."""
_MIN_NEIGHBOURS = 3
COLUMNS = ("latency_ms", "capture_delta_bytes", "standalone_bytes")
"""The columns judged (capture_s and the IQR are not decided on)."""


@dataclass(frozen=True)
class Outlier:
    """One reading flagged: the row (width, mode), the column, its value and its neighbours' median."""

    num_tokens: int
    mode: str
    column: str
    value: float
    reference: float

    def text(self) -> str:
        """`full latency_ms at 2048: 1e+308 against 4.12 at its neighbours`."""
        unit = "ms" if self.column == "latency_ms" else "bytes"
        return (f"{self.mode} {self.column} at {self.num_tokens}: {self.value:.4g} {unit} against {self.reference:.4g} "
                f"at its neighbours")


def _judged(rows: list[ProfileRow], mode: str, column: str) -> list[Outlier]:
    points = [(r.num_tokens, float(v)) for r in rows if (v := getattr(r, column)) is not None]
    n = len(points)
    if n <= _MIN_NEIGHBOURS:
        return []
    values = np.array([v for _, v in points])
    # The NEIGHBOURS nearest widths of each are the block of NEIGHBOURS + 1 around it (shifted in at either end),
    # itself left out: a median over them, vectorised (a bootstrap refits the model hundreds of times).
    index = np.arange(n)
    start = np.clip(index - NEIGHBOURS // 2, 0, max(n - NEIGHBOURS - 1, 0))
    block = start[:, None] + np.arange(NEIGHBOURS + 1)
    near = np.where((block == index[:, None]) | (block >= n), np.nan, values[np.minimum(block, n - 1)])
    k = min(NEIGHBOURS, n - 1)  # every width has as many neighbours; np.sort puts the left-out (nan) last
    ordered = np.sort(near, axis=1)
    reference = (ordered[:, (k - 1) // 2] + ordered[:, k // 2]) / 2
    with np.errstate(over="ignore"):  # ten times 1e308 is inf, and still compares right
        above = values > FACTOR * reference
    if column == "latency_ms":
        off = above | (values < reference / FACTOR)
    else:
        # Memory moves in allocator blocks (a shared pool's delta is 0 at many widths and a segment at the next), so
        # a memory reading is wild only when it is also FACTOR times every other reading of its column.
        order = np.argsort(values)
        largest_other = np.where(index == order[-1], values[order[-2]], values[order[-1]])
        with np.errstate(over="ignore"):
            off = above & (values > FACTOR * largest_other)
        if column == "capture_delta_bytes":
            # The widest, captured first, allocates the pool: its delta is the pool's, a neighbour but not judged.
            off[-1] = False
    return [Outlier(points[i][0], mode, column, points[i][1], float(reference[i])) for i in np.flatnonzero(off)]


def find_outliers(profile: Profile) -> list[Outlier]:
    """Every reading of the profile's measured rows wildly off its neighbours (see the module docstring)."""
    by_mode: dict[str, list[ProfileRow]] = {}
    for r in profile.rows:  # sorted by width already (read_profile; the sweep writes them so)
        if r.status == "ok":
            by_mode.setdefault(r.mode, []).append(r)
    found = [o for mode, rows in by_mode.items()
             for column in COLUMNS for o in _judged(sorted(rows, key=lambda r: r.num_tokens), mode, column)]
    return sorted(found, key=lambda o: (o.num_tokens, o.mode, o.column))


def without_outliers(profile: Profile, outliers: list[Outlier]) -> Profile:
    """The profile with every flagged row dropped: its width is then interpolated over, as an unmeasured one is."""
    flagged = {(o.num_tokens, o.mode) for o in outliers}
    return replace(profile, rows=[r for r in profile.rows if (r.num_tokens, r.mode) not in flagged])
