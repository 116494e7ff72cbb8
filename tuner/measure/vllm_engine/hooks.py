"""What cgtune adds to vLLM's worker to measure it, and nothing that decides a number: a free-memory reading around each
graph vLLM captures (per batch descriptor, in vLLM's own order and pool, the drafter's graphs told from the target's)
and a dispatch that runs a timed step in the mode asked for. The worker imports this module when vLLM resolves
`worker_extension_cls`, so the capture hooks are in place in every worker (each tensor-parallel rank's process too)
before it captures."""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["CAPTURES", "CAPTURE_TOTALS", "CgtuneWorkerExtension", "capture_reading", "forced_dispatch",
           "install_capture_hooks", "uninstall_capture_hooks", "wrap_capture_model", "wrap_v1_capture", "wrap_v1_drafter_capture",
           "wrap_v2_capture"]

CAPTURES: list[dict[str, Any]] = []
"""This process's captures in vLLM's order: {mode, num_tokens, uniform, num_reqs, free_delta_bytes, owner} (owner
`target` or `drafter`; V2's also `manager_id`, the id of the `CudaGraphManager` that captured it, and its
`decode_query_len`); a V1 target capture that held a drafter capture reads without it (`nested_bytes`)."""
CAPTURE_TOTALS: list[int] = []
"""What each real `capture_model()` of this process returned: the pool vLLM's own capture measured (the figure its
"Graph capturing finished ... took X GiB" line rounds), last one last."""


def _free_bytes() -> int | None:
    import torch

    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    return int(torch.cuda.mem_get_info()[0])


_OPEN: list[list[int]] = []
"""For each capture reading open now (innermost last), the drafter graphs' bytes read inside it: V1 captures the
drafter's PIECEWISE graph inside the target's capture of the same width."""


def capture_reading(mode: str, num_tokens: int, *, uniform: bool, num_reqs: int | None,
                    free_bytes: Callable[[], int | None] = _free_bytes, owner: str = "target"
                    ) -> contextlib.AbstractContextManager[None]:
    """A context that appends one capture's free-memory drop to CAPTURES (None off CUDA), less what captures read
    inside it took (theirs are their own entries)."""

    @contextlib.contextmanager
    def reading() -> Iterator[None]:
        before = free_bytes()
        _OPEN.append([])
        try:
            yield
        finally:
            inner = _OPEN.pop()
        after = free_bytes()
        delta = None if before is None or after is None else before - after
        if _OPEN and delta is not None:
            _OPEN[-1].append(delta)
        nested = sum(inner)
        _record(mode, num_tokens, uniform, num_reqs, None if delta is None else delta - nested, owner=owner,
                nested_bytes=nested if inner else None)

    return reading()


def _record(mode: str, num_tokens: int, uniform: bool, num_reqs: int | None, delta: int | None, *,
            owner: str = "target", **extra: Any) -> None:
    CAPTURES.append({"mode": mode, "num_tokens": int(num_tokens), "uniform": bool(uniform), "num_reqs": num_reqs,
                     "free_delta_bytes": delta, "owner": owner,
                     **{k: v for k, v in extra.items() if v is not None}})


def _delta(before: int | None, after: int | None) -> int | None:
    return None if before is None or after is None else before - after


_SPECULATOR_PACKAGE = "vllm.v1.worker.gpu.spec_decode"
"""V2's speculators and their graph managers live here: a manager from this package captures the drafter's graphs."""


def _manager_owner(manager: Any) -> str:
    return "drafter" if type(manager).__module__.startswith(_SPECULATOR_PACKAGE) else "target"


def _mode_name(mode: Any) -> str:
    return str(getattr(mode, "name", mode)).lower()


