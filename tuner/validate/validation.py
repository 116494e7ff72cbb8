"""The decision GPU validation records: each list's measured graph memory and step latency (from a
`tuner.validate.backend` device replaying a `tuner.validate.trace` trace) held to the cost model's predictions, whether
it fits the engine's memory conditions by measurement, which list ships, and validation.json."""

from __future__ import annotations

import datetime as _dt
import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tuner import __version__
from tuner.model.costmodel import GIB, CostModel, Evaluation
from tuner.profile.table import atomic_write_text
from tuner.steps import Step
# validate_run and validate_candidates look require_cuda and build_backend up on this module, so a command or a test
# may replace them here (a CPU rehearsal, a scripted device).
from tuner.validate.backend import CaptureResult, ReplayBackend, ValidationError, build_backend, require_cuda
from tuner.validate.trace import PlannedStep, dispatch_counts, plan_trace, predicted_trace_step_ms, sample_trace
from tuner.validate.trace import step_statistics

if TYPE_CHECKING:
    from tuner.search.study import SearchResult
    from tuner.validate.served_load import ServedLoad
    from tuner.workload.spec import Workload

__all__ = [
    "LATENCY_GOAL",
    "MEMORY_GOAL",
    "MEMORY_MARGIN",
    "PARTIAL_FILE",
    "VALIDATION_FILE",
    "ListValidation",
    "ValidationError",
    "build_backend",
    "build_instrument",
    "build_record",
    "choose_measured",
    "compare_list",
    "exact_run",
    "finish_validation",
    "lists_to_validate",
    "shipped_list",
    "partial_writer",
    "refuse_unvalidated",
    "require_cuda",
    "top_candidates",
    "validate_candidates",
    "validate_lists",
    "validate_run",
    "write_validation",
]

log = logging.getLogger(__name__)

VALIDATION_FILE = "validation.json"
PARTIAL_FILE = "validation.partial.json"
"""The lists measured so far, rewritten after each one and removed when validation.json is written: a run killed
midway (out of device time, a device error) still leaves what it measured. It chooses and emits nothing."""
MEMORY_GOAL = 0.05
"""Predicted graph memory should be within this share of the measured pool."""
LATENCY_GOAL = 0.03
"""Predicted mean step latency (same trace) should be within this share of the measured mean."""
MEMORY_MARGIN = 0.05
"""When the measured pool exceeds the prediction by more than this share, the run warns loudly and the fit check
adds this share of the measured pool on top: the model was shown wrong, so vLLM's real pool may be larger too."""


