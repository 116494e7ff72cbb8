"""Run directories stay consistent (another run is refused or cleared with --force, no stale output survives), Ctrl-C
in `search`/`tune` says what it kept and how to resume, storage URLs name their driver, and every --out creates its
missing parents. Hand-made profiles (test fixtures, never measurements)."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/handmade_profiles.py (import-mode=importlib)
from handmade_profiles import MIB, handmade_profile, handmade_spec, mixed_traffic, write_handmade_inputs  # noqa: E402
from cli_runner import run  # noqa: E402

from tuner.report.run import PLOTS  # noqa: E402

SPEC = handmade_spec(name="dir-hand", max_num_seqs=24, num_speculative_tokens=1, max_num_batched_tokens=64,
                     traffic=mixed_traffic(24, 64))
OTHER = handmade_spec(name="dir-other", max_num_seqs=16, num_speculative_tokens=1, max_num_batched_tokens=64,
                      traffic=mixed_traffic(16, 64))
PROFILE = dict(total_memory_bytes=400 * MIB, standalone_bytes=lambda w: 2 * w * MIB, delta_bytes=lambda w: 2 * MIB)


def _inputs(folder: Path, spec: dict):
    folder.mkdir()
    return write_handmade_inputs(folder, spec, list(range(1, 65)), **PROFILE)


@pytest.fixture()
def inputs(tmp_path):
    return _inputs(tmp_path / "in", SPEC)


@pytest.fixture()
def other(tmp_path):
    return _inputs(tmp_path / "other", OTHER)


def search(capsys, wl, profile, out, *extra, command="search", trials=6):
    return run(capsys, command, wl, "--profile", profile, "--out", out, "--trials", trials, "--no-progress", *extra)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------------------------------- another run in DIR
def test_a_dir_holding_another_workloads_run_is_refused_then_cleared_with_force(inputs, other, tmp_path, capsys):
    out = tmp_path / "run"
    code, _, err = search(capsys, *other[:2], out, command="tune")
    assert code == 0, err
    before = snapshot(out)

    code, stdout, err = search(capsys, *inputs[:2], out)
    assert code == 2 and stdout == ""
    assert err.count("\n") == 1 and err.startswith("cgtune search: error: --out: ")
    assert f"holds the run of workload dir-other (hash {other[2].content_hash})" in err
    assert f"not of workload dir-hand (hash {inputs[2].content_hash})" in err
    assert "pass --force to clear it, or choose another --out" in err
    assert snapshot(out) == before  # refused: nothing touched

    code, stdout, err = search(capsys, *inputs[:2], out, "--force")
    assert code == 0, err
    assert "--force: cleared" in stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["workload"] == {"name": "dir-hand", "hash": inputs[2].content_hash}
    assert yaml.safe_load((out / "workload.yaml").read_text())["name"] == "dir-hand"
    # tune's report and plots described dir-other: search writes neither, so none is left beside the new files.
    assert not (out / "report.md").exists() and not (out / "plots").exists()
    import optuna

    names = [s.study_name for s in optuna.get_all_study_summaries(f"sqlite:///{out / 'study.db'}")]
    assert names and all("dir-hand" in n for n in names)  # the old study went with the old run

    # --force never removes the new run's own inputs, even when they are the directory's copies.
    profile_copy = (out / "profile.csv").read_bytes()
    code, _, err = search(capsys, other[0], out / "profile.csv", out, "--force")
    assert code == 0, err
    assert (out / "profile.csv").read_bytes() == profile_copy and (out / "profile.json").is_file()
    assert json.loads((out / "summary.json").read_text())["workload"]["name"] == "dir-other"


def test_another_profile_of_the_same_workload_is_another_run(inputs, tmp_path, capsys):
    wl, profile, workload = inputs
    out = tmp_path / "run"
    assert search(capsys, wl, profile, out)[0] == 0
    remeasured = handmade_profile(tmp_path / "p2", workload, list(range(1, 65)), eager_ms=lambda w: 2.0 + 0.01 * w,
                                  total_memory_bytes=400 * MIB, name="dir-hand")
    code, _, err = search(capsys, wl, remeasured, out)
    assert code == 2 and "on profile" in err and str(remeasured) in err and "--force" in err
    assert search(capsys, wl, profile, out)[0] == 0  # the same inputs again: a rerun, resumed, never refused


def test_stale_outputs_of_an_earlier_run_go(inputs, tmp_path, capsys):
    wl, profile, _ = inputs
    out = tmp_path / "run"
    assert search(capsys, wl, profile, out, command="tune")[0] == 0
    assert (out / "report.md").is_file() and all((out / "plots" / p).is_file() for p in PLOTS)
    (out / "plots" / "plot-an-older-cgtune-drew.png").write_bytes(b"\x89PNG stale")
    # A validation of some other list: its section is not kept, so its plot is stale too (validation.json stays).
    (out / "validation.json").write_text(json.dumps({"tuned": {"capture_sizes": [999]}, "emitted": "tuned"}))
    (out / "plots" / "validation.png").write_bytes(b"\x89PNG stale")

    code, _, err = run(capsys, "report", out)
    assert code == 0, err
    assert sorted(p.name for p in (out / "plots").iterdir()) == sorted(PLOTS)
    assert (out / "validation.json").is_file() and "cgtune validate: begin" not in (out / "report.md").read_text()

    assert search(capsys, wl, profile, out)[0] == 0  # search renders no report: tune's report and plots go
    assert not (out / "report.md").exists() and not (out / "plots").exists()
    assert {"summary.json", "search.json", "compilation_config.json", "vllm-serve.yaml"} <= set(snapshot(out))


def test_report_refuses_a_summary_of_another_run_unless_forced(inputs, tmp_path, capsys):
    wl, profile, _ = inputs
    out = tmp_path / "run"
    assert search(capsys, wl, profile, out, command="tune")[0] == 0
    summary = json.loads((out / "summary.json").read_text())
    summary["workload"] = {"name": "someone-else", "hash": "0123456789ab"}
    (out / "summary.json").write_text(json.dumps(summary))
    code, _, err = run(capsys, "report", out)
    assert code == 2 and err.count("\n") == 1
    assert "holds the run of workload someone-else (hash 0123456789ab)" in err and "--force" in err
    code, _, err = run(capsys, "report", out, "--force")
    assert code == 0, err
    assert json.loads((out / "summary.json").read_text())["workload"]["name"] == "dir-hand"


def test_tune_refuses_another_workloads_dir_before_measuring(inputs, other, tmp_path, capsys, monkeypatch,
                                                             gpu_host_without_vllm):
    import tuner.commands.tune as tune

    out = tmp_path / "run"
    assert search(capsys, *other[:2], out)[0] == 0
    monkeypatch.setattr(tune, "gpu_available", lambda: (True, "fake GPU"))
    measured = []
    monkeypatch.setattr(tune.TuneCommand, "_profile", staticmethod(lambda *a, **k: measured.append(1)))
    code, _, err = run(capsys, "tune", inputs[0], "--out", out, "--trials", 5, "--no-progress")
    assert code == 2 and "holds the run of workload dir-other" in err and "(to be measured)" in err
    assert measured == []


# ---------------------------------------------------------------------------------------------- Ctrl-C
def _interrupt_objective(monkeypatch, after: int) -> None:
    """The study's objective raises KeyboardInterrupt (as Ctrl-C would) on call `after + 1`."""
    import tuner.search.study as search_mod

    real = search_mod.make_objective
    calls = []

    def make(model, objective):
        inner = real(model, objective)

        def objective_fn(trial):
            calls.append(1)
            if len(calls) > after:
                raise KeyboardInterrupt
            return inner(trial)

        return objective_fn

    monkeypatch.setattr(search_mod, "make_objective", make)


