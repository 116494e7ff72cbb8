"""`cgtune profile` end to end on a CPU: a real eager sweep of the tiny workload, and clean rejections."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tuner.cli import main
from tuner.profile_table import METADATA_KEYS, read_profile

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "workloads" / "tiny-cpu.yaml")


def _profile(out: Path, *extra: str) -> int:
    return main(["profile", TINY, "--device", "cpu", "--out", str(out), "--no-progress", *extra])


def test_tiny_cpu_profile_end_to_end(tmp_path, capsys) -> None:
    assert _profile(tmp_path, "--max-widths", "8") == 0
    out = capsys.readouterr().out
    profile = read_profile(tmp_path / "tiny-cpu.csv")
    widths = profile.widths()
    assert len(widths) == 8 and {1, 512, 640} <= set(widths)  # ends, the ceiling and the widest decode batch
    eager = profile.by_mode("eager")
    assert set(eager) == set(widths) and all(r.latency_ms > 0 and r.latency_iqr_ms >= 0 for r in eager.values())
    graph_rows = [r for r in profile.rows if r.mode != "eager"]
    assert graph_rows and all(r.status == "unsupported" and r.latency_ms is None for r in graph_rows)
    meta = profile.metadata
    assert set(METADATA_KEYS) <= set(meta)
    assert meta["command"].startswith("cgtune profile ") and "--max-widths 8" in meta["command"]
    assert meta["weights_bytes"] > 0 and meta["kv_cache_bytes"] > 0 and meta["torch_version"] == torch.__version__
    assert "graph ms" in out and "unsupported" in out and f"wrote {tmp_path / 'tiny-cpu.csv'}" in out

    # Same command again: everything is already there, nothing is re-measured.
    assert _profile(tmp_path, "--max-widths", "8") == 0
    assert "0 widths measured this run, 8 in the table" in capsys.readouterr().out
    assert read_profile(tmp_path / "tiny-cpu.csv").rows == profile.rows


def test_explicit_sizes(tmp_path) -> None:
    assert _profile(tmp_path, "--sizes", "7", "3", "7", "--name", "picked") == 0
    assert read_profile(tmp_path / "picked.csv").widths() == [3, 7]


@pytest.mark.parametrize("sizes, message", [
    (["0"], "--sizes: 0 must be >= 1"),
    (["-4"], "--sizes: -4 must be >= 1"),
    (["1025"], "--sizes: 1025 must be <= max_num_batched_tokens=1024"),
    (["8", "2.5"], "--sizes: '2.5' is not an integer"),
    (["eight"], "--sizes: 'eight' is not an integer"),
])
def test_bad_sizes_exit_2_with_one_line_and_write_nothing(tmp_path, capsys, sizes, message) -> None:
    out = tmp_path / "out"
    try:
        code = _profile(out, "--sizes", *sizes)
    except SystemExit as exc:  # argparse rejects non-integers and values below 1 while parsing
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_bad_workload_exit_2_with_one_line(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "workloads" / "tiny-cpu.yaml").read_text().replace("max_num_seqs: 160", "max_num_seqs: -3"))
    out = tmp_path / "out"
    assert main(["profile", str(bad), "--device", "cpu", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "serving.max_num_seqs: -3 must be >= 1" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
    assert main(["profile", str(tmp_path / "missing.yaml"), "--device", "cpu", "--out", str(out)]) == 2
    assert "is not a file" in capsys.readouterr().err


def test_model_too_big_for_cpu_is_refused(tmp_path, capsys) -> None:
    spec = str(ROOT / "workloads" / "suffix-llama-3.1-70b-tp2.yaml")
    assert main(["profile", spec, "--device", "cpu", "--out", str(tmp_path / "o")]) == 2
    assert "profile it on a GPU" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_cuda_without_gpu_says_so(tmp_path, capsys) -> None:
    assert main(["profile", TINY, "--out", str(tmp_path / "o")]) == 2
    assert "no CUDA device is visible" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_resume_of_another_workload_is_refused(tmp_path, capsys) -> None:
    assert _profile(tmp_path, "--sizes", "4") == 0
    other = tmp_path / "other.yaml"
    other.write_text(Path(TINY).read_text().replace("mean_context_len: 64", "mean_context_len: 32"))
    capsys.readouterr()
    assert main(["profile", str(other), "--device", "cpu", "--out", str(tmp_path), "--sizes", "4"]) == 2
    assert "--fresh" in capsys.readouterr().err
    assert main(["profile", str(other), "--device", "cpu", "--out", str(tmp_path), "--sizes", "4", "--fresh",
                 "--no-progress"]) == 0


def test_profile_runs_where_optuna_is_missing(tmp_path) -> None:
    """The GPU box has no optuna: `cgtune profile` (and the parser that loads every command) must not need it."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['optuna'] = None\n"  # makes any `import optuna` fail, as on that box
        "from tuner.cli import main\n"
        f"sys.exit(main(['profile', {TINY!r}, '--device', 'cpu', '--out', {str(tmp_path)!r}, '--sizes', '4',"
        " '--no-progress']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "optuna" not in done.stderr
    assert read_profile(tmp_path / "tiny-cpu.csv").widths() == [4]
