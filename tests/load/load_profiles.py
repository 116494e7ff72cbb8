"""Hand-made profiles the load tests share (test fixtures, never measurements): a tiny one whose steps can be timed by
hand, a speculative one (q = 3), and the cliff's, whose eager steps cost 4x the graph's per token (and 2 ms more to
launch), so that a list too short for the wide steps has a second, eager operating point."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ helpers (import-mode=importlib)
from handmade_profiles import handmade_profile, handmade_workload  # noqa: E402

from tuner.model.costmodel import CostModel  # noqa: E402

__all__ = ["CLIFF_COVER", "CLIFF_SHORT", "cliff_eager", "cliff_graph", "cliff_model", "eager_hand", "full_hand",
           "hand_model", "spec_model"]


def eager_hand(w: int) -> float:
    """The hand model's eager step: 1 ms plus 0.5 ms a token (every width 1..16 measured, so exact)."""
    return 1.0 + 0.5 * w


def full_hand(w: int) -> float:
    """The hand model's FULL graph step: 0.5 ms plus 0.1 ms a token."""
    return 0.5 + 0.1 * w


def cliff_eager(w: int) -> float:
    """The cliff profile's eager step: 2 ms of launches plus 0.04 ms a token (4x the graph's per token)."""
    return 2.0 + 0.04 * w


def cliff_graph(w: int) -> float:
    """The cliff profile's graph step (FULL and PIECEWISE alike): 0.5 ms plus 0.01 ms a token."""
    return 0.5 + 0.01 * w


CLIFF_SHORT = (1, 2, 4, 8, 16, 24, 32)
"""A list whose largest graph (32) is below the widths a busy server steps at (64 seats + prefill chunks)."""
CLIFF_COVER = tuple(range(8, 257, 8))
"""A list whose graphs cover every width up to the token budget (256)."""


def hand_model(out: Path) -> CostModel:
    """max_num_seqs 2, max_num_batched_tokens 8, q = 1; eager and FULL rows at every width 1..16."""
    wl = handmade_workload(max_num_seqs=2, max_num_batched_tokens=8)
    return CostModel.from_files(handmade_profile(out, wl, list(range(1, 17)), eager_ms=eager_hand,
                                                 full_ms=full_hand), wl)


def spec_model(out: Path) -> CostModel:
    """max_num_seqs 4, max_num_batched_tokens 8, q = 3 (two speculative tokens, no draft model)."""
    wl = handmade_workload(max_num_seqs=4, max_num_batched_tokens=8, num_speculative_tokens=2,
                           traffic={"requests": {"kind": "uniform", "min": 1, "max": 2}})
    return CostModel.from_files(handmade_profile(out, wl, list(range(1, 17)), eager_ms=eager_hand,
                                                 full_ms=full_hand), wl)


def cliff_model(out: Path) -> CostModel:
    """max_num_seqs 64, max_num_batched_tokens 256, q = 1; eager `cliff_eager`, graphs `cliff_graph` (FULL and
    PIECEWISE) at every width 1..256."""
    wl = handmade_workload(max_num_seqs=64, max_num_batched_tokens=256)
    return CostModel.from_files(handmade_profile(out, wl, list(range(1, 257)), eager_ms=cliff_eager,
                                                 full_ms=cliff_graph, piecewise_ms=cliff_graph), wl)