@pytest.mark.parametrize("command", ["search", "tune"])
def test_ctrl_c_in_the_study_says_what_was_kept_and_how_to_resume(inputs, tmp_path, capsys, monkeypatch, command):
    wl, profile, _ = inputs
    out = tmp_path / "run"
    _interrupt_objective(monkeypatch, after=8)  # vLLM's default and the seeds, then a sampled trial
    code, stdout, err = search(capsys, wl, profile, out, command=command, trials=20)
    assert code == 130
    assert "Traceback" not in err and "KeyboardInterrupt" not in err and err.count("\n") == 1, err
    assert err.startswith(f"cgtune {command}: interrupted: kept study cgtune-dir-hand-")
    assert (f"in sqlite:///{out.resolve() / 'study.db'} (8 of 20 trials finished, 1 interrupted, kept as pruned: it "
            f"counts toward the 20); resume with: cgtune {command} ") in err
    assert not (out / "summary.json").exists()  # no run files from a search that did not finish

    monkeypatch.undo()
    resume = shlex.split(err.split("resume with: ", 1)[1])
    assert resume[:2] == ["cgtune", command] and "--force" not in resume
    code, stdout, err = run(capsys, *resume[1:], "--no-progress")
    assert code == 0, err
    assert "11 run now" in stdout  # 8 complete + the interrupted one (pruned) counted: 11 more reach 20
    # Every trial of the 20 is counted somewhere in the closing line, the pruned one too.
    assert "20 trials (19 feasible, 0 infeasible, 0 failed, 1 pruned (interrupted), 11 run now)" in stdout
    assert json.loads((out / "summary.json").read_text())["study"]["total"] == 20