# ---------------------------------------------------------------------------------------------- comparison
@dataclass
class ListValidation:
    """One list: the cost model's predictions next to what the device measured."""

    name: str
    """`default`, `tuned`, `exact` or `candidate-N`."""
    capture_sizes: tuple[int, ...]
    """The list."""
    num_graphs: int
    """Graphs vLLM captures for it (mixed + FULL decode)."""
    predicted_graph_bytes: int
    """Cost model: graph memory of the graphs captured here (the target's; a drafter's are `drafter_graph_bytes`)."""
    measured_graph_bytes: int | None
    """Device: free-memory delta around capturing every graph into one pool (None: not measurable, or OOM)."""
    predicted_step_ms: float
    """Cost model: expected step latency over the workload's distribution."""
    predicted_trace_step_ms: float
    """Cost model: mean latency of the very steps replayed."""
    measured_step_ms: float
    """Device: mean latency of the replayed steps."""
    p50_step_ms: float
    """Device: median step latency."""
    p99_step_ms: float
    """Device: 99th-percentile step latency."""
    tokens_per_s: float
    """Device: real tokens per second over the trace."""
    kv_available_bytes: int | None
    """KV cache vLLM sizes with the measured estimate (the predicted one when it could not be measured)."""
    required_kv_bytes: int
    """KV the deployment needs."""
    dispatch: dict[str, int]
    """Steps per runtime mode and padding tokens (dispatch_counts)."""
    by_graph: list[dict[str, Any]] = field(default_factory=list)
    """Per distinct (mode, width run): steps, predicted ms, measured mean ms."""
    nvml_graph_bytes: int | None = None
    """Device: the same pool through NVML."""
    reserved_graph_bytes: int | None = None
    """Device: torch reserved-memory growth."""
    capture_s: float = 0.0
    """Seconds spent warming up and capturing."""
    residual_bytes: int | None = None
    """Memory not given back after releasing this list's graphs."""
    oom: str | None = None
    """Capture ran out of memory on the device (the list does not fit)."""
    predicted_estimate_bytes: int = 0
    """Cost model: vLLM's graph-memory estimate for the runner, of the graphs captured here (the target's)."""
    measured_estimate_bytes: int | None = None
    """Device: the estimate taken as the runner takes it (its samples in throwaway pools); None: not measured."""
    capture_headroom_bytes: int | None = None
    """estimate + total - requested - measured pool (safety margin included): < 0, the real capture runs out."""
    warnings: list[str] = field(default_factory=list)
    """What a user must not miss."""
    drafter_graph_bytes: int = 0
    """Cost model: the drafter's graphs' share of the pool; not captured here, so added to the measured pool for
    the fit check (`predicted_graph_bytes` and `measured_graph_bytes` are the target's alone)."""
    drafter_estimate_bytes: int = 0
    """Cost model: the drafter's share of vLLM's estimate, added to the measured estimate for the fit check."""
    predicted_drafter_step_ms: float = 0.0
    """Cost model: the drafter's passes' share of `predicted_step_ms`; not replayed, so not in the trace comparison."""
    predicted_kv_bytes: int | None = None
    """Cost model: the KV cache the engine sizes for the list (its rule, the predicted estimate or pool)."""
    measured_kv_bytes: int | None = None
    """The engine itself: the KV cache it allocated for the list (blocks x block size x bytes per token); None where
    validation did not run the engine (the stand-in)."""
    load: dict[str, Any] | None = None
    """`validate --rate`: the load the engine served under the list against the load model's prediction of the same
    requests (`tuner.validate.served_load.compare_load`: TPOT, ITL, TTFT, throughput); None without a load."""
    engine: dict[str, Any] | None = None
    """What vLLM's engine said of the list (`tuner.validate.vllm_backend`): the lists its config kept, its KV blocks,
    estimate and pool, its dispatch of the trace against the plan; None with the stand-in."""

    @property
    def memory_error(self) -> float | None:
        """predicted / measured - 1 (negative: the model under-predicts)."""
        if self.measured_graph_bytes is None or self.measured_graph_bytes <= 0:
            return None
        return self.predicted_graph_bytes / self.measured_graph_bytes - 1.0

    @property
    def estimate_error(self) -> float | None:
        """predicted estimate / measured estimate - 1."""
        if self.measured_estimate_bytes is None or self.measured_estimate_bytes <= 0:
            return None
        return self.predicted_estimate_bytes / self.measured_estimate_bytes - 1.0

    @property
    def latency_error(self) -> float:
        """predicted (same trace) / measured - 1."""
        return self.predicted_trace_step_ms / self.measured_step_ms - 1.0 if self.measured_step_ms > 0 else math.inf

    @property
    def kv_error(self) -> float | None:
        """predicted KV cache / the engine's - 1 (None without the engine's figure)."""
        if self.measured_kv_bytes is None or self.measured_kv_bytes <= 0 or self.predicted_kv_bytes is None:
            return None
        return self.predicted_kv_bytes / self.measured_kv_bytes - 1.0

    @property
    def fits(self) -> bool:
        """The device could capture it, vLLM's estimate leaves the required KV cache, and the measured pool fits
        beside it; where the engine itself ran the list, it started (its capture fit) with the required KV cache."""
        if self.measured_kv_bytes is not None:
            return self.oom is None and self.measured_kv_bytes >= self.required_kv_bytes
        return (self.oom is None and self.kv_available_bytes is not None
                and self.kv_available_bytes >= self.required_kv_bytes
                and self.capture_headroom_bytes is not None and self.capture_headroom_bytes >= 0)

    def as_dict(self) -> dict[str, Any]:
        return {
            "capture_sizes": list(self.capture_sizes),
            "num_graphs": self.num_graphs,
            "predicted_graph_bytes": self.predicted_graph_bytes,
            "measured_graph_bytes": self.measured_graph_bytes,
            "nvml_graph_bytes": self.nvml_graph_bytes,
            "reserved_graph_bytes": self.reserved_graph_bytes,
            "memory_error": self.memory_error,
            "predicted_step_ms": self.predicted_step_ms,
            "predicted_trace_step_ms": self.predicted_trace_step_ms,
            "measured_step_ms": self.measured_step_ms,
            "latency_error": self.latency_error,
            "p50_step_ms": self.p50_step_ms,
            "p99_step_ms": self.p99_step_ms,
            "tokens_per_s": self.tokens_per_s,
            "predicted_estimate_bytes": self.predicted_estimate_bytes,
            "measured_estimate_bytes": self.measured_estimate_bytes,
            "estimate_error": self.estimate_error,
            "kv_available_bytes": self.kv_available_bytes,
            "required_kv_bytes": self.required_kv_bytes,
            "capture_headroom_bytes": self.capture_headroom_bytes,
            "fits": self.fits,
            "oom": self.oom,
            "capture_s": self.capture_s,
            "residual_bytes": self.residual_bytes,
            "dispatch": dict(self.dispatch),
            "by_graph": list(self.by_graph),
            "warnings": list(self.warnings),
            "drafter_graph_bytes": self.drafter_graph_bytes,
            "drafter_estimate_bytes": self.drafter_estimate_bytes,
            "predicted_drafter_step_ms": self.predicted_drafter_step_ms,
            "predicted_kv_bytes": self.predicted_kv_bytes,
            "measured_kv_bytes": self.measured_kv_bytes,
            "kv_error": self.kv_error,
            "load": self.load,
            "engine": self.engine,
        }


def target_memory(model: CostModel, evaluation: Evaluation) -> tuple[int, int]:
    """(pool, vLLM's estimate) the cost model predicts for the list's TARGET graphs alone: what validation captures.
    The drafter's share is the rest of `evaluation`'s (0 without a draft model)."""
    costs = [g for g in model.graph_costs(evaluation.capture_sizes) if g.owner == "target"]
    return int(round(model.engine.pool_bytes(costs))), int(round(model.engine.estimate_bytes(costs)))


