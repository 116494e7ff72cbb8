"""The profile sweep: for every candidate width, the graphs captured in vLLM's order (all PIECEWISE largest first,
then all FULL largest first, into one shared pool, each also alone in a fresh pool), then eager, PIECEWISE and
FULL replay and the LM head timed back to back, written as the profile table after every width so an interrupted
run resumes where it stopped; plus vLLM's non-KV memory and the eager step's kernels per layer."""

from __future__ import annotations

import datetime as _dt
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tuner import candidates as _candidates
from tuner.measure import graphs as _graphs
from tuner.measure import piecewise as _piecewise
from tuner.measure.decoder import DTYPES, DecodeModel, ShardShape
from tuner.measure.kernels import cuda_kernels_per_layer
from tuner.measure.memory import (
    MemorySnapshot,
    device_metadata,
    free_delta_bytes,
    non_kv_memory,
    nvml_delta_bytes,
    snapshot,
)
from tuner.measure.timing import Clock, CudaEventClock, Measurement, WallClock, measure
from tuner.profile_table import MODES, ProfileError, ProfileRow, read_profile, write_profile
from tuner.workload import Workload

__all__ = [
    "ASSUMED_CAPTURE_S",
    "CAPTURE_ORDER",
    "PIECEWISE_NOTE",
    "SWEEP_MODES",
    "ProfileResult",
    "StepRunner",
    "SweepOptions",
    "build_model",
    "candidate_widths",
    "estimate_sweep_s",
    "profile_workload",
    "thin_widths",
    "validate_sizes",
]

log = logging.getLogger(__name__)

PIECEWISE_NOTE = _piecewise.NOT_VLLM
"""What piecewise rows are (metadata `piecewise` on CUDA)."""

CAPTURE_ORDER = "piecewise-then-full"
"""Metadata `capture_order`: every PIECEWISE graph (largest first) was in the shared pool before the FULL graphs
(largest first) were captured, so a FULL row's `capture_delta_bytes` is the sample vLLM's V2 estimate takes after
the PIECEWISE graphs. Profiles without the key captured FULL graphs only."""

ASSUMED_CAPTURE_S = 0.005
"""Seconds per graph capture that `estimate_sweep_s` assumes (an assumption, not a measurement: a capture is a
synchronize, a recorded kernel sequence and an instantiation, milliseconds for a piece)."""

SWEEP_MODES = ("eager", "full", "piecewise", "logits")
"""The rows the sweep writes for every width (the table may hold other modes too); a width with all of them is
done and is resumed, not re-measured."""

_NO_CUDA = "CUDA graphs need a CUDA device"


# --------------------------------------------------------------------------- candidates
def candidate_widths(workload: Workload, *, stride_tokens: int = 128) -> list[int]:
    """The sweep's widths: `tuner.candidates.candidate_widths` with a 128-token stride above the ceiling,
    coarser than vLLM's 16 so a sweep of an 8B model fits minutes; decode widths are all kept."""
    return _candidates.candidate_widths(workload.serving, stride_tokens=stride_tokens)


def thin_widths(widths: Sequence[int], max_count: int, *, keep: Iterable[int] = ()) -> list[int]:
    """At most `max_count` widths spread evenly over `widths` (by rank), always keeping the smallest, the
    largest and every width in `keep` that is a candidate."""
    ordered = sorted(set(widths))
    if max_count < 1:
        raise ValueError(f"{max_count=} must be >= 1")
    if len(ordered) <= max_count:
        return ordered
    chosen = {ordered[0], ordered[-1]} | (set(keep) & set(ordered))
    slots = max_count - len(chosen)
    if slots > 0:
        step = (len(ordered) - 1) / (slots + 1)
        chosen |= {ordered[round(step * (i + 1))] for i in range(slots)}
    return sorted(chosen)


def validate_sizes(sizes: Iterable[int], workload: Workload) -> list[int]:
    """Explicit widths, deduplicated and sorted; ValueError naming the first out of 1..max_num_batched_tokens."""
    limit = workload.serving.max_num_batched_tokens
    out = set()
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, int):
            raise ValueError(f"--sizes: {size!r} must be an integer")
        if size < 1:
            raise ValueError(f"--sizes: {size} must be >= 1")
        if size > limit:
            raise ValueError(f"--sizes: {size} must be <= max_num_batched_tokens={limit}")
        out.add(size)
    if not out:
        raise ValueError("--sizes: give at least one width")
    return sorted(out)