def wrap_v2_capture(capture: Callable[..., Any], free_bytes: Callable[[], int | None] = _free_bytes
                    ) -> Callable[..., Any]:
    """V2's `CudaGraphManager.capture(create_forward_fn, ...)`, reading free memory at each batch descriptor: vLLM calls
    `create_forward_fn(desc, warmup=True)` first for every descriptor, so a descriptor's graph memory is the drop from
    that call to the next descriptor's (or the capture's end). Its warm-up runs fall inside, as in vLLM's own
    estimate, which samples around the capture with the warm-up's blocks already cached. A speculator's manager
    (spec_decode's, whose `capture` ends in this one) reads as the drafter's."""

    @functools.wraps(capture)
    def wrapped(self: Any, create_forward_fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        open_: list[Any] = []  # [desc, free before] of the descriptor being captured

        owner = _manager_owner(self)
        query_len = getattr(self, "decode_query_len", None)

        def close() -> None:
            if open_:
                desc, before = open_.pop()
                _record(_mode_name(desc.cg_mode), desc.num_tokens, desc.uniform_token_count is not None,
                        desc.num_reqs, _delta(before, free_bytes()), owner=owner, manager_id=id(self),
                        decode_query_len=query_len if isinstance(query_len, int) else None)

        def create(desc: Any, warmup: bool = False, **kw: Any) -> Any:
            if warmup:
                close()
                open_.append([desc, free_bytes()])
            return create_forward_fn(desc, warmup=warmup, **kw)

        try:
            return capture(self, create, *args, **kwargs)
        finally:
            close()

    return wrapped


def wrap_v1_capture(warmup_and_capture: Callable[..., Any], free_bytes: Callable[[], int | None] = _free_bytes
                    ) -> Callable[..., Any]:
    """V1's `GPUModelRunner._warmup_and_capture(desc, cudagraph_runtime_mode, ...)`, one batch descriptor's warm-ups
    and capture, with its free-memory drop recorded."""

    @functools.wraps(warmup_and_capture)
    def wrapped(self: Any, desc: Any, *args: Any, **kwargs: Any) -> Any:
        mode = kwargs.get("cudagraph_runtime_mode", args[0] if args else None)
        with capture_reading(_mode_name(mode), desc.num_tokens, uniform=bool(getattr(desc, "uniform", False)),
                             num_reqs=getattr(desc, "num_reqs", None), free_bytes=free_bytes):
            return warmup_and_capture(self, desc, *args, **kwargs)

    return wrapped


def wrap_capture_model(capture_model: Callable[..., Any]) -> Callable[..., Any]:
    """A runner's `capture_model(...)`, its returned pool bytes appended to CAPTURE_TOTALS (V2's profiling pass,
    `profile_only=True`, is its estimate, not the pool)."""

    @functools.wraps(capture_model)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = capture_model(self, *args, **kwargs)
        if not kwargs.get("profile_only") and isinstance(out, int):
            CAPTURE_TOTALS.append(out)
        return out

    return wrapped


def wrap_v1_drafter_capture(dummy_run: Callable[..., Any], free_bytes: Callable[[], int | None] = _free_bytes
                            ) -> Callable[..., Any]:
    """V1's drafter pass (`SpecDecodeBaseProposer.dummy_run(num_tokens, use_cudagraphs, is_graph_capturing, ...)`,
    DFlash's override too): where vLLM captures it, inside the target's capture of a PIECEWISE descriptor
    (`_warmup_and_capture`, read by `wrap_v1_capture`), its free-memory drop is recorded as the drafter's PIECEWISE
    graph of that width and left out of the target's. Called outside a target capture (cgtune timing the drafter's
    graphs), nothing is read."""

    @functools.wraps(dummy_run)
    def wrapped(self: Any, num_tokens: int, use_cudagraphs: bool = True, is_graph_capturing: bool = False,
                *args: Any, **kwargs: Any) -> Any:
        if not (_OPEN and is_graph_capturing and use_cudagraphs):
            return dummy_run(self, num_tokens, use_cudagraphs, is_graph_capturing, *args, **kwargs)
        with capture_reading("piecewise", num_tokens, uniform=False, num_reqs=None, free_bytes=free_bytes,
                             owner="drafter"):
            return dummy_run(self, num_tokens, use_cudagraphs, is_graph_capturing, *args, **kwargs)

    return wrapped


def _v1_drafter_classes() -> list[Any]:
    """V1's drafter classes whose `dummy_run` vLLM captures (the base, and DFlash's own pass)."""
    out = []
    for module, name in (("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer"),
                         ("vllm.v1.spec_decode.dflash", "DFlashProposer")):
        try:
            out.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):  # vLLM 0.34 removed V1
            continue
    return [c for c in out if "dummy_run" in vars(c)]


_INSTALLED: list[bool] = []


