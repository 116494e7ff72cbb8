"""Hold a run's predictions to vLLM's own start-up log (`cgtune check`): the log must be of the run's capture list and
serving settings; then every figure vLLM logs about the list (its graph-memory estimate, the KV cache it sized in
bytes, tokens and concurrency, the real graph pool, the capture time, its non-KV memory) beside cgtune's prediction,
with the error and whether the log line's rounding or cgtune's stated tolerance covers it. What a release logs
differs (vLLM 0.34 under its extensible KV cache: no estimate, and the capacity it reserves before capture where 0.33
logs the KV cache); the run's engine says what its log shows (`kv_line_figure`, `no_estimate_note`,
`estimate_refusal`, `config_lists`, `read_compilation_config`).

A run whose summary.json records a `kv_pin` for the list the log is of (`cgtune validate --pin-kv`: the shipped files
carry `--kv-cache-memory-bytes`) is held to a pinned start-up: vLLM must have reserved that KV cache (its "reserved X
GiB memory for KV Cache as specified by kv_cache_memory_bytes config" line within its rounding of the pin, and the
setting among its non-default args equal to it where they show it), and a pinned log of a run that pins nothing for
the list is refused. Pinned, vLLM skips its memory profiling: no estimate and no non-KV figure to compare; the KV
cache is the pin's, its tokens and concurrency the pin's by the engine's own rule (`kv_capacity`), the pool and the
capture time as without it."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.engines.vllm.emit import COMPILATION_CONFIG_FILE
from tuner.engines.vllm.startup_log import GIB, GIB_RESOLUTION, StartupLog, WorkerFigures
from tuner.model.capture_time import predicted_capture_s
from tuner.model.costmodel import CostModel, Evaluation
from tuner.decision.compare import kv_tokens, max_concurrency
from tuner.decision.record import alternative_name
from tuner.validate.validation import MEMORY_GOAL
from tuner.workload.spec import Workload

__all__ = [
    "QUANTITIES",
    "CheckError",
    "CheckResult",
    "Quantity",
    "check_run",
    "write_calibration",
]

QUANTITIES = ("vllm_graph_estimate_bytes", "kv_available_bytes", "kv_capacity_bytes", "kv_pinned_bytes", "kv_tokens",
              "max_concurrency", "graph_pool_bytes", "capture_s", "non_kv_cache_bytes")
"""What `cgtune check` compares, in table order (summary.json's names where it has them; `kv_capacity_bytes`: the
capacity vLLM 0.34 reserves before capture under its extensible KV cache, where 0.33 logs `kv_available_bytes`;
`kv_pinned_bytes`: the KV cache a pinned start-up reserved, in place of either)."""


class CheckError(ValueError):
    """A log that is not of this run's list and settings, or that ends too early; the message is one line."""


@dataclass(frozen=True)
class Quantity:
    """One figure, predicted and logged."""

    name: str
    unit: str
    """`bytes`, `tokens`, `x` (concurrency) or `s`."""
    predicted: float
    logged: float
    """vLLM's figure (with several workers: the one furthest from the prediction)."""
    resolution: float
    """How far the logged figure may sit from the true one by the log line's rounding alone (half its last printed
    digit; 0 for the token count, which vLLM logs whole and cgtune counts in vLLM's blocks as it does), in `unit`."""
    tolerance: float | None
    """The share cgtune states it predicts the figure within (None: it states none)."""
    source: str
    """The log line it was read from."""
    workers: dict[str, float] = field(default_factory=dict)
    """Each worker's figure, when several logged one."""

    @property
    def error(self) -> float | None:
        """logged / predicted - 1 (how far vLLM's figure is from cgtune's); None when nothing was predicted."""
        return self.logged / self.predicted - 1.0 if self.predicted else None

    @property
    def within(self) -> str:
        """`rounding` (the log line cannot tell them apart), `tolerance` (within cgtune's stated share) or
        `neither`."""
        if abs(self.logged - self.predicted) <= self.resolution * (1 + 1e-9):
            return "rounding"
        if self.tolerance is not None and self.error is not None and abs(self.error) <= self.tolerance:
            return "tolerance"
        return "neither"

    def as_dict(self) -> dict[str, Any]:
        return {"predicted": self.predicted, "logged": self.logged,
                "error_pct": None if self.error is None else 100 * self.error, "within": self.within,
                "unit": self.unit, "log_resolution": self.resolution,
                "tolerance_pct": None if self.tolerance is None else 100 * self.tolerance, "source": self.source,
                **({"workers": self.workers} if len(self.workers) > 1 else {})}


