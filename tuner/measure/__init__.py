"""Everything that touches a device: the decode model, timing, memory readings, graph capture, the sweep."""

from tuner.measure.decoder import DTYPES, DecodeModel, ShardShape, attention_kernel
from tuner.measure.graphs import CapturedGraph, capture, is_oom, new_pool, release_memory
from tuner.measure.memory import MemorySnapshot, device_metadata, free_delta_bytes, nvml_delta_bytes, snapshot
from tuner.measure.profile import (
    PIECEWISE_NOTE,
    ProfileResult,
    StepRunner,
    SweepOptions,
    build_model,
    candidate_widths,
    profile_workload,
    thin_widths,
    validate_sizes,
)
from tuner.measure.timing import Clock, CudaEventClock, FakeClock, Measurement, WallClock, measure

__all__ = [
    "DTYPES",
    "PIECEWISE_NOTE",
    "CapturedGraph",
    "Clock",
    "CudaEventClock",
    "DecodeModel",
    "FakeClock",
    "Measurement",
    "MemorySnapshot",
    "ProfileResult",
    "ShardShape",
    "StepRunner",
    "SweepOptions",
    "WallClock",
    "attention_kernel",
    "build_model",
    "candidate_widths",
    "capture",
    "device_metadata",
    "free_delta_bytes",
    "is_oom",
    "measure",
    "new_pool",
    "nvml_delta_bytes",
    "profile_workload",
    "release_memory",
    "snapshot",
    "thin_widths",
    "validate_sizes",
]
