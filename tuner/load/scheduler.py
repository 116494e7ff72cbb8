"""vLLM's V1 scheduler, step by step, over a load's arrivals: which requests each step schedules and with how many
tokens, and how long the step lasts under a capture list (the cost model's step latency), so the step widths are the
ones the list itself makes of the load rather than a distribution taken as given.

The rules, as vLLM 0.33's `vllm/v1/core/sched/scheduler.py` schedules with chunked prefill on and plenty of KV cache:
- RUNNING requests first, in the order they were admitted: a decoding request takes q = 1 + num_speculative_tokens
  tokens of the step's budget (`max_num_batched_tokens`), or what is left of it when less (the rest take none and wait);
  a request still prefilling takes the rest of its prompt, or what is left of the budget (a chunk), and keeps its place.
- then WAITING requests in arrival order (FCFS), while the running count stays below `max_num_seqs` and budget
  remains: each is admitted and its prompt prefilled in a chunk of what is left of the budget.
- the step whose chunk ends a prompt gives the request its first token; each decode then advances it by the tokens
  the drafts and the verifier accept (`acceptance.py`, at most the tokens scheduled) until its output is done.
- a step is a uniform decode step when every scheduled request decodes q tokens (no prompt chunk, none cut short);
  its latency is `CostModel.step_latency_ms` at its tokens, uniformity, query length q and request count.
- time advances by the step; requests arriving during it join the waiting queue at its end; with nothing running or
  waiting, time jumps to the next arrival.
Left out: KV-cache block limits and preemption (the KV cache is taken to hold every running request), prefix caching,
`long_prefill_token_threshold`, max_model_len limits on a request's length, priority scheduling, a dynamic speculative
schedule's query length per batch size (q is the workload's), V1's counting a q-token prompt chunk as uniform (any
chunk makes a step mixed here), async scheduling, structured output, and the host's time between steps beyond what the
profile measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tuner.load.acceptance import AcceptanceDraws
from tuner.load.arrivals import Requests
from tuner.workload.load import Load, LoadError
from tuner.load.steady_state import DEFAULT_WARMUP_SHARE, LoadResult, StepRecord, steady_state
from tuner.model.costmodel import CostModel

__all__ = ["DEFAULT_DURATION_S", "DEFAULT_MAX_STEPS", "Schedule", "schedule", "simulate"]

DEFAULT_DURATION_S = 60.0
"""Simulated seconds of an open (Poisson) load when no duration is given."""
DEFAULT_MAX_STEPS = 1_000_000
"""Steps at most, whatever the duration: a safety stop for a list whose steps are very short."""


@dataclass(frozen=True)
class Schedule:
    """Every step the scheduler made and every request's times: the raw run a steady state is read from."""

    steps: StepRecord
    """What each step scheduled, how long it took, the queue around it."""
    requests: Requests
    """The requests, with their first-token and finish times (NaN: not reached by the end)."""
    capture_sizes: tuple[int, ...]
    """The list the steps were costed under."""
    end_s: float
    """Simulated time at the end."""
    stopped_by: str
    """`duration`, `max_steps` or `arrivals done`."""
    waiting_end: int
    """Requests still waiting at the end."""
    latencies_costed: int
    """Distinct (tokens, uniform, query length, requests) steps the cost model was asked about."""


def simulate(model: CostModel, capture_sizes: Sequence[int], load: Load, *, duration_s: float | None = None,
             max_steps: int = DEFAULT_MAX_STEPS, warmup_share: float = DEFAULT_WARMUP_SHARE,
             initial_waiting: int = 0) -> LoadResult:
    """Run the load through the scheduler under `capture_sizes` (`schedule`) and return its steady state, the first
    `warmup_share` of the simulated time dropped (`steady_state.py`)."""
    if not 0 <= warmup_share < 1:
        raise LoadError(f"warmup_share={warmup_share!r} must be in [0, 1)")
    run = schedule(model, capture_sizes, load, duration_s=duration_s, max_steps=max_steps,
                   initial_waiting=initial_waiting)
    return steady_state(run.steps, run.requests, load, list(run.capture_sizes), end_s=run.end_s,
                        warmup_share=warmup_share, steps_total=len(run.steps.start_s), stopped_by=run.stopped_by,
                        waiting_end=run.waiting_end)


