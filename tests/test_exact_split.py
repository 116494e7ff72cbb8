"""The exact solver for vLLM 0.34's two lists (`tuner.search.exact_split`) held to brute force over every subset of
random candidates (decode request sizes and prefill token sizes together), on hand-made profiles whose graphs
leave only some lists room: every cudagraph mode, q from 1 to 4, memory figures that round or not, standalone
footprints that grow with width or not, and the Lagrangian path. Test fixtures, never measurements."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/ helpers (import-mode=importlib)
from handmade_profiles import MIB, handmade_profile, handmade_workload  # noqa: E402

from tuner.model.costmodel import CostModel  # noqa: E402
from tuner.search import exact_split  # noqa: E402
from tuner.search.exact import brute_force, exact_solve  # noqa: E402

MODES = ("FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "PIECEWISE", "FULL")
GIB = 1 << 30


def split_case(tmp_path: Path, seed: int, *, mode: str | None = None, monotone: bool | None = None,
               whole_mib: bool = True) -> tuple[CostModel, list[int]]:
    """A 0.34 workload (max_num_seqs 8, 32 tokens a step, mixed and decode steps) on a 4 GiB device whose weights leave
    8..36 MiB of real pool for graphs beside the required KV cache (its granule-rounded segments) and vLLM 0.34's 1 GiB
    margin; random latencies and
    memory (whole MiB, or not), and ten random candidate keys of both lists."""
    rnd = random.Random(seed)
    spec = rnd.choice([0, 1, 3])
    q = spec + 1
    mode = mode or (MODES[0] if seed % 2 == 0 else MODES[1 + (seed // 2) % 3])  # half of them both lists
    wl = handmade_workload(num_speculative_tokens=spec, max_num_seqs=8, max_num_batched_tokens=32,
                           traffic={"requests": {"kind": "uniform", "min": 1, "max": min(8, 32 // q)},
                                    "mixed_share": 0.3, "mixed_tokens": {"kind": "uniform", "min": 1, "max": 32}},
                           cudagraph_mode=mode, vllm_version="0.34", gpu_memory_utilization=1.0)
    widths = list(range(1, 33))
    e = {w: rnd.uniform(1, 3) for w in widths}
    f = {w: e[w] * rnd.uniform(0.3, 1.1) for w in widths}
    pw = {w: e[w] * rnd.uniform(0.5, 1.1) for w in widths}
    monotone = rnd.random() < 0.6 if monotone is None else monotone
    de = {w: rnd.choice([0, 1, 1, 2, 3, 5]) for w in widths}
    if monotone:  # the widest graph holds the most activations (standalone less delta grows with width)
        sa = {w: de[w] + 2 + w // 3 for w in widths}
    else:
        sa = {w: de[w] + rnd.randint(0, 10) for w in widths}
    unit = MIB if whole_mib else MIB + 4097
    activation = 50 * MIB
    total = 4 * GIB
    # the rest: the required KV; vLLM 0.34 maps its five blocks (40 KiB) in one 2 MiB granule per layer segment (two)
    weights = total - GIB - activation - rnd.randint(8, 36) * MIB - 64 * 16 * 1024 - (2 * 2 * MIB - 40 * 1024)
    path = handmade_profile(tmp_path, wl, widths, total_memory_bytes=total, weights_bytes=weights,
                            activation_peak_bytes=activation, eager_ms=e.get, full_ms=f.get,
                            piecewise_ms=pw.get if seed % 3 else None, standalone_bytes=lambda w: sa[w] * unit,
                            delta_bytes=lambda w: de[w] * unit, name=f"split{seed}")
    model = CostModel.from_files(path, wl)
    decode = [k for k in model.candidates if k < 0]
    prefill = [k for k in model.candidates if k > 0]
    n_decode = min(len(decode), 4 if prefill else 10)
    picked = rnd.sample(decode, n_decode) + rnd.sample(prefill, min(len(prefill), 10 - n_decode))
    return model, sorted(picked)


def test_the_cases_bind_memory_and_mix_both_lists(tmp_path):
    # The comparison below means something only if memory keeps the fastest list of everything out, and the optimum
    # holds both lists where the mode captures both.
    both = bound = 0
    for seed in range(24):
        m, cands = split_case(tmp_path / str(seed), seed)
        assert m.engine.version == "0.34" and m.budget.margin_bytes == GIB
        best = brute_force(m, cands)
        everything = m.evaluate(cands)
        bound += not everything.feasible
        both += any(k < 0 for k in best.capture_sizes) and any(k > 0 for k in best.capture_sizes)
    assert bound >= 8 and both >= 5, (bound, both)


@pytest.mark.parametrize("seed", range(24))
def test_the_answer_is_brute_forces_and_proven(tmp_path, seed):
    m, cands = split_case(tmp_path, seed)
    exact = exact_solve(m, candidates=cands)
    brute = brute_force(m, cands)
    assert exact.best.feasible
    assert exact.lower_bound_ms <= brute.expected_step_ms + 1e-12
    if exact.exact_memory:
        assert exact.best.expected_step_ms == pytest.approx(brute.expected_step_ms, abs=1e-12)
        assert exact.lower_bound_ms == pytest.approx(brute.expected_step_ms, abs=1e-12)
    else:  # only where the widest activations may sit below a list's top: the answer is then bounded, and said so
        assert exact.unproven == (exact_split._WIDEST,)
        assert brute.expected_step_ms - 1e-12 <= exact.best.expected_step_ms <= brute.expected_step_ms * 1.05


def test_every_case_whose_footprints_grow_with_width_is_proven(tmp_path):
    proven = [exact_solve(*_args(split_case(tmp_path / str(s), s, monotone=True))).exact_memory for s in range(12)]
    assert all(proven)


def _args(case: tuple[CostModel, list[int]]) -> tuple[CostModel]:
    m, cands = case
    m.candidates = cands  # the solver's default candidates: the case's
    return (m,)


@pytest.mark.parametrize("seed", range(6))
def test_figures_that_do_not_divide_into_units_still_give_the_optimum_or_a_bound_below_it(tmp_path, seed):
    m, cands = split_case(tmp_path, seed, whole_mib=False)
    exact = exact_split.split_solve(m, candidates=cands, memory_buckets=64)
    brute = brute_force(m, cands)
    assert exact.best.feasible and exact.best.expected_step_ms >= brute.expected_step_ms - 1e-12
    assert exact.lower_bound_ms is not None and exact.lower_bound_ms <= brute.expected_step_ms + 1e-12
    if exact.exact_memory:
        assert exact.best.expected_step_ms == pytest.approx(brute.expected_step_ms, abs=1e-12)
    else:
        assert any(why.startswith("memory figures rounded") for why in exact.unproven)


@pytest.mark.parametrize("seed", range(6))
def test_the_lagrangian_path_fits_and_bounds_the_optimum_from_below(tmp_path, seed, monkeypatch):
    monkeypatch.setattr(exact_split, "EXACT_WORK", 0)  # every case too big for the program over units
    m, cands = split_case(tmp_path, seed)
    exact = exact_split.split_solve(m, candidates=cands)
    brute = brute_force(m, cands)
    assert exact.best.feasible and exact.best.expected_step_ms >= brute.expected_step_ms - 1e-12
    assert exact.lower_bound_ms is not None and exact.lower_bound_ms <= brute.expected_step_ms + 1e-12
    if not exact.exact_memory:
        assert exact_split.LAGRANGIAN in exact.unproven
    else:  # proven only where its bound meets the answer
        assert exact.best.expected_step_ms == pytest.approx(brute.expected_step_ms, abs=1e-12)


def test_a_cap_keeps_the_answer_under_it_and_keep_lists_the_least_memory_within_a_latency(tmp_path):
    m, cands = split_case(tmp_path, 0, mode="FULL_AND_PIECEWISE", monotone=True)
    free = exact_solve(m, candidates=cands)
    cap = free.best.graph_memory_bytes // 2
    capped = exact_solve(m, candidates=cands, memory_cap_bytes=cap)
    assert capped.best.graph_memory_bytes <= cap
    subsets = [m.evaluate(s) for s in _subsets(cands)]
    under = [e for e in subsets if e.feasible and e.graph_memory_bytes <= cap]
    assert capped.best.expected_step_ms == pytest.approx(min(e.expected_step_ms for e in under), abs=1e-12)
    within = free.best.expected_step_ms * 1.05
    kept = exact_solve(m, candidates=cands, keep_within_ms=within).kept
    least = min(e.graph_memory_bytes for e in subsets if e.feasible and e.expected_step_ms <= within + 1e-12)
    assert kept and min(e.graph_memory_bytes for e in kept) == least


def test_the_pool_holds_the_widest_activations_once_whichever_list_holds_them(tmp_path):
    # By hand: standalone 2 + w // 3 MiB, delta from the fixture. Decode 2 requests at q 4 (8 tokens) and a prefill
    # size of 4: the decode graph's activations (2 + 8 // 3 = 4 MiB) are the widest, though PIECEWISE is captured
    # first; the pool is its standalone plus the prefill graph's delta.
    m, _ = split_case(tmp_path, 5, mode="FULL_AND_PIECEWISE", monotone=True)
    assert m.q == 4  # seed 5 draws 3 speculative tokens
    costs = m.graph_costs((-2, 4))
    assert [(g.mode, g.num_tokens) for g in costs] == [("PIECEWISE", 4), ("FULL", 8)]
    full, piece = costs[1], costs[0]
    assert m.evaluate((-2, 4)).graph_memory_bytes == full.standalone_bytes + piece.delta_bytes


def _subsets(cands: list[int]) -> list[tuple[int, ...]]:
    from itertools import combinations

    return [c for r in range(len(cands) + 1) for c in combinations(cands, r)]


def drafter_case(tmp_path: Path, seed: int, method: str) -> tuple[CostModel, list[int]]:
    """`split_case` with a model-based drafter (DFlash, or EAGLE drafting K tokens one at a time) and drafter rows:
    its passes cost a share of the target's and its graphs a delta of their own."""
    rnd = random.Random(1000 + seed)
    k = rnd.choice([1, 3]) if method == "dflash" else 3
    wl = handmade_workload(num_speculative_tokens=k, max_num_seqs=8, max_num_batched_tokens=32,
                           traffic={"requests": {"kind": "uniform", "min": 1, "max": min(8, 32 // (k + 1))},
                                    "mixed_share": 0.3, "mixed_tokens": {"kind": "uniform", "min": 1, "max": 32}},
                           vllm_version="0.34", gpu_memory_utilization=1.0,
                           speculative={"method": method, "drafter": {"num_layers": 1}})
    widths = list(range(1, 33))
    e = {w: rnd.uniform(1, 3) for w in widths}
    de = {w: rnd.choice([0, 1, 1, 2]) for w in widths}
    total = 4 * GIB
    weights = total - GIB - 50 * MIB - rnd.randint(12, 48) * MIB - 64 * 16 * 1024
    path = handmade_profile(tmp_path, wl, widths, total_memory_bytes=total, weights_bytes=weights,
                            activation_peak_bytes=50 * MIB, eager_ms=e.get, full_ms=lambda w: e[w] * 0.6,
                            piecewise_ms=lambda w: e[w] * 0.8, standalone_bytes=lambda w: (de[w] + 4 + w // 3) * MIB,
                            delta_bytes=lambda w: de[w] * MIB,
                            drafter_eager_ms=lambda w: 0.2 + 0.01 * w + rnd.random() * 0.0,
                            drafter_full_ms=lambda w: 0.05 + 0.004 * w, drafter_piecewise_ms=lambda w: 0.1 + 0.006 * w,
                            drafter_standalone_bytes=lambda w: MIB + (w // 16) * MIB,
                            drafter_delta_bytes=lambda w: MIB if w % 3 else 2 * MIB, name=f"dr{seed}")
    model = CostModel.from_files(path, wl)
    decode = [c for c in model.candidates if c < 0]
    prefill = [c for c in model.candidates if c > 0]
    n_decode = min(len(decode), 4)
    return model, sorted(rnd.sample(decode, n_decode) + rnd.sample(prefill, min(len(prefill), 10 - n_decode)))


@pytest.mark.parametrize("method", ["dflash", "eagle"])
@pytest.mark.parametrize("seed", range(6))
def test_a_drafters_passes_and_graphs_are_in_the_program(tmp_path, seed, method):
    # vLLM 0.34's drafter adds per member (DFlash's query passes on the decode sizes' graphs; EAGLE's step 0 on the
    # graph its target step replays, and its later one-token graphs with any decode list): the program follows it.
    m, cands = drafter_case(tmp_path, seed, method)
    assert m.drafter is not None and m.drafter.method == method
    exact = exact_solve(m, candidates=cands)
    brute = brute_force(m, cands)
    assert exact.best.feasible
    assert exact.exact_memory, exact.unproven
    assert exact.best.expected_step_ms == pytest.approx(brute.expected_step_ms, abs=1e-12)


def test_the_drafter_cases_bind_memory_and_the_drafter_moves_the_answer(tmp_path):
    # Not trivial: memory keeps every candidate out somewhere, and the drafter's costs change some answer against the
    # same case without them (its passes and graphs matter to the choice).
    bound = moved = 0
    for seed in range(6):
        for method in ("dflash", "eagle"):
            m, cands = drafter_case(tmp_path / f"{method}{seed}", seed, method)
            bound += not m.evaluate(cands).feasible
            best = brute_force(m, cands).capture_sizes
            m.drafter = None
            moved += brute_force(m, cands).capture_sizes != best
    assert bound >= 3 and moved >= 2, (bound, moved)
