"""The device side of validation: the workload's decode model built once on the GPU, capturing one list's graphs
into one shared pool as the engine would, measuring vLLM's graph-memory estimate the way its runner takes it, timing
a planned trace, and releasing the graphs; what it measures is handed to `tuner.validate.validation`, which decides."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from tuner.validate.trace import PlannedStep

if TYPE_CHECKING:  # torch and the device code load only where a backend is built
    from tuner.measure.decoder import DecodeModel
    from tuner.measure.memory import MemorySnapshot
    from tuner.measure.timing import Clock
    from tuner.model.costmodel import CostModel, Evaluation

__all__ = ["CaptureResult", "ReplayBackend", "TorchBackend", "ValidationError", "build_backend", "require_cuda"]


class ValidationError(ValueError):
    """Validation cannot run (no CUDA device, unusable run directory); the message is one line."""


@dataclass(frozen=True)
class CaptureResult:
    """Device memory around capturing one list's graphs into one shared pool."""

    free_delta_bytes: int | None
    """Free device memory taken (cudaMemGetInfo before/after, cached blocks released first): the pool and the graph
    objects, as the profile's capture deltas were measured; None when unreadable or negative."""
    nvml_delta_bytes: int | None = None
    """The same, through NVML (the driver's used-memory counter)."""
    reserved_delta_bytes: int | None = None
    """Growth of torch's reserved memory (the pool's segments as the caching allocator sees them)."""
    capture_s: float = 0.0
    """Wall seconds the warm-ups and captures took."""
    oom: str | None = None
    """The out-of-memory message when the list could not be captured on this device."""
    graphs: int = 0
    """Graphs captured."""


class ReplayBackend(Protocol):
    """What validation does on a device; the CPU tests inject a fake or an eager CPU backend."""

    device_name: str
    """Device the numbers come from."""
    graphs_supported: bool
    """Whether `capture` really captures (False on a CPU: graph steps then run the body eagerly at the padded width,
    PIECEWISE ones split at attention)."""
    max_num_tokens: int | None
    """Widest step the backend can run (its static buffers and KV cache); wider trace steps are left out."""

    def metadata(self) -> dict[str, Any]: ...

    def capture(self, graphs: Sequence[tuple[str, int]]) -> CaptureResult: ...

    def measure_estimate(self, graphs: Sequence[tuple[str, int]], runner: str) -> int | None: ...

    def time_steps(self, plan: Sequence[PlannedStep]) -> list[float]: ...

    def release(self) -> int | None: ...