def compare_list(model: CostModel, name: str, evaluation: Evaluation, plan: Sequence[PlannedStep],
                 samples_ms: Sequence[float], capture: CaptureResult, *, residual_bytes: int | None = None,
                 margin: float = MEMORY_MARGIN, measured_estimate_bytes: int | None = None,
                 engine: dict[str, Any] | None = None) -> ListValidation:
    """Put a list's measurements next to the model's predictions, decide whether it fits vLLM's two conditions
    with the measured numbers (its estimate leaves the required KV cache; the measured pool fits beside it), and
    say loudly when the measured pool exceeds the prediction by more than `margin`.

    Only the target's steps are replayed (predicted_trace_step_ms is theirs). The stand-in captures only the target's
    graphs: predictions are compared on the target's graphs alone, and for the fit check the drafter's predicted
    graph memory is added to the measured pool and its share of vLLM's estimate to the measured estimate (nothing of
    it was measured here). Where vLLM's engine built the drafter beside the target (`engine["drafter_class"]`), its
    pool and estimate hold the drafter's graphs: they are compared with the whole list's predictions, nothing added.

    `engine`: what vLLM's engine said of the list where it ran it (`VllmReplayBackend.engine_record`); its KV cache
    is then the measured one, and its start the capture condition."""
    stats = step_statistics(samples_ms, plan) if samples_ms else {
        "measured_step_ms": math.nan, "p50_step_ms": math.nan, "p99_step_ms": math.nan, "tokens_per_s": math.nan}
    predicted = predicted_trace_step_ms(model, plan) if plan else []
    groups: dict[tuple[str, int], list[int]] = {}
    for i, p in enumerate(plan):
        groups.setdefault(p.key, []).append(i)
    by_graph = []
    if samples_ms:
        for (mode, width), idx in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
            by_graph.append({"mode": mode, "width": width, "steps": len(idx),
                             "predicted_ms": float(np.mean([predicted[i] for i in idx])),
                             "measured_ms": float(np.mean([samples_ms[i] for i in idx]))})
    warnings: list[str] = []
    measured = capture.free_delta_bytes
    b = model.budget
    predicted_pool, predicted_estimate = target_memory(model, evaluation)
    drafter_pool = int(evaluation.graph_memory_bytes) - predicted_pool
    drafter_estimate = int(evaluation.profiled_estimate_bytes) - predicted_estimate
    if engine and engine.get("drafter_class"):  # measured with the drafter's graphs in: nothing to add
        predicted_pool, predicted_estimate = int(evaluation.graph_memory_bytes), int(evaluation.profiled_estimate_bytes)
        drafter_pool = drafter_estimate = 0
    estimate = (measured_estimate_bytes + drafter_estimate if measured_estimate_bytes is not None
                else evaluation.profiled_estimate_bytes)
    kv_available = headroom = None
    if capture.oom is not None:
        warnings.append(f"{name}: capture ran out of memory on the device ({capture.oom}); this list does not fit "
                        f"and is never emitted")
    elif measured is not None:
        charged = measured
        if measured > predicted_pool * (1 + margin):
            charged = int(measured * (1 + margin))
            warnings.append(
                f"{name}: MEASURED GRAPH MEMORY {measured / GIB:.3f} GiB EXCEEDS THE PREDICTION "
                f"{predicted_pool / GIB:.3f} GiB by "
                f"{measured / max(1, predicted_pool) - 1:.1%} "
                f"(margin {margin:.0%}): the fit check charges {charged / GIB:.3f} GiB")
        charged += drafter_pool  # the drafter's graphs, not captured here, at their predicted memory
        kv_available, headroom = model.memory_conditions(charged, estimate, evaluation.runs_as)
        if kv_available < b.required_kv_bytes:
            warnings.append(f"{name}: vLLM's graph-memory estimate ({estimate / GIB:.3f} GiB) leaves a KV cache of "
                            f"{kv_available / GIB:.2f} GiB < required {b.required_kv_bytes / GIB:.2f} GiB: vLLM "
                            f"would refuse to start; this list is never emitted")
        if headroom < 0:
            warnings.append(f"{name}: the measured pool ({charged / GIB:.3f} GiB) exceeds vLLM's estimate plus the "
                            f"memory it does not request by {-headroom / GIB:.3f} GiB: the capture would run out of "
                            f"memory; this list is never emitted")
    measured_kv = engine.get("kv_cache_bytes") if engine and engine.get("started") else None
    if measured_kv is not None:
        kept = {f: list(v) for f, v in model.engine.config_lists(evaluation.runs_as)}
        engine["lists_as_predicted"] = all(engine["lists_kept"].get(f) == v for f, v in kept.items())
        if not engine["lists_as_predicted"]:
            warnings.append(f"{name}: vLLM kept {engine['lists_kept']} of the list, the model predicted {kept}")
        if measured_kv < b.required_kv_bytes:
            warnings.append(f"{name}: vLLM's engine allocated a KV cache of {measured_kv / GIB:.3f} GiB < required "
                            f"{b.required_kv_bytes / GIB:.3f} GiB: this list is never emitted")
    if measured_estimate_bytes is not None and measured_estimate_bytes > 0:
        err = predicted_estimate / measured_estimate_bytes - 1
        if abs(err) > MEMORY_GOAL:
            warnings.append(f"{name}: predicted vLLM estimate {predicted_estimate / GIB:.3f} GiB is "
                            f"{err:+.1%} off the measured {measured_estimate_bytes / GIB:.3f} GiB (goal "
                            f"{MEMORY_GOAL:.0%})")
    return ListValidation(
        name=name,
        capture_sizes=tuple(evaluation.capture_sizes),
        num_graphs=len(model.graphs(evaluation.capture_sizes)),
        predicted_graph_bytes=predicted_pool,
        measured_graph_bytes=measured,
        predicted_step_ms=float(evaluation.expected_step_ms),
        predicted_trace_step_ms=float(np.mean(predicted)) if predicted else math.nan,
        kv_available_bytes=kv_available,
        required_kv_bytes=b.required_kv_bytes,
        dispatch=dispatch_counts(plan),
        by_graph=by_graph,
        nvml_graph_bytes=capture.nvml_delta_bytes,
        reserved_graph_bytes=capture.reserved_delta_bytes,
        capture_s=capture.capture_s,
        residual_bytes=residual_bytes,
        oom=capture.oom,
        predicted_estimate_bytes=predicted_estimate,
        measured_estimate_bytes=measured_estimate_bytes,
        capture_headroom_bytes=headroom,
        warnings=warnings,
        drafter_graph_bytes=drafter_pool,
        drafter_estimate_bytes=drafter_estimate,
        predicted_drafter_step_ms=float(evaluation.drafter_step_ms),
        predicted_kv_bytes=int(evaluation.kv_available_bytes),
        measured_kv_bytes=int(measured_kv) if measured_kv is not None else None,
        load=engine.pop("load", None) if engine else None,
        engine=engine,
        **stats,
    )


