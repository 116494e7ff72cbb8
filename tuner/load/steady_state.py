"""The steady state of a simulated load: the warm-up cut and the figures an operator asks about (step widths, TPOT,
ITL, TTFT, throughput, queue), read from the scheduler's step records and the requests' times.

The warm-up rule: the first `warmup_share` (default 20%) of the simulated time is dropped. Step figures count the
steps that START at or after the cut; request figures count the requests that ARRIVE at or after it (a saturated
start's backlog arrives at t = 0, so it is never counted), each figure over those that got that far by the end
(TTFT: a first token; TPOT, end-to-end: finished); the ones that did not are counted (`num_unfinished`), not hidden.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tuner.load.arrivals import Requests
from tuner.workload.load import Load

__all__ = ["BACKLOG_SLACK", "DEFAULT_WARMUP_SHARE", "LoadResult", "StepRecord", "steady_state"]

DEFAULT_WARMUP_SHARE = 0.2
"""Share of the simulated time dropped as warm-up."""
BACKLOG_SLACK = 0.05
"""A load is kept up with when its waiting queue grows over the measured window by at most this share of the window's
arrivals (plus 2 requests, for small counts): a queue that grows faster is an overload, whatever its TPOT says."""


@dataclass
class StepRecord:
    """What the scheduler did each step (plain lists: appending is the cheapest thing a step can do; the scheduler
    appends to each itself)."""

    start_s: list[float] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    uniform: list[bool] = field(default_factory=list)
    decoded: list[int] = field(default_factory=list)
    """Requests a decode advanced this step (each received output: one inter-token gap each)."""
    produced: list[int] = field(default_factory=list)
    """Output tokens the step produced (first tokens included)."""
    running: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    """Requests left waiting once the step's admissions were made."""
    wait_area: list[float] = field(default_factory=list)
    """Request-seconds waited inside the step by the requests that arrived during it."""
    scheduled: list[int] = field(default_factory=list)
    """Requests the step scheduled (decodes and prompt chunks): the request count its latency was costed at."""


@dataclass(frozen=True)
class LoadResult:
    """The steady state of one simulated load under one capture list."""

    seed: int
    """The load's seed."""
    rate_per_s: float | None
    """Poisson arrival rate (requests/s); None for given arrivals."""
    initial_waiting: int
    """Requests waiting at t = 0 (0: started empty; more: started saturated)."""
    capture_sizes: tuple[int, ...]
    """The list simulated."""
    end_s: float
    """Simulated time at the end."""
    warmup_s: float
    """The cut: figures are over [warmup_s, end_s]."""
    stopped_by: str
    """What ended the simulation: `duration`, `max_steps` or `arrivals done`."""
    num_steps_total: int
    """Steps simulated, warm-up included."""
    num_steps: int
    """Steps in the measured window."""
    num_requests: int
    """Requests arriving in the window."""
    num_completed: int
    """Of those, how many finished by the end."""
    num_unfinished: int
    """Of those, how many had not finished by the end (waiting or running)."""
    width_histogram: tuple[tuple[int, int], ...]
    """(step width in tokens, steps) over the window, ascending by width."""
    mean_step_width: float | None
    """Mean tokens per step over the window."""
    mean_step_ms: float | None
    """Mean step latency over the window."""
    uniform_share: float | None
    """Share of the window's steps that are uniform decode steps."""
    tpot_p50_ms: float | None
    """Time per output token, per request (finish - first token) / (output tokens - 1), median."""
    tpot_p99_ms: float | None
    tpot_mean_ms: float | None
    itl_p50_ms: float | None
    """Inter-token latency: each decode a step makes is one gap of the step's duration for its request, median."""
    itl_p99_ms: float | None
    ttft_p50_ms: float | None
    """Time to first token (first token - arrival), median."""
    ttft_p99_ms: float | None
    mean_e2e_s: float | None
    """Mean time in the system (finish - arrival) of the completed requests."""
    throughput_tok_s: float
    """Output tokens produced in the window per second of it."""
    mean_queue_len: float
    """Time-weighted mean of the waiting queue (arrived, not admitted) over the window."""
    mean_running: float
    """Time-weighted mean of the running requests over the window."""
    waiting_at_cut: int
    """Waiting requests at the window's first step."""
    waiting_end: int
    """Waiting requests at the end."""
    keeps_up: bool
    """The waiting queue grew over the window by at most BACKLOG_SLACK of its arrivals (+2): not an overload."""
    running_at_cut: int = 0
    """Requests running at the window's first step."""
    running_end: int = 0
    """Requests running at the end."""
    step_kinds: tuple[tuple[int, bool, int, int, int], ...] = field(default=(), repr=False, compare=False)
    """The window's steps by kind: (width, uniform decode, query length (0: mixed), requests scheduled, steps),
    ascending: the step distribution this list makes of the load (not in `as_dict`)."""

    def working_off(self, seats: int) -> bool:
        """Requests in the system (waiting + running) fell over the window by more than a house of `seats` (what a
        backlog admitted into the running seats leaves at a point it settles at) plus BACKLOG_SLACK of its arrivals
        (+2): a start still on its way down, not yet where it settles."""
        fell = (self.waiting_at_cut + self.running_at_cut) - (self.waiting_end + self.running_end)
        return fell > seats + BACKLOG_SLACK * self.num_requests + 2

    def came_back_to(self, other: LoadResult) -> bool:
        """This start ended its window with no more requests in the system (waiting + running) than `other` holds on
        average, give or take three Poisson spreads (+2): a saturated start back at the empty start's point by the
        end, whose window mixes its backlog being worked off with the point it came back to."""
        mean = other.mean_in_system
        return self.waiting_end + self.running_end <= mean + 3 * mean ** 0.5 + 2

    @property
    def mean_in_system(self) -> float:
        """Time-weighted mean of requests in the system (waiting + running): Little's L."""
        return self.mean_queue_len + self.mean_running

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["capture_sizes"] = list(self.capture_sizes)
        out["width_histogram"] = {w: n for w, n in self.width_histogram}
        out["mean_in_system"] = self.mean_in_system
        del out["step_kinds"]
        return out


