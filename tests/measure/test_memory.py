"""Memory readings and device metadata on a CPU-only machine: nothing is read, nothing crashes."""

from __future__ import annotations

import torch

from tuner.measure.memory import MemorySnapshot, cpu_name, device_metadata, free_delta_bytes, nvml_delta_bytes
from tuner.measure.memory import snapshot


def test_cpu_snapshot_reads_nothing() -> None:
    assert snapshot("cpu") == MemorySnapshot()
    assert free_delta_bytes(MemorySnapshot(), MemorySnapshot()) is None


def test_deltas_are_what_was_taken_and_negative_readings_are_invalid() -> None:
    before = MemorySnapshot(free_bytes=1000, nvml_used_bytes=500)
    after = MemorySnapshot(free_bytes=600, nvml_used_bytes=900)
    assert free_delta_bytes(before, after) == 400
    assert nvml_delta_bytes(before, after) == 400
    # Free memory that grew across a capture means something else freed memory: not a graph's size.
    assert free_delta_bytes(after, before) is None
    assert nvml_delta_bytes(after, before) is None


def test_cpu_metadata_names_the_cpu_and_leaves_gpu_fields_empty() -> None:
    meta = device_metadata("cpu")
    assert meta["device"] == "cpu" and meta["device_name"] == cpu_name() and meta["device_name"]
    assert meta["compute_capability"] is None and meta["total_memory_bytes"] is None
    assert meta["torch_version"] == torch.__version__