def schedule(model: CostModel, capture_sizes: Sequence[int], load: Load, *, duration_s: float | None = None,
             max_steps: int = DEFAULT_MAX_STEPS, initial_waiting: int = 0) -> Schedule:
    """Run the load through the scheduler under `capture_sizes`, step by step (module docstring).

    Stops at `duration_s` of simulated time (Poisson loads: DEFAULT_DURATION_S when None; given arrivals: when every
    request is done, or at `duration_s` if given), or after `max_steps` steps. `initial_waiting` requests are in the
    waiting queue at t = 0 (a saturated start), ahead of the load's own arrivals."""
    s = model.serving
    q = int(model.q)
    budget_per_step = int(s.max_num_batched_tokens)
    max_seqs = int(s.max_num_seqs)
    load.check_query_len(q)
    if duration_s is None:
        duration_s = DEFAULT_DURATION_S if load.rate_per_s is not None else float("inf")
    elif not duration_s > 0:
        raise LoadError(f"duration_s={duration_s!r} must be > 0")
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise LoadError(f"max_steps={max_steps!r} must be an integer >= 1")
    if isinstance(initial_waiting, bool) or not isinstance(initial_waiting, int) or initial_waiting < 0:
        raise LoadError(f"initial_waiting={initial_waiting!r} must be an integer >= 0")
    sizes = sorted({int(x) for x in capture_sizes})

    reqs = Requests(load, initial=initial_waiting)
    # The acceptance draws are the seed's fourth stream (Requests holds the first three), so they do not shift with
    # the arrivals.
    draws = AcceptanceDraws(load.acceptance, q, np.random.SeedSequence(load.seed, spawn_key=(3,)))
    latency: dict[tuple[int, bool, int, int], float] = {}
    rec = StepRecord()
    # Bound appends: a step's bookkeeping is ten list appends, the cheapest a step can do.
    put_start, put_ms, put_tokens = rec.start_s.append, rec.step_ms.append, rec.tokens.append
    put_uniform, put_decoded, put_produced = rec.uniform.append, rec.decoded.append, rec.produced.append
    put_running, put_waiting, put_area = rec.running.append, rec.waiting.append, rec.wait_area.append
    put_scheduled = rec.scheduled.append

    now = 0.0
    arrived = reqs.arrived_by(now)
    admitted = 0
    dec_ids = np.empty(0, dtype=np.int64)  # decoding requests, in admission order
    dec_left = np.empty(0, dtype=np.int64)  # their output tokens still to come
    prefilling: list[list[int]] = []  # [id, prompt tokens still to prefill], in admission order, after the decoders
    steps = 0
    stopped_by = "max_steps"
    while steps < max_steps:
        if now >= duration_s:
            stopped_by = "duration"
            break
        n_dec = len(dec_ids)
        if n_dec == 0 and not prefilling and arrived == admitted:
            nxt = reqs.next_arrival_s(arrived)
            if nxt is None:
                stopped_by = "arrivals done"
                break
            if nxt >= duration_s:
                now = duration_s
                stopped_by = "duration"
                break
            now = nxt
            arrived = reqs.arrived_by(now)
            continue

        budget = budget_per_step
        # 1. Running requests that decode: q tokens each while the budget lasts; the first it cannot cover in full
        # gets what is left (vLLM caps num_new_tokens at the budget, dropping draft tokens), the rest none.
        full = min(n_dec, budget // q)
        budget -= full * q
        part = budget if full < n_dec else 0
        budget -= part
        scheduled = full + (1 if part else 0)
        # 2. Running requests still prefilling: the rest of the prompt, in a chunk of what is left.
        chunked = 0
        done_prefill: list[int] = []
        for entry in prefilling:
            if budget == 0:
                break
            take = min(entry[1], budget)
            entry[1] -= take
            budget -= take
            scheduled += 1
            chunked += 1
            if entry[1] == 0:
                done_prefill.append(entry[0])
        # 3. Waiting requests, in arrival order, while a seat and budget remain.
        while arrived > admitted and budget > 0 and n_dec + len(prefilling) < max_seqs:
            rid = admitted
            admitted += 1
            prompt = int(reqs.prompt[rid])
            take = min(prompt, budget)
            budget -= take
            scheduled += 1
            chunked += 1
            prefilling.append([rid, prompt - take])
            if take == prompt:
                done_prefill.append(rid)

        running = n_dec + len(prefilling)
        tokens = budget_per_step - budget
        uniform = chunked == 0 and part == 0
        query_len = q if uniform else 0
        key = (tokens, uniform, query_len, scheduled)
        step_ms = latency.get(key)
        if step_ms is None:
            step_ms = model.step_latency_ms(tokens, uniform, sizes, query_len=query_len or None, num_reqs=scheduled)
            latency[key] = step_ms
        end = now + step_ms / 1000.0

        # Decodes advance by their accepted tokens (never past their output); those with none left finish.
        produced = 0
        if full or part:
            n = full + (1 if part else 0)
            if q == 1:
                dec_left[:n] -= 1
                produced = n
            else:
                acc = draws.take(n)
                if part:
                    acc = acc.copy()
                    acc[-1] = min(int(acc[-1]), part)
                adv = np.minimum(acc, dec_left[:n])
                dec_left[:n] -= adv
                produced = int(adv.sum())
            if dec_left[:n].min() == 0:
                gone = dec_left == 0
                reqs.finish_s[dec_ids[gone]] = end
                keep = ~gone
                dec_ids, dec_left = dec_ids[keep], dec_left[keep]
        # Prompts finished this step: their first token now; one-token outputs are done, the rest decode next step.
        if done_prefill:
            ids = np.array(done_prefill, dtype=np.int64)
            reqs.first_token_s[ids] = end
            produced += len(ids)
            left = reqs.output[ids] - 1
            reqs.finish_s[ids[left == 0]] = end
            more = left > 0
            dec_ids = np.concatenate([dec_ids, ids[more]])
            dec_left = np.concatenate([dec_left, left[more]])
            prefilling = [e for e in prefilling if e[1] > 0]

        before = arrived
        arrived = reqs.arrived_by(end)
        # Time the step's arrivals spent waiting inside it (the queue's area, for its time-weighted mean).
        wait_area = (arrived - before) * end - float(reqs.arrival_s[before:arrived].sum()) if arrived > before else 0.0
        put_start(now)
        put_ms(step_ms)
        put_tokens(tokens)
        put_uniform(uniform)
        put_decoded(full + (1 if part else 0))
        put_produced(produced)
        put_running(running)
        put_waiting(before - admitted)
        put_area(wait_area)
        put_scheduled(scheduled)
        now = end
        steps += 1

    return Schedule(rec, reqs, tuple(sizes), now, stopped_by, arrived - admitted, len(latency))
