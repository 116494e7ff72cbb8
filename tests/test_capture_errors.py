"""A profile whose capture failed at one width (row status `error`, as `cgtune profile` records a non-OOM capture
error): the table reads, the width is offered to no list, and a list holding it says why it is infeasible."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/handmade_profiles.py (import-mode=importlib)
from handmade_profiles import handmade_profile, handmade_workload  # noqa: E402

from tuner.model.costmodel import CostModel  # noqa: E402
from tuner.profile.table import read_profile, write_profile  # noqa: E402


def test_a_failed_capture_rules_its_width_out(tmp_path) -> None:
    workload = handmade_workload()
    csv_path = handmade_profile(tmp_path, workload, [1, 2, 4, 8], piecewise_ms=lambda w: 0.7 + 0.01 * w)
    profile = read_profile(csv_path)
    rows = [dataclasses.replace(r, status="error", latency_ms=None, latency_iqr_ms=None)
            if (r.num_tokens, r.mode) == (4, "piecewise") else r for r in profile.rows]
    write_profile(tmp_path, "hand", rows, profile.metadata)
    assert read_profile(csv_path).by_mode("piecewise", ok_only=False)[4].status == "error"
    model = CostModel.from_files(csv_path, workload)
    assert model.failed_widths == [4] and model.candidates == [1, 2, 8]
    e = model.evaluate((4, 8))
    assert not e.feasible and "the capture of width 4 failed while profiling" in e.why_infeasible
    assert model.evaluate((2, 8)).feasible
