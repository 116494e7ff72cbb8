"""The program over memory levels (`tuner.search.exact_levels`) held to its own rule, level by level (the solver's
answer only reads the top level; compact lists and the capture-bound fallback read every level): per pass and level
m, the fastest closed chain using at most m units, memory counted exactly; and the list a level backtracks to is a
real list whose latency and memory are the ones the level claims (none where the level has no chain). Against brute
force at up to ten candidates; where a pass reaches more cells than the rows first allocated (64), against a plain sweep
over the same transitions written out here (every candidate of the fixture: brute force is out of reach)."""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/*.py helpers (import-mode=importlib)
from handmade_profiles import MIB, handmade_profile, handmade_workload  # noqa: E402
from test_engines import random_engine_case  # noqa: E402
from test_exact import random_case, random_drafter_case  # noqa: E402
from test_exact_bounds import Yardstick, relabel, setup, yardstick  # noqa: E402
from test_exact_scaling import binding_case  # noqa: E402

from tuner.model.costmodel import CostModel  # noqa: E402
from tuner.search.exact import _Solve  # noqa: E402
from tuner.search.exact_levels import Levels  # noqa: E402
from tuner.search.exact_program import C0, counted_bytes  # noqa: E402


def passes(solve: _Solve, ys: Yardstick) -> list[tuple[np.ndarray, object, Levels]]:
    """Per pass: every level's latency, level -> its widths, and the program over levels itself (nothing pruned)."""
    out = []
    for p in ys.passes:
        levels = Levels(solve.program, ys.units, p.label, p.per_graph, ys.B, solve.program.pred_cls)
        totals, back = levels.best_levels(ys.limit)
        out.append((totals, back, levels))
    return out


def units_of(model: CostModel, solve: _Solve, sizes: tuple[int, ...]) -> tuple[float, int]:
    """A list's latency and its memory in the program's units (exact: the unit divides every figure)."""
    e = model.evaluate(sizes)
    counted = counted_bytes(model, e)
    assert counted % solve.unit == 0, (sizes, counted, solve.unit)
    return e.expected_step_ms, counted // solve.unit


def top_limit(solve: _Solve, ys: Yardstick, sizes: tuple[int, ...]) -> int:
    """The most units a list topped by max(sizes) may take (SGLang: its KV budget moves with the top)."""
    return int(ys.limit[solve.cands.index(max(sizes))])


def assert_levels_honest(model: CostModel, solve: _Solve, ys: Yardstick, per_pass) -> None:
    """Each level of each pass: a list backtracked at a finite level has the latency the level claims and fits the
    level (and its top's limit); a level with no chain backtracks to no list."""
    for totals, back, _ in per_pass:
        for m in range(ys.B + 1):
            sizes = back(m)
            if not math.isfinite(totals[m]):
                assert sizes == (), (m, sizes)
                continue
            assert sizes, m  # a closed chain has a top
            ms, units = units_of(model, solve, sizes)
            assert ms == pytest.approx(float(totals[m]), rel=1e-9), (m, sizes, ms, totals[m])
            assert units <= min(m, top_limit(solve, ys, sizes)), (m, sizes, units)


def brute_levels(model: CostModel, solve: _Solve, ys: Yardstick) -> np.ndarray:
    """Per level 0..B, the fastest non-empty list within that many units and its top's limit (the empty list closes
    no chain: no level holds it)."""
    best = np.full(ys.B + 1, math.inf)
    for k in range(1, len(solve.cands) + 1):
        for sizes in itertools.combinations(solve.cands, k):
            ms, units = units_of(model, solve, sizes)
            if units <= min(ys.B, top_limit(solve, ys, sizes)):
                best[units] = min(best[units], ms)
    return np.minimum.accumulate(best)


def level_case(tmp_path: Path, seed: int) -> tuple[CostModel, list[int]]:
    """The brute-force fixtures of every program kind (vLLM count and window forms, the real pool without the
    estimate, drafters, SGLang's per-top budgets, TensorRT-LLM), with loose budgets and cut ones (where a top's whole
    charge, or a single transition, can exceed the budget while later ones fit)."""
    kind = seed % 5
    if kind == 0:
        return random_case(tmp_path, seed)
    if kind == 1:
        return random_case(tmp_path, seed, mode="FULL_AND_PIECEWISE", runner="v2", util=0.9)
    if kind == 2:
        return random_drafter_case(tmp_path, seed // 5)
    if kind == 3:
        return random_engine_case(tmp_path, seed)
    return binding_case(tmp_path, seed // 5)


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5, 6, 7, 10, 11])  # 8, 9: not one list fits
def test_every_level_is_the_fastest_list_within_it(tmp_path, seed):
    model, candidates = level_case(tmp_path, seed)
    solve = setup(model, candidates)
    assert solve.exact_memory and solve.layers_exact
    ys = yardstick(solve, relabel(solve, "units"))
    per_pass = passes(solve, ys)
    totals = np.min(np.stack([t for t, _, _ in per_pass]), axis=0)  # each list is costed exactly in its own pass
    brute = brute_levels(model, solve, ys)
    assert np.isfinite(brute).sum() >= 2, "the fixture has lists at several levels"
    for m in range(ys.B + 1):
        assert totals[m] == pytest.approx(brute[m], rel=1e-9), (m, totals[m], brute[m])
    assert_levels_honest(model, solve, ys, per_pass)


def reference_levels(solve: _Solve, ys: Yardstick, label: int, per_graph: int) -> np.ndarray:
    """The fastest closed chain per level of one pass, swept plainly: a level array per reached (node, position) in a
    dict, every transition over every predecessor one at a time (no rows to grow, no blocks)."""
    program, units, B = solve.program, ys.units, ys.B
    best: dict[tuple[int, int], np.ndarray] = {(node, 0): np.zeros(B + 1) for node in program.starts(label)}
    for j in range(program.n):
        for e in program.edges(j):
            if not e.enabled(label):
                continue
            u = int(round(e.base(units, j))) + (per_graph if e.per_graph else 0)
            if u > B:
                continue
            for i in range(e.lo, e.hi):
                if (e.frm, i) not in best or (e.placing and program.pred_cls[i] != label):
                    continue
                to = best.setdefault((e.to, j + 1), np.full(B + 1, math.inf))
                to[u:] = np.minimum(to[u:], best[e.frm, i][:B + 1 - u] + e.cost[i])
    totals = np.full(B + 1, math.inf)
    for j in range(program.n):
        extra, cap = int(round(units["extra"][j])), min(B, int(ys.limit[j]))
        for st in (0, 1):
            if (C0 + st, j + 1) in best and extra <= cap:
                for m in range(extra, B + 1):
                    totals[m] = min(totals[m], best[C0 + st, j + 1][min(m, cap) - extra] + program.close_tail[st, j])
    return totals


def test_levels_past_the_first_rows_match_a_plain_sweep(tmp_path):
    # V2 windows, every candidate (32): three nodes a position, so passes reach up to 79 cells and the rows grow
    # past the 64 first allocated (rows added then must start empty, at inf, for chains through them to count).
    model, _ = random_case(tmp_path, 20, mode="FULL_AND_PIECEWISE", runner="v2", util=0.9)
    solve = setup(model, model.candidates)
    assert solve.program.kind == "window" and solve.exact_memory and solve.layers_exact
    ys = yardstick(solve, relabel(solve, "units"))
    per_pass = passes(solve, ys)
    assert max(levels.used for _, _, levels in per_pass) > 64  # the case is the one described
    for p, (totals, _, _) in zip(ys.passes, per_pass):
        want = reference_levels(solve, ys, p.label, p.per_graph)
        assert np.isfinite(want).any()
        np.testing.assert_allclose(totals, want, rtol=1e-12, err_msg=str(p))
    assert_levels_honest(model, solve, ys, per_pass)


def test_a_top_whose_window_would_not_fit_still_tops_without_its_full_graph(tmp_path):
    # By hand: V2, q = 2, the real pool (estimate off) against vLLM's 50 MiB unrequested. Odd candidates' windows
    # round up to even widths; every even width's FULL graph takes 60 MiB but 8's (2 MiB). Opening 11's window
    # (1 + 60 MiB) is past the budget, yet 11 may top a list with its window ungraphed (12 > 11): (11,) at 5 MiB
    # (its 5 MiB standalone graph), (7, 11) at 8 MiB (7's window 8 opened: 1 + 2, then 11: 1 + 4), the fastest.
    wl = handmade_workload(num_speculative_tokens=1, max_num_seqs=8, max_num_batched_tokens=16,
                           traffic={"requests": {"kind": "uniform", "min": 1, "max": 8}, "mixed_share": 0.3,
                                    "mixed_tokens": {"kind": "uniform", "min": 1, "max": 16}},
                           cudagraph_mode="FULL_AND_PIECEWISE", model_runner="v2", estimate_cudagraph_memory=False,
                           gpu_memory_utilization=0.95)
    path = handmade_profile(tmp_path, wl, list(range(1, 17)), total_memory_bytes=1000 * MIB,
                            weights_bytes=700 * MIB, activation_peak_bytes=50 * MIB, eager_ms=lambda w: 2.0 + 0.01 * w,
                            full_ms=lambda w: 0.5 + 0.01 * w, piecewise_ms=lambda w: 1.0 + 0.01 * w,
                            standalone_bytes=lambda w: 5 * MIB,
                            delta_bytes=lambda w: (2 if w == 8 else 60 if w % 2 == 0 else 1) * MIB, name="window11")
    model = CostModel.from_files(path, wl)
    solve = setup(model, [1, 7, 9, 11])
    assert solve.program.kind == "real" and solve.exact_memory and solve.layers_exact
    ys = yardstick(solve, relabel(solve, "units"))
    assert ys.B == 50
    per_pass = passes(solve, ys)
    totals = np.min(np.stack([t for t, _, _ in per_pass]), axis=0)
    np.testing.assert_allclose(totals, brute_levels(model, solve, ys), rtol=1e-9)
    assert [per_pass[0][1](m) for m in (5, 8, 50)] == [(11,), (7, 11), (7, 11)]
    assert_levels_honest(model, solve, ys, per_pass)
