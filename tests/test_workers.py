"""Fleet studies: the plan, one worker on SQLite, a dead worker's trial retried on SQLite, three worker processes on
PostgreSQL with one killed mid-trial, and storage passwords that never reach an output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/handmade_profiles.py (import-mode=importlib)
from handmade_profiles import MIB, handmade_spec, mixed_traffic, write_handmade_inputs  # noqa: E402

from tuner.search.workers import (  # noqa: E402
    STORAGE_ENV,
    create_or_extend,
    fleet_result,
    plan_trials,
    run_worker,
    study_status,
)
from tuner.model.costmodel import CostModel  # noqa: E402
from tuner.search.storage_url import hide_secret  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SPEC = handmade_spec(name="fleet-hand", max_num_seqs=24, num_speculative_tokens=1, max_num_batched_tokens=64,
                     traffic=mixed_traffic(24, 64))
BUDGET = 24


@pytest.fixture()
def inputs(tmp_path):
    wl_path, profile, workload = write_handmade_inputs(
        tmp_path, SPEC, list(range(1, 65)), total_memory_bytes=400 * MIB,
        standalone_bytes=lambda w: 2 * w * MIB, delta_bytes=lambda w: 2 * MIB)
    return wl_path, profile, CostModel.from_files(profile, workload)


def create(url, inputs, n=BUDGET, **kw):
    wl_path, profile, model = inputs
    return create_or_extend(url, wl_path, profile, model, n_trials=n, seed=0, heartbeat_interval_s=1,
                            grace_period_s=2, **kw)


def trials(url, name):
    import optuna

    return optuna.load_study(study_name=name, storage=url).get_trials(deepcopy=False)


def assert_each_slot_complete_once(ts, n):
    complete = sorted(t.user_attrs["slot"] for t in ts if t.state.name == "COMPLETE")
    assert complete == list(range(n))


def values_by_slot(ts):
    return {t.user_attrs["slot"]: tuple(t.values) for t in ts if t.state.name == "COMPLETE"}


def test_plan_is_a_function_of_seed_and_slot(inputs):
    _, _, model = inputs
    a, b = plan_trials(model, 30, seed=0, n_seeds=6), plan_trials(model, 40, seed=0, n_seeds=6)
    assert a == b[:30]  # extending a study keeps the trials already planned
    assert a[0] == ({}, {"capture_sizes": list(model.default_sizes), "slot": 0})  # vLLM's default first
    assert [attrs["slot"] for _, attrs in b] == list(range(40))
    assert plan_trials(model, 30, seed=1, n_seeds=6)[10:] != a[10:]


def test_one_worker_on_sqlite_runs_the_plan_once_and_extends(inputs, tmp_path):
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    name, enqueued = create(url, inputs)
    assert enqueued == BUDGET
    assert create(url, inputs) == (name, 0)  # same inputs: the same study, nothing enqueued twice
    counts = run_worker(url, name, progress=False)
    assert counts == {"complete": BUDGET, "failed": 0}
    assert_each_slot_complete_once(trials(url, name), BUDGET)
    result = fleet_result(url, name, inputs[2])
    assert result.chosen.feasible and result.chosen.expected_step_ms <= result.default.expected_step_ms
    assert result.trials["complete"] == BUDGET

    assert create(url, inputs, n=BUDGET + 6) == (name, 6)
    run_worker(url, name, progress=False)
    assert_each_slot_complete_once(trials(url, name), BUDGET + 6)
    [status] = study_status(url)
    assert status.done and status.planned == BUDGET + 6 and status.counts["complete"] == BUDGET + 6


_KILLER = textwrap.dedent("""
    import os, signal, sys, time
    import tuner.search.workers as fleet

    real = fleet._evaluate

    def die_after_evaluating(objective, trial):
        value = real(objective, trial)  # the list is evaluated and recorded on the trial; then the host dies
        # Die only once the other workers are going, so the kill happens while they run trials.
        while sum(t.state.name == "COMPLETE" for t in trial.study.get_trials(deepcopy=False)) < 3:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)

    fleet._evaluate = die_after_evaluating
    from tuner.cli import main
    sys.exit(main(["worker", "--study", sys.argv[1], "--no-progress", "--poll", "0.2"]))
