"""The steady state of an open load: the warm-up cut as stated (the first 20% of simulated time; a saturated start's
backlog never counted), Little's law and the conservation of tokens at a low rate, the seed, and the acceptance
draws' mean. Hand-made cliff profile (a test fixture, never a measurement)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # load_profiles (import-mode=importlib)
from load_profiles import CLIFF_COVER  # noqa: E402

from tuner.load.acceptance import AcceptanceDraws, accepted_probabilities  # noqa: E402
from tuner.load.scheduler import schedule, simulate  # noqa: E402
from tuner.workload.load import Lengths, Load  # noqa: E402
from tuner.load.steady_state import DEFAULT_WARMUP_SHARE  # noqa: E402
from tuner.model.costmodel import CostModel  # noqa: E402

LOW = Load(Lengths(8, 24), Lengths(32, 96), rate_per_s=20.0, seed=3)
"""A low rate for the cliff profile (its covering list serves ~800 requests/s): the server mostly idles."""


def test_little_and_the_tokens_balance_at_a_low_rate(cliff_model: CostModel) -> None:
    r = simulate(cliff_model, CLIFF_COVER, LOW, duration_s=120.0)
    window = r.end_s - r.warmup_s
    rate = r.num_requests / window  # the rate that arrived in the window (Poisson noise left out of the check)
    # Little's law: L = lambda x W, within 5% (the window's edges: requests in the system at the cut, or still in it
    # at the end, count in L but not W).
    assert r.mean_in_system == pytest.approx(rate * r.mean_e2e_s, rel=0.05)
    # Every request that arrives is served: output tokens/s = arrivals/s x mean output (64), within 5%.
    assert r.keeps_up and r.num_unfinished <= 2
    assert r.throughput_tok_s == pytest.approx(rate * 64, rel=0.05)
    # Nearly alone: a step decodes ~1-2 requests, so a token costs about one narrow graph step (0.5 + 0.01 w ms).
    assert 0.5 < r.tpot_p50_ms < 0.6
    assert r.mean_queue_len < 0.05


def test_the_warm_up_cut_drops_the_first_fifth_of_the_time_and_the_backlog(cliff_model: CostModel) -> None:
    run = schedule(cliff_model, CLIFF_COVER, LOW, duration_s=20.0, initial_waiting=128)
    r = simulate(cliff_model, CLIFF_COVER, LOW, duration_s=20.0, initial_waiting=128)
    assert DEFAULT_WARMUP_SHARE == 0.2
    assert r.warmup_s == pytest.approx(0.2 * r.end_s) and r.end_s == pytest.approx(20.0, abs=0.01)
    starts = np.array(run.steps.start_s)
    assert r.num_steps == int((starts >= r.warmup_s).sum()) < r.num_steps_total == len(starts)
    # The 128 requests waiting at t = 0 arrive before the cut: only the Poisson arrivals after it count.
    arrivals = run.requests.arrival_s
    assert r.num_requests == int(((arrivals >= r.warmup_s) & (arrivals <= r.end_s)).sum())
    assert r.initial_waiting == 128 and r.num_requests < 20 * 20


def test_a_saturated_start_sees_the_same_arrivals_after_its_backlog(cliff_model: CostModel) -> None:
    empty = schedule(cliff_model, CLIFF_COVER, LOW, duration_s=5.0)
    full = schedule(cliff_model, CLIFF_COVER, LOW, duration_s=5.0, initial_waiting=10)
    n = min(len(empty.requests.arrival_s), len(full.requests.arrival_s) - 10)
    assert np.array_equal(full.requests.arrival_s[10:10 + n], empty.requests.arrival_s[:n])
    assert np.array_equal(full.requests.prompt[10:10 + n], empty.requests.prompt[:n])


def test_one_seed_one_result_and_the_result_is_json(cliff_model: CostModel) -> None:
    a = simulate(cliff_model, CLIFF_COVER, LOW, duration_s=10.0)
    b = simulate(cliff_model, CLIFF_COVER, LOW, duration_s=10.0)
    other = Load(LOW.prompt_tokens, LOW.output_tokens, rate_per_s=LOW.rate_per_s, seed=4)
    c = simulate(cliff_model, CLIFF_COVER, other, duration_s=10.0)
    assert a == b and a.as_dict() == b.as_dict()
    assert a.as_dict() != c.as_dict() and c.seed == 4
    d = json.loads(json.dumps(a.as_dict()))
    assert d["seed"] == 3 and d["capture_sizes"] == list(CLIFF_COVER)
    assert sum(d["width_histogram"].values()) == a.num_steps


def test_a_run_stops_at_max_steps(cliff_model: CostModel) -> None:
    r = simulate(cliff_model, CLIFF_COVER, LOW.at_rate(500.0), duration_s=60.0, max_steps=2000)
    assert r.stopped_by == "max_steps" and r.num_steps_total == 2000 and r.end_s < 60.0


@pytest.mark.parametrize("acceptance,q", [(1.0, 1), (1.0, 3), (2.2, 3), (3.0, 3), (3.5, 5)])
def test_accepted_tokens_have_the_acceptance_as_mean_within_one_to_q(acceptance: float, q: int) -> None:
    probs = accepted_probabilities(acceptance, q)
    assert len(probs) == q and probs.sum() == pytest.approx(1.0) and (probs >= 0).all()
    assert float(np.dot(np.arange(1, q + 1), probs)) == pytest.approx(acceptance, abs=1e-9)
    draws = AcceptanceDraws(acceptance, q, np.random.SeedSequence(0)).take(200_000)
    assert draws.min() >= 1 and draws.max() <= q
    assert draws.mean() == pytest.approx(acceptance, abs=0.01)


def test_speculation_shortens_tpot_by_the_acceptance(spec_model: CostModel) -> None:
    # One request at a time, decode steps only (prompt 1): TPOT = step latency / tokens per step, so it falls
    # with the acceptance (output 601: 600 tokens after the first, ~1/acceptance steps each).
    times = tuple(5.0 * t for t in range(20))  # 5 s apart: each done (<= 1.5 s) before the next arrives
    slow = simulate(spec_model, [], Load(Lengths(1), Lengths(601), arrival_times_s=times, acceptance=1.0),
                    warmup_share=0.0)
    fast = simulate(spec_model, [], Load(Lengths(1), Lengths(601), arrival_times_s=times, acceptance=2.5),
                    warmup_share=0.0)
    assert slow.tpot_p50_ms == pytest.approx(2.5)  # eager(3) = 1 + 0.5 x 3: each step yields one token
    assert fast.tpot_p50_ms == pytest.approx(2.5 / 2.5, rel=0.03)
