"""The optuna study against the exact solver (tests/test_exact.py holds the solver to brute force), constraints,
resume."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/handmade_profiles.py (import-mode=importlib)
from handmade_profiles import MIB, handmade_profile, handmade_workload  # noqa: E402

from tuner.model.costmodel import CostModel  # noqa: E402
from tuner.search.study import (  # noqa: E402
    SearchConfig,
    SearchError,
    exact_solve,
    list_from_params,
    run_search,
    study_name_for,
)

def test_budget_that_no_list_meets_is_an_error(tmp_path):
    wl = handmade_workload()
    path = handmade_profile(tmp_path, wl, [1, 2, 4, 8], total_memory_bytes=160 * MIB, weights_bytes=100 * MIB,
                            activation_peak_bytes=50 * MIB)  # 144 MiB requested < 150 MiB used before graphs
    m = CostModel.from_files(path, wl)
    with pytest.raises(SearchError, match="not even the empty one"):
        exact_solve(m)


def test_the_budget_error_names_the_kv_cache_left_and_required_in_gib(tmp_path):
    # A 4096 MiB device at utilization 0.9 requests 3686.4 MiB; 2100 MiB of weights and a 50 MiB activation peak
    # leave 1536.4 MiB (1.50 GiB) of KV cache without graphs, short of the 2 GiB the workload requires.
    wl = handmade_workload(required_kv_gib=2.0)
    path = handmade_profile(tmp_path, wl, [1, 2, 4, 8], total_memory_bytes=4096 * MIB, weights_bytes=2100 * MIB,
                            activation_peak_bytes=50 * MIB)
    m = CostModel.from_files(path, wl)
    # The setting that asks for it is named, not the capture list, which no choice could make fit.
    with pytest.raises(SearchError, match=r"^no capture list fits, not even the empty one: serving.required_kv_gib=2 "
                                          r"asks for 2\.000 GiB of KV cache, but with no graphs at all the device "
                                          r"leaves it 1\.500 GiB \(lower serving.required_kv_gib, or give the "
                                          r"deployment more memory\)$"):
        exact_solve(m)
    long = handmade_workload(max_model_len=10**12)
    m = CostModel.from_files(handmade_profile(tmp_path / "long", long, [1, 2, 4, 8]), long)
    with pytest.raises(SearchError, match=r"^no capture list fits, not even the empty one: "
                                          r"serving.max_model_len=1000000000000: one request that long needs "):
        exact_solve(m)


def study_model(tmp_path, **kwargs):
    wl = handmade_workload(num_speculative_tokens=1, max_num_seqs=24, max_num_batched_tokens=64,
                           traffic={"requests": {"kind": "uniform", "min": 1, "max": 24}, "mixed_share": 0.2,
                                    "mixed_tokens": {"kind": "uniform", "min": 1, "max": 64}})
    defaults = dict(total_memory_bytes=300 * MIB, weights_bytes=100 * MIB, activation_peak_bytes=50 * MIB,
                    standalone_bytes=lambda w: 2 * w * MIB, delta_bytes=lambda w: 2 * MIB)
    path = handmade_profile(tmp_path, wl, list(range(1, 65)), **{**defaults, **kwargs})
    return CostModel.from_files(path, wl)


def test_study_is_within_one_percent_of_exact_and_never_worse_than_default(tmp_path):
    m = study_model(tmp_path, total_memory_bytes=400 * MIB)
    result = run_search(m, SearchConfig(n_trials=40, progress=False), run_dir=tmp_path)
    assert result.study_best is not None
    assert result.study_best.expected_step_ms <= result.exact.best.expected_step_ms * 1.01
    assert result.source == "study"
    assert result.chosen.feasible
    assert result.chosen.expected_step_ms <= result.default.expected_step_ms
    assert result.storage.startswith("sqlite:///") and (tmp_path / "study.db").is_file()


def test_exact_answer_is_used_when_the_study_misses_by_more_than_one_percent(tmp_path):
    # A one-trial study runs only vLLM's default, which is well off the optimum: the exact answer ships.
    m = study_model(tmp_path, total_memory_bytes=400 * MIB)
    result = run_search(m, SearchConfig(n_trials=1, progress=False), run_dir=tmp_path)
    assert result.study_best is not None and result.study_best.capture_sizes == m.default_sizes
    assert result.gap is not None and result.gap > 0.01
    assert result.source == "exact" and result.chosen == result.exact.best
    assert any("exact solver's answer is used" in n for n in result.notes)


def test_infeasible_trials_are_recorded_as_infeasible(tmp_path):
    import optuna

    # 270 MiB x 0.9 - 150 MiB leaves ~93 MiB: the default list (up to 48 tokens, 96 MiB standalone) does not fit.
    m = study_model(tmp_path, total_memory_bytes=270 * MIB)
    result = run_search(m, SearchConfig(n_trials=30, progress=False), run_dir=tmp_path)
    assert not result.default.feasible
    assert result.trials["infeasible"] >= 1
    study = optuna.load_study(study_name=result.study_name, storage=result.storage)
    first = study.trials[0]
    assert first.user_attrs["capture_sizes"] == list(m.default_sizes)  # vLLM's default was trial 0
    assert first.constraints["kv_shortfall_gib"] > 0
    assert "required" in first.user_attrs["evaluation"]["infeasible_reason"]
    assert result.chosen.feasible


def test_failed_trials_are_recorded_with_their_reason(tmp_path, monkeypatch):
    import optuna

    import tuner.search.study

    m = study_model(tmp_path, total_memory_bytes=400 * MIB)
    real = tuner.search.study._record
    calls = {"n": 0}

    def broken(trial, e, *words):
        calls["n"] += 1
        if calls["n"] == 3:
            raise ValueError("synthetic failure in trial 3")
        return real(trial, e, *words)

    monkeypatch.setattr(tuner.search.study, "_record", broken)
    result = run_search(m, SearchConfig(n_trials=6, progress=False), run_dir=tmp_path)
    assert result.trials["failed"] == 1 and result.trials["complete"] == 5
    study = optuna.load_study(study_name=result.study_name, storage=result.storage)
    failed = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    assert "synthetic failure in trial 3" in failed[0].user_attrs["fail_reason"]


def test_interrupted_study_resumes(tmp_path, monkeypatch):
    import optuna

    import tuner.search.study

    m = study_model(tmp_path)
    calls = {"n": 0}
    real = tuner.search.study._record

    def interrupted(trial, e, *words):
        calls["n"] += 1
        if calls["n"] == 6:
            raise KeyboardInterrupt  # Ctrl-C in the middle of trial 6, long before the buffer's first 2 s batch
        return real(trial, e, *words)

    monkeypatch.setattr(tuner.search.study, "_record", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_search(m, SearchConfig(n_trials=12, progress=False), run_dir=tmp_path)
    monkeypatch.setattr(tuner.search.study, "_record", real)
    name = study_name_for(m, "latency")
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    # The trials ran in memory (tuner/search/study_buffer.py): the interrupt still wrote every one, the seed lists not
    # yet run as WAITING for the rerun.
    states = [t.state.name for t in optuna.load_study(study_name=name, storage=storage).trials]
    assert states[:6] == ["COMPLETE"] * 5 + ["PRUNED"] and set(states[6:]) <= {"WAITING"}

    result = run_search(m, SearchConfig(n_trials=12, progress=False), run_dir=tmp_path)
    assert result.study_name == name
    assert result.trials["run_now"] == 12 - 6  # the six that ended before the interrupt count
    study = optuna.load_study(study_name=name, storage=storage)
    finished = [t for t in study.trials if t.state.is_finished()]
    assert len(finished) == 12
    assert sum("capture_sizes" in t.user_attrs for t in study.trials) == 1  # the default was enqueued once


def test_pareto_objective_returns_a_front(tmp_path):
    m = study_model(tmp_path)
    result = run_search(m, SearchConfig(n_trials=25, objective="pareto", progress=False), run_dir=tmp_path)
    assert result.objective == "pareto" and result.pareto
    for a, b in zip(result.pareto, result.pareto[1:]):
        assert a.graph_memory_bytes <= b.graph_memory_bytes and a.expected_step_ms > b.expected_step_ms
    assert all(e.feasible for e in result.pareto)


def test_list_from_params_always_holds_the_top(tmp_path):
    m = study_model(tmp_path)
    sizes = list_from_params(m, top=40, count=5, spacing=0.5, placement="quantile")
    assert sizes[-1] == m.candidates[40] and len(sizes) <= 5
    with_default = list_from_params(m, top=40, count=5, spacing=0.5, placement="quantile+default")
    assert set(s for s in m.default_sizes if s <= m.candidates[40]) <= set(with_default)
    valued = list_from_params(m, top=40, count=5, spacing=0.5, placement="value")
    assert valued[-1] == m.candidates[40] and len(valued) <= 5


def test_value_placement_finds_the_widths_a_histogram_puts_its_mass_on(tmp_path):
    wl = handmade_workload(max_num_seqs=32, max_num_batched_tokens=64,
                           traffic={"requests": {"kind": "histogram", "counts": {3: 5, 11: 3, 20: 1}}})
    m = CostModel.from_files(handmade_profile(tmp_path, wl, list(range(1, 33))), wl)
    assert list_from_params(m, top=31, count=4, spacing=0.0, placement="value") == (3, 11, 20, 32)


def test_storage_password_never_reaches_the_result():
    from tuner.search.storage_url import display_url

    assert display_url("postgresql://cgtune:s3cret@db:5432/studies") == "postgresql://cgtune:***@db:5432/studies"
    assert display_url("sqlite:////tmp/run/study.db") == "sqlite:////tmp/run/study.db"
