"""The trace a validation replays: steps drawn from the workload's step distribution with a seed (so every list
and every run replays the same sequence), each planned as the engine dispatches it under one list, the cost model's
latency for each planned step, and the statistics of the timings measured for them."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tuner.steps import Step

if TYPE_CHECKING:
    from tuner.engines.engine import GraphDispatcher
    from tuner.model.costmodel import CostModel

__all__ = ["PlannedStep", "dispatch_counts", "plan_trace", "predicted_trace_step_ms", "sample_trace",
           "step_statistics"]


def sample_trace(steps: Sequence[Step], num_steps: int, seed: int) -> list[Step]:
    """`num_steps` steps drawn independently from the workload's step distribution with a seeded generator, so
    two lists (and two runs) replay the very same sequence."""
    if num_steps < 1:
        raise ValueError(f"{num_steps=} must be >= 1")
    if not steps:
        raise ValueError("the workload has no steps to sample")
    probs = np.array([s.probability for s in steps], dtype=float)
    probs = probs / probs.sum()  # the distribution sums to 1 up to rounding; choice() insists on exactly
    idx = np.random.default_rng(seed).choice(len(steps), size=num_steps, p=probs)
    return [steps[i] for i in idx]


@dataclass(frozen=True)
class PlannedStep:
    """One trace step and what vLLM runs for it under one capture list."""

    num_tokens: int
    """Tokens in the step."""
    uniform_decode: bool
    """Every request has exactly q tokens."""
    runtime_mode: str
    """`FULL`, `PIECEWISE` or `NONE` (eager), as Dispatcher.dispatch says."""
    padded_size: int | None
    """Width of the graph replayed; None when eager."""

    @property
    def run_width(self) -> int:
        """Width the model body runs at: the padded width under a graph, the step's own width eagerly."""
        return self.padded_size if self.padded_size is not None else self.num_tokens

    @property
    def key(self) -> tuple[str, int]:
        """What is actually run: the same key means the same kernels (used to warm up and to group timings)."""
        return self.runtime_mode, self.run_width


def plan_trace(trace: Sequence[Step], dispatcher: GraphDispatcher) -> list[PlannedStep]:
    """Dispatch every step of the trace as the engine would with the dispatcher's capture list."""
    cache: dict[tuple[int, bool, int | None], PlannedStep] = {}
    out = []
    for step in trace:
        k = (step.num_tokens, step.uniform_decode, step.query_len)
        planned = cache.get(k)
        if planned is None:
            d = dispatcher.dispatch(step.num_tokens, uniform_decode=step.uniform_decode, query_len=step.query_len)
            planned = cache[k] = PlannedStep(step.num_tokens, step.uniform_decode, d.runtime_mode, d.padded_size)
        out.append(planned)
    return out


def dispatch_counts(plan: Sequence[PlannedStep]) -> dict[str, int]:
    """Steps per runtime mode, plus the padding tokens graphs added (tokens run but not asked for)."""
    counts = Counter(p.runtime_mode for p in plan)
    return {
        "FULL": counts.get("FULL", 0),
        "PIECEWISE": counts.get("PIECEWISE", 0),
        "NONE": counts.get("NONE", 0),
        "tokens": sum(p.num_tokens for p in plan),
        "padding_tokens": sum(p.run_width - p.num_tokens for p in plan),
    }


def predicted_trace_step_ms(model: CostModel, plan: Sequence[PlannedStep]) -> list[float]:
    """The cost model's latency for each planned step (same dispatch, same widths), so measured and predicted
    means are compared on the very steps replayed and sampling noise drops out of the comparison."""
    cache: dict[tuple[str, int, int], float] = {}
    out = []
    for p in plan:
        key = p.key + (p.num_tokens,)
        ms = cache.get(key)
        if ms is None:
            # A graph step replays the padded body, then the logits of its real tokens (as vLLM, and as replayed).
            ms = float(model.eager_ms(p.num_tokens)) if p.runtime_mode == "NONE" else \
                float(model.graph_body_ms(p.run_width, p.runtime_mode) + model.logits_at(p.num_tokens))
            cache[key] = ms
        out.append(ms)
    return out


def _quantile(sorted_values: Sequence[float], p: float) -> float:
    from tuner.measure.timing import quantile  # the profile's quantile (tuner.measure loads torch: import late)

    return quantile(sorted_values, p)


def step_statistics(samples_ms: Sequence[float], plan: Sequence[PlannedStep]) -> dict[str, float]:
    """Mean, p50, p99 step latency and tokens per second (real tokens, padding excluded)."""
    if len(samples_ms) != len(plan) or not plan:
        raise ValueError(f"{len(samples_ms)} timings for {len(plan)} steps")
    s = sorted(samples_ms)
    total_ms = float(sum(samples_ms))
    tokens = sum(p.num_tokens for p in plan)
    return {
        "measured_step_ms": total_ms / len(s),
        "p50_step_ms": _quantile(s, 0.5),
        "p99_step_ms": _quantile(s, 0.99),
        "tokens_per_s": tokens / total_ms * 1e3 if total_ms > 0 else math.inf,
    }
