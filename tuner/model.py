"""Cost model fitted from a profile: step latency of any capture list under vLLM's dispatch, its graph memory,
and the KV budget it leaves."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tuner.profile_table import Profile, ProfileError, read_profile
from tuner.vllm.dispatch import Dispatcher
from tuner.workload import Step, Workload

__all__ = [
    "GIB",
    "CostModel",
    "Evaluation",
    "KvBudget",
    "ModelError",
    "check_profile_matches",
    "crossover_width",
]

GIB = 1 << 30
log = logging.getLogger(__name__)


class ModelError(ValueError):
    """A profile and workload the cost model cannot be fitted from; the message is one line."""


@dataclass(frozen=True)
class KvBudget:
    """The memory terms vLLM sizes the KV cache from (all bytes on one rank)."""

    total_memory_bytes: int
    """Device memory of the profiled GPU."""
    gpu_memory_utilization: float
    """Share of it vLLM may use."""
    weights_bytes: int
    """Model weights on one rank."""
    activation_peak_bytes: int
    """Peak non-KV, non-weight memory of vLLM's profile run."""
    required_kv_bytes: int
    """KV bytes the deployment needs."""
    weights_source: str = "profile"
    """`profile` (measured) or `workload` (computed from the model shape)."""

    @property
    def requested_bytes(self) -> int:
        return int(self.total_memory_bytes * self.gpu_memory_utilization)

    def kv_available_bytes(self, graph_memory_bytes: int) -> int:
        """KV cache left after weights, activations and graphs."""
        return self.requested_bytes - self.weights_bytes - self.activation_peak_bytes - graph_memory_bytes

    @property
    def graph_budget_bytes(self) -> int:
        """Most graph memory a list may take while the KV cache keeps what is required (< 0: none fits)."""
        return self.kv_available_bytes(0) - self.required_kv_bytes


@dataclass(frozen=True)
class Evaluation:
    """One capture list under the cost model."""

    capture_sizes: tuple[int, ...]
    """Sorted unique widths."""
    expected_step_ms: float
    """Expected step latency over the workload's step distribution."""
    per_token_ms: float
    """Expected step latency divided by the expected tokens per step."""
    graph_memory_bytes: int
    """Predicted memory of all graphs the list makes vLLM capture."""
    kv_available_bytes: int
    """KV cache left with these graphs."""
    required_kv_bytes: int
    """KV cache the deployment needs."""
    reason: str = ""
    """Why the list is infeasible beyond the KV budget (e.g. a width whose capture ran out of memory)."""

    @property
    def kv_margin_bytes(self) -> int:
        return self.kv_available_bytes - self.required_kv_bytes

    @property
    def kv_margin_gib(self) -> float:
        return self.kv_margin_bytes / GIB

    @property
    def feasible(self) -> bool:
        return self.kv_margin_bytes >= 0 and not self.reason

    @property
    def why_infeasible(self) -> str:
        if self.reason:
            return self.reason
        if self.kv_margin_bytes < 0:
            return (f"KV cache {self.kv_available_bytes / GIB:.2f} GiB < required {self.required_kv_bytes / GIB:.2f} "
                    f"GiB (graphs take {self.graph_memory_bytes / GIB:.2f} GiB)")
        return ""

    def as_dict(self) -> dict[str, object]:
        return {
            "capture_sizes": list(self.capture_sizes),
            "expected_step_ms": self.expected_step_ms,
            "per_token_ms": self.per_token_ms,
            "graph_memory_bytes": self.graph_memory_bytes,
            "kv_available_bytes": self.kv_available_bytes,
            "kv_margin_gib": self.kv_margin_gib,
            "feasible": self.feasible,
            "reason": self.why_infeasible,
        }


def check_profile_matches(profile: Profile, workload: Workload) -> None:
    """Raise ModelError when the profile was measured for another model shape, dtype or TP size."""
    name = profile.path.name if profile.path else "profile"
    meta = profile.metadata.get("model")
    if not isinstance(meta, dict) or not isinstance(meta.get("shape"), dict):
        raise ModelError(f"{name}: metadata has no model.shape, so it cannot be checked against {workload.name}")
    want = workload.model.shape.as_dict()
    for key, value in want.items():
        got = meta["shape"].get(key)
        if got is None or (got != value and not (isinstance(value, float) and math.isclose(got, value))):
            raise ModelError(
                f"{name}: measured for another model shape (model.shape.{key}={got!r}, "
                f"workload {workload.name} has {value!r})"
            )
    for key, value in (("dtype", workload.model.dtype), ("tensor_parallel_size", workload.model.tensor_parallel_size)):
        if meta.get(key) != value:
            raise ModelError(f"{name}: measured with model.{key}={meta.get(key)!r}, "
                             f"workload {workload.name} has {value!r}")


