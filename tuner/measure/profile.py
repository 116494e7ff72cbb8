"""The profile sweep: for every candidate width, eager and CUDA-graph step latency measured back to back,
the memory each graph capture adds to one shared pool (largest first, vLLM's order) and takes alone, written
as the profile table after every width so an interrupted run resumes where it stopped."""

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
from tuner.measure.decoder import DTYPES, DecodeModel, ShardShape
from tuner.measure.memory import MemorySnapshot, device_metadata, free_delta_bytes, nvml_delta_bytes, snapshot
from tuner.measure.timing import Clock, CudaEventClock, Measurement, WallClock, measure
from tuner.profile_table import MODES, ProfileError, ProfileRow, read_profile, write_profile
from tuner.workload import Workload

__all__ = [
    "PIECEWISE_NOTE",
    "ProfileResult",
    "StepRunner",
    "SweepOptions",
    "build_model",
    "candidate_widths",
    "profile_workload",
    "thin_widths",
    "validate_sizes",
]

log = logging.getLogger(__name__)

PIECEWISE_NOTE = (
    "piecewise not measured: vLLM's piecewise graphs are Inductor-compiled pieces split at its attention "
    "custom op, with attention writing into a preallocated output; cgtune's pieces would differ in fusion and "
    "copies, so no piecewise number is reported rather than an unfaithful one"
)
"""Why piecewise rows carry status `unsupported`."""

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
def build_model(workload: Workload, max_num_tokens: int, device: torch.device | str, *, seed: int = 0) -> DecodeModel:
    """The workload's decode step for one rank, with a static KV cache at its mean context length."""
    m = workload.model
    return DecodeModel(
        ShardShape.for_rank(m.shape, m.tensor_parallel_size),
        max_num_tokens=max_num_tokens,
        decode_query_len=workload.serving.decode_query_len,
        context_len=workload.traffic.mean_context_len,
        dtype=DTYPES[m.dtype],
        device=device,
        seed=seed,
    )


class StepRunner:
    """Everything the sweep does on the device, one method per action; tests subclass it to script graphs
    and out-of-memory errors on a CPU."""

    def __init__(self, model: DecodeModel, clock: Clock | None = None) -> None:
        self.model = model
        self.device = model.device
        cuda = self.device.type == "cuda"
        self.clock = clock or (CudaEventClock(self.device) if cuda else WallClock())
        self.graphs_supported = cuda
        """Whether `capture` can work here; when False, graph rows are `unsupported`."""
        self.unsupported_reason = None if cuda else _NO_CUDA

    def eager(self, num_tokens: int) -> None:
        self.model.step(num_tokens)

    def new_pool(self) -> Any:
        return _graphs.new_pool()

    def capture(self, num_tokens: int, pool: Any) -> _graphs.CapturedGraph:
        return _graphs.capture(lambda: self.model.forward_hidden(num_tokens), num_tokens, pool=pool)

    def replay(self, graph: _graphs.CapturedGraph) -> None:
        # vLLM replays the graphed body, then computes logits eagerly from the graph's static output.
        graph.replay()
        self.model.logits(self.model.hidden_out[: graph.num_tokens])

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
    """Stop starting new widths after this many seconds (the run can be resumed)."""
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
                     ("compiled", meta["compiled"]), ("context_len", meta["context_len"])):
        then = old.metadata.get(key)
        then = then.get("hash") if key == "workload" and isinstance(then, dict) else then
        if then != now:
            raise ValueError(f"{csv_path}: was measured with {key}={then!r}, this run has {now!r}; "
                             "pass --fresh to overwrite or choose another --out")
    by_width: dict[int, list[ProfileRow]] = {}
    for row in old.rows:
        by_width.setdefault(row.num_tokens, []).append(row)
    done = {w: rows for w, rows in by_width.items() if {r.mode for r in rows} == set(MODES)}
    return done, old.metadata