def test_ctrl_c_outside_the_objective_is_one_line_too(inputs, tmp_path, capsys, monkeypatch):
    # Between trials (a callback, a storage write) optuna re-raises without logging: the same one line.
    import optuna

    real = optuna.study.Study.optimize

    def optimize(self, func, n_trials=None, callbacks=None, **kw):
        def stop_after_three(study, trial):
            if trial.number == 2:
                raise KeyboardInterrupt

        return real(self, func, n_trials=n_trials, callbacks=[*(callbacks or []), stop_after_three], **kw)

    monkeypatch.setattr(optuna.study.Study, "optimize", optimize)
    wl, profile, _ = inputs
    code, _, err = search(capsys, wl, profile, tmp_path / "run", trials=10)
    assert code == 130 and err.count("\n") == 1 and "Traceback" not in err
    assert "(3 of 10 trials finished); resume with: cgtune search " in err


def test_ctrl_c_while_writing_says_the_study_is_complete(inputs, tmp_path, capsys, monkeypatch):
    import tuner.report.run as report

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "write_run", interrupted)
    wl, profile, _ = inputs
    code, _, err = search(capsys, wl, profile, tmp_path / "run")
    assert code == 130 and err.count("\n") == 1
    assert "interrupted while writing" in err and "is complete (6 trials)" in err and "rerun to write the files" in err


def test_ctrl_c_while_profiling_in_tune_says_what_the_sweep_kept(inputs, tmp_path, capsys, monkeypatch,
                                                                  gpu_host_without_vllm):
    import tuner.commands.tune as tune
    import tuner.measure.profile as measure

    def sweep_then_interrupt(workload, out_dir, *, widths, **kwargs):
        handmade_profile(Path(out_dir), workload, [1, 2, 4], name=workload.name)  # the table after three widths
        raise KeyboardInterrupt

    monkeypatch.setattr(tune, "gpu_available", lambda: (True, "fake GPU"))
    monkeypatch.setattr(measure, "profile_workload", sweep_then_interrupt)
    out = tmp_path / "run"
    code, _, err = run(capsys, "tune", inputs[0], "--out", out, "--no-progress")
    assert code == 130 and err.count("\n") == 1
    assert f"interrupted while profiling: 3 measured widths kept in {out / 'profile-sweep'}/" in err
    assert err.rstrip().endswith(f"resume with: cgtune tune {inputs[0]} --out {out} --trials 300")


# ---------------------------------------------------------------------------------------------- storage URLs
def test_plain_postgresql_urls_name_the_driver_the_postgres_extra_installs(monkeypatch):
    from tuner.search.storage_url import StorageError, engine_url

    # psycopg2-binary (the `postgres` and `test` extras) opens a plain postgresql:// URL, whatever SQLAlchemy's
    # own default driver is (psycopg 3 from SQLAlchemy 2.1 on).
    assert engine_url("postgresql://u:pw@db:5432/x") == "postgresql+psycopg2://u:pw@db:5432/x"
    assert engine_url("postgresql+psycopg2://u:pw@db/x") == "postgresql+psycopg2://u:pw@db/x"
    assert engine_url("sqlite:////tmp/study.db") == "sqlite:////tmp/study.db"
    # Without psycopg2 (and without psycopg): one line, the password hidden, what to install.
    monkeypatch.setitem(sys.modules, "psycopg2", None)
    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(StorageError) as info:
        engine_url("postgresql://u:s3cret@db/x")
    message = str(info.value)
    assert message.startswith("storage postgresql://u:***@db/x: its database driver (psycopg, module 'psycopg') is "
                              "not installed: pip install 'cgtune[postgres]' (psycopg2-binary)")
    assert "s3cret" not in message and "\n" not in message


