"""The sweep's logic on a CPU: candidates, shared-pool bookkeeping, out-of-memory, resume and atomic writes,
with a scripted graph runner standing in for CUDA (its byte counts are test fixtures, not measurements)."""

from __future__ import annotations

import weakref
from pathlib import Path

import pytest
import torch

from tuner.candidates import decode_widths
from tuner.measure.graphs import CapturedGraph, is_oom
from tuner.measure.memory import MemorySnapshot
from tuner.measure.profile import (
    StepRunner,
    SweepOptions,
    candidate_widths,
    profile_workload,
    thin_widths,
    validate_sizes,
)
from tuner.measure.timing import FakeClock, WallClock
from tuner.profile_table import METADATA_KEYS, read_profile
from tuner.workload import load_workload

ROOT = Path(__file__).resolve().parents[2]
FAST = SweepOptions(warmup_ms=0, rep_ms=0, min_reps=2, max_reps=2)


@pytest.fixture(scope="module")
def tiny():
    return load_workload(ROOT / "workloads" / "tiny-cpu.yaml")


class _Pool:
    def __init__(self) -> None:
        self.size = 0


class ScriptedGraphs(StepRunner):
    """Pretends to capture graphs: a width costs `w * 1000` bytes of activations in its pool (shared pools
    keep only the largest) plus 100 bytes per graph; `oom_at` and larger raise the allocator's OOM error."""

    def __init__(self, model, *, oom_at: int | None = None, interrupt_at: int | None = None) -> None:
        super().__init__(model, clock=WallClock())
        self.graphs_supported = True
        self.unsupported_reason = None
        self.oom_at = oom_at
        self.interrupt_at = interrupt_at
        self.pools: weakref.WeakSet[_Pool] = weakref.WeakSet()
        self.captured: list[int] = []

    def new_pool(self) -> _Pool:
        pool = _Pool()
        self.pools.add(pool)
        return pool

    def capture(self, num_tokens: int, pool: _Pool) -> CapturedGraph:
        self.captured.append(num_tokens)
        if self.interrupt_at == num_tokens:
            raise KeyboardInterrupt
        if self.oom_at is not None and num_tokens >= self.oom_at:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate (scripted)")
        pool.size = max(pool.size, num_tokens * 1000) + 100
        return CapturedGraph(graph=None, num_tokens=num_tokens, pool=pool, capture_s=0.0)  # type: ignore[arg-type]

    def replay(self, graph: CapturedGraph) -> None:
        self.model.step(graph.num_tokens)

    def memory(self) -> MemorySnapshot:
        return MemorySnapshot(free_bytes=10**9 - sum(p.size for p in self.pools), total_bytes=10**9)


def _run(tiny, out: Path, widths, **kw):
    return profile_workload(tiny, out, widths=widths, device="cpu", options=kw.pop("options", FAST),
                            progress=False, **kw)


def test_candidates_cover_grid_decode_widths_and_stride(tiny) -> None:
    widths = candidate_widths(tiny)
    grid = tiny.serving.defaults().sizes
    assert set(grid) <= set(widths)
    assert set(decode_widths(tiny.serving)) <= set(widths)  # 4, 8, ..., 640
    assert max(widths) == 640  # min(max_num_batched_tokens=1024, q * max_num_seqs = 640)
    assert all(w % 4 == 0 for w in widths if w > 512)  # above the ceiling only decode and stride widths
    wide = candidate_widths(tiny, stride_tokens=50)
    assert set(wide) - set(widths) == {562}  # 612 is a decode width already; 662 is above 640


def test_thin_keeps_ends_and_requested(tiny) -> None:
    widths = candidate_widths(tiny)
    thinned = thin_widths(widths, 10, keep=[512])
    assert len(thinned) == 10 and {1, 512, 640} <= set(thinned)
    assert thin_widths([3, 1, 2], 10) == [1, 2, 3]


@pytest.mark.parametrize("bad", [[0], [-4], [1025], [2.5], ["8"], []])
def test_bad_sizes_rejected(tiny, bad) -> None:
    with pytest.raises(ValueError, match="--sizes"):
        validate_sizes(bad, tiny)
    assert validate_sizes([8, 1, 8, 1024], tiny) == [1, 8, 1024]


