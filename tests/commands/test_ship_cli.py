"""The deployment follows the recommendation (issue 29): the files a run writes carry the compact list when the report
recommends it (`--ship auto`), else the fastest, or the one `--ship` names; the other list's files stand beside them
under names that say which; summary.json, the report and the printed lines say which shipped and why; a rerun with
another choice leaves no file of the old one. On the shipped DFlash workload with a synthetic profile at GPU scale
(tests/handmade_profiles.py: made-up numbers, a fixture, not a measurement)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # tests/ helpers (import-mode=importlib)
from cli_runner import run  # noqa: E402
from handmade_profiles import gpu_scale_profile  # noqa: E402

DFLASH = ROOT / "workloads" / "dflash-llama-3.1-8b.yaml"
FILES = ("compilation_config.json", "vllm-serve.yaml", "vllm-flags.txt")


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    return gpu_scale_profile(tmp_path_factory.mktemp("profile"), DFLASH)


def _search(capsys, profile: Path, out: Path, *extra: str) -> tuple[str, dict]:
    code, stdout, err = run(capsys, "search", DFLASH, "--profile", profile, "--out", out, "--trials", 4,
                            "--no-progress", *extra)
    assert code == 0, err
    return stdout, json.loads((out / "summary.json").read_text())


def _sizes(path: Path) -> list[int]:
    return json.loads(path.read_text())["cudagraph_capture_sizes"]


@pytest.mark.slow
def test_auto_ships_the_recommended_compact_list_and_keeps_the_fastest_beside_it(profile, tmp_path, capsys):
    out = tmp_path / "run"
    stdout, summary = _search(capsys, profile, out)
    compact, tuned = summary["compact"]["capture_sizes"], summary["tuned"]["capture_sizes"]
    assert summary["compact_choice"]["recommended"] and compact != tuned  # the case issue 29 tripped on
    shipped = summary["shipped"]
    assert (shipped["list"], shipped["policy"], shipped["capture_sizes"]) == ("compact", "auto", compact)
    assert _sizes(out / "compilation_config.json") == compact
    assert _sizes(out / "compilation_config.fastest.json") == tuned
    assert shipped["other"] == {"list": "fastest", "capture_sizes": tuned,
                                "files": ["compilation_config.fastest.json", "vllm-serve.fastest.yaml",
                                          "vllm-flags.fastest.txt"]}
    assert all((out / f).is_file() for f in shipped["other"]["files"])
    assert f"shipped: the compact list ({len(compact)} graphs) in {', '.join(FILES)}: recommended" in stdout
    # The printed serve line is the shipped list's.
    assert f'"cudagraph_capture_sizes": {json.dumps(compact)}' in stdout
    assert "# list: the compact list" in (out / "vllm-serve.yaml").read_text()
    code, _, err = run(capsys, "report", out)
    assert code == 0, err
    report = (out / "report.md").read_text()
    assert "**Shipped: the compact list** (recommended (--ship auto)" in report
    assert "`vllm-serve.fastest.yaml`" in report


@pytest.mark.slow
def test_ship_names_the_list_and_a_rerun_leaves_no_file_of_the_other_choice(profile, tmp_path, capsys):
    out = tmp_path / "run"
    _, summary = _search(capsys, profile, out, "--ship", "fastest")
    compact, tuned = summary["compact"]["capture_sizes"], summary["tuned"]["capture_sizes"]
    assert summary["shipped"]["list"] == "fastest" and summary["shipped"]["why"].startswith("--ship fastest")
    assert _sizes(out / "compilation_config.json") == tuned
    assert _sizes(out / "compilation_config.compact.json") == compact
    assert not list(out.glob("*.fastest.*"))
    _, summary = _search(capsys, profile, out, "--ship", "compact")
    assert summary["shipped"]["list"] == "compact" and _sizes(out / "compilation_config.json") == compact
    assert _sizes(out / "compilation_config.fastest.json") == tuned and not list(out.glob("*.compact.*"))
    # The choice is part of the run: re-rendering keeps it.
    code, _, err = run(capsys, "report", out)
    assert code == 0, err
    assert _sizes(out / "compilation_config.json") == compact
    assert json.loads((out / "search.json").read_text())["ship"] == "compact"


def test_a_bad_ship_value_is_one_line_exit_2_and_nothing_written(profile, tmp_path, capsys):
    out = tmp_path / "run"
    code, _, err = run(capsys, "search", DFLASH, "--profile", profile, "--out", out, "--ship", "smallest")
    assert code == 2 and not out.exists() and "--ship" in err.strip().splitlines()[-1]
