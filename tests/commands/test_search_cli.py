"""`cgtune search`, `tune` and `report` on hand-made profiles: files parse back, reruns resume, bad input is one
line with exit 2 and leaves nothing in --out."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/handmade_profiles.py (import-mode=importlib)
from handmade_profiles import MIB, handmade_profile, handmade_spec, mixed_traffic, write_handmade_inputs  # noqa: E402
from cli_runner import run  # noqa: E402

from tuner.report.run import PLOTS, SUMMARY_KEYS  # noqa: E402
from tuner.engines.vllm.defaults import default_capture_sizes  # noqa: E402

SPEC = handmade_spec(name="cli-hand", max_num_seqs=24, num_speculative_tokens=1, max_num_batched_tokens=64,
                     traffic=mixed_traffic(24, 64))


@pytest.fixture()
def inputs(tmp_path):
    return write_handmade_inputs(tmp_path, SPEC, list(range(1, 65)), total_memory_bytes=400 * MIB,
                                 standalone_bytes=lambda w: 2 * w * MIB, delta_bytes=lambda w: 2 * MIB)


def test_search_writes_vllm_files_that_parse_and_pass_vllm_rules(inputs, tmp_path, capsys):
    wl_path, profile, _ = inputs
    out = tmp_path / "run"
    code, stdout, err = run(capsys, "search", wl_path, "--profile", profile, "--out", out, "--trials", 15,
                            "--no-progress")
    assert code == 0, err
    # tiny: no checkpoint, a value vLLM refuses stands in its place on the printed command (shell-quoted)
    assert "tuned list" in stdout and "vllm serve '<CHECKPOINT: set model.name in the workload" in stdout
    cc = json.loads((out / "compilation_config.json").read_text())
    sizes = cc["cudagraph_capture_sizes"]
    assert sizes == sorted(set(sizes)) and cc["max_cudagraph_capture_size"] == sizes[-1] and sizes[-1] <= 64
    kept = default_capture_sizes(24, 1, 64, cudagraph_capture_sizes=sizes, max_cudagraph_capture_size=sizes[-1])
    assert kept.sizes == sizes
    assert yaml.safe_load((out / "vllm-serve.yaml").read_text())["compilation-config"] == cc
    summary = json.loads((out / "summary.json").read_text())
    for key in SUMMARY_KEYS:
        assert set(summary[key]) >= {"expected_step_ms", "graph_memory_bytes", "kv_available_bytes", "feasible"}
    assert summary["shipped"]["capture_sizes"] == sizes and summary["required_kv_bytes"] == (64 // 16 + 1) * 16 * 512
    assert summary["tuned"]["expected_step_ms"] <= summary["default"]["expected_step_ms"]
    assert not (out / "report.md").exists()  # search leaves the report to `cgtune report` / `tune`

    # A rerun into the same directory resumes the study: nothing left to run, same answer.
    code, stdout, _ = run(capsys, "search", wl_path, "--profile", profile, "--out", out, "--trials", 15,
                          "--no-progress")
    assert code == 0 and "0 run now" in stdout
    assert json.loads((out / "compilation_config.json").read_text()) == cc

    code, stdout, err = run(capsys, "report", out)
    assert code == 0, err
    assert (out / "report.md").read_text().startswith("# cgtune report: cli-hand")
    assert all((out / "plots" / p).stat().st_size > 0 for p in PLOTS)
    assert not any(p.name.startswith(".cgtune-staging") for p in out.iterdir())


def test_tune_with_a_profile_writes_the_report(inputs, tmp_path, capsys):
    wl_path, profile, _ = inputs
    out = tmp_path / "tuned"
    code, stdout, err = run(capsys, "tune", wl_path, "--profile", profile, "--out", out, "--trials", 10,
                            "--objective", "pareto", "--no-progress")
    assert code == 0, err
    assert "[1/3]" in stdout and "[3/3]" in stdout
    report = (out / "report.md").read_text()
    assert "| vLLM default |" in report and "| widest capture (PR 50488) |" in report and "Crossover" in report


def test_tune_without_profile_or_gpu_says_what_is_needed(inputs, tmp_path, capsys, monkeypatch):
    import tuner.commands.tune as tune

    monkeypatch.setattr(tune, "gpu_available", lambda: (False, "no CUDA device is visible"))
    wl_path, _, _ = inputs
    code, _, err = run(capsys, "tune", wl_path, "--out", tmp_path / "none")
    assert code == 2
    assert "no --profile given and no CUDA device is visible" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "none").exists()


def bad_profile(tmp_path, workload, kind):
    if kind == "shape":
        return handmade_profile(tmp_path, workload, [1, 2, 4], shape_override={"hidden_size": 128})
    if kind == "budget":  # 180 MiB x 0.9 < weights + activations: not even the empty list fits
        return handmade_profile(tmp_path, workload, [1, 2, 4], total_memory_bytes=160 * MIB)
    path = handmade_profile(tmp_path, workload, [1, 2, 4])
    lines = path.read_text().splitlines()
    if kind == "column":
        lines = [line.rsplit(",", 1)[0] for line in lines]
    else:  # a NaN latency where a number is needed
        lines[1] = lines[1].replace(lines[1].split(",")[2], "nan", 1)
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("kind, message", [
    ("shape", "another model shape"),
    ("column", "missing column 'capture_s'"),
    ("nan", "not a finite number"),
    ("budget", "not even the empty one"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(inputs, tmp_path, capsys, kind, message):
    wl_path, _, workload = inputs
    profile = bad_profile(tmp_path / kind, workload, kind)
    out = tmp_path / f"out-{kind}"
    code, _, err = run(capsys, "search", wl_path, "--profile", profile, "--out", out, "--trials", 5)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_report_on_a_directory_without_a_run_is_an_error(tmp_path, capsys):
    code, _, err = run(capsys, "report", tmp_path)
    assert code == 2 and "not a cgtune search or tune output directory" in err


def test_tune_without_profile_profiles_first_when_a_gpu_is_there(inputs, tmp_path, capsys, monkeypatch,
                                                                  gpu_host_without_vllm):
    """The wiring only: the measurement is replaced by a hand-made profile (no GPU here)."""
    from types import SimpleNamespace

    import tuner.commands.tune as tune
    import tuner.measure.profile as measure

    seen = {}

    def fake_profile_workload(workload, out_dir, *, widths, **kwargs):
        seen["widths"] = widths
        path = handmade_profile(Path(out_dir), workload, list(range(1, 65)), total_memory_bytes=400 * MIB,
                                name=workload.name)
        return SimpleNamespace(csv_path=path, complete=True)

    monkeypatch.setattr(tune, "gpu_available", lambda: (True, "fake GPU"))
    monkeypatch.setattr(measure, "profile_workload", fake_profile_workload)
    wl_path, _, _ = inputs
    out = tmp_path / "gpu-run"
    code, stdout, err = run(capsys, "tune", wl_path, "--out", out, "--trials", 5, "--max-widths", 10,
                            "--no-progress")
    assert code == 0, err
    assert "[1/3] profile: measuring cli-hand on fake GPU" in stdout
    assert len(seen["widths"]) <= 10
    assert (out / "profile-sweep" / "cli-hand.csv").is_file() and (out / "report.md").is_file()