@dataclass
class CheckResult:
    """A run held to one vLLM start-up."""

    model: CostModel
    evaluation: Evaluation
    """The run's emitted list under the run's cost model."""
    log: StartupLog
    list_kind: str
    """`as written` or `as the V1 runner runs it` (what the log's list is of the run's)."""
    quantities: dict[str, Quantity]
    notes: list[str]
    kv_pin: dict[str, Any] | None = None
    """summary.json's `kv_pin` the log was held to (None: an unpinned start-up of an unpinned list)."""

    def over(self, percent: float) -> list[str]:
        """Figures more than `percent` off their prediction beyond what the log's rounding explains (--fail-over)."""
        return [q.name for q in self.quantities.values()
                if q.within != "rounding" and q.error is not None and abs(q.error) * 100 > percent]

    def as_dict(self) -> dict[str, Any]:
        return {"list_matches": True, "list": self.list_kind, "capture_sizes": list(self.log.capture_sizes),
                "runner": self.log.runner, "runner_predicted": self.model.runner,
                "vllm_version": self.log.vllm_version, "log": self.log.source,
                "workers": [w.tag for w in self.log.workers],
                # Only where the start-up was pinned: an unpinned check's JSON stays as it was.
                **({"kv_pin": {"bytes": int(self.kv_pin["bytes"]), "list": self.kv_pin.get("list")}}
                   if self.kv_pin is not None else {}),
                "quantities": {name: q.as_dict() for name, q in self.quantities.items()}, "notes": self.notes}


# ---------------------------------------------------------------------------------------------- predictions
def _runs_as(workload: Workload, sizes: tuple[int, ...]) -> tuple[int, ...] | None:
    try:
        return tuple(workload.engine.runs_as(sizes))
    except ValueError:
        return None


