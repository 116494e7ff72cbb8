"""What a new user tripped on (issue 29), each the command, then its one clear line and exit 2, or the fixed behaviour:
a max_num_seqs vLLM refuses (it hung `cgtune defaults`), a compute capability no GPU has, a status of a run directory,
a storage path that is not a URL, every unknown model field and the ones it takes, a context longer than
max_model_len named by its bound. Hand-made profiles (test fixtures, never measurements)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/handmade_profiles.py (import-mode=importlib)
from handmade_profiles import MIB, handmade_spec, mixed_traffic, write_handmade_inputs  # noqa: E402
from cli_runner import run  # noqa: E402


def _workload(tmp_path: Path, **edits: dict) -> Path:
    spec = handmade_spec(max_num_seqs=8, max_num_batched_tokens=64)
    for section, values in edits.items():
        spec[section].update(values)
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _one_line(code: int, err: str) -> str:
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def test_a_max_num_seqs_above_the_token_budget_is_refused_at_once_as_vllm_refuses_it(tmp_path, capsys):
    t0 = time.perf_counter()
    code, out, err = run(capsys, "defaults", _workload(tmp_path, serving={"max_num_seqs": 100_000_000_000}))
    line = _one_line(code, err)
    assert time.perf_counter() - t0 < 30  # was > 10 minutes at 100% CPU; any finite bound shows the hang is gone
    assert "serving.max_num_seqs: 100000000000 must be <= max_num_batched_tokens=64" in line and not out


def test_a_compute_capability_no_gpu_has_is_refused(tmp_path, capsys):
    line = _one_line(*run(capsys, "defaults", "--max-num-seqs", 8, "--gpu-capability", "99.9")[::2])
    assert "'99.9' is not a CUDA compute capability" in line
    line = _one_line(*run(capsys, "defaults", _workload(tmp_path, serving={"gpu_capability": "99.9"}))[::2])
    assert line.endswith("serving.gpu_capability: '99.9' is not a CUDA compute capability (1.0 to 12.9: 9.0 for "
                         "H100/H200, 10.0 for B200)")
    code, out, err = run(capsys, "defaults", "--max-num-seqs", 8, "--gpu-capability", "12.0")
    assert code == 0 and "compute capability 12.0" in out, err


def test_every_unknown_model_field_is_named_with_the_ones_it_takes(tmp_path, capsys):
    line = _one_line(*run(capsys, "defaults", _workload(tmp_path, model={"colour": "red", "size": 8}))[::2])
    assert "model.colour: unknown field (and size); model takes config, dtype, head_dim, hidden_size" in line
    assert "preset" in line and "tensor_parallel_size" in line


def test_a_context_longer_than_max_model_len_names_its_bound(tmp_path, capsys):
    path = _workload(tmp_path, serving={"max_model_len": 1}, traffic={"mean_context_len": 2048})
    line = _one_line(*run(capsys, "defaults", path)[::2])
    assert "traffic.mean_context_len: 2048 must be <= serving.max_model_len=1" in line


@pytest.fixture()
def searched(tmp_path, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    spec = handmade_spec(name="newcomer", max_num_seqs=16, num_speculative_tokens=1, max_num_batched_tokens=64,
                         traffic=mixed_traffic(16, 64))
    wl, profile, _ = write_handmade_inputs(folder, spec, list(range(1, 65)), total_memory_bytes=400 * MIB,
                                           standalone_bytes=lambda w: 2 * w * MIB, delta_bytes=lambda w: 2 * MIB)
    out = tmp_path / "run"
    code, _, err = run(capsys, "search", wl, "--profile", profile, "--out", out, "--trials", 5, "--no-progress")
    assert code == 0, err
    return out


def test_status_takes_a_run_directory(searched, capsys):
    code, out, err = run(capsys, "status", searched)
    assert code == 0, err
    assert f"storage sqlite:///{searched / 'study.db'}: 1 study" in out
    line = _one_line(*run(capsys, "status", searched.parent)[::2])
    assert "RUN_DIR:" in line and "holds no study.db" in line


def test_a_storage_path_is_refused_with_the_url_it_should_be(searched, capsys):
    db = searched / "study.db"
    line = _one_line(*run(capsys, "status", "--storage", db)[::2])
    assert f"is a path, not a storage URL: an SQLite file is sqlite:///{db}" in line and "cgtune status DIR" in line
    code, out, _ = run(capsys, "status", "--storage", f"sqlite:///{db}")
    assert code == 0 and "1 study" in out
