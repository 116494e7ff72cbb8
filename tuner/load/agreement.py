"""How closely the load model's schedule agrees with a real server's: the step widths vLLM's own
`vllm:iteration_tokens_total` would have observed of the simulated steps, both histograms over the server's buckets,
their total-variation distance, the mean widths and the TPOT medians, as relative errors.

What the server's histogram observes is not the scheduled tokens of every step. vLLM 0.32/0.33 observes, once per
batch of engine outputs that holds any request output (`v1/engine/async_llm.py` makes IterationStats only when
`outputs.outputs` is non-empty), `prompt_token_stats.computed + num_generation_tokens` (`v1/metrics/loggers.py`):
the generated tokens of the step, plus the WHOLE prompt of each request whose first token the step produced (the
prompt's PrefillStats travel with its first output, `scheduler.update_from_output` / `v1/metrics/stats.py`). So a
step that only advances a prompt chunk and decodes nothing is not observed at all, and a chunked prompt is counted in
full at its last chunk's step. `observed_widths` applies that rule to the simulated steps, so the two histograms are
the same quantity; the scheduled widths stay in the LoadResult.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tuner.load.scheduler import Schedule
from tuner.workload.load import LoadError
from tuner.model.costmodel import CostModel
from tuner.workload.traffic.metrics import TokenHistogram

__all__ = ["Agreement", "bucket_counts", "compare_to_server", "histogram_counts", "observed_widths", "relative_error",
           "total_variation", "with_host_overhead"]


def observed_widths(run: Schedule) -> np.ndarray:
    """What vLLM's `iteration_tokens_total` observes of each simulated step that produced output (module docstring):
    the step's output tokens plus the whole prompt of every request whose first token it produced, in step order;
    steps that produced nothing are left out, as the server leaves them out."""
    steps, reqs = run.steps, run.requests
    start = np.asarray(steps.start_s, dtype=float)
    # The scheduler stamps a request's first token with its step's end, computed the same way (start + ms / 1000).
    end = start + np.asarray(steps.step_ms, dtype=float) / 1000.0
    produced = np.asarray(steps.produced, dtype=np.int64)
    first = reqs.first_token_s
    got = ~np.isnan(first)
    prompt_at_step = np.zeros(len(start), dtype=np.int64)
    if got.any() and len(end):
        at = np.minimum(np.searchsorted(end, first[got], side="left"), len(end) - 1)
        np.add.at(prompt_at_step, at, reqs.prompt[got])
    width = produced + prompt_at_step
    return width[produced > 0]


def histogram_counts(h: TokenHistogram) -> np.ndarray:
    """Steps in each of the histogram's buckets (`lower < width <= upper`, the last one up to +Inf)."""
    return np.array([n for _, _, n in h.buckets()], dtype=float)


def bucket_counts(widths: np.ndarray | Sequence[int], bounds: Sequence[float]) -> np.ndarray:
    """Widths counted into the buckets of `bounds` as Prometheus does (`lower < width <= upper`, then +Inf)."""
    edges = np.asarray(bounds, dtype=float)
    if len(edges) and np.any(np.diff(edges) <= 0):
        raise LoadError(f"bounds={list(bounds)!r} must be strictly ascending")
    idx = np.searchsorted(edges, np.asarray(widths, dtype=float), side="left")
    return np.bincount(idx, minlength=len(edges) + 1).astype(float)


def total_variation(p: np.ndarray | Sequence[float], q: np.ndarray | Sequence[float]) -> float:
    """Total-variation distance of two histograms over the same buckets, each normalised: 1/2 sum |p_i - q_i|, in
    [0, 1] (0: the same shape; 1: no bucket in common)."""
    a, b = np.asarray(p, dtype=float), np.asarray(q, dtype=float)
    if a.shape != b.shape:
        raise LoadError(f"histograms of {a.shape} and {b.shape} buckets: total variation needs the same buckets")
    if (a < 0).any() or (b < 0).any() or a.sum() <= 0 or b.sum() <= 0:
        raise LoadError("total variation needs two histograms of counts >= 0 with at least one step each")
    return float(0.5 * np.abs(a / a.sum() - b / b.sum()).sum())


def relative_error(model: float | None, measured: float | None) -> float | None:
    """(model - measured) / measured: the model's signed error relative to the measurement; None when either is
    missing, inf when the measurement is 0 and the model is not."""
    if model is None or measured is None:
        return None
    if measured == 0:
        return 0.0 if model == 0 else math.inf
    return (model - measured) / measured


class _HostOverhead(CostModel):
    """A cost model whose every step also pays the server's host work around the forward (with_host_overhead)."""

    def __init__(self, model: CostModel, overhead_ms: float, per_request_ms: float) -> None:
        super().__init__(model.profile, model.workload, **model.settings())
        self.overhead_ms = overhead_ms
        self.per_request_ms = per_request_ms

    def step_latency_ms(self, num_tokens: int, uniform_decode: bool, capture_sizes: Sequence[int], *,
                        query_len: int | None = None, num_reqs: int | None = None) -> float:
        forward = super().step_latency_ms(num_tokens, uniform_decode, capture_sizes, query_len=query_len,
                                          num_reqs=num_reqs)
        return forward + self.overhead_ms + self.per_request_ms * (max(num_reqs or 1, 1) - 1)


