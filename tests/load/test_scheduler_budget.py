"""The token budget and the seat limit of vLLM's scheduler as the load model steps it (issue 44, 1): a running
request's prompt chunk, a decode and an admitted prompt each get at most what is left of `max_num_batched_tokens`,
and no more than `max_num_seqs` requests run. Held by hand-worked steps and by a reference scheduler written here
request by request from the rule (`reference_steps`), independent of the simulator's arrays, on random loads that chunk
prompts while others decode. The step latencies come from the hand-made profiles (test fixtures, never
measurements)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # load_profiles (import-mode=importlib)
from load_profiles import eager_hand  # noqa: E402

from tuner.load.arrivals import Requests  # noqa: E402
from tuner.load.scheduler import schedule  # noqa: E402
from tuner.model.costmodel import CostModel  # noqa: E402
from tuner.workload.load import Lengths, Load  # noqa: E402


def test_a_running_prompt_longer_than_two_budgets_is_chunked_every_step(hand_model: CostModel) -> None:
    # Budget 8, q = 1, one request: prompt 20, output 2. By hand:
    #  1  admitted, chunk 8 (12 left)          width 8  mixed
    #  2  running prefill: 8 of its 12 left    width 8  mixed   (the whole 12 would be a 12-token step)
    #  3  its last 4 (first token)             width 4  mixed
    #  4  decode 1 (done)                      width 1  uniform
    run = schedule(hand_model, [], Load(Lengths(20), Lengths(2), arrival_times_s=(0.0,)))
    assert run.steps.tokens == [8, 8, 4, 1]
    assert run.steps.uniform == [False, False, False, True]
    assert run.steps.scheduled == [1, 1, 1, 1]
    # Step ends 5, 10, 13, 14.5 ms (eager 1 + 0.5 a token).
    assert run.requests.first_token_s[0] * 1000 == pytest.approx(13.0)
    assert run.requests.finish_s[0] * 1000 == pytest.approx(14.5)


def test_a_running_prompt_gets_what_the_decodes_leave(hand_model: CostModel) -> None:
    # Budget 8, max_num_seqs 2, q = 1: R0 (prompt 2, output 6) at 0; R1 (prompt 24, output 1) at 0.
    #  1  R0 chunk 2 (first token); R1 admitted, chunk 6 (18 left)       width 8
    #  2  R0 decodes 1; R1 gets the 7 left (11 left)                     width 8
    #  3  R0 decodes 1; R1 7 (4 left)                                    width 8
    #  4  R0 decodes 1; R1 its last 4 (first token, done: output 1)      width 5
    #  5  R0 decodes 1                                                   width 1 uniform
    #  6  R0 decodes 1 (done: 6 tokens)                                  width 1 uniform
    # Two-point histograms give the two lengths; `_seed_for` finds a seed that draws them in this order.
    load = Load(Lengths(2, 24, counts=((2, 1.0), (24, 1.0))), Lengths(1, 6, counts=((1, 1.0), (6, 1.0))),
                arrival_times_s=(0.0, 0.0), seed=_seed_for(((2, 6), (24, 1))))
    run = schedule(hand_model, [], load)
    assert run.steps.tokens == [8, 8, 8, 5, 1, 1]
    assert run.steps.scheduled == [2, 2, 2, 2, 1, 1]
    assert run.steps.uniform == [False, False, False, False, True, True]
    ends = np.cumsum([eager_hand(w) for w in [8, 8, 8, 5, 1, 1]])
    assert run.requests.finish_s * 1000 == pytest.approx([ends[5], ends[3]])


def _seed_for(lengths: tuple[tuple[int, int], ...]) -> int:
    """A seed whose two requests draw exactly these (prompt, output) lengths from the two-point histograms above."""
    for seed in range(10_000):
        load = Load(Lengths(2, 24, counts=((2, 1.0), (24, 1.0))), Lengths(1, 6, counts=((1, 1.0), (6, 1.0))),
                    arrival_times_s=(0.0, 0.0), seed=seed)
        r = Requests(load)
        if tuple(zip(r.prompt.tolist(), r.output.tolist())) == lengths:
            return seed
    raise AssertionError(f"no seed draws {lengths}")


def reference_steps(model: CostModel, load: Load, max_steps: int = 5000,
                    events: dict[str, int] | None = None) -> list[tuple[int, bool, int, int]]:
    """vLLM's V1 scheduler written request by request from its rule, for loads whose every draft is accepted or none
    is (acceptance q or 1, so no draw is needed): RUNNING requests in admission order, each taking what it needs (q
    tokens to decode, the rest of its prompt to prefill) or what is left of the budget, the loop ending once the budget
    is spent; then WAITING requests in arrival order while a seat (max_num_seqs) and budget remain. Returns each step's
    (tokens, uniform decode, requests scheduled, requests decoding); `events` counts the caps that bound a request."""
    events = {} if events is None else events
    s = model.serving
    q, budget_per_step, seats = int(model.q), int(s.max_num_batched_tokens), int(s.max_num_seqs)
    assert load.acceptance in (1.0, float(q))
    advance = q if load.acceptance == q else 1
    reqs = Requests(load)
    arrivals = list(reqs.arrival_s)
    prompt, output = list(map(int, reqs.prompt)), list(map(int, reqs.output))
    left_prompt = prompt[:]  # prompt tokens still to prefill
    left_output = output[:]  # output tokens still to come
    running: list[int] = []
    admitted, now, steps = 0, 0.0, []
    while len(steps) < max_steps:
        if not running and (admitted == len(arrivals) or arrivals[admitted] > now):
            if admitted == len(arrivals):
                break
            now = arrivals[admitted]
        budget = budget_per_step
        chunks, cut, scheduled, decoding, tokens_of = 0, False, 0, 0, {}
        for rid in running:
            if budget == 0:
                break
            need = q if left_prompt[rid] == 0 else left_prompt[rid]
            take = min(need, budget)
            budget -= take
            tokens_of[rid] = take
            scheduled += 1
            if take < need:
                what = "decode cut" if left_prompt[rid] == 0 else "running chunk cut"
                events[what] = events.get(what, 0) + 1
            if left_prompt[rid] == 0:
                decoding += 1
                cut |= take < q
            else:
                chunks += 1
        while admitted < len(arrivals) and arrivals[admitted] <= now and budget > 0 and len(running) < seats:
            rid = admitted
            admitted += 1
            running.append(rid)
            take = min(left_prompt[rid], budget)
            budget -= take
            tokens_of[rid] = take
            scheduled += 1
            chunks += 1
        tokens = budget_per_step - budget
        if len(running) == seats and admitted < len(arrivals) and arrivals[admitted] <= now and budget > 0:
            events["seat refused"] = events.get("seat refused", 0) + 1
        uniform = chunks == 0 and not cut
        steps.append((tokens, uniform, scheduled, decoding))
        now += model.step_latency_ms(tokens, uniform, [], query_len=q if uniform else None,
                                     num_reqs=scheduled) / 1000.0
        for rid, take in tokens_of.items():
            if left_prompt[rid] > 0:
                left_prompt[rid] -= take
                if left_prompt[rid] == 0:
                    left_output[rid] -= 1  # the chunk that ends the prompt gives the first token
            else:
                left_output[rid] -= min(advance, take, left_output[rid])
        running = [rid for rid in running if left_output[rid] > 0]
    return steps


def random_load(seed: int, q: int) -> Load:
    """Prompts from 1 to 3..40 tokens (up to five budgets long), outputs 1..3 to 1..30, arrivals close enough that
    prompts are chunked while others decode; every draft accepted or none."""
    rnd = random.Random(seed)
    n = rnd.randint(3, 12)
    times = sorted(round(rnd.uniform(0.0, 0.03), 4) for _ in range(n))
    return Load(Lengths(1, rnd.choice((3, 12, 25, 40))), Lengths(1, rnd.choice((3, 12, 30))),
                arrival_times_s=tuple(times),
                acceptance=float(rnd.choice((1, q))), seed=seed)


@pytest.mark.parametrize("which", ["hand_model", "spec_model"])
@pytest.mark.parametrize("seed", range(12))
def test_every_step_is_the_reference_schedulers(request: pytest.FixtureRequest, which: str, seed: int) -> None:
    model: CostModel = request.getfixturevalue(which)
    load = random_load(seed, int(model.q))
    run = schedule(model, [], load)
    got = list(zip(run.steps.tokens, run.steps.uniform, run.steps.scheduled, run.steps.decoded))
    assert got == reference_steps(model, load)
    s = model.serving
    assert max(run.steps.tokens) <= s.max_num_batched_tokens
    assert max(run.steps.running) <= s.max_num_seqs and max(run.steps.scheduled) <= s.max_num_seqs


def test_the_random_loads_reach_every_budget_cap(hand_model: CostModel, spec_model: CostModel) -> None:
    # The comparison above means something only if its loads cut a running prompt's chunk and a decode short at the
    # budget, and keep a waiting request out for want of a seat with budget left: counted on the reference's steps.
    events: dict[str, int] = {}
    for model in (hand_model, spec_model):
        for seed in range(12):
            reference_steps(model, random_load(seed, int(model.q)), events=events)
    assert set(events) == {"running chunk cut", "decode cut", "seat refused"}, events
    assert min(events.values()) >= 5, events
