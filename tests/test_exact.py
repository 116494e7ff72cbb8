"""The exact solver against brute force under vLLM's memory rule: both runners, every cudagraph mode, the estimate
on and off, budgets where the estimate (not the real pool) draws the edge."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/handmade_profiles.py (import-mode=importlib)
from handmade_profiles import MIB, handmade_profile, handmade_workload  # noqa: E402

from tuner.search.exact import brute_force, exact_solve  # noqa: E402
from tuner.model.costmodel import CostModel  # noqa: E402

MODES = ["FULL_AND_PIECEWISE", "FULL", "FULL_DECODE_ONLY", "PIECEWISE"]


def random_case(tmp_path: Path, seed: int, *, mode: str | None = None, runner: str | None = None,
                util: float | None = None) -> tuple[CostModel, list[int]]:
    """Noisy latencies, memory figures in whole MiB (some deltas below vLLM's 1 MiB floor), a budget drawn so that
    some but not all lists fit, mixed and decode steps."""
    rnd = random.Random(seed)
    spec = rnd.choice([0, 1, 3])
    mode = mode or MODES[seed % 4]
    runner = runner or rnd.choice(["v1", "v2"])
    q = spec + 1
    util = util or rnd.choice([0.9, 0.9, 0.99, 1.0])
    wl = handmade_workload(num_speculative_tokens=spec, max_num_seqs=8, max_num_batched_tokens=32,
                           traffic={"requests": {"kind": "uniform", "min": 1, "max": min(8, 32 // q)},
                                    "mixed_share": 0.3, "mixed_tokens": {"kind": "uniform", "min": 1, "max": 32}},
                           cudagraph_mode=mode, model_runner=runner, estimate_cudagraph_memory=rnd.random() > 0.25,
                           gpu_memory_utilization=util)
    widths = list(range(1, 33))
    e = {w: rnd.uniform(1, 3) for w in widths}
    f = {w: e[w] * rnd.uniform(0.3, 1.1) for w in widths}  # graphs mostly faster, not always
    pw = {w: e[w] * rnd.uniform(0.5, 1.1) for w in widths}
    sa = {w: rnd.randint(2, 12) for w in widths}
    de = {w: rnd.choice([0, 0, 1, 2, 3, 5]) for w in widths}
    # A 1000 MiB device; weights fill it so that 12..60 MiB of graph estimate leave the required KV cache.
    activation = 50 * MIB
    weights = int(1000 * MIB * util) - activation - rnd.randint(12, 60) * MIB
    path = handmade_profile(tmp_path, wl, widths, total_memory_bytes=1000 * MIB, weights_bytes=weights,
                            activation_peak_bytes=activation, eager_ms=e.get, full_ms=f.get,
                            piecewise_ms=pw.get if seed % 3 else None, standalone_bytes=lambda w: sa[w] * MIB,
                            delta_bytes=lambda w: de[w] * MIB, name=f"rand{seed}")
    model = CostModel.from_files(path, wl)
    candidates = sorted(rnd.sample(model.candidates, min(10, len(model.candidates))))
    return model, candidates


UNPROVEN_SEEDS = {3, 5, 6, 7, 10, 16, 18, 20, 21, 38}
"""random_case seeds (of 0..39) whose answer the solver cannot prove optimal: the real capture may outgrow vLLM's
estimate by more than what vLLM leaves unrequested (a gpu_memory_utilization of 0.99 or 1.0)."""
UNPROVEN_DRAFTER_SEEDS = {0, 2, 4, 6, 10, 17, 20, 25, 30, 34}
"""random_drafter_case seeds (of 0..47) likewise."""
UNPROVEN_NO_ESTIMATE_SEEDS = {10}
"""random_drafter_case seeds (of 0..23) unproven with vLLM's estimate switched off."""
UNPROVEN_TOLERANCE = 0.06
"""An unproven answer is at most this much slower than brute force. Worst seen: 5.3% (drafter seed 34), 2.1% (drafter
seed 30); every other unproven case is within 0.6%, most exactly optimal. The empty list, which always fits, is 8% to
26% slower than the optimum in 13 of the 20 unproven cases: a solver that gave up on them fails here."""


def assert_matches_brute_force(m: CostModel, candidates: list[int], *, proven: bool) -> None:
    """The exact answer fits and says whether it is proven; proven optimal, it is as fast as the best of every subset;
    else (the capture-headroom condition could bind) it is no faster than that best and within UNPROVEN_TOLERANCE."""
    exact = exact_solve(m, candidates=candidates)
    brute = brute_force(m, candidates)
    assert exact.best.feasible
    assert exact.exact_memory is proven
    if proven:
        assert exact.best.expected_step_ms == pytest.approx(brute.expected_step_ms, abs=1e-12)
        # Proven means counted in a unit that divides every figure: the fixtures' figures are whole MiB.
        assert exact.memory_unit_bytes % MIB == 0
    else:
        assert brute.expected_step_ms - 1e-12 <= exact.best.expected_step_ms <= \
            brute.expected_step_ms * (1 + UNPROVEN_TOLERANCE)


@pytest.mark.parametrize("seed", range(40))
def test_exact_solver_equals_brute_force(tmp_path, seed):
    m, candidates = random_case(tmp_path, seed)
    # Not proven only where the real capture can outgrow the estimate by more than vLLM's unrequested memory
    # (here: a gpu_memory_utilization near 1).
    if seed in UNPROVEN_SEEDS:
        assert m.budget.slack_bytes <= 10 * MIB
    assert_matches_brute_force(m, candidates, proven=seed not in UNPROVEN_SEEDS)


@pytest.mark.parametrize("seed", range(100, 124))
def test_exact_solver_equals_brute_force_on_v2_windows(tmp_path, seed):
    # vLLM's default: FULL decode windows extrapolated from the second-largest, PIECEWISE graphs counted in full.
    m, candidates = random_case(tmp_path, seed, mode="FULL_AND_PIECEWISE", runner="v2", util=0.9)
    assert_matches_brute_force(m, candidates, proven=True)


def test_random_cases_are_not_trivial(tmp_path):
    # The fixture is only a test if the optimum is often a non-empty list that is not every candidate.
    sizes = []
    for seed in range(40):
        m, candidates = random_case(tmp_path / str(seed), seed)
        best = brute_force(m, candidates)
        sizes.append((len(best.capture_sizes), len(candidates)))
    assert sum(0 < k < n for k, n in sizes) >= 20


def test_cases_with_room_beside_the_estimate_are_proven_optimal(tmp_path):
    for seed in range(40):
        m, candidates = random_case(tmp_path / str(seed), seed)
        if m.budget.slack_bytes >= 100 * MIB:
            assert exact_solve(m, candidates=candidates).exact_memory, seed


def test_a_thinned_front_keeps_its_ends(tmp_path):
    m, candidates = random_case(tmp_path, 103, mode="FULL_AND_PIECEWISE", runner="v2", util=0.9)
    full = exact_solve(m, candidates=candidates)
    thin = exact_solve(m, candidates=candidates, front_points=3)
    assert len(full.front) > 3  # so that 3 points are a thinning
    # Three points spread from the lowest memory (no graphs) to the top, ending at the optimum.
    assert len(thin.front) == 3 and thin.front[0].capture_sizes == () == full.front[0].capture_sizes
    assert thin.front[-1].capture_sizes == full.best.capture_sizes == thin.best.capture_sizes


def test_exact_front_is_non_dominated_and_ends_at_the_optimum(tmp_path):
    m, candidates = random_case(tmp_path, 103, mode="FULL_AND_PIECEWISE", runner="v2", util=0.9)
    exact = exact_solve(m, candidates=candidates)
    front = exact.front
    assert len(front) >= 2
    assert all(e.feasible for e in front)
    for a, b in zip(front, front[1:]):
        assert a.graph_memory_bytes < b.graph_memory_bytes and a.expected_step_ms > b.expected_step_ms
    assert front[-1].expected_step_ms == pytest.approx(exact.best.expected_step_ms)


DRAFTERS = [("eagle", {"num_layers": 1}), ("mtp", {"num_layers": 1}), ("dflash", {"num_layers": 2}),
            ("draft_model", {"num_layers": 1})]


def random_drafter_case(tmp_path: Path, seed: int, *, estimate: bool = True, mode: str | None = None,
                        runner: str | None = None) -> tuple[CostModel, list[int]]:
    """random_case with a draft model: its passes, graphs and their memory in the list's cost; `estimate` False
    switches vLLM's graph-memory estimate off (the real pool, drafter windows included, is then what counts)."""
    rnd = random.Random(10_000 + seed)
    method, drafter = DRAFTERS[seed % 4]
    mode = mode or rnd.choice(["FULL_AND_PIECEWISE", "FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "PIECEWISE", "FULL"])
    runner = runner or rnd.choice(["v1", "v2"])
    spec = rnd.choice([1, 3])
    q = spec + 1
    util = rnd.choice([0.9, 0.9, 0.99])
    traffic = {"requests": {"kind": "uniform", "min": 1, "max": min(8, 32 // q)}, "mixed_share": 0.3,
               "mixed_tokens": {"kind": "uniform", "min": 1, "max": 32}}
    kwargs = dict(num_speculative_tokens=spec, max_num_seqs=8, max_num_batched_tokens=32, traffic=traffic,
                  cudagraph_mode=mode, model_runner=runner, gpu_memory_utilization=util,
                  estimate_cudagraph_memory=estimate, speculative={"method": method, "drafter": drafter})
    wl = handmade_workload(**kwargs)
    widths = list(range(1, 41))  # the drafter's passes reach T + N
    e = {w: rnd.uniform(1, 3) for w in widths}
    f = {w: e[w] * rnd.uniform(0.3, 1.1) for w in widths}
    pw = {w: e[w] * rnd.uniform(0.5, 1.1) for w in widths}
    de = {w: rnd.uniform(0.2, 1.0) for w in widths}
    df = {w: de[w] * rnd.uniform(0.2, 1.1) for w in widths}
    dp = {w: de[w] * rnd.uniform(0.4, 1.1) for w in widths}
    sa = {w: rnd.randint(2, 12) for w in widths}
    dl = {w: rnd.choice([0, 0, 1, 2, 3]) for w in widths}
    dsa = {w: rnd.randint(1, 4) for w in widths}
    ddl = {w: rnd.choice([0, 1, 2]) for w in widths}
    activation = 50 * MIB
    weights = int(1000 * MIB * util) - activation - rnd.randint(20, 80) * MIB - wl.drafter_weight_bytes()
    path = handmade_profile(tmp_path, wl, widths, total_memory_bytes=1000 * MIB, weights_bytes=weights,
                            activation_peak_bytes=activation, eager_ms=e.get, full_ms=f.get,
                            piecewise_ms=pw.get if seed % 3 else None, standalone_bytes=lambda w: sa[w] * MIB,
                            delta_bytes=lambda w: dl[w] * MIB, drafter_eager_ms=de.get, drafter_full_ms=df.get,
                            drafter_piecewise_ms=dp.get if seed % 2 else None,
                            drafter_standalone_bytes=lambda w: dsa[w] * MIB, drafter_delta_bytes=lambda w: ddl[w] * MIB,
                            name=f"drafter{seed}")
    # The drafter's graph latencies are drawn independently, up to 25x apart at neighbouring widths: the solver's
    # fixture, searched as drawn, not a profile to judge for outliers.
    model = CostModel.from_files(path, wl, allow_outliers=True)
    candidates = sorted(rnd.sample(model.candidates, min(9, len(model.candidates))))
    return model, candidates


@pytest.mark.parametrize("seed", range(48))
def test_exact_solver_equals_brute_force_with_a_drafter(tmp_path, seed):
    m, candidates = random_drafter_case(tmp_path, seed)
    assert m.drafter is not None
    assert_matches_brute_force(m, candidates, proven=seed not in UNPROVEN_DRAFTER_SEEDS)


@pytest.mark.parametrize("seed", range(24))
def test_exact_solver_equals_brute_force_with_a_drafter_and_no_estimate(tmp_path, seed):
    # The estimate off: the real pool counts, the drafter's graphs per FULL decode window included.
    m, candidates = random_drafter_case(tmp_path, seed, estimate=False)
    assert not m.budget.estimate_enabled
    assert_matches_brute_force(m, candidates, proven=seed not in UNPROVEN_NO_ESTIMATE_SEEDS)


@pytest.mark.parametrize("seed", range(24, 32))
def test_exact_solver_equals_brute_force_with_a_drafter_in_v2_full_mode(tmp_path, seed):
    # V2 in FULL mode: the estimate's count form, the drafter's graphs counted in full beside each member and the top
    # (seed 29: a top charged without its drafter graphs picks a list one member short, still claiming proof).
    m, candidates = random_drafter_case(tmp_path, seed, mode="FULL", runner="v2")
    assert_matches_brute_force(m, candidates, proven=seed not in {24, 26, 30})


@pytest.mark.parametrize("seed", [100, 133])
def test_exact_solver_charges_the_drafters_decode_windows_in_v2(tmp_path, seed):
    # V2 with FULL decode windows: the drafter's FULL graph of each window counts beside the target's. Of 150 drawn
    # cases these two are where it decides the list (uncharged, 133 fell back to no graphs at all).
    m, candidates = random_drafter_case(tmp_path, seed, mode="FULL_AND_PIECEWISE", runner="v2")
    assert_matches_brute_force(m, candidates, proven=True)
