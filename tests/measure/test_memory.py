"""Memory readings and device metadata on a CPU-only machine (nothing is read, nothing crashes), and vLLM's non-KV
memory computed from hand-made snapshots."""

from __future__ import annotations

import torch

from tuner.measure.memory import MemorySnapshot, cpu_name, device_metadata, free_delta_bytes, non_kv_memory
from tuner.measure.memory import nvml_delta_bytes, snapshot


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


def test_non_kv_memory_is_consumed_without_kv_plus_peak_headroom() -> None:
    """Hand-made readings (MiB-sized round numbers, not measurements): 16 GiB free before the weights, 1 GiB of KV
    cache allocated in between, 9 GiB free after the profiling step, whose peak sat 3 GiB above what it left."""
    gib = 2**30
    before = MemorySnapshot(free_bytes=16 * gib, reserved_bytes=0)
    after = MemorySnapshot(free_bytes=9 * gib, reserved_bytes=7 * gib)  # torch holds 6 GiB besides the KV cache
    out = non_kv_memory(before, after, kv_cache_bytes=1 * gib, peak_allocated_bytes=10 * gib,
                        allocated_after_bytes=7 * gib, weights_bytes=5 * gib, persistent_buffers_bytes=gib // 2)
    assert out["total_consumed_bytes"] == 6 * gib  # 16 - 9 - 1 (the KV cache is not non-KV memory)
    assert out["peak_headroom_bytes"] == 3 * gib
    assert out["non_kv_cache_bytes"] == 9 * gib
    assert out["torch_other_bytes"] == gib // 2  # 6 GiB held by torch - 5 weights - 0.5 buffers
    assert out["non_torch_bytes"] == 0
    # A peak below what is left allocated adds no headroom; missing readings (a CPU) give nothing.
    assert non_kv_memory(before, after, kv_cache_bytes=gib, peak_allocated_bytes=gib, allocated_after_bytes=2 * gib,
                         weights_bytes=0, persistent_buffers_bytes=0)["peak_headroom_bytes"] == 0
    assert non_kv_memory(MemorySnapshot(), MemorySnapshot(), kv_cache_bytes=None, peak_allocated_bytes=None,
                         allocated_after_bytes=None, weights_bytes=0, persistent_buffers_bytes=0) is None
    # Free memory that grew (something else freed memory meanwhile) is an invalid reading, not a negative size.
    assert non_kv_memory(after, before, kv_cache_bytes=0, peak_allocated_bytes=0, allocated_after_bytes=0,
                         weights_bytes=0, persistent_buffers_bytes=0) is None