# --------------------------------------------------------------------------- device actions
def build_model(workload: Workload, max_num_tokens: int, device: torch.device | str, *, seed: int = 0,
                allocate_kv_cache: bool = True) -> DecodeModel:
    """The workload's decode step for one rank, with a static KV cache at its mean context length (allocated
    later by the caller when `allocate_kv_cache` is False)."""
    m = workload.model
    return DecodeModel(
        ShardShape.for_rank(m.shape, m.tensor_parallel_size),
        max_num_tokens=max_num_tokens,
        decode_query_len=workload.serving.decode_query_len,
        context_len=workload.traffic.mean_context_len,
        dtype=DTYPES[m.dtype],
        device=device,
        seed=seed,
        allocate_kv_cache=allocate_kv_cache,
    )


class StepRunner:
    """Everything the sweep does on the device, one method per action; tests subclass it to script graphs,
    memory readings and out-of-memory errors on a CPU."""

    def __init__(self, model: DecodeModel, clock: Clock | None = None) -> None:
        self.model = model
        self.device = model.device
        cuda = self.device.type == "cuda"
        self.clock = clock or (CudaEventClock(self.device) if cuda else WallClock())
        self.graphs_supported = cuda
        """Whether `capture` can work here; when False, graph rows are `unsupported`."""
        self.unsupported_reason = None if cuda else _NO_CUDA

    def eager(self, num_tokens: int) -> None:
        """The step without a graph (compiled when the model is): body, then logits for its tokens."""
        self.model.step(num_tokens)

    def split_eager(self, num_tokens: int) -> None:
        """The PIECEWISE step run piece by piece without graphs (the warm-up before its capture)."""
        self.model.split_step(num_tokens)

    def logits(self, num_tokens: int) -> None:
        """The LM head alone over `num_tokens` tokens: what runs after a graph's replay."""
        self.model.logits(self.model.hidden_out[:num_tokens])

    def new_pool(self) -> Any:
        return _graphs.new_pool()

    def capture(self, num_tokens: int, pool: Any) -> _graphs.CapturedGraph:
        """The FULL graph of the step's body at `num_tokens`, into `pool`."""
        return _graphs.capture(lambda: self.model.forward_hidden(num_tokens), num_tokens, pool=pool)

    def capture_piecewise(self, num_tokens: int, pool: Any) -> _piecewise.PiecewiseGraph:
        """The PIECEWISE graphs of the step at `num_tokens`: one per piece between attentions, into `pool`."""
        return _piecewise.capture_piecewise(self.model, num_tokens,
                                            lambda fn: self.capture_piece(fn, num_tokens, pool), pool)

    def capture_piece(self, fn: Callable[[], Sequence[torch.Tensor]], num_tokens: int, pool: Any
                      ) -> tuple[_piecewise.Piece, Sequence[torch.Tensor]]:
        """One piece of a PIECEWISE step as a graph (tests put a stand-in graph here)."""
        return _piecewise.capture_piece(fn, num_tokens, pool)

    def replay(self, graph: _graphs.CapturedGraph | _piecewise.PiecewiseGraph) -> None:
        # vLLM replays the graphed body, then computes logits eagerly from the graph's static output for the real
        # tokens; here the width's own tokens, all real, so no timed mode computes logits over padding.
        graph.replay()
        self.logits(graph.num_tokens)

    def memory(self) -> MemorySnapshot:
        return snapshot(self.device)

    def release(self, *, collect: bool = False) -> None:
        _graphs.release_memory(self.device, collect=collect)

    def peak_bytes(self, fn: Callable[[], object]) -> int | None:
        """Peak bytes `fn` allocates beyond what is live before it (CUDA only: None elsewhere)."""
        if self.device.type != "cuda":
            return None
        self.release()
        torch.cuda.reset_peak_memory_stats(self.device)
        base = torch.cuda.memory_allocated(self.device)
        fn()
        torch.cuda.synchronize(self.device)
        return int(torch.cuda.max_memory_allocated(self.device) - base)

    def profile_memory(self, fn: Callable[[], object]) -> tuple[int, int] | None:
        """(torch's peak allocated bytes while `fn` ran, bytes allocated after it), as vLLM's memory profiling
        reads them around its profiling step; None off CUDA."""
        if self.device.type != "cuda":
            return None
        self.release()
        torch.cuda.reset_peak_memory_stats(self.device)
        fn()
        torch.cuda.synchronize(self.device)
        return int(torch.cuda.max_memory_allocated(self.device)), int(torch.cuda.memory_allocated(self.device))

    def kernels_per_layer(self, num_tokens: int) -> dict[str, Any] | None:
        """CUDA kernels one eager body step at `num_tokens` launches, per layer (None off CUDA)."""
        return cuda_kernels_per_layer(lambda: self.model.forward_hidden(num_tokens), len(self.model.layers),
                                      self.device)


