"""The only place that knows vLLM's rules: default capture grid, runtime dispatch, config emission."""

from tuner.engines.vllm.defaults import (
    CUDAGRAPH_MODES,
    PERFORMANCE_MODES,
    CaptureDefaults,
    capture_ceiling,
    default_capture_sizes,
    uniform_decode_tiers,
)
from tuner.engines.vllm.dispatch import Dispatch, Dispatcher, full_decode_sizes

__all__ = [
    "CUDAGRAPH_MODES",
    "PERFORMANCE_MODES",
    "CaptureDefaults",
    "Dispatch",
    "Dispatcher",
    "capture_ceiling",
    "default_capture_sizes",
    "full_decode_sizes",
    "uniform_decode_tiers",
]