def profile_workload(
    workload: Workload,
    out_dir: str | Path,
    *,
    widths: Sequence[int] | None = None,
    device: str = "cuda",
    compile: bool = False,
    options: SweepOptions | None = None,
    name: str | None = None,
    command: str = "",
    resume: bool = True,
    seed: int = 0,
    progress: bool = True,
    runner_factory: Callable[[DecodeModel], StepRunner] = StepRunner,
) -> ProfileResult:
    """Measure `widths` (default: `candidate_widths`) of the workload on `device` and write
    `out_dir/<name>.csv` and `.json` after every width. Largest first: each graph is captured into one shared
    pool (vLLM's order) and, if `options.standalone`, alone in a fresh pool; then eager and graph replay are
    timed back to back. An out-of-memory width is marked `oom` and the sweep goes on with smaller ones."""
    options = options or SweepOptions()
    out_dir = Path(out_dir)
    name = name or workload.name
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

    model = build_model(workload, max(requested), dev, seed=seed)
    if compile:
        model.compile()
    runner = runner_factory(model)
    measurements: dict[str, Any] = dict(old_meta.get("measurements", {}))
    meta.update(
        weights_bytes=model.weight_bytes(),
        kv_cache_bytes=model.kv_cache_bytes(),
        attention_kernel=model.attention_kernel,
        graphs=runner.unsupported_reason or "full graphs captured with torch.cuda.CUDAGraph, largest first, "
                                                "one shared pool",
        piecewise=PIECEWISE_NOTE,
        timing={"clock": type(runner.clock).__name__, "warmup_ms": options.warmup_ms, "rep_ms": options.rep_ms,
                "min_reps": options.min_reps, "max_reps": options.max_reps},
        widths_requested=requested,
        first_created_at=old_meta.get("first_created_at", old_meta.get("created_at", meta["created_at"])),
    )
    meta.update(_activation_peaks(runner, workload, max(requested)))
    if dev.type == "cuda":
        meta["free_memory_bytes"] = runner.memory().free_bytes

    rows: dict[int, list[ProfileRow]] = dict(done)
    previous_sweep_s = float(old_meta.get("sweep_s") or 0.0)

    def write(complete: bool) -> Path:
        if not rows:  # stopped before the first width: an empty table is not a profile
            return out_dir / f"{name}.csv"
        meta.update(measurements=measurements, widths_done=sorted(rows), complete=complete,
                    sweep_s=previous_sweep_s + (time.perf_counter() - started))
        return write_profile(out_dir, name, [r for rs in rows.values() for r in rs], meta)

    shared_pool = runner.new_pool() if runner.graphs_supported else None
    live_graphs: list[_graphs.CapturedGraph] = []
    if shared_pool is not None and done and pending:
        # Capture deltas depend on what the pool already holds: re-capture (untimed) the larger widths an
        # earlier run finished, so the widths measured now see the same pool as an uninterrupted sweep.
        restore = [w for w in sorted(done, reverse=True)
                   if w > pending[0] and any(r.mode == "full" and r.status == "ok" for r in done[w])]
        log.info("resuming: %d widths already measured; re-capturing %d into the shared pool", len(done), len(restore))
        for w in restore:
            ok, graph, _ = _attempt(runner, lambda: (runner.eager(w), runner.capture(w, shared_pool))[1])
            if ok:
                live_graphs.append(graph)

    oom_floor: dict[str, int] = {}
    measured: list[int] = []
    complete = True
    csv_path = out_dir / f"{name}.csv"
    bar = _progress(len(pending), name, enabled=progress)
    try:
        for w in pending:
            if options.max_seconds is not None and time.perf_counter() - started > options.max_seconds:
                complete = False
                log.warning("stopped after %.0f s with %d of %d widths left; rerun the same command to resume",
                            time.perf_counter() - started, len(pending) - len(measured), len(requested))
                break
            bar.set_postfix_str(f"{w} tokens")
            width_started = time.perf_counter()
            rows[w], measurements[str(w)] = _measure_width(w, runner, shared_pool, live_graphs, options, oom_floor)
            measurements[str(w)]["seconds"] = round(time.perf_counter() - width_started, 4)
            measured.append(w)
            csv_path = write(complete=False)
            bar.update(1)
    finally:
        bar.close()
        complete = complete and len(measured) == len(pending)
        csv_path = write(complete=complete)
        live_graphs.clear()
        runner.release()
    all_rows = sorted((r for rs in rows.values() for r in rs), key=lambda r: (r.num_tokens, MODES.index(r.mode)))
    return ProfileResult(csv_path=csv_path, rows=all_rows, metadata=meta, measured=measured, complete=complete)


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


