"""Which vLLM release's rules a workload runs under (`tuner.engines.vllm.versions`, `serving.vllm_version`,
`--vllm-version`), and the settings only one release has: bad values one line naming the field, exit 2."""

from __future__ import annotations

import importlib.metadata
import logging
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/ helpers (import-mode=importlib)
from cli_runner import run  # noqa: E402
from handmade_profiles import handmade_spec  # noqa: E402

from tuner.engines.vllm import versions  # noqa: E402
from tuner.workload.spec import WorkloadError, parse_workload  # noqa: E402


def _workload(**serving: object):
    return parse_workload(handmade_spec(**serving))


def test_the_workload_pin_beats_the_flag_which_beats_the_installed_vllm(monkeypatch):
    monkeypatch.setenv(versions.VERSION_ENV, "0.33")
    assert _workload(vllm_version="0.34").engine.version == "0.34"
    assert _workload().engine.version == "0.33"
    monkeypatch.setenv(versions.VERSION_ENV, "0.34")
    assert _workload().engine.version == "0.34" and _workload(vllm_version="0.33").engine.version == "0.33"
    monkeypatch.delenv(versions.VERSION_ENV)
    monkeypatch.setattr(versions, "installed_version", lambda: "0.33")
    assert _workload().engine.version == "0.33"
    monkeypatch.setattr(versions, "installed_version", lambda: None)  # a fresh machine: the default
    assert _workload().engine.version == versions.DEFAULT_VERSION == "0.34"


def test_an_installed_vllm_cgtune_does_not_speak_falls_back_to_the_default_with_one_warning(monkeypatch, caplog):
    monkeypatch.delenv(versions.VERSION_ENV)
    monkeypatch.setattr(versions, "installed_version", lambda: "0.36")
    monkeypatch.setattr(versions, "_WARNED", set())
    with caplog.at_level(logging.WARNING):
        assert versions.resolve_version(None) == "0.34" and versions.resolve_version("auto") == "0.34"
    assert [r.getMessage() for r in caplog.records] == [
        "vLLM 0.36 is installed; cgtune speaks vLLM 0.33, 0.34: a workload that does not pin serving.vllm_version runs "
        "under 0.34's rules"]


def test_the_installed_version_is_read_from_the_vllm_distribution(monkeypatch):
    monkeypatch.setattr(importlib.metadata, "version", lambda name: {"vllm": "0.34.2"}[name])
    assert versions.installed_version() == "0.34"

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert versions.installed_version() is None


def test_yaml_reads_an_unquoted_version_as_a_number_and_it_still_names_the_release():
    assert _workload(vllm_version=0.34).engine.version == "0.34"
    assert _workload(vllm_version=0.33).engine.version == "0.33"


@pytest.mark.parametrize("serving, needle", [
    ({"vllm_version": "0.35"}, "serving.vllm_version: '0.35' must be one of auto, 0.33, 0.34"),
    ({"vllm_version": "0.33", "decode_cudagraph_capture_request_sizes": [1, 2]},
     "serving.decode_cudagraph_capture_request_sizes: a vLLM 0.34 setting, but serving.vllm_version is 0.33"),
    ({"vllm_version": "0.34", "model_runner": "v1"}, "serving.model_runner: 'v1': vLLM 0.34 removed Model Runner V1"),
    ({"vllm_version": "0.34", "prefill_cudagraph_capture_token_sizes": [4, 0]},
     "serving.prefill_cudagraph_capture_token_sizes: [4, 0] must be a list of positive integers"),
    ({"vllm_version": "0.34", "max_decode_cudagraph_capture_tokens": 0},
     "serving.max_decode_cudagraph_capture_tokens: 0 must be >= 1"),
])
def test_a_setting_the_release_does_not_have_is_refused_naming_the_field(serving, needle):
    with pytest.raises(WorkloadError) as exc:
        _workload(**serving)
    assert str(exc.value).startswith(needle), str(exc.value)


