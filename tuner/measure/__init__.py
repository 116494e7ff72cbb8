"""Everything that touches a device: the decode model (and the drafter's), timing, memory readings, graph capture,
the sweep."""

from tuner.measure.decoder import DTYPES, DecodeModel, ShardShape, attention_kernel, build_model
from tuner.measure.drafter import DRAFTER_NOTE, DrafterPlan, build_drafter, drafter_plan, pool_sequence
from tuner.measure.graphs import CapturedGraph, capture, is_oom, new_pool, release_memory, weak_ref
from tuner.measure.kernels import count_cpu_ops, count_cuda_kernels, cuda_kernels_per_layer
from tuner.measure.memory import (
    MemorySnapshot,
    device_metadata,
    free_delta_bytes,
    non_kv_memory,
    nvml_delta_bytes,
    snapshot,
)
from tuner.measure.piecewise import Piece, PiecewiseGraph, capture_piece, capture_piecewise
from tuner.measure.profile import (
    CAPTURE_ORDER,
    PIECEWISE_NOTE,
    SWEEP_MODES,
    ProfileResult,
    StepRunner,
    SweepOptions,
    candidate_widths,
    estimate_sweep_s,
    profile_workload,
    thin_widths,
    validate_sizes,
)
from tuner.measure.timing import Clock, CudaEventClock, FakeClock, Measurement, WallClock, measure

__all__ = [
    "CAPTURE_ORDER",
    "DRAFTER_NOTE",
    "DTYPES",
    "PIECEWISE_NOTE",
    "CapturedGraph",
    "Clock",
    "CudaEventClock",
    "DecodeModel",
    "DrafterPlan",
    "FakeClock",
    "Measurement",
    "MemorySnapshot",
    "Piece",
    "PiecewiseGraph",
    "ProfileResult",
    "SWEEP_MODES",
    "ShardShape",
    "StepRunner",
    "SweepOptions",
    "WallClock",
    "attention_kernel",
    "build_drafter",
    "build_model",
    "candidate_widths",
    "capture",
    "capture_piece",
    "capture_piecewise",
    "count_cpu_ops",
    "count_cuda_kernels",
    "cuda_kernels_per_layer",
    "device_metadata",
    "drafter_plan",
    "estimate_sweep_s",
    "free_delta_bytes",
    "is_oom",
    "measure",
    "new_pool",
    "non_kv_memory",
    "nvml_delta_bytes",
    "pool_sequence",
    "profile_workload",
    "release_memory",
    "snapshot",
    "thin_widths",
    "validate_sizes",
    "weak_ref",
]
