"""The comparison of the load model with a server's metrics: what vLLM's `iteration_tokens_total` observes of a
schedule (worked by hand from vLLM's rule on test_scheduler.py's three requests), Prometheus bucketing, the
total-variation distance, relative errors, and the host overhead added to a cost model (hand-made profiles, never
measurements)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # load_profiles (import-mode=importlib)
from load_profiles import eager_hand

from tuner.load.agreement import (
    bucket_counts,
    compare_to_server,
    histogram_counts,
    observed_widths,
    relative_error,
    total_variation,
    with_host_overhead,
)
from tuner.load.scheduler import schedule
from tuner.workload.load import Lengths, Load, LoadError
from tuner.model.costmodel import CostModel
from tuner.workload.traffic.metrics import parse_exposition

THREE = Load(Lengths(10), Lengths(3), arrival_times_s=(0.0, 0.0, 0.0))
# test_scheduler.py's steps (widths 8, 8, 5, 2, 8, 3, 1, 1) as vLLM's metric observes them: output tokens plus the
# whole 10-token prompt at the step of its first token; step 1 (R0's first chunk) produces nothing and is not seen.
#  2  R0's first token, R1's chunk                 10 + 1
#  3  R0 decodes, R1's first token                 10 + 2
#  4  R0, R1 decode                                2
#  5  R1 decodes, R2's chunk                       1
#  6  R2's first token                             10 + 1
#  7, 8  R2 decodes                                1, 1
OBSERVED = [11, 12, 2, 1, 11, 1, 1]
BOUNDS = (1.0, 8.0, 16.0, 32.0)


def exposition(widths: list[int], bounds: tuple[float, ...] = BOUNDS) -> str:
    """A vLLM-like exposition of iteration_tokens_total holding `widths` (as prometheus_client writes it)."""
    labels = 'engine="0",model_name="m"'
    lines = ["# HELP vllm:iteration_tokens_total Histogram of number of tokens per engine_step.",
             "# TYPE vllm:iteration_tokens_total histogram"]
    for b in bounds:
        lines.append(f'vllm:iteration_tokens_total_bucket{{{labels},le="{b}"}} {sum(w <= b for w in widths)}.0')
    lines.append(f'vllm:iteration_tokens_total_bucket{{{labels},le="+Inf"}} {len(widths)}.0')
    lines.append(f"vllm:iteration_tokens_total_count{{{labels}}} {len(widths)}.0")
    lines.append(f"vllm:iteration_tokens_total_sum{{{labels}}} {sum(widths)}.0")
    return "\n".join(lines) + "\n"


def test_the_metric_sees_output_steps_with_whole_prompts_at_their_first_token(hand_model: CostModel) -> None:
    run = schedule(hand_model, [], THREE)
    assert run.steps.tokens == [8, 8, 5, 2, 8, 3, 1, 1]
    assert observed_widths(run).tolist() == OBSERVED
    # Every token is counted once, as the server's _sum counts it: 3 prompts and 3 x 3 outputs.
    assert sum(OBSERVED) == 3 * 10 + 3 * 3


def test_buckets_count_as_prometheus_does_lower_exclusive_upper_inclusive() -> None:
    widths = [1, 2, 8, 9, 16, 17, 40, 100_000]
    assert bucket_counts(widths, BOUNDS).tolist() == [1, 2, 2, 1, 2]
    (hist,) = parse_exposition(exposition(widths)).values()
    assert histogram_counts(hist).tolist() == bucket_counts(widths, BOUNDS).tolist()
    with pytest.raises(LoadError, match="strictly ascending"):
        bucket_counts(widths, (8.0, 1.0))


def test_total_variation_is_half_the_l1_distance_of_the_normalised_histograms() -> None:
    assert total_variation([3, 1], [30, 10]) == 0.0
    assert total_variation([1, 0], [0, 5]) == 1.0
    assert total_variation([3, 1], [1, 3]) == pytest.approx(0.5)
    with pytest.raises(LoadError, match="same buckets"):
        total_variation([1, 2], [1, 2, 3])
    with pytest.raises(LoadError, match="at least one step"):
        total_variation([0, 0], [1, 1])


def test_relative_error_is_signed_against_the_measurement() -> None:
    assert relative_error(11.0, 10.0) == pytest.approx(0.1)
    assert relative_error(9.0, 10.0) == pytest.approx(-0.1)
    assert relative_error(None, 10.0) is None
    assert relative_error(1.0, 0.0) == math.inf and relative_error(0.0, 0.0) == 0.0


def test_a_server_that_stepped_as_the_model_did_agrees_exactly(hand_model: CostModel) -> None:
    run = schedule(hand_model, [], THREE)
    (hist,) = parse_exposition(exposition(OBSERVED)).values()
    tpot = (run.requests.finish_s - run.requests.first_token_s) / 2 * 1000.0
    a = compare_to_server(hist, tpot, run, server_tpot_mean_ms=float(tpot.mean()))
    assert a.tv_distance == 0.0 and a.width_error == 0.0 and a.tpot_error == 0.0 and a.tpot_mean_error == 0.0
    assert a.server_steps == a.model_steps == len(OBSERVED)
    assert a.server_mean_width == pytest.approx(sum(OBSERVED) / len(OBSERVED))
    assert any("total-variation distance" in line for line in a.lines())


def test_a_server_with_fewer_wider_steps_is_told_apart(hand_model: CostModel) -> None:
    # The same 39 tokens observed in 6 steps instead of 7 (as when prompts are not chunked): the mean width and the
    # step count differ, with signs saying which way.
    run = schedule(hand_model, [], THREE)
    (hist,) = parse_exposition(exposition([11, 12, 2, 12, 1, 1])).values()
    a = compare_to_server(hist, [5.0], run)
    assert a.server_steps == 6 and a.model_steps == 7 and a.width_error < 0


def test_the_host_overhead_is_added_to_every_step_and_per_request_beyond_the_first(hand_model: CostModel) -> None:
    slower = with_host_overhead(hand_model, 0.75)
    for w in (1, 5, 8, 16):
        assert slower.step_latency_ms(w, False, []) == pytest.approx(eager_hand(w) + 0.75)
    run = schedule(slower, [], THREE)
    assert [round(x, 9) for x in run.steps.step_ms] == [eager_hand(w) + 0.75 for w in run.steps.tokens]
    # 0.25 ms more per request the step carries beyond the first: a step of 5 requests pays 0.75 + 4 x 0.25.
    per_request = with_host_overhead(hand_model, 0.75, 0.25)
    assert per_request.step_latency_ms(5, True, [], query_len=1, num_reqs=5) == pytest.approx(eager_hand(5) + 1.75)
    assert per_request.step_latency_ms(8, False, [], num_reqs=1) == pytest.approx(eager_hand(8) + 0.75)
    run = schedule(per_request, [], THREE)
    assert [round(x, 9) for x in run.steps.step_ms] == [
        round(eager_hand(w) + 0.75 + 0.25 * (n - 1), 9) for w, n in zip(run.steps.tokens, run.steps.scheduled)]
    for bad in ({"overhead_ms": float("nan")}, {"per_request_ms": float("inf")}):
        with pytest.raises(LoadError, match=next(iter(bad))):
            with_host_overhead(hand_model, **{"overhead_ms": 0.75, **bad})


def test_an_empty_run_is_refused_with_the_reason(hand_model: CostModel) -> None:
    run = schedule(hand_model, [], THREE)
    (hist,) = parse_exposition(exposition(OBSERVED)).values()
    with pytest.raises(LoadError, match="no request finished"):
        compare_to_server(hist, np.array([]), run)