def validate_lists(model: CostModel, lists: dict[str, Evaluation], backend: ReplayBackend, *, num_steps: int = 3000,
                   seed: int = 0, margin: float = MEMORY_MARGIN, progress: Callable[[str], None] | None = None,
                   measured: Callable[[list[Step], dict[str, ListValidation], dict[str, Any]], None] | None = None,
                   ) -> tuple[list[Step], dict[str, ListValidation], dict[str, Any]]:
    """For each list in turn: capture exactly its graphs in one pool in vLLM's order, read the pool's memory,
    replay the same seeded trace dispatched as vLLM would, release the graphs; then compare with the model.
    Returns the replayed trace, the per-list results and what was sampled versus replayed: steps wider than the
    backend can run are left out of every list alike (they run eager under all of them). `measured` is called with
    the same three after each list (the partial record)."""
    sampled = sample_trace(model.workload.steps(), num_steps, seed)
    cap = getattr(backend, "max_num_tokens", None)
    trace = [s for s in sampled if cap is None or s.num_tokens <= cap]
    if not trace:
        raise ValidationError(f"every sampled step is wider than the {cap} tokens the decode model was built for")
    info = {"sampled": len(sampled), "replayed": len(trace), "excluded": len(sampled) - len(trace),
            "max_num_tokens": cap}
    if info["excluded"]:
        log.warning("%d of %d sampled steps are wider than %d tokens and are left out of every list's replay",
                    info["excluded"], len(sampled), cap)
    out: dict[str, ListValidation] = {}
    by_sizes: dict[tuple[int, ...], ListValidation] = {}
    for name, evaluation in lists.items():
        sizes = evaluation.capture_sizes
        if sizes in by_sizes:  # e.g. the tuned list is vLLM's default: one measurement stands for both
            import dataclasses

            out[name] = dataclasses.replace(by_sizes[sizes], name=name)
            continue
        dispatcher = model.engine.dispatcher(sizes)
        graphs = model.graphs(sizes)
        plan = plan_trace(trace, dispatcher)
        open_list = getattr(backend, "open_list", None)
        if open_list is not None:  # the engine itself, built for this list, the plan replayed through it
            if progress:
                progress(f"{name}: vLLM with the list ({model.engine.list_shape(sizes)}): start, replay "
                         f"{len(plan)} steps")
            open_list(name, evaluation, plan)
        elif progress:
            progress(f"{name}: capturing {len(graphs)} graphs, max {model.engine.list_max(sizes)}")
        estimate = None
        measure_estimate = getattr(backend, "measure_estimate", None)
        if measure_estimate is not None and model.engine.makes_estimate:  # the KV cache is sized from it
            if progress:
                progress(f"{name}: measuring vLLM's {model.runner.upper()} graph-memory estimate")
            estimate = measure_estimate(graphs, model.runner)
        capture = backend.capture(graphs)
        samples: list[float] = []
        if capture.oom is None:
            if progress:
                progress(f"{name}: replaying {len(plan)} steps")
            samples = backend.time_steps(plan)
        residual = backend.release()
        engine_record = getattr(backend, "engine_record", None)
        out[name] = by_sizes[sizes] = compare_list(model, name, evaluation, plan, samples, capture,
                                                   residual_bytes=residual, margin=margin,
                                                   measured_estimate_bytes=estimate,
                                                   engine=engine_record() if engine_record is not None else None)
        for w in out[name].warnings:
            log.warning(w)
        if measured is not None:
            measured(trace, out, info)
    return trace, out, info


# ---------------------------------------------------------------------------------------------- decisions
def choose_measured(results: dict[str, ListValidation]) -> ListValidation | None:
    """The list with the lowest measured mean step latency among those whose measured memory fits (None: none)."""
    fitting = [r for r in results.values() if r.fits and math.isfinite(r.measured_step_ms)]
    return min(fitting, key=lambda r: r.measured_step_ms) if fitting else None


def lists_to_validate(search: SearchResult, shipped: Evaluation | None = None) -> dict[str, Evaluation]:
    """default and tuned, the exact optimum when it differs from both, and the list the run's files ship (`shipped`:
    the compact list, when the ship policy chose it) when it is none of them: the shipped list is always measured."""
    lists = {"default": search.default, "tuned": search.chosen}
    exact = search.exact.best
    if exact.capture_sizes not in (search.default.capture_sizes, search.chosen.capture_sizes):
        lists["exact"] = exact
    if shipped is not None and shipped.capture_sizes not in [e.capture_sizes for e in lists.values()]:
        lists["compact"] = shipped
    return lists


def shipped_list(run: Path, model: CostModel, search: SearchResult) -> tuple[str, Evaluation]:
    """(the name validation gives the list the run's files carry, its evaluation): `tuned`, or `compact` where the
    ship policy chose the compact list (summary.json's `shipped`)."""
    from tuner.decision.run_dir import recorded_summary

    shipped = recorded_summary(run).get("shipped")
    sizes = tuple(shipped["capture_sizes"]) if isinstance(shipped, dict) and "capture_sizes" in shipped else None
    if sizes is None or model.evaluate(sizes).capture_sizes == search.chosen.capture_sizes:
        return "tuned", search.chosen
    return "compact", model.evaluate(sizes)


