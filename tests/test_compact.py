"""The compact choice held to brute force: of every subset of the candidates that fits, the least counted graph memory
(vLLM's estimate; the real pool where the rule counts that) whose expected step is within the tolerance of the
fastest, on the exact solver's random cases (both runners, every mode, drafters, the estimate off, SGLang and
TensorRT-LLM); and the two solver modes it rests on, a cap on the counted memory and the kept least levels."""

from __future__ import annotations

import sys
from itertools import combinations
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/ helpers (import-mode=importlib)
from handmade_profiles import MIB  # noqa: E402
from test_engines import random_engine_case  # noqa: E402
from test_exact import UNPROVEN_TOLERANCE, random_case, random_drafter_case  # noqa: E402

from tuner.model.costmodel import CostModel, Evaluation  # noqa: E402
from tuner.search.compact import RECOMMEND_SAVING, CompactChoice, choose_compact, counted_bytes  # noqa: E402
from tuner.search.exact import exact_solve  # noqa: E402


def fitting_lists(m: CostModel, candidates: list[int]) -> list[Evaluation]:
    """Every subset of the candidates that fits, evaluated."""
    return [e for k in range(len(candidates) + 1) for s in combinations(candidates, k) if (e := m.evaluate(s)).feasible]


def brute_compact(m: CostModel, candidates: list[int], tolerance: float) -> tuple[Evaluation, float]:
    """(the fitting subset with the least counted memory within the tolerance, ties to the faster; the fastest
    fitting subset's expected step), by evaluating every subset."""
    fitting = fitting_lists(m, candidates)
    fastest = min(e.expected_step_ms for e in fitting)
    within = [e for e in fitting if e.expected_step_ms <= fastest * (1 + tolerance) + 1e-12]
    return min(within, key=lambda e: (counted_bytes(m, e), e.expected_step_ms)), fastest


def assert_least_within_tolerance(m: CostModel, candidates: list[int], tolerance: float) -> Evaluation:
    """The compact choice, where the solver proves it, has brute force's counted memory and latency; unproven (the
    solver's own fastest may then be slower than the true one), it still fits within the tolerance of the fastest
    list the solver found, which is no faster than brute force's, and no fitting list within that counts less than
    the floor it claims proven."""
    choice = choose_compact(m, tolerance, candidates=candidates)
    brute, fastest = brute_compact(m, candidates, tolerance)
    c = choice.evaluation
    assert c.feasible and set(c.capture_sizes) <= set(candidates)
    assert c.expected_step_ms <= choice.limit_ms + 1e-12
    assert choice.fastest_ms >= fastest - 1e-12
    least = min(counted_bytes(m, e) for e in fitting_lists(m, candidates)
                if e.expected_step_ms <= choice.limit_ms + 1e-12)
    assert choice.floor_bytes <= least <= counted_bytes(m, c)
    # Unproven, the solver's fastest is still within UNPROVEN_TOLERANCE of the true one (worst seen: 0.42%, seed 6).
    assert choice.fastest_ms <= fastest * (1 + UNPROVEN_TOLERANCE)
    if choice.proven:
        assert choice.fastest_ms == pytest.approx(fastest, abs=1e-12)
        assert counted_bytes(m, c) == counted_bytes(m, brute)
        assert c.expected_step_ms == pytest.approx(brute.expected_step_ms, abs=1e-12)
    return c


@pytest.mark.parametrize("seed", range(24))
def test_compact_is_the_least_estimate_within_tolerance(tmp_path, seed):
    m, candidates = random_case(tmp_path, seed)
    assert_least_within_tolerance(m, candidates, (0.0, 0.01, 0.05)[seed % 3])


@pytest.mark.parametrize("seed", range(100, 112))
def test_compact_on_v2_windows(tmp_path, seed):
    m, candidates = random_case(tmp_path, seed, mode="FULL_AND_PIECEWISE", runner="v2", util=0.9)
    assert_least_within_tolerance(m, candidates, 0.05)