def test_search_with_a_missing_driver_is_one_line_and_writes_nothing(inputs, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)
    wl, profile, _ = inputs
    out = tmp_path / "run"
    code, _, err = search(capsys, wl, profile, out, "--storage", "postgresql+psycopg://u:s3cret@127.0.0.1:1/db")
    assert code == 2 and err.count("\n") == 1 and "s3cret" not in err
    assert "its database driver (psycopg, module 'psycopg') is not installed" in err
    assert not out.exists()


def test_a_plain_postgresql_url_reaches_the_server(inputs, tmp_path, capsys):
    # Nothing listens on port 1: the error is the driver's (psycopg2 was loaded), as one line, password hidden.
    wl, profile, _ = inputs
    code, _, err = search(capsys, wl, profile, tmp_path / "run", "--storage", "postgresql://u:s3cret@127.0.0.1:1/db")
    assert code == 2 and err.count("\n") == 1 and "s3cret" not in err
    assert "cannot open storage postgresql://u:***@127.0.0.1:1/db: " in err and "not installed" not in err


@pytest.mark.postgres
def test_search_on_postgresql_with_a_plain_url(inputs, tmp_path, capsys):
    from sqlalchemy.engine import make_url

    url = make_url(os.environ["CGTUNE_TEST_POSTGRES_URL"]).set(drivername="postgresql")
    plain = url.render_as_string(hide_password=False)
    assert plain.startswith("postgresql://")
    wl, profile, _ = inputs
    code, stdout, err = search(capsys, wl, profile, tmp_path / "run", "--storage", plain, "--seed", "7")
    assert code == 0, err
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["study"]["storage"].startswith("postgresql://")


# ---------------------------------------------------------------------------------------------- --out parents
def test_out_creates_missing_parents_and_refuses_a_file_on_the_way(inputs, tmp_path, capsys):
    wl, profile, _ = inputs
    nested = tmp_path / "a" / "b" / "run"
    assert search(capsys, wl, profile, nested)[0] == 0
    assert (nested / "compilation_config.json").is_file()

    (tmp_path / "file").write_text("not a folder\n")
    for command in ("search", "tune"):
        code, _, err = search(capsys, wl, profile, tmp_path / "file" / "run", command=command)
        assert code == 2 and err.count("\n") == 1
        assert f"--out: '{tmp_path / 'file' / 'run'}' cannot be created: '{tmp_path / 'file'}' is a file" in err
    code, _, err = search(capsys, wl, profile, tmp_path / "file")
    assert code == 2 and "exists and is not a directory" in err
    # `validate --workload --profile` writes RUN_DIR itself: the same rule, checked before CUDA is asked for.
    code, _, err = run(capsys, "validate", tmp_path / "file" / "run", "--workload", wl, "--profile", profile)
    assert code == 2 and err.count("\n") == 1 and "run_dir: " in err and "' is a file" in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_out_under_a_read_only_folder_is_refused(inputs, tmp_path, capsys):
    wl, profile, _ = inputs
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    code, _, err = search(capsys, wl, profile, locked / "run")
    assert code == 2 and "is not writable" in err


# ---------------------------------------------------------------------------------------------- the checkpoint
def test_vllm_serve_yaml_names_the_checkpoint_the_workload_names(tmp_path, capsys):
    spec = dict(SPEC, name="ft-hand", model={**SPEC["model"], "name": "my-org/tiny-ft"})
    wl, profile, workload = _inputs(tmp_path / "ft", spec)
    assert workload.model.checkpoint == "my-org/tiny-ft"
    code, stdout, err = search(capsys, wl, profile, tmp_path / "run")
    assert code == 0, err
    assert yaml.safe_load((tmp_path / "run" / "vllm-serve.yaml").read_text())["model"] == "my-org/tiny-ft"
    assert "vllm serve my-org/tiny-ft --dtype float32 " in stdout
    # The tiny preset has no checkpoint: never a missing model key (vLLM would serve its own default model), a value
    # vLLM refuses and a comment saying what goes there.
    wl, profile, _ = _inputs(tmp_path / "tiny", SPEC)
    assert search(capsys, wl, profile, tmp_path / "run-tiny")[0] == 0
    serve_text = (tmp_path / "run-tiny" / "vllm-serve.yaml").read_text()
    value = "<CHECKPOINT: set model.name in the workload, or put its Hugging Face id or path here>"
    assert yaml.safe_load(serve_text)["model"] == value
    assert f"# model: {value} stands for the served checkpoint (vLLM refuses it as it is)" in serve_text