def with_host_overhead(model: CostModel, overhead_ms: float, per_request_ms: float = 0.0) -> CostModel:
    """The same cost model with every step `overhead_ms` + `per_request_ms` x (its requests - 1) slower: a profile
    times the model runner's forward, a server's step also pays the engine's own work around it (scheduling,
    sampling, output processing and streaming, the last ones per request), measured separately and added here."""
    for name, value in (("overhead_ms", overhead_ms), ("per_request_ms", per_request_ms)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise LoadError(f"{name}={value!r} must be finite")
    return _HostOverhead(model, float(overhead_ms), float(per_request_ms))


@dataclass(frozen=True)
class Agreement:
    """A server's run against the load model's schedule of the same arrivals: each figure server-side and
    model-side, the relative errors (model vs server) and the histograms' distance."""

    bounds: tuple[float, ...]
    """The server's histogram bounds (`le`), the +Inf bucket implied."""
    server_counts: tuple[float, ...]
    """Server steps per bucket over the run (lower < width <= upper, the last up to +Inf)."""
    model_counts: tuple[float, ...]
    """Simulated observed steps per bucket."""
    server_steps: float
    """Steps the server observed."""
    model_steps: int
    """Simulated steps that would be observed (they produced output)."""
    server_mean_width: float
    """The server's histogram sum / count."""
    model_mean_width: float
    """The mean of the simulated observed widths."""
    server_tpot_p50_ms: float
    """Median TPOT of the server's finished requests, measured at the client."""
    model_tpot_p50_ms: float
    """Median TPOT of the simulated requests."""
    server_tpot_mean_ms: float | None
    """Mean TPOT of the server's requests by the engine's own clock (vLLM's TPOT histogram's sum / count), if given."""
    model_tpot_mean_ms: float
    """Mean TPOT of the simulated requests."""
    tv_distance: float
    """Total-variation distance of the two histograms."""

    @property
    def width_error(self) -> float:
        """Mean observed width: (model - server) / server."""
        return relative_error(self.model_mean_width, self.server_mean_width)  # type: ignore[return-value]

    @property
    def tpot_error(self) -> float:
        """TPOT p50: (model - server) / server."""
        return relative_error(self.model_tpot_p50_ms, self.server_tpot_p50_ms)  # type: ignore[return-value]

    @property
    def tpot_mean_error(self) -> float | None:
        """Mean TPOT, the engine's clock: (model - server) / server; None without the server's figure."""
        return relative_error(self.model_tpot_mean_ms, self.server_tpot_mean_ms)

    @property
    def steps_error(self) -> float:
        """Observed steps: (model - server) / server."""
        return relative_error(float(self.model_steps), self.server_steps)  # type: ignore[return-value]

    def lines(self) -> list[str]:
        """The comparison as text, one figure a line."""
        labels = [f"<={b:g}" for b in self.bounds] + ["+Inf"]
        hist = ", ".join(f"{lab}: {int(s)}/{int(m)}" for lab, s, m in zip(labels, self.server_counts,
                                                                          self.model_counts) if s or m)
        engine = f"{self.server_tpot_mean_ms:.3f} ms" if self.server_tpot_mean_ms is not None else "not given"
        mean_error = f" ({self.tpot_mean_error:+.1%})" if self.tpot_mean_error is not None else ""
        return [f"mean observed width: server {self.server_mean_width:.2f}, model {self.model_mean_width:.2f} "
                f"({self.width_error:+.1%})",
                f"TPOT p50: server (client clock) {self.server_tpot_p50_ms:.3f} ms, model {self.model_tpot_p50_ms:.3f} "
                f"ms ({self.tpot_error:+.1%})",
                f"TPOT mean: server (engine clock) {engine}, model {self.model_tpot_mean_ms:.3f} ms{mean_error}",
                f"observed steps: server {int(self.server_steps)}, model {self.model_steps} ({self.steps_error:+.1%})",
                f"total-variation distance of the step-width histograms: {self.tv_distance:.3f}",
                f"steps per bucket, server/model: {hist}"]


def compare_to_server(server: TokenHistogram, server_tpot_ms: np.ndarray | Sequence[float], run: Schedule, *,
                      server_tpot_mean_ms: float | None = None) -> Agreement:
    """Compare a server's step-width histogram and client-measured TPOTs (and, if given, its mean TPOT by the engine's
    clock) with the load model's schedule `run` of the same arrivals (the model's TPOT over its finished requests,
    every request counted: no warm-up cut on either side)."""
    if server.count <= 0 or server.sum is None:
        raise LoadError("the server's iteration_tokens histogram holds no steps (or no _sum) over the run")
    tpots = np.asarray(server_tpot_ms, dtype=float)
    if not len(tpots):
        raise LoadError("server_tpot_ms holds no TPOT: no request finished")
    widths = observed_widths(run)
    if not len(widths):
        raise LoadError("the schedule holds no step that produced output")
    reqs = run.requests
    done = ~np.isnan(reqs.finish_s) & (reqs.output > 1)
    if not done.any():
        raise LoadError("the schedule finished no request with two tokens or more")
    model_tpot = (reqs.finish_s[done] - reqs.first_token_s[done]) / (reqs.output[done] - 1) * 1000.0
    s_counts = histogram_counts(server)
    m_counts = bucket_counts(widths, server.bounds)
    return Agreement(bounds=tuple(server.bounds), server_counts=tuple(s_counts), model_counts=tuple(m_counts),
                     server_steps=float(server.count), model_steps=len(widths),
                     server_mean_width=float(server.sum / server.count), model_mean_width=float(widths.mean()),
                     server_tpot_p50_ms=float(np.median(tpots)), model_tpot_p50_ms=float(np.median(model_tpot)),
                     server_tpot_mean_ms=server_tpot_mean_ms, model_tpot_mean_ms=float(model_tpot.mean()),
                     tv_distance=total_variation(s_counts, m_counts))