def build_record(model: CostModel, backend_meta: dict[str, Any], trace: Sequence[Step],
                 results: dict[str, ListValidation], *, seed: int, command: str = "",
                 emitted: str | None = None, notes: Sequence[str] = (),
                 trace_info: dict[str, Any] | None = None, margin: float = MEMORY_MARGIN) -> dict[str, Any]:
    """validation.json: device, profile, workload, the trace, and per list predicted vs measured; `goals.margin` is
    the memory margin the lists were judged with (`margin`)."""
    meta = model.profile.metadata
    record: dict[str, Any] = {
        "device_name": backend_meta.get("device_name"),
        "device": backend_meta,
        "profile": {"path": str(model.profile.path) if model.profile.path else None,
                    "device_name": meta.get("device_name"), "command": meta.get("command"),
                    "created_at": meta.get("created_at"), "compiled": meta.get("compiled")},
        "workload": {"name": model.workload.name, "hash": model.workload.content_hash},
        "command": command,
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "cgtune_version": __version__,
        "trace": {"steps": len(trace), "seed": seed,
                  "mean_tokens": float(np.mean([s.num_tokens for s in trace])) if trace else 0.0,
                  "uniform_decode_share": float(np.mean([s.uniform_decode for s in trace])) if trace else 0.0,
                  **(trace_info or {})},
        "goals": {"memory": MEMORY_GOAL, "latency": LATENCY_GOAL, "margin": margin},
        "lists": list(results),
        "emitted": emitted,
        "warnings": [w for r in results.values() for w in r.warnings],
        "notes": list(notes),
    }
    if model.drafter is not None and any((r.engine or {}).get("drafter_class") for r in results.values()):
        record["notes"].append(
            f"the {model.drafter.method} drafter ran in vLLM's engine beside the target: its graphs are in the "
            f"engine's pool and estimate, compared with the whole list's predictions; the replayed trace is the target's steps "
            f"(the drafter's pass left out, as in the profile's target rows and predicted_trace_step_ms); the served "
            f"load (--rate) runs the real steps, drafts included")
    elif model.drafter is not None:
        record["notes"].append(
            f"the {model.drafter.method} drafter is not replayed: only the target's graphs are captured and its steps "
            f"timed, so the memory and latency errors are the target's; the drafter's passes are in the model's "
            f"predicted_step_ms (its share: predicted_drafter_step_ms) but not in predicted_trace_step_ms, and for the "
            f"fit check its predicted graph memory (drafter_graph_bytes) is added to the measured pool and its share "
            f"of vLLM's estimate (drafter_estimate_bytes) to the measured estimate")
    if meta.get("device_name") != backend_meta.get("device_name"):
        record["warnings"].append(f"profile measured on {meta.get('device_name')!r}, validated on "
                                  f"{backend_meta.get('device_name')!r}: latency predictions are for another device")
    for name, r in results.items():
        record[name] = r.as_dict()
    d, t = results.get("default"), results.get("tuned")
    if d is not None and t is not None and t.measured_step_ms > 0 and math.isfinite(d.measured_step_ms):
        record["measured_speedup_tuned_over_default"] = d.measured_step_ms / t.measured_step_ms
        record["predicted_speedup_tuned_over_default"] = d.predicted_trace_step_ms / t.predicted_trace_step_ms
    return record


