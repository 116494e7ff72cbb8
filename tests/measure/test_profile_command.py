"""`cgtune profile` end to end on a CPU: a real eager sweep of the tiny workload (compiled once, plain otherwise to
keep the suite fast), --dry-run, Ctrl-C, and clean rejections."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tuner.cli import main
from tuner.profile.table import METADATA_KEYS, read_profile

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "workloads" / "tiny-cpu.yaml")


def _profile(out: Path, *extra: str, compile: bool = False) -> int:
    flags = [] if compile else ["--no-compile"]
    return main(["profile", TINY, "--device", "cpu", "--out", str(out), "--no-progress", *flags, *extra])


def test_tiny_cpu_profile_end_to_end(tmp_path, capsys) -> None:
    assert _profile(tmp_path, "--max-widths", "8") == 0
    out = capsys.readouterr().out
    profile = read_profile(tmp_path / "tiny-cpu.csv")
    widths = profile.widths()
    assert len(widths) == 8 and {1, 512, 640} <= set(widths)  # ends, the ceiling and the widest decode batch
    eager = profile.by_mode("eager")
    assert set(eager) == set(widths) and all(r.latency_ms > 0 and r.latency_iqr_ms >= 0 for r in eager.values())
    graph_rows = [r for r in profile.rows if r.mode in ("full", "piecewise")]
    assert graph_rows and all(r.status == "unsupported" and r.latency_ms is None for r in graph_rows)
    meta = profile.metadata
    assert set(METADATA_KEYS) <= set(meta)
    assert meta["command"].startswith("cgtune profile ") and "--max-widths 8" in meta["command"]
    assert meta["weights_bytes"] > 0 and meta["kv_cache_bytes"] > 0 and meta["torch_version"] == torch.__version__
    assert meta["compiled"] is False and "--no-compile" in meta["command"]
    assert set(profile.by_mode("logits")) == set(widths)
    assert "piecewise ms" in out and "logits ms" in out and "unsupported" in out
    assert f"wrote {tmp_path / 'tiny-cpu.csv'}" in out
    noisy = meta["noisy_widths"]
    assert set(noisy) <= set(widths)
    assert f"noisy: {len(noisy)} of 8 widths have a timing with IQR/median > 5%" in out
    assert "not compiled (plain eager)" in out

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


@pytest.mark.slow
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


def test_compiled_by_default_and_compile_time_recorded(tmp_path, capsys) -> None:
    torch._dynamo.reset()  # a fresh compilation, whatever other tests compiled before
    assert _profile(tmp_path, "--sizes", "4", "1", compile=True) == 0
    meta = read_profile(tmp_path / "tiny-cpu.csv").metadata
    assert meta["compiled"] is True and meta["compile_s"] > 0
    assert "--no-compile" not in meta["command"]
    assert f"compiled in {meta['compile_s']:.1f} s" in capsys.readouterr().out
    # A plain rerun into the same table would mix two measurements: refused.
    assert _profile(tmp_path, "--sizes", "4", "1") == 2
    assert "compiled=True, this run has False" in capsys.readouterr().err


def test_enforce_eager_workload_measures_plain_eager(tmp_path, capsys) -> None:
    eager = tmp_path / "eager.yaml"
    eager.write_text(Path(TINY).read_text().replace("serving:\n", "serving:\n  enforce_eager: true\n"))
    out = tmp_path / "o"
    assert main(["profile", str(eager), "--device", "cpu", "--out", str(out), "--sizes", "4", "--no-progress"]) == 0
    assert read_profile(out / "tiny-cpu.csv").metadata["compiled"] is False
    capsys.readouterr()
    assert main(["profile", str(eager), "--device", "cpu", "--out", str(out), "--sizes", "4", "--compile"]) == 2
    err = capsys.readouterr().err
    assert "--compile: tiny-cpu sets serving.enforce_eager: true" in err and len(err.strip().splitlines()) == 1


def test_dry_run_prints_widths_and_estimate_and_writes_nothing(tmp_path, capsys) -> None:
    out = tmp_path / "never"
    # --device cuda on a machine without a GPU: a dry run touches no device, so it still answers.
    assert main(["profile", TINY, "--out", str(out), "--max-widths", "8", "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "tiny-cpu: 8 widths on cuda (compiled): 1 " in text and " 512 " in text and text.count(" 640") >= 1
    # 8 widths x 4 modes x (25 + 100) ms = 4 s; 8 x (2 + 1 pieces + 1 full) x 2 captures x 5 ms = 0.32 s
    assert "estimated sweep: at least 4 s (8 widths x 4 timed modes x 25+100 ms budgets = 4 s" in text
    assert "assumed 5 ms" in text and "nothing measured, nothing written" in text
    assert not out.exists()


def test_dry_run_counts_widths_already_measured(tmp_path, capsys) -> None:
    assert _profile(tmp_path, "--sizes", "4", "8") == 0
    capsys.readouterr()
    assert _profile(tmp_path, "--sizes", "2", "4", "8", "--dry-run") == 0
    text = capsys.readouterr().out
    assert "3 widths on cpu (not compiled): 2 4 8" in text and "2 of them are already in" in text
    assert "1 widths x 2 timed modes x 2+10 ms budgets" in text
    assert read_profile(tmp_path / "tiny-cpu.csv").widths() == [4, 8]  # untouched


def test_ctrl_c_says_what_was_kept_and_how_to_resume(tmp_path, capsys, monkeypatch) -> None:
    import tuner.measure.profile as measure

    real = measure.profile_workload

    class Interrupted(measure.StepRunner):
        def logits(self, num_tokens):  # while the second width (8 tokens; the smallest goes first) is timed
            if num_tokens == 8:
                raise KeyboardInterrupt
            super().logits(num_tokens)

    monkeypatch.setattr(measure, "profile_workload", lambda *a, **k: real(*a, runner_factory=Interrupted, **k))
    assert _profile(tmp_path, "--sizes", "4", "8", "--fresh") == 130
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err
    assert lines[0].startswith(f"cgtune profile: interrupted: kept 1 of 2 widths in {tmp_path / 'tiny-cpu.csv'}")
    resume = lines[0].split("resume with: ", 1)[1]
    assert resume.startswith("cgtune profile ") and "--sizes 4 8" in resume and "--fresh" not in resume
    assert read_profile(tmp_path / "tiny-cpu.csv").widths() == [4]

    monkeypatch.setattr(measure, "profile_workload", real)
    assert main(resume.split()[1:] + ["--no-progress"]) == 0  # the printed command resumes it
    assert read_profile(tmp_path / "tiny-cpu.csv").widths() == [4, 8]


def test_ctrl_c_before_any_width_keeps_nothing(tmp_path, capsys, monkeypatch) -> None:
    import tuner.measure.profile as measure

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(measure, "profile_workload", interrupted)
    out = tmp_path / "o"
    assert _profile(out, "--sizes", "4") == 130
    err = capsys.readouterr().err
    assert "interrupted before a width was finished: nothing kept; rerun: cgtune profile" in err
    assert len(err.strip().splitlines()) == 1