def install_capture_hooks() -> None:
    """Wrap both runners' capture once per process (CUDA builds; the CPU build captures nothing)."""
    if _INSTALLED:
        return
    _INSTALLED.append(True)
    try:
        import vllm.v1.worker.gpu_model_runner as v1
    except ImportError:  # vLLM 0.34 removed the V1 runner
        pass
    else:
        v1.GPUModelRunner._warmup_and_capture = wrap_v1_capture(v1.GPUModelRunner._warmup_and_capture)
        v1.GPUModelRunner.capture_model = wrap_capture_model(v1.GPUModelRunner.capture_model)
    for cls in _v1_drafter_classes():
        cls.dummy_run = wrap_v1_drafter_capture(cls.dummy_run)
    try:
        import vllm.v1.worker.gpu.cudagraph_utils as v2
        import vllm.v1.worker.gpu.model_runner as v2_runner
    except ImportError:  # a build without the V2 runner
        return
    v2.CudaGraphManager.capture = wrap_v2_capture(v2.CudaGraphManager.capture)
    v2_runner.GPUModelRunner.capture_model = wrap_capture_model(v2_runner.GPUModelRunner.capture_model)


def uninstall_capture_hooks() -> None:
    """Undo `install_capture_hooks` (tests that wrap vLLM's capture themselves)."""
    if not _INSTALLED:
        return
    _INSTALLED.clear()
    try:
        import vllm.v1.worker.gpu_model_runner as v1
    except ImportError:
        pass
    else:
        v1.GPUModelRunner._warmup_and_capture = v1.GPUModelRunner._warmup_and_capture.__wrapped__
        v1.GPUModelRunner.capture_model = v1.GPUModelRunner.capture_model.__wrapped__
    for cls in _v1_drafter_classes():
        if hasattr(cls.dummy_run, "__wrapped__"):
            cls.dummy_run = cls.dummy_run.__wrapped__
    try:
        import vllm.v1.worker.gpu.cudagraph_utils as v2
        import vllm.v1.worker.gpu.model_runner as v2_runner
    except ImportError:
        return
    v2.CudaGraphManager.capture = v2.CudaGraphManager.capture.__wrapped__
    v2_runner.GPUModelRunner.capture_model = v2_runner.GPUModelRunner.capture_model.__wrapped__


@contextlib.contextmanager
def forced_dispatch(manager: Any, mode: str, *, candidates: Callable[[Any, int, int], list[Any]] | None = None,
                    compatible: Callable[..., bool] | None = None, descriptor: Callable[..., Any] | None = None
                    ) -> Iterator[None]:
    """V2: inside the context, `manager.dispatch` returns a `mode` descriptor ("none", "piecewise" or "full") for the
    batch, found among vLLM's own captured candidates with vLLM's own compatibility test; LookupError when it has none
    (the width was not captured in that mode). The hooks are vLLM's by default; tests pass their own."""
    import vllm.v1.worker.gpu.cudagraph_utils as v2

    compatible = compatible or v2._is_compatible
    descriptor = descriptor or v2.BatchExecutionDescriptor
    candidates = candidates or (lambda m, tokens, loras: list(m._candidates.get((tokens, loras), ())))
    original = manager.dispatch

    def dispatch(num_reqs: int, num_tokens: int, uniform_token_count: int | None, num_active_loras: int,
                 max_query_len: int | None = None, num_ubatches: int = 1) -> Any:
        chosen = original(num_reqs, num_tokens, uniform_token_count, num_active_loras, max_query_len, num_ubatches)
        if mode == "none":
            if _mode_name(chosen.cg_mode) == "none":
                return chosen
            from vllm.config import CUDAGraphMode

            return descriptor(cg_mode=CUDAGraphMode.NONE, num_tokens=num_tokens, num_reqs=num_reqs,
                              num_active_loras=chosen.num_active_loras, num_ubatches=num_ubatches)
        for desc in candidates(manager, num_tokens, chosen.num_active_loras):
            if _mode_name(desc.cg_mode) == mode and compatible(desc, num_reqs, num_tokens, uniform_token_count,
                                                                 chosen.num_active_loras, max_query_len, num_ubatches):
                return desc
        raise LookupError(f"no {mode.upper()} graph captured for {num_tokens} tokens ({num_reqs} requests)")

    manager.dispatch = dispatch
    try:
        yield
    finally:
        del manager.dispatch  # the class's method again


class CgtuneWorkerExtension:
    """Named as vLLM's `worker_extension_cls`: importing it installs the capture hooks in the worker's process."""


install_capture_hooks()