class TorchBackend:
    """The decode model of `cgtune profile` (built once) with its capture, memory and timing helpers: capture
    a list's graphs into one pool in the given order (FULL graphs whole, PIECEWISE ones split at every attention
    call as the profile's piecewise rows were), time each planned step with the profile's clock (CUDA events
    around each step, one synchronize per chunk, so the host runs ahead as in serving), release the graphs. The
    target only: a drafter's graphs and passes are the cost model's prediction, not replayed (see compare_list)."""

    def __init__(self, model: DecodeModel, clock: Clock | None = None, *, chunk_steps: int = 512,
                 warmup_eager: int = 32) -> None:
        from tuner.measure.memory import device_metadata
        from tuner.measure.profile import StepRunner

        self.model = model
        self.runner = StepRunner(model, clock)
        self.graphs_supported = self.runner.graphs_supported
        self.max_num_tokens = model.max_num_tokens
        self._meta = device_metadata(model.device)
        self.device_name = str(self._meta.get("device_name"))
        self.chunk_steps = chunk_steps
        self.warmup_eager = warmup_eager
        self._graphs: dict[tuple[str, int], Any] = {}
        self._baseline: MemorySnapshot | None = None
        self._primed = False

    def metadata(self) -> dict[str, Any]:
        return dict(self._meta, graphs=("torch.cuda.CUDAGraph, one shared pool; PIECEWISE graphs split at every "
                                        "attention call, attention eager between the pieces"
                                        if self.graphs_supported else
                                        "none: graph steps run the body eagerly at the padded width (PIECEWISE ones "
                                        "split at attention)"),
                    attention_kernel=self.model.attention_kernel, clock=type(self.runner.clock).__name__,
                    compiled=bool(getattr(self.model, "_compiled", False)))

    def capture(self, graphs: Sequence[tuple[str, int]]) -> CaptureResult:
        import time

        from tuner.measure import graphs as _graphs
        from tuner.measure.memory import free_delta_bytes, nvml_delta_bytes

        if self._graphs:
            raise RuntimeError("capture() called while another list's graphs are live; release() first")
        runner = self.runner
        if self.graphs_supported and graphs and not self._primed:
            self._prime(min(w for _, w in graphs))
        runner.release(collect=True)
        before = runner.memory()
        self._baseline = before
        if not self.graphs_supported:
            return CaptureResult(None)
        pool = runner.new_pool()
        t0 = time.perf_counter()
        oom = None
        try:
            for mode, width in graphs:
                self._warm(mode, width)
                self._graphs[(mode, width)] = self._capture_graph(mode, width, pool)
        except Exception as exc:
            if not _graphs.is_oom(exc):
                raise
            oom = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        if oom is not None:
            # Outside the except block: its traceback's frames would keep the failed capture's tensors alive.
            self.release()
            return CaptureResult(None, oom=oom, capture_s=time.perf_counter() - t0)
        runner.release()  # the warm-ups' cached activation blocks are not graph memory
        after = runner.memory()
        reserved = None if before.reserved_bytes is None or after.reserved_bytes is None else \
            after.reserved_bytes - before.reserved_bytes
        return CaptureResult(free_delta_bytes(before, after), nvml_delta_bytes(before, after), reserved,
                             time.perf_counter() - t0, None, len(self._graphs))

    def measure_estimate(self, graphs: Sequence[tuple[str, int]], runner: str) -> int | None:
        """vLLM's graph-memory estimate measured the way its runner takes it, in throwaway pools: V2 captures every
        PIECEWISE graph and the two largest FULL graphs in the real order and extrapolates the FULL ones; V1 captures
        each mode's two largest graphs into a scratch pool (`tuner.engines.vllm.memory`). None without graphs here or
        when a sample capture runs out of memory."""
        from tuner.engines.vllm.memory import GraphCost, estimate_bytes, estimate_samples
        from tuner.measure import graphs as _graphs
        from tuner.measure.memory import free_delta_bytes

        if not self.graphs_supported or not graphs:
            return None if not self.graphs_supported else 0
        if self._graphs:
            raise RuntimeError("measure_estimate() called while a list's graphs are live; release() first")
        runner_ = self.runner
        if not self._primed:
            self._prime(min(w for _, w in graphs))
        sequences = estimate_samples(graphs, runner)
        measured: dict[tuple[str, int], tuple[float, float]] = {}
        try:
            for seq in sequences:
                if not seq:
                    continue
                pool, held = runner_.new_pool(), []
                for i, (mode, width) in enumerate(seq):
                    self._warm(mode, width)
                    runner_.release()
                    before = runner_.memory()
                    held.append(self._capture_graph(mode, width, pool))
                    runner_.release()
                    delta = free_delta_bytes(before, runner_.memory())
                    if delta is None:
                        return None
                    measured[(mode, width)] = (float(delta), float(delta))  # first: alone; later: its delta
                held.clear()
                runner_.release(collect=True)
        except Exception as exc:
            if not _graphs.is_oom(exc):
                raise
            runner_.release(collect=True)
            return None
        costs = [GraphCost("target", m, w, *measured.get((m, w), (0.0, 0.0))) for m, w in graphs]
        return int(round(estimate_bytes(costs, runner)))

    def _prime(self, width: int) -> None:
        """An eager step and throwaway captures (FULL, and PIECEWISE with its split warm-up) before the first measured
        list, so one-time allocations (cuBLAS handles and workspaces, the capture stream's, the compiled pieces'
        kernels) fall outside every list's reading, not into the first list's; the profile's deltas were likewise
        read after its compilation, activation-peak step and first captures."""
        self._warm("PIECEWISE", width)
        # Dropped at once; their pools go at the next release.
        self._capture_graph("FULL", width, self.runner.new_pool())
        self._capture_graph("PIECEWISE", width, self.runner.new_pool())
        self._primed = True

    def _warm(self, mode: str, width: int) -> None:
        """vLLM's eager run of a size before capturing it (lazy init, library heuristics, compiling a new shape);
        for PIECEWISE the split step too, whose pieces are what gets captured."""
        self.runner.eager(width)
        if mode == "PIECEWISE":
            self.runner.split_eager(width)

    def _capture_graph(self, mode: str, width: int, pool: Any) -> Any:
        """The graph of `mode` at `width` into `pool`: FULL the whole body, PIECEWISE one graph per piece between
        attention calls (`StepRunner.capture_piecewise`, as the profile's piecewise rows)."""
        if mode == "PIECEWISE":
            return self.runner.capture_piecewise(width, pool)
        return self.runner.capture(width, pool)

    def _step_fn(self, p: PlannedStep) -> Callable[[], object]:
        m = self.model
        t = p.num_tokens
        w = p.run_width
        if p.runtime_mode == "NONE":
            return lambda: m.step(t)
        if self.graphs_supported:
            # vLLM replays the padded body (PIECEWISE: the pieces, attention eager between them), then computes
            # logits eagerly for the real tokens only.
            g = self._graphs[(p.runtime_mode, w)]
            replay = g.graph.replay if p.runtime_mode == "FULL" else g.replay  # FULL: one call less per step
            return lambda: (replay(), m.logits(m.hidden_out[:t]))[1]
        # No graphs here (a CPU): the body eagerly at the padded width, PIECEWISE steps split at attention.
        if p.runtime_mode == "PIECEWISE":
            return lambda: m.logits(m.split_step(w)[:t])
        return lambda: m.logits(m.forward_hidden(w)[:t])

    def time_steps(self, plan: Sequence[PlannedStep]) -> list[float]:
        fns = {p.key + (p.num_tokens,): self._step_fn(p) for p in plan}
        # Untimed runs first (allocator growth, cuBLAS heuristics): every graph width, and eager steps from the
        # widest down, at most WARMUP_EAGER of them (mixed steps take nearly every width; warming all would double
        # the trace's eager time).
        eager = sorted((k for k in fns if k[0] == "NONE"), key=lambda k: -k[1])
        for k in [k for k in fns if k[0] != "NONE"] + eager[:self.warmup_eager]:
            fns[k]()
        order = [fns[p.key + (p.num_tokens,)] for p in plan]
        out: list[float] = []
        for lo in range(0, len(order), self.chunk_steps):
            chunk = iter(order[lo:lo + self.chunk_steps])
            out += self.runner.clock.time_ms(lambda: next(chunk)(), min(self.chunk_steps, len(order) - lo))
        return out

    def release(self) -> int | None:
        """Drop the graphs and their pool; returns the bytes still missing against the pre-capture reading."""
        self._graphs.clear()
        self.runner.release(collect=True)
        if self._baseline is None or self._baseline.free_bytes is None:
            return None
        after = self.runner.memory()
        return None if after.free_bytes is None else self._baseline.free_bytes - after.free_bytes


