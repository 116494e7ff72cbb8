"""`--exact-seconds` on `cgtune search` and `tune`: bad values are one line with exit 2, and a spent budget is said in
summary.json and the report, with the proven gap, while the study's answer still ships when it is faster."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/handmade_profiles.py (import-mode=importlib)
sys.path.insert(0, str(Path(__file__).resolve().parent))
from handmade_profiles import MIB, write_handmade_inputs  # noqa: E402
from cli_runner import run  # noqa: E402
from test_search_cli import SPEC  # noqa: E402


@pytest.fixture()
def inputs(tmp_path):
    # test_search_cli's workload on 300 MiB of device memory: about 120 MiB of graph estimate fit, so the budget
    # binds and the bounds alone do not prove the answer; the program over memory levels has work to do.
    return write_handmade_inputs(tmp_path, SPEC, list(range(1, 65)), total_memory_bytes=300 * MIB,
                                 standalone_bytes=lambda w: 2 * w * MIB, delta_bytes=lambda w: 2 * MIB)


@pytest.mark.parametrize("value", ["0", "-1", "abc", "nan", "inf"])
@pytest.mark.parametrize("command", ["search", "tune"])
def test_exact_seconds_must_be_a_positive_number(inputs, tmp_path, capsys, command, value):
    wl_path, profile, _ = inputs
    out = tmp_path / "run"
    code, _, err = run(capsys, command, wl_path, "--profile", profile, "--out", out, "--exact-seconds", value)
    assert code == 2
    line = err.strip().splitlines()[-1]
    assert "--exact-seconds" in line and value in line.replace("-inf", "inf")
    assert not out.exists()


def test_a_spent_exact_budget_is_said_and_the_faster_list_ships(inputs, tmp_path, capsys):
    wl_path, profile, _ = inputs
    out = tmp_path / "spent"
    # A nanosecond: the bounds' first forward sweeps run to their end (the bound of last resort), nothing after them.
    code, stdout, err = run(capsys, "tune", wl_path, "--profile", profile, "--out", out, "--trials", 20,
                            "--exact-seconds", "1e-9", "--no-progress")
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["exact_stopped_early"] is True and summary["exact_memory"] is False
    assert summary["exact_unproven"][0].startswith("stopped at its time budget")
    lower, gap = summary["exact_lower_bound_ms"], summary["exact_gap_bound"]
    assert 0 < lower <= summary["exact"]["expected_step_ms"]
    assert summary["exact"]["expected_step_ms"] == pytest.approx(lower * (1 + gap))
    # The study's answer is never lost: whichever of the two is faster ships (here the study's, by far).
    assert summary["tuned"]["expected_step_ms"] < summary["exact"]["expected_step_ms"]
    assert "vs the exact solver's list, not proven optimal" in stdout
    report = (out / "report.md").read_text()
    assert "stopped at its time budget" in report and f"within {gap:.2%} of the optimum" in report
    assert "proven optimum" not in report and "faster than the exact solver's list, which is not proven" in report

    # Without the budget the same run proves its answer, in the same files.
    code, _, err = run(capsys, "search", wl_path, "--profile", profile, "--out", tmp_path / "whole", "--trials", 20,
                       "--no-progress")
    assert code == 0, err
    whole = json.loads((tmp_path / "whole" / "summary.json").read_text())
    assert whole["exact_memory"] is True and whole["exact_stopped_early"] is False and whole["exact_gap_bound"] == 0
    assert whole["exact_lower_bound_ms"] == pytest.approx(whole["exact"]["expected_step_ms"])
    assert whole["exact"]["expected_step_ms"] <= summary["exact"]["expected_step_ms"] + 1e-12