def test_least_estimate_is_not_the_least_real_pool_so_the_cap_is_on_the_estimate(tmp_path):
    # vLLM's default mode extrapolates the second-largest FULL graph, so the estimate does not follow the real pool:
    # here another list within 5% is faster than the one with the least estimate, with no more real pool. The cap and
    # the kept levels count the estimate (the solver's memory axis); counted on the real pool, the choice would be
    # that other list.
    m, candidates = random_case(tmp_path, 101, mode="FULL_AND_PIECEWISE", runner="v2", util=0.9)
    assert m.budget.estimate_enabled
    least_estimate, _ = brute_compact(m, candidates, 0.05)
    fitting = [m.evaluate(s) for k in range(len(candidates) + 1) for s in combinations(candidates, k)]
    fastest = min(e.expected_step_ms for e in fitting if e.feasible)
    least_real = min((e for e in fitting if e.feasible and e.expected_step_ms <= fastest * 1.05 + 1e-12),
                     key=lambda e: (e.graph_memory_bytes, e.expected_step_ms))
    assert least_estimate.graph_estimate_bytes < least_real.graph_estimate_bytes
    assert least_real.graph_memory_bytes <= least_estimate.graph_memory_bytes
    assert least_real.expected_step_ms < least_estimate.expected_step_ms
    assert choose_compact(m, 0.05, candidates=candidates).evaluation.capture_sizes == least_estimate.capture_sizes


@pytest.mark.parametrize("seed", range(16))
def test_compact_with_a_drafter(tmp_path, seed):
    m, candidates = random_drafter_case(tmp_path, seed, estimate=seed % 3 != 2)
    assert m.drafter is not None
    assert_least_within_tolerance(m, candidates, 0.02)


@pytest.mark.parametrize("seed", range(12))
def test_compact_for_sglang_and_trtllm_counts_the_real_pool(tmp_path, seed):
    m, candidates = random_engine_case(tmp_path, seed)
    c = assert_least_within_tolerance(m, candidates, 0.03)
    assert counted_bytes(m, c) == c.graph_memory_bytes


def test_enough_cases_are_proven_and_the_compact_list_differs_from_the_fastest(tmp_path):
    # The brute-force comparison only tests something if most answers are proven and the compact list is often not
    # the fastest one.
    proven = differs = 0
    for seed in range(24):
        m, candidates = random_case(tmp_path / str(seed), seed)
        choice = choose_compact(m, 0.05, candidates=candidates)
        brute, fastest = brute_compact(m, candidates, 0.0)
        proven += choice.proven
        differs += counted_bytes(m, choice.evaluation) < counted_bytes(m, brute)
    assert proven >= 14 and differs >= 12


def test_tolerance_zero_keeps_the_fastest_latency_and_a_wider_one_never_adds_memory(tmp_path):
    m, candidates = random_case(tmp_path, 101, mode="FULL_AND_PIECEWISE", runner="v2", util=0.9)
    counted = []
    for tolerance in (0.0, 0.01, 0.05, 0.2, 1.0):
        choice = choose_compact(m, tolerance, candidates=candidates)
        counted.append(counted_bytes(m, choice.evaluation))
        if tolerance == 0.0:
            assert choice.evaluation.expected_step_ms == pytest.approx(choice.fastest_ms, abs=1e-12)
    assert counted == sorted(counted, reverse=True) and counted[0] > counted[-1]


def test_a_known_faster_list_sets_the_reference(tmp_path):
    m, candidates = random_case(tmp_path, 102, mode="FULL_AND_PIECEWISE", runner="v2", util=0.9)
    alone = choose_compact(m, 0.01, candidates=candidates)
    # A fitting list outside the candidates that is faster than anything the solver could build from them.
    faster = min((e for w in m.candidates if (e := m.evaluate(set(alone.evaluation.capture_sizes) | {w})).feasible),
                 key=lambda e: e.expected_step_ms)
    with_known = choose_compact(m, 0.01, candidates=candidates, known=[faster])
    assert with_known.fastest_ms == min(alone.fastest_ms, faster.expected_step_ms)


