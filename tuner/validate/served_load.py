"""`validate --rate`: the workload's load served to vLLM's engine for each list, against the load model's prediction of
the very same requests. The load is bounded and seeded: the first N Poisson arrivals at the rate, the workload's
`traffic.load` lengths drawn for them (`tuner.load.arrivals.Requests` of those arrival times, so the simulator sees the
same requests). The engine serves them in-process (`tuner.measure.vllm_engine.serve`); the prediction is
`tuner.load.simulate` of the list as the engine keeps it, its steps costed by the profile plus the engine's own work
around the forward, measured by two calibrations in the same process before the load (one request alone, then
`together` at once: the per-step and per-request host time a profile's forward leaves out)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tuner.validate.backend import ValidationError

if TYPE_CHECKING:
    from tuner.model.costmodel import CostModel
    from tuner.workload.load import Load

__all__ = ["CALIBRATION_TOKENS", "ServedLoad", "bounded_load", "compare_load", "measured_figures"]

CALIBRATION_TOKENS = 32
"""Output tokens of each calibration request (its TPOT is the mean over the gaps after the first)."""
BOOTSTRAP = 2000
"""Resamples of the requests for the 95% intervals."""


@dataclass(frozen=True)
class ServedLoad:
    """The bounded load validation serves (module docstring)."""

    rate_per_s: float
    """Poisson arrival rate (requests/s)."""
    load: Load
    """The N arrivals as given times, with the workload's lengths, acceptance and seed."""
    arrival_s: tuple[float, ...]
    prompt_tokens: tuple[int, ...]
    output_tokens: tuple[int, ...]
    limit_s: float
    """Wall seconds the engine may take over the load; requests still running then are cut (and reported)."""

    def request(self, vocab_size: int, together: int) -> dict[str, Any]:
        """What `serve_load` is given (prompt ids drawn with the load's seed)."""
        return {"arrival_s": list(self.arrival_s), "prompt_tokens": list(self.prompt_tokens),
                "output_tokens": list(self.output_tokens), "vocab_size": vocab_size, "seed": self.load.seed,
                "limit_s": self.limit_s, "calibration": {"output_tokens": CALIBRATION_TOKENS,
                                                         "prompt_tokens": min(self.prompt_tokens),
                                                         "together": together}}

    def as_dict(self) -> dict[str, Any]:
        return {"rate_per_s": self.rate_per_s, "requests": len(self.arrival_s), "seed": self.load.seed,
                "limit_s": self.limit_s, "last_arrival_s": self.arrival_s[-1],
                "prompt_tokens": self.load.prompt_tokens.as_dict(), "output_tokens": self.load.output_tokens.as_dict(),
                "acceptance": self.load.acceptance}


def bounded_load(workload_load: Load, rate_per_s: float, num_requests: int, *, limit_s: float) -> ServedLoad:
    """The first `num_requests` Poisson arrivals of the workload's load at `rate_per_s`, as given arrival times with
    the load's lengths drawn for them (ValidationError, one line, for a load the simulator refuses)."""
    from tuner.load.arrivals import Requests
    from tuner.workload.load import Load, LoadError

    try:
        poisson = Requests(workload_load.at_rate(rate_per_s))
        poisson.next_arrival_s(num_requests - 1)
        times = tuple(float(t) for t in poisson.arrival_s[:num_requests])
        given = Load(workload_load.prompt_tokens, workload_load.output_tokens, arrival_times_s=times,
                     acceptance=workload_load.acceptance, seed=workload_load.seed, notes=workload_load.notes)
    except LoadError as exc:
        raise ValidationError(f"--rate: {exc}") from None
    reqs = Requests(given)
    return ServedLoad(rate_per_s, given, times, tuple(int(x) for x in reqs.prompt), tuple(int(x) for x in reqs.output),
                      limit_s)


def _tpot_ms(token_s: Sequence[float]) -> float | None:
    return (token_s[-1] - token_s[0]) / (len(token_s) - 1) * 1e3 if len(token_s) > 1 else None


def _interval(values: np.ndarray, seed: int) -> list[float] | None:
    """95% bootstrap interval of the mean over `values` (None with fewer than 2)."""
    if len(values) < 2:
        return None
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), size=(BOOTSTRAP, len(values)))].mean(axis=1)
    return [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]


