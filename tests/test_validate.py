"""CPU tests of `cgtune validate`: the seeded trace, per-step dispatch accounting, the comparison and report logic on
scripted numbers (test fixtures, never measurements), the error paths, and an eager CPU replay with real timings."""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/handmade_profiles.py (import-mode=importlib)
from handmade_profiles import MIB, handmade_profile, handmade_workload  # noqa: E402

from tuner.cli import main  # noqa: E402
from tuner.model.costmodel import GIB, CostModel  # noqa: E402
from tuner.decision.record import decide  # noqa: E402
from tuner.report.run import write_run  # noqa: E402
from tuner.search.study import SearchResult, exact_solve  # noqa: E402
from tuner.validate.validation import (  # noqa: E402
    PARTIAL_FILE,
    VALIDATION_FILE,
    ValidationError,
    build_record,
    choose_measured,
    compare_list,
    lists_to_validate,
    top_candidates,
    validate_lists,
    validate_run,
)
from tuner.validate.backend import CaptureResult  # noqa: E402
from tuner.validate.trace import (  # noqa: E402
    PlannedStep,
    dispatch_counts,
    plan_trace,
    predicted_trace_step_ms,
    sample_trace,
    step_statistics,
)
from tuner.report.validation import BEGIN, END, update_report  # noqa: E402

FIXTURE_DEVICE = "scripted test fixture (not a measurement)"
MIXED_TRAFFIC = {"requests": {"kind": "uniform", "min": 1, "max": 12}, "mixed_share": 0.2,
                 "mixed_tokens": {"kind": "uniform", "min": 1, "max": 32}}


def _model(tmp_path: Path, **profile_kwargs: object) -> CostModel:
    wl = handmade_workload(num_speculative_tokens=1, max_num_seqs=12, max_num_batched_tokens=32, traffic=MIXED_TRAFFIC)
    path = handmade_profile(tmp_path / "profile", wl, list(range(1, 33)), standalone_bytes=lambda w: 2 * w * MIB,
                            **profile_kwargs)
    return CostModel.from_files(path, wl)


def _search(model: CostModel, ship: str = "fastest") -> SearchResult:
    """A search result from the exact solver alone (no optuna study needed for these tests), shipping the fastest
    list unless `ship` says otherwise (this workload's compact list is recommended: `auto` ships it)."""
    exact = exact_solve(model)
    return SearchResult(chosen=exact.best, source="exact", exact=exact, study_best=None,
                        default=model.evaluate(model.default_sizes), study_name="test-study", storage="none",
                        objective="latency", trials={}, pareto=exact.front, notes=[], ship=ship)


def _run_dir(tmp_path: Path, *, ship: str = "fastest", **profile_kwargs: object
             ) -> tuple[Path, CostModel, SearchResult]:
    model = _model(tmp_path, **profile_kwargs)
    search = _search(model, ship)
    run = tmp_path / "run"
    write_run(run, model, decide(model, search), command="pytest", plots=False)
    return run, model, search


@pytest.fixture
def one_thread():
    """Tiny matrices on a shared 2-core CI machine: extra torch threads only contend (30x slower steps)."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class ScriptedBackend:
    """Test fixture: capture results and step timings are scripted, not measured. Each step 'takes' the model's
    prediction times `latency_factor`; the pool 'takes' the prediction times `memory_factor`. Derived from the
    predictions, so it tests plumbing (the fit check, the fallback, the files), never the comparison itself: for that,
    DeviceScript."""

    device_name = FIXTURE_DEVICE
    graphs_supported = True
    max_num_tokens: int | None = None

    def __init__(self, model: CostModel, memory_factor: dict[int, float] | float = 1.0,
                 latency_factor: dict[int, float] | float = 1.0, oom_above: int | None = None) -> None:
        self.model = model
        self.memory_factor = memory_factor
        self.latency_factor = latency_factor
        self.oom_above = oom_above
        self.captured: list[list[tuple[str, int]]] = []
        self.released = 0

    def metadata(self) -> dict[str, object]:
        return {"device_name": FIXTURE_DEVICE}

    def capture(self, graphs):
        self.captured.append(list(graphs))
        widths = [w for _, w in graphs]
        if self.oom_above is not None and widths and max(widths) > self.oom_above:
            return CaptureResult(None, oom="scripted: CUDA out of memory")
        sizes = sorted({w for _, w in graphs})
        predicted = self.model.graph_memory_bytes(sizes) if graphs else 0
        factor = self.memory_factor if isinstance(self.memory_factor, float) else \
            self.memory_factor.get(max(widths) if widths else 0, 1.0)
        return CaptureResult(int(predicted * factor), graphs=len(graphs))

    def time_steps(self, plan):
        top = max((w for _, w in self.captured[-1]), default=0)
        factor = self.latency_factor if isinstance(self.latency_factor, float) else self.latency_factor.get(top, 1.0)
        return [ms * factor for ms in predicted_trace_step_ms(self.model, plan)]

    def release(self):
        self.released += 1
        return 0


class DeviceScript:
    """Test fixture: a device whose numbers owe nothing to the cost model. Each list has its own pool and its own step
    law, step_ms = offset_ms + ms_per_token x the step's real tokens, so means, quantiles, tokens/s and speedups
    follow by hand from the trace's tokens. Scripted, not measured."""

    device_name = FIXTURE_DEVICE
    graphs_supported = True
    max_num_tokens: int | None = None

    def __init__(self, model: CostModel, lists: dict[tuple[int, ...], tuple[int, float, float]],
                 otherwise: tuple[int, float, float] | None = None) -> None:
        """`lists`: capture sizes -> (pool bytes, offset_ms, ms_per_token); `otherwise`: for any other list."""
        self.by_graphs = {tuple(model.graphs(sizes)): script for sizes, script in lists.items()}
        self.otherwise = otherwise
        self.current: tuple[int, float, float] | None = None
        self.captured: list[list[tuple[str, int]]] = []

    def metadata(self) -> dict[str, object]:
        return {"device_name": FIXTURE_DEVICE}

    def capture(self, graphs):
        self.captured.append(list(graphs))
        self.current = self.by_graphs.get(tuple(graphs), self.otherwise)
        assert self.current is not None, f"no script for the list of {graphs}"
        return CaptureResult(self.current[0], graphs=len(graphs))

    def time_steps(self, plan):
        _, offset_ms, ms_per_token = self.current
        return [offset_ms + ms_per_token * p.num_tokens for p in plan]

    def release(self):
        return 0


def _law(offset_ms: float, ms_per_token: float, tokens: list[int]) -> dict[str, float]:
    """What DeviceScript's law gives over a trace's tokens, by hand: the mean, and the quantiles of the tokens mapped
    through the law (an increasing affine map commutes with a linear-interpolation quantile)."""
    mean_tokens = sum(tokens) / len(tokens)
    mean_ms = offset_ms + ms_per_token * mean_tokens
    return {"measured_step_ms": mean_ms,
            "p50_step_ms": offset_ms + ms_per_token * float(np.percentile(tokens, 50)),
            "p99_step_ms": offset_ms + ms_per_token * float(np.percentile(tokens, 99)),
            "tokens_per_s": mean_tokens / mean_ms * 1e3}