def _meta_bytes(profile: Profile, key: str) -> int | None:
    value = profile.metadata.get(key)
    if value is None:
        return None
    name = profile.path.name if profile.path else "profile"
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ModelError(f"{name}: metadata {key}={value!r} must be a byte count >= 0")
    return int(value)


class _Curve:
    """A measured quantity over widths, interpolated linearly between measured widths, flat below the first
    and extended along the last segment's slope above the last (monotone when asked)."""

    def __init__(self, points: dict[int, float], *, monotone: bool) -> None:
        xs = sorted(points)
        ys = np.array([points[x] for x in xs], dtype=float)
        if monotone:
            # Noise can make a wider step read faster; a wider step never does less work, so take the running max.
            ys = np.maximum.accumulate(ys)
        self.x = np.array(xs, dtype=float)
        self.y = ys
        self.slope = max(0.0, (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])) if len(xs) > 1 else 0.0

    def __call__(self, widths: np.ndarray | Sequence[int] | int) -> np.ndarray:
        w = np.asarray(widths, dtype=float)
        out = np.interp(w, self.x, self.y)
        above = w > self.x[-1]
        if np.any(above):
            out = np.where(above, self.y[-1] + self.slope * (w - self.x[-1]), out)
        return out

    @property
    def max_width(self) -> int:
        return int(self.x[-1])


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
    notes: list[str] = field(default_factory=list, repr=False)
    """Assumptions made while fitting (printed in the report)."""

    @classmethod
    def from_files(cls, profile_csv: str | Path, workload: Workload, **kwargs: object) -> CostModel:
        try:
            profile = read_profile(profile_csv)
        except ProfileError as exc:
            raise ModelError(str(exc)) from None
        return cls(profile, workload, **kwargs)  # type: ignore[arg-type]

    def __post_init__(self) -> None:
        if self.piecewise_fallback not in ("eager", "full"):
            raise ModelError(f"piecewise_fallback={self.piecewise_fallback!r} must be eager or full")
        check_profile_matches(self.profile, self.workload)
        name = self.profile.path.name if self.profile.path else "profile"
        s = self.workload.serving
        self.serving = s
        self.q = s.decode_query_len
        self.decode_limit = self.q * s.max_num_seqs
        probe = s.dispatcher([1])
        self.cudagraph_mode = probe.cudagraph_mode
        self.mixed_mode = probe.mixed_mode
        self.decode_mode = probe.decode_mode
        self.separate_decode = probe.separate_decode

        eager = self.profile.by_mode("eager")
        full = self.profile.by_mode("full")
        piecewise = self.profile.by_mode("piecewise")
        if not eager:
            raise ModelError(f"{name}: no eager rows with status ok")
        self.eager_ms = _Curve({w: r.latency_ms for w, r in eager.items()}, monotone=True)  # type: ignore[misc]
        if not full and self.cudagraph_mode != "NONE":
            raise ModelError(f"{name}: no full rows with status ok (no graph was measured; a CPU profile?)")
        self.full_ms = (_Curve({w: r.latency_ms for w, r in full.items()}, monotone=True)  # type: ignore[misc]
                        if full else None)
        self.full_standalone = self._memory_curve(full, "standalone_bytes", name, "full")
        self.full_delta = self._memory_curve(full, "capture_delta_bytes", name, "full")
        if piecewise:
            self.piecewise_ms = _Curve({w: r.latency_ms for w, r in piecewise.items()},  # type: ignore[misc]
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
        # Widths whose capture ran out of memory while profiling: no list may hold them.
        self.oom_widths = sorted({r.num_tokens for r in self.profile.rows if r.mode != "eager" and r.status == "oom"})

        total = _meta_bytes(self.profile, "total_memory_bytes")
        if total is None:
            raise ModelError(f"{name}: metadata total_memory_bytes is missing (a CPU profile?); the KV budget needs a "
                             f"GPU profile")
        activation = _meta_bytes(self.profile, "activation_peak_bytes")
        if activation is None:
            raise ModelError(f"{name}: metadata activation_peak_bytes is missing; the KV budget needs it")
        weights = _meta_bytes(self.profile, "weights_bytes")
        source = "profile"
        if weights is None:
            weights = self.workload.model.weight_bytes()
            source = "workload"
            self.notes.append(f"weights_bytes missing in {name}: using {weights / GIB:.2f} GiB computed from the "
                              f"model shape")
        self.budget = KvBudget(total, s.gpu_memory_utilization, weights, activation, self.workload.required_kv_bytes,
                               source)

        steps = self.workload.steps()
        if not steps:
            raise ModelError(f"workload {self.workload.name}: has no steps")
        self.steps: list[Step] = steps
        widths = np.array([st.num_tokens for st in steps], dtype=np.int64)
        uniform = np.array([st.uniform_decode for st in steps], dtype=bool)
        probs = np.array([st.probability for st in steps], dtype=float)
        self._widths, self._uniform, self._probs = widths, uniform, probs
        self._eager_at_step = self.eager_ms(widths)
        self.mean_tokens = float(np.dot(probs, widths))
        top = int(widths.max())
        if top > self.eager_ms.max_width:
            self.notes.append(
                f"steps up to {top} tokens but eager latency measured only up to {self.eager_ms.max_width}: "
                f"extrapolated along the last measured slope"
            )
        self.candidates = self._candidates()
        defaults = s.defaults()
        self.default_sizes = tuple(defaults.sizes)

    # ------------------------------------------------------------------ fitting helpers
    @staticmethod
    def _memory_curve(rows: dict, column: str, name: str, mode: str) -> _Curve | None:
        points = {}
        for w, r in rows.items():
            value = getattr(r, column)
            # A negative reading ("took -4.58 GiB") is an invalid measurement, not a number: interpolate over it.
            if value is not None and value >= 0:
                points[w] = float(value)
        if not rows:
            return None
        if not points:
            hint = " (profiled with --no-standalone?)" if column == "standalone_bytes" else ""
            raise ModelError(f"{name}: no {mode} row has a usable {column}{hint}; the graph-memory model needs it")
        return _Curve(points, monotone=column == "standalone_bytes")

    def _candidates(self) -> list[int]:
        """Widths worth offering the search: measured as a graph (ok), within the token budget."""
        if self.cudagraph_mode == "NONE":
            return []
        s = self.serving
        ok = set(self.profile.by_mode("full"))
        # `unsupported` piecewise rows (the profiler does not build vLLM's split graphs) do not rule a width out;
        # a capture that ran out of memory in any graph mode does.
        bad = set(self.oom_widths)
        widths = sorted(w for w in ok - bad if w <= s.max_num_batched_tokens)
        if self.cudagraph_mode == "FULL_DECODE_ONLY":
            # Only the rounded decode graphs exist in this mode, so multiples of q within max_num_seqs lose nothing.
            widths = [w for w in widths if w % self.q == 0 and w <= self.decode_limit]
        return widths

    # ------------------------------------------------------------------ latency
    def graph_latency_ms(self, widths: np.ndarray | Sequence[int] | int, mode: str) -> np.ndarray:
        """Latency of replaying a graph of `mode` (FULL or PIECEWISE) at each width."""
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

    def _mode_latency(self, mode: str, widths: np.ndarray) -> np.ndarray:
        return self.eager_ms(widths) if mode == "NONE" else self.graph_latency_ms(widths, mode)

    def _step_latencies(self, sizes: Sequence[int]) -> np.ndarray:
        """Latency of every workload step under vLLM's dispatch for `sizes` (Dispatcher.dispatch, vectorised)."""
        w, uniform = self._widths, self._uniform
        out = self._eager_at_step.copy()
        if self.cudagraph_mode == "NONE" or not sizes:
            return out
        d = self._dispatcher(sizes)
        mixed = np.array(d.mixed_graph_sizes, dtype=np.int64)
        decode = np.array(d.decode_graph_sizes, dtype=np.int64)
        pending = np.ones(len(w), dtype=bool)
        if len(decode):
            idx = np.searchsorted(decode, w, side="left")
            hit = uniform & (idx < len(decode))
            if np.any(hit):
                out[hit] = self.graph_latency_ms(decode[idx[hit]], "FULL")
            pending &= ~hit
        if len(mixed):
            idx = np.searchsorted(mixed, w, side="left")
            inside = pending & (idx < len(mixed))
            for is_uniform in (False, True):
                mode = self.decode_mode if is_uniform and not d.separate_decode else self.mixed_mode
                sel = inside & (uniform == is_uniform)
                if mode != "NONE" and np.any(sel):
                    out[sel] = self.graph_latency_ms(mixed[idx[sel]], mode)
        return out

    def _dispatcher(self, sizes: Sequence[int]) -> Dispatcher:
        return self.serving.dispatcher(sizes)

    def step_latency_ms(self, num_tokens: int, uniform_decode: bool, capture_sizes: Sequence[int]) -> float:
        """Latency of one step: the graph at the padded width, or eager at its own width."""
        d = self._dispatcher(sorted(set(capture_sizes)))
        dispatch = d.dispatch(num_tokens, uniform_decode=uniform_decode)
        if dispatch.eager:
            return float(self.eager_ms(num_tokens))
        return float(self.graph_latency_ms(dispatch.padded_size, dispatch.runtime_mode))  # type: ignore[arg-type]

    def expected_step_ms(self, capture_sizes: Sequence[int]) -> float:
        """Expected step latency over the workload's steps."""
        return float(np.dot(self._probs, self._step_latencies(self._normalise(capture_sizes))))

    def per_token_ms(self, capture_sizes: Sequence[int]) -> float:
        """Expected step latency per token of the expected step."""
        return self.expected_step_ms(capture_sizes) / self.mean_tokens

    def step_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The workload's steps as arrays: widths, uniform-decode flags, probabilities, eager latency (ms)."""
        return self._widths, self._uniform, self._probs, self._eager_at_step

    def eager_step_ms(self) -> float:
        """Expected step latency with no graphs at all."""
        return float(np.dot(self._probs, self._eager_at_step))

    # ------------------------------------------------------------------ memory
    def graph_bytes(self, mode: str, widths: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(standalone, capture delta) bytes of graphs of `mode` at each width."""
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
        return self._dispatcher(self._normalise(capture_sizes)).graphs()

    def graph_memory_bytes(self, capture_sizes: Sequence[int]) -> int:
        """The first-captured graph's standalone footprint plus every later graph's capture delta: vLLM captures
        PIECEWISE graphs, then FULL decode graphs, each largest first, into one shared pool."""
        graphs = self.graphs(capture_sizes)
        if not graphs:
            return 0
        total = 0.0
        for mode in ("PIECEWISE", "FULL"):
            widths = [w for m, w in graphs if m == mode]
            if widths:
                total += float(self.graph_bytes(mode, widths)[1].sum())
        first_mode, first_width = graphs[0]
        sa, de = self.graph_bytes(first_mode, [first_width])
        total += max(0.0, float(sa[0] - de[0]))
        return int(total)

    def kv_available_bytes(self, capture_sizes: Sequence[int]) -> int:
        return self.budget.kv_available_bytes(self.graph_memory_bytes(capture_sizes))

    # ------------------------------------------------------------------ all together
    def _normalise(self, capture_sizes: Iterable[int]) -> tuple[int, ...]:
        # vLLM drops explicit sizes above the token budget, deduplicates and sorts.
        return tuple(sorted({int(s) for s in capture_sizes if 1 <= int(s) <= self.serving.max_num_batched_tokens}))

    def evaluate(self, capture_sizes: Iterable[int]) -> Evaluation:
        """Expected latency, graph memory and KV left for one list."""
        sizes = self._normalise(capture_sizes)
        expected = self.expected_step_ms(sizes)
        memory = self.graph_memory_bytes(sizes)
        bad = [w for w in sizes if w in set(self.oom_widths)]
        reason = f"width {bad[-1]} ran out of memory while the profile captured it" if bad else ""
        return Evaluation(
            capture_sizes=sizes,
            expected_step_ms=expected,
            per_token_ms=expected / self.mean_tokens,
            graph_memory_bytes=memory,
            kv_available_bytes=self.budget.kv_available_bytes(memory),
            required_kv_bytes=self.budget.required_kv_bytes,
            reason=reason,
        )

    def ideal(self) -> Evaluation:
        """Every width a step can have captured, memory ignored: each step replays a graph of its own width."""
        top = int(self._widths.max())
        return self.evaluate(range(1, top + 1))
