"""vLLM's data-parallel step agreement: every DP rank dispatches its own step, the ranks all-reduce what they chose, and
each runs the agreed shape. Read from vLLM 0.34.0's `dispatch_cg_and_sync_dp` / `sync_cudagraph_and_dp_padding`
(v1/worker/gpu/dp_utils.py; 0.33's V2 runner has the same code) and 0.33's V1 `coordinate_batch_across_dp`
(v1/worker/dp_utils.py) with `GPUModelRunner._determine_batch_execution_and_padding` (gpu_model_runner.py):

- If any rank's own dispatch ran eager, every rank runs eager (the agreed mode is the minimum, NONE being 0), unpadded:
  V2 at the rank's own tokens; V1 at its own padded width (its own graph's width where it had one, else its tokens).
- Otherwise the ranks pad to the widest rank's tokens, uniform only where every rank is uniform at the same query
  length, and each dispatches that agreed step (V2: `CudaGraphManager.dispatch` at the agreed tokens and query length;
  V1: the mode agreed, at the widest padded width). V2 can still find no graph for the agreed step (a decode graph
  wider than every prefill graph, met with a mixed step on another rank): then every rank runs eager at the agreed
  width.

Whether any rank's own dispatch is eager needs only each kind of step's widest rank: within one uniform query length
(or among mixed steps) a narrower step never lacks a graph a wider one has. A joint draw of the ranks' steps is
summarised that way (`tuner.steps.agree`), which the cost model dispatches in bulk (`dispatch_ranks`); `synced_dispatch`
takes every rank's step, for the cross-checks against vLLM's own code."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tuner.steps import agree

__all__ = ["dispatch_ranks", "synced_dispatch"]


def dispatch_ranks(d: object, widths: np.ndarray, utc: np.ndarray, own_tokens: np.ndarray, own_utc: np.ndarray,
                   widest_utc: np.ndarray, widest_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The agreed dispatch of many joint draws under dispatcher `d` (its `dispatch_steps` and `runner`): (mode, padded
    width (0: eager), the width an eager step runs at). `widths`, `utc`: the agreed step; `own_*`: this rank's own;
    `widest_*`: (draws, kinds) arrays of each kind of step's widest rank (width 0: padding, no such kind)."""
    modes, padded, _ = d.dispatch_steps(widths, utc)  # type: ignore[attr-defined]
    any_eager = np.zeros(len(widths), dtype=bool)
    for k in range(widest_tokens.shape[1] if widest_tokens.ndim == 2 else 0):
        present = widest_tokens[:, k] > 0
        if np.any(present):
            kind_modes = d.dispatch_steps(np.maximum(widest_tokens[:, k], 1), widest_utc[:, k])[0]  # type: ignore
            any_eager |= present & (kind_modes == "NONE")
    eager_width = widths.copy()
    if getattr(d, "runner", "v2") == "v1":
        own_padded = d.dispatch_steps(own_tokens, own_utc)[1]  # type: ignore[attr-defined]
        own_eager = np.where(own_padded > 0, own_padded, own_tokens)
    else:
        own_eager = own_tokens
    eager_width = np.where(any_eager, own_eager, eager_width)
    modes = np.where(any_eager, "NONE", modes).astype(object)
    padded = np.where(any_eager, 0, padded)
    return modes, padded, eager_width


def synced_dispatch(d: object, steps: Sequence[tuple[int, int]], own: int = 0) -> tuple[str, int]:
    """What rank `own` runs of the ranks' `(width, uniform token count)` steps under dispatcher `d`: (mode, width: the
    graph's padded width, or the width it runs eagerly at)."""
    width, utc, s = agree(steps, own)
    kinds = len(s.widest)
    modes, padded, eager = dispatch_ranks(
        d, np.array([width]), np.array([utc]), np.array([s.own_tokens]), np.array([s.own_utc]),
        np.array([[u for u, _ in s.widest]]).reshape(1, kinds), np.array([[w for _, w in s.widest]]).reshape(1, kinds))
    return str(modes[0]), int(padded[0] if modes[0] != "NONE" else eager[0])
