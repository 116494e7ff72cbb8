"""`cgtune tune --validate K` wiring on a CPU: no CUDA is one line before any search work, and with a scripted
stand-in backend the measured winner is emitted, recorded in the study and never ranked as a model trial."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ helpers (import-mode=importlib)
from handmade_profiles import MIB, handmade_spec, mixed_traffic, write_handmade_inputs  # noqa: E402
from cli_runner import run  # noqa: E402


SPEC = handmade_spec(name="tune-validate", max_num_seqs=12, num_speculative_tokens=1, max_num_batched_tokens=32,
                     traffic=mixed_traffic(12, 32))


@pytest.fixture()
def inputs(tmp_path):
    wl_path, profile, _ = write_handmade_inputs(tmp_path, SPEC, list(range(1, 33)),
                                                standalone_bytes=lambda w: 2 * w * MIB)
    return wl_path, profile


def test_without_cuda_validate_is_one_line_and_writes_nothing(inputs, tmp_path, capsys, monkeypatch):
    import tuner.validate.validation
    from tuner.validate.validation import ValidationError

    def no_cuda():
        raise ValidationError("no CUDA device is visible: validation captures and replays graphs on the GPU")

    monkeypatch.setattr(tuner.validate.validation, "require_cuda", no_cuda)  # as on any machine without a GPU
    wl, profile = inputs
    code, out, err = run(capsys, "tune", wl, "--profile", profile, "--out", tmp_path / "run", "--validate", 2,
                         "--trials", 5, "--no-progress")
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [err.strip()] and "--validate: no CUDA device" in err
    assert not (tmp_path / "run").exists()


def test_real_require_cuda_without_a_gpu(inputs, tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    wl, profile = inputs
    code, _, err = run(capsys, "tune", wl, "--profile", profile, "--out", tmp_path / "run", "--validate", 1)
    assert code == 2 and "no CUDA device" in err and not (tmp_path / "run").exists()


@pytest.fixture()
def scripted(monkeypatch, gpu_host_without_vllm):
    """Stand-in for the GPU: the scripted device of tests/test_validate.py, whose numbers owe nothing to the model
    (test fixtures): set `script` to (per-list scripts, the script of any other list) before the command runs."""
    import tuner.validate.validation

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from test_validate import DeviceScript

    made = {}

    def build(model, lists, device, **kwargs):
        made["backend"] = DeviceScript(model, *made["script"])
        return made["backend"]

    monkeypatch.setattr(tuner.validate.validation, "require_cuda", lambda: "cpu")
    monkeypatch.setattr(tuner.validate.validation, "build_backend", build)
    return made


@pytest.mark.slow
def test_validate_ships_the_measured_winner_and_keeps_it_out_of_the_model_ranking(inputs, tmp_path, capsys,
                                                                                    scripted):
    import optuna

    from tuner.decision.run_dir import load_run
    from tuner.search.study import SearchConfig, run_search
    from tuner.validate.trace import sample_trace

    wl, profile = inputs
    out = tmp_path / "run"
    # First a plain search, to learn the model's pick; then the scripted device measures vLLM's default fastest
    # (0.3 + 0.01 ms per token against 0.5 + 0.01 for every other list, 50 MiB each: all fit).
    code, _, err = run(capsys, "search", wl, "--profile", profile, "--out", out, "--trials", 12, "--no-progress")
    assert code == 0, err
    model, search = load_run(out)
    default = (1, 2, 4, 8, 16, 24, 32)  # vLLM's grid up to max_num_batched_tokens 32
    assert model.default_sizes == default and search.chosen.capture_sizes != default
    scripted["script"] = ({default: (50 * MIB, 0.3, 0.01)}, (50 * MIB, 0.5, 0.01))
    code, stdout, err = run(capsys, "tune", wl, "--profile", profile, "--out", out, "--trials", 12, "--no-progress",
                            "--validate", 3, "--validate-steps", 300)
    assert code == 0, err
    assert "validate:" in stdout and "shipped" in stdout
    record = json.loads((out / "validation.json").read_text())
    assert record["command"].endswith("--validate 3") and record["emitted"] == "default"
    replayed = sample_trace(model.workload.steps(), 300, seed=0)
    assert record["default"]["measured_step_ms"] == pytest.approx(
        0.3 + 0.01 * sum(s.num_tokens for s in replayed) / 300)
    _, shipped = load_run(out)
    assert shipped.source == "gpu-validated" and shipped.chosen.capture_sizes == default
    cc = json.loads((out / "compilation_config.json").read_text())
    assert cc["cudagraph_capture_sizes"] == list(default)
    assert any("chosen on the GPU: 'default'" in n for n in shipped.notes)

    study = optuna.load_study(study_name=search.study_name, storage=f"sqlite:///{out / 'study.db'}")
    gpu = [t for t in study.trials if t.user_attrs.get("source") == "gpu-validation"]
    assert gpu
    # A measured value far below every prediction must still not become the study's best.
    [fake] = [t for t in gpu if t.user_attrs["list_name"] == "default"]  # slower than the best by prediction
    assert model.evaluate(model.default_sizes).expected_step_ms > search.study_best.expected_step_ms
    study.add_trial(optuna.trial.create_trial(
        state=optuna.trial.TrialState.COMPLETE, values=[1e-6], user_attrs=dict(fake.user_attrs),
        constraints={"kv_shortfall_gib": -1.0}))
    again = run_search(model, SearchConfig(n_trials=len(study.trials), progress=False), run_dir=out)
    assert again.study_best is not None
    assert again.study_best.expected_step_ms == pytest.approx(search.study_best.expected_step_ms)


def test_validate_when_nothing_fits_returns_1_and_removes_the_vllm_files(inputs, tmp_path, capsys, scripted):
    wl, profile = inputs
    out = tmp_path / "run"
    scripted["script"] = ({}, (10 * 1024 * MIB, 0.5, 0.01))  # every measured pool 10 GiB, far over the budget
    code, _, err = run(capsys, "tune", wl, "--profile", profile, "--out", out, "--trials", 8, "--no-progress",
                       "--validate", 2, "--validate-steps", 200)
    assert code == 1
    assert len(err.strip().splitlines()) == 1 and "no validated list fits" in err
    assert not (out / "compilation_config.json").exists() and not (out / "vllm-serve.yaml").exists()
    assert (out / "validation.json").is_file()
