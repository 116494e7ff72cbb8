"""A measured quantity over widths: linear between measured widths, flat below the first, along the last slope
above the last; the shape every latency and memory column of a profile is read through."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["Curve", "memory_curve"]


class Curve:
    """A measured quantity over widths, interpolated linearly between measured widths, flat below the first
    and extended along the last segment's slope above the last (monotone when asked)."""

    def __init__(self, points: dict[int, float], *, monotone: bool) -> None:
        xs = sorted(points)
        ys = np.array([points[x] for x in xs], dtype=float)
        if monotone:
            # Noise can make a wider step read faster; a wider step never does less work, so take the running max.
            ys = np.maximum.accumulate(ys)
        self.x = np.array(xs, dtype=float)
        self.y = ys
        self.slope = max(0.0, (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])) if len(xs) > 1 else 0.0

    def __call__(self, widths: np.ndarray | Sequence[int] | int) -> np.ndarray:
        w = np.asarray(widths, dtype=float)
        out = np.interp(w, self.x, self.y)
        above = w > self.x[-1]
        if np.any(above):
            out = np.where(above, self.y[-1] + self.slope * (w - self.x[-1]), out)
        return out

    @property
    def max_width(self) -> int:
        return int(self.x[-1])


def memory_curve(rows: dict, column: str) -> Curve | None:
    """A memory column over widths, its empty cells (an unreadable or negative free-memory drop) skipped."""
    points = {w: float(getattr(r, column)) for w, r in rows.items() if getattr(r, column) is not None}
    return Curve(points, monotone=column == "standalone_bytes") if points else None
