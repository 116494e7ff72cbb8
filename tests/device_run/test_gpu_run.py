"""The prepared device run (scripts/gpu_run.py) on a CPU: its rehearsal goes through every stage and leaves at most
8 files directly under OUT, one of them the profile; the time shares, the trace sizing and the packing on their own."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # tests/handmade_profiles.py (import-mode=importlib)
from handmade_profiles import handmade_profile  # noqa: E402

from tuner.profile.table import read_profile  # noqa: E402
from tuner.workload.spec import load_workload  # noqa: E402

_spec = importlib.util.spec_from_file_location("gpu_run", ROOT / "scripts" / "gpu_run.py")
gpu_run = importlib.util.module_from_spec(_spec)
sys.modules["gpu_run"] = gpu_run  # its dataclasses look their module up
_spec.loader.exec_module(gpu_run)


def _validate_profile(directory: Path) -> Path:
    """A hand-made tiny-cpu profile with graph rows (test fixture, not a measurement): a CPU profile has none for the
    exact solver, so the rehearsal validates this one."""
    workload = load_workload(ROOT / "workloads" / "tiny-cpu.yaml")
    return handmade_profile(directory, workload, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 640], name="tiny-cpu",
                            piecewise_ms=lambda w: 0.8 + 0.01 * w)


@pytest.mark.slow
def test_cpu_rehearsal_goes_through_every_stage_and_returns_at_most_8_files(tmp_path) -> None:
    out, work = tmp_path / "OUT", tmp_path / "work"
    _validate_profile(tmp_path / "hand")
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_run.py"), "--out", str(out), "--work", str(work),
         "--device", "cpu", "--workloads", "tiny-cpu", "--budget-s", "400", "--max-widths", "6", "--max-steps", "20",
         "--validate-profiles", str(tmp_path / "hand")],
        cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    files = [p for p in out.rglob("*")]
    assert all(p.is_file() for p in files) and len(files) <= gpu_run.MAX_FILES  # flat: no folder below OUT
    assert all(p.stat().st_size <= gpu_run.MAX_FILE_BYTES for p in files)
    assert {p.name for p in files} == {"run.log", "summary.md", "results.tar.gz", "tiny-cpu.csv", "tiny-cpu.json"}
    profile = read_profile(out / "tiny-cpu.csv")
    assert profile.metadata["compiled"] is True and len(profile.widths()) == 6
    with tarfile.open(out / "results.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"profiles/tiny-cpu.csv", "runs/tiny-cpu/validation.json", "runs/tiny-cpu/report.md",
            "logs/profile-tiny-cpu.log", "logs/validate-tiny-cpu.log", "logs/gpu-tests.log"} <= names
    summary = (out / "summary.md").read_text()
    for stage in ("profile tiny-cpu", "validate tiny-cpu", "gpu-tests"):
        assert f"| {stage} |" in summary
    assert "| 1 |" in summary and "### validation of tiny-cpu" in summary
    record = json.loads((work / "runs" / "tiny-cpu" / "validation.json").read_text())
    assert record["trace"]["steps"] == 20 and "no validation numbers" in " ".join(record["warnings"])
    assert done.stdout.rstrip().endswith(summary.rstrip())  # the summary table is printed last


def test_time_is_shared_by_weight_and_later_stages_get_what_earlier_ones_left() -> None:
    stages = gpu_run.plan_stages(["a", "b"], [165.0, 125.0], [95.0, 85.0])
    assert [s.name for s in stages] == ["profile a", "profile b", "validate a", "validate b", "gpu-tests"]
    total = sum(s.weight for s in stages)
    assert gpu_run.share_s(stages, 0, 525) == pytest.approx(525 * 165 / total)
    # The first profile ended early (100 s of its 169): the next stage's share grows with the time left.
    assert gpu_run.share_s(stages, 1, 425) == pytest.approx(425 * 125 / (total - 165))
    assert gpu_run.share_s(stages, 4, 50) == pytest.approx(50)  # the last takes what is left


def test_trace_steps_fit_the_seconds_or_the_stage_is_skipped() -> None:
    assert gpu_run.steps_for(100, fixed_s=40, per_step_s=0.02) == 3000  # 3000 of the 3000 that would fit
    assert gpu_run.steps_for(100, fixed_s=40, per_step_s=0.05) == 1200
    assert gpu_run.steps_for(100, fixed_s=96, per_step_s=0.05) is None  # not even 100 steps: skipped, not killed
    assert gpu_run.steps_for(100, fixed_s=95, per_step_s=0.05, most=20) == 20  # a short trace asked for: it fits
    assert gpu_run.steps_for(100, fixed_s=99.5, per_step_s=0.05, most=20) is None


def test_validation_seconds_come_from_the_profile_and_the_lists(tmp_path) -> None:
    from tuner.validate.validation import exact_run

    csv = _validate_profile(tmp_path / "p")
    run_dir = exact_run(ROOT / "workloads" / "tiny-cpu.yaml", csv, tmp_path / "run")
    fixed_s, per_step_s = gpu_run.validation_seconds(run_dir, start_s=10.0)
    summary = json.loads((run_dir / "summary.json").read_text())
    graphs = sum(len(summary[name]["runs_as"]) for name in ("default", "tuned"))
    # Each graph twice at the fixture's capture_s of 0.01 s plus a warm-up step of about a millisecond or more.
    assert 10 + graphs * 2 * 0.01 < fixed_s < 10 + graphs * 2 * 0.05
    assert per_step_s == pytest.approx(1.5 * (summary["default"]["expected_step_ms"]
                                              + summary["tuned"]["expected_step_ms"]) / 1e3, rel=0.5)


@pytest.mark.slow
def test_a_validation_killed_midway_still_reaches_the_summary(tmp_path) -> None:
    # The tiny model on this CPU; its second list's capture faults, as a device error would on the GPU.
    from tuner.decision.run_dir import load_run
    from tuner.validate.validation import build_backend, exact_run, lists_to_validate, validate_run

    run_dir = exact_run(ROOT / "workloads" / "tiny-cpu.yaml", _validate_profile(tmp_path / "p"),
                        tmp_path / "work" / "runs" / "tiny-cpu")
    model, search = load_run(run_dir)
    backend = build_backend(model, lists_to_validate(search), "cpu")
    captures = []
    real_capture = backend.capture

    def capture(graphs):
        captures.append(len(graphs))
        if len(captures) == 2:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real_capture(graphs)

    backend.capture = capture
    with pytest.raises(RuntimeError, match="illegal memory access"):
        validate_run(run_dir, num_steps=20, backend=backend)
    assert not (run_dir / "validation.json").exists() and (run_dir / "validation.partial.json").is_file()
    run = gpu_run.Run(out=tmp_path / "out", work=tmp_path / "work", device="cpu", workload_dir=ROOT / "workloads",
                      validate_profiles=None, log=gpu_run.Log(tmp_path / "run.log"), env={})
    text = gpu_run.summary(run, [], 0.0, 60.0)
    # The default was measured; the list whose capture faulted and every list after it (the shipped one among them)
    # are pending, and the summary says which.
    partial = json.loads((run_dir / "validation.partial.json").read_text())
    pending = partial["pending"]
    assert partial["lists"] == ["default"] and pending[0] == "tuned"
    assert "### validation of tiny-cpu on " in text and f"(PARTIAL: not measured {', '.join(pending)})" in text
    assert "| default |" in text and "| tuned |" not in text


def test_pack_keeps_within_the_file_limits(tmp_path, monkeypatch) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    for sub in ("profiles", "runs/a/plots", "logs"):
        (work / sub).mkdir(parents=True)
    for name in ("a", "b", "c"):
        (work / "profiles" / f"{name}.csv").write_text("num_tokens\n")
        (work / "profiles" / f"{name}.json").write_text("{}")
    (work / "runs" / "a" / "plots" / "deep.png").write_bytes(b"x" * 5000)
    out.mkdir()
    (out / "run.log").write_text("log\n")
    run = gpu_run.Run(out=out, work=work, device="cpu", workload_dir=ROOT / "workloads", validate_profiles=None,
                      log=gpu_run.Log(out / "run.log"), env={})
    files = gpu_run.pack(run, "summary\n")
    assert [f.name for f in files] == ["a.csv", "a.json", "b.csv", "b.json", "results.tar.gz", "run.log",
                                       "summary.md"]  # c's pair would make 9 files: it is in the archive only
    monkeypatch.setattr(gpu_run, "MAX_FILE_BYTES", 1000)  # parts of 1000 bytes: the archive is split
    (work / "runs" / "a" / "plots" / "noise.bin").write_bytes(os.urandom(3000))  # incompressible
    files = gpu_run.pack(run, "summary\n")
    parts = sorted(f for f in files if f.name.startswith("results.tar.gz.part"))
    assert len(parts) >= 2 and not (out / "results.tar.gz").exists() and len(files) <= gpu_run.MAX_FILES
    assert b"".join(p.read_bytes() for p in parts)[:2] == b"\x1f\x8b"  # the parts join into the gzip archive
