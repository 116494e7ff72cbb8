"""`CostModel.without_each`, each width's list without it (what `what_changed` reports per width), held to the full
evaluation it stands in for, to the bit: expected step, real pool and the estimate the engine subtracts, on random
lists of random cases of every engine, runner, cudagraph mode, dynamic speculative tiers and drafters."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the case builders of the solver's tests
from test_engines import random_engine_case  # noqa: E402
from test_exact import random_case, random_drafter_case  # noqa: E402
from test_exact_dynamic import dynamic_case  # noqa: E402

from tuner.model.costmodel import CostModel  # noqa: E402


def assert_as_evaluated(m: CostModel, candidates: list[int], seed: int) -> int:
    """Every width of a random list of the candidates, dropped: the figures are the full evaluation's; returns how
    many widths were checked."""
    rnd = random.Random(seed)
    e = m.evaluate(rnd.sample(candidates, rnd.randint(1, len(candidates))))
    got = m.without_each(e, e.runs_as)
    assert set(got) == set(e.runs_as)
    for w in e.runs_as:
        x = m.evaluate(set(e.runs_as) - {w})
        assert got[w] == (x.expected_step_ms, x.graph_memory_bytes, x.graph_estimate_bytes), w
    return len(e.runs_as)


def _case(tmp_path: Path, family: str, seed: int) -> tuple[CostModel, list[int]]:
    if family == "tiers":  # several decode query lengths: a size holds a FULL graph at each rounding, two may share
        return dynamic_case(tmp_path, seed, tiers=2 + seed % 2, runner=("v2", "v1")[seed % 2])
    if family == "engines":  # SGLang and TensorRT-LLM
        return random_engine_case(tmp_path, seed)
    if family == "drafter":
        return random_drafter_case(tmp_path, seed)
    return random_case(tmp_path, seed)  # vLLM: both runners, every cudagraph mode, with and without speculation


@pytest.mark.parametrize("family, seed", [("vllm", s) for s in range(24)] + [("tiers", s) for s in range(8)]
                         + [("engines", s) for s in range(8)] + [("drafter", s) for s in range(4)])
def test_each_width_dropped_is_the_full_evaluation(tmp_path, family, seed):
    m, candidates = _case(tmp_path, family, seed)
    assert_as_evaluated(m, candidates, seed)


def test_fifty_random_lists_are_checked_width_by_width(tmp_path):
    # The count issue 34 asks for, across the families above, with more than a handful of widths each.
    checked = [assert_as_evaluated(*random_case(tmp_path / f"r{s}", 100 + s), s) for s in range(50)]
    assert len(checked) == 50 and sum(checked) > 200


def _two_tier_model(tmp_path: Path) -> CostModel:
    """V2 with two decode query lengths: 1..3 requests draft K=3 (q 4), 4..8 draft K=1 (q 2), decode steps only."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from handmade_profiles import handmade_profile, handmade_workload

    wl = handmade_workload(num_speculative_tokens=3, max_num_seqs=8, max_num_batched_tokens=32,
                           speculative_schedule=[[1, 3, 3], [4, 8, 1]], cudagraph_mode="FULL_AND_PIECEWISE",
                           model_runner="v2", traffic={"requests": {"kind": "uniform", "min": 1, "max": 8}})
    path = handmade_profile(tmp_path, wl, list(range(1, 33)), eager_ms=lambda w: 2.0 + 0.01 * w,
                            full_ms=lambda w: 0.5 + 0.01 * w, piecewise_ms=lambda w: 1.0 + 0.01 * w)
    return CostModel.from_files(path, wl)


def test_a_step_whose_pad_width_goes_may_reach_a_graph_that_holds_it(tmp_path):
    # By hand (V2 rounds each size up to each query length, keeping what stays within the largest size): [5, 12]
    # holds FULL (6, q 2), (8, q 4), (12, q 2), (12, q 4). A 4-request step (8 tokens at q 2) pads to the FULL
    # width 8, whose graph is for q 4: it misses and replays the PIECEWISE graph at 12. Without 5, the FULL width 8
    # is gone: it pads to 12, whose q 2 graph holds it, and replays FULL. Its own graph (PIECEWISE 12) stayed.
    m = _two_tier_model(tmp_path)
    d = m.engine.dispatcher((5, 12))
    assert (8, 4) in d.decode_graphs and (8, 2) not in d.decode_graphs
    assert d.dispatch(8, uniform_decode=True, query_len=2).runtime_mode == "PIECEWISE"
    assert m.engine.dispatcher((12,)).dispatch(8, uniform_decode=True, query_len=2).runtime_mode == "FULL"
    e = m.evaluate((5, 12))
    x = m.evaluate((12,))
    assert m.without_each(e, [5])[5] == (x.expected_step_ms, x.graph_memory_bytes, x.graph_estimate_bytes)


def test_a_step_whose_graph_pair_goes_while_its_width_stays_is_dispatched_again(tmp_path):
    # [5, 7, 9]: 5 gives (6, q 2) and (8, q 4), 7 gives (8, q 2) and (8, q 4) (9 rounds past the largest size). A
    # 4-request step (8 tokens at q 2) replays FULL (8, q 2). Without 7 the FULL width 8 stays, for q 4 only: the
    # step misses and replays the PIECEWISE graph at 9.
    m = _two_tier_model(tmp_path)
    assert m.engine.dispatcher((5, 7, 9)).dispatch(8, uniform_decode=True, query_len=2).runtime_mode == "FULL"
    without = m.engine.dispatcher((5, 9))
    assert 8 in without.full_pad_sizes and (8, 2) not in without.decode_graphs
    assert without.dispatch(8, uniform_decode=True, query_len=2).runtime_mode == "PIECEWISE"
    e = m.evaluate((5, 7, 9))
    x = m.evaluate((5, 9))
    assert m.without_each(e, [7])[7] == (x.expected_step_ms, x.graph_memory_bytes, x.graph_estimate_bytes)