def _pct(values: np.ndarray, p: float) -> float | None:
    return float(np.percentile(values, p)) if len(values) else None


def _weighted_pct(values: np.ndarray, weights: np.ndarray, p: float) -> float | None:
    """The smallest value whose cumulative weight reaches p% of the total (a sample repeated weight times)."""
    total = weights.sum()
    if total <= 0:
        return None
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[order])
    return float(values[order][min(int(np.searchsorted(cum, p / 100 * total, side="left")), len(cum) - 1)])


def steady_state(rec: StepRecord, reqs: Requests, load: Load, sizes: list[int], *, end_s: float, warmup_share: float,
                 steps_total: int, stopped_by: str, waiting_end: int) -> LoadResult:
    """The figures of the window after the warm-up cut (module docstring)."""
    cut = warmup_share * end_s
    window = end_s - cut
    start = np.array(rec.start_s)
    sel = start >= cut
    step_ms = np.array(rec.step_ms)[sel]
    tokens = np.array(rec.tokens, dtype=np.int64)[sel]
    widths, counts = np.unique(tokens, return_counts=True)
    decoded = np.array(rec.decoded, dtype=np.int64)[sel]
    running = np.array(rec.running, dtype=np.int64)[sel]
    waiting = np.array(rec.waiting, dtype=np.int64)[sel]
    dt_s = step_ms / 1000.0
    queue_area = float(np.dot(waiting, dt_s)) + float(np.array(rec.wait_area)[sel].sum())
    running_area = float(np.dot(running, dt_s))
    n = len(reqs.finish_s)
    arrival = reqs.arrival_s[:n]
    mine = (arrival >= cut) & (arrival <= end_s)
    first, finish, out = reqs.first_token_s[mine], reqs.finish_s[mine], reqs.output[:n][mine]
    done = ~np.isnan(finish)
    served = ~np.isnan(first)
    ttft = (first[served] - arrival[mine][served]) * 1000.0
    decoding = done & (out > 1)
    tpot = (finish[decoding] - first[decoding]) / (out[decoding] - 1) * 1000.0
    e2e = finish[done] - arrival[mine][done]
    waiting_at_cut = int(waiting[0]) if len(waiting) else waiting_end
    uniform_sel = np.array(rec.uniform, dtype=bool)[sel]
    scheduled = np.array(rec.scheduled, dtype=np.int64)[sel] if rec.scheduled else decoded
    kinds, kind_counts = (np.unique(np.stack([tokens, uniform_sel.astype(np.int64), scheduled]), axis=1,
                                    return_counts=True) if len(tokens) else (np.zeros((3, 0), dtype=np.int64),
                                                                              np.zeros(0, dtype=np.int64)))
    # A uniform step's requests each decode the same q tokens: its query length is its width over its requests.
    step_kinds = tuple((int(w), bool(u), int(w) // int(n) if u else 0, int(n), int(c))
                       for (w, u, n), c in zip(kinds.T, kind_counts))
    keeps_up = waiting_end - waiting_at_cut <= BACKLOG_SLACK * int(mine.sum()) + 2
    return LoadResult(
        seed=load.seed, rate_per_s=load.rate_per_s, initial_waiting=reqs.initial, capture_sizes=tuple(sizes),
        end_s=end_s, warmup_s=cut, stopped_by=stopped_by, num_steps_total=steps_total, num_steps=int(sel.sum()),
        num_requests=int(mine.sum()), num_completed=int(done.sum()), num_unfinished=int((~done).sum()),
        width_histogram=tuple((int(w), int(c)) for w, c in zip(widths, counts)),
        mean_step_width=float(tokens.mean()) if len(tokens) else None,
        mean_step_ms=float(step_ms.mean()) if len(step_ms) else None,
        uniform_share=float(np.array(rec.uniform, dtype=bool)[sel].mean()) if len(tokens) else None,
        tpot_p50_ms=_pct(tpot, 50), tpot_p99_ms=_pct(tpot, 99),
        tpot_mean_ms=float(tpot.mean()) if len(tpot) else None,
        itl_p50_ms=_weighted_pct(step_ms, decoded, 50), itl_p99_ms=_weighted_pct(step_ms, decoded, 99),
        ttft_p50_ms=_pct(ttft, 50), ttft_p99_ms=_pct(ttft, 99),
        mean_e2e_s=float(e2e.mean()) if len(e2e) else None,
        throughput_tok_s=float(np.array(rec.produced, dtype=np.int64)[sel].sum()) / window if window > 0 else 0.0,
        mean_queue_len=queue_area / window if window > 0 else 0.0,
        mean_running=running_area / window if window > 0 else 0.0,
        waiting_at_cut=waiting_at_cut, waiting_end=waiting_end, keeps_up=bool(keeps_up), step_kinds=step_kinds,
        running_at_cut=int(running[0]) if len(running) else 0,
        running_end=int(rec.running[-1]) if rec.running else 0,
    )
