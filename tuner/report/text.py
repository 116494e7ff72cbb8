"""How a run's report writes numbers, whatever the engine: the memory unit of the report (GiB or MiB), a memory
figure in it, a change in MiB, and a list cut to a readable length."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tuner.model.costmodel import CostModel

__all__ = ["GIB", "MIB", "memory_unit", "mem_text", "mib_text", "num_text", "sizes_text"]

GIB = 1 << 30
MIB = 1 << 20


def memory_unit(model: CostModel) -> tuple[int, str]:
    """The memory unit of a report: GiB on a device of 8 GiB or more, else MiB (a hand-made profile's figures)."""
    return (GIB, "GiB") if model.budget.total_memory_bytes >= 8 * GIB else (MIB, "MiB")


def num_text(model: CostModel, x: float) -> str:
    """A memory figure in the report's unit, without the unit (a table cell)."""
    return f"{x / memory_unit(model)[0]:.3f}"


def mem_text(model: CostModel, x: float) -> str:
    """A memory figure in the report's unit, with it."""
    return f"{num_text(model, x)} {memory_unit(model)[1]}"


def mib_text(x: float) -> str:
    """A signed change in MiB."""
    return f"{x / MIB:+.2f}"


def sizes_text(sizes: Sequence[int], limit: int = 24) -> str:
    """`1, 2, 4, ... (51 sizes)`: a list cut after `limit` sizes; `(none)` for an empty one."""
    if not sizes:
        return "(none)"
    text = ", ".join(map(str, sizes[:limit]))
    return text + (f", ... ({len(sizes)} sizes)" if len(sizes) > limit else "")
