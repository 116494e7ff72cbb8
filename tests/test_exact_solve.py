"""exact_solve's edges that the brute-force comparisons do not reach: the caveat sentence a report prints for an
unproven answer, the reason a stopped solve gives, and the solves with nothing to search (no candidates, no graphs)."""

from __future__ import annotations

import dataclasses
import logging
import sys
from itertools import combinations
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the fixtures of the brute-force tests
from handmade_profiles import MIB, handmade_profile, handmade_workload  # noqa: E402
from test_exact import UNPROVEN_SEEDS, random_case  # noqa: E402
from test_exact_dynamic import dynamic_case  # noqa: E402
from test_exact_scaling import StepClock, binding_case  # noqa: E402

from tuner.model.costmodel import CostModel, Evaluation  # noqa: E402
from tuner.search.exact import APPROXIMATED, KEPT, ROUNDED, brute_force, exact_solve, improve_locally  # noqa: E402
from tuner.search.exact_program import counted_bytes  # noqa: E402

KEEP_SEEDS = (0, 1, 2, 4, 8, 9)
"""random_case seeds for the kept levels: proven ones (none of test_exact.UNPROVEN_SEEDS), a second or two each."""


def fitting(m: CostModel, candidates: list[int]) -> list[Evaluation]:
    """Every subset of the candidates that fits, evaluated (brute force)."""
    return [e for k in range(len(candidates) + 1) for s in combinations(candidates, k) if (e := m.evaluate(s)).feasible]


def assert_kept_by_level(m: CostModel, kept: tuple[Evaluation, ...]) -> None:
    """One list per level where the fastest drops: no list twice, and past the lists counting nothing each counts
    more memory and is faster than the one before (a level whose fastest is no faster than the last is no drop)."""
    sizes = [e.capture_sizes for e in kept]
    assert len(set(sizes)) == len(sizes), sizes
    rest = [e for e in kept if counted_bytes(m, e) > 0]
    for a, b in zip(rest, rest[1:]):
        assert counted_bytes(m, a) < counted_bytes(m, b) and a.expected_step_ms > b.expected_step_ms


@pytest.fixture(scope="module")
def proven(tmp_path_factory):
    m, candidates = random_case(tmp_path_factory.mktemp("proven"), 0)
    r = exact_solve(m, candidates=candidates)
    assert r.exact_memory and r.caveat() == ""  # a proven answer has no caveat
    return r


def test_the_caveat_names_every_reason_and_the_proven_bound(proven):
    # The report prints this sentence as is (study notes, decision record): hand-written expected text, so a changed
    # subject, separator or bound shows.
    lb = proven.best.expected_step_ms / 1.25
    r = dataclasses.replace(proven, exact_memory=False, unproven=("first reason", "second reason"), lower_bound_ms=lb)
    assert r.gap == pytest.approx(0.25)
    bound = f"it is within 25.00% of the optimum (a proven lower bound: {lb:.4f} ms)"
    assert r.caveat() == ("the exact solver's answer fits both memory conditions but is not proven optimal "
                          f"(first reason; second reason): {bound}")
    assert r.caveat("its answer") == ("its answer fits both memory conditions but is not proven optimal "
                                      f"(first reason; second reason): {bound}")


@pytest.mark.parametrize("lb", [None, 0.0])
def test_a_caveat_without_a_positive_lower_bound_claims_no_gap(proven, lb):
    # No bound, or one that is not positive: no gap is proven, and the sentence must say so (not fail formatting it).
    r = dataclasses.replace(proven, exact_memory=False, unproven=("why",), lower_bound_ms=lb)
    assert r.gap is None
    assert r.caveat() == ("the exact solver's answer fits both memory conditions but is not proven optimal (why): "
                          "no bound on its gap is proven")