def test_a_bad_version_on_the_command_line_is_one_line_and_exit_2(tmp_path, capsys):
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(handmade_spec(vllm_version="0.9")))
    code, out, err = run(capsys, "defaults", path)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "serving.vllm_version: '0.9'" in err
    code, out, err = run(capsys, "defaults", "--max-num-seqs", 8, "--vllm-version", "0.32")
    assert code == 2 and out == "" and "--vllm-version: invalid choice: '0.32'" in err


def test_the_flag_applies_to_one_command_and_is_restored_after_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(versions.VERSION_ENV, "0.33")
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(handmade_spec(max_num_seqs=128, num_speculative_tokens=16,
                                                 max_num_batched_tokens=8192)))
    code, out, _ = run(capsys, "defaults", path, "--json", "--vllm-version", "0.34")
    assert code == 0 and '"vllm_version": "0.34"' in out and '"decode_cudagraph_capture_request_sizes"' in out
    code, out, _ = run(capsys, "defaults", path, "--json")
    assert code == 0 and '"decode_cudagraph_capture_request_sizes"' not in out
    assert versions.resolve_version(None) == "0.33"


def test_a_run_is_re_rendered_and_checked_under_the_release_it_was_searched_under(tmp_path, capsys, monkeypatch):
    # A 0.34 run of a workload that leaves vllm_version auto, re-rendered where the environment (or the installed vLLM)
    # says 0.33: summary.json's recorded release decides, so the run's lists are read as the two lists they are; a
    # --vllm-version naming 0.33 on the command line is refused in one line naming both releases, not ignored.
    from tuner.decision.run_dir import load_run_workload
    from handmade_profiles import write_handmade_inputs

    spec = handmade_spec(max_num_seqs=8, num_speculative_tokens=3, max_num_batched_tokens=32,
                         gpu_memory_utilization=1.0)
    wl_path, profile, _ = write_handmade_inputs(tmp_path, spec, list(range(1, 33)), total_memory_bytes=4 << 30)
    out = tmp_path / "run"
    code, _, err = run(capsys, "search", wl_path, "--profile", profile, "--out", out, "--trials", 2, "--no-progress",
                       "--vllm-version", "0.34")
    assert code == 0, err
    monkeypatch.setenv(versions.VERSION_ENV, "0.33")
    assert load_run_workload(out).engine.version == "0.34"
    before = (out / "report.md").read_text() if (out / "report.md").exists() else None
    code, _, err = run(capsys, "report", out)
    assert code == 0, err
    report = (out / "report.md").read_text()
    assert "- vLLM 0.34 (asked for by --vllm-version), model runner" in report and report != before
    from tuner.check.example import predicted_log

    (tmp_path / "vllm.log").write_text(predicted_log(out, kv_error=0.0, pool_error=0.0))
    for command in (["report", out], ["status", out], ["check", out, "--vllm-log", tmp_path / "vllm.log"]):
        code, _, err = run(capsys, *command, "--vllm-version", "0.33")
        assert code == 2 and err.strip() == (f"cgtune {command[0]}: error: --vllm-version 0.33: the run was searched "
                                             f"under vLLM 0.34 (its summary.json), and is read under it: drop the "
                                             f"flag, or give 0.34")
    assert (out / "report.md").read_text() == report, "nothing rewritten"


def test_a_flag_naming_another_release_than_the_workload_pins_is_refused(tmp_path, capsys):
    # Issue 50: a --vllm-version the workload's own pin overrides was ignored silently; it is refused in one line.
    spec = handmade_spec(max_num_seqs=8, num_speculative_tokens=3, max_num_batched_tokens=32)
    spec["serving"]["vllm_version"] = "0.34"
    path = tmp_path / "pinned.yaml"
    path.write_text(yaml.safe_dump(spec))
    code, out, err = run(capsys, "defaults", path, "--vllm-version", "0.33")
    assert code == 2 and not out and err == ("cgtune defaults: error: --vllm-version 0.33: the workload pins "
                                             "serving.vllm_version 0.34: drop the flag, or give 0.34\n")
    code, out, err = run(capsys, "defaults", path, "--vllm-version", "0.34")
    assert code == 0 and "0.34 (model runner V2)" in out, err