def _table(section: str) -> dict[str, list[str]]:
    """The validation section's table, row by row: list name -> its cells (from a section or a whole report.md)."""
    lines = section[section.index(BEGIN):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| list |")) + 2
    rows = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells
    return rows


def _flag(error: float, goal: float) -> str:
    return " **(!)**" if abs(error) > goal else ""


# ---------------------------------------------------------------------------------------------- trace
def _chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X ~ chi-square(df): the regularized upper incomplete gamma Q(df/2, x/2), by its power series
    below a + 1 and Lentz's continued fraction above (Numerical Recipes 6.2), so the test needs no scipy."""
    a, z = df / 2, x / 2
    if z <= 0:
        return 1.0
    log_prefix = a * math.log(z) - z - math.lgamma(a)
    if z < a + 1:
        term = total = 1 / a
        n = a
        while abs(term) > abs(total) * 1e-16:
            n += 1
            term *= z / n
            total += term
        return 1 - total * math.exp(log_prefix)
    tiny = 1e-300
    b = z + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 100_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        h *= d * c
        if abs(d * c - 1) < 1e-16:
            break
    return math.exp(log_prefix) * h


def test_chi2_tail_matches_its_closed_forms():
    # df 2: exp(-x/2); df 1: erfc(sqrt(x/2)); df 4: exp(-x/2) (1 + x/2); both branches (x/2 below and above a + 1).
    for x in (0.1, 1.0, 3.0, 10.0, 40.0):
        assert _chi2_sf(x, 2) == pytest.approx(math.exp(-x / 2), rel=1e-12)
        assert _chi2_sf(x, 1) == pytest.approx(math.erfc(math.sqrt(x / 2)), rel=1e-10)
        assert _chi2_sf(x, 4) == pytest.approx(math.exp(-x / 2) * (1 + x / 2), rel=1e-12)
    # The 99.9% point of chi-square with 10 degrees of freedom is 29.588 (standard tables).
    assert _chi2_sf(29.588, 10) == pytest.approx(0.001, rel=1e-3)


def test_trace_is_seeded_and_follows_the_step_distribution(tmp_path):
    model = _model(tmp_path)
    steps = model.workload.steps()
    trace = sample_trace(steps, 6000, seed=7)
    assert trace == sample_trace(steps, 6000, seed=7)
    assert trace != sample_trace(steps, 6000, seed=8)
    counts = Counter((s.num_tokens, s.uniform_decode) for s in trace)
    # Pearson chi-square against the workload's probabilities; 0.1% level, so a correct sampler fails 1 run in 1000
    # (and the seed is fixed, so this one never flakes).
    stat = sum((counts.get((s.num_tokens, s.uniform_decode), 0) - 6000 * s.probability) ** 2
               / (6000 * s.probability) for s in steps)
    assert _chi2_sf(stat, len(steps) - 1) > 0.001
    uniform_share = sum(s.uniform_decode for s in trace) / len(trace)
    assert abs(uniform_share - 0.8) < 0.03  # mixed_share 0.2
    with pytest.raises(ValueError, match="num_steps"):
        sample_trace(steps, 0, seed=0)


def test_every_step_is_dispatched_as_vllm_would(tmp_path):
    model = _model(tmp_path)
    trace = sample_trace(model.workload.steps(), 2000, seed=0)
    for sizes in (model.default_sizes, (4, 12), (1, 2, 3, 24)):
        dispatcher = model.engine.dispatcher(sizes)
        plan = plan_trace(trace, dispatcher)
        assert len(plan) == len(trace)
        for step, p in zip(trace, plan):
            d = dispatcher.dispatch(step.num_tokens, uniform_decode=step.uniform_decode)
            assert (p.num_tokens, p.uniform_decode, p.runtime_mode, p.padded_size) == \
                (step.num_tokens, step.uniform_decode, d.runtime_mode, d.padded_size)
            assert p.run_width == (d.padded_size or step.num_tokens) >= step.num_tokens
        counts = dispatch_counts(plan)
        assert counts["FULL"] + counts["PIECEWISE"] + counts["NONE"] == len(trace)
        assert counts["tokens"] == sum(s.num_tokens for s in trace)
        assert counts["padding_tokens"] == sum(p.run_width - p.num_tokens for p in plan)
        # Each planned step is costed exactly as the model costs that step.
        predicted = predicted_trace_step_ms(model, plan)
        for step, ms in list(zip(trace, predicted))[:200]:
            assert ms == pytest.approx(model.step_latency_ms(step.num_tokens, step.uniform_decode, sizes))
        # Over many steps the trace's predicted mean approaches the model's expectation.
        assert sum(predicted) / len(predicted) == pytest.approx(model.expected_step_ms(sizes), rel=0.02)


def test_dispatch_counts_by_hand():
    plan = [PlannedStep(3, True, "FULL", 4), PlannedStep(5, False, "PIECEWISE", 8),
            PlannedStep(40, False, "NONE", None)]
    assert dispatch_counts(plan) == {"FULL": 1, "PIECEWISE": 1, "NONE": 1, "tokens": 48, "padding_tokens": 4}


# ---------------------------------------------------------------------------------------------- comparison
def test_statistics_on_scripted_timings():
    plan = [PlannedStep(10, True, "FULL", 10)] * 100
    samples = [1.0] * 98 + [5.0, 9.0]  # test fixture numbers
    s = step_statistics(samples, plan)
    assert s["measured_step_ms"] == pytest.approx(1.12)
    assert s["p50_step_ms"] == 1.0
    assert 5.0 < s["p99_step_ms"] < 9.0
    assert s["tokens_per_s"] == pytest.approx(1000 * 10 / 1.12)
    with pytest.raises(ValueError):
        step_statistics(samples[:-1], plan)


def test_compare_list_errors_fit_and_loud_warning(tmp_path):
    model = _model(tmp_path)
    e = model.evaluate((1, 2, 4, 8, 16))
    plan = plan_trace(sample_trace(model.workload.steps(), 500, seed=1), model.engine.dispatcher(e.capture_sizes))
    predicted = predicted_trace_step_ms(model, plan)
    samples = [ms * 1.02 for ms in predicted]  # fixture: 2% slower than predicted

    ok = compare_list(model, "tuned", e, plan, samples, CaptureResult(int(e.graph_memory_bytes * 1.04)))
    assert ok.memory_error == pytest.approx(1 / 1.04 - 1, abs=1e-6)
    assert ok.latency_error == pytest.approx(1 / 1.02 - 1)
    assert ok.fits and not ok.warnings
    b = model.budget
    # vLLM sizes the KV cache from its estimate (not measured here: the predicted one); the measured pool must fit
    # beside it.
    assert ok.kv_available_bytes == b.kv_available_bytes(e.graph_estimate_bytes)
    assert ok.capture_headroom_bytes == b.capture_headroom_bytes(e.graph_estimate_bytes,
                                                                 int(e.graph_memory_bytes * 1.04))
    assert sum(g["steps"] for g in ok.by_graph) == len(plan)

    over = compare_list(model, "tuned", e, plan, samples, CaptureResult(int(e.graph_memory_bytes * 1.5)))
    assert any("EXCEEDS THE PREDICTION" in w for w in over.warnings)
    # Beyond the margin the fit check charges a safety margin on top of the measured pool.
    assert over.capture_headroom_bytes == b.capture_headroom_bytes(
        e.graph_estimate_bytes, int(int(e.graph_memory_bytes * 1.5) * 1.05))

    huge = e.graph_estimate_bytes + b.slack_bytes + MIB  # more than vLLM left beside its KV cache
    no_fit = compare_list(model, "tuned", e, plan, samples, CaptureResult(huge))
    assert not no_fit.fits and no_fit.capture_headroom_bytes < 0
    charged = int(huge * 1.05)  # over the prediction by more than the margin: 5% on top
    assert (f"tuned: the measured pool ({charged / GIB:.3f} GiB) exceeds vLLM's estimate plus the memory it does not "
            f"request by {(charged - huge + MIB) / GIB:.3f} GiB: the capture would run out of memory; this list is "
            f"never emitted") in no_fit.warnings

    # vLLM's estimate measured on the device: the KV check uses it, and its error against the prediction is kept.
    big_estimate = b.estimate_budget_bytes + MIB
    refused = compare_list(model, "tuned", e, plan, samples, CaptureResult(e.graph_memory_bytes),
                           measured_estimate_bytes=big_estimate)
    assert refused.kv_available_bytes == b.kv_available_bytes(big_estimate) < b.required_kv_bytes
    kv = b.kv_available_bytes(big_estimate)
    assert not refused.fits and (
        f"tuned: vLLM's graph-memory estimate ({big_estimate / GIB:.3f} GiB) leaves a KV cache of {kv / GIB:.2f} GiB "
        f"< required {b.required_kv_bytes / GIB:.2f} GiB: vLLM would refuse to start; this list is never emitted"
    ) in refused.warnings
    assert refused.estimate_error == pytest.approx(e.graph_estimate_bytes / big_estimate - 1)
    assert (f"tuned: predicted vLLM estimate {e.graph_estimate_bytes / GIB:.3f} GiB is "
            f"{e.graph_estimate_bytes / big_estimate - 1:+.1%} off the measured {big_estimate / GIB:.3f} GiB (goal 5%)"
            ) in refused.warnings

    oom = compare_list(model, "tuned", e, plan, [], CaptureResult(None, oom="scripted OOM"))
    assert not oom.fits and math.isnan(oom.measured_step_ms) and "out of memory" in oom.warnings[0]


def test_choose_measured_picks_fastest_that_fits(tmp_path):
    model = _model(tmp_path)
    lists = {"default": model.evaluate(model.default_sizes), "tuned": model.evaluate((1, 2, 4, 8, 12, 16, 24)),
             "exact": model.evaluate(tuple(range(1, 25)))}
    # Fixture: the widest list 'measures' more than vLLM's estimate plus the memory it does not request.
    e = lists["exact"]
    too_much = (e.graph_estimate_bytes + model.budget.slack_bytes + MIB) / e.graph_memory_bytes
    backend = ScriptedBackend(model, memory_factor={24: too_much})
    trace, results, info = validate_lists(model, lists, backend, num_steps=300, seed=0)
    assert info == {"sampled": 300, "replayed": 300, "excluded": 0, "max_num_tokens": None}
    assert len(trace) == 300 and backend.released == 3
    assert [g for g in backend.captured[1]] == model.graphs(lists["tuned"].capture_sizes)  # vLLM's order
    assert not results["exact"].fits and results["tuned"].fits
    assert choose_measured(results).name == "tuned"


def test_steps_wider_than_the_backend_are_left_out_of_every_list(tmp_path):
    model = _model(tmp_path)
    backend = ScriptedBackend(model)
    backend.max_num_tokens = 20
    lists = {"default": model.evaluate(model.default_sizes), "tuned": model.evaluate((4, 12, 20))}
    trace, results, info = validate_lists(model, lists, backend, num_steps=1000, seed=2)
    assert all(s.num_tokens <= 20 for s in trace)
    assert info["sampled"] == 1000 and info["replayed"] == len(trace) == 1000 - info["excluded"]
    wider = sum(s.probability for s in model.workload.steps() if s.num_tokens > 20)
    assert abs(info["excluded"] / 1000 - wider) < 0.04
    assert all(sum(g["steps"] for g in r.by_graph) == len(trace) for r in results.values())


def test_a_list_named_twice_is_measured_once(tmp_path):
    model = _model(tmp_path)
    e = model.evaluate(model.default_sizes)
    backend = ScriptedBackend(model)
    _, results, _ = validate_lists(model, {"default": e, "tuned": e}, backend, num_steps=100, seed=0)
    assert len(backend.captured) == 1 and results["tuned"].name == "tuned"
    assert results["tuned"].measured_step_ms == results["default"].measured_step_ms


def test_measured_numbers_independent_of_the_model_against_hand_values(tmp_path, capsys):
    """A scripted device whose pools and step laws owe nothing to the predictions: every measured figure in
    validation.json, the report's table (cell by cell), the speedup sentence and the printed table is its hand value."""
    from tuner.commands.validate import _print_table
    from tuner.report.validation import render_section

    model = _model(tmp_path)
    assert model.default_sizes == (1, 2, 4, 8, 16, 24, 32)  # vLLM's grid, up to max_num_batched_tokens 32
    lists = {"default": model.evaluate(model.default_sizes), "tuned": model.evaluate((4, 8, 16))}
    # Scripted: default 95 MiB and 0.5 + 0.0213 ms per token; tuned 41 MiB and 0.3 + 0.0213 ms per token (odd
    # figures, so no mean lands on a rounding edge of the table's 4 decimals).
    backend = DeviceScript(model, {(1, 2, 4, 8, 16, 24, 32): (95 * MIB, 0.5, 0.0213),
                                   (4, 8, 16): (41 * MIB, 0.3, 0.0213)})
    trace, results, _ = validate_lists(model, lists, backend, num_steps=400, seed=5)
    record = build_record(model, backend.metadata(), trace, results, seed=5, emitted="tuned")
    tokens = [s.num_tokens for s in trace]
    uniform = [s for s in trace if s.uniform_decode]
    mixed = [s for s in trace if not s.uniform_decode]
    assert len(trace) == 400 and uniform and mixed

    hand = {
        # Handmade profile: a graph alone 2 w MiB, each later one 2 MiB (q = 2, FULL_AND_PIECEWISE).
        # default: PIECEWISE 1..32 (7) + FULL 2, 4, 8, 16, 24 (5) = 12 graphs; PIECEWISE 32 alone 64 + 11 x 2 = 86 MiB.
        # Every decode step (2..24 tokens) has a FULL window, every mixed one (1..32) a PIECEWISE graph.
        "default": {"graphs": 12, "predicted": 86 * MIB, "measured": 95 * MIB, **_law(0.5, 0.0213, tokens),
                    "dispatch": (len(uniform), len(mixed), 0)},
        # tuned: PIECEWISE 4, 8, 16 + FULL 4, 8, 16 = 6 graphs; 32 + 5 x 2 = 42 MiB. Steps above 16 tokens run eager.
        "tuned": {"graphs": 6, "predicted": 42 * MIB, "measured": 41 * MIB, **_law(0.3, 0.0213, tokens),
                  "dispatch": (sum(s.num_tokens <= 16 for s in uniform), sum(s.num_tokens <= 16 for s in mixed),
                               sum(s.num_tokens > 16 for s in trace))},
    }
    for name, h in hand.items():
        r = record[name]
        # The model's latency for each replayed step, through step_latency_ms (not the code under test's own path).
        h["predicted_trace"] = float(np.mean([model.step_latency_ms(s.num_tokens, s.uniform_decode,
                                                                    lists[name].capture_sizes) for s in trace]))
        assert r["num_graphs"] == h["graphs"]
        assert (r["predicted_graph_bytes"], r["measured_graph_bytes"]) == (h["predicted"], h["measured"])
        assert r["memory_error"] == pytest.approx(h["predicted"] / h["measured"] - 1)
        for key in ("measured_step_ms", "p50_step_ms", "p99_step_ms", "tokens_per_s"):
            assert r[key] == pytest.approx(h[key], rel=1e-12), (name, key)
        assert r["predicted_trace_step_ms"] == pytest.approx(h["predicted_trace"], rel=1e-12)
        assert r["latency_error"] == pytest.approx(h["predicted_trace"] / h["measured_step_ms"] - 1, rel=1e-9)
        assert (r["dispatch"]["FULL"], r["dispatch"]["PIECEWISE"], r["dispatch"]["NONE"]) == h["dispatch"]
        assert r["fits"]
    # Per step kind (mode, width run), sorted: tuned's decode steps replay FULL 4, 8 or 16, its mixed ones PIECEWISE
    # 4, 8 or 16, and steps above 16 run eager at their own width; each group's mean is the law's over its steps.
    kinds: dict[tuple[str, int], list[int]] = {}
    for st in trace:
        kind = ("NONE", st.num_tokens) if st.num_tokens > 16 else (
            "FULL" if st.uniform_decode else "PIECEWISE", next(w for w in (4, 8, 16) if w >= st.num_tokens))
        kinds.setdefault(kind, []).append(st.num_tokens)
    assert [(g["mode"], g["width"], g["steps"]) for g in record["tuned"]["by_graph"]] == [
        (mode, width, len(kinds[(mode, width)])) for mode, width in sorted(kinds)]
    assert [g["measured_ms"] for g in record["tuned"]["by_graph"]] == pytest.approx(
        [0.3 + 0.0213 * sum(kinds[k]) / len(kinds[k]) for k in sorted(kinds)])
    # vLLM sizes KV from the estimate: ceil(1000 MiB x 0.9) = 900 MiB - non-KV 150 MiB - estimate.
    assert [record[n]["kv_available_bytes"] for n in hand] == [(900 - 150 - 86) * MIB, (900 - 150 - 42) * MIB]
    assert record["default"]["memory_error"] == pytest.approx(86 / 95 - 1)  # -9.5%: over the 5% goal
    assert record["tuned"]["memory_error"] == pytest.approx(42 / 41 - 1)  # +2.4%
    # 95 MiB exceeds 86 x 1.05: the fit check charges 5% on top; headroom = estimate 86 + unrequested 100 - charged.
    assert any("default: MEASURED GRAPH MEMORY" in w for w in record["warnings"])
    assert record["default"]["capture_headroom_bytes"] == 86 * MIB + 100 * MIB - int(95 * MIB * 1.05)
    assert record["tuned"]["capture_headroom_bytes"] == 42 * MIB + 100 * MIB - 41 * MIB
    # V2's estimate here is the pool (PIECEWISE in full, FULL deltas 2 MiB >= the 1 MiB floor); none was measured.
    assert [(record[n]["predicted_estimate_bytes"], record[n]["measured_estimate_bytes"]) for n in hand] == [
        (86 * MIB, None), (42 * MIB, None)]
    # Provenance: the profile as its metadata names it, and the trace as replayed.
    assert record["profile"] == {"path": str(model.profile.path), "device_name": "handmade test fixture (not a "
                                 "measurement)", "command": "tests/handmade_profiles.py",
                                 "created_at": "2026-01-01T00:00:00Z", "compiled": True}
    assert record["trace"]["seed"] == 5 and record["trace"]["steps"] == 400
    assert record["trace"]["mean_tokens"] == pytest.approx(sum(tokens) / 400)
    assert record["trace"]["uniform_decode_share"] == pytest.approx(len(uniform) / 400)
    # The measured speedup is the scripted device's, the predicted one the model's: they differ in direction too.
    d, t = hand["default"], hand["tuned"]
    measured_speedup = d["measured_step_ms"] / t["measured_step_ms"]
    predicted_speedup = d["predicted_trace"] / t["predicted_trace"]
    assert measured_speedup > 1 > predicted_speedup
    assert record["measured_speedup_tuned_over_default"] == pytest.approx(measured_speedup, rel=1e-12)
    assert record["predicted_speedup_tuned_over_default"] == pytest.approx(predicted_speedup, rel=1e-12)

    section = render_section(record)
    rows = _table(section)
    assert list(rows) == ["default", "tuned"]
    for name, h in hand.items():
        mem_err = h["predicted"] / h["measured"] - 1
        lat_err = h["predicted_trace"] / h["measured_step_ms"] - 1
        assert rows[name] == [
            name, str(h["graphs"]), f"{h['predicted'] / (1 << 30):.3f}", f"{h['measured'] / (1 << 30):.3f}",
            f"{mem_err:+.1%}{_flag(mem_err, 0.05)}", f"{h['predicted_trace']:.4f}", f"{h['measured_step_ms']:.4f}",
            f"{lat_err:+.1%}{_flag(lat_err, 0.03)}", f"{h['p50_step_ms']:.4f}", f"{h['p99_step_ms']:.4f}",
            f"{h['tokens_per_s']:,.0f}", " / ".join(map(str, h["dispatch"])), "yes"], name
    assert rows["default"][2:5] == ["0.084", "0.093", "-9.5% **(!)**"] and rows["tuned"][2:5] == [
        "0.041", "0.040", "+2.4%"]
    assert (f"Measured speedup of tuned over default (mean step latency, same steps): **{measured_speedup:.3f}x** "
            f"(the model predicted {predicted_speedup:.3f}x).") in section
    assert "Emitted list: **tuned**." in section

    _print_table(record)  # `cgtune validate`'s printed table
    printed = capsys.readouterr().out
    assert (f"measured speedup tuned over default: {measured_speedup:.3f}x (predicted {predicted_speedup:.3f}x); "
            f"emitted: tuned") in printed
    assert [line.split()[:3] for line in printed.splitlines()[2:4]] == [["default", "0.084", "0.093"],
                                                                        ["tuned", "0.041", "0.040"]]


def test_lists_and_candidates(tmp_path):
    model = _model(tmp_path)
    search = _search(model)
    lists = lists_to_validate(search)
    assert list(lists)[:2] == ["default", "tuned"]
    assert "exact" not in lists  # the search chose the exact optimum
    assert [c.capture_sizes for c in top_candidates(model, search, 1)] == [search.chosen.capture_sizes]
    with pytest.raises(ValueError, match="k=0 must be >= 1"):
        top_candidates(model, search, 0)
    cands = top_candidates(model, search, 3, trial_lists=[[1, 2, 4], [1, 2, 4]])
    assert cands[0].capture_sizes == search.chosen.capture_sizes
    assert len({c.capture_sizes for c in cands}) == len(cands) <= 3
    assert all(c.feasible for c in cands)


# ---------------------------------------------------------------------------------------------- run directory
def _png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk (and a check that the file is one)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", path
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_validate_run_writes_record_and_report_section(tmp_path):
    from tuner.report.validation import render_plot

    run, model, search = _run_dir(tmp_path)
    tuned = search.chosen.capture_sizes
    assert tuned == tuple(range(1, 25))  # the exact optimum here: every width up to 12 requests x q 2
    # Scripted device (not the model): default 90 MiB, 0.6 + 0.0117 ms per token; tuned 120 MiB, 0.45 + 0.0117.
    backend = DeviceScript(model, {model.default_sizes: (90 * MIB, 0.6, 0.0117), tuned: (120 * MIB, 0.45, 0.0117)})
    record = validate_run(run, num_steps=400, seed=3, backend=backend, command="pytest")
    on_disk = json.loads((run / VALIDATION_FILE).read_text())
    assert on_disk["device_name"] == FIXTURE_DEVICE
    assert on_disk["workload"]["name"] == model.workload.name
    assert on_disk["profile"]["path"].endswith("profile.csv")
    tokens = [s.num_tokens for s in sample_trace(model.workload.steps(), 400, seed=3)]  # the very steps replayed
    # Predicted pools by hand (a graph alone 2 w MiB, each later one 2 MiB): default 12 graphs, PIECEWISE 32 alone
    # 64 + 11 x 2 = 86 MiB; tuned PIECEWISE 1..24 and FULL 2..24 (even), 36 graphs, 48 + 35 x 2 = 118 MiB.
    hand = {"default": (search.default, 86 * MIB, 90 * MIB, _law(0.6, 0.0117, tokens)),
            "tuned": (search.chosen, 118 * MIB, 120 * MIB, _law(0.45, 0.0117, tokens))}
    for name, (evaluation, predicted, measured, law) in hand.items():
        r = on_disk[name]
        assert r["capture_sizes"] == list(evaluation.capture_sizes)
        assert (r["predicted_graph_bytes"], r["measured_graph_bytes"]) == (predicted, measured)
        assert r["predicted_step_ms"] == pytest.approx(evaluation.expected_step_ms)
        for key, value in law.items():
            assert r[key] == pytest.approx(value, rel=1e-12), (name, key)
        assert r["fits"]
    # The tuned list fits, so it ships even though nothing else was compared: no fallback, no note.
    assert on_disk["emitted"] == "tuned" and on_disk["notes"] == []
    assert record["measured_speedup_tuned_over_default"] == pytest.approx(
        hand["default"][3]["measured_step_ms"] / hand["tuned"][3]["measured_step_ms"], rel=1e-12)
    report = (run / "report.md").read_text()
    assert report.count(BEGIN) == 1 and report.count(END) == 1 and "Validation on the device" in report
    assert FIXTURE_DEVICE in report
    rows = _table(report)
    assert [rows[n][2:4] for n in ("default", "tuned")] == [["0.084", "0.088"], ["0.115", "0.117"]]
    assert [rows[n][6] for n in ("default", "tuned")] == [f"{hand[n][3]['measured_step_ms']:.4f}"
                                                          for n in ("default", "tuned")]
    # The plot: a PNG of the figure's size (11 x 4.5 in at 110 dpi) with the lists drawn on it.
    plot = run / "plots" / "validation.png"
    assert _png_size(plot) == (1210, 495)
    blank = render_plot({**record, "lists": []}, tmp_path / "blank.png")
    assert _png_size(blank) == (1210, 495) and blank.read_bytes() != plot.read_bytes()
    # Validating again replaces the section instead of adding a second one.
    validate_run(run, num_steps=200, seed=4, backend=ScriptedBackend(model))
    assert (run / "report.md").read_text().count(BEGIN) == 1


class DeviceError(RuntimeError):
    """What a device fault raises mid-validation (an illegal address, a lost device)."""


def test_a_validation_that_dies_midway_keeps_the_lists_it_measured(tmp_path):
    run, model, search = _run_dir(tmp_path)
    tuned = search.chosen.capture_sizes
    backend = DeviceScript(model, {model.default_sizes: (90 * MIB, 0.6, 0.0117)})
    real_capture = backend.capture

    def capture(graphs):  # the default list is measured first; the device faults on the tuned list's capture
        if tuple(graphs) == tuple(model.graphs(tuned)):
            raise DeviceError("CUDA error: an illegal memory access was encountered")
        return real_capture(graphs)

    backend.capture = capture
    files = sorted(p.name for p in run.iterdir())
    with pytest.raises(DeviceError):
        validate_run(run, num_steps=200, seed=1, backend=backend, command="pytest")
    assert not (run / VALIDATION_FILE).exists()  # nothing decided, nothing re-emitted
    assert sorted(p.name for p in run.iterdir()) == sorted([*files, PARTIAL_FILE])
    partial = json.loads((run / PARTIAL_FILE).read_text())
    assert partial["partial"] is True and partial["emitted"] is None
    assert partial["lists"] == ["default"] and partial["pending"] == ["tuned"]
    tokens = [s.num_tokens for s in sample_trace(model.workload.steps(), 200, seed=1)]
    assert partial["default"]["measured_graph_bytes"] == 90 * MIB
    assert partial["default"]["measured_step_ms"] == pytest.approx(_law(0.6, 0.0117, tokens)["measured_step_ms"])
    assert "1 of 2 lists measured" in partial["notes"][0]
    # A later run that finishes writes validation.json and drops the partial record it supersedes.
    full = DeviceScript(model, {model.default_sizes: (90 * MIB, 0.6, 0.0117), tuned: (120 * MIB, 0.45, 0.0117)})
    validate_run(run, num_steps=200, seed=1, backend=full)
    assert (run / VALIDATION_FILE).is_file() and not (run / PARTIAL_FILE).exists()


def test_tuned_list_that_does_not_fit_is_not_emitted(tmp_path, caplog):
    run, model, search = _run_dir(tmp_path)
    tuned_top = search.chosen.capture_sizes[-1]
    assert tuned_top != model.default_sizes[-1]
    t = search.chosen
    too_much = (t.graph_estimate_bytes + model.budget.slack_bytes + MIB) / t.graph_memory_bytes
    with caplog.at_level("WARNING", logger="tuner.validate.validation"):
        record = validate_run(run, num_steps=300, backend=ScriptedBackend(model, memory_factor={tuned_top: too_much}))
    assert record["emitted"] == "default" and not record["tuned"]["fits"] and record["command"] == ""
    assert "TUNED LIST DOES NOT FIT ON THE DEVICE: emitted default instead" in caplog.messages
    config = json.loads((run / "compilation_config.json").read_text())
    assert config["cudagraph_capture_sizes"] == list(model.default_sizes)
    assert any("never emitted" in w for w in record["warnings"])

    record = validate_run(run, num_steps=300, backend=ScriptedBackend(model, oom_above=0), emit=False)
    assert record["emitted"] is None and (run / "compilation_config.json").exists()  # --no-emit touches nothing
    assert any("--no-emit" in n for n in record["notes"])
    record = validate_run(run, num_steps=300, backend=ScriptedBackend(model, oom_above=0))
    assert record["emitted"] is None and not (run / "compilation_config.json").exists()


def test_the_list_the_files_ship_is_measured_and_is_the_one_emitted(tmp_path, caplog):
    """A run whose files ship its compact list (the ship policy's auto): validation measures that list beside the
    tuned one and emits it; where it does not fit by measurement, the fastest measured list that fits replaces it."""
    run, model, search = _run_dir(tmp_path, ship="auto")
    shipped = json.loads((run / "summary.json").read_text())["shipped"]
    assert shipped["list"] == "compact" and tuple(shipped["capture_sizes"]) != search.chosen.capture_sizes
    backend = ScriptedBackend(model)
    record = validate_run(run, num_steps=200, backend=backend)
    assert record["lists"] == ["default", "tuned", "compact"] and record["emitted"] == "compact"
    assert record["compact"]["capture_sizes"] == shipped["capture_sizes"] and record["compact"]["fits"]
    assert backend.captured[-1] == model.graphs(tuple(shipped["capture_sizes"]))
    assert any("ship the compact list" in n for n in record["notes"])
    top = shipped["capture_sizes"][-1]
    e = model.evaluate(tuple(shipped["capture_sizes"]))
    too_much = (e.graph_estimate_bytes + model.budget.slack_bytes + MIB) / e.graph_memory_bytes
    with caplog.at_level("WARNING", logger="tuner.validate.validation"):
        record = validate_run(run, num_steps=200, backend=ScriptedBackend(model, memory_factor={top: too_much}))
    assert not record["compact"]["fits"] and record["emitted"] not in (None, "compact")
    assert "COMPACT LIST DOES NOT FIT ON THE DEVICE: emitted default instead" in caplog.messages
    assert json.loads((run / "compilation_config.json").read_text())["cudagraph_capture_sizes"] == \
        record[record["emitted"]]["capture_sizes"]


def test_update_report_without_report_md(tmp_path):
    record = {"device_name": FIXTURE_DEVICE, "workload": {"name": "w"}, "lists": [], "trace": {}}
    path = update_report(tmp_path, record)
    assert BEGIN in path.read_text()


# ---------------------------------------------------------------------------------------------- errors
def test_cli_bad_run_dir_is_one_line_exit_2(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip()
    assert "is not a directory" in err and len(err.splitlines()) == 1
    (tmp_path / "empty").mkdir()
    assert main(["validate", str(tmp_path / "empty")]) == 2
    assert "no profile.csv" in capsys.readouterr().err


def test_cli_without_cuda_is_one_line_exit_2(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    run, _, _ = _run_dir(tmp_path)
    assert main(["validate", str(run), "--steps", "10"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("cgtune validate: error: no CUDA device is visible") and len(err.splitlines()) == 1
    assert not (run / VALIDATION_FILE).exists()


def test_unreadable_search_json_is_a_validation_error(tmp_path):
    run, _, _ = _run_dir(tmp_path)
    (run / "search.json").write_text("{not json")
    with pytest.raises(ValidationError, match="search.json"):
        validate_run(run, backend=object())  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- CPU end to end
def test_cpu_eager_replay_through_the_torch_backend(tmp_path, one_thread):
    """The tiny model really runs every step eagerly on the CPU (FULL steps the body at the padded width), timed by an
    injected clock whose durations are scripted, so the accounting end to end has hand values: no graph memory exists
    here, so none is reported and nothing fits."""
    from tuner.measure.decoder import build_model
    from tuner.measure.timing import FakeClock
    from tuner.validate.backend import TorchBackend

    run, model, search = _run_dir(tmp_path)
    # Scripted durations, in replay order: default 1.0 ms per step; tuned 0.4 ms for its first 150 steps, 0.6 after.
    clock = FakeClock([1.0] * 300 + [0.4] * 150 + [0.6] * 150)
    backend = TorchBackend(build_model(model.workload, 32, "cpu"), clock, chunk_steps=128)
    record = validate_run(run, num_steps=300, seed=0, backend=backend)
    assert clock.calls == 600  # every step of both lists timed once, across chunks of 128
    assert record["device"]["device"] == "cpu" and record["device"]["clock"] == "FakeClock"
    tokens = sum(s.num_tokens for s in sample_trace(model.workload.steps(), 300, seed=0))
    # tuned: sorted, 150 x 0.4 then 150 x 0.6; the median interpolates halfway at position 149.5, the p99 (296.01)
    # lies among the 0.6s.
    hand = {"default": (1.0, 1.0, 1.0), "tuned": (0.5, 0.5, 0.6)}
    for name, (mean_ms, p50_ms, p99_ms) in hand.items():
        r = record[name]
        assert r["measured_graph_bytes"] is None and not r["fits"]
        assert (r["measured_step_ms"], r["p50_step_ms"], r["p99_step_ms"]) == pytest.approx((mean_ms, p50_ms, p99_ms))
        assert r["tokens_per_s"] == pytest.approx(tokens / (300 * mean_ms) * 1e3)
        d = r["dispatch"]
        assert d["FULL"] + d["PIECEWISE"] + d["NONE"] == 300
        assert sum(g["steps"] for g in r["by_graph"]) == 300
        assert sum(g["steps"] * g["measured_ms"] for g in r["by_graph"]) == pytest.approx(300 * mean_ms)
    assert record["measured_speedup_tuned_over_default"] == pytest.approx(2.0)
    assert any("no CUDA graphs here" in w for w in record["warnings"])
    # No fallback is emitted from a CPU run: nothing was measured that could overrule the search.

    assert json.loads((run / "compilation_config.json").read_text())["cudagraph_capture_sizes"] == \
        list(decide(model, search).ship.evaluation.capture_sizes)


def test_build_backend_is_as_wide_as_every_graph_and_step_and_compiled_as_the_profile(tmp_path):
    from tuner.validate.backend import build_backend

    model = _model(tmp_path)  # profile widths 1..32; a default deployment's step is compiled
    assert model.profile.metadata["compiled"] is True
    backend = build_backend(model, {"default": model.evaluate((2, 4)), "tuned": model.evaluate((4, 8))}, "cpu")
    # Graphs reach 8 tokens, but mixed steps reach max_num_batched_tokens 32, which the profile measured eagerly.
    assert backend.model.max_num_tokens == 32 and backend.model.device.type == "cpu"
    assert backend.model.compiled and backend.metadata()["compiled"] is True

    # The profile measured eager steps only up to 16 tokens: the model is not built wider than the model extrapolates.
    wl = model.workload
    narrow = CostModel.from_files(handmade_profile(tmp_path / "narrow", wl, list(range(1, 17)),
                                                   standalone_bytes=lambda w: 2 * w * MIB), wl)
    backend = build_backend(narrow, {"default": narrow.evaluate((2, 4))}, "cpu")
    assert backend.model.max_num_tokens == 16

    # An enforce_eager deployment was profiled uncompiled: validation builds it uncompiled too.
    eager_wl = handmade_workload(num_speculative_tokens=1, max_num_seqs=12, max_num_batched_tokens=32,
                                 traffic=MIXED_TRAFFIC, enforce_eager=True)
    eager = CostModel.from_files(handmade_profile(tmp_path / "eager", eager_wl, list(range(1, 33))), eager_wl)
    assert eager.profile.metadata["compiled"] is False
    backend = build_backend(eager, {"default": eager.evaluate(())}, "cpu")
    assert backend.model.max_num_tokens == 32
    assert not backend.model.compiled and backend.metadata()["compiled"] is False


def test_exact_run_writes_a_run_directory_without_optuna(tmp_path):
    from tuner.validate.validation import exact_run

    model = _model(tmp_path)
    (tmp_path / "w.yaml").write_text(json.dumps(model.workload.spec))  # JSON is YAML
    run = exact_run(tmp_path / "w.yaml", model.profile.path, tmp_path / "run", command="pytest")
    search = json.loads((run / "search.json").read_text())
    assert search["chosen"] == search["exact"]["best"] and search["storage"] == "none"
    assert (run / "compilation_config.json").is_file() and (run / "report.md").is_file()
    with pytest.raises(ValidationError):
        exact_run(tmp_path / "w.yaml", tmp_path / "missing.csv", tmp_path / "run2")


def test_cli_profile_flags_check_before_writing(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    model = _model(tmp_path)
    (tmp_path / "w.yaml").write_text(json.dumps(model.workload.spec))
    assert main(["validate", str(tmp_path / "run"), "--profile", str(model.profile.path)]) == 2
    assert "go together" in capsys.readouterr().err
    assert main(["validate", str(tmp_path / "run"), "--workload", str(tmp_path / "w.yaml"),
                 "--profile", str(tmp_path / "nope.csv")]) == 2
    assert "is not a file" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["validate", str(tmp_path / "run"), "--workload", str(tmp_path / "w.yaml"),
                     "--profile", str(model.profile.path)]) == 2
        assert "no CUDA device" in capsys.readouterr().err
        assert not (tmp_path / "run").exists()  # nothing written by a failed command


def test_tune_validate_records_gpu_trials_in_the_study_and_chooses_by_measurement(tmp_path):
    pytest.importorskip("optuna")
    import optuna

    from tuner.search.study import SearchConfig, run_search
    from tuner.validate.validation import validate_candidates

    model = _model(tmp_path)
    run = tmp_path / "run"
    search = run_search(model, SearchConfig(n_trials=12, progress=False), run_dir=run)
    write_run(run, model, decide(model, search), command="pytest", plots=False)
    model_only = len(optuna.load_study(study_name=search.study_name, storage=search.storage).trials)
    # Scripted device (not the model): vLLM's default 80 MiB and 0.3 + 0.01 ms per token, every other list 100 MiB and
    # 0.5 + 0.01: the default, slowest by prediction, is the measured winner.
    backend = DeviceScript(model, {model.default_sizes: (80 * MIB, 0.3, 0.01)}, otherwise=(100 * MIB, 0.5, 0.01))
    chosen, record = validate_candidates(run, model, search, 3, backend=backend, num_steps=400, command="pytest")
    assert record["emitted"] == "default" and chosen.source == "gpu-validated"
    assert chosen.chosen.capture_sizes == model.default_sizes
    assert {"default", "tuned"} <= set(record["lists"]) and set(record["candidates"]) == set(record["lists"])
    mean_tokens = float(np.mean([s.num_tokens for s in sample_trace(model.workload.steps(), 400, 0)]))
    study = optuna.load_study(study_name=search.study_name, storage=search.storage)
    gpu = [t for t in study.trials if t.user_attrs.get("source") == "gpu-validation"]
    distinct = {tuple(record[n]["capture_sizes"]) for n in record["lists"]}
    assert len(study.trials) == model_only + len(gpu) and len(gpu) == len(distinct)
    for t in gpu:
        offset_ms = 0.3 if t.user_attrs["list_name"] == "default" else 0.5
        assert t.value == pytest.approx(offset_ms + 0.01 * mean_tokens)  # the scripted law's mean, by hand
        assert t.user_attrs["device_name"] == FIXTURE_DEVICE and "kv_shortfall_gib" in t.constraints
    # The study still resumes with GPU trials in it.
    before = len(study.trials)
    again = run_search(model, SearchConfig(n_trials=before + 2, progress=False), run_dir=run)
    assert again.trials["total"] == before + 2
    assert (run / VALIDATION_FILE).is_file()


def test_the_measured_winner_ships_when_it_is_not_the_models_pick(tmp_path):
    import dataclasses

    from tuner.validate.validation import validate_candidates

    run, model, search = _run_dir(tmp_path)
    cands = top_candidates(model, search, 3)
    assert cands[0].capture_sizes == search.chosen.capture_sizes  # the model's pick ranks first by prediction
    second = cands[1].capture_sizes
    # Scripted device (not the model): every list 100 MiB and 0.5 + 0.01 ms per token, except the model's
    # second-best, 0.4 + 0.01: measured, it wins.
    backend = DeviceScript(model, {second: (100 * MIB, 0.4, 0.01)}, otherwise=(100 * MIB, 0.5, 0.01))
    said: list[str] = []
    # No study to record into (storage "none", as an optuna-free run writes it): the measurements are still made.
    assert search.storage == "none"
    chosen, record = validate_candidates(run, model, search, 3, backend=backend, num_steps=300, progress=said.append)
    # candidate-2 is 2, 4, .., 24 (the exact solver's front): 12 PIECEWISE graphs and the same 12 FULL windows (q = 2).
    assert second == tuple(range(2, 25, 2))
    assert "candidate-2: capturing 24 graphs, max 24" in said and "candidate-2: replaying 300 steps" in said
    assert record["lists"] == ["default", "tuned", "candidate-2", "candidate-3"]
    assert record["candidates"]["candidate-2"] == list(second)
    assert record["emitted"] == "candidate-2"
    assert chosen is not search and chosen.source == "gpu-validated" and chosen.chosen.capture_sizes == second
    mean_tokens = float(np.mean([s.num_tokens for s in sample_trace(model.workload.steps(), 300, 0)]))
    note = (f"chosen on the GPU: 'candidate-2' measured {0.4 + 0.01 * mean_tokens:.4f} ms per step vs the model's "
            f"pick {0.5 + 0.01 * mean_tokens:.4f} ms")
    assert note in record["notes"] and note in chosen.notes
    # The trace is the seed's: another seed replays other steps (their mean tokens set the winner's figure).
    _, seeded = validate_candidates(run, model, search, 3, backend=backend, num_steps=300, seed=7, record_study=False)
    seven = [s.num_tokens for s in sample_trace(model.workload.steps(), 300, 7)]
    assert sum(seven) != 300 * mean_tokens and seeded["trace"]["seed"] == 7
    assert seeded["candidate-2"]["measured_step_ms"] == pytest.approx(0.4 + 0.01 * sum(seven) / 300)
    # And where the model's pick is also the measured winner, the search comes back untouched.
    backend = DeviceScript(model, {search.chosen.capture_sizes: (100 * MIB, 0.4, 0.01)},
                           otherwise=(100 * MIB, 0.5, 0.01))
    same, record = validate_candidates(run, model, search, 3, backend=backend, num_steps=300, record_study=False)
    assert same is search and record["emitted"] == "tuned"
    # The model's pick is vLLM's default: one measurement stands for both names.
    default_pick = dataclasses.replace(search, chosen=search.default)
    backend = DeviceScript(model, {}, otherwise=(100 * MIB, 0.5, 0.01))
    same, record = validate_candidates(run, model, default_pick, 2, backend=backend, num_steps=300,
                                       record_study=False)
    assert record["tuned"]["capture_sizes"] == record["default"]["capture_sizes"] == list(model.default_sizes)
    assert record["tuned"]["measured_step_ms"] == record["default"]["measured_step_ms"]
    assert same is default_pick and record["emitted"] in ("default", "tuned")
    # Nothing fits by measurement (every pool 10 GiB): nothing ships, and the vLLM files go.
    backend = DeviceScript(model, {}, otherwise=(10 * 1024 * MIB, 0.5, 0.01))
    none, record = validate_candidates(run, model, search, 2, backend=backend, num_steps=100, record_study=False)
    assert none is None and record["emitted"] is None
    assert not (run / "compilation_config.json").exists() and not (run / "vllm-serve.yaml").exists()


def test_without_a_backend_one_is_built_on_the_device_for_every_list_validated(tmp_path, monkeypatch):
    import tuner.validate.validation
    from tuner.validate.validation import validate_candidates

    run, model, search = _run_dir(tmp_path)
    built = []

    def build(m, lists, device):  # stands in for the device's model; records what it was asked to build for
        built.append((device, {name: e.capture_sizes for name, e in lists.items()}))
        return DeviceScript(m, {}, otherwise=(100 * MIB, 0.5, 0.01))

    monkeypatch.setattr(tuner.validate.validation, "require_cuda", lambda: "cuda:7")
    monkeypatch.setattr(tuner.validate.validation, "build_backend", build)
    validate_run(run, num_steps=50)
    validate_candidates(run, model, search, 2, num_steps=50, record_study=False)
    second = top_candidates(model, search, 2)[1].capture_sizes
    assert built == [("cuda:7", {"default": model.default_sizes, "tuned": search.chosen.capture_sizes}),
                     ("cuda:7", {"default": model.default_sizes, "tuned": search.chosen.capture_sizes,
                                 "candidate-2": second})]


def test_the_gpu_box_path_never_imports_optuna(tmp_path):
    """The GPU machine has no optuna: exact_run, validate_run and the command module must work without it."""
    import subprocess

    code = f"""
import json, sys
sys.modules["optuna"] = None  # any import of optuna now raises ImportError
sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
from pathlib import Path
from test_validate import ScriptedBackend, _model
import tuner.commands.validate
from tuner.validate.validation import exact_run, validate_run
tmp = Path({str(tmp_path)!r})
model = _model(tmp)
(tmp / "w.yaml").write_text(json.dumps(model.workload.spec))
run = exact_run(tmp / "w.yaml", model.profile.path, tmp / "run")
record = validate_run(run, num_steps=100, backend=ScriptedBackend(model))
print(record["emitted"])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "compact"  # exact_run ships the recommended compact list (auto)


def test_cgtune_report_keeps_the_section_of_this_list_only(tmp_path, capsys):
    run, model, search = _run_dir(tmp_path)
    validate_run(run, num_steps=200, backend=ScriptedBackend(model))
    assert main(["report", str(run)]) == 0
    assert (run / "report.md").read_text().count(BEGIN) == 1
    record = json.loads((run / VALIDATION_FILE).read_text())
    record["tuned"]["capture_sizes"] = [1]
    record["emitted"] = "tuned"
    (run / VALIDATION_FILE).write_text(json.dumps(record))  # now the validation of another list
    assert main(["report", str(run)]) == 0
    assert BEGIN not in (run / "report.md").read_text()


def test_torch_backend_capture_flow_with_stand_in_graphs(tmp_path, one_thread):
    """The device backend's own control flow on a CPU: capture order and keys, FULL graphs whole and PIECEWISE ones
    split at attention (each piece a stand-in that reruns it into its recorded outputs, as a CUDA graph writes its
    static outputs), replay plus logits of the real tokens, the out-of-memory path and the release; the memory
    readings are scripted (test fixtures, not measurements)."""
    torch = pytest.importorskip("torch")
    from tuner.measure.graphs import CapturedGraph
    from tuner.measure.memory import MemorySnapshot
    from tuner.measure.piecewise import Piece
    from tuner.measure.decoder import build_model
    from tuner.validate.backend import TorchBackend

    model = _model(tmp_path)
    backend = TorchBackend(build_model(model.workload, 32, "cpu"))
    decoder = backend.model
    free = {"bytes": 10_000 * MIB}
    captured: list[tuple[str, int]] = []

    class StandIn:
        def __init__(self, width: int) -> None:
            self.width = width

        def replay(self) -> None:
            decoder.forward_hidden(self.width)  # writes hidden_out[:width], as a replay would

    class StandInPiece:
        def __init__(self, fn, outputs) -> None:
            self.fn, self.outputs = fn, outputs

        def replay(self) -> None:
            for recorded, fresh in zip(self.outputs, self.fn()):
                if fresh.data_ptr() != recorded.data_ptr():
                    recorded.copy_(fresh)

    def capture(width, pool):
        if width == 24 and free.get("oom"):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (scripted)")
        captured.append(("FULL", width))
        free["bytes"] -= 3 * MIB
        return CapturedGraph(StandIn(width), width, pool, 0.0)  # type: ignore[arg-type]

    split_capture = backend.runner.capture_piecewise  # the real split, its pieces captured by the stand-in below

    def capture_piecewise(width, pool):
        captured.append(("PIECEWISE", width))
        free["bytes"] -= 2 * MIB
        return split_capture(width, pool)

    def capture_piece(fn, width, pool):
        outputs = tuple(fn())
        return Piece(StandInPiece(fn, outputs), outputs), outputs

    backend.graphs_supported = True
    backend.runner.capture = capture  # type: ignore[method-assign]
    backend.runner.capture_piecewise = capture_piecewise  # type: ignore[method-assign]
    backend.runner.capture_piece = capture_piece  # type: ignore[method-assign]
    backend.runner.new_pool = lambda: "pool"  # type: ignore[method-assign]
    backend.runner.memory = lambda: MemorySnapshot(free_bytes=free["bytes"])  # type: ignore[method-assign]

    sizes = (4, 8, 24)
    graphs = model.graphs(sizes)
    assert {m for m, _ in graphs} == {"FULL", "PIECEWISE"}
    result = backend.capture(graphs)
    # Throwaway captures first (one-time allocations stay out of every list's reading), then vLLM's order.
    assert captured == [("FULL", 4), ("PIECEWISE", 4)] + list(graphs) and result.graphs == len(graphs)
    pieces = {m: sum(1 for g in graphs if g[0] == m) for m in ("FULL", "PIECEWISE")}
    assert result.free_delta_bytes == (3 * pieces["FULL"] + 2 * pieces["PIECEWISE"]) * MIB and result.oom is None
    assert all(len(backend._graphs[g].pieces) == 3 for g in graphs if g[0] == "PIECEWISE")  # 2 layers: 3 pieces
    with pytest.raises(RuntimeError, match="release"):
        backend.capture(graphs)
    plan = plan_trace(sample_trace(model.workload.steps(), 100, seed=5), model.engine.dispatcher(sizes))
    for mode in ("FULL", "PIECEWISE"):  # a padded step: the graph of the padded width, logits of the real tokens
        step = next(p for p in plan if p.runtime_mode == mode and p.padded_size != p.num_tokens)
        decoder.hidden_out.zero_()
        torch.testing.assert_close(backend._step_fn(step)(), decoder.step(step.num_tokens), rtol=1e-5, atol=1e-5)
    assert len(backend.time_steps(plan)) == len(plan)
    free["bytes"] += result.free_delta_bytes  # scripted: the pool went back
    assert backend.release() == 0

    free["oom"] = True
    result = backend.capture(graphs)
    assert result.oom and "out of memory" in result.oom and result.free_delta_bytes is None
    assert not backend._graphs  # released after the failed capture


class _PoolRunner:
    """Test fixture standing in for StepRunner on a CPU: a capture 'takes' free memory as a CUDA graph pool would,
    the first graph of a pool its standalone footprint (10 w MiB), every later one its delta (w MiB). Scripted,
    not measured."""

    def __init__(self) -> None:
        self.free = 10_000 * MIB
        self.pools: dict[int, list[int]] = {}
        self.captures: list[tuple[int, str, int]] = []

    def new_pool(self):
        pool = len(self.pools)
        self.pools[pool] = []
        return pool

    def eager(self, width):
        pass

    def split_eager(self, width):
        pass

    def release(self, collect=False):
        pass

    def memory(self):
        from tuner.measure.memory import MemorySnapshot

        return MemorySnapshot(free_bytes=self.free)

    def _take(self, mode, width, pool):
        self.free -= (width if self.pools[pool] else 10 * width) * MIB
        self.pools[pool].append(width)
        self.captures.append((pool, mode, width))
        return object()

    def capture(self, width, pool):
        return self._take("FULL", width, pool)

    def capture_piecewise(self, width, pool):  # the split step's pieces, as the profile's piecewise rows
        return self._take("PIECEWISE", width, pool)


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_the_estimate_is_measured_the_way_the_runner_takes_it(runner):
    from tuner.validate.backend import TorchBackend

    backend = TorchBackend.__new__(TorchBackend)  # no decode model: the scripted runner stands in for it
    backend.runner, backend.graphs_supported, backend._graphs, backend._primed = _PoolRunner(), True, {}, True
    graphs = [("PIECEWISE", 8), ("PIECEWISE", 4), ("PIECEWISE", 2), ("FULL", 8), ("FULL", 4), ("FULL", 2)]
    estimate = backend.measure_estimate(graphs, runner)
    caps = backend.runner.captures
    # PIECEWISE samples are captured split at attention (capture_piecewise), FULL ones whole.
    if runner == "v2":
        # One throwaway pool, the real order, only the two largest FULL graphs: PIECEWISE 80 + 4 + 2, FULL samples
        # 8 and 4 (deltas: the pool already holds the PIECEWISE graphs), extrapolated as 8 + 2 x 4.
        assert [(m, w) for _, m, w in caps] == graphs[:5] and len({p for p, _, _ in caps}) == 1
        assert estimate == (80 + 4 + 2 + 8 + 2 * 4) * MIB
    else:
        # A scratch pool per mode, two graphs each: max(80, 80) + 2 x max(4, 1 MiB) per mode.
        assert [(m, w) for _, m, w in caps] == [("PIECEWISE", 8), ("PIECEWISE", 4), ("FULL", 8), ("FULL", 4)]
        assert len({p for p, _, _ in caps}) == 2
        assert estimate == (80 + 2 * 4 + 2 * 4) * MIB


def test_a_drafters_graphs_are_predicted_not_captured_and_count_in_the_fit_check(tmp_path):
    """Validation captures and replays the target alone: the predictions held to the measurement are the target's,
    and for the fit check the drafter's predicted graph memory joins the measured pool and its share of vLLM's
    estimate the measured estimate. Hand-made profile (test fixture): target graphs 2 w MiB alone, 2 MiB deltas;
    the EAGLE drafter's 0.5 MiB deltas."""
    import dataclasses

    import numpy as np

    wl = handmade_workload(num_speculative_tokens=1, max_num_seqs=12, max_num_batched_tokens=32, traffic=MIXED_TRAFFIC,
                           speculative={"method": "eagle"})
    path = handmade_profile(tmp_path / "profile", wl, list(range(1, 33)), standalone_bytes=lambda w: 2 * w * MIB)
    model = CostModel.from_files(path, wl)
    e = model.evaluate((4, 8, 16))
    # Target: PIECEWISE 16 alone (32 MiB) + 5 deltas of 2 MiB; drafter: PIECEWISE and FULL at 4, 8, 16 after them,
    # 0.5 MiB each.
    assert e.graph_memory_bytes == 45 * MIB and e.drafter_graph_bytes == 3 * MIB
    plan = plan_trace(sample_trace(wl.steps(), 200, seed=1), model.engine.dispatcher(e.capture_sizes))
    samples = predicted_trace_step_ms(model, plan)
    r = compare_list(model, "tuned", e, plan, samples, CaptureResult(42 * MIB), measured_estimate_bytes=42 * MIB)
    assert (r.predicted_graph_bytes, r.drafter_graph_bytes) == (42 * MIB, 3 * MIB) and r.memory_error == 0
    assert r.predicted_estimate_bytes == 42 * MIB and r.estimate_error == 0
    assert r.drafter_estimate_bytes == e.graph_estimate_bytes - 42 * MIB == 3 * MIB  # V2 counts them in full
    b = model.budget
    assert r.kv_available_bytes == b.kv_available_bytes(45 * MIB)
    assert r.capture_headroom_bytes == b.capture_headroom_bytes(45 * MIB, 45 * MIB)
    assert r.predicted_drafter_step_ms == pytest.approx(e.drafter_step_ms) and e.drafter_step_ms > 0
    assert r.predicted_trace_step_ms == pytest.approx(float(np.mean(samples)))  # the target's steps alone
    # A deployment whose KV requirement the target's graphs alone would leave, but not with the drafter's.
    model.budget = dataclasses.replace(b, required_kv_bytes=b.kv_available_bytes(44 * MIB))
    tight = compare_list(model, "tuned", e, plan, samples, CaptureResult(42 * MIB), measured_estimate_bytes=42 * MIB)
    assert not tight.fits and any("would refuse to start" in w for w in tight.warnings)
    record = build_record(model, {"device_name": FIXTURE_DEVICE}, [], {"tuned": r}, seed=0)
    assert any("drafter is not replayed" in n for n in record["notes"])
    assert record["tuned"]["drafter_graph_bytes"] == 3 * MIB


def test_an_engine_runs_files_go_when_no_measured_list_fits(tmp_path):
    from tuner.engines.registry import ENGINE_FILES

    wl = handmade_workload(engine="trtllm", max_num_seqs=12, max_num_batched_tokens=32, traffic=MIXED_TRAFFIC,
                           enable_padding=True)
    model = CostModel.from_files(handmade_profile(tmp_path / "profile", wl, list(range(1, 33)),
                                                  standalone_bytes=lambda w: 2 * w * MIB), wl)
    run = tmp_path / "run"
    write_run(run, model, decide(model, _search(model)), command="pytest", plots=False)
    assert all((run / name).is_file() for name in ENGINE_FILES["trtllm"])
    record = validate_run(run, num_steps=100, backend=ScriptedBackend(model, oom_above=0))
    assert record["emitted"] is None and "trtllm files were removed" in " ".join(record["notes"])
    assert not any((run / name).exists() for name in ENGINE_FILES["trtllm"])