# --------------------------------------------------------------------------- the sweep
@dataclass(frozen=True)
class SweepOptions:
    """How long to time each width and how far to go."""

    warmup_ms: float = 25.0
    """Warm-up budget per (width, mode)."""
    rep_ms: float = 100.0
    """Timed-repetition budget per (width, mode)."""
    min_reps: int = 5
    """At least this many timed repetitions, whatever the budget."""
    max_reps: int = 1000
    """At most this many timed repetitions."""
    max_seconds: float | None = None
    """Stop starting new widths after this many seconds (the run can be resumed): with graphs, checked while the
    PIECEWISE graphs are captured, against the time the widths captured so far still need (they go on); without,
    before each width is timed."""
    standalone: bool = True
    """Also capture each width alone in a fresh pool (`standalone_bytes`)."""


@dataclass
class ProfileResult:
    """What a sweep wrote."""

    csv_path: Path
    """The profile table."""
    rows: list[ProfileRow]
    """Every row in it."""
    metadata: dict[str, Any]
    """Its metadata."""
    measured: list[int] = field(default_factory=list)
    """Widths measured by this run (resumed widths excluded)."""
    complete: bool = True
    """False when `max_seconds` stopped the sweep early."""


def estimate_sweep_s(num_widths: int, options: SweepOptions, *, graphs: bool, num_layers: int) -> tuple[float, str]:
    """Seconds a sweep of `num_widths` new widths takes at least, and how that is reckoned: every timed mode
    (eager and logits; with graphs also piecewise and full) spends its warm-up and repetition budgets, and every
    graph capture (num_layers + 1 pieces and one full graph per width, twice with standalone captures) is counted
    at ASSUMED_CAPTURE_S. Steps slower than rep_ms / min_reps, warm-up steps, compilation and model set-up come
    on top: an estimate, not a measurement."""
    modes = 4 if graphs else 2
    timing_s = num_widths * modes * (options.warmup_ms + options.rep_ms) / 1e3
    captures = num_widths * (num_layers + 2) * (2 if options.standalone else 1) if graphs else 0
    capture_s = captures * ASSUMED_CAPTURE_S
    how = (f"{num_widths} widths x {modes} timed modes x {options.warmup_ms:g}+{options.rep_ms:g} ms budgets = "
           f"{timing_s:.0f} s")
    if graphs:
        how += f", + {captures} graph captures at an assumed {ASSUMED_CAPTURE_S * 1e3:g} ms = {capture_s:.0f} s"
    how += "; compilation, set-up and steps slower than their budget come on top"
    return timing_s + capture_s, how


def _resume(out_dir: Path, name: str, meta: dict[str, Any]) -> tuple[dict[int, list[ProfileRow]], dict[str, Any]]:
    """Rows of widths finished by an earlier run of the same measurement; ValueError if it measured another."""
    csv_path = out_dir / f"{name}.csv"
    if not csv_path.exists():
        return {}, {}
    try:
        old = read_profile(csv_path)
    except ProfileError as exc:
        raise ValueError(f"{csv_path}: cannot resume ({exc}); pass --fresh to overwrite") from None
    for key, now in (("workload", meta["workload"]["hash"]), ("device_name", meta["device_name"]),
                     ("compiled", meta["compiled"]), ("context_len", meta["context_len"]),
                     ("capture_order", meta["capture_order"])):
        then = old.metadata.get(key)
        then = then.get("hash") if key == "workload" and isinstance(then, dict) else then
        if then != now:
            raise ValueError(f"{csv_path}: was measured with {key}={then!r}, this run has {now!r}; "
                             "pass --fresh to overwrite or choose another --out")
    by_width: dict[int, list[ProfileRow]] = {}
    for row in old.rows:
        by_width.setdefault(row.num_tokens, []).append(row)
    done = {w: rows for w, rows in by_width.items() if {r.mode for r in rows} >= set(SWEEP_MODES)}
    return done, old.metadata


