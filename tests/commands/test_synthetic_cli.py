"""`cgtune profile --synthetic` (issue 50): a SYNTHETIC profile for a workload no file ships, with no GPU, under vLLM
0.33 and 0.34, which `cgtune search` takes and whose every output says SYNTHETIC; its numbers are the flags', its
widths token widths under either release (never 0.34's internal decode keys), and a bad number is one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ helpers (import-mode=importlib)
from cli_runner import run  # noqa: E402

from tuner.profile.table import read_profile  # noqa: E402

OWN = {  # a workload no file ships: Qwen3-8B with an EAGLE head, 48 requests x 4 tokens, 12288 tokens a step
    "name": "own-qwen3-8b-eagle",
    "model": {"preset": "qwen3-8b", "dtype": "bfloat16"},
    "speculative": {"method": "eagle", "drafter": {"num_layers": 1}},
    "serving": {"max_num_seqs": 48, "num_speculative_tokens": 3, "max_num_batched_tokens": 12288,
                "max_model_len": 12288, "gpu_memory_utilization": 0.9},
    "traffic": {"requests": {"kind": "uniform", "min": 2, "max": 48}, "mixed_share": 0.1,
                "mixed_tokens": {"kind": "uniform", "min": 256, "max": 12288}, "mean_context_len": 3000},
}


@pytest.fixture
def own(tmp_path):
    path = tmp_path / "own.yaml"
    path.write_text(yaml.safe_dump(OWN))
    return path


@pytest.mark.parametrize("release", ["0.33", "0.34"])
def test_it_feeds_search_for_a_workload_no_file_ships(own, tmp_path, capsys, release):
    code, out, err = run(capsys, "profile", own, "--synthetic", "--out", tmp_path / "p", "--vllm-version", release)
    assert code == 0, err
    csv = tmp_path / "p" / "own-qwen3-8b-eagle.synthetic.csv"
    assert out.startswith(f"SYNTHETIC profile (made-up numbers, not a measurement): {csv}")
    profile = read_profile(csv)
    assert min(profile.widths()) == 1 and max(profile.widths()) == 12288  # token widths, whichever release
    assert profile.metadata["device"] == "synthetic" and "SYNTHETIC" in profile.metadata["device_name"]
    assert profile.metadata["synthetic"]["eager_base_ms"] == 7.0
    assert {r.mode for r in profile.rows} >= {"eager", "full", "piecewise", "drafter_eager", "drafter_full"}
    code, out, err = run(capsys, "search", own, "--profile", csv, "--out", tmp_path / "r", "--trials", "8",
                         "--no-progress", "--vllm-version", release)
    assert code == 0, err
    first = out.splitlines()
    assert any(line.startswith("**SYNTHETIC PROFILE") for line in first[:3]), out
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["vllm_version"] == release and "SYNTHETIC" in summary["device_name"]
    assert summary["shipped"]["capture_sizes"] and summary["cost_model"]["max_capture_s"] == 60.0


def test_the_same_widths_under_either_release_and_the_flags_numbers(own, tmp_path, capsys):
    for release in ("0.33", "0.34"):
        code, _, err = run(capsys, "profile", own, "--synthetic", "--out", tmp_path / release, "--eager-ms", "5",
                           "0.01", "--full-saving-ms", "2", "--graph-delta", "1", "2048", "--capture-s", "0.2",
                           "--vllm-version", release)
        assert code == 0, err
    a, b = (tmp_path / r / "own-qwen3-8b-eagle.synthetic.csv" for r in ("0.33", "0.34"))
    assert a.read_bytes() == b.read_bytes()
    rows = {(r.num_tokens, r.mode): r for r in read_profile(a).rows}
    assert rows[100, "eager"].latency_ms == pytest.approx(6.0) and rows[100, "full"].latency_ms == pytest.approx(4.0)
    assert rows[100, "full"].capture_delta_bytes == (1 << 20) + 2048 * 100 and rows[100, "full"].capture_s == 0.2


@pytest.mark.parametrize("flags, needle", [
    (["--eager-ms", "-1", "0.01"], "--eager-ms A -1.0 must be a finite number >= 0"),
    (["--full-saving-ms", "nan"], "--full-saving-ms nan must be a finite number >= 0"),
    (["--eager-ms", "0.5", "0.01"], "--eager-ms A 0.5 must exceed what a graph saves"),
    (["--sizes", "8"], "--sizes: measures a device; --synthetic makes its numbers up"),
])
def test_a_bad_number_is_one_line_and_nothing_written(own, tmp_path, capsys, flags, needle):
    code, out, err = run(capsys, "profile", own, "--synthetic", "--out", tmp_path / "p", *flags)
    assert code == 2 and out == "" and err.count("\n") == 1 and needle in err, err
    assert not (tmp_path / "p").exists()
