"""The answer at production scale (issue 49): on dense synthetic profiles (every width 1..W, eager, FULL and PIECEWISE
rows, `tuner.workload.synthetic_profile`: made-up numbers, fixtures, never measurements) of issue 34's case (V2 n-gram,
64 requests x 25 tokens, 4 GiB of KV cache required) at W = 2048, 8192 and 16384, with dense traffic (mixed steps
spread over every width) and sparse traffic (a few widths), under vLLM 0.33 and 0.34: the list shipped is never
dominated (slower AND more memory) by another feasible row of the report, every list the search ships, tunes or
compacts is within the start-up budget, and the exact solver's row claims the optimum only with a proof."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tuner.decision.record import decide
from tuner.model.costmodel import CostModel
from tuner.report.startup import exact_row_label
from tuner.search.study import SearchConfig, compact_of, exact_solve, run_search
from tuner.workload.spec import load_workload
from tuner.workload.synthetic_profile import write_synthetic_profile

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "benchmarks/dense-ngram-v2.yaml"
TRAFFIC = {
    "dense": lambda w: {"requests": {"kind": "uniform", "min": 8, "max": 64}, "mixed_share": 0.05,
                        "mixed_tokens": {"kind": "uniform", "min": min(256, w // 8), "max": w}},
    "sparse": lambda w: {"requests": {"kind": "histogram", "counts": {8: 1, 32: 2, 64: 1}}, "mixed_share": 0.05,
                         "mixed_tokens": {"kind": "histogram", "counts": {w // 4: 1, w // 2: 2, w: 1}}},
}


def dense_case(tmp: Path, width: int, traffic: str, release: str, **budget: object) -> CostModel:
    """Issue 34's case at max_num_batched_tokens `width` under `release`, on its dense synthetic profile."""
    spec = yaml.safe_load(BASE.read_text())
    spec["serving"].update(max_num_batched_tokens=width, max_model_len=max(8192, width), vllm_version=release)
    spec["traffic"] = {**TRAFFIC[traffic](width), "mean_context_len": 2048}
    path = tmp / f"dense-{width}-{traffic}-{release}.yaml"
    path.write_text(yaml.safe_dump(spec))
    wl = load_workload(path)
    csv, _ = write_synthetic_profile(tmp, wl, dense=True, name=path.stem)
    return CostModel.from_files(csv, wl, **{"max_capture_s": 60.0, "max_graphs": 1024, **budget})


def decided(model: CostModel):
    result = run_search(model, SearchConfig(n_trials=12, progress=False, storage=""))
    compact_of(model, result)
    return decide(model, result)


def dominated_by(dec, name: str) -> list[str]:
    """The rows of the report that beat list `name` on both counts: faster and with less graph memory."""
    e = dec.table[name]
    return [other for other, x in dec.table.items() if other != name and x.feasible
            and x.expected_step_ms < e.expected_step_ms - 1e-12 and dec.counted(x) < dec.counted(e)]


def held_to_the_answer(dec) -> None:
    assert dominated_by(dec, "tuned") == [] and dominated_by(dec, "compact") == []
    assert dominated_by(dec, {"fastest": "tuned", "compact": "compact"}[dec.ship.name]) == []
    for name in ("tuned", "compact", "exact"):  # the start-up budget holds every list the search made
        e = dec.table[name]
        assert e.feasible and e.num_graphs <= 1024 and e.capture_s <= 60.0, (name, e.num_graphs, e.capture_s)
    if dec.exact.exact_memory:
        assert exact_row_label(dec) == "exact optimum (proven)"
    else:  # no claim of the optimum: the best found, and the bound proven on its gap
        assert exact_row_label(dec).startswith("exact solver's best") and "optimum (proven)" not in exact_row_label(dec)
        assert dec.exact.gap is not None and dec.exact.gap < 0.01


@pytest.fixture(scope="module")
def models_2k(tmp_path_factory):
    """Each traffic's and release's cost model at 2k widths (made once)."""
    tmp = tmp_path_factory.mktemp("dense")
    return {(traffic, release): dense_case(tmp, 2048, traffic, release)
            for traffic in TRAFFIC for release in ("0.33", "0.34")}


