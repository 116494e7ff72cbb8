"""A profile calibrated on vLLM's log (`tuner.profile.calibration`) as the cost model reads it: every graph-memory
reading scaled, vLLM's non-KV memory taken as it is, a bad calibration block refused in one line. Hand-made profiles:
test fixtures, never measurements."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/ helpers (import-mode=importlib)
from handmade_profiles import MIB, handmade_profile, handmade_workload  # noqa: E402

from tuner.model.costmodel import CostModel, ModelError  # noqa: E402
from tuner.profile.calibration import (  # noqa: E402
    CALIBRATION_KEY,
    apply_calibration,
    calibrated_metadata,
    write_calibrated,
)
from tuner.profile.table import read_profile  # noqa: E402

WIDTHS = list(range(1, 65))


@pytest.fixture()
def plain(tmp_path):
    wl = handmade_workload(max_num_seqs=16, max_num_batched_tokens=64)
    return wl, handmade_profile(tmp_path, wl, WIDTHS, total_memory_bytes=2000 * MIB,
                                standalone_bytes=lambda w: 3 * w * MIB)


def calibrate(csv: Path, out: Path, *, pool_logged: float, pool_predicted: float, non_kv: float | None) -> Path:
    meta = calibrated_metadata(read_profile(csv).metadata, log="vllm.log", capture_sizes=[1, 2, 4, 8, 16, 32, 64],
                               pool_logged_bytes=pool_logged, pool_predicted_bytes=pool_predicted,
                               non_kv_logged_bytes=non_kv, command="test")
    return write_calibrated(csv, out, meta)[1]


def test_an_uncalibrated_profile_comes_back_as_it_is(plain):
    profile = read_profile(plain[1])
    assert apply_calibration(profile) == (profile, None)


def test_the_scale_multiplies_every_graph_memory_reading_and_the_non_kv_memory_is_vllms(plain, tmp_path):
    wl, csv = plain
    base = CostModel.from_files(csv, wl)
    sizes = [1, 2, 4, 8, 16, 32, 64]
    e = base.evaluate(sizes)
    cal_csv = calibrate(csv, tmp_path / "cal" / "p.json", pool_logged=1.25 * e.graph_memory_bytes,
                        pool_predicted=e.graph_memory_bytes, non_kv=321 * MIB)
    model = CostModel.from_files(cal_csv, wl)
    for w, row in base.profile.by_mode("full").items():
        got = model.profile.by_mode("full")[w]
        assert (got.standalone_bytes, got.capture_delta_bytes) == (round(row.standalone_bytes * 1.25),
                                                                   round(row.capture_delta_bytes * 1.25))
        assert got.latency_ms == row.latency_ms
    again = model.evaluate(sizes)
    assert again.graph_memory_bytes == pytest.approx(1.25 * e.graph_memory_bytes, rel=1e-6)
    assert again.graph_estimate_bytes == pytest.approx(1.25 * e.graph_estimate_bytes, rel=1e-3)
    assert model.budget.non_kv_cache_bytes == 321 * MIB
    assert any(n.startswith("calibrated on vLLM's start-up log vllm.log (vLLM running a list of 7 sizes, max 64)")
               and "x 1.2500, the estimate's included) and its non-KV memory; from the profile" in n
               for n in model.notes)


def test_without_a_non_kv_figure_the_profiles_is_kept_and_the_note_says_so(plain, tmp_path):
    wl, csv = plain
    cal_csv = calibrate(csv, tmp_path / "p.json", pool_logged=2.0, pool_predicted=1.0, non_kv=None)
    meta = json.loads(cal_csv.with_suffix(".json").read_text())
    assert "non_kv_cache_bytes" in meta[CALIBRATION_KEY]["from_profile"]
    model = CostModel.from_files(cal_csv, wl)
    assert model.budget.non_kv_cache_bytes == CostModel.from_files(csv, wl).budget.non_kv_cache_bytes
    assert any("from the profile: latencies, capture times, the shape of graph memory over widths, non-KV memory" in n
               for n in model.notes)


@pytest.mark.parametrize("scale", [0, -1.5, "1.1", None, float("nan"), True])
def test_a_bad_scale_is_refused_in_one_line_naming_the_field(plain, tmp_path, scale):
    wl, csv = plain
    meta = json.loads(csv.with_suffix(".json").read_text())
    meta[CALIBRATION_KEY] = {"graph_memory_scale": scale}
    csv.with_suffix(".json").write_text(json.dumps(meta))
    with pytest.raises(ModelError, match=r"^hand\.json: vllm_calibration\.graph_memory_scale=.* must be a number > 0$"):
        CostModel.from_files(csv, wl)