def profile_workload(
    workload: Workload,
    out_dir: str | Path,
    *,
    widths: Sequence[int] | None = None,
    device: str = "cuda",
    compile: bool | None = None,
    options: SweepOptions | None = None,
    name: str | None = None,
    command: str = "",
    resume: bool = True,
    seed: int = 0,
    progress: bool = True,
    runner_factory: Callable[[DecodeModel], StepRunner] = StepRunner,
) -> ProfileResult:
    """Measure `widths` (default: `candidate_widths`) of the workload on `device` and write
    `out_dir/<name>.csv` and `.json` after every width. `compile` (default: unless the workload sets
    `serving.enforce_eager`) runs the model through torch.compile, compiled once before the first width.

    Before the widths: vLLM's non-KV memory (its profiling step), the eager step's kernels per layer, the
    activation peaks. Then vLLM's capture order into one shared pool: every PIECEWISE step largest first, then
    every FULL graph largest first, each width also captured alone in a fresh pool (`options.standalone`); then,
    largest first, eager, PIECEWISE replay, FULL replay and the LM head alone timed back to back with every graph
    resident. An out-of-memory width is marked `oom` in that mode and the sweep goes on with smaller ones."""
    options = options or SweepOptions()
    out_dir = Path(out_dir)
    name = name or workload.name
    compile = (not workload.serving.enforce_eager) if compile is None else compile
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("no CUDA device is visible; pass --device cpu to measure the eager path on the CPU")
    requested = validate_sizes(widths, workload) if widths is not None else candidate_widths(workload)
    started = time.perf_counter()
    meta: dict[str, Any] = {
        **device_metadata(dev),
        "workload": {"name": workload.name, "hash": workload.content_hash,
                     "path": str(workload.path) if workload.path else None},
        "model": {"preset": workload.model.preset, "shape": workload.model.shape.as_dict(),
                  "dtype": workload.model.dtype, "tensor_parallel_size": workload.model.tensor_parallel_size},
        "compiled": compile,
        "capture_order": CAPTURE_ORDER,
        "context_len": workload.traffic.mean_context_len,
        "decode_query_len": workload.serving.decode_query_len,
        "command": command,
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    done, old_meta = _resume(out_dir, name, meta) if resume else ({}, {})
    dropped = sorted(set(old_meta.get("widths_requested") or done) - set(requested))
    if dropped:
        # Capture deltas only add up within one width list; resuming may add widths, never drop them.
        raise ValueError(f"{out_dir / name}.csv: was measured with widths this run does not ask for "
                         f"({', '.join(map(str, dropped[:5]))}{', ...' if len(dropped) > 5 else ''}); "
                         "pass --fresh to overwrite or choose another --out/--name")
    pending = [w for w in sorted(requested, reverse=True) if w not in done]

    # vLLM's memory profiling starts from a snapshot taken once CUDA is up and before the weights exist (after a
    # collection, so garbage freed later cannot make the reading smaller).
    _graphs.release_memory(dev, collect=True)
    baseline = snapshot(dev)
    model = build_model(workload, max(requested), dev, seed=seed, allocate_kv_cache=False)
    runner = runner_factory(model)
    kv_taken = _allocate_kv_cache(runner, model)
    compile_s = _compile(runner, requested) if compile else None
    measurements: dict[str, Any] = dict(old_meta.get("measurements", {}))
    meta.update(
        weights_bytes=model.weight_bytes(),
        kv_cache_bytes=model.kv_cache_bytes(),
        attention_kernel=model.attention_kernel,
        compile_s=compile_s,
        graphs=runner.unsupported_reason or "PIECEWISE then FULL graphs captured with torch.cuda.CUDAGraph, "
                                                "largest first, one shared pool",
        piecewise=PIECEWISE_NOTE if runner.graphs_supported else runner.unsupported_reason,
        logits="logits rows: the LM head alone over the width's tokens, eagerly (what runs after a graph); eager "
               "rows time body + logits, piecewise and full rows replay + logits, all for the width's own tokens",
        eager_kernels_per_layer=old_meta.get("eager_kernels_per_layer"),
        eager_kernels=old_meta.get("eager_kernels"),
        timing={"clock": type(runner.clock).__name__, "warmup_ms": options.warmup_ms, "rep_ms": options.rep_ms,
                "min_reps": options.min_reps, "max_reps": options.max_reps},
        widths_requested=requested,
        first_created_at=old_meta.get("first_created_at", old_meta.get("created_at", meta["created_at"])),
    )
    meta.update(_non_kv(runner, workload, baseline, kv_taken))
    meta.update(_activation_peaks(runner, workload, max(requested)))
    if dev.type == "cuda":
        meta["free_memory_bytes"] = runner.memory().free_bytes

    rows: dict[int, list[ProfileRow]] = dict(done)
    previous_sweep_s = float(old_meta.get("sweep_s") or 0.0)
    csv_path = out_dir / f"{name}.csv"

    def write(complete: bool) -> Path:
        if not rows:  # stopped before the first width: an empty table is not a profile
            return csv_path
        meta.update(measurements=measurements, widths_done=sorted(rows), complete=complete,
                    noisy_widths=_noisy_widths(measurements, rows),
                    sweep_s=previous_sweep_s + (time.perf_counter() - started))
        return write_profile(out_dir, name, [r for rs in rows.values() for r in rs], meta)

    sweep = _Sweep(runner, options, started, oom_floor={})
    measured: list[int] = []
    complete = True
    try:
        if runner.graphs_supported and pending:
            pending = sweep.capture_all(pending, done)
            complete = len(pending) == len([w for w in requested if w not in done])
        bar = _progress(len(pending), name, enabled=progress)
        try:
            for w in pending:
                # With graphs, `capture_all` already kept only the widths the time allows: their graphs are made.
                over = options.max_seconds is not None and time.perf_counter() - started > options.max_seconds
                if over and not runner.graphs_supported:
                    complete = False
                    log.warning("stopped after %.0f s with %d of %d widths left; rerun the same command to resume",
                                time.perf_counter() - started, len(pending) - len(measured), len(requested))
                    break
                bar.set_postfix_str(f"{w} tokens")
                rows[w], measurements[str(w)] = sweep.time_width(w)
                measured.append(w)
                write(complete=False)
                bar.update(1)
        finally:
            bar.close()
        # Counted last, so the profiler's device tracing cannot touch a timing or a memory reading.
        kernel_width = min(workload.serving.decode_query_len, max(requested))
        kernels = runner.kernels_per_layer(kernel_width)
        if kernels is not None:
            kernels["num_tokens"] = kernel_width
            meta.update(eager_kernels_per_layer=kernels["per_layer"], eager_kernels=kernels)
    finally:
        complete = complete and len(measured) == len(pending)
        csv_path = write(complete=complete)
        sweep.graphs.clear()
        sweep.restored.clear()
        runner.release()
    all_rows = sorted((r for rs in rows.values() for r in rs), key=lambda r: (r.num_tokens, MODES.index(r.mode)))
    return ProfileResult(csv_path=csv_path, rows=all_rows, metadata=meta, measured=measured, complete=complete)


def _noisy_widths(measurements: dict[str, Any], rows: dict[int, list[ProfileRow]]) -> list[int]:
    """Widths in the table with a timing flagged noisy (IQR / median above 5%) in any mode."""
    noisy = {int(w) for w, detail in measurements.items()
             if any(isinstance(m, dict) and m.get("noisy") for m in detail.values())}
    return sorted(noisy & set(rows))


def _allocate_kv_cache(runner: StepRunner, model: DecodeModel) -> int | None:
    """Allocate the static KV cache; returns the device memory that took (its free-memory drop, None off CUDA),
    which vLLM's non-KV memory must not include: vLLM allocates its KV cache after profiling."""
    runner.release()
    before = runner.memory()
    model.allocate_kv_cache()
    after = runner.memory()
    return free_delta_bytes(before, after)


def _compile(runner: StepRunner, widths: Sequence[int]) -> float:
    """Compile once, before the first width, as vLLM compiles before it captures: the widest step, the PIECEWISE
    pieces too where graphs will be captured, and width 1 if measured (the token count is unbacked, so no
    compilation of its own is expected; a torch that specialized it would pay for it here, not inside a width).
    Returns the seconds spent (compilation and one run of each). An out-of-memory run is left to the sweep, which
    marks that width."""
    log.info("compiling the step%s with torch.compile", " and its PIECEWISE pieces" if runner.graphs_supported else "")
    t0 = time.perf_counter()
    for w in sorted({max(widths)} | ({1} & set(widths)), reverse=True):
        _attempt(runner, lambda: runner.eager(w))
        if runner.graphs_supported:
            _attempt(runner, lambda: runner.split_eager(w))
    runner.release()
    return round(time.perf_counter() - t0, 3)


def _non_kv(runner: StepRunner, workload: Workload, baseline: MemorySnapshot, kv_taken: int | None
            ) -> dict[str, Any]:
    """vLLM's non-KV memory (`non_kv_cache_bytes`, breakdown in `non_kv`): the drop in free device memory from the
    baseline (CUDA up, no weights) to after vLLM's profiling step, max_num_batched_tokens over max_num_seqs
    requests, plus its transient peak headroom. The KV cache, allocated in between (the decode steps compiled
    before need it), is excluded by subtracting its own free-memory drop. None off CUDA."""
    s = workload.serving
    tokens, requests = s.max_num_batched_tokens, min(s.max_num_seqs, s.max_num_batched_tokens)
    ok, reading, message = _attempt(runner, lambda: runner.profile_memory(
        lambda: runner.model.profile_run(tokens, requests)))
    if message:
        log.warning("vLLM's profiling step ran out of memory; non_kv_cache_bytes left empty: %s", message)
    runner.release(collect=True)  # as vLLM collects and empties the cache before its after-profiling reading
    after = runner.memory()
    model = runner.model
    breakdown = None
    if ok and reading is not None:
        breakdown = non_kv_memory(baseline, after, kv_cache_bytes=kv_taken, peak_allocated_bytes=reading[0],
                                  allocated_after_bytes=reading[1], weights_bytes=model.weight_bytes(),
                                  persistent_buffers_bytes=model.persistent_buffer_bytes())
    if breakdown is not None:
        breakdown.update(profile_run_tokens=tokens, profile_run_requests=requests,
                         kv_cache="allocated before the profiling step (compiled decode steps need it); its own "
                                  "free-memory drop is subtracted")
    return {"non_kv_cache_bytes": breakdown["non_kv_cache_bytes"] if breakdown else None, "non_kv": breakdown}


def _activation_peaks(runner: StepRunner, workload: Workload, widest: int) -> dict[str, Any]:
    """`activation_peak_bytes`, what the KV budget must leave free besides weights and graphs: the larger of
    the peak of vLLM's memory-profiling step (max_num_batched_tokens fresh tokens over max_num_seqs requests,
    the number vLLM itself subtracts) and the peak of the widest decode step measured (logits for every
    token), which serving needs as well. Both are kept; None on a CPU or when a step ran out of memory."""
    s = workload.serving
    tokens, requests = s.max_num_batched_tokens, min(s.max_num_seqs, s.max_num_batched_tokens)
    ok_run, run_peak, run_oom = _attempt(
        runner, lambda: runner.peak_bytes(lambda: runner.model.profile_run(tokens, requests)))
    ok_step, step_peak, step_oom = _attempt(runner, lambda: runner.peak_bytes(lambda: runner.eager(widest)))
    for what, message in (("profile run", run_oom), ("widest decode step", step_oom)):
        if message:
            log.warning("%s ran out of memory while measuring the activation peak: %s", what, message)
    peaks = [p for p in (run_peak, step_peak) if p is not None]
    return {
        "activation_peak_bytes": max(peaks) if ok_run and ok_step and peaks else None,
        "activation_peaks": {
            "profile_run_bytes": run_peak, "profile_run_tokens": tokens, "profile_run_requests": requests,
            "decode_step_bytes": step_peak, "decode_step_tokens": widest,
        },
    }


def _progress(total: int, name: str, *, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=f"profile {name}", unit="width", disable=not enabled, dynamic_ncols=True)


def _summary(m: Measurement) -> dict[str, Any]:
    return {"median_ms": m.median_ms, "iqr_ms": m.iqr_ms, "noisy": m.noisy, "warmup_reps": m.warmup_reps,
            "samples_ms": [round(x, 6) for x in m.samples_ms]}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def _attempt(runner: StepRunner, fn: Callable[[], Any]) -> tuple[bool, Any, str | None]:
    """Run `fn`; on out-of-memory return `(False, None, message)` after freeing what the failed call held.
    Any other error propagates: only memory exhaustion is a measurement outcome."""
    try:
        return True, fn(), None
    except Exception as exc:
        if not _graphs.is_oom(exc):
            raise
        message = _first_line(exc)
    # Released outside the except block: until it ends, the traceback's frames keep the failed call's tensors.
    runner.release(collect=True)
    return False, None, message


_GRAPH_MODES = ("piecewise", "full")  # vLLM's capture order


class _Sweep:
    """One run's captures and timings: the graphs it holds, what each capture read, where memory ran out."""

    def __init__(self, runner: StepRunner, options: SweepOptions, started: float, oom_floor: dict[str, int]) -> None:
        self.runner = runner
        self.options = options
        self.started = started
        self.oom_floor = oom_floor
        """mode -> the smallest width that ran out of memory in it; it and every larger width are `oom`."""
        self.graphs: dict[tuple[str, int], Any] = {}
        """(mode, width) -> the live graph this run timed or will time."""
        self.restored: list[Any] = []
        """Graphs of widths an earlier run finished, re-captured (untimed) so the pool looks as in one sweep."""
        self.details: dict[int, dict[str, Any]] = {}
        """width -> readings for the metadata's `measurements`."""
        self.captures: dict[tuple[str, int], dict[str, Any]] = {}
        """(mode, width) -> capture_delta_bytes, standalone_bytes, capture_s of a capture (or its attempt)."""
        self.seconds: dict[int, float] = {}
        """width -> seconds spent capturing it (warm-ups included)."""

    def _out_of_time(self, captured: int) -> bool:
        """Whether capturing one more width would leave `max_seconds` too short to finish the `captured` ones and
        it: each still needs its FULL captures (counted at its PIECEWISE capture time, which has more graphs) and
        four timed modes at their budgets."""
        limit = self.options.max_seconds
        if limit is None:
            return False
        per_capture_s = sum(self.seconds.values()) / max(1, len(self.seconds))
        per_width_s = per_capture_s + 4 * (self.options.warmup_ms + self.options.rep_ms) / 1e3
        elapsed = time.perf_counter() - self.started
        return elapsed + per_capture_s + (captured + 1) * per_width_s > limit

    def _oom(self, mode: str, w: int, message: str | None) -> None:
        self.oom_floor[mode] = min(self.oom_floor.get(mode, w), w)
        self.details.setdefault(w, {})[f"{mode}_oom"] = message

    def _blocked(self, mode: str, w: int) -> bool:
        return w >= self.oom_floor.get(mode, math.inf)

    def capture_all(self, pending: list[int], done: dict[int, list[ProfileRow]]) -> list[int]:
        """Every pending width's graphs in vLLM's order, into one shared pool: all PIECEWISE largest first, then
        all FULL largest first; widths an earlier run finished are re-captured (untimed) in their places. Returns
        the pending widths to time: all of them, or the widths captured before `max_seconds` ran out."""
        runner = self.runner
        pool = runner.new_pool()
        order = sorted(set(done) | set(pending), reverse=True)
        if done:
            log.info("resuming: %d widths already measured; re-capturing their graphs into the shared pool", len(done))
        for mode in _GRAPH_MODES:
            log.info("capturing the %s graphs of %d widths, largest first, into the shared pool", mode.upper(),
                     len(pending))
            captured: list[int] = []
            for w in order:
                if w in done:
                    if any(r.mode == mode and r.status == "ok" for r in done[w]):
                        ok, graph, _ = _attempt(runner, lambda: self._warm_and_capture(mode, w, pool))
                        if ok:
                            self.restored.append(graph)
                    continue
                if w not in pending:
                    continue
                if mode == "piecewise" and captured and self._out_of_time(len(captured)):
                    log.warning("max_seconds would run out: timing the %d widths whose PIECEWISE graphs are captured, "
                                "the other %d are left for a rerun", len(captured), len(pending) - len(captured))
                    pending = captured
                    break
                t0 = time.perf_counter()
                self._capture(mode, w, pool)
                self.seconds[w] = self.seconds.get(w, 0.0) + time.perf_counter() - t0
                captured.append(w)
        return pending

    def _warm_and_capture(self, mode: str, w: int, pool: Any) -> Any:
        # vLLM runs each size eagerly before capturing it (lazy initialisation, library heuristics, compilation of
        # a new shape), outside the capture.
        runner = self.runner
        runner.eager(w)
        if mode == "piecewise":
            runner.split_eager(w)
            return runner.capture_piecewise(w, pool)
        return runner.capture(w, pool)

    def _capture(self, mode: str, w: int, shared_pool: Any) -> None:
        """Width `w` in `mode`: alone in a fresh pool (standalone_bytes), then into the shared pool (the delta)."""
        runner = self.runner
        detail = self.details.setdefault(w, {})
        info: dict[str, Any] = {}
        self.captures[(mode, w)] = info
        if self._blocked("eager", w) or self._blocked(mode, w):
            return
        ok, _, message = _attempt(runner, lambda: (runner.eager(w), runner.split_eager(w) if mode == "piecewise"
                                                   else None))
        if not ok:  # the step itself does not fit: no graph of it can
            self._oom("eager", w, message)
            return
        capture = runner.capture_piecewise if mode == "piecewise" else runner.capture
        key = "capture" if mode == "full" else "piecewise_capture"
        if self.options.standalone:
            runner.release()
            before = runner.memory()
            ok, alone, message = _attempt(runner, lambda: capture(w, runner.new_pool()))
            if ok:
                runner.release()  # blocks attention cached between PIECEWISE captures are not graph memory
                after = runner.memory()
                info["standalone_bytes"] = free_delta_bytes(before, after)
                detail["standalone" if mode == "full" else "piecewise_standalone"] = {
                    "free_delta_bytes": info["standalone_bytes"], "nvml_delta_bytes": nvml_delta_bytes(before, after)}
                del alone  # frees the graph and, at the next release, its private pool
            else:
                detail[f"{mode}_standalone_oom"] = message
        runner.release()
        before = runner.memory()
        ok, graph, message = _attempt(runner, lambda: capture(w, shared_pool))
        if not ok:
            self._oom(mode, w, message)
            return
        runner.release()
        after = runner.memory()
        self.graphs[(mode, w)] = graph
        info.update(capture_delta_bytes=free_delta_bytes(before, after), capture_s=round(graph.capture_s, 6))
        detail[key] = {
            "free_delta_bytes": info["capture_delta_bytes"],
            "nvml_delta_bytes": nvml_delta_bytes(before, after),
            "reserved_delta_bytes": None if before.reserved_bytes is None or after.reserved_bytes is None
            else after.reserved_bytes - before.reserved_bytes,
        }

    def time_width(self, w: int) -> tuple[list[ProfileRow], dict[str, Any]]:
        """Rows for one width, timed back to back so drift between them stays small: eager (body + logits),
        PIECEWISE and FULL replay (+ logits), and the LM head alone."""
        runner = self.runner
        detail = self.details.setdefault(w, {})
        t0 = time.perf_counter()

        def timed(mode: str, fn: Callable[[], object]) -> Measurement | None:
            if self._blocked(mode, w):
                return None
            ok, m, message = _attempt(runner, lambda: measure(
                fn, runner.clock, warmup_ms=self.options.warmup_ms, rep_ms=self.options.rep_ms,
                min_reps=self.options.min_reps, max_reps=self.options.max_reps))
            if not ok:
                self._oom(mode, w, message)
                return None
            detail[mode] = _summary(m)
            return m

        rows = []
        eager = None if self._blocked("eager", w) else timed("eager", lambda: runner.eager(w))
        rows.append(ProfileRow(w, "eager", "oom") if eager is None else
                    ProfileRow(w, "eager", "ok", latency_ms=eager.median_ms, latency_iqr_ms=eager.iqr_ms))
        for mode in _GRAPH_MODES:
            if not runner.graphs_supported:
                rows.append(ProfileRow(w, mode, "unsupported"))
                detail[f"{mode}_unsupported"] = runner.unsupported_reason
                continue
            info = self.captures.get((mode, w), {})
            memory = dict(capture_delta_bytes=info.get("capture_delta_bytes"),
                          standalone_bytes=info.get("standalone_bytes"), capture_s=info.get("capture_s"))
            graph = self.graphs.get((mode, w))
            m = None if graph is None else timed(mode, lambda g=graph: runner.replay(g))
            rows.append(ProfileRow(w, mode, "oom", **memory) if m is None else
                        ProfileRow(w, mode, "ok", latency_ms=m.median_ms, latency_iqr_ms=m.iqr_ms, **memory))
        logits = timed("logits", lambda: runner.logits(w))
        rows.append(ProfileRow(w, "logits", "oom") if logits is None else
                    ProfileRow(w, "logits", "ok", latency_ms=logits.median_ms, latency_iqr_ms=logits.iqr_ms))
        detail["seconds"] = round(self.seconds.get(w, 0.0) + time.perf_counter() - t0, 4)
        return rows, detail
