"""vLLM's V1 scheduler as the load model steps it, checked against steps worked out by hand from the rule (decode
first, prompts chunked within the token budget, admission stopped at max_num_seqs, speculative decodes advancing by
their accepted tokens), each step timed by the hand-made profile's latency (test fixtures, never measurements)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # load_profiles (import-mode=importlib)
from load_profiles import eager_hand, full_hand  # noqa: E402

from tuner.load.scheduler import Schedule, schedule, simulate  # noqa: E402
from tuner.workload.load import Lengths, Load  # noqa: E402
from tuner.model.costmodel import CostModel  # noqa: E402

# Three requests at t = 0, prompts of 10 tokens, 3 output tokens each; max_num_seqs 2, 8 tokens a step, q = 1.
# Worked by hand (R0, R1, R2; budget 8):
#  1  R0 admitted, chunk 8 of 10 (budget spent: R1 waits)                      width 8  mixed
#  2  R0's last 2 (first token), R1 admitted, chunk 6 of 10                      width 8  mixed
#  3  R0 decodes 1; R1's last 4 (first token); R2 waits: 2 seats taken           width 5  mixed
#  4  R0, R1 decode (R0 done); R2 still waits: R0 holds its seat to the end      width 2  uniform decode
#  5  R1 decodes FIRST (done), then R2 admitted with what is left: chunk 7       width 8  mixed
#  6  R2's last 3 (first token)                                                   width 3  mixed
#  7  R2 decodes                                                                  width 1  uniform decode
#  8  R2 decodes (done)                                                           width 1  uniform decode
THREE = Load(Lengths(10), Lengths(3), arrival_times_s=(0.0, 0.0, 0.0))
WIDTHS = [8, 8, 5, 2, 8, 3, 1, 1]
UNIFORM = [False, False, False, True, False, False, True, True]


def steps_ms(run: Schedule) -> list[float]:
    return [round(x, 9) for x in run.steps.step_ms]


def test_three_requests_step_by_step_as_worked_by_hand(hand_model: CostModel) -> None:
    run = schedule(hand_model, [], THREE)  # no graphs: every step eager at its own width
    assert run.steps.tokens == WIDTHS
    assert run.steps.uniform == UNIFORM
    assert steps_ms(run) == [eager_hand(w) for w in WIDTHS]
    assert run.stopped_by == "arrivals done"
    # Step ends: 5, 10, 13.5, 15.5, 20.5, 23, 24.5, 26 ms.
    assert np.allclose(run.requests.first_token_s * 1000, [10.0, 13.5, 23.0])
    assert np.allclose(run.requests.finish_s * 1000, [15.5, 20.5, 26.0])
    assert run.end_s == pytest.approx(0.026)


def test_decoding_requests_are_scheduled_before_a_prompt_is_admitted(hand_model: CostModel) -> None:
    # Step 5: R1's decode takes its token first, so R2's first chunk is 7 (8 - 1), its rest 3 in step 6, and R1 is
    # done at the end of step 5 (20.5 ms), not delayed behind R2's prompt.
    run = schedule(hand_model, [], THREE)
    assert run.steps.decoded[4] == 1 and run.steps.tokens[4] == 8
    assert run.steps.tokens[5] == 3
    assert run.requests.finish_s[1] * 1000 == pytest.approx(20.5)


def test_a_prompt_is_chunked_within_the_token_budget(hand_model: CostModel) -> None:
    # R0's 10-token prompt does not fit 8 tokens: 8 now, 2 next step, and its first token only then.
    run = schedule(hand_model, [], THREE)
    assert max(run.steps.tokens) == 8
    assert run.steps.tokens[:2] == [8, 8]
    assert run.requests.first_token_s[0] * 1000 == pytest.approx(10.0)


def test_admission_stops_at_max_num_seqs_even_with_budget_left(hand_model: CostModel) -> None:
    # Steps 3 and 4 leave 3 and 6 tokens of budget, yet R2 waits: two requests run (max_num_seqs 2).
    run = schedule(hand_model, [], THREE)
    assert run.steps.running[2:4] == [2, 2]
    assert run.steps.waiting[2:4] == [1, 1]
    assert run.steps.waiting[4] == 0  # admitted in step 5, once R0 had left


def test_decode_steps_replay_graphs_and_mixed_steps_above_the_list_run_eager(hand_model: CostModel) -> None:
    # List [1, 2]: the uniform decode steps (widths 2, 1, 1) replay FULL graphs; the mixed ones (8, 8, 5, 8, 3) are
    # wider than the list and run eager.
    run = schedule(hand_model, [1, 2], THREE)
    expected = [full_hand(w) if u else eager_hand(w) for w, u in zip(WIDTHS, UNIFORM)]
    assert steps_ms(run) == pytest.approx(expected)
    # Ends: 5, 10, 13.5, 14.2, 19.2, 21.7, 22.3, 22.9 ms.
    assert np.allclose(run.requests.finish_s * 1000, [14.2, 19.2, 22.9])


def test_time_jumps_to_the_next_arrival_when_nothing_runs_or_waits(hand_model: CostModel) -> None:
    load = Load(Lengths(4), Lengths(2), arrival_times_s=(0.0, 1.0))
    run = schedule(hand_model, [], load)
    # Each request: a 4-token prefill (3 ms, first token) and one decode (1.5 ms).
    assert run.steps.tokens == [4, 1, 4, 1]
    assert run.steps.start_s[2] == pytest.approx(1.0)
    assert np.allclose(run.requests.first_token_s, [0.003, 1.003])
    assert np.allclose(run.requests.finish_s, [0.0045, 1.0045])


def test_the_metrics_of_one_request_alone_are_its_steps(hand_model: CostModel) -> None:
    # Prompt 4 (one 3 ms prefill step), output 5: four decodes of 1.5 ms each.
    r = simulate(hand_model, [], Load(Lengths(4), Lengths(5), arrival_times_s=(0.0,)), warmup_share=0.0)
    assert r.ttft_p50_ms == pytest.approx(3.0)
    assert r.tpot_p50_ms == pytest.approx(1.5) and r.tpot_p99_ms == pytest.approx(1.5)
    assert r.itl_p50_ms == pytest.approx(1.5)
    assert r.num_steps == 5 and r.num_completed == 1
    assert r.throughput_tok_s == pytest.approx(5 / 0.009)


def test_queue_and_running_means_are_time_weighted_as_by_hand(hand_model: CostModel) -> None:
    r = simulate(hand_model, [], THREE, warmup_share=0.0)
    # R1 waited 0..5 ms, R2 0..15.5 ms; running request-ms: 5 + 2x5 + 2x3.5 + 2x2 + 2x5 + 2.5 + 1.5 + 1.5 = 41.5.
    assert r.mean_queue_len == pytest.approx(20.5 / 26.0)
    assert r.mean_running == pytest.approx(41.5 / 26.0)
    # Little's law holds exactly over a run that starts and ends empty: L x T = the sum of the times in the system.
    assert r.mean_in_system * 26.0 == pytest.approx(15.5 + 20.5 + 26.0)
    assert r.width_histogram == ((1, 2), (2, 1), (3, 1), (5, 1), (8, 3))
    assert r.mean_step_width == pytest.approx(sum(WIDTHS) / 8)


def test_speculative_decodes_advance_by_their_accepted_tokens(spec_model: CostModel) -> None:
    # q = 3. Prompt 2, output 7: the prefill gives token 1, then 6 to go: every draft accepted (acceptance 3) is two
    # decode steps of 3 tokens; none accepted (acceptance 1) is six.
    one = Load(Lengths(2), Lengths(7), arrival_times_s=(0.0,), acceptance=3.0)
    run = schedule(spec_model, [], one)
    assert run.steps.tokens == [2, 3, 3] and run.steps.uniform == [False, True, True]
    slow = schedule(spec_model, [], Load(Lengths(2), Lengths(7), arrival_times_s=(0.0,), acceptance=1.0))
    assert slow.steps.tokens == [2] + [3] * 6


def test_decodes_the_budget_cannot_cover_get_what_is_left_then_none(spec_model: CostModel) -> None:
    # q = 3, 8 tokens a step, four 1-token prompts, 4 output tokens, every draft accepted.
    #  1  four prefills of 1 token (first tokens)                                             width 4
    #  2  R0, R1 decode 3 each (done), R2 gets the 2 left (advances 2), R3 none: not uniform  width 8
    #  3  R2 (1 to go), R3 decode 3 each: uniform                                             width 6
    load = Load(Lengths(1), Lengths(4), arrival_times_s=(0.0,) * 4, acceptance=3.0)
    run = schedule(spec_model, [], load)
    assert run.steps.tokens == [4, 8, 6]
    assert run.steps.uniform == [False, False, True]
    assert run.steps.decoded == [0, 3, 2]
    assert np.allclose(run.requests.finish_s * 1000, [8.0, 8.0, 12.0, 12.0])  # steps of 3, 5 and 4 ms


def test_the_step_latency_of_a_list_is_asked_once_per_kind_of_step(hand_model: CostModel) -> None:
    run = schedule(hand_model, [], THREE)
    kinds = {(w, u, n) for w, u, n in zip(run.steps.tokens, run.steps.uniform, run.steps.running)}
    assert run.latencies_costed <= len(kinds) < len(WIDTHS)
