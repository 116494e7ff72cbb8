"""The cost model: a list's expected step latency under the workload's step distribution, its real graph pool,
the engine's estimate and the KV cache left (`costmodel`), what runs without a graph under a list (`eager_share`) and
a list's capture time (`capture_time`). Reads a profile and a workload; imports profile, engines and workload."""

from __future__ import annotations

from tuner.face import lazy_face

_FACE = {
    "CostModel": "costmodel", "Evaluation": "costmodel", "MODEL_SETTINGS": "costmodel", "ModelError": "costmodel",
    "crossover_width": "costmodel",
    "EagerShare": "eager_share", "drafter_eager_passes": "eager_share", "uniform_decode_steps": "eager_share",
    "predicted_capture_s": "capture_time",
}
"""Each public name -> the submodule that defines it (imported when the name is first used)."""

__all__ = sorted(_FACE)
__getattr__ = lazy_face(__name__, _FACE)
