"""The profile sweep: for every candidate width, the graphs captured in vLLM's order (all PIECEWISE largest first,
then all FULL largest first, into one shared pool, each also alone in a fresh pool), then eager, PIECEWISE and
FULL replay and the LM head timed back to back, key widths first, written as the profile table after every width
so an interrupted run resumes where it stopped; plus vLLM's non-KV memory and the eager step's kernels per layer."""

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

from tuner.measure import graphs as _graphs
from tuner.measure import piecewise as _piecewise
from tuner.measure import sweep_plan as _plan
from tuner.measure.decoder import DecodeModel, build_model, out_of_memory_building
from tuner.measure.drafter import DrafterPlan, build_drafter, drafter_plan, pool_sequence
from tuner.measure.kernels import cuda_kernels_per_layer
from tuner.measure.memory import (
    MemorySnapshot,
    device_metadata,
    free_delta_bytes,
    non_kv_memory,
    nvml_delta_bytes,
    snapshot,
)
from tuner.measure.timing import Clock, CudaEventClock, HostClock, Measurement, WallClock, measure
from tuner.profile.host_cost import host_bound_widths
from tuner.profile.table import ProfileError, ProfileRow, mode_order, read_profile, write_metadata, write_profile
from tuner.workload import candidates as _candidates
from tuner.workload.spec import Workload