def test_eager_measured_and_graph_rows_unsupported_on_cpu(tiny, tmp_path) -> None:
    result = _run(tiny, tmp_path, [1, 6, 16])
    profile = read_profile(result.csv_path)
    assert [(r.num_tokens, r.mode, r.status) for r in profile.rows] == [
        (w, m, s) for w in (1, 6, 16)
        for m, s in (("eager", "ok"), ("full", "unsupported"), ("piecewise", "unsupported"))
    ]
    assert all(r.latency_ms > 0 for r in profile.rows if r.mode == "eager")
    assert all(r.latency_ms is None and r.capture_delta_bytes is None for r in profile.rows if r.mode != "eager")
    meta = profile.metadata
    assert set(METADATA_KEYS) <= set(meta)
    assert meta["device"] == "cpu" and meta["compiled"] is False and meta["complete"] is True
    assert meta["graphs"] == "CUDA graphs need a CUDA device"
    assert meta["workload"] == {"name": "tiny-cpu", "hash": tiny.content_hash, "path": str(tiny.path)}
    assert len(meta["measurements"]["16"]["eager"]["samples_ms"]) == 2


def test_shared_pool_deltas_and_standalone_bytes(tiny, tmp_path) -> None:
    runners = []

    def factory(model):
        runners.append(ScriptedGraphs(model))
        return runners[-1]

    result = _run(tiny, tmp_path, [4, 8, 16], runner_factory=factory)
    full = {r.num_tokens: r for r in result.rows if r.mode == "full"}
    # Largest first: the first graph pays its activations, later ones only their own overhead.
    assert [full[w].capture_delta_bytes for w in (16, 8, 4)] == [16100, 100, 100]
    assert [full[w].standalone_bytes for w in (16, 8, 4)] == [16100, 8100, 4100]
    assert all(full[w].status == "ok" and full[w].latency_ms > 0 for w in full)
    # Each width: alone in a fresh pool, then into the shared pool.
    assert runners[0].captured == [16, 16, 8, 8, 4, 4]


def test_out_of_memory_marks_width_and_larger_and_goes_on(tiny, tmp_path) -> None:
    result = _run(tiny, tmp_path, [4, 8, 16, 24, 32], runner_factory=lambda m: ScriptedGraphs(m, oom_at=16))
    status = {(r.num_tokens, r.mode): r.status for r in result.rows}
    assert [status[(w, "full")] for w in (4, 8, 16, 24, 32)] == ["ok", "ok", "oom", "oom", "oom"]
    assert all(status[(w, "eager")] == "ok" for w in (4, 8, 16, 24, 32))
    full = {r.num_tokens: r for r in result.rows if r.mode == "full"}
    assert full[8].capture_delta_bytes == 8100  # the first graph that fit pays the pool
    assert full[32].latency_ms is None and full[32].standalone_bytes is None
    assert "out of memory" in result.metadata["measurements"]["32"]["full_oom"]
    assert read_profile(result.csv_path).by_mode("full") .keys() == {4, 8}


def test_eager_out_of_memory_marks_graph_too(tiny, tmp_path) -> None:
    class EagerOOM(ScriptedGraphs):
        def eager(self, num_tokens: int) -> None:
            if num_tokens >= 16:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory (scripted)")
            super().eager(num_tokens)

    result = _run(tiny, tmp_path, [8, 16], runner_factory=EagerOOM)
    status = {(r.num_tokens, r.mode): r.status for r in result.rows}
    assert status[(16, "eager")] == status[(16, "full")] == "oom"
    assert status[(8, "eager")] == status[(8, "full")] == "ok"


