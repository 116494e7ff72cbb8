"""The cost model's drafter: its vectorised pass latency equals vLLM's per-pass rules (tuner.engines.vllm.drafter), its
graphs count in the pool and vLLM's estimate, its weights in the non-KV memory and its KV layers in the KV cache."""

from __future__ import annotations

import os
import random
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/handmade_profiles.py (import-mode=importlib)
from handmade_profiles import MIB, handmade_profile, handmade_spec, handmade_workload  # noqa: E402

from tuner.model.costmodel import CostModel  # noqa: E402
from tuner.engines.vllm.drafter import drafter_passes  # noqa: E402

MIXED = {"requests": {"kind": "uniform", "min": 1, "max": 8}, "mixed_share": 0.3,
         "mixed_tokens": {"kind": "uniform", "min": 1, "max": 32}}


def drafter_model(tmp_path, method, *, runner="v2", mode="FULL_AND_PIECEWISE", spec=3, layers=1, **profile):
    wl = handmade_workload(num_speculative_tokens=spec, max_num_seqs=8, max_num_batched_tokens=48, traffic={
        **MIXED, "requests": {"kind": "uniform", "min": 1, "max": min(8, 48 // (spec + 1))}},
        cudagraph_mode=mode, model_runner=runner, speculative={"method": method, "drafter": {"num_layers": layers}})
    path = handmade_profile(tmp_path, wl, list(range(1, 57)), drafter_piecewise_ms=lambda w: 0.2 + 0.002 * w,
                            **profile)
    return CostModel.from_files(path, wl)


def by_rules(m: CostModel, sizes, num_tokens: int, uniform: bool, num_reqs: int | None = None) -> float:
    """The drafter's latency of one step, pass by pass from tuner.engines.vllm.drafter and the profile's drafter
    rows; `num_reqs`: the step's requests where known, else a decode step's T / q and a mixed step's
    min(max_num_seqs, ceil(T / q))."""
    d = m.drafter
    runs = m.runs_as(sizes)
    n = num_reqs or (num_tokens // m.q if uniform else min(m.serving.max_num_seqs, -(-num_tokens // m.q)))
    dispatch = m.engine.dispatcher(runs).dispatch(num_tokens, uniform_decode=uniform)
    passes = drafter_passes(d.method, runner=m.runner, num_requests=n, num_tokens=num_tokens, uniform_decode=uniform,
                            capture_sizes=list(runs), cudagraph_mode=m.cudagraph_mode,
                            num_speculative_tokens=d.k, max_num_seqs=m.serving.max_num_seqs,
                            target_padded_size=dispatch.padded_size or num_tokens)
    total = 0.0
    for p in passes:
        if p.role == "context":
            continue  # DFlash's context-KV precompute: not measured, not costed (a model note)
        if p.runtime_mode == "NONE":
            ms = float(d.eager_ms(p.num_tokens))
        else:
            ms = float(d.graph_ms(p.padded_size, p.runtime_mode))
        total += ms * p.repeats
    return total


def case_rng(method: str, runner: str, mode: str) -> random.Random:
    """The lists a case draws, seeded by crc32 of its names: hash() of a string is salted per process, so a failing
    list could never be drawn again."""
    return random.Random(zlib.crc32(f"{method}/{runner}/{mode}".encode()))


def test_the_drawn_lists_are_the_same_in_every_process():
    import subprocess

    code = ("import sys; sys.path.insert(0, 'tests'); from test_drafter_cost import case_rng; "
            "print(case_rng('eagle', 'v2', 'FULL').random())")
    repo = Path(__file__).resolve().parents[1]
    draws = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=repo,
                            env={**os.environ, "PYTHONHASHSEED": salt}).stdout for salt in ("1", "2")}
    assert len(draws) == 1 and float(draws.pop()) == case_rng("eagle", "v2", "FULL").random()


@pytest.mark.parametrize("method", ["eagle", "mtp", "dflash", "draft_model"])
@pytest.mark.parametrize("runner", ["v1", "v2"])
@pytest.mark.parametrize("mode", ["FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "PIECEWISE", "FULL"])
def test_vectorised_drafter_latency_matches_the_pass_rules(tmp_path, method, runner, mode):
    m = drafter_model(tmp_path, method, runner=runner, mode=mode, layers=2 if method == "dflash" else 1)
    rnd = case_rng(method, runner, mode)
    for _ in range(12):
        sizes = tuple(sorted(rnd.sample(range(1, 49), rnd.randint(1, 7))))
        if m.v1_rewrite:
            sizes = tuple(sorted({s for s in sizes if s % m.q == 0} | {m.q}))
        expected_ms = 0.0
        for st in m.steps:
            got = m._step_parts(m.runs_as(sizes), np.array([st.num_tokens]), np.array([st.uniform_decode]))[1][0]
            assert got == pytest.approx(by_rules(m, sizes, st.num_tokens, st.uniform_decode)), (sizes, st)
            expected_ms += st.probability * got
        assert m.expected_drafter_ms(sizes) == pytest.approx(expected_ms)  # the drafter's share of a step


def test_worked_example_drafter_graphs_enter_the_pool_after_the_target(tmp_path):
    # V2 EAGLE, K = 3, max_num_seqs 8: the prefill manager repeats the target's graph set, the decode manager adds
    # FULL graphs at the sizes <= 8; all after the target's, each at its delta in the pool and in V2's estimate.
    m = drafter_model(tmp_path, "eagle", drafter_delta_bytes=lambda w: 3 * MIB)
    sizes = (4, 8, 16)
    costs = m.graph_costs(sizes)
    owners = [g.owner for g in costs]
    assert owners == ["target"] * owners.count("target") + ["drafter"] * owners.count("drafter")
    drafter = [(g.mode, g.num_tokens) for g in costs if g.owner == "drafter"]
    assert drafter == [("PIECEWISE", 16), ("PIECEWISE", 8), ("PIECEWISE", 4), ("FULL", 16), ("FULL", 8),
                       ("FULL", 4), ("FULL", 8), ("FULL", 4)]
    e = m.evaluate(sizes)
    assert e.drafter_graph_bytes == 8 * 3 * MIB
    without = drafter_model(tmp_path / "none", "eagle", drafter_delta_bytes=lambda w: 0)
    assert e.graph_memory_bytes - without.evaluate(sizes).graph_memory_bytes == 8 * 3 * MIB
    assert e.graph_estimate_bytes - without.evaluate(sizes).graph_estimate_bytes == 8 * 3 * MIB  # V2: in full


def test_drafter_weights_and_kv_layers_by_hand(tmp_path):
    # The tiny preset: hidden 64, 4 heads, 2 KV heads, head_dim 16, intermediate 128, vocab 256, fp32.
    eagle = handmade_workload(num_speculative_tokens=3, speculative={"method": "eagle", "drafter": {"num_layers": 1}})
    per_layer = 64 * (4 + 2 * 2) * 16 + 4 * 16 * 64 + 3 * 64 * 128 + 2 * 64
    # One decoder layer and the final norm; embedding and LM head are the target's (not counted twice).
    assert eagle.drafter_weight_bytes() == (per_layer + 64) * 4
    assert eagle.drafter_kv_bytes_per_token() == 2 * 1 * 2 * 16 * 4
    assert eagle.kv_bytes_per_token() == eagle.model.kv_bytes_per_token() + 256
    plain = handmade_workload(num_speculative_tokens=3)
    m_eagle = CostModel.from_files(handmade_profile(tmp_path / "e", eagle, [1, 2, 4, 8]), eagle)
    m_plain = CostModel.from_files(handmade_profile(tmp_path / "p", plain, [1, 2, 4, 8]), plain)
    # The profile was measured without the drafter: its weights join the non-KV memory; the KV cache's tokens are
    # dearer by the drafter's layers.
    assert m_eagle.budget.non_kv_cache_bytes - m_plain.budget.non_kv_cache_bytes == (per_layer + 64) * 4
    assert m_eagle.kv_bytes_per_token - m_plain.kv_bytes_per_token == 256
    # vLLM's start check: a 64-token request's four 16-token blocks and the null block, of both models' layers.
    assert m_eagle.budget.required_kv_bytes == 5 * 16 * (m_plain.kv_bytes_per_token + 256)
    for method in ("ngram", "suffix"):
        free = handmade_workload(num_speculative_tokens=3, speculative={"method": method})
        m = CostModel.from_files(handmade_profile(tmp_path / method, free, [1, 2, 4, 8]), free)
        assert free.drafter is None and m.drafter is None
        assert m.budget.non_kv_cache_bytes == m_plain.budget.non_kv_cache_bytes
        assert m.kv_bytes_per_token == m_plain.kv_bytes_per_token


def test_a_profile_without_drafter_rows_is_refused(tmp_path):
    from tuner.model.costmodel import ModelError

    wl = handmade_workload(num_speculative_tokens=3, speculative={"method": "eagle"})
    plain = handmade_workload(num_speculative_tokens=3)
    path = handmade_profile(tmp_path, plain, [1, 2, 4, 8])  # no drafter rows
    with pytest.raises(ModelError, match="no drafter rows"):
        CostModel.from_files(path, wl)


def test_the_drafters_graphs_tip_a_width_over_the_budget(tmp_path):
    import math

    from tuner.search.exact import exact_solve

    # Target graphs take their width in MiB alone and nothing more in the shared pool (vLLM's estimate then charges
    # each FULL window after the first its 1 MiB floor); the DFlash drafter adds a 6 MiB FULL graph per decode
    # window (q = 4). With a 37 MiB estimate budget, a list topped by 32 fits only without the drafter's graphs:
    # (32,) alone is 32 + 6 = 38 MiB with them.
    wl = handmade_workload(num_speculative_tokens=3, max_num_seqs=8, max_num_batched_tokens=32,
                           speculative={"method": "dflash", "drafter": {"num_layers": 2}})
    budget = 37 * MIB
    weights = math.ceil(1000 * MIB * 0.9) - 50 * MIB - wl.required_kv_bytes - budget - wl.drafter_weight_bytes()
    path = handmade_profile(tmp_path, wl, [4, 8, 16, 24, 32], weights_bytes=weights,
                            standalone_bytes=lambda w: w * MIB, delta_bytes=lambda w: 0,
                            drafter_delta_bytes=lambda w: 6 * MIB, eager_ms=lambda w: 2.0 + 0.01 * w)
    m = CostModel.from_files(path, wl)
    assert m.budget.estimate_budget_bytes == budget
    assert m.evaluate((32,)).graph_estimate_bytes == 38 * MIB and not m.evaluate((32,)).feasible
    assert m.fits_without_drafter_graphs((32,))
    best = exact_solve(m).best
    assert best.feasible and best.capture_sizes[-1] == 24
    assert m.dropped_for_drafter(best) == [32]


def test_the_report_says_the_drafters_graphs_were_the_reason(tmp_path):
    import math

    from tuner.search.exact import exact_solve
    from tuner.decision.record import decide
    from tuner.report.run import render_markdown, summary
    from tuner.search.study import SearchResult

    wl = handmade_workload(num_speculative_tokens=3, max_num_seqs=8, max_num_batched_tokens=32,
                           speculative={"method": "dflash", "drafter": {"num_layers": 2}})
    weights = math.ceil(1000 * MIB * 0.9) - 50 * MIB - wl.required_kv_bytes - 37 * MIB - wl.drafter_weight_bytes()
    path = handmade_profile(tmp_path, wl, [4, 8, 16, 24, 32], weights_bytes=weights,
                            standalone_bytes=lambda w: w * MIB, delta_bytes=lambda w: 0,
                            drafter_delta_bytes=lambda w: 6 * MIB, eager_ms=lambda w: 2.0 + 0.01 * w)
    m = CostModel.from_files(path, wl)
    exact = exact_solve(m)
    search = SearchResult(exact.best, "exact", exact, None, m.evaluate(m.default_sizes), "none", "none", "latency")
    dec = decide(m, search)
    table = dec.table
    text = render_markdown(m, dec)
    assert "The drafter's graphs cost these widths**: adding 32" in text
    t = table["tuned"]
    assert f"its passes take {t.drafter_step_ms:.4f} ms" in text and t.drafter_step_ms > 0
    data = summary(m, dec)
    # DFlash captures a FULL graph per decode window of the target's: 6 MiB each.
    windows = [w for mode, w in m.graphs(t.capture_sizes) if mode == "FULL"]
    assert data["tuned"]["drafter_graph_bytes"] == t.drafter_graph_bytes == 6 * MIB * len(windows)


def test_a_v1_profile_needs_only_the_drafters_piecewise_rows(tmp_path):
    from tuner.model.costmodel import ModelError
    from tuner.profile.table import read_profile, write_profile

    # V1 captures the drafter's graphs PIECEWISE only: a profile measured that way has no drafter_full rows.
    m = drafter_model(tmp_path, "eagle", runner="v1")
    p = read_profile(m.profile.path)
    rows = [r for r in p.rows if r.mode != "drafter_full"]
    v1 = CostModel.from_files(write_profile(tmp_path / "v1", "v1", rows, p.metadata), m.workload)
    assert v1.evaluate((4, 8)).drafter_graph_bytes > 0
    # A V2 EAGLE drafter captures FULL graphs too: the same profile is refused there, with one line.
    wl2 = drafter_model(tmp_path / "v2", "eagle", runner="v2").workload
    with pytest.raises(ModelError, match="no drafter_full rows"):
        CostModel.from_files(write_profile(tmp_path / "v2p", "v2", rows, p.metadata), wl2)


@pytest.mark.parametrize("method", ["eagle", "dflash"])
def test_the_expected_step_adds_the_drafters_passes_to_the_targets_step(tmp_path, method):
    # Every step pays the target's step and the drafter's passes by the rules: the expected step is their weighted
    # sum, and the drafter's share is its part of it.
    m = drafter_model(tmp_path, method)
    sizes = m.runs_as([1, 2, 4, 8, 16, 32])
    drafter = sum(st.probability * by_rules(m, sizes, st.num_tokens, st.uniform_decode) for st in m.steps)
    target = sum(st.probability * m.step_latency_ms(st.num_tokens, st.uniform_decode, sizes, query_len=st.query_len,
                                                    num_reqs=st.num_reqs) for st in m.steps) - drafter
    assert drafter > 0.1
    assert m.expected_drafter_ms(sizes) == pytest.approx(drafter)
    assert m.expected_step_ms(sizes) == pytest.approx(target + drafter)
    assert m.evaluate(sizes).expected_step_ms == pytest.approx(target + drafter)


@pytest.mark.parametrize("method,runner", [("eagle", "v2"), ("eagle", "v1"), ("draft_model", "v2"), ("dflash", "v1")])
def test_a_traced_mixed_step_drafts_for_the_requests_its_trace_names(tmp_path, method, runner):
    # A 40-token prefill chunk of 2 requests drafts for 2: its passes are costed at N = 2 (by the rules), not at the
    # min(max_num_seqs, ceil(40 / q)) = 8 assumed where the trace leaves num_reqs empty.
    from tuner.workload.spec import parse_workload

    (tmp_path / "steps.csv").write_text("num_tokens,num_reqs,is_uniform_decode\n40,2,false\n40,,false\n"
                                        "36,1,false\n8,2,true\n")
    spec = handmade_spec(num_speculative_tokens=3, max_num_seqs=8, max_num_batched_tokens=48,
                         traffic={"trace": "steps.csv"}, cudagraph_mode="FULL_AND_PIECEWISE", model_runner=runner,
                         speculative={"method": method, "drafter": {"num_layers": 1}})
    wl = parse_workload(spec, base_dir=tmp_path)
    assert wl.traffic.trace == ((40, False, 2), (40, False, None), (36, False, 1), (8, True, 2))
    path = handmade_profile(tmp_path, wl, list(range(1, 57)), drafter_piecewise_ms=lambda w: 0.2 + 0.002 * w)
    m = CostModel.from_files(path, wl)
    sizes = m.runs_as([4, 8, 16, 32])
    steps = {(st.num_tokens, st.uniform_decode, st.num_reqs): st.probability for st in m.steps}
    assert steps == {(40, False, 2): 0.25, (40, False, None): 0.25, (36, False, 1): 0.25, (8, True, 2): 0.25}
    expected = sum(p * by_rules(m, sizes, t, u, n) for (t, u, n), p in steps.items())
    assert m.expected_drafter_ms(sizes) == pytest.approx(expected)
    # The requests matter: the same chunk at 2 requests and at the assumed 8 cost the drafter differently.
    assert by_rules(m, sizes, 40, False, 2) != pytest.approx(by_rules(m, sizes, 40, False))
    two = m.step_latency_ms(40, False, sizes, num_reqs=2) - m.step_latency_ms(40, False, sizes)
    assert two == pytest.approx(by_rules(m, sizes, 40, False, 2) - by_rules(m, sizes, 40, False))


def test_only_the_drafters_graphs_are_left_out_of_the_fit_without_them_and_only_infeasible_widths_count(tmp_path):
    import math

    # The worked case above, also with a 30 MiB estimate budget: (32,) does not fit even without the drafter's graphs
    # (32 MiB of target graph alone), (24,) does. Added to (4,), each wider width is faster; 8 and 16 fit with the
    # drafter's two 6 MiB graphs, so only the width that fits without them and not with them counts: 24 under 30 MiB
    # (24 + 1 + 12 = 37 MiB with them, 25 without), 32 under 37 MiB (45 with them, 33 without).
    wl = handmade_workload(num_speculative_tokens=3, max_num_seqs=8, max_num_batched_tokens=32,
                           speculative={"method": "dflash", "drafter": {"num_layers": 2}})
    for budget, fits_32, dropped in ((30 * MIB, False, [24]), (37 * MIB, True, [32])):
        weights = math.ceil(1000 * MIB * 0.9) - 50 * MIB - wl.required_kv_bytes - budget - wl.drafter_weight_bytes()
        path = handmade_profile(tmp_path / str(budget), wl, [4, 8, 16, 24, 32], weights_bytes=weights,
                                standalone_bytes=lambda w: w * MIB, delta_bytes=lambda w: 0,
                                drafter_delta_bytes=lambda w: 6 * MIB, eager_ms=lambda w: 2.0 + 0.01 * w)
        m = CostModel.from_files(path, wl)
        assert m.fits_without_drafter_graphs((32,)) is fits_32 and m.fits_without_drafter_graphs((24,))
        assert m.dropped_for_drafter(m.evaluate((4,))) == dropped


def test_a_profile_measured_without_the_drafter_adds_its_weights_to_the_non_kv_memory(tmp_path):
    import json

    wl = handmade_workload(num_speculative_tokens=3, max_num_seqs=8, max_num_batched_tokens=32,
                           speculative={"method": "dflash", "drafter": {"num_layers": 2}})
    path = handmade_profile(tmp_path, wl, [4, 8, 16, 24, 32], weights_bytes=100 * MIB, activation_peak_bytes=50 * MIB)
    without = CostModel.from_files(path, wl)
    assert without.budget.non_kv_cache_bytes == 150 * MIB + wl.drafter_weight_bytes() > 150 * MIB
    assert any(n.startswith("hand.csv was measured without the drafter: its weights") for n in without.notes)
    meta = json.loads(path.with_suffix(".json").read_text())
    meta["drafter"] = {"method": "dflash"}  # measured with it loaded: its weights are in the readings already
    path.with_suffix(".json").write_text(json.dumps(meta))
    measured = CostModel.from_files(path, wl)
    assert measured.budget.non_kv_cache_bytes == 150 * MIB
    assert not any("measured without the drafter" in n for n in measured.notes)
