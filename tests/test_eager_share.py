"""The eager share: uniform decode steps (and their tokens) that get no graph under a list, dispatched as the engine
runs the list, checked by hand on small hand-written workloads."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/handmade_profiles.py (import-mode=importlib)
from handmade_profiles import handmade_workload  # noqa: E402

from tuner.model.eager_share import decode_request_counts, eager_share, uniform_decode_steps  # noqa: E402
from tuner.workload.spec import Step  # noqa: E402


def test_by_hand_with_mixed_steps_left_out():
    # q = 2, list [2, 4, 8] (1..4 requests): decode steps of 2 (p .3), 4 (p .2) and 6 (p .3) requests; a mixed step
    # (p .2) is not a decode step. Eager: 6 requests = 12 tokens: 0.3 / 0.8 of decode steps, 0.3 x 12 / (0.3 x 4 +
    # 0.2 x 8 + 0.3 x 12) = 3.6 / 6.4 of their tokens.
    wl = handmade_workload(max_num_seqs=8, num_speculative_tokens=1, max_num_batched_tokens=64,
                           speculative={"method": "ngram"})
    steps = [Step(4, True, 0.3), Step(8, True, 0.2), Step(12, True, 0.3), Step(30, False, 0.2)]
    share = eager_share(wl.serving, steps, [2, 4, 8])
    assert share.request_counts == (2, 4, 6) and share.eager_request_counts == (6,)
    assert share.eager_step_share == pytest.approx(0.3 / 0.8)
    assert share.eager_token_share == pytest.approx(3.6 / 6.4)
    assert share.decode_step_share == pytest.approx(0.8)
    assert share.describe() == ("over 2..6 requests: 1 of 3 request counts eager = 37.5% of decode steps, 56.2% of "
                                "their tokens (decode steps are 80.0% of all steps)")


def test_a_list_the_runner_refuses_runs_everything_eager():
    # Suffix decoding runs on V1; with q = 5 a list topped at 4 tokens has no multiple of q left: V1 refuses it.
    wl = handmade_workload(max_num_seqs=4, num_speculative_tokens=4, max_num_batched_tokens=64,
                           speculative={"method": "suffix"})
    assert wl.engine.runner == "v1"
    share = eager_share(wl.serving, uniform_decode_steps(wl.serving), [1, 2, 4])
    assert share.eager_step_share == 1.0 and share.eager_request_counts == (1, 2, 3, 4)


def test_no_decode_steps_gives_no_share():
    wl = handmade_workload(max_num_seqs=4, max_num_batched_tokens=64)
    share = eager_share(wl.serving, [Step(40, False, 1.0)], [1, 2, 4])
    assert share.eager_step_share is None and share.eager_token_share is None
    assert share.describe() == "no uniform decode steps in this traffic"


def test_uniform_traffic_and_request_counts():
    wl = handmade_workload(max_num_seqs=5, num_speculative_tokens=1, max_num_batched_tokens=8,
                           speculative={"method": "ngram"}, traffic={"requests": {"kind": "uniform", "min": 2,
                                                                                  "max": 4}})
    # 5 requests x q 2 = 10 tokens exceed the 8-token budget: that step cannot happen.
    assert [(st.num_tokens, st.probability) for st in uniform_decode_steps(wl.serving)] == [
        (2, 0.25), (4, 0.25), (6, 0.25), (8, 0.25)]
    assert decode_request_counts(wl) == [2, 3, 4]