""")


@pytest.mark.postgres
@pytest.mark.slow
def test_three_workers_on_postgres_one_killed_mid_trial(inputs, pg_url, tmp_path):
    name, _ = create(pg_url, inputs)
    env = {**os.environ, STORAGE_ENV: pg_url, "PYTHONPATH": str(REPO)}
    logs = [open(tmp_path / f"worker{i}.log", "w+") for i in range(3)]  # noqa: SIM115
    killer = subprocess.Popen([sys.executable, "-c", _KILLER, name], env=env, stdout=logs[0], stderr=logs[0])
    # Let the killer claim the first trial before the others start, so it surely dies holding one.
    deadline = time.monotonic() + 40
    while not any(t.state.name == "RUNNING" for t in trials(pg_url, name)):
        assert time.monotonic() < deadline and killer.poll() is None, "the killer worker never claimed a trial"
        time.sleep(0.1)
    others = [subprocess.Popen([sys.executable, "-m", "tuner.cli", "worker", "--study", name, "--no-progress",
                                "--poll", "0.2", "--device", "cpu"], env=env, stdout=log, stderr=log)
              for log in logs[1:]]
    try:
        codes = [p.wait(timeout=60) for p in [killer, *others]]
    finally:
        for p in [killer, *others]:
            if p.poll() is None:
                p.kill()
    output = ""
    for log in logs:
        log.seek(0)
        output += log.read()
        log.close()
    assert codes == [-9, 0, 0], output
    assert "cgtune-test" not in output  # the server's password
    assert "joined study" in output and "cgtune:***@" in output  # the workers' logs show the URL, masked

    ts = trials(pg_url, name)
    assert_each_slot_complete_once(ts, BUDGET)  # nothing lost, nothing counted twice
    [killed] = [t for t in ts if t.state.name == "FAIL"]
    [retry] = [t for t in ts if t.system_attrs.get("failed_trial") == killed.number]
    assert retry.state.name == "COMPLETE" and retry.user_attrs["slot"] == killed.user_attrs["slot"]
    assert retry.user_attrs["worker"] != killed.user_attrs["worker"]
    [status] = study_status(pg_url, name)
    assert status.done and status.counts["failed"] == 1 and status.counts["retried"] == 1

    # The same plan in one process on SQLite: the same trials, the same answer.
    sqlite = f"sqlite:///{tmp_path / 'single.db'}"
    single, _ = create(sqlite, inputs)
    run_worker(sqlite, single, progress=False)
    assert values_by_slot(trials(sqlite, single)) == values_by_slot(ts)
    fleet, alone = fleet_result(pg_url, name, inputs[2]), fleet_result(sqlite, single, inputs[2])
    assert fleet.chosen.capture_sizes == alone.chosen.capture_sizes and fleet.source == alone.source
    assert fleet.study_best == alone.study_best
    assert "cgtune-test" not in fleet.storage and fleet.storage.startswith("postgresql+psycopg2://cgtune:***@")


@pytest.mark.slow
def test_a_trial_abandoned_by_a_dead_worker_is_retried_on_sqlite(inputs, tmp_path, monkeypatch):
    """The stale-trial retry without PostgreSQL: a worker claims a trial, beats, and dies without a word; past the
    grace period the next worker fails it and reruns it in the same slot, and the study counts one retry."""
    import types

    import optuna

    import tuner.search.workers as fleet

    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    name, _ = create(url, inputs, n=3)  # heartbeats every 1 s, stale after 2 s
    spec = fleet.load_spec(url, name)
    storage = fleet._open_storage(url, spec)
    study = optuna.load_study(study_name=name, storage=storage)
    claimed = fleet._pop_waiting(study, url)  # the dead worker's claim, as run_worker makes it
    assert claimed is not None
    optuna.Trial(study, claimed).set_user_attr("worker", "dead-host:1")
    beat = fleet._Heartbeat(storage, claimed, spec.heartbeat_interval_s)
    time.sleep(spec.heartbeat_interval_s + 0.5)  # it beat while alive
    beat.stop()  # the host dies: no tell, no more heartbeats
    time.sleep(spec.grace_period_s + 1)  # past the grace period

    # A worker that never retries would wait forever on the RUNNING trial: bound its polling instead of hanging.
    waited = {"s": 0.0}

    def bounded_sleep(seconds: float) -> None:
        waited["s"] += seconds
        assert waited["s"] < 30, "the worker waited 30 s on the dead worker's trial: it was never failed and retried"
        time.sleep(seconds)

    monkeypatch.setattr(fleet, "time", types.SimpleNamespace(sleep=bounded_sleep, monotonic=time.monotonic))
    assert run_worker(url, name, progress=False, poll_s=0.2) == {"complete": 3, "failed": 0}

    ts = trials(url, name)
    assert_each_slot_complete_once(ts, 3)  # nothing lost, nothing counted twice
    [killed] = [t for t in ts if t.state.name == "FAIL"]
    assert killed._trial_id == claimed and killed.user_attrs["worker"] == "dead-host:1"
    [retry] = [t for t in ts if t.system_attrs.get("failed_trial") == killed.number]
    assert retry.state.name == "COMPLETE" and retry.user_attrs["slot"] == killed.user_attrs["slot"]
    assert retry.user_attrs["worker"] != "dead-host:1"
    [status] = study_status(url, name)
    assert status.done and status.counts["failed"] == 1 and status.counts["retried"] == 1


def test_passwords_never_reach_errors(capsys):
    from tuner.cli import main

    url = "postgresql+psycopg2://cgtune:s3cret-pw@127.0.0.1:1/nodb"
    for argv in (["status", "--storage", url], ["worker", "--storage", url, "--study", "x", "--no-progress"]):
        assert main(argv) == 2
        out, err = capsys.readouterr()
        assert "s3cret-pw" not in out + err and "cgtune:***@127.0.0.1:1" in err
        assert len(err.strip().splitlines()) == 1
    os.environ[STORAGE_ENV] = url
    try:
        assert main(["status"]) == 2
    finally:
        del os.environ[STORAGE_ENV]
    out, err = capsys.readouterr()
    assert "s3cret-pw" not in out + err and "***" in err
    assert hide_secret(f"could not connect {url} (password s3cret-pw)", url) == \
        "could not connect postgresql+psycopg2://cgtune:***@127.0.0.1:1/nodb (password ***)"
    # libpq also takes the password as a query parameter
    query = "postgresql+psycopg2://cgtune@127.0.0.1:1/nodb?password=s3cret-pw&sslmode=disable"
    assert main(["status", "--storage", query]) == 2
    out, err = capsys.readouterr()
    assert "s3cret-pw" not in out + err and "password=***" in err


def test_display_url_hides_passwords_in_the_user_part_and_the_query():
    from tuner.search.storage_url import display_url

    assert display_url("postgresql://u:pw@h/db") == "postgresql://u:***@h/db"
    assert display_url("postgresql://u@h/db?sslmode=require&password=pw") == \
        "postgresql://u@h/db?sslmode=require&password=***"
    assert display_url("sqlite:///x.db?timeout=5") == "sqlite:///x.db?timeout=5"
    assert "pw" not in display_url("not a url://u:pw@h?token=pw")


def test_worker_without_storage_is_one_line(capsys, monkeypatch):
    from tuner.cli import main

    monkeypatch.delenv(STORAGE_ENV, raising=False)
    assert main(["worker", "--study", "x"]) == 2
    _, err = capsys.readouterr()
    assert err.strip().splitlines() == [err.strip()] and STORAGE_ENV in err


def _tune(capsys, *argv):
    from tuner.cli import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_tune_workers_0_plans_and_a_rerun_collects(inputs, tmp_path, capsys, monkeypatch):
    wl, profile, _ = inputs
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    monkeypatch.setenv(STORAGE_ENV, url)
    out = tmp_path / "run"
    argv = ["tune", wl, "--profile", profile, "--out", out, "--trials", 10, "--workers", 0, "--no-progress"]
    code, stdout, err = _tune(capsys, *argv)
    assert code == 0, err
    assert "10 trials enqueued" in stdout and "cgtune worker --study" in stdout and not out.exists()
    name = stdout.split("fleet study ", 1)[1].split()[0]
    run_worker(url, name, progress=False)
    code, stdout, err = _tune(capsys, *argv)
    assert code == 0, err
    assert "0 trials enqueued" in stdout and "tuned list" in stdout
    summary = json.loads((out / "search.json").read_text())
    assert summary["study_name"] == name and summary["trials"]["complete"] == 10


@pytest.mark.postgres
@pytest.mark.slow
def test_tune_on_sqlite_and_on_postgres_give_the_same_answer_and_hide_the_password(inputs, tmp_path, capsys,
                                                                                  pg_url):
    wl, profile, _ = inputs
    password = "cgtune-test"
    results = {}
    for label, url, workers in (("sqlite", f"sqlite:///{tmp_path / 'one.db'}", 1), ("postgres", pg_url, 3)):
        out = tmp_path / label
        code, stdout, err = _tune(capsys, "tune", wl, "--profile", profile, "--out", out, "--trials", BUDGET,
                                  "--storage", url, "--workers", workers, "--no-progress")
        assert code == 0, err
        assert password not in stdout + err
        for path in out.rglob("*"):
            if path.is_file() and path.suffix in (".json", ".md", ".yaml", ".txt", ".csv"):
                assert password not in path.read_text(), path
        results[label] = json.loads((out / "search.json").read_text())
        code, stdout, err = _tune(capsys, "status", "--storage", url)
        assert code == 0 and password not in stdout + err and "[done]" in stdout
    assert results["postgres"]["storage"].startswith("postgresql+psycopg2://cgtune:***@")
    for key in ("chosen", "source", "study_best", "exact"):
        assert results["sqlite"][key] == results["postgres"][key], key


def test_status_lists_single_process_studies_too(inputs, tmp_path, capsys):
    from tuner.cli import main
    from tuner.search.study import SearchConfig, run_search

    run_search(inputs[2], SearchConfig(n_trials=6, progress=False), run_dir=tmp_path)  # sqlite:///tmp/study.db
    url = f"sqlite:///{tmp_path / 'study.db'}"
    assert main(["status", "--storage", url]) == 0
    out, _ = capsys.readouterr()
    assert "1 study" in out and "6 complete, 0 running" in out and "[single-process]" in out and "best " in out
    assert main(["status", "--storage", url, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    [study] = data["studies"]
    assert study["fleet"] is False and study["planned"] is None and study["counts"]["complete"] == 6
    assert study["best_sizes"] and study["best_value"] > 0
    assert main(["status", "--storage", url, "--study", "nope"]) == 2
    assert "no study 'nope'" in capsys.readouterr().err


@pytest.mark.slow
def test_three_local_workers_on_sqlite_never_claim_one_trial_twice(inputs, tmp_path):
    from tuner.search.workers import run_local_workers

    # SQLite ignores SELECT ... FOR UPDATE: without the claim lock two workers ran one trial and one crashed on
    # "Cannot tell a COMPLETE trial" (seen at 150 trials, 3 workers).
    url = f"sqlite:///{tmp_path / 'local.db'}"
    name, _ = create(url, inputs, n=90)
    assert run_local_workers(url, name, 3, timeout_s=60) == [0, 0, 0]
    ts = trials(url, name)
    assert_each_slot_complete_once(ts, 90)
    assert not [t for t in ts if t.state.name != "COMPLETE"]


def test_status_counts_gpu_measurements_apart_from_trials(inputs, tmp_path, capsys):
    import optuna

    from tuner.cli import main

    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    name, _ = create(url, inputs, n=6)
    run_worker(url, name, progress=False)
    study = optuna.load_study(study_name=name, storage=url)
    # As tuner.validate.validation records a measured list: a tiny measured value.
    study.add_trial(optuna.trial.create_trial(
        state=optuna.trial.TrialState.COMPLETE, values=[1e-6], constraints={"kv_shortfall_gib": -1.0},
        user_attrs={"source": "gpu-validation", "evaluation": {"capture_sizes": [1]}}))
    [status] = study_status(url, name)
    assert status.counts["complete"] == 6 and status.counts["gpu_validated"] == 1 and status.done
    assert status.best_value > 1e-3  # a measurement is not ranked against the model's predictions
    assert main(["status", "--storage", url]) == 0
    assert "1 GPU-validated lists" in capsys.readouterr().out


def test_a_bug_in_a_trial_fails_it_with_the_reason_and_stops_the_worker(inputs, tmp_path, monkeypatch):
    import tuner.search.workers

    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    name, _ = create(url, inputs, n=6)
    real = tuner.search.workers._evaluate

    def buggy(objective, trial):
        if trial.user_attrs["slot"] == 2:
            raise KeyError("synthetic bug")
        return real(objective, trial)

    monkeypatch.setattr(tuner.search.workers, "_evaluate", buggy)
    with pytest.raises(KeyError):
        run_worker(url, name, progress=False)
    [failed] = [t for t in trials(url, name) if t.state.name == "FAIL"]
    assert failed.user_attrs["slot"] == 2 and "synthetic bug" in failed.user_attrs["fail_reason"]
    monkeypatch.setattr(tuner.search.workers, "_evaluate", real)
    assert run_worker(url, name, progress=False) == {"complete": 3, "failed": 0}  # the rest; no retry of the bug
    [status] = study_status(url, name)
    assert status.done and status.counts == {**status.counts, "complete": 5, "failed": 1, "retried": 0}


def test_tune_fails_when_its_local_workers_fail_and_leave_the_study_unfinished(inputs, tmp_path, capsys,
                                                                               monkeypatch):
    import tuner.search.workers

    # A stand-in: one worker crashed at once.
    monkeypatch.setattr(tuner.search.workers, "run_local_workers", lambda *a, **k: [1, 0])
    wl, profile, _ = inputs
    code, stdout, err = _tune(capsys, "tune", wl, "--profile", profile, "--out", tmp_path / "run", "--trials", 8,
                              "--storage", f"sqlite:///{tmp_path / 'f.db'}", "--workers", 2, "--no-progress")
    assert code == 1 and "local workers exited with [1, 0]" in err and "unfinished" in err
    assert not (tmp_path / "run").exists()