def _run_list(workload: Workload, run_dir: Path, name: str = COMPILATION_CONFIG_FILE) -> tuple[int, ...]:
    """The list the run emitted (what `vllm serve` was given), from its compilation_config.json (or the other list's,
    `name`), as the run's engine reads its own file (vLLM 0.34: two lists, as keys)."""
    path = run_dir / name
    try:
        return workload.engine.read_compilation_config(json.loads(path.read_text()))
    except FileNotFoundError:
        raise CheckError(f"run_dir: {run_dir} has no {COMPILATION_CONFIG_FILE} (the run emitted no vLLM list)"
                         ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckError(f"run_dir: {path} is unreadable ({type(exc).__name__}: {exc})") from None


# ---------------------------------------------------------------------------------------------- refusals
def _brief(sizes: tuple[int, ...]) -> str:
    if not sizes:
        return "[] (no graphs)"
    head = ", ".join(map(str, sizes[:6]))
    return f"[{head}{', ...' if len(sizes) > 6 else ''}] ({len(sizes)} sizes, max {sizes[-1]})"


def _named(workload: Workload, sizes: tuple[int, ...]) -> str:
    """A list as vLLM's compilation config names it: `cudagraph_capture_sizes=[...] (...)`, or both 0.34 lists."""
    return ", ".join(f"{field}={_brief(part)}" for field, part in workload.engine.config_lists(sizes))


def _unnamed(workload: Workload, sizes: tuple[int, ...]) -> str:
    """The run's list in a refusal: `[...] (...)` when the engine takes one list, each named when it takes two."""
    parts = workload.engine.config_lists(sizes)
    return _brief(parts[0][1]) if len(parts) == 1 else _named(workload, sizes)


def _run_pin(run_dir: Path, sizes: tuple[int, ...]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(summary.json's kv_pin when it is of `sizes`, the list the log is of; the kv_pin it records for any list): a pin
    is of the shipped list's files only (tuner.report.run's write_run keeps it while its capture_sizes are that
    list's)."""
    from tuner.decision.run_dir import recorded_summary

    pin = recorded_summary(run_dir).get("kv_pin")
    if not (isinstance(pin, dict) and isinstance(pin.get("bytes"), int) and pin["bytes"] > 0):
        return None, None
    return (pin if list(pin.get("capture_sizes", ())) == list(sizes) else None), pin


def _gib(b: float) -> str:
    return f"{b / GIB:.2f} GiB"


def _refuse_other_pin(log: StartupLog, pin: dict[str, Any] | None, any_pin: dict[str, Any] | None) -> None:
    """One line when the log's KV cache is not pinned as the run's files pin it for the log's list: the run pins it
    (summary.json kv_pin) and vLLM ran without that `--kv-cache-memory-bytes`, or vLLM ran pinned and the run pins
    nothing for the list. The reserved line prints the setting to 2 decimals of a GiB (format_gib): within half of
    that it is the pin. A log that shows neither (cut before the KV line, no non-default args) is left to
    `_refuse_truncated`."""
    src = log.source
    reserved = [(w.tag, w.kv_reserved_gib) for w in log.workers if w.kv_reserved_gib is not None]
    if pin is None:
        if not log.kv_pinned:
            return
        given = (f"--kv-cache-memory-bytes {log.kv_cache_memory_bytes}" if log.kv_cache_memory_bytes is not None
                 else "kv_cache_memory_bytes")
        what = (f" (it reserved {reserved[0][1]} GiB for the KV cache and skipped its memory profiling)" if reserved
                else "")
        which = (f" (it pins its {any_pin.get('list') or 'shipped'} list's, in that list's files)" if any_pin is not None
                 else "")
        raise CheckError(f"--vllm-log: {src}: vLLM ran with {given}{what}, which the run does not pin for this list: "
                         f"its summary.json records no kv_pin for it{which}; start vLLM with the run's vllm-serve.yaml")
    n = int(pin["bytes"])
    without = (f"--vllm-log: {src}: vLLM ran without the run's --kv-cache-memory-bytes {n} ({_gib(n)} per rank, its "
               f"summary.json kv_pin for the {pin.get('list') or 'shipped'} list)")
    fix = "start it with the run's vllm-serve.yaml"
    if log.kv_cache_memory_bytes is not None and log.kv_cache_memory_bytes != n:
        raise CheckError(f"{without}: its non-default args have kv_cache_memory_bytes={log.kv_cache_memory_bytes}; "
                         f"{fix}")
    profiled = next((w for w in log.workers if w.kv_available_gib is not None), None)
    if profiled is not None:
        who = f"{profiled.tag} " if profiled.tag else ""
        raise CheckError(f"{without}: {who}profiled its memory and sized the KV cache itself (\"Available KV cache "
                         f"memory: {profiled.kv_available_gib} GiB\"); {fix}")
    for tag, gib in reserved:
        if abs(gib - n / GIB) > GIB_RESOLUTION + 1e-9:
            who = f" ({tag})" if tag else ""
            raise CheckError(f"{without}: it reserved {gib} GiB for the KV cache{who}, not the pin's {_gib(n)}; {fix}")
    if not log.kv_pinned and log.non_default_args:
        raise CheckError(f"{without}: its non-default args have no kv_cache_memory_bytes; {fix}")


def _refuse_other_configuration(workload: Workload, log: StartupLog, sizes: tuple[int, ...],
                                runs: tuple[int, ...], pin: dict[str, Any] | None = None,
                                any_pin: dict[str, Any] | None = None) -> str:
    """One line when the log is not of this run's list and settings (its KV cache pinned as the run pins it for that
    list: `pin`; `any_pin`: the run's pin of whichever list); returns what the log's list is of the run's."""
    src, s, engine = log.source, workload.serving, workload.engine
    # A release that captures another number of lists than the run's (0.33 one, 0.34 two) ran another list.
    if log.split_lists != engine.split_lists:
        form = {True: "two capture lists", False: "one capture list"}
        release = ".".join(log.vllm_version.split(".")[:2])
        raise CheckError(f"--vllm-log: {src}: the log is of vLLM {log.vllm_version}, which ran "
                         f"{form[log.split_lists]}; the run follows vLLM {engine.version}'s rules "
                         f"({form[engine.split_lists]}): start vLLM {engine.version} with the run's vllm-serve.yaml, "
                         f"or tune for the log's release (--vllm-version {release})")
    if log.enforce_eager or log.cudagraph_mode == "NONE" or not log.capture_sizes:
        fields = [field for field, _ in engine.config_lists(())]
        empty = f"an empty {fields[0]}" if len(fields) == 1 else f"empty {' and '.join(fields)}"
        why = ("enforce_eager=True" if log.enforce_eager else
               "cudagraph_mode NONE" if log.cudagraph_mode == "NONE" else empty)
        raise CheckError(f"--vllm-log: {src}: vLLM ran without CUDA graphs ({why}), so it logged no graph memory to "
                         f"compare")
    if log.capture_sizes not in (sizes, runs):
        default = (" (it is vLLM's default for the workload)" if log.capture_sizes == tuple(engine.defaults().sizes)
                   else "")
        runs_note = f" nor what it runs as, {_unnamed(workload, runs)}" if runs != sizes else ""
        lists = "list" if len(engine.config_lists(())) == 1 else "lists"
        raise CheckError(f"--vllm-log: {src}: vLLM ran {_named(workload, log.capture_sizes)}{default}, not the run's "
                         f"{lists} {_unnamed(workload, sizes)}{runs_note}; start vLLM with the run's vllm-serve.yaml")
    if log.num_speculative_tokens != s.num_speculative_tokens:
        raise CheckError(f"--vllm-log: {src}: vLLM ran num_speculative_tokens={log.num_speculative_tokens} (its "
                         f"speculative_config), the run's workload has {s.num_speculative_tokens}; start vLLM with "
                         f"the workload's --speculative-config")
    wanted = {"max_num_seqs": s.max_num_seqs, "max_num_batched_tokens": s.max_num_batched_tokens,
              "max_model_len": s.max_model_len, "tensor_parallel_size": workload.model.tensor_parallel_size,
              "gpu_memory_utilization": s.gpu_memory_utilization}
    for name, value in wanted.items():
        got = log.settings.get(name)
        if got is not None and not math.isclose(got, value, abs_tol=5e-5):
            raise CheckError(f"--vllm-log: {src}: vLLM ran {name}={got:g}, the run's workload has {value:g}")
    _refuse_other_pin(log, pin, any_pin)
    if log.kv_pinned:  # pinned, vLLM skips its estimate and every line of it, whatever the workload's flag
        return "as written" if log.capture_sizes == sizes else f"as the {engine.runner.upper()} runner runs it"
    logged_estimate = any(w.pool_estimated_gib is not None or w.utilization is not None
                          or w.v1_estimate_gib is not None for w in log.workers)
    why = engine.estimate_refusal(warned_disabled=log.estimate_disabled, logged_estimate=logged_estimate)
    if why is not None:
        raise CheckError(f"--vllm-log: {src}: {why}")
    return "as written" if log.capture_sizes == sizes else f"as the {engine.runner.upper()} runner runs it"


def _refuse_truncated(log: StartupLog, pinned: bool = False) -> None:
    src = log.source
    if not log.workers and pinned:
        raise CheckError(f"--vllm-log: {src} ends before vLLM reserved its KV cache (no \"Initial free memory ... "
                         f"GiB, reserved ... GiB memory for KV Cache\" line after the engine-config line); pass the log "
                         f"of a whole start-up")
    if not log.workers:
        raise CheckError(f"--vllm-log: {src} ends before vLLM sized its KV cache (no \"Available KV cache memory\" "
                         f"line after the engine-config line); pass the log of a whole start-up")
    if log.kv_tokens is None:
        raise CheckError(f"--vllm-log: {src} ends before vLLM logged its KV cache size (no \"GPU KV cache size\" "
                         f"line); pass the log of a whole start-up")
    for w in log.workers:
        if w.real_capture is None:
            who = f" ({w.tag})" if w.tag else ""
            raise CheckError(f"--vllm-log: {src} ends before vLLM's graph capture finished{who} (no \"Graph "
                             f"capturing finished\" line after its KV cache line); pass the log of a whole start-up")


# ---------------------------------------------------------------------------------------------- figures
def _estimate_gib(model: CostModel, w: WorkerFigures) -> tuple[float, float, str] | None:
    """(vLLM's estimate, resolution, line) from the best line this worker logged."""
    if w.pool_estimated_gib is not None:
        return w.pool_estimated_gib, GIB_RESOLUTION, "CUDA graph pool memory: ... (estimated)"
    if w.v1_estimate_gib is not None:
        return w.v1_estimate_gib, GIB_RESOLUTION, "Estimated CUDA graph memory"
    if w.utilization is not None:  # (current - equivalent) x total, each utilization to 4 decimals
        total_gib = w.total_gib if w.total_gib is not None else model.budget.total_memory_bytes / GIB
        return ((w.utilization[0] - w.utilization[1]) * total_gib, 1e-4 * total_gib,
                "--gpu-memory-utilization hint (current - equivalent) x device memory")
    return None


def _per_worker(log: StartupLog, read: Callable[[WorkerFigures], tuple[float, float, str] | None]
                ) -> dict[str, tuple[float, float, str]]:
    return {w.tag: r for w in log.workers if (r := read(w)) is not None}


def _quantity(name: str, unit: str, predicted: float | None, figures: dict[str, tuple[float, float, str]],
              tolerance: float | None) -> Quantity | None:
    """The quantity from every worker's (logged, resolution, line): the worker furthest from the prediction."""
    if predicted is None or not figures:
        return None
    logged, resolution, line = max(figures.values(), key=lambda f: abs(f[0] - predicted))
    return Quantity(name, unit, float(predicted), float(logged), resolution, tolerance, line,
                    {t: f[0] for t, f in figures.items()})


def _bytes(figures: dict[str, tuple[float, float, str]]) -> dict[str, tuple[float, float, str]]:
    return {t: (v * GIB, r * GIB, line) for t, (v, r, line) in figures.items()}


def _pool_figure(notes: list[str]) -> Callable[[WorkerFigures], tuple[float, float, str] | None]:
    """A worker's real graph pool (GiB, resolution, line): the pool line's actual figure, else the capture line's."""
    def pool(w: WorkerFigures) -> tuple[float, float, str] | None:
        assert w.real_capture is not None  # _refuse_truncated saw to it
        real = w.pool_actual_gib if w.pool_actual_gib is not None else w.real_capture[1]
        if real < 0:  # a negative free-memory drop (vLLM issue 25779) is an invalid reading, not a number
            notes.append(f"{w.tag or 'the worker'} logged a negative graph capture ({real} GiB): invalid, not compared")
            return None
        return real, GIB_RESOLUTION, "Graph capturing finished ... took / CUDA graph pool memory (actual)"

    return pool


def _memory_quantities(model: CostModel, e: Evaluation, log: StartupLog, notes: list[str]) -> list[Quantity | None]:
    b = model.budget
    enabled = b.estimate_enabled
    estimates = _per_worker(log, lambda w: _estimate_gib(model, w))
    pool = _pool_figure(notes)

    def non_kv(w: WorkerFigures) -> tuple[float, float, str] | None:
        # vLLM's own rule: available KV = requested - non-KV - the estimate it subtracted.
        est = estimates.get(w.tag, (0.0, 0.0, ""))[0] if enabled else 0.0
        if w.requested_gib is None or w.kv_available_gib is None or (enabled and w.tag not in estimates):
            return None
        return (w.requested_gib - w.kv_available_gib - est, 3 * GIB_RESOLUTION,
                "requested (memory summary) - Available KV cache memory - the estimate")

    if not enabled:
        notes.append(model.engine.no_estimate_note)
    if not _per_worker(log, non_kv):
        notes.append("non_kv_cache_bytes is not compared: the log has no memory summary line (\"Free memory on device "
                     "... Desired GPU memory utilization is ...\") to read vLLM's requested memory from")
    kv_line = "Available KV cache memory"
    # What that line shows is the engine's to say (0.34's extensible KV cache: the capacity, not the KV cache).
    kv_name, kv_predicted = model.engine.kv_line_figure(e.kv_available_bytes, requested_bytes=b.requested_bytes,
                                                        non_kv_cache_bytes=b.non_kv_cache_bytes)
    return [
        _quantity("vllm_graph_estimate_bytes", "bytes", e.graph_estimate_bytes if enabled else None,
                  _bytes(estimates), MEMORY_GOAL),
        _quantity(kv_name, "bytes", kv_predicted,
                  _bytes(_per_worker(log, lambda w: (w.kv_available_gib, GIB_RESOLUTION, kv_line))), None),
        _quantity("graph_pool_bytes", "bytes", e.graph_memory_bytes, _bytes(_per_worker(log, pool)), MEMORY_GOAL),
        _quantity("non_kv_cache_bytes", "bytes", model.budget.non_kv_cache_bytes, _bytes(_per_worker(log, non_kv)),
                  None),
    ]


def _pinned_memory_quantities(model: CostModel, e: Evaluation, log: StartupLog, pin: dict[str, Any],
                              notes: list[str]) -> list[Quantity | None]:
    """A pinned start-up's memory figures: the KV cache it reserved (the pin, to vLLM's 2 decimals of a GiB) and the
    real pool; vLLM skipped its memory profiling, so there is no estimate and no non-KV figure to compare."""
    n = int(pin["bytes"])
    notes.append(f"vLLM started with the run's --kv-cache-memory-bytes {n} ({n / GIB:.3f} GiB per rank, summary.json's "
                 f"kv_pin) and skipped its memory profiling: it made no graph-memory estimate and logged no non-KV "
                 f"figure (no \"Available KV cache memory\" line, no memory summary), so vllm_graph_estimate_bytes and "
                 f"non_kv_cache_bytes are not compared; kv_pinned_bytes is the pin against the KV cache vLLM reserved, "
                 f"kv_tokens and max_concurrency the pin's by the engine's block rule")
    line = "Initial free memory ... GiB, reserved X GiB memory for KV Cache as specified by kv_cache_memory_bytes"
    reserved = _per_worker(log, lambda w: (w.kv_reserved_gib, GIB_RESOLUTION, line)
                           if w.kv_reserved_gib is not None else None)
    return [
        _quantity("kv_pinned_bytes", "bytes", n, _bytes(reserved), None),
        _quantity("graph_pool_bytes", "bytes", e.graph_memory_bytes, _bytes(_per_worker(log, _pool_figure(notes))),
                  MEMORY_GOAL),
    ]


def _engine_quantities(model: CostModel, e: Evaluation, log: StartupLog, notes: list[str],
                       kv_bytes: float | None = None) -> list[Quantity | None]:
    """The engine's KV size and concurrency, and the capture time. `kv_bytes`: the KV cache the figures follow from
    (a pinned start-up's pin), else the list's predicted KV cache."""
    assert log.kv_tokens is not None and log.max_concurrency is not None
    kv_line = "GPU KV cache size: N tokens, Maximum concurrency ..."
    if kv_bytes is None:
        tokens, concurrency = kv_tokens(model, e), max_concurrency(model, e)
    else:  # the engine's own rule, on the pin: whole blocks, as vLLM counts them
        tokens, concurrency = model.engine.kv_capacity(int(kv_bytes), model.kv_bytes_per_token)
    capture_s = predicted_capture_s(model, e.runs_as)
    if capture_s is None:
        notes.append("capture_s is not compared: the profile records no capture time for the graphs the list captures")
    else:
        notes.append("capture_s predicted = the profile's capture seconds summed over the list's graphs; vLLM's figure "
                     "also holds its warm-up runs and set-up, and no tolerance is stated for it")
    return [
        _quantity("kv_tokens", "tokens", tokens, {"": (log.kv_tokens, 0, kv_line)}, None),
        _quantity("max_concurrency", "x", concurrency, {"": (log.max_concurrency, 0.005, kv_line)}, None),
        _quantity("capture_s", "s", capture_s,
                  _per_worker(log, lambda w: (w.real_capture[0], 0.5, "Graph capturing finished in N secs")
                              if w.real_capture else None), None),
    ]


def _context_notes(model: CostModel, log: StartupLog, list_kind: str) -> list[str]:
    notes = []
    # The run's own release (its engine's), held to the log's.
    if ".".join(log.vllm_version.split(".")[:2]) != model.engine.version:
        notes.append(f"the log is of vLLM {log.vllm_version}; cgtune mirrors vLLM {model.engine.version}'s rules")
    if log.starts > 1:
        notes.append(f"the log holds {log.starts} start-ups; the last one is read")
    if list_kind != "as written":
        notes.append(f"vLLM's engine config shows the list {list_kind} (V1 rewrites an explicit list when speculating)")
    # Not a branch on the runner: the runner vLLM logged held to the one the run predicted.
    if log.runner is not None and log.runner != model.runner:
        notes.append(f"vLLM ran the {log.runner.upper()} runner, the run predicted {model.runner.upper()}: its graph-"
                     f"memory estimate was predicted by the other runner's rule")
    if "max_num_seqs" not in log.settings:
        notes.append("the log does not state max_num_seqs (vLLM logs it in \"non-default args\" only when it is set): "
                     "not checked against the workload's")
    tp = model.workload.model.tensor_parallel_size
    if tp > 1 and len(log.workers) < tp:
        notes.append(f"{len(log.workers)} worker(s) logged a KV cache at tensor_parallel_size {tp}: lines without "
                     f"vLLM's process tags cannot be told apart")
    total = model.budget.total_memory_bytes / GIB
    for w in log.workers:
        if w.total_gib is not None and abs(w.total_gib - total) > GIB_RESOLUTION:
            notes.append(f"vLLM's device has {w.total_gib} GiB, the profile's {total:.2f} GiB: the profile was "
                         f"measured on another GPU")
            break
    return notes


def check_run(run_dir: Path, log: StartupLog) -> CheckResult:
    """The run in `run_dir` (its emitted list, and its cost model rebuilt from its own copies as `cgtune report` does)
    held to the log; CheckError (one line) when the directory is no vLLM run, or the log is of another list or
    configuration, or ends before the figures. The log is judged before the cost model is built."""
    from tuner.decision.run_dir import load_run, load_run_workload

    from tuner.engines.vllm.versions import VersionConflict

    try:
        workload = load_run_workload(run_dir)
    except VersionConflict:  # --vllm-version naming another release than the run's: its own line
        raise
    except ValueError as exc:  # WorkloadError: one line naming the file
        raise CheckError(f"run_dir: {run_dir} holds no readable workload.yaml ({str(exc).splitlines()[0]})") from None
    # cgtune check is vLLM's start-up log reader (tuner.engines.vllm.startup_log): another engine logs nothing it can
    # read.
    if workload.serving.engine != "vllm":
        raise CheckError(f"run_dir: {run_dir} is a {workload.serving.engine} run; cgtune check reads vLLM's log only")
    sizes = _run_list(workload, run_dir)
    # A run ships one list and keeps the other's files beside it (compilation_config.fastest.json or .compact.json):
    # a log of that one is checked against it.
    for other in ("fastest", "compact"):
        path = run_dir / alternative_name(COMPILATION_CONFIG_FILE, other)
        if log.capture_sizes != sizes and path.is_file():
            alt = _run_list(workload, run_dir, path.name)
            if log.capture_sizes in (alt, _runs_as(workload, alt)):
                sizes = alt
    try:
        runs = workload.engine.runs_as(sizes)
    except ValueError as exc:
        raise CheckError(f"run_dir: {run_dir}/{COMPILATION_CONFIG_FILE}: a list vLLM refuses ({exc})") from None
    pin, any_pin = _run_pin(run_dir, sizes)
    list_kind = _refuse_other_configuration(workload, log, sizes, runs, pin, any_pin)
    _refuse_truncated(log, pinned=pin is not None)
    try:
        model, _ = load_run(run_dir)
    except ValueError as exc:  # ModelError: one line naming the file
        raise CheckError(f"run_dir: {str(exc).splitlines()[0]}") from None
    e = model.evaluate(sizes)
    notes = _context_notes(model, log, list_kind)
    if pin is None:
        found = _memory_quantities(model, e, log, notes) + _engine_quantities(model, e, log, notes)
    else:
        found = (_pinned_memory_quantities(model, e, log, pin, notes)
                 + _engine_quantities(model, e, log, notes, kv_bytes=pin["bytes"]))
    by_name = {q.name: q for q in found if q is not None}
    return CheckResult(model, e, log, list_kind, {n: by_name[n] for n in QUANTITIES if n in by_name}, notes, pin)


def write_calibration(result: CheckResult, out_json: Path, *, command: str) -> dict[str, Any]:
    """Write the run's profile calibrated on the log (`tuner.profile.calibration`: OUT.json + OUT.csv) and say what came
    from where. With several workers the largest pool and non-KV figures are taken, so a re-plan keeps the tightest
    rank's KV cache. CheckError when the log gives no valid real pool to scale by."""
    from tuner.profile.calibration import CALIBRATION_KEY, calibrated_metadata, write_calibrated

    pool = result.quantities.get("graph_pool_bytes")
    if pool is None or pool.predicted <= 0 or pool.logged <= 0:
        raise CheckError("--calibrate: the log gives no valid real graph pool to calibrate on")
    non_kv = result.quantities.get("non_kv_cache_bytes")
    profile = result.model.profile
    assert profile.path is not None
    metadata = calibrated_metadata(
        profile.metadata, log=result.log.source, capture_sizes=result.log.capture_sizes,
        pool_logged_bytes=max(pool.workers.values(), default=pool.logged), pool_predicted_bytes=pool.predicted,
        non_kv_logged_bytes=max(non_kv.workers.values(), default=non_kv.logged) if non_kv is not None else None,
        command=command)
    json_path, csv_path = write_calibrated(profile.path, out_json, metadata)
    block = metadata[CALIBRATION_KEY]
    # The same list under the calibrated profile, as `cgtune search --profile OUT.csv` will see it: the real pool
    # comes out at vLLM's; the estimate moves by the same scale, so what it still misses shows here.
    again = CostModel.from_files(csv_path, result.model.workload, **result.model.settings())
    e = again.evaluate(result.evaluation.capture_sizes)
    kv_name, kv_bytes = again.engine.kv_line_figure(e.kv_available_bytes, requested_bytes=again.budget.requested_bytes,
                                                    non_kv_cache_bytes=again.budget.non_kv_cache_bytes)
    repredicted = {"vllm_graph_estimate_bytes": e.graph_estimate_bytes, kv_name: kv_bytes,
                   "graph_pool_bytes": e.graph_memory_bytes, "non_kv_cache_bytes": again.budget.non_kv_cache_bytes}
    return {"json": str(json_path), "csv": str(csv_path), "graph_memory_scale": block["graph_memory_scale"],
            "non_kv_cache_bytes": metadata.get("non_kv_cache_bytes"), "from_vllm_log": block["from_vllm_log"],
            "from_profile": block["from_profile"],
            "repredicted": {name: {"predicted": value, "logged": result.quantities[name].logged}
                            for name, value in repredicted.items() if name in result.quantities}}
