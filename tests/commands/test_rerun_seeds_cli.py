"""A rerun of `cgtune search` in a directory that holds this workload's earlier run answers no worse than that run
(issue 49: the answer is no worse than any list cgtune evaluated, the previous answer among them): the earlier run's
tuned and compact lists seed the exact solver and the compact choice (`tuner.decision.run_dir.earlier_answer`). Shown
where it matters: a rerun on a small `--exact-work` budget, which on its own answers worse. The profile is a dense
SYNTHETIC one (made-up numbers, a fixture)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # tests/ helpers (import-mode=importlib)
from cli_runner import run  # noqa: E402

from tuner.decision.run_dir import earlier_answer  # noqa: E402
from tuner.workload.spec import load_workload  # noqa: E402
from tuner.workload.synthetic_profile import write_synthetic_profile  # noqa: E402


def dense_2k(tmp: Path, release: str) -> tuple[Path, Path]:
    """issue 34's case at 2048 batched tokens under `release` and its dense synthetic profile."""
    spec = yaml.safe_load((ROOT / "benchmarks/dense-ngram-v2.yaml").read_text())
    spec["serving"].update(max_num_batched_tokens=2048, vllm_version=release)
    spec["traffic"]["mixed_tokens"] = {"kind": "uniform", "min": 256, "max": 2048}
    path = tmp / f"dense-2k-{release}.yaml"
    path.write_text(yaml.safe_dump(spec))
    csv, _ = write_synthetic_profile(tmp, load_workload(path), dense=True, name=path.stem)
    return path, csv


def searched(capsys, wl: Path, csv: Path, out: Path, *flags: str) -> dict:
    code, stdout, err = run(capsys, "search", wl, "--profile", csv, "--out", out, "--trials", 2, "--no-progress",
                            *flags)
    assert code == 0, err
    return json.loads((out / "summary.json").read_text())


def counted(entry: dict) -> int:
    return entry["graph_memory_bytes"]  # 0.34 counts the real pool (no estimate is made)


@pytest.mark.slow
def test_a_rerun_on_a_small_budget_answers_no_worse_than_the_run_it_replaces(tmp_path, capsys):
    wl, csv = dense_2k(tmp_path, "0.34")
    first = searched(capsys, wl, csv, tmp_path / "run")
    alone = searched(capsys, wl, csv, tmp_path / "alone", "--exact-work", "1")
    # The premise: on its own, the small budget answers worse than the first run.
    assert alone["tuned"]["expected_step_ms"] > first["tuned"]["expected_step_ms"] + 1e-6
    again = searched(capsys, wl, csv, tmp_path / "run", "--exact-work", "1")
    assert again["tuned"]["expected_step_ms"] <= first["tuned"]["expected_step_ms"] + 1e-9
    limit = again["compact_choice"]["limit_ms"]
    assert again["compact"]["expected_step_ms"] <= limit + 1e-9
    if first["compact"]["expected_step_ms"] <= limit:  # the earlier compact list is within this run's tolerance
        assert counted(again["compact"]) <= counted(first["compact"])


def test_the_earlier_answer_is_read_only_from_this_workloads_run_under_the_same_release(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    wl = load_workload(ROOT / "workloads/dflash-llama-3.1-8b.yaml")
    other = load_workload(ROOT / "workloads/ngram-llama-3.1-8b.yaml")
    summary = {"workload": {"name": wl.name, "hash": wl.content_hash}, "vllm_version": wl.engine.version,
               "tuned": {"capture_sizes": [1, 2, 4]}, "compact": {"capture_sizes": [2, 4]},
               "shipped": {"capture_sizes": [2, 4], "other": {"capture_sizes": [1, 2, 4]}}}
    (out / "summary.json").write_text(json.dumps(summary))
    assert earlier_answer(out, wl) == [(1, 2, 4), (2, 4)]
    assert earlier_answer(out, other) == []
    (out / "summary.json").write_text(json.dumps({**summary, "vllm_version": "0.0"}))
    assert earlier_answer(out, wl) == []
    assert earlier_answer(tmp_path / "none", wl) == []