@pytest.fixture(scope="module")
def at_2k(models_2k):
    """Each traffic's and release's decision at 2k widths (made once: the tests below read them)."""
    return {key: decided(model) for key, model in models_2k.items()}


@pytest.mark.parametrize("release", ["0.33", "0.34"])
@pytest.mark.parametrize("traffic", ["dense", "sparse"])
def test_at_2k_widths_no_row_beats_the_shipped_list_and_the_budget_holds(at_2k, traffic, release):
    held_to_the_answer(at_2k[traffic, release])


@pytest.mark.slow
@pytest.mark.parametrize("width", [8192, 16384])
@pytest.mark.parametrize("release", ["0.33", "0.34"])
@pytest.mark.parametrize("traffic", ["dense", "sparse"])
def test_at_8k_and_16k_widths_no_row_beats_the_shipped_list(tmp_path, width, traffic, release):
    held_to_the_answer(decided(dense_case(tmp_path, width, traffic, release)))


def test_0_34_answers_as_well_as_0_33_on_the_dense_case(at_2k):
    # Issue 49: under 0.34 the shipped list took 61% of the default-to-ideal gap where 0.33's took 88%. Each release's
    # shipped list's share of its own gap, at 2k widths: 0.34's within a point of 0.33's, both a few graphs.
    shares = {}
    for release in ("0.33", "0.34"):
        dec = at_2k["dense", release]
        d, i, s = dec.default.expected_step_ms, dec.table["ideal"].expected_step_ms, dec.ship.evaluation
        shares[release] = (d - s.expected_step_ms) / (d - i)
        assert dec.ship.name == "compact" and s.num_graphs < 64
    assert shares["0.34"] >= shares["0.33"] - 0.01, shares


def test_at_the_memory_0_33_ships_0_34_answers_at_least_as_well(models_2k, at_2k):
    # The shipped lists are each release's compact choice (the least memory within 1% of the fastest), so they are
    # different trades; compared at the same memory, 0.34's solver (which counts the real pool) is held to be at least
    # as good: its fastest list within 0.33's shipped pool captures no less of the gap than 0.33's shipped list.
    model = models_2k["dense", "0.34"]
    old = at_2k["dense", "0.33"]
    pool = old.ship.evaluation.graph_memory_bytes
    e = exact_solve(model, memory_cap_bytes=pool).best
    assert e.feasible and e.graph_memory_bytes <= pool
    d, i = old.default.expected_step_ms, old.table["ideal"].expected_step_ms
    new = at_2k["dense", "0.34"]
    assert (d, i) == pytest.approx((new.default.expected_step_ms, new.table["ideal"].expected_step_ms))
    assert (d - e.expected_step_ms) / (d - i) >= (d - old.ship.evaluation.expected_step_ms) / (d - i)


@pytest.mark.slow  # half a minute of exact solves: kept out of the README's test command (under 15 min on 2 cores)
def test_the_start_up_budget_shapes_the_answer_and_a_proof_needs_it_not_to(tmp_path):
    # Without a budget the dense 0.34 case's fastest pair captures every width (hundreds of seconds), proven; under
    # a 20 s budget (400 graphs at 0.05 s) the answer captures at most that and states its bound; and the 0.33 solver,
    # whose program counts memory alone, holds the same budget.
    free = exact_solve(dense_case(tmp_path, 2048, "dense", "0.34", max_capture_s=None, max_graphs=None))
    assert free.exact_memory and free.best.capture_s > 60 and free.unproven == ()
    for release in ("0.34", "0.33"):
        model = dense_case(tmp_path, 2048, "dense", release, max_capture_s=20.0)
        r = exact_solve(model)
        assert r.best.feasible and r.best.capture_s <= 20.0 and not r.exact_memory
        assert any("start-up budget binds" in why for why in r.unproven)
        assert r.lower_bound_ms is not None and r.best.expected_step_ms - r.lower_bound_ms < 0.01 * r.lower_bound_ms
        assert r.best.expected_step_ms < model.evaluate(model.default_sizes).expected_step_ms
