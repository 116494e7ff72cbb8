"""Device memory readings (torch's allocator, cudaMemGetInfo and NVML) and device metadata, each guarded
so that a CPU-only machine imports and runs this module and simply reads nothing."""

from __future__ import annotations

import platform
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["MemorySnapshot", "cpu_name", "device_metadata", "free_delta_bytes", "nvml_delta_bytes", "snapshot"]


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