__all__ = [
    "ASSUMED_CAPTURE_S",
    "CAPTURE_ORDER",
    "DEVICE_BUDGETS",
    "PIECEWISE_NOTE",
    "STAND_IN",
    "SWEEP_MODES",
    "ProfileResult",
    "StepRunner",
    "SweepOptions",
    "candidate_widths",
    "error_text",
    "estimate_sweep_s",
    "first_line",
    "profile_workload",
    "resume_rows",
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
    """The sweep's widths: `tuner.workload.candidates.candidate_widths` with a 128-token stride above the ceiling,
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
        self.host_clock: Clock | None = HostClock(lambda: torch.cuda.synchronize(self.device)) if cuda else None
        """Times the host's share of an eager step (None on a CPU, where the host does all of it)."""
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

    def wall_s(self, fn: Callable[[], object]) -> float:
        """Wall seconds `fn` takes, the device synchronized before and after (what one call costs the sweep)."""
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - t0

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

    def reserve_growth_bytes(self, fn: Callable[[], object]) -> int | None:
        """How far `fn` grows torch's reserved memory from an emptied cache beyond what it keeps allocated, as vLLM
        0.34's `_measure_sizing_step` reads it around its KV-cache sizing steps (fragmentation the allocated peak does
        not show); None off CUDA."""
        if self.device.type != "cuda":
            return None
        self.release(collect=True)
        torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_stats(self.device)
        fn()
        torch.cuda.synchronize(self.device)
        after = torch.cuda.memory_stats(self.device)
        kept = max(after.get("allocated_bytes.all.current", 0) - before.get("allocated_bytes.all.current", 0), 0)
        return int(after.get("reserved_bytes.all.peak", 0) - before.get("reserved_bytes.all.current", 0) - kept)

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
    """Seconds the whole run may take, set-up and compilation included (it can be resumed): with graphs, the widths
    the time left allows are kept as the capture pass reaches them, key widths first and the rest spread evenly
    (`sweep_plan`), each width's cost estimated from the widths measured before it; timing, in the same priority
    order, stops starting widths once the time is up."""
    standalone: bool = True
    """Also capture each width alone in a fresh pool (`standalone_bytes`)."""


DEVICE_BUDGETS = {"cuda": (25.0, 100.0, 5), "cpu": (2.0, 10.0, 3)}
"""`cgtune profile`'s default time budgets per (width, mode) by device: warm-up ms, repetition ms, least repetitions.
A GPU step is short and worth many samples; a CPU run stays within minutes."""


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
    drafter_measured: list[int] = field(default_factory=list)
    """Widths of the drafter's rows measured by this run (resumed widths excluded)."""


def estimate_sweep_s(num_widths: int, options: SweepOptions, *, graphs: bool, num_layers: int,
                     drafter: DrafterPlan | None = None, drafter_widths: int = 0) -> tuple[float, str]:
    """Seconds a sweep of `num_widths` new widths takes at least, and how that is reckoned: every timed mode
    (eager and logits; with graphs also piecewise and full) spends its warm-up and repetition budgets, and every
    graph capture (num_layers + 1 pieces and one full graph per width, twice with standalone captures) is counted
    at ASSUMED_CAPTURE_S; with a `drafter`, its `drafter_widths` new widths likewise (its eager pass, and with
    graphs its graph modes). Steps slower than rep_ms / min_reps, warm-up steps, compilation and model set-up come
    on top: an estimate, not a measurement."""
    budget_s = (options.warmup_ms + options.rep_ms) / 1e3
    copies = 2 if options.standalone else 1
    modes = 4 if graphs else 2
    timed = num_widths * modes
    captures = num_widths * (num_layers + 2) * copies if graphs else 0
    how = f"{num_widths} widths x {modes} timed modes"
    if drafter is not None and drafter_widths:
        drafter_modes = drafter.graph_modes if graphs else ()
        timed += drafter_widths * (1 + len(drafter_modes))
        per_width = sum(drafter.shape.num_layers + 1 if m == "piecewise" else 1 for m in drafter_modes)
        captures += drafter_widths * per_width * copies
        how += f" + {drafter_widths} drafter widths x {1 + len(drafter_modes)}"
    timing_s = timed * budget_s
    capture_s = captures * ASSUMED_CAPTURE_S
    how += f" x {options.warmup_ms:g}+{options.rep_ms:g} ms budgets = {timing_s:.0f} s"
    if captures:
        how += f", + {captures} graph captures at an assumed {ASSUMED_CAPTURE_S * 1e3:g} ms = {capture_s:.0f} s"
    how += "; compilation, set-up and steps slower than their budget come on top"
    return timing_s + capture_s, how


def resume_rows(out_dir: Path, name: str, meta: dict[str, Any], drafter_modes: Sequence[str] = ()
            ) -> tuple[dict[int, list[ProfileRow]], dict[int, list[ProfileRow]], dict[str, Any]]:
    """Rows of the target's widths and of the drafter's (`drafter_modes`: the row modes a finished drafter width has)
    finished by an earlier run of the same measurement, and its metadata; ValueError if it measured another."""
    csv_path = out_dir / f"{name}.csv"
    if not csv_path.exists():
        return {}, {}, {}
    try:
        old = read_profile(csv_path)
    except ProfileError as exc:
        raise ValueError(f"{csv_path}: cannot resume ({exc}); pass --fresh to overwrite") from None
    for key, now in (("workload", meta["workload"]["hash"]), ("device_name", meta["device_name"]),
                     ("compiled", meta["compiled"]), ("context_len", meta["context_len"]),
                     ("capture_order", meta["capture_order"]), ("backend", _backend_label(meta))):
        then = old.metadata.get(key)
        then = then.get("hash") if key == "workload" and isinstance(then, dict) else then
        then = _backend_label(old.metadata) if key == "backend" else then
        if then != now:
            raise ValueError(f"{csv_path}: was measured with {key}={then!r}, this run has {now!r}; "
                             "pass --fresh to overwrite or choose another --out")
    by_width: dict[int, list[ProfileRow]] = {}
    drafter_by_width: dict[int, list[ProfileRow]] = {}
    for row in old.rows:
        (drafter_by_width if row.mode.startswith(_DRAFTER) else by_width).setdefault(row.num_tokens, []).append(row)
    done = {w: rows for w, rows in by_width.items() if {r.mode for r in rows} >= set(SWEEP_MODES)}
    drafter_done = ({w: rows for w, rows in drafter_by_width.items() if {r.mode for r in rows} >= set(drafter_modes)}
                    if drafter_modes else {})
    return done, drafter_done, old.metadata


STAND_IN = {"name": "stand-in"}
"""Metadata `backend` of a profile the stand-in decoder measured (profiles without the key are the stand-in's too)."""


def _backend_label(meta: dict[str, Any]) -> str:
    """The instrument a profile was measured with, as resuming compares it: `stand-in`, or `vllm <version>`."""
    b = meta.get("backend") if isinstance(meta.get("backend"), dict) else STAND_IN
    return " ".join(str(v) for v in (b.get("name"), b.get("version")) if v)


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
    drafter_widths: Sequence[int] | None = None,
    on_width: Callable[[int, int, int], None] | None = None,
) -> ProfileResult:
    """Measure `widths` (default: `candidate_widths`) of the workload on `device` and write
    `out_dir/<name>.csv` and `.json` after every width. `compile` (default: unless the workload sets
    `serving.enforce_eager`) runs the model through torch.compile, compiled once before the first width.

    A workload with a draft model gets its drafter built beside the target (`tuner.measure.drafter`: random
    weights, its own KV cache, the target's embedding and LM head where vLLM shares them), measured at
    `drafter_widths` (default: `drafter_plan`'s) in the graph modes its runner captures it in; `runner_factory`
    makes the drafter's runner too, device actions (pools, memory readings) go through the target's.

    Before the widths: vLLM's non-KV memory (its profiling step; the drafter's weights and pass included, as
    vLLM loads and profiles it in the same block), the eager step's kernels per layer, the activation peaks.
    Then vLLM's capture order into one shared pool: every PIECEWISE step largest first, then every FULL graph
    largest first, the drafter's graphs after them (V2) or each beside the target's PIECEWISE step of its width
    (V1), each width also captured alone in a fresh pool (`options.standalone`); then, largest first, eager,
    PIECEWISE replay, FULL replay and the LM head alone timed back to back with every graph resident, and the
    drafter's rows of the same width after them. An out-of-memory width is marked `oom` in that mode and the
    sweep goes on with smaller ones.

    `on_width(width, in_table, requested)` is called after each width's rows are in the table on disk (`in_table`
    of the `requested` widths, resumed ones included), so a caller reporting progress (`tuner.fleet`) never
    counts a width that a crash right after would lose."""
    options = options or SweepOptions()
    out_dir = Path(out_dir)
    name = name or workload.name
    compile = (not workload.serving.enforce_eager) if compile is None else compile
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("no CUDA device is visible; pass --device cpu to measure the eager path on the CPU")
    requested = validate_sizes(widths, workload) if widths is not None else candidate_widths(workload)
    plan = drafter_plan(workload, requested,
                        widths=None if drafter_widths is None else validate_sizes(drafter_widths, workload))
    started = time.perf_counter()
    meta: dict[str, Any] = {
        **device_metadata(dev),
        "workload": {"name": workload.name, "hash": workload.content_hash,
                     "path": str(workload.path) if workload.path else None},
        "model": {"preset": workload.model.preset, "shape": workload.model.shape.as_dict(),
                  "dtype": workload.model.dtype, "tensor_parallel_size": workload.model.tensor_parallel_size},
        "compiled": compile,
        "capture_order": CAPTURE_ORDER,
        "backend": STAND_IN,
        "context_len": workload.traffic.mean_context_len,
        "decode_query_len": workload.serving.decode_query_len,
        "command": command,
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    done, drafter_done, old_meta = resume_rows(out_dir, name, meta, plan.row_modes if plan else ()) if resume else \
        ({}, {}, {})
    dropped = sorted(set(old_meta.get("widths_requested") or done) - set(requested))
    if plan is not None and not dropped:
        old_drafter = old_meta.get("drafter") if isinstance(old_meta.get("drafter"), dict) else {}
        dropped = sorted(set(old_drafter.get("widths_requested") or drafter_done) - set(plan.widths))
    if dropped:
        # Capture deltas only add up within one width list; resuming may add widths, never drop them.
        raise ValueError(f"{out_dir / name}.csv: was measured with widths this run does not ask for "
                         f"({', '.join(map(str, dropped[:5]))}{', ...' if len(dropped) > 5 else ''}); "
                         "pass --fresh to overwrite or choose another --out/--name")
    pending = [w for w in sorted(requested, reverse=True) if w not in done]
    drafter_pending = [w for w in sorted(plan.widths, reverse=True) if w not in drafter_done] if plan else []

    # vLLM's memory profiling starts from a snapshot taken once CUDA is up and before the weights exist (after a
    # collection, so garbage freed later cannot make the reading smaller).
    _graphs.release_memory(dev, collect=True)
    baseline = snapshot(dev)
    try:
        model = build_model(workload, max(requested), dev, seed=seed, allocate_kv_cache=False)
        # vLLM loads the drafter in the same memory-profiled block as the target, so its weights are non-KV memory.
        drafter = None if plan is None else build_drafter(workload, plan, model, max(plan.widths), seed=seed + 2,
                                                          allocate_kv_cache=False)
        runner = runner_factory(model)
        drafter_runner = None if drafter is None else runner_factory(drafter)
        kv_taken = _allocate_kv_cache(runner, model, drafter)
    except Exception as exc:
        if not _graphs.is_oom(exc):
            raise
        message = out_of_memory_building(workload, max(requested), dev)
    else:
        message = None
    if message is not None:  # raised outside the except block, whose traceback holds what was allocated
        _graphs.release_memory(dev, collect=True)
        raise ValueError(message)
    compile_s = None
    if compile:
        model.compile()
        compile_s = _compile(runner, requested)
        if drafter_runner is not None and drafter is not None:
            drafter.compile()
            compile_s += _compile(drafter_runner, plan.widths, pieces="piecewise" in plan.graph_modes,
                                  what="drafter's pass")
    measurements: dict[str, Any] = dict(old_meta.get("measurements", {}))
    old_drafter_meta = old_meta.get("drafter") if isinstance(old_meta.get("drafter"), dict) else {}
    drafter_measurements: dict[str, Any] = dict(old_drafter_meta.get("measurements", {})) if plan else {}
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
    if plan is not None:
        meta["drafter"] = plan.metadata(drafter)
    meta.update(_non_kv(runner, workload, baseline, kv_taken, drafter))
    meta.update(_activation_peaks(runner, workload, max(requested)))
    if dev.type == "cuda":
        meta["free_memory_bytes"] = runner.memory().free_bytes
        # Where SGLang's KV budget starts: free memory with CUDA up, before any weights (tuner.engines.sglang.memory).
        meta["pre_load_free_bytes"] = baseline.free_bytes

    rows: dict[int, list[ProfileRow]] = dict(done)
    drafter_rows: dict[int, list[ProfileRow]] = dict(drafter_done)
    previous_sweep_s = float(old_meta.get("sweep_s") or 0.0)
    csv_path = out_dir / f"{name}.csv"
    ends, request_widths = _plan.key_widths(workload)
    sweep = _Sweep(runner, options, started, oom_floor={}, drafter_runner=drafter_runner, plan=plan,
                   order=_plan.priority_order(set(pending) | set(drafter_pending), ends, request_widths))

    def write(complete: bool) -> Path:
        # Readings of widths captured but not yet timed go into the metadata too: nothing measured is lost.
        measurements.update((str(w), d) for w, d in sweep.details.items() if w not in rows)
        if plan is not None:
            drafter_measurements.update((str(w), d) for w, d in sweep.drafter_details.items() if w not in drafter_rows)
            meta["drafter"].update(measurements=drafter_measurements, widths_done=sorted(drafter_rows))
        noisy = set(_noisy_widths(measurements, rows)) | set(_noisy_widths(drafter_measurements, drafter_rows))
        meta.update(measurements=measurements, widths_done=sorted(rows), complete=complete,
                    noisy_widths=sorted(noisy), sweep_s=previous_sweep_s + (time.perf_counter() - started),
                    capture_errors=[{"mode": m, "num_tokens": w, "error": e} for (m, w), e in sorted(sweep.errors.items())],
                    widths_left_for_time=sorted(sweep.dropped))
        meta["host_bound_widths"] = host_bound_widths({"measurements": {w: d for w, d in measurements.items()
                                                                        if int(w) in rows}})
        if not rows and not drafter_rows:  # no width finished yet: the metadata alone (compile time, memory)
            write_metadata(out_dir, name, meta)
            return csv_path
        return write_profile(out_dir, name, [r for table in (rows, drafter_rows) for rs in table.values() for r in rs],
                             meta)

    write(complete=False)  # compile time and memory readings are kept even if no width finishes
    measured: list[int] = []
    drafter_measured: list[int] = []
    complete = True
    try:
        drafter_graphs = bool(drafter_pending and plan and plan.graph_modes)
        if runner.graphs_supported and (pending or drafter_graphs):
            pending, drafter_pending = sweep.capture_all(pending, done, drafter_pending, drafter_done)
        # Timed in priority order (key widths first): a sweep stopped early keeps them and an even spread.
        order = [w for w in sweep.order if w in set(pending) | set(drafter_pending)]
        bar = _progress(len(order), name, enabled=progress)
        try:
            for w in order:
                if options.max_seconds is not None and time.perf_counter() - started > options.max_seconds:
                    complete = False
                    log.warning("stopped after %.0f s with %d of %d widths left; rerun the same command to resume",
                                time.perf_counter() - started, len(order) - len(set(measured) | set(drafter_measured)),
                                len(set(requested) | set(plan.widths if plan else ())))
                    break
                bar.set_postfix_str(f"{w} tokens")
                if w in pending:
                    rows[w], measurements[str(w)] = sweep.time_width(w)
                    measured.append(w)
                if w in drafter_pending:
                    drafter_rows[w], drafter_measurements[str(w)] = sweep.time_drafter_width(w)
                    drafter_measured.append(w)
                write(complete=False)
                bar.update(1)
                if on_width is not None:
                    on_width(w, len(set(rows) | set(drafter_rows)),
                             len(set(requested) | set(plan.widths if plan else ())))
        finally:
            bar.close()
        # Counted last, so the profiler's device tracing cannot touch a timing or a memory reading.
        kernel_width = min(workload.serving.decode_query_len, max(requested))
        kernels = runner.kernels_per_layer(kernel_width)
        if kernels is not None:
            kernels["num_tokens"] = kernel_width
            meta.update(eager_kernels_per_layer=kernels["per_layer"], eager_kernels=kernels)
    finally:
        complete = (complete and not sweep.dropped and len(measured) == len(pending)
                    and len(drafter_measured) == len(drafter_pending))
        csv_path = write(complete=complete)
        sweep.graphs.clear()
        sweep.restored.clear()
        runner.release()
    all_rows = sorted((r for table in (rows, drafter_rows) for rs in table.values() for r in rs),
                      key=lambda r: (r.num_tokens, mode_order(r.mode)))
    return ProfileResult(csv_path=csv_path, rows=all_rows, metadata=meta, measured=measured, complete=complete,
                         drafter_measured=drafter_measured)


def _noisy_widths(measurements: dict[str, Any], rows: dict[int, list[ProfileRow]]) -> list[int]:
    """Widths in the table with a timing flagged noisy (IQR / median above 5%) in any mode."""
    noisy = {int(w) for w, detail in measurements.items()
             if any(isinstance(m, dict) and m.get("noisy") for m in detail.values())}
    return sorted(noisy & set(rows))


def _allocate_kv_cache(runner: StepRunner, model: DecodeModel, drafter: DecodeModel | None = None) -> int | None:
    """Allocate the static KV cache (the target's and the drafter's); returns the device memory that took (its
    free-memory drop, None off CUDA), which vLLM's non-KV memory must not include: vLLM allocates its KV cache
    after profiling."""
    runner.release()
    before = runner.memory()
    model.allocate_kv_cache()
    if drafter is not None:
        drafter.allocate_kv_cache()
    after = runner.memory()
    return free_delta_bytes(before, after)


def _compile(runner: StepRunner, widths: Sequence[int], *, pieces: bool = True, what: str = "step") -> float:
    """Compile once, before the first width, as vLLM compiles before it captures: the widest step, the PIECEWISE
    pieces too where graphs will be captured, and width 1 if measured (the token count is unbacked, so no
    compilation of its own is expected; a torch that specialized it would pay for it here, not inside a width).
    Returns the seconds spent (compilation and one run of each). An out-of-memory run is left to the sweep, which
    marks that width."""
    pieces = pieces and runner.graphs_supported
    log.info("compiling the %s%s with torch.compile", what, " and its PIECEWISE pieces" if pieces else "")
    t0 = time.perf_counter()
    for w in sorted({max(widths)} | ({1} & set(widths)), reverse=True):
        _attempt(runner, lambda: runner.eager(w))
        if pieces:
            _attempt(runner, lambda: runner.split_eager(w))
    runner.release()
    return round(time.perf_counter() - t0, 3)


def _non_kv(runner: StepRunner, workload: Workload, baseline: MemorySnapshot, kv_taken: int | None,
            drafter: DecodeModel | None = None) -> dict[str, Any]:
    """vLLM's non-KV memory (`non_kv_cache_bytes`, breakdown in `non_kv`): the drop in free device memory from the
    baseline (CUDA up, no weights) to after vLLM's profiling step, max_num_batched_tokens over max_num_seqs
    requests, plus its transient peak headroom. The KV cache, allocated in between (the decode steps compiled
    before need it), is excluded by subtracting its own free-memory drop. A drafter's weights and buffers count
    (vLLM loads it in the same block), and its pass over the same tokens runs in the profiling step after the
    target's (vLLM's profile run drafts too). None off CUDA."""
    s = workload.serving
    tokens, requests = s.max_num_batched_tokens, min(s.max_num_seqs, s.max_num_batched_tokens)

    def profile_step() -> None:
        runner.model.profile_run(tokens, requests)
        if drafter is not None:
            drafter.profile_run(tokens, requests)

    ok, reading, message = _attempt(runner, lambda: runner.profile_memory(profile_step))
    if message:
        log.warning("vLLM's profiling step ran out of memory; non_kv_cache_bytes left empty: %s", message)
    runner.release(collect=True)  # as vLLM collects and empties the cache before its after-profiling reading
    after = runner.memory()
    models = [runner.model] + ([drafter] if drafter is not None else [])
    breakdown = None
    if ok and reading is not None:
        breakdown = non_kv_memory(baseline, after, kv_cache_bytes=kv_taken, peak_allocated_bytes=reading[0],
                                  allocated_after_bytes=reading[1],
                                  weights_bytes=sum(m.weight_bytes() for m in models),
                                  persistent_buffers_bytes=sum(m.persistent_buffer_bytes() for m in models))
    if breakdown is not None:
        breakdown.update(profile_run_tokens=tokens, profile_run_requests=requests,
                         kv_cache="allocated before the profiling step (compiled decode steps need it); its own "
                                  "free-memory drop is subtracted")
        if drafter is not None:
            breakdown.update(drafter_weights_bytes=drafter.weight_bytes(),
                             drafter="the drafter's own weights and buffers are in weights_bytes and "
                                     "persistent_buffers_bytes (shared embedding/LM head counted once); its pass "
                                     "over the same tokens ran in the profiling step")
    return {"non_kv_cache_bytes": breakdown["non_kv_cache_bytes"] if breakdown else None, "non_kv": breakdown}


def _activation_peaks(runner: StepRunner, workload: Workload, widest: int) -> dict[str, Any]:
    """`activation_peak_bytes`, what the KV budget must leave free besides weights and graphs: the larger of
    the peak of vLLM's memory-profiling step (max_num_batched_tokens fresh tokens over max_num_seqs requests,
    the number vLLM itself subtracts) and the peak of the widest decode step measured (logits for every
    token), which serving needs as well. Both are kept; None on a CPU or when a step ran out of memory. And
    `torch_reserve_growth_bytes`: how far the profiling step grows torch's reservation from an emptied cache."""
    s = workload.serving
    tokens, requests = s.max_num_batched_tokens, min(s.max_num_seqs, s.max_num_batched_tokens)
    ok_run, run_peak, run_oom = _attempt(
        runner, lambda: runner.peak_bytes(lambda: runner.model.profile_run(tokens, requests)))
    ok_step, step_peak, step_oom = _attempt(runner, lambda: runner.peak_bytes(lambda: runner.eager(widest)))
    for what, message in (("profile run", run_oom), ("widest decode step", step_oom)):
        if message:
            log.warning("%s ran out of memory while measuring the activation peak: %s", what, message)
    peaks = [p for p in (run_peak, step_peak) if p is not None]
    # vLLM 0.34 keeps free the larger of the peak and this growth of torch's reservation over its sizing step (the
    # same max_num_batched_tokens step)
    ok_growth, growth, growth_oom = _attempt(
        runner, lambda: runner.reserve_growth_bytes(lambda: runner.model.profile_run(tokens, requests)))
    if growth_oom:
        log.warning("the sizing step ran out of memory while measuring torch's reserve growth: %s", growth_oom)
    return {
        "activation_peak_bytes": max(peaks) if ok_run and ok_step and peaks else None,
        "torch_reserve_growth_bytes": growth if ok_growth else None,
        "activation_peaks": {
            "profile_run_bytes": run_peak, "profile_run_tokens": tokens, "profile_run_requests": requests,
            "decode_step_bytes": step_peak, "decode_step_tokens": widest,
        },
    }


def _progress(total: int, name: str, *, enabled: bool) -> Any:
    from tuner.progress import progress_bar

    return progress_bar(total, f"profile {name}", "width", enabled=enabled, dynamic_ncols=True)


def _summary(m: Measurement) -> dict[str, Any]:
    return {"median_ms": m.median_ms, "iqr_ms": m.iqr_ms, "noisy": m.noisy, "warmup_reps": m.warmup_reps,
            "samples_ms": [round(x, 6) for x in m.samples_ms]}


def first_line(exc: BaseException) -> str:
    """An error's first line (at most 200 characters), or its type's name when it has no text."""
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def error_text(exc: BaseException) -> str:
    """An error as the metadata records it: its type and first line."""
    return f"{type(exc).__name__}: {first_line(exc)}"


def _attempt(runner: StepRunner, fn: Callable[[], Any]) -> tuple[bool, Any, str | None]:
    """Run `fn`; on out-of-memory return `(False, None, message)` after freeing what the failed call held.
    Any other error propagates: only memory exhaustion is a measurement outcome."""
    try:
        return True, fn(), None
    except Exception as exc:
        if not _graphs.is_oom(exc):
            raise
        message = first_line(exc)
    # Released outside the except block: until it ends, the traceback's frames keep the failed call's tensors.
    runner.release(collect=True)
    return False, None, message


_GRAPH_MODES = ("piecewise", "full")  # vLLM's capture order
_DRAFTER = "drafter_"  # the prefix of the drafter's row modes


def _base(mode: str) -> str:
    """What a mode runs, whoever's model it is: `piecewise` for `drafter_piecewise`."""
    return mode.removeprefix(_DRAFTER)


class _Sweep:
    """One run's captures and timings: the graphs it holds, what each capture read, where memory ran out or a capture
    failed, which widths the time allows. Modes are the profile's row modes; `drafter_*` ones run on the drafter's
    runner, device actions (pools, memory readings, releases) always go through the target's."""

    def __init__(self, runner: StepRunner, options: SweepOptions, started: float, oom_floor: dict[str, int], *,
                 drafter_runner: StepRunner | None = None, plan: DrafterPlan | None = None,
                 order: Sequence[int] = ()) -> None:
        self.runner = runner
        self.drafter_runner = drafter_runner
        self.plan = plan
        self.options = options
        self.started = started
        self.oom_floor = oom_floor
        """mode -> the smallest width that ran out of memory in it; it and every larger width are `oom`."""
        self.order = list(order)
        """Every width of this run (the target's and the drafter's), most important first (`sweep_plan`)."""
        self.graphs: dict[tuple[str, int], Any] = {}
        """(mode, width) -> the live graph this run timed or will time."""
        self.restored: list[Any] = []
        """Graphs of widths an earlier run finished, re-captured (untimed) so the pool looks as in one sweep."""
        self.details: dict[int, dict[str, Any]] = {}
        """width -> readings for the metadata's `measurements`."""
        self.drafter_details: dict[int, dict[str, Any]] = {}
        """width -> the drafter's readings, for the metadata's `drafter.measurements`."""
        self.captures: dict[tuple[str, int], dict[str, Any]] = {}
        """(mode, width) -> capture_delta_bytes, standalone_bytes, capture_s of a capture (or its attempt)."""
        self.seconds: dict[int, float] = {}
        """width -> seconds spent capturing it (warm-ups included)."""
        self.graph_s: list[float] = []
        """Seconds each target PIECEWISE capture (alone and shared) took, its warm-up excluded: nearly the same at
        every width (the same graphs), so their mean stands for the widths not captured yet."""
        self.step_s: dict[int, float] = {}
        """width -> wall seconds of the target's eager step there (timed at its warm-up, and once at the smallest
        width before the captures), interpolated between for the widths not measured yet."""
        self.errors: dict[tuple[str, int], str] = {}
        """(mode, width) -> the error (not out of memory) its capture failed with; the sweep went on."""
        self.decided: set[int] = set()
        """Widths the time plan has ruled on (kept or dropped)."""
        self.dropped: set[int] = set()
        """Widths dropped for time: left for a rerun."""

    def _runner(self, mode: str) -> StepRunner:
        if mode.startswith(_DRAFTER):
            assert self.drafter_runner is not None
            return self.drafter_runner
        return self.runner

    def _detail(self, mode: str, w: int) -> dict[str, Any]:
        return (self.drafter_details if mode.startswith(_DRAFTER) else self.details).setdefault(w, {})

    def _cost_s(self, w: int, *, captured: bool) -> float:
        """Seconds width `w` still needs, estimated from what the widths measured so far took: its captures (the
        PIECEWISE graphs unless `captured`, and the FULL graph counted at the PIECEWISE time, which has more graphs;
        the largest measured, so an upper bound) with their eager warm-ups (three steps, two once captured), and
        its timed modes, each at what `measure` spends on its eager step (interpolated between measured widths); a
        drafter's modes, and on V2 its captures, scaled by its share of the target's layers."""
        o = self.options
        step_s = _plan.interpolate(self.step_s, w) or 0.0
        per_mode_s = _plan.measure_seconds(step_s, warmup_ms=o.warmup_ms, rep_ms=o.rep_ms, min_reps=o.min_reps,
                                           max_reps=o.max_reps)
        graph_s = max(self.graph_s, default=0.0)
        captures = (graph_s + 2 * step_s) if captured else (2 * graph_s + 3 * step_s)
        timed = len(SWEEP_MODES) * per_mode_s
        if self.plan is not None:
            share = self.plan.shape.num_layers / max(1, len(self.runner.model.layers))
            timed += len(self.plan.row_modes) * per_mode_s * share
            if self.plan.graph_modes and self.plan.graphs_apart:
                captures *= 1 + share
        return captures + timed

    def _decide(self, w: int, captured: Sequence[int]) -> bool:
        """Whether width `w` (met for the first time in the capture order) is measured by this run. Without a time
        limit, always; else every undecided width >= w is ruled on now: kept when the time left after finishing the
        `captured` widths allows it, taken in priority order (`sweep_plan.priority_order`) with each width's cost
        estimated from the widths measured so far. Before any width is measured, the first is kept while time is
        left (there is nothing to estimate from)."""
        limit = self.options.max_seconds
        if w in self.decided or limit is None:
            return w not in self.dropped
        left_s = limit - (time.perf_counter() - self.started)
        undecided = [u for u in self.order if u not in self.decided]
        if left_s <= 0:
            kept: set[int] = set()
        elif not self.graph_s:
            kept = {w}
        else:
            left_s -= sum(self._cost_s(u, captured=True) for u in captured)
            kept = set(_plan.fit_to_seconds(undecided, lambda u: self._cost_s(u, captured=False), left_s))
        for u in undecided:
            if u >= w:
                self.decided.add(u)
                if u not in kept:
                    self.dropped.add(u)
        return w not in self.dropped

    def _oom(self, mode: str, w: int, message: str | None) -> None:
        self.oom_floor[mode] = min(self.oom_floor.get(mode, w), w)
        self._detail(mode, w)[f"{_base(mode)}_oom"] = message

    def _blocked(self, mode: str, w: int) -> bool:
        return w >= self.oom_floor.get(mode, math.inf)

    def capture_all(self, pending: list[int], done: dict[int, list[ProfileRow]], drafter_pending: Sequence[int] = (),
                    drafter_done: dict[int, list[ProfileRow]] | None = None) -> tuple[list[int], list[int]]:
        """Every pending width's graphs in vLLM's order, into one shared pool (`pool_sequence`): the target's PIECEWISE
        largest first, then its FULL largest first, and the drafter's after all of them (V2) or each right after the
        target's PIECEWISE graph of its width (V1); graphs of widths an earlier run finished are re-captured (untimed)
        in their places. With `max_seconds`, widths the time left does not allow are dropped as the sweep reaches
        them (`_decide`), key widths last. A capture that fails with an error other than out-of-memory is recorded
        for its (mode, width) and the sweep goes on. Returns the target and drafter widths to time."""
        runner = self.runner
        drafter_done = drafter_done or {}
        plan = self.plan
        drafter_modes = plan.graph_modes if plan is not None and self._drafter_graphs_supported() else ()
        drafter_widths = set(drafter_done) | set(drafter_pending) if drafter_modes else set()
        sequence = pool_sequence(plan.runner if plan is not None else "v2", set(done) | set(pending), _GRAPH_MODES,
                                 drafter_widths, drafter_modes)
        pool = runner.new_pool()
        if done or drafter_done:
            log.info("resuming: %d widths already measured; re-capturing their graphs into the shared pool",
                     len(set(done) | set(drafter_done)))
        log.info("capturing the graphs of %d widths%s in vLLM's order into the shared pool", len(pending),
                 f" and of the drafter's {len(drafter_pending)}" if drafter_modes else "")
        asked = (set(pending), set(drafter_pending))
        captured: list[int] = []
        if self.options.max_seconds is not None and pending:
            # One step at the smallest width, so the time plan interpolates step times from both ends.
            smallest = min(pending)
            _attempt(runner, lambda: self.step_s.setdefault(smallest, runner.wall_s(lambda: runner.eager(smallest))))
        for owner, base, w in sequence:
            mode = base if owner == "target" else _DRAFTER + base
            finished = done if owner == "target" else drafter_done
            if w in finished:
                if any(r.mode == mode and r.status == "ok" for r in finished[w]):
                    self._restore(mode, w, pool)
                continue
            if w not in asked[owner != "target"] or not self._decide(w, captured):
                continue
            t0 = time.perf_counter()
            self._capture(mode, w, pool)
            self.seconds[w] = self.seconds.get(w, 0.0) + time.perf_counter() - t0
            if w not in captured:
                captured.append(w)
        if self.dropped:
            log.warning("max_seconds: %d widths left for a rerun (the time left allowed the others, key widths "
                        "first)", len(self.dropped))
        return ([w for w in pending if w not in self.dropped],
                [w for w in drafter_pending if w not in self.dropped])

    def _restore(self, mode: str, w: int, pool: Any) -> None:
        """Re-capture (untimed) the graph of a width an earlier run finished, so the shared pool looks as in one
        sweep; a failure is logged and recorded, never fatal (its rows are kept as they were)."""
        try:
            ok, graph, _ = _attempt(self.runner, lambda: self._warm_and_capture(mode, w, pool))
        except Exception as exc:
            self._detail(mode, w)[f"{_base(mode)}_restore_error"] = error_text(exc)
            log.warning("re-capturing the %s graph of width %d failed: %s", mode, w, error_text(exc))
            self.runner.release(collect=True)
            return
        if ok:
            self.restored.append(graph)

    def _drafter_graphs_supported(self) -> bool:
        return self.drafter_runner is not None and self.drafter_runner.graphs_supported

    def _warm_and_capture(self, mode: str, w: int, pool: Any) -> Any:
        # vLLM runs each size eagerly before capturing it (lazy initialisation, library heuristics, compilation of
        # a new shape), outside the capture.
        r = self._runner(mode)
        r.eager(w)
        if _base(mode) == "piecewise":
            r.split_eager(w)
            return r.capture_piecewise(w, pool)
        return r.capture(w, pool)

    def _capture(self, mode: str, w: int, shared_pool: Any) -> None:
        """Width `w` in `mode` (`_capture_width`); a failure other than running out of memory (an op illegal under
        capture, a recompilation inside one) is recorded for (mode, w), its row says `error`, and the sweep goes
        on: one failed graph must not lose the workload."""
        try:
            self._capture_width(mode, w, shared_pool)
            return
        except Exception as exc:
            self.errors[(mode, w)] = self._detail(mode, w)[f"{_base(mode)}_error"] = error_text(exc)
            log.warning("capturing the %s graph of width %d failed (recorded, the sweep goes on): %s", mode, w,
                        self.errors[(mode, w)])
        # Released outside the except block: until it ends, the traceback's frames keep the failed capture's tensors.
        self.runner.release(collect=True)

    def _warm(self, r: StepRunner, base: str, w: int) -> float:
        """The eager run(s) vLLM makes before capturing a size; returns their wall seconds. The target's eager step
        is timed alone too (synchronized): the time plan sizes the widths left by it."""
        step_s = r.wall_s(lambda: r.eager(w))
        if r is self.runner:
            self.step_s.setdefault(w, step_s)
        return step_s + (r.wall_s(lambda: r.split_eager(w)) if base == "piecewise" else 0.0)

    def _capture_width(self, mode: str, w: int, shared_pool: Any) -> None:
        """Width `w` in `mode`: alone in a fresh pool (standalone_bytes), then into the shared pool (the delta)."""
        runner, r, base = self.runner, self._runner(mode), _base(mode)
        eager_mode = "drafter_eager" if mode.startswith(_DRAFTER) else "eager"
        detail = self._detail(mode, w)
        info: dict[str, Any] = {}
        self.captures[(mode, w)] = info
        if self._blocked(eager_mode, w) or self._blocked(mode, w):
            return
        t0 = time.perf_counter()
        ok, warm_s, message = _attempt(runner, lambda: self._warm(r, base, w))
        if not ok:  # the step itself does not fit: no graph of it can
            self._oom(eager_mode, w, message)
            return
        capture = r.capture_piecewise if base == "piecewise" else r.capture
        key = "capture" if base == "full" else "piecewise_capture"
        if self.options.standalone:
            runner.release()
            before = runner.memory()
            ok, alone, message = _attempt(runner, lambda: capture(w, runner.new_pool()))
            if ok:
                runner.release()  # blocks attention cached between PIECEWISE captures are not graph memory
                after = runner.memory()
                info["standalone_bytes"] = free_delta_bytes(before, after)
                detail["standalone" if base == "full" else "piecewise_standalone"] = {
                    "free_delta_bytes": info["standalone_bytes"], "nvml_delta_bytes": nvml_delta_bytes(before, after)}
                del alone  # frees the graph and, at the next release, its private pool
            else:
                detail[f"{base}_standalone_oom"] = message
        runner.release()
        before = runner.memory()
        ok, graph, message = _attempt(runner, lambda: capture(w, shared_pool))
        if not ok:
            self._oom(mode, w, message)
            return
        runner.release()
        after = runner.memory()
        self.graphs[(mode, w)] = graph
        if mode == "piecewise":
            self.graph_s.append(time.perf_counter() - t0 - warm_s)
        info.update(capture_delta_bytes=free_delta_bytes(before, after), capture_s=round(graph.capture_s, 6))
        detail[key] = {
            "free_delta_bytes": info["capture_delta_bytes"],
            "nvml_delta_bytes": nvml_delta_bytes(before, after),
            "reserved_delta_bytes": None if before.reserved_bytes is None or after.reserved_bytes is None
            else after.reserved_bytes - before.reserved_bytes,
        }

    def _timed(self, mode: str, w: int, fn: Callable[[], object]) -> Measurement | None:
        """`fn` timed with the budgets (None when `mode` is out of memory at `w`, or runs out of it now)."""
        if self._blocked(mode, w):
            return None
        o = self.options
        ok, m, message = _attempt(self.runner, lambda: measure(
            fn, self._runner(mode).clock, warmup_ms=o.warmup_ms, rep_ms=o.rep_ms, min_reps=o.min_reps,
            max_reps=o.max_reps))
        if not ok:
            self._oom(mode, w, message)
            return None
        self._detail(mode, w)[_base(mode)] = _summary(m)
        return m

    def _graph_rows(self, w: int, modes: Sequence[str]) -> list[ProfileRow]:
        """The rows of `w` in each graph mode: its replay (+ logits) timed with its memory readings, `oom` without a
        graph, `unsupported` where graphs cannot be captured."""
        rows = []
        for mode in modes:
            r = self._runner(mode)
            if not r.graphs_supported:
                rows.append(ProfileRow(w, mode, "unsupported"))
                self._detail(mode, w)[f"{_base(mode)}_unsupported"] = r.unsupported_reason
                continue
            info = self.captures.get((mode, w), {})
            memory = dict(capture_delta_bytes=info.get("capture_delta_bytes"),
                          standalone_bytes=info.get("standalone_bytes"), capture_s=info.get("capture_s"))
            if (mode, w) in self.errors:
                rows.append(ProfileRow(w, mode, "error", **memory))
                continue
            graph = self.graphs.get((mode, w))
            m = None if graph is None else self._timed(mode, w, lambda g=graph, r=r: r.replay(g))
            rows.append(ProfileRow(w, mode, "oom", **memory) if m is None else
                        ProfileRow(w, mode, "ok", latency_ms=m.median_ms, latency_iqr_ms=m.iqr_ms, **memory))
        return rows

    def time_width(self, w: int) -> tuple[list[ProfileRow], dict[str, Any]]:
        """Rows for one width, timed back to back so drift between them stays small: eager (body + logits),
        PIECEWISE and FULL replay (+ logits), and the LM head alone."""
        runner = self.runner
        detail = self.details.setdefault(w, {})
        t0 = time.perf_counter()
        rows = []
        eager = None if self._blocked("eager", w) else self._timed("eager", w, lambda: runner.eager(w))
        if eager is not None and runner.host_clock is not None:
            # The host's share of the same step, beside it: whether the eager step is host-bound
            # (tuner.profile.host_cost).
            o = self.options
            ok, host, _ = _attempt(runner, lambda: measure(lambda: runner.eager(w), runner.host_clock, warmup_ms=0,
                                                           rep_ms=0, min_reps=o.min_reps, max_reps=o.min_reps))
            if ok:
                detail["eager_host"] = _summary(host)
        rows.append(ProfileRow(w, "eager", "oom") if eager is None else
                    ProfileRow(w, "eager", "ok", latency_ms=eager.median_ms, latency_iqr_ms=eager.iqr_ms))
        rows += self._graph_rows(w, _GRAPH_MODES)
        logits = self._timed("logits", w, lambda: runner.logits(w))
        rows.append(ProfileRow(w, "logits", "oom") if logits is None else
                    ProfileRow(w, "logits", "ok", latency_ms=logits.median_ms, latency_iqr_ms=logits.iqr_ms))
        detail["seconds"] = round(self.seconds.get(w, 0.0) + time.perf_counter() - t0, 4)
        return rows, detail

    def time_drafter_width(self, w: int) -> tuple[list[ProfileRow], dict[str, Any]]:
        """The drafter's rows for one width, back to back: its eager pass (body + its logits), and its replay
        (+ logits) in each graph mode the runner captures it in."""
        assert self.plan is not None and self.drafter_runner is not None
        r = self.drafter_runner
        detail = self.drafter_details.setdefault(w, {})
        t0 = time.perf_counter()
        eager = self._timed("drafter_eager", w, lambda: r.eager(w))
        rows = [ProfileRow(w, "drafter_eager", "oom") if eager is None else
                ProfileRow(w, "drafter_eager", "ok", latency_ms=eager.median_ms, latency_iqr_ms=eager.iqr_ms)]
        rows += self._graph_rows(w, [_DRAFTER + m for m in self.plan.graph_modes])
        detail["seconds"] = round(time.perf_counter() - t0, 4)
        return rows, detail
