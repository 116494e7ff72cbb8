"""Device memory readings (torch's allocator, cudaMemGetInfo and NVML) and device metadata, each guarded
so that a CPU-only machine imports and runs this module and simply reads nothing."""

from __future__ import annotations

import platform
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "MemorySnapshot",
    "cpu_name",
    "device_metadata",
    "free_delta_bytes",
    "non_kv_memory",
    "nvml_delta_bytes",
    "snapshot",
]


@dataclass(frozen=True)
class MemorySnapshot:
    """Memory of one CUDA device at one moment; every field None on a CPU."""

    free_bytes: int | None = None
    """Free device memory (cudaMemGetInfo): what a capture's new allocations and graph objects come out of."""
    total_bytes: int | None = None
    """Device memory in all."""
    nvml_used_bytes: int | None = None
    """Used device memory as NVML (the driver) counts it, all processes; None without NVML."""
    allocated_bytes: int | None = None
    """Bytes in live tensors (torch caching allocator)."""
    reserved_bytes: int | None = None
    """Bytes the caching allocator holds from the driver."""


_NVML: Any = None  # the initialised pynvml module, False when unavailable


def _nvml() -> Any:
    global _NVML
    if _NVML is None:
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            _NVML = pynvml
        except Exception:  # no library, no driver, or no permission: NVML readings stay None
            _NVML = False
    return _NVML or None


def _nvml_handle(device: torch.device) -> Any:
    """NVML's handle for a torch CUDA device, matched by UUID because CUDA_VISIBLE_DEVICES renumbers."""
    nvml = _nvml()
    if nvml is None:
        return None
    try:
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        return nvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    except Exception:
        try:
            return nvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        except Exception:
            return None


def snapshot(device: torch.device | str) -> MemorySnapshot:
    """Read the device's memory now (after a synchronize, so pending frees and captures have landed)."""
    device = torch.device(device)
    if device.type != "cuda":
        return MemorySnapshot()
    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    used = None
    handle = _nvml_handle(device)
    if handle is not None:
        try:
            used = int(_nvml().nvmlDeviceGetMemoryInfo(handle).used)
        except Exception:
            used = None
    return MemorySnapshot(
        free_bytes=int(free), total_bytes=int(total), nvml_used_bytes=used,
        allocated_bytes=int(torch.cuda.memory_allocated(device)),
        reserved_bytes=int(torch.cuda.memory_reserved(device)),
    )


def free_delta_bytes(before: MemorySnapshot, after: MemorySnapshot) -> int | None:
    """Device memory taken between two snapshots; None when unknown or negative (a negative reading means
    something else freed memory meanwhile, as in vLLM issue 25779: invalid, not a number to keep)."""
    if before.free_bytes is None or after.free_bytes is None:
        return None
    delta = before.free_bytes - after.free_bytes
    return delta if delta >= 0 else None


def nvml_delta_bytes(before: MemorySnapshot, after: MemorySnapshot) -> int | None:
    """Same as free_delta_bytes, read through NVML."""
    if before.nvml_used_bytes is None or after.nvml_used_bytes is None:
        return None
    delta = after.nvml_used_bytes - before.nvml_used_bytes
    return delta if delta >= 0 else None


def non_kv_memory(
    baseline: MemorySnapshot,
    after: MemorySnapshot,
    *,
    kv_cache_bytes: int | None,
    peak_allocated_bytes: int | None,
    allocated_after_bytes: int | None,
    weights_bytes: int,
    persistent_buffers_bytes: int,
) -> dict[str, Any] | None:
    """vLLM's non-KV memory as its `memory_profiling` reads it (vllm/utils/mem_utils.py, facts file "Memory
    accounting"): `total_consumed` (the drop in free device memory from `baseline`, taken once CUDA is up and before
    the weights exist, to `after`, taken after the profiling step with the allocator's cache emptied) plus
    `transient_peak_headroom` (torch's peak allocated bytes during that step minus its allocated bytes after it).

    `kv_cache_bytes`, the drop the decoder's static KV cache took when it was allocated in between, is subtracted:
    vLLM allocates its KV cache only after profiling. The breakdown splits the consumed memory into weights and
    persistent buffers (exact tensor bytes), the rest torch's allocator holds (workspaces, rounding, leftovers;
    from its reserved bytes) and non-torch memory (CUDA modules and library handles: what the allocator does not
    see). None when a reading is missing (a CPU) or the consumed memory reads negative (something else freed
    memory meanwhile: invalid, as in `free_delta_bytes`)."""
    readings = (baseline.free_bytes, after.free_bytes, kv_cache_bytes, peak_allocated_bytes, allocated_after_bytes)
    if any(r is None for r in readings):
        return None
    consumed = baseline.free_bytes - after.free_bytes - kv_cache_bytes
    if consumed < 0:
        return None
    headroom = max(0, peak_allocated_bytes - allocated_after_bytes)
    breakdown: dict[str, Any] = {
        "non_kv_cache_bytes": consumed + headroom,
        "total_consumed_bytes": consumed,
        "peak_headroom_bytes": headroom,
        "weights_bytes": weights_bytes,
        "persistent_buffers_bytes": persistent_buffers_bytes,
        "torch_other_bytes": None,
        "non_torch_bytes": None,
        "kv_cache_excluded_bytes": kv_cache_bytes,
    }
    if baseline.reserved_bytes is not None and after.reserved_bytes is not None:
        # The KV cache was allocated right after the allocator's cache was emptied, in segments of its own: its
        # free-memory drop is what the allocator reserved for it.
        torch_held = after.reserved_bytes - baseline.reserved_bytes - kv_cache_bytes
        breakdown["torch_other_bytes"] = torch_held - weights_bytes - persistent_buffers_bytes
        breakdown["non_torch_bytes"] = consumed - torch_held
    return breakdown


def cpu_name() -> str:
    """The CPU model as /proc/cpuinfo names it (platform's guess elsewhere)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def device_metadata(device: torch.device | str) -> dict[str, Any]:
    """device_name, compute_capability ("9.0"), total_memory_bytes, torch/CUDA/driver versions."""
    device = torch.device(device)
    meta: dict[str, Any] = {
        "device": str(device),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "driver_version": None,
    }
    if device.type != "cuda":
        return {**meta, "device_name": cpu_name(), "compute_capability": None, "total_memory_bytes": None}
    props = torch.cuda.get_device_properties(device)
    meta.update(
        device="cuda:%d" % (device.index if device.index is not None else torch.cuda.current_device()),
        device_name=props.name,
        compute_capability=f"{props.major}.{props.minor}",
        total_memory_bytes=int(props.total_memory),
    )
    nvml = _nvml()
    if nvml is not None:
        try:
            version = nvml.nvmlSystemGetDriverVersion()
            meta["driver_version"] = version.decode() if isinstance(version, bytes) else str(version)
        except Exception:
            pass
    return meta