def test_a_stopped_solve_names_the_time_budget_it_ran_out_of(tmp_path, caplog):
    # binding_case 6 needs the levels program; an injected clock 10 s later at every reading stops it at its 5 s.
    m, candidates = binding_case(tmp_path, 6)
    with caplog.at_level(logging.INFO, logger="tuner.search.exact"):
        r = exact_solve(m, candidates=candidates, seconds=5.0, clock=StepClock(10.0))
    assert (f"exact solver: stopped at its time budget of 5 s (--exact-seconds), after {r.seconds:.1f} s"
            in caplog.messages)
    assert r.stopped_early and r.best.feasible
    assert r.unproven[0] == "stopped at its time budget of 5 s (--exact-seconds)"
    assert "(stopped at its time budget of 5 s" in r.caveat()


def test_a_work_budget_stops_the_solve_at_the_same_list_whatever_the_clock(tmp_path):
    # A work budget counts the program's steps, not seconds: a clock that races (a loaded machine) or stands still
    # (a quiet one) stops it at the same step with the same answer, and the answer says which budget it spent.
    m, candidates = binding_case(tmp_path, 6)
    full = exact_solve(m, candidates=candidates)
    assert not full.stopped_early and 0 < full.work
    small = [exact_solve(m, candidates=candidates, work=full.work // 4, clock=clock)
             for clock in (StepClock(10.0), StepClock(0.0))]
    assert all(r.stopped_early and r.best.feasible for r in small)
    assert small[0].best.capture_sizes == small[1].best.capture_sizes and small[0].work == small[1].work
    assert small[0].unproven[0] == f"stopped at its work budget of {full.work // 4:,} steps (--exact-work)"


@pytest.mark.parametrize("mode", ["FULL_AND_PIECEWISE", "NONE"])
def test_nothing_to_search_answers_the_empty_list_proven(tmp_path, mode):
    # No candidates (any mode), or no graphs at all (NONE, even given widths to search: none is ever captured): the
    # empty list is the proven answer without a program, and it is kept within a latency only when it is within it.
    m, _ = random_case(tmp_path, 0, mode=mode)
    empty = m.evaluate(())
    for cands in ([], [1, 2, 4, 8]) if mode == "NONE" else ([],):
        r = exact_solve(m, candidates=cands)
        assert r.best.capture_sizes == () and r.exact_memory and r.num_candidates == 0
        assert r.lower_bound_ms == empty.expected_step_ms and r.kept == ()
        kept = exact_solve(m, candidates=cands, keep_within_ms=empty.expected_step_ms)
        assert [e.capture_sizes for e in kept.kept] == [()]
        assert exact_solve(m, candidates=cands, keep_within_ms=empty.expected_step_ms * 0.99).kept == ()


@pytest.mark.parametrize("seed", KEEP_SEEDS)
def test_a_latency_exactly_the_optimums_keeps_the_optimum(tmp_path, seed):
    # The compact choice asks for the least memory within a latency; a latency equal to the optimum's (to the last
    # bit) must keep a list that fast: the levels' sums may round the other way by float noise.
    m, candidates = random_case(tmp_path, seed)
    lists = fitting(m, candidates)
    fastest = min(e.expected_step_ms for e in lists)
    r = exact_solve(m, candidates=candidates, keep_within_ms=fastest)
    assert r.exact_memory and r.kept
    assert all(e.feasible and e.expected_step_ms <= fastest + 1e-12 for e in r.kept)
    assert min(e.expected_step_ms for e in r.kept) == pytest.approx(fastest, abs=1e-12)
    assert_kept_by_level(m, r.kept)


@pytest.mark.parametrize("seed", KEEP_SEEDS)
def test_a_latency_the_empty_list_meets_keeps_the_least_memory_first(tmp_path, seed):
    # Within the empty list's latency (and a bit more) the least memory is nothing: the first kept list counts no
    # memory and is the fastest counting none (brute force), the levels' lists follow once each.
    m, candidates = random_case(tmp_path, seed)
    lists = fitting(m, candidates)
    keep_ms = m.evaluate(()).expected_step_ms * 1.01
    r = exact_solve(m, candidates=candidates, keep_within_ms=keep_ms)
    assert r.exact_memory and r.kept
    assert all(e.feasible and e.expected_step_ms <= keep_ms + 1e-12 for e in r.kept)
    least = min((e for e in lists if e.expected_step_ms <= keep_ms + 1e-12),
                key=lambda e: (counted_bytes(m, e), e.expected_step_ms))
    assert counted_bytes(m, least) == 0 == counted_bytes(m, r.kept[0])
    assert r.kept[0].expected_step_ms == pytest.approx(least.expected_step_ms, abs=1e-12)
    assert_kept_by_level(m, r.kept)


@pytest.mark.parametrize("seed", [1, 3, 4])
def test_an_approximated_answer_improved_under_a_cap_stays_under_it(tmp_path, seed):
    # Several V2 tiers: the program only approximates the latency and the answer is then improved one width at a
    # time; under a cap, a move that counts more than the cap is no improvement (the compact choice asks for the
    # fastest list under the cap). A quarter of the lists' counted memory (brute force) makes the cap bind.
    m, candidates = dynamic_case(tmp_path, seed, tiers=2 + seed % 2)
    counted = sorted({counted_bytes(m, e) for e in fitting(m, candidates)})
    cap = counted[len(counted) // 4]
    r = exact_solve(m, candidates=candidates, memory_cap_bytes=cap)
    assert APPROXIMATED in r.unproven
    assert r.best.feasible and counted_bytes(m, r.best) <= cap


def test_improving_one_width_at_a_time_fits_both_memory_conditions_by_default(tmp_path):
    # Without `fits`, fitting means vLLM's two memory conditions: from the empty list the result fits and no list
    # one candidate away from it both fits and is faster (a local optimum, checked by evaluating every such move).
    # Seed 2: several moves improve on the empty list.
    m, candidates = random_case(tmp_path, 2)
    best = improve_locally(m, m.evaluate(()), candidates)
    assert best.feasible and len(best.capture_sizes) >= 2
    moves = [m.evaluate(set(best.capture_sizes) ^ {c}) for c in candidates]
    assert not [e for e in moves if e.feasible and e.expected_step_ms < best.expected_step_ms - 1e-12]


@pytest.mark.parametrize("seed", [28, 254])
def test_where_the_real_capture_binds_the_answer_is_read_from_every_level_where_latency_drops(tmp_path, seed):
    # gpu_memory_utilization 1.0: the fastest list of the program does not fit beside the estimate, so the answer is
    # the fastest list that fits both among every level where a pass's latency drops (by any amount, not only by a
    # large one). In these two cases that is brute force's optimum (not claimed proven).
    m, candidates = random_case(tmp_path, seed, util=1.0)
    r = exact_solve(m, candidates=candidates)
    assert not r.exact_memory and any("real capture could outgrow" in why for why in r.unproven)
    assert r.best.feasible
    assert r.best.expected_step_ms == pytest.approx(brute_force(m, candidates).expected_step_ms, abs=1e-12)


def test_kept_levels_that_fill_up_still_start_at_the_empty_list(tmp_path):
    # Every candidate of V2 case 103 and 1.5x the empty list's latency: more levels drop within it than KEPT holds.
    # The empty list fits, counts nothing and is within the latency, so the least memory within it is 0 bytes: the
    # first kept list counts none, however many levels filled the rest.
    m, _ = random_case(tmp_path, 103, mode="FULL_AND_PIECEWISE", runner="v2", util=0.9)
    empty = m.evaluate(())
    r = exact_solve(m, keep_within_ms=empty.expected_step_ms * 1.5)
    assert r.exact_memory and len(r.kept) == KEPT
    assert counted_bytes(m, r.kept[0]) == 0 and r.kept[0].expected_step_ms <= empty.expected_step_ms
    assert_kept_by_level(m, r.kept)


@pytest.mark.parametrize("seed", [6, 38])
def test_where_the_real_capture_may_not_fit_the_bound_is_the_fastest_list_vllm_starts_with(tmp_path, seed):
    # Memory counted exactly, but the real capture may outgrow the estimate: the levels solved every pass exactly
    # under the estimate alone, so the proven lower bound is the fastest list whose estimate leaves the required KV
    # cache (brute force, the real capture ignored), below the answer here, and not a looser Lagrangian bound.
    m, candidates = random_case(tmp_path, seed)
    r = exact_solve(m, candidates=candidates)
    lists = [m.evaluate(s) for k in range(len(candidates) + 1) for s in combinations(candidates, k)]
    starts = min(e.expected_step_ms for e in lists if e.starts and not e.reason)
    assert not r.exact_memory and r.memory_unit_bytes % MIB == 0
    assert r.lower_bound_ms == pytest.approx(starts, abs=1e-12) and starts < r.best.expected_step_ms


OUTGROW = "the real capture could outgrow vLLM's estimate by more than the memory vLLM does not request"


@pytest.mark.parametrize("seed", sorted(UNPROVEN_SEEDS))
def test_an_answer_the_real_capture_leaves_unproven_says_so(tmp_path, seed):
    # Each unproven random case (memory counted exactly, utilization 0.99 or 1.0) gives the one reason a report
    # prints, whether or not the real capture bound the answer found (seeds 6 and 38 it did, the others not).
    m, candidates = random_case(tmp_path, seed)
    r = exact_solve(m, candidates=candidates)
    assert not r.exact_memory and r.unproven == (OUTGROW,)
    assert OUTGROW in r.caveat()


@pytest.mark.parametrize("front_points", [0, 1])
def test_a_solve_that_asks_for_no_front_still_proves_the_optimum(tmp_path, front_points):
    # front_points <= 1 (the API's, no caller in the tool): the bounds start without the front's grid prices, and the
    # answer is still brute force's optimum, proven.
    m, candidates = random_case(tmp_path, 0)
    r = exact_solve(m, candidates=candidates, front_points=front_points)
    assert r.exact_memory
    assert r.best.expected_step_ms == pytest.approx(brute_force(m, candidates).expected_step_ms, abs=1e-12)


def test_an_answer_with_memory_rounded_names_the_unit_in_mib(tmp_path):
    # Eight buckets over a budget of tens of MiB: units of several MiB, not counted exactly. The reason names the
    # unit the program counted in (memory_unit_bytes) in MiB, to the thousandth.
    m, candidates = random_case(tmp_path, 0)
    r = exact_solve(m, candidates=candidates, memory_buckets=8)
    assert r.rounded and r.memory_unit_bytes > MIB
    [why] = [why for why in r.unproven if why.startswith(ROUNDED)]
    assert why.endswith(f" {r.memory_unit_bytes / MIB:.3f} MiB")


def test_a_list_counting_nothing_that_beats_the_empty_list_is_kept_before_it(tmp_path):
    # Widths 1 and 2 capture for free (standalone and delta 0 bytes): lists of them count no memory and are faster
    # than the empty list, so within the empty list's latency the first kept list is the fastest list counting
    # nothing (brute force), the empty list after it.
    wl = handmade_workload(max_num_seqs=8, max_num_batched_tokens=32, cudagraph_mode="FULL_AND_PIECEWISE",
                           model_runner="v2", traffic={"requests": {"kind": "uniform", "min": 1, "max": 8},
                                                       "mixed_share": 0.3,
                                                       "mixed_tokens": {"kind": "uniform", "min": 1, "max": 32}})
    path = handmade_profile(tmp_path, wl, list(range(1, 33)), standalone_bytes=lambda w: 0 if w <= 2 else w * MIB,
                            delta_bytes=lambda w: 0 if w <= 2 else 2 * MIB, name="free")
    m = CostModel.from_files(path, wl)
    candidates = [1, 2, 4, 8, 16]
    empty = m.evaluate(())
    zero = min((e for e in fitting(m, candidates) if counted_bytes(m, e) == 0), key=lambda e: e.expected_step_ms)
    assert zero.capture_sizes and zero.expected_step_ms < empty.expected_step_ms
    r = exact_solve(m, candidates=candidates, keep_within_ms=empty.expected_step_ms)
    assert [e.capture_sizes for e in r.kept[:2]] == [zero.capture_sizes, ()]
