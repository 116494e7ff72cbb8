"""CUDA-graph capture and replay helpers shared by the profile sweep and the validation stage."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from unittest.mock import patch

import torch

__all__ = ["CapturedGraph", "capture", "is_oom", "new_pool", "release_memory", "weak_ref"]


@dataclass
class CapturedGraph:
    """A captured graph with what it needs to be replayed (the pool is kept so it outlives the capture)."""

    graph: torch.cuda.CUDAGraph
    """The captured graph; `replay()` reruns the captured kernels on the same buffers."""
    num_tokens: int
    """Width the graph was captured at."""
    pool: Any
    """Memory-pool handle the graph allocated from (shared by graphs captured with the same handle)."""
    capture_s: float
    """Wall seconds the capture took (begin to end, synchronized)."""
    output: Any = None
    """What the captured callable returned (tensors in the pool or in static buffers), for callers that hand it
    on; None once they have."""

    def replay(self) -> None:
        self.graph.replay()


def new_pool() -> Any:
    """A fresh graph memory pool handle; graphs captured with one handle share (and reuse) its memory."""
    return torch.cuda.graph_pool_handle()


def capture(fn: Callable[[], object], num_tokens: int, *, pool: Any = None) -> CapturedGraph:
    """Capture `fn` (already run eagerly once, so lazy initialisation and autotuning happened outside the
    capture, as vLLM warms up each size first) into a CUDA graph allocating from `pool`."""
    graph = torch.cuda.CUDAGraph()
    if pool is None:
        pool = new_pool()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    # torch.cuda.graph() runs gc.collect() and empty_cache() on entry; vLLM patches both out while it
    # captures (a full collection per graph adds up over hundreds of graphs), and so do we: callers release
    # memory themselves beforehand.
    with patch("gc.collect", lambda *a, **k: 0), patch("torch.cuda.empty_cache", lambda: None):
        with torch.cuda.graph(graph, pool=pool):
            output = fn()
    torch.cuda.synchronize()
    return CapturedGraph(graph=graph, num_tokens=num_tokens, pool=pool, capture_s=time.perf_counter() - t0,
                         output=output)


def weak_ref(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor on the same memory that does not own it (vLLM's `weak_ref_tensors`): a graph's output kept this
    way stays readable at replay while the pool may hand its memory to graphs captured later, as vLLM lets its
    piecewise graphs share memory. Valid only while the graph (and its pool) lives."""
    storage = tensor.untyped_storage()
    alias = torch._C._construct_storage_from_data_pointer(storage.data_ptr(), tensor.device, storage.nbytes())
    return torch.empty(0, dtype=tensor.dtype, device=tensor.device).set_(
        alias, tensor.storage_offset(), tensor.size(), tensor.stride())


def is_oom(exc: BaseException) -> bool:
    """True for the allocator's OutOfMemoryError and for driver-level out-of-memory errors (graph
    instantiation can fail with a plain RuntimeError "CUDA error: out of memory"), also when the error
    surfaced while cleaning up after one (ending a capture that an allocation failure invalidated)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, torch.cuda.OutOfMemoryError):
            return True
        if isinstance(current, RuntimeError) and "out of memory" in str(current).lower():
            return True
        current = current.__cause__ or current.__context__
    return False


def release_memory(device: torch.device | str | None = None, *, collect: bool = False) -> None:
    """Give cached blocks back to the driver, so the next free-memory reading sees only what live graphs and
    tensors hold; `collect` also runs gc first (after an error, when frames may still hold tensors)."""
    if not torch.cuda.is_available() or (device is not None and torch.device(device).type != "cuda"):
        return  # nothing is read from a CPU's memory
    if collect:  # a full collection is slow with torch loaded: only where an error's frames may hold memory
        gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