def require_cuda() -> str:
    """The device to validate on; ValidationError naming why when there is none."""
    try:
        import torch
    except ImportError:
        raise ValidationError("PyTorch is not installed: validation captures graphs on a CUDA GPU") from None
    if not torch.cuda.is_available():
        raise ValidationError("no CUDA device is visible: validation captures and replays graphs on the GPU the "
                              "profile was measured on (run it there)")
    return "cuda"


def build_backend(model: CostModel, lists: dict[str, Evaluation], device: str) -> TorchBackend:
    """The workload's decode model built once, wide enough for every step and graph, compiled as the profile was."""
    from tuner.measure import graphs as _graphs
    from tuner.measure.decoder import build_model, out_of_memory_building

    # As wide as every graph, and as the widest step the profile measured eagerly: the decoder models a wider
    # (mixed) step as more decode requests, whose KV cache would not fit (DFlash-like: 8192 tokens are 482
    # requests of 2 GiB context each), and the model only extrapolates there anyway.
    graphs = [w for e in lists.values() for _, w in model.graphs(e.capture_sizes)]
    widest = max(graphs + [min(int(model.step_arrays()[0].max()), model.eager_ms.max_width)])
    try:
        decoder = build_model(model.workload, widest, device)
    except Exception as exc:
        if not _graphs.is_oom(exc):
            raise
        message = out_of_memory_building(model.workload, widest, device)
    else:
        message = None
    if message is not None:  # outside the except block, whose traceback holds what was allocated
        _graphs.release_memory(device, collect=True)
        raise ValidationError(message)
    if model.profile.metadata.get("compiled"):
        decoder.compile()
    return TorchBackend(decoder)