def test_saved_share_and_recommendation_are_on_the_counted_memory(tmp_path):
    m, candidates = random_case(tmp_path, 104, mode="FULL_AND_PIECEWISE", runner="v2", util=0.9)
    choice = choose_compact(m, 1.0, candidates=candidates)  # anything up to twice the fastest: the empty list
    tuned = m.evaluate(candidates)
    assert choice.evaluation.capture_sizes == () and counted_bytes(m, tuned) > 0
    assert choice.saved_share(m, tuned) == 1.0 and choice.recommended(m, tuned)
    same = choose_compact(m, 0.0, candidates=candidates)
    share = same.saved_share(m, same.evaluation)
    assert share == 0.0 and not same.recommended(m, same.evaluation) and RECOMMEND_SAVING == 0.25
    assert counted_bytes(m, tuned) % MIB == 0  # whole-MiB fixtures: the shares above are exact


def test_tolerance_must_be_a_finite_number_at_least_zero(tmp_path):
    m, candidates = random_case(tmp_path, 100, mode="FULL_AND_PIECEWISE", runner="v2", util=0.9)
    for bad in (-0.01, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="tolerance="):
            choose_compact(m, bad, candidates=candidates)


@pytest.mark.parametrize("seed", range(12))
def test_a_capped_solve_is_the_fastest_list_counting_at_most_the_cap(tmp_path, seed):
    # The cap the compact choice asks under: brute force over the fitting lists that count at most the cap.
    m, candidates = (random_case if seed % 2 else random_drafter_case)(tmp_path, seed)
    lists = fitting_lists(m, candidates)
    counted = sorted({counted_bytes(m, e) for e in lists})
    for cap in (counted[len(counted) // 4], max(0, counted[len(counted) // 2] - 1), 0):
        r = exact_solve(m, candidates=candidates, memory_cap_bytes=cap)
        under = [e for e in lists if counted_bytes(m, e) <= cap]
        fastest = min(e.expected_step_ms for e in under)
        assert r.best.feasible and counted_bytes(m, r.best) <= cap
        assert all(counted_bytes(m, e) <= cap for e in r.front)
        assert r.lower_bound_ms is None or r.lower_bound_ms <= fastest + 1e-12
        if r.exact_memory:
            assert r.best.expected_step_ms == pytest.approx(fastest, abs=1e-12)


@pytest.mark.parametrize("seed", range(12))
def test_kept_levels_start_at_the_least_memory_within_the_latency(tmp_path, seed):
    # One solve reads every memory level: its first kept list is brute force's compact list wherever it is proven.
    m, candidates = random_case(tmp_path, seed)
    lists = fitting_lists(m, candidates)
    keep_ms = min(e.expected_step_ms for e in lists) * 1.03
    r = exact_solve(m, candidates=candidates, keep_within_ms=keep_ms)
    within = [e for e in lists if e.expected_step_ms <= keep_ms + 1e-12]
    least = min(within, key=lambda e: (counted_bytes(m, e), e.expected_step_ms))
    assert all(e.feasible and e.expected_step_ms <= keep_ms + 1e-12 for e in r.kept)
    if r.exact_memory:
        assert counted_bytes(m, r.kept[0]) == counted_bytes(m, least)
        assert r.kept[0].expected_step_ms == pytest.approx(least.expected_step_ms, abs=1e-12)
        # Kept by level: the later levels count more memory and are faster.
        assert [counted_bytes(m, e) for e in r.kept] == sorted(counted_bytes(m, e) for e in r.kept)


def test_a_cap_below_zero_is_refused(tmp_path):
    m, candidates = random_case(tmp_path, 0)
    with pytest.raises(ValueError, match="memory_cap_bytes=-1"):
        exact_solve(m, candidates=candidates, memory_cap_bytes=-1)


def test_past_its_time_budget_the_choice_says_so_and_claims_only_what_it_proved(tmp_path):
    # An injected clock: each reading is a second later, so the budget runs out in the first capped solve.
    m, candidates = random_case(tmp_path, 101, mode="FULL_AND_PIECEWISE", runner="v2", util=0.9)
    ticks = iter(range(10**6))
    choice = choose_compact(m, 0.05, candidates=candidates, seconds=5, clock=lambda: float(next(ticks)))
    assert choice.stopped_early and not choice.proven and choice.solves <= 1
    c = choice.evaluation
    assert c.feasible and c.expected_step_ms <= choice.limit_ms + 1e-12
    least = min(counted_bytes(m, e) for e in fitting_lists(m, candidates)
                if e.expected_step_ms <= choice.limit_ms + 1e-12)
    assert choice.floor_bytes <= least
    unhurried = choose_compact(m, 0.05, candidates=candidates)
    assert unhurried.proven and not unhurried.stopped_early and counted_bytes(m, unhurried.evaluation) == least
    # A budget its clock never spends (it stands still) changes nothing: the choice made with no budget at all.
    still = choose_compact(m, 0.05, candidates=candidates, seconds=5, clock=lambda: 0.0)
    assert still.proven and not still.stopped_early
    assert still.evaluation.capture_sizes == unhurried.evaluation.capture_sizes


def test_the_capped_solves_keep_to_the_time_budget_and_its_clock(tmp_path):
    # The fastest list solved already (as `cgtune search` hands it over), so the whole budget is left for the capped
    # solves: a clock one second later at every reading spends it inside the first, which must stop there, not run
    # past the user's --exact-seconds (with no budget the same solve proves the choice).
    m, candidates = random_case(tmp_path, 101, mode="FULL_AND_PIECEWISE", runner="v2", util=0.9)
    fastest = exact_solve(m, candidates=candidates)
    ticks = iter(range(10**6))
    choice = choose_compact(m, 0.05, candidates=candidates, fastest=fastest, seconds=5,
                            clock=lambda: float(next(ticks)))
    assert choice.solves == 1 and choice.stopped_early and not choice.proven
    assert choice.evaluation.feasible and choice.evaluation.expected_step_ms <= choice.limit_ms + 1e-12
    unhurried = choose_compact(m, 0.05, candidates=candidates, fastest=fastest)
    assert unhurried.solves == 1 and unhurried.proven and not unhurried.stopped_early


def test_the_kept_levels_prove_most_cases_in_one_capped_solve(tmp_path):
    # The compact choice costs one capped solve where the solver counts memory exactly (the floor probes are for
    # rounded memory and a real capture that could outgrow the estimate).
    solves = []
    for seed in range(100, 106):
        m, candidates = random_case(tmp_path / str(seed), seed, mode="FULL_AND_PIECEWISE", runner="v2", util=0.9)
        choice = choose_compact(m, 0.05, candidates=candidates)
        assert choice.proven
        solves.append(choice.solves)
    assert solves.count(1) >= 5


def test_a_choice_read_back_from_search_json_is_the_choice_written(tmp_path):
    # search.json keeps the compact choice so a re-render does not choose again: every field comes back as written
    # (a field under another key, or read with its default, would change what the report claims is proven), and a
    # run written before the floor, the fastest's proof, the time budget and the solve count were kept claims none.
    m, candidates = random_case(tmp_path, 3)
    choice = choose_compact(m, 0.02, candidates=candidates)
    written = choice.to_dict()
    assert set(written) == {"capture_sizes", "tolerance", "fastest_ms", "proven", "floor_bytes", "fastest_proven",
                            "stopped_early", "solves", "work"}
    assert written["capture_sizes"] == list(choice.evaluation.capture_sizes) and written["tolerance"] == 0.02
    back = CompactChoice.from_dict(written, m)
    assert back == choice
    # Every field distinct from its default, so a field read with its default (or under another key) shows.
    made = CompactChoice(m.evaluate(candidates[:2]), 0.05, 7.25, True, 12345, True, True, 4, 6789)
    assert CompactChoice.from_dict(made.to_dict(), m) == made
    old = {k: v for k, v in made.to_dict().items() if k in ("capture_sizes", "tolerance", "fastest_ms", "proven")}
    assert CompactChoice.from_dict(old, m) == CompactChoice(made.evaluation, 0.05, 7.25, True, 0, False, False, 0, 0)


def test_the_saved_share_and_the_recommendation_by_hand(tmp_path, monkeypatch):
    # The rule: the share of the tuned list's counted memory the compact list saves, 1 - compact / tuned (0 when the
    # tuned list counts none), recommended from RECOMMEND_SAVING (25%) on. Counted bytes set by hand: 4 -> 3 saves
    # exactly 25% (recommended), 4 -> 3.2 saves 20% (not), a tuned list of one byte -> none saves all of it.
    import tuner.search.compact as compact

    m, candidates = random_case(tmp_path, 3)
    tuned, small = m.evaluate(candidates), m.evaluate(candidates[:1])
    counted = {}
    monkeypatch.setattr(compact, "counted_bytes", lambda model, e: counted[e.capture_sizes])

    def choice_of(compact_bytes: float, tuned_bytes: float) -> CompactChoice:
        counted.update({small.capture_sizes: compact_bytes, tuned.capture_sizes: tuned_bytes})
        return CompactChoice(small, 0.01, 1.0, True, 0)

    quarter = choice_of(3, 4)
    assert quarter.saved_share(m, tuned) == 0.25 and quarter.recommended(m, tuned)
    fifth = choice_of(3.2, 4)
    assert fifth.saved_share(m, tuned) == pytest.approx(0.2) and not fifth.recommended(m, tuned)
    assert choice_of(0, 1).saved_share(m, tuned) == 1.0
    assert choice_of(0, 0).saved_share(m, tuned) == 0.0


@pytest.mark.parametrize("seed", range(16))
def test_with_memory_rounded_the_floor_probes_claim_only_what_brute_force_confirms(tmp_path, seed):
    # Four memory buckets round every figure, so the kept levels prove little and the capped probes below the answer
    # run (`_Search.run`). Whatever they find, the choice claims only what brute force confirms: the floor is at most
    # the least counted memory within the limit, the list is the fastest of its counted memory within it (ties go to
    # the faster), and "proven" means brute force's answer.
    m, candidates = random_case(tmp_path, seed)
    tolerance = (0.0, 0.01, 0.05, 0.2)[seed % 4]
    choice = choose_compact(m, tolerance, candidates=candidates, memory_buckets=4)
    c = choice.evaluation
    within = [e for e in fitting_lists(m, candidates) if e.expected_step_ms <= choice.limit_ms + 1e-12]
    assert c.feasible and c.expected_step_ms <= choice.limit_ms + 1e-12
    assert choice.floor_bytes <= min(counted_bytes(m, e) for e in within) <= counted_bytes(m, c)
    same = [e.expected_step_ms for e in within if counted_bytes(m, e) == counted_bytes(m, c)]
    if choice.proven:
        brute, _ = brute_compact(m, candidates, tolerance)
        assert counted_bytes(m, c) == counted_bytes(m, brute) and c.expected_step_ms == pytest.approx(min(same))


def test_a_known_list_faster_than_the_solvers_optimum_leaves_the_fastest_unproven(tmp_path):
    # The solver proves the optimum over its candidates only: a known list outside them that is faster sets the
    # reference, and then the reference is not a proven optimum, so neither it nor the choice is claimed proven.
    m, candidates = random_case(tmp_path, 102, mode="FULL_AND_PIECEWISE", runner="v2", util=0.9)
    alone = choose_compact(m, 0.01, candidates=candidates)
    assert alone.fastest_proven and alone.proven
    faster = min((e for w in m.candidates if (e := m.evaluate(set(alone.evaluation.capture_sizes) | {w})).feasible),
                 key=lambda e: e.expected_step_ms)
    assert faster.expected_step_ms < alone.fastest_ms
    with_known = choose_compact(m, 0.01, candidates=candidates, known=[faster])
    assert with_known.fastest_ms == faster.expected_step_ms
    assert not with_known.fastest_proven and not with_known.proven


def test_a_choice_stopped_before_any_capped_solve_claims_no_floor(tmp_path):
    # A clock one second later at every reading spends the whole budget in the first, uncapped solve: no capped
    # solve runs, nothing is proven, so the floor claimed is 0 bytes (while the list found counts more).
    m, candidates = random_case(tmp_path, 101, mode="FULL_AND_PIECEWISE", runner="v2", util=0.9)
    ticks = iter(range(10**6))
    choice = choose_compact(m, 0.05, candidates=candidates, seconds=5, clock=lambda: float(next(ticks)))
    assert choice.stopped_early and choice.solves == 0 and not choice.proven
    assert counted_bytes(m, choice.evaluation) > 0 and choice.floor_bytes == 0


def test_where_the_real_capture_may_outgrow_the_estimate_a_probe_one_byte_below_closes_the_floor(tmp_path):
    # random_case 6: memory counted exactly, but the real capture may outgrow the estimate, so the kept levels prove
    # nothing. The probe one byte below the least memory found proves that no list within the tolerance counts less:
    # the floor is the compact list's own counted memory, brute force's least (the choice still unproven: its
    # fastest list is not proven optimal).
    m, candidates = random_case(tmp_path, 6)
    choice = choose_compact(m, 0.05, candidates=candidates)
    brute, _ = brute_compact(m, candidates, 0.05)
    assert not choice.fastest_proven and not choice.proven
    assert choice.floor_bytes == counted_bytes(m, choice.evaluation) == counted_bytes(m, brute) > 0


@pytest.mark.parametrize("seed, shift", [(4, 8), (13, 6)])
def test_with_memory_rounded_the_first_probe_that_proves_sets_the_floor(tmp_path, seed, shift):
    # Four buckets round the memory, so the probes below the answer run at 1/256, 1/64, then 1/16 of its counted
    # memory below it, stopping at the first proof. Here the probe 1/2^shift below proves (brute force agrees that
    # nothing within the tolerance counts less): the floor is one byte above that probe's cap.
    m, candidates = random_case(tmp_path, seed)
    tolerance = (0.0, 0.01, 0.05, 0.2)[seed % 4]
    choice = choose_compact(m, tolerance, candidates=candidates, memory_buckets=4)
    hi = counted_bytes(m, choice.evaluation)
    brute, _ = brute_compact(m, candidates, tolerance)
    assert hi == counted_bytes(m, brute)
    assert choice.floor_bytes == hi - (hi >> shift) + 1


@pytest.mark.parametrize("seed, util, buckets", [(30, 1.0, 2048), (33, None, 4)])
def test_a_probe_that_finds_a_faster_list_of_the_same_memory_takes_it(tmp_path, seed, util, buckets):
    # Unproven cases (the real capture may outgrow the estimate; memory rounded to four buckets) where a capped solve
    # finds a list counting exactly the least memory found but faster than the list holding it: the choice takes the
    # faster one. Brute force: the choice is the least counted memory within 5% and the fastest list counting that.
    m, candidates = random_case(tmp_path, seed, util=util)
    choice = choose_compact(m, 0.05, candidates=candidates, memory_buckets=buckets)
    brute, _ = brute_compact(m, candidates, 0.05)
    c = choice.evaluation
    assert not choice.proven and c.feasible
    assert counted_bytes(m, c) == counted_bytes(m, brute)
    assert c.expected_step_ms == pytest.approx(brute.expected_step_ms, abs=1e-12)
