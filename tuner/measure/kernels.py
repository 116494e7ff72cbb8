"""Counting what one decode step launches: CUDA kernels (torch.profiler on a GPU) and aten ops that do work
(on a CPU, for the lean-decoder benchmark), so the eager step's launch count can be held against vLLM's."""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import torch

__all__ = ["NO_WORK_OPS", "count_cpu_ops", "count_cuda_kernels", "cuda_kernels_per_layer"]

log = logging.getLogger(__name__)

NO_WORK_OPS = frozenset({
    "empty", "empty_strided", "empty_like", "resolve_conj", "resolve_neg", "result_type", "to", "lift_fresh",
    "detach", "alias", "set_",
})
"""aten ops that allocate or relabel a tensor without running a kernel of their own."""

_VIEWS: dict[str, bool] = {}


def _is_view(op: str) -> bool:
    """Whether `aten::op` returns an alias (a tensor overload's schema says so: `slice.Tensor` is a view, the list
    overload `slice.t` is not, and the profiler names neither), cached."""
    if op not in _VIEWS:
        packet = getattr(torch.ops.aten, op, None)
        try:
            overloads = [getattr(packet, o) for o in packet.overloads()] if packet is not None else []
        except Exception:  # an op the registry cannot describe: treat it as work, so nothing is hidden
            overloads = []
        _VIEWS[op] = any(o.is_view for o in overloads)
    return _VIEWS[op]


def _works(event: Any) -> bool:
    """An aten event that runs a kernel itself or through a callee (a `reshape` that copies counts, one that
    only views does not)."""
    op = event.name.split("::", 1)[1]
    if op not in NO_WORK_OPS and not _is_view(op):
        return True
    return any(_works(c) for c in event.cpu_children if c.name.startswith("aten::"))


def _has_aten_ancestor(event: Any) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            return True
        parent = parent.cpu_parent
    return False


def count_cpu_ops(events: Iterable[Any], *, by_name: Counter | None = None) -> int:
    """Ops a CPU profile (torch.profiler, CPU activity) shows one step dispatching: each outermost aten op that
    does work counts once (`linear` is one op, not its `t` + `mm`; views and bare allocations count zero), and
    each Inductor-generated kernel counts once (profiled when `torch._inductor.config.cpp.enable_kernel_profile`
    was set before compiling). Ops inside an opaque custom op (the compiled step's attention) count too: their
    parent is not an aten op. `by_name`, if given, is filled with the count per op name."""
    total = 0
    for e in events:
        name = e.name
        if name.startswith("aten::"):
            counted = not _has_aten_ancestor(e) and _works(e)
        else:
            counted = "cpp_fused" in name or name.startswith("triton_")
        if counted:
            total += 1
            if by_name is not None:  # Inductor prefixes kernels with their graph's number: drop it to compare runs
                by_name[re.sub(r"^graph_\d+_", "", name)] += 1
    return total


def count_cuda_kernels(events: Iterable[Any]) -> int:
    """Kernels on the device in a CUDA profile: device-side events, memory copies and memsets excluded."""
    from torch.autograd import DeviceType

    return sum(1 for e in events if getattr(e, "device_type", None) == DeviceType.CUDA
               and not e.name.startswith(("Memcpy", "Memset")))


def cuda_kernels_per_layer(step: Callable[[], object], num_layers: int, device: torch.device | str
                           ) -> dict[str, Any] | None:
    """Kernels one (already warmed) `step` launches, per decoder layer: the step's device kernels over
    `num_layers`, so the few kernels outside the layers (embedding, final norm, output copy) are spread over
    them (+0.1 per layer for a 32-layer model). None off CUDA, or when the profiler cannot see the device
    (no CUPTI): this count is a label beside the timings, not a measurement the sweep depends on."""
    device = torch.device(device)
    if device.type != "cuda" or num_layers < 1:
        return None
    from torch.profiler import ProfilerActivity, profile

    try:
        torch.cuda.synchronize(device)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize(device)
        kernels = count_cuda_kernels(prof.events())
    except RuntimeError as exc:
        log.warning("could not count the eager step's CUDA kernels: %s", exc)
        return None
    if kernels == 0:  # the profiler saw no device activity: an unusable reading, not a zero-kernel step
        log.warning("torch.profiler saw no CUDA kernels in the eager step; eager_kernels_per_layer left empty")
        return None
    return {"per_layer": round(kernels / num_layers, 2), "per_step": kernels, "num_layers": num_layers}
