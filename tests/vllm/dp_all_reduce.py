"""The DP all-reduce stood in for, for the oracles that run vLLM's own data-parallel agreement on CPU (0.33's and
0.34's; it imports nothing of vLLM's): every rank's step is run once to read the column of the tensor it contributes,
then again with every rank's column in the tensor, which is what the sum of the ranks' one-column tensors is."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["agree_ranks", "agree_v2"]

T = TypeVar("T")
Reduce = Callable[[Any], None]


class _Collected(Exception):
    """The stand-in all-reduce has read one rank's column."""


def agree_ranks(ranks: int, call: Callable[[int], T], install: Callable[[Reduce], None]) -> list[T]:
    """What each of `ranks` ranks gets from `call(rank)` (vLLM's own code, which all-reduces through whatever
    `install(reduce)` put in place of the DP group's all-reduce: `reduce(tensor)` reduces in place)."""
    if ranks == 1:
        return [call(0)]
    columns: dict[int, Any] = {}
    for rank in range(ranks):
        def collect(tensor: Any, rank: int = rank) -> None:
            columns[rank] = tensor[:, rank].clone()
            raise _Collected
        install(collect)
        try:
            call(rank)
        except _Collected:
            pass

    def answer(tensor: Any) -> None:
        for rank, column in columns.items():
            tensor[:, rank] = column

    install(answer)
    return [call(rank) for rank in range(ranks)]


def agree_v2(dp: Any, ranks: int, call: Callable[[int], T]) -> list[T]:
    """`agree_ranks` through the V2 runner's dp_utils module `dp` (v1/worker/gpu/dp_utils.py, 0.33's and 0.34's): its
    DP group's `cpu_all_reduce_` stood in for, restored after."""
    saved = dp.get_dp_group
    try:
        return agree_ranks(ranks, call, lambda reduce: setattr(
            dp, "get_dp_group", lambda: types.SimpleNamespace(cpu_all_reduce_=reduce)))
    finally:
        dp.get_dp_group = saved