def _measure_width(
    w: int,
    runner: StepRunner,
    shared_pool: Any,
    live_graphs: list[_graphs.CapturedGraph],
    options: SweepOptions,
    oom_floor: dict[str, int],
) -> tuple[list[ProfileRow], dict[str, Any]]:
    """Rows for one width: eager, full and piecewise. `oom_floor[mode]` is the smallest width that ran out of
    memory in that mode; it and every larger width are `oom` without another try."""
    detail: dict[str, Any] = {}

    def timed(fn: Callable[[], object]) -> Measurement:
        return measure(fn, runner.clock, warmup_ms=options.warmup_ms, rep_ms=options.rep_ms,
                       min_reps=options.min_reps, max_reps=options.max_reps)

    def oom(mode: str, message: str | None) -> None:
        oom_floor[mode] = min(oom_floor.get(mode, w), w)
        detail[f"{mode}_oom"] = message

    # 1. One eager run first: vLLM warms each size before capturing it (lazy init, library autotuning).
    eager_ok = w < oom_floor.get("eager", math.inf)
    if eager_ok:
        eager_ok, _, message = _attempt(runner, lambda: runner.eager(w))
        if not eager_ok:
            oom("eager", message)

    graph: _graphs.CapturedGraph | None = None
    standalone_bytes = capture_delta = None
    if runner.graphs_supported:
        full_ok = eager_ok and w < oom_floor.get("full", math.inf)
        # 2. Alone in a fresh pool: what this width costs when it is the only (or the largest) graph.
        if full_ok and options.standalone:
            runner.release()
            before = runner.memory()
            ok, alone, message = _attempt(runner, lambda: runner.capture(w, runner.new_pool()))
            if ok:
                after = runner.memory()
                standalone_bytes = free_delta_bytes(before, after)
                detail["standalone"] = {"free_delta_bytes": standalone_bytes,
                                        "nvml_delta_bytes": nvml_delta_bytes(before, after)}
                del alone  # frees the graph and, at the next release, its private pool
            else:
                detail["standalone_oom"] = message
        # 3. Into the shared pool, after every larger width: what it adds to vLLM's capture.
        if full_ok:
            runner.release()
            before = runner.memory()
            ok, graph, message = _attempt(runner, lambda: runner.capture(w, shared_pool))
            if ok:
                after = runner.memory()
                live_graphs.append(graph)
                capture_delta = free_delta_bytes(before, after)
                detail["capture"] = {
                    "free_delta_bytes": capture_delta,
                    "nvml_delta_bytes": nvml_delta_bytes(before, after),
                    "reserved_delta_bytes": None if before.reserved_bytes is None or after.reserved_bytes is None
                    else after.reserved_bytes - before.reserved_bytes,
                }
            else:
                oom("full", message)
    else:
        detail["full_unsupported"] = runner.unsupported_reason

    # 4. Eager and graph timings back to back, so drift between them stays small.
    eager = ProfileRow(w, "eager", "oom")
    if eager_ok:
        ok, m, message = _attempt(runner, lambda: timed(lambda: runner.eager(w)))
        if ok:
            detail["eager"] = _summary(m)
            eager = ProfileRow(w, "eager", "ok", latency_ms=m.median_ms, latency_iqr_ms=m.iqr_ms)
        else:
            oom("eager", message)
    if not runner.graphs_supported:
        full = ProfileRow(w, "full", "unsupported")
    elif graph is None:
        full = ProfileRow(w, "full", "oom", standalone_bytes=standalone_bytes)
    else:
        g = graph
        ok, m, message = _attempt(runner, lambda: timed(lambda: runner.replay(g)))
        if ok:
            detail["full"] = _summary(m)
            full = ProfileRow(w, "full", "ok", latency_ms=m.median_ms, latency_iqr_ms=m.iqr_ms,
                              capture_delta_bytes=capture_delta, standalone_bytes=standalone_bytes,
                              capture_s=round(graph.capture_s, 6))
        else:
            oom("full", message)
            full = ProfileRow(w, "full", "oom", capture_delta_bytes=capture_delta, standalone_bytes=standalone_bytes,
                              capture_s=round(graph.capture_s, 6))
    piecewise = ProfileRow(w, "piecewise", "unsupported")
    return [eager, full, piecewise], detail