def measured_figures(run: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    """TPOT, ITL, TTFT and throughput of a served run (`serve._run`'s record), by the engine loop's clock: TPOT per
    finished request (last token - first) / (tokens - 1), ITL every gap between a request's successive output times
    (tokens one step emits together are one gap), TTFT first token - planned arrival, throughput output tokens over
    the time from the first arrival to the last token; means with 95% bootstrap intervals over the requests."""
    tokens = run["token_s"]
    finished = [k for k, ts in enumerate(tokens) if len(ts) >= run["output_tokens"][k]]
    tpot = np.array([t for t in (_tpot_ms(tokens[k]) for k in finished) if t is not None])
    gaps = [np.diff(np.unique(ts)) * 1e3 for ts in tokens if len(ts) > 1]
    itl = np.concatenate(gaps) if gaps else np.zeros(0)
    ttft = np.array([(ts[0] - run["arrival_s"][k]) * 1e3 for k, ts in enumerate(tokens) if ts])
    produced = sum(len(ts) for ts in tokens)
    end = max((ts[-1] for ts in tokens if ts), default=0.0)
    per_request_itl = np.array([g.mean() for g in gaps if len(g)])

    def pct(values: np.ndarray, p: float) -> float | None:
        return float(np.percentile(values, p)) if len(values) else None

    return {"requests": len(tokens), "finished": len(finished), "cut_by_limit": run["cut_by_limit"],
            "tpot_mean_ms": float(tpot.mean()) if len(tpot) else None, "tpot_mean_ci_ms": _interval(tpot, seed),
            "tpot_p50_ms": pct(tpot, 50), "tpot_p99_ms": pct(tpot, 99),
            "itl_mean_ms": float(itl.mean()) if len(itl) else None,
            "itl_mean_ci_ms": _interval(per_request_itl, seed + 1), "itl_p50_ms": pct(itl, 50),
            "itl_p99_ms": pct(itl, 99), "ttft_p50_ms": pct(ttft, 50), "ttft_p99_ms": pct(ttft, 99),
            "throughput_tok_s": produced / end if end > 0 else None, "engine_steps": len(run["steps_ms"]),
            "mean_engine_step_ms": float(np.mean(run["steps_ms"])) if run["steps_ms"] else None}


def host_overhead(model: CostModel, sizes: Sequence[int], calibration: dict[str, Any]) -> dict[str, float]:
    """The engine's own work per step and per request beyond the profile's forward, from the two calibrations: one
    request alone, its TPOT (x the load's tokens per step) minus the predicted step of one decode request; then
    `together` requests at once, what their step takes beyond that and the alone step's overhead, per request past
    the first. Never below 0 (a profile slower than the engine charges no negative work)."""
    q = model.q
    alone, together = calibration["alone"], calibration["together"]
    tpot_alone = _tpot_ms(alone["token_s"][0]) or 0.0
    n = len(together["token_s"])
    tpot_together = float(np.mean([t for t in (_tpot_ms(ts) for ts in together["token_s"]) if t is not None]))
    step_alone = model.step_latency_ms(q, True, sizes, query_len=q, num_reqs=1)
    step_together = model.step_latency_ms(q * n, True, sizes, query_len=q, num_reqs=n)
    overhead = max(0.0, tpot_alone - step_alone)
    per_request = max(0.0, (tpot_together - step_together - overhead) / (n - 1)) if n > 1 else 0.0
    return {"overhead_ms": overhead, "per_request_ms": per_request, "calibration_tpot_alone_ms": tpot_alone,
            "calibration_tpot_together_ms": tpot_together, "together": n,
            "predicted_step_alone_ms": step_alone, "predicted_step_together_ms": step_together}


_FIGURES = ("tpot_mean_ms", "tpot_p50_ms", "tpot_p99_ms", "itl_p50_ms", "itl_p99_ms", "ttft_p50_ms", "throughput_tok_s")


def compare_load(model: CostModel, sizes: Sequence[int], served: ServedLoad, result: dict[str, Any],
                 seed: int = 0) -> dict[str, Any]:
    """validation.json's `load` entry of one list: the load, what the engine measured, the host overhead its
    calibrations measured, the load model's prediction of the same requests under the list as the engine keeps it
    (`sizes`) with that overhead, and each figure's predicted / measured - 1."""
    from tuner.load import simulate, with_host_overhead

    measured = measured_figures(result["load"], seed)
    overhead = host_overhead(model, sizes, result["calibration"])
    costed = with_host_overhead(model, overhead["overhead_ms"], overhead["per_request_ms"])
    predicted = simulate(costed, sizes, served.load, warmup_share=0.0).as_dict()
    errors = {k: (predicted[k] / measured[k] - 1.0 if predicted.get(k) is not None and measured.get(k) else None)
              for k in _FIGURES}
    inside = None
    ci = measured["tpot_mean_ci_ms"]
    if ci is not None and predicted.get("tpot_mean_ms") is not None:
        inside = bool(ci[0] <= predicted["tpot_mean_ms"] <= ci[1])
    return {"served": served.as_dict(), "measured": measured, "host_overhead": overhead,
            "predicted": {k: predicted.get(k) for k in (*_FIGURES, "mean_step_width", "mean_step_ms", "num_completed",
                                                         "keeps_up")},
            "errors": {k: (v if v is None or math.isfinite(v) else None) for k, v in errors.items()},
            "predicted_tpot_in_measured_interval": inside}