def test_other_errors_are_not_swallowed(tiny, tmp_path) -> None:
    class Broken(ScriptedGraphs):
        def capture(self, num_tokens, pool):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    assert not is_oom(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert is_oom(RuntimeError("CUDA error: out of memory"))
    try:  # ending a capture that an allocation failure invalidated raises its own error
        try:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (scripted)")
        except RuntimeError:
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture")
    except RuntimeError as chained:
        assert is_oom(chained)
    with pytest.raises(RuntimeError, match="illegal"):
        _run(tiny, tmp_path, [8], runner_factory=Broken)


def test_interrupted_sweep_resumes_with_the_same_pool(tiny, tmp_path) -> None:
    with pytest.raises(KeyboardInterrupt):
        _run(tiny, tmp_path, [4, 8, 16, 32], runner_factory=lambda m: ScriptedGraphs(m, interrupt_at=8))
    partial = read_profile(tmp_path / "tiny-cpu.csv")
    assert partial.widths() == [16, 32] and partial.metadata["complete"] is False

    runners = []

    def factory(model):
        runners.append(ScriptedGraphs(model))
        return runners[-1]

    result = _run(tiny, tmp_path, [4, 8, 16, 32], runner_factory=factory)
    assert result.measured == [8, 4] and result.complete
    assert runners[0].captured[:2] == [32, 16]  # the finished widths re-captured (untimed) first
    full = {r.num_tokens: r for r in read_profile(result.csv_path).rows if r.mode == "full"}
    assert [full[w].capture_delta_bytes for w in (32, 16, 8, 4)] == [32100, 100, 100, 100]


def test_max_seconds_stops_early_and_rerun_completes(tiny, tmp_path) -> None:
    stopped = _run(tiny, tmp_path, [1, 2, 3], options=SweepOptions(0, 0, 1, 1, max_seconds=0))
    assert not stopped.complete and stopped.measured == []
    done = _run(tiny, tmp_path, [1, 2, 3])
    assert done.complete and done.measured == [3, 2, 1]


def test_resume_refuses_another_measurement(tiny, tmp_path) -> None:
    _run(tiny, tmp_path, [4])
    with pytest.raises(ValueError, match="compiled"):
        profile_workload(tiny, tmp_path, widths=[4], device="cpu", compile=True, options=FAST, progress=False)


def test_resume_may_add_widths_but_not_drop_them(tiny, tmp_path) -> None:
    _run(tiny, tmp_path, [4, 8])
    assert _run(tiny, tmp_path, [2, 4, 8]).measured == [2]
    with pytest.raises(ValueError, match="widths this run does not ask for"):
        _run(tiny, tmp_path, [2, 4])
    assert _run(tiny, tmp_path, [2, 4], resume=False).measured == [4, 2]


def test_writes_are_atomic(tiny, tmp_path, monkeypatch) -> None:
    import tuner.profile_table as table

    real_replace = table.os.replace
    calls = {"n": 0}

    def failing_replace(src, dst):
        calls["n"] += 1
        if calls["n"] >= 4:  # JSON then CSV per write: from the CSV of the second width on, the disk is full
            raise OSError("disk full (scripted)")
        return real_replace(src, dst)

    monkeypatch.setattr(table.os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        _run(tiny, tmp_path, [4, 8])
    monkeypatch.setattr(table.os, "replace", real_replace)
    assert read_profile(tmp_path / "tiny-cpu.csv").widths() == [8]  # the last complete table, never a part
    assert not list(tmp_path.glob(".*.tmp"))


def test_activation_peak_is_the_larger_of_profile_run_and_widest_step(tiny, tmp_path) -> None:
    class Peaks(StepRunner):
        def __init__(self, model):
            super().__init__(model)
            self.readings = [300, 700]  # scripted: profile run, then the widest decode step

        def peak_bytes(self, fn):
            fn()
            return self.readings.pop(0)

    meta = _run(tiny, tmp_path, [8, 16], runner_factory=Peaks).metadata
    assert meta["activation_peak_bytes"] == 700
    assert meta["activation_peaks"] == {"profile_run_bytes": 300, "profile_run_tokens": 1024,
                                        "profile_run_requests": 160, "decode_step_bytes": 700,
                                        "decode_step_tokens": 16}


def test_fake_clock_drives_the_reported_statistics(tiny, tmp_path) -> None:
    class Clocked(StepRunner):
        def __init__(self, model):
            super().__init__(model, clock=FakeClock([3.0, 1.0, 2.0, 30.0]))

    result = _run(tiny, tmp_path, [4], runner_factory=Clocked, options=SweepOptions(0, 0, 3, 3))
    eager = next(r for r in result.rows if r.mode == "eager")
    assert eager.latency_ms == 2.0 and eager.latency_iqr_ms == pytest.approx(14.5)
    assert result.metadata["measurements"]["4"]["eager"]["noisy"] is True