def write_validation(run_dir: str | Path, record: dict[str, Any], name: str = VALIDATION_FILE) -> Path:
    """Write RUN_DIR/validation.json (or `name`) atomically (NaN written as null, so any JSON reader takes it)."""
    def clean(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [clean(v) for v in x]
        return x

    path = Path(run_dir) / name
    atomic_write_text(path, json.dumps(clean(record), indent=2, default=str) + "\n")
    return path


def partial_writer(run_dir: str | Path, model: CostModel, backend: ReplayBackend, lists: dict[str, Evaluation], *,
                   seed: int, command: str, margin: float = MEMORY_MARGIN
                   ) -> Callable[[list[Step], dict[str, ListValidation], dict[str, Any]], None]:
    """`validate_lists`' `measured` callback: RUN_DIR/validation.partial.json holds the lists measured so far (a
    stale one from an earlier run is removed first); `finish_validation` removes it."""
    path = Path(run_dir) / PARTIAL_FILE
    path.unlink(missing_ok=True)

    def write(trace: list[Step], results: dict[str, ListValidation], info: dict[str, Any]) -> None:
        note = (f"partial: {len(results)} of {len(lists)} lists measured when this was written; the run ended before "
                f"the rest, so nothing was chosen or emitted")
        record = build_record(model, backend.metadata(), trace, results, seed=seed, command=command, trace_info=info,
                              margin=margin, notes=[note])
        record["partial"] = True
        record["pending"] = [name for name in lists if name not in results]
        write_validation(run_dir, record, PARTIAL_FILE)

    return write


def finish_validation(run_dir: str | Path, record: dict[str, Any]) -> Path:
    """Write validation.json and drop the partial record it supersedes."""
    path = write_validation(run_dir, record)
    (Path(run_dir) / PARTIAL_FILE).unlink(missing_ok=True)
    return path


# ---------------------------------------------------------------------------------------------- orchestration
def _emit(run_dir: Path, model: CostModel, search: SearchResult, chosen: Evaluation | None, note: str,
          kv_pin: dict[str, Any] | None = None) -> None:
    """Re-write the run directory's vLLM files (and report) for `chosen` (None: the list its search chose), keeping
    everything else (`kv_pin`: the KV cache its files pin, `tuner.validate.pin_kv`)."""
    import dataclasses

    from tuner.decision.record import decide
    from tuner.report.run import write_run

    replaced = dataclasses.replace(search, chosen=chosen if chosen is not None else search.chosen,
                                   notes=list(search.notes) + [note])
    if search.load_record is not None:
        # The search ran under a load (--rate): the lists, the emitted one now among them, are put under it again.
        from tuner.search.load_aware import recorded_load_search

        replaced = dataclasses.replace(replaced, load_search=recorded_load_search(model, search.load_record))
    write_run(run_dir, model, decide(model, replaced), command="cgtune validate", copy_inputs=False, kv_pin=kv_pin)


def _pin(run: Path, model: CostModel, search: SearchResult, lists: dict[str, Evaluation],
         results: dict[str, ListValidation], emitted: str | None) -> tuple[dict[str, Any] | None, str]:
    """`--pin-kv`: pin the emitted list's KV cache at what the engine measured for it (`pin_kv`) and re-render the
    run's files with it; (the pin, or None; what happened, in words)."""
    from tuner.decision.run_dir import recorded_summary
    from tuner.validate.pin_kv import pin_kv

    if emitted is None:
        return None, "--pin-kv: no list was emitted, so none is pinned"
    pin, why = pin_kv(model, results[emitted])
    if pin is None:
        return None, f"--pin-kv: {why}"
    # The files re-rendered as they stand (their list is the emitted one), the pin added.
    _emit(run, model, search, None, f"cgtune validate --pin-kv: {why}", kv_pin=pin)
    if recorded_summary(run).get("kv_pin") is None:  # a guard: the pin is of the list the files carry, or none
        return None, f"--pin-kv: the run's files carry another list than '{emitted}': not pinned"
    return pin, f"--pin-kv: {why}"


def validate_run(run_dir: str | Path, *, num_steps: int = 3000, seed: int = 0, backend: ReplayBackend | None = None,
                 command: str = "", margin: float = MEMORY_MARGIN, emit: bool = True,
                 progress: Callable[[str], None] | None = None, device: str | None = None,
                 instrument: str = "stand-in", any_version: bool = False, rate: float | None = None,
                 load_requests: int = 64, load_limit_s: float = 120.0, pin: bool = False) -> dict[str, Any]:
    """`cgtune validate RUN_DIR`: validate default, tuned (and exact) of a run directory and write validation.json
    and the report section. When the tuned list does not fit by measurement, the fastest measured list that does
    is emitted instead (never one that does not fit); without any, the vLLM files are removed. `device` (default:
    CUDA, required) builds the backend there: `cpu` only rehearses the run (graph steps run eagerly). `instrument`:
    `vllm` runs each list in vLLM's own engine (`tuner.validate.vllm_backend`), `stand-in` in cgtune's decode model.
    `rate` (vllm only): each list's engine also serves `load_requests` Poisson arrivals at that rate of the workload's
    traffic.load (`tuner.validate.served_load`), at most `load_limit_s` seconds. `pin` (vllm only): the emitted list's
    files pin the KV cache at what the engine measured for it (`tuner.validate.pin_kv`)."""
    from tuner.model.costmodel import ModelError
    from tuner.decision.run_dir import load_run
    from tuner.report.validation import update_report
    from tuner.workload.spec import WorkloadError

    run = Path(run_dir)
    if not run.is_dir():
        raise ValidationError(f"run_dir: {str(run)!r} is not a directory")
    try:
        model, search = load_run(run)
    except (ModelError, WorkloadError) as exc:
        raise ValidationError(str(exc).splitlines()[0]) from None
    refuse_unvalidated(model.workload)
    shipped_name, shipped = shipped_list(run, model, search)
    lists = lists_to_validate(search, shipped)
    if backend is None:
        backend = build_instrument(model, lists, device or require_cuda(), instrument, any_version=any_version,
                                   served=served_load_of(model, rate, load_requests, load_limit_s))
    try:
        trace, results, info = validate_lists(model, lists, backend, num_steps=num_steps, seed=seed, margin=margin,
                                              progress=progress, measured=partial_writer(run, model, backend, lists,
                                                                                         seed=seed, command=command,
                                                                                         margin=margin))
    finally:
        _close(backend)
    emitted: str | None = shipped_name
    notes: list[str] = []
    if shipped_name != "tuned":
        notes.append(f"the run's files ship the {shipped_name} list (its ship policy): measured beside the tuned one")
    if not results[shipped_name].fits and backend.graphs_supported:
        fallback = choose_measured(results)
        if not emit:
            emitted = None
            notes.append(f"--no-emit: the {model.serving.engine} files still hold the {shipped_name} list, which does "
                         f"NOT fit by measured memory"
                         + (f"; '{fallback.name}' would have been emitted" if fallback is not None else ""))
        elif fallback is None:
            emitted = None
            _remove_engine_files(run, (*model.engine.files, *model.engine.note_files))
            notes.append(f"no validated list fits by measured memory: the {model.serving.engine} files were removed")
        else:
            emitted = fallback.name
            note = (f"cgtune validate: the {shipped_name} list did not fit by measured graph memory; "
                    f"'{fallback.name}' (fastest measured list that fits) is emitted instead")
            notes.append(note)
            _emit(run, model, search, lists[fallback.name], note)
        log.warning("%s LIST DOES NOT FIT ON THE DEVICE: emitted %s instead", shipped_name.upper(),
                    emitted or "nothing")
    kv_pin = None
    if pin:
        kv_pin, said = _pin(run, model, search, lists, results, emitted)
        notes.append(said)
    record = build_record(model, backend.metadata(), trace, results, seed=seed, command=command, emitted=emitted,
                          notes=notes, trace_info=info, margin=margin)
    record["kv_pin"] = kv_pin
    if not backend.graphs_supported:
        record["warnings"].append(
            f"{backend.device_name}: vLLM's CPU build keeps no CUDA graphs, every list ran eager there (as its rules "
            f"predict); a rehearsal of the path, no GPU validation" if instrument == "vllm" else
            f"{backend.device_name}: no CUDA graphs here, graph steps ran eagerly; these are no validation numbers")
    finish_validation(run, record)
    update_report(run, record)
    return record


def build_instrument(model: CostModel, lists: dict[str, Evaluation], device: str, instrument: str, *,
                     any_version: bool = False, served: ServedLoad | None = None) -> ReplayBackend:
    """The backend validation measures with: vLLM's engine per list (`vllm`, serving `served` after the replay), or
    the stand-in decode model built once (`stand-in`, `build_backend`; it serves no load)."""
    if instrument == "vllm":
        from tuner.validate.vllm_backend import VllmReplayBackend

        return VllmReplayBackend(model, device, any_version=any_version, served=served)
    if instrument != "stand-in":
        raise ValueError(f"instrument={instrument!r} must be vllm or stand-in")
    if served is not None:
        raise ValidationError("--rate: only vLLM's engine serves a load (--backend vllm)")
    return build_backend(model, lists, device)


def served_load_of(model: CostModel, rate: float | None, num_requests: int, limit_s: float) -> ServedLoad | None:
    """The bounded load `--rate` serves (None without a rate); ValidationError (one line) when the workload has no
    traffic.load to take its lengths from."""
    if rate is None:
        return None
    load = model.workload.load
    if load is None:
        raise ValidationError(f"--rate: workload {model.workload.name} has no traffic.load section (prompt_tokens, "
                              f"output_tokens, acceptance when speculating, rate_per_s): the served requests' lengths "
                              f"come from it")
    from tuner.validate.served_load import bounded_load

    return bounded_load(load, rate, num_requests, limit_s=limit_s)


def _close(backend: ReplayBackend) -> None:
    """Release what a backend holds beyond one list (vLLM's scratch directory); the stand-in holds nothing."""
    close = getattr(backend, "close", None)
    if close is not None:
        close()


def _remove_engine_files(run: Path, files: Sequence[str]) -> None:
    """Remove the files the engine would load (nothing that does not fit may be left to deploy)."""
    for name in files:
        (run / name).unlink(missing_ok=True)


def exact_run(workload_path: str | Path, profile_csv: str | Path, run_dir: str | Path, *, command: str = "",
              memory_buckets: int = 2048, allow_mismatch: bool = False, exact_seconds: float | None = None) -> Path:
    """An optuna-free `cgtune search`: the exact solver's optimum as the tuned list, written as a run directory
    (vLLM files, search.json, summary.json, report.md), so a GPU machine without optuna can validate a fresh profile."""
    from tuner.model.costmodel import DEFAULT_MAX_CAPTURE_S, DEFAULT_MAX_GRAPHS, ModelError
    from tuner.decision.record import decide
    from tuner.report.run import write_run
    from tuner.search.study import SearchError, SearchResult, exact_solve
    from tuner.workload.spec import WorkloadError, load_workload

    try:
        model = CostModel.from_files(profile_csv, load_workload(workload_path), allow_mismatch=allow_mismatch,
                                     max_capture_s=DEFAULT_MAX_CAPTURE_S, max_graphs=DEFAULT_MAX_GRAPHS)
        exact = exact_solve(model, memory_buckets=memory_buckets, seconds=exact_seconds)
    except (ModelError, SearchError, WorkloadError) as exc:
        raise ValidationError(str(exc).splitlines()[0]) from None
    note = "no optuna study: the exact solver's optimum is the tuned list (written by cgtune validate --profile)"
    search = SearchResult(chosen=exact.best, source="exact", exact=exact, study_best=None,
                          default=model.evaluate(model.default_sizes), study_name="none", storage="none",
                          objective="latency", trials={}, pareto=exact.front, notes=list(model.notes) + [note])
    write_run(run_dir, model, decide(model, search), command=command)
    return Path(run_dir)


def refuse_unvalidated(workload: Workload) -> None:
    """Refuse, naming the field, a deployment the replay cannot stand for: it runs one engine's own steps with no
    adapter active, not the steps of a data-parallel rank (the ranks' agreed ones) or of a LoRA deployment."""
    s = workload.serving
    if s.data_parallel_size > 1:
        what = f"serving.data_parallel_size: {s.data_parallel_size}"
        why = "one rank's own steps, not the ranks' agreed ones"
    elif s.lora is not None:
        what, why = "serving.enable_lora: true", "its steps with no adapter active"
    else:
        return
    raise ValidationError(f"{what} is not validated yet (the replay runs {why}); hold the run to vLLM's start-up log "
                          f"with cgtune check")


# ---------------------------------------------------------------------------------------------- tune --validate
def top_candidates(model: CostModel, search: SearchResult, k: int, trial_lists: Sequence[Sequence[int]] = ()
                   ) -> list[Evaluation]:
    """The `k` best distinct feasible lists by predicted latency: tuned, the exact optimum, the exact front and
    the study's trials (`trial_lists`), each re-evaluated under `model`."""
    if k < 1:
        raise ValueError(f"{k=} must be >= 1")
    pool = [search.chosen, search.exact.best, *search.exact.front, *(model.evaluate(s) for s in trial_lists)]
    seen: set[tuple[int, ...]] = set()
    out = []
    for e in sorted(pool, key=lambda e: e.expected_step_ms):
        if e.feasible and e.capture_sizes not in seen:
            seen.add(e.capture_sizes)
            out.append(e)
    return out[:k]


def validate_candidates(run_dir: str | Path, model: CostModel, search: SearchResult, k: int, *,
                        backend: ReplayBackend | None = None, num_steps: int = 3000, seed: int = 0,
                        margin: float = MEMORY_MARGIN, command: str = "", record_study: bool = True,
                        storage: str | None = None, progress: Callable[[str], None] | None = None,
                        device: str | None = None, instrument: str = "stand-in", any_version: bool = False,
                        pin: bool = False) -> tuple[SearchResult | None, dict[str, Any]]:
    """`cgtune tune --validate K`: measure vLLM's default and the K best distinct candidates on the GPU, choose
    the fastest by measured mean step latency among those whose measured memory fits the KV budget, record every
    GPU measurement as a trial (user attribute `source: gpu-validation`) in the search's optuna study, and write
    validation.json and the report section. Returns the search with `chosen` replaced (the same object when the
    model's pick wins) and the record; the caller re-emits the run directory from it. When no measured list fits,
    returns None and removes the run directory's vLLM files: nothing may be emitted. `storage` is the study's real
    URL when `search.storage` is the password-hidden one written into files. `device`, `instrument` and `pin` as
    `validate_run`'s (the pin is the record's `kv_pin`, for the caller's re-emit)."""
    import dataclasses

    from tuner.report.validation import update_report

    refuse_unvalidated(model.workload)
    study = None
    trial_lists: list[list[int]] = []
    url = storage or search.storage
    if record_study and url not in ("in-memory", "none", ""):
        import optuna  # only here: the GPU box validating a recorded run directory has no optuna

        study = optuna.load_study(study_name=search.study_name, storage=url)
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            ev = t.user_attrs.get("evaluation")
            if isinstance(ev, dict) and ev.get("capture_sizes") is not None and t.user_attrs.get("source") is None:
                trial_lists.append(ev["capture_sizes"])
    candidates = top_candidates(model, search, k, trial_lists)
    lists: dict[str, Evaluation] = {"default": search.default}
    for i, e in enumerate(candidates):
        name = "tuned" if e.capture_sizes == search.chosen.capture_sizes else f"candidate-{i + 1}"
        if e.capture_sizes != search.default.capture_sizes:
            lists[name] = e
    if "tuned" not in lists and search.chosen.capture_sizes != search.default.capture_sizes:
        lists["tuned"] = search.chosen  # the model's pick is always measured, so the record has default and tuned
    if backend is None:
        backend = build_instrument(model, lists, device or require_cuda(), instrument, any_version=any_version)
    try:
        trace, results, info = validate_lists(model, lists, backend, num_steps=num_steps, seed=seed, margin=margin,
                                              progress=progress, measured=partial_writer(run_dir, model, backend,
                                                                                         lists, seed=seed,
                                                                                         command=command,
                                                                                         margin=margin))
    finally:
        _close(backend)
    if "tuned" not in results:  # the model's pick is vLLM's default
        results["tuned"] = dataclasses.replace(results["default"], name="tuned")
    best = choose_measured(results)
    notes = [f"tune --validate {k}: {len(lists)} lists measured on {backend.device_name}, chosen by measured mean "
             f"step latency among those whose measured graph memory fits"]
    chosen_search: SearchResult | None
    if best is None:
        chosen_search, emitted = None, None
        notes.append(f"no validated list fits by measured memory: the {model.serving.engine} files were removed")
        _remove_engine_files(Path(run_dir), (*model.engine.files, *model.engine.note_files))
        log.warning("NO VALIDATED LIST FITS ON THE DEVICE: nothing is emitted")
    else:
        emitted = best.name
        chosen_eval = lists.get(best.name, search.chosen)
        if chosen_eval.capture_sizes == search.chosen.capture_sizes:
            chosen_search = search
        else:
            note = (f"chosen on the GPU: '{best.name}' measured {best.measured_step_ms:.4f} ms per step vs the model's "
                    f"pick {results['tuned'].measured_step_ms:.4f} ms")
            chosen_search = dataclasses.replace(search, chosen=chosen_eval, source="gpu-validated",
                                                notes=list(search.notes) + [note])
            notes.append(note)
    kv_pin = None
    if pin and best is not None:  # the caller re-emits the run directory with it
        from tuner.validate.pin_kv import pin_kv

        kv_pin, said = pin_kv(model, best)
        notes.append(f"--pin-kv: {said}")
    record = build_record(model, backend.metadata(), trace, results, seed=seed, command=command, emitted=emitted,
                          notes=notes, trace_info=info, margin=margin)
    record["kv_pin"] = kv_pin
    record["candidates"] = {name: list(e.capture_sizes) for name, e in lists.items()}
    if study is not None:
        _record_trials(study, model, results, backend.device_name)
    finish_validation(run_dir, record)
    update_report(run_dir, record)
    return chosen_search, record


def _record_trials(study: Any, model: CostModel, results: dict[str, ListValidation], device_name: str) -> None:
    """One finished trial per measured list, value = measured mean step latency (and measured GiB for a two-objective
    study), constraint = KV shortfall with the measured memory, so the history stays in one study."""
    import optuna

    two = len(study.directions) == 2
    default_sizes = results["default"].capture_sizes if "default" in results else None
    for name, r in results.items():
        if name != "default" and r.capture_sizes == default_sizes:
            continue  # the default's measurement stands for both; one trial is enough
        evaluation = model.evaluate(r.capture_sizes)
        # The drafter's graphs are not captured in validation: their predicted bytes keep this comparable.
        measured_gib = ((r.measured_graph_bytes or 0) + r.drafter_graph_bytes) / GIB
        shortfall = 1.0 if r.kv_available_bytes is None or r.capture_headroom_bytes is None else max(
            (r.required_kv_bytes - r.kv_available_bytes) / GIB, -r.capture_headroom_bytes / GIB)
        attrs = {
            "source": "gpu-validation",
            "device_name": device_name,
            "list_name": name,
            # Same shape as the model-only trials, so code reading `evaluation` keeps working on these.
            "evaluation": {"capture_sizes": list(r.capture_sizes),
                           "expected_step_ms": evaluation.expected_step_ms,
                           "graph_memory_bytes": evaluation.graph_memory_bytes,
                           "vllm_graph_estimate_bytes": evaluation.graph_estimate_bytes,
                           "kv_available_bytes": evaluation.kv_available_bytes,
                           "capture_headroom_bytes": evaluation.capture_headroom_bytes,
                           "infeasible_reason": evaluation.why_infeasible},
            "measured": {k: v for k, v in r.as_dict().items() if k not in ("by_graph", "capture_sizes")},
        }
        ok = r.oom is None and math.isfinite(r.measured_step_ms)
        trial = optuna.trial.create_trial(
            state=optuna.trial.TrialState.COMPLETE if ok else optuna.trial.TrialState.FAIL,
            values=([r.measured_step_ms, measured_gib] if two else [r.measured_step_ms]) if ok else None,
            user_attrs=attrs,
            constraints={"kv_shortfall_gib": shortfall},  # the search's constraint: <= 0 is feasible
        )
        study.add_trial(trial)
