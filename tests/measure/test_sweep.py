"""The sweep's logic on a CPU: candidates, vLLM's capture order into one shared pool, out-of-memory, resume, atomic
writes, logits rows, non-KV memory and noise, with a scripted graph runner standing in for CUDA (its byte counts
and memory readings are test fixtures, not measurements)."""

from __future__ import annotations

import json
import weakref
from pathlib import Path

import pytest
import torch

from tuner.measure import profile as profile_module
from tuner.measure.graphs import is_oom
from tuner.measure.memory import MemorySnapshot
from tuner.measure.profile import (
    CAPTURE_ORDER,
    StepRunner,
    SweepOptions,
    candidate_widths,
    estimate_sweep_s,
    profile_workload,
    thin_widths,
    validate_sizes,
)
from tuner.measure.timing import FakeClock, WallClock
from tuner.profile.table import METADATA_KEYS, read_profile
from tuner.workload.candidates import decode_widths
from tuner.workload.spec import load_workload

ROOT = Path(__file__).resolve().parents[2]
FAST = SweepOptions(warmup_ms=0, rep_ms=0, min_reps=2, max_reps=2)


@pytest.fixture(scope="module")
def tiny():
    return load_workload(ROOT / "workloads" / "tiny-cpu.yaml")


class _Pool:
    def __init__(self) -> None:
        self.size = 0


class _Graph:
    """Stand-in for a captured graph: replay reruns the step's body (the full step or the split one)."""

    def __init__(self, body, num_tokens: int, pool: _Pool) -> None:
        self.body, self.num_tokens, self.pool, self.capture_s = body, num_tokens, pool, 0.0

    def replay(self) -> None:
        self.body()


class ScriptedGraphs(StepRunner):
    """Pretends to capture graphs: a FULL graph of width w needs `w * 1000` bytes of activations in its pool and a
    PIECEWISE step `w * 500` (a pool keeps only the largest; later graphs reuse it), plus 100 bytes per FULL graph
    and 10 per piece (3 pieces: the tiny model has 2 layers); `oom_at={mode: w}` makes w and larger raise the
    allocator's OOM error; `interrupt_at=(mode, w)` raises KeyboardInterrupt when that graph is replayed."""

    def __init__(self, model, *, oom_at: dict[str, int] | None = None,
                 interrupt_at: tuple[str, int] | None = None) -> None:
        super().__init__(model, clock=WallClock())
        self.graphs_supported = True
        self.unsupported_reason = None
        self.oom_at = oom_at or {}
        self.interrupt_at = interrupt_at
        self.pools: weakref.WeakSet[_Pool] = weakref.WeakSet()
        self.captured: list[tuple[str, int, _Pool]] = []
        self.pools_made: list[int] = []

    def new_pool(self) -> _Pool:
        pool = _Pool()
        self.pools.add(pool)
        self.pools_made.append(id(pool))
        return pool

    def _capture(self, mode: str, num_tokens: int, pool: _Pool, activations: int, overhead: int, body) -> _Graph:
        self.captured.append((mode, num_tokens, pool))
        if num_tokens >= self.oom_at.get(mode, 10**9):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate (scripted)")
        pool.size = max(pool.size, activations) + overhead
        graph = _Graph(body, num_tokens, pool)
        if self.interrupt_at == (mode, num_tokens):
            def interrupt() -> None:
                raise KeyboardInterrupt
            graph.body = interrupt
        return graph

    def capture(self, num_tokens: int, pool: _Pool) -> _Graph:
        return self._capture("full", num_tokens, pool, num_tokens * 1000, 100,
                             lambda: self.model.forward_hidden(num_tokens))

    def capture_piecewise(self, num_tokens: int, pool: _Pool) -> _Graph:
        return self._capture("piecewise", num_tokens, pool, num_tokens * 500, 30,
                             lambda: self.model.split_step(num_tokens))

    def memory(self) -> MemorySnapshot:
        return MemorySnapshot(free_bytes=10**9 - sum(p.size for p in self.pools), total_bytes=10**9)

    def shared(self) -> list[tuple[str, int]]:
        """Captures into the sweep's shared pool (the first pool it asked for), in order."""
        return [(m, w) for m, w, p in self.captured if id(p) == self.pools_made[0]]


def _run(tiny, out: Path, widths, **kw):
    kw.setdefault("compile", False)  # compiling is tested on its own: each compile costs seconds here
    return profile_workload(tiny, out, widths=widths, device="cpu", options=kw.pop("options", FAST),
                            progress=False, **kw)


def test_candidates_cover_grid_decode_widths_and_stride(tiny) -> None:
    widths = candidate_widths(tiny)
    grid = tiny.engine.defaults().sizes
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


def test_eager_and_logits_measured_and_graph_rows_unsupported_on_cpu(tiny, tmp_path) -> None:
    result = _run(tiny, tmp_path, [1, 6, 16])
    profile = read_profile(result.csv_path)
    assert [(r.num_tokens, r.mode, r.status) for r in profile.rows] == [
        (w, m, s) for w in (1, 6, 16)
        for m, s in (("eager", "ok"), ("full", "unsupported"), ("piecewise", "unsupported"), ("logits", "ok"))
    ]
    timed = [r for r in profile.rows if r.mode in ("eager", "logits")]
    assert all(r.latency_ms > 0 for r in timed)
    assert all(r.latency_ms is None and r.capture_delta_bytes is None for r in profile.rows if r not in timed)
    meta = profile.metadata
    assert set(METADATA_KEYS) <= set(meta)
    assert meta["device"] == "cpu" and meta["compiled"] is False and meta["complete"] is True
    assert meta["compile_s"] is None and meta["capture_order"] == CAPTURE_ORDER == "piecewise-then-full"
    assert meta["graphs"] == meta["piecewise"] == "CUDA graphs need a CUDA device"
    # Readings a CPU does not have stay empty rather than invented.
    assert meta["non_kv_cache_bytes"] is None and meta["non_kv"] is None and meta["eager_kernels_per_layer"] is None
    assert meta["workload"] == {"name": "tiny-cpu", "hash": tiny.content_hash, "path": str(tiny.path)}
    assert len(meta["measurements"]["16"]["eager"]["samples_ms"]) == 2
    assert len(meta["measurements"]["16"]["logits"]["samples_ms"]) == 2


def test_capture_order_is_all_piecewise_then_all_full_largest_first_in_one_pool(tiny, tmp_path) -> None:
    runners = []

    def factory(model):
        runners.append(ScriptedGraphs(model))
        return runners[-1]

    result = _run(tiny, tmp_path, [4, 8, 16], runner_factory=factory)
    runner = runners[0]
    # vLLM's order into the shared pool: every PIECEWISE step largest first, then every FULL graph largest first.
    assert runner.shared() == [("piecewise", 16), ("piecewise", 8), ("piecewise", 4),
                               ("full", 16), ("full", 8), ("full", 4)]
    # Each width is also captured alone, just before, each time into a fresh pool of its own.
    assert [(m, w) for m, w, _ in runner.captured] == [
        (m, w) for m in ("piecewise", "full") for w in (16, 8, 4) for _ in range(2)]
    assert len({id(p) for _, _, p in runner.captured}) == 7
    piecewise = {r.num_tokens: r for r in result.rows if r.mode == "piecewise"}
    full = {r.num_tokens: r for r in result.rows if r.mode == "full"}
    # The largest PIECEWISE step pays its activations (16 * 500) + 3 pieces x 10, smaller ones their pieces;
    # the largest FULL graph then needs 16 * 1000 + 100 in a pool that holds 8000 + 90: it adds 8010.
    assert [piecewise[w].capture_delta_bytes for w in (16, 8, 4)] == [8030, 30, 30]
    assert [piecewise[w].standalone_bytes for w in (16, 8, 4)] == [8030, 4030, 2030]
    assert [full[w].capture_delta_bytes for w in (16, 8, 4)] == [16100 - 8090, 100, 100]
    assert [full[w].standalone_bytes for w in (16, 8, 4)] == [16100, 8100, 4100]
    assert all(r.status == "ok" and r.latency_ms > 0 for r in [*piecewise.values(), *full.values()])
    assert result.metadata["capture_order"] == "piecewise-then-full"


def test_out_of_memory_marks_width_and_larger_and_goes_on(tiny, tmp_path) -> None:
    result = _run(tiny, tmp_path, [4, 8, 16, 24, 32], runner_factory=lambda m: ScriptedGraphs(m, oom_at={"full": 16}))
    status = {(r.num_tokens, r.mode): r.status for r in result.rows}
    assert [status[(w, "full")] for w in (4, 8, 16, 24, 32)] == ["ok", "ok", "oom", "oom", "oom"]
    assert all(status[(w, m)] == "ok" for w in (4, 8, 16, 24, 32) for m in ("eager", "piecewise", "logits"))
    full = {r.num_tokens: r for r in result.rows if r.mode == "full"}
    # The first FULL graph that fits: 8 * 1000 + 100 in a pool already holding 32 * 500 + 5 x 30 from PIECEWISE.
    assert full[8].capture_delta_bytes == 100 and full[8].standalone_bytes == 8100
    assert full[32].latency_ms is None and full[32].standalone_bytes is None
    assert "out of memory" in result.metadata["measurements"]["32"]["full_oom"]
    assert read_profile(result.csv_path).by_mode("full").keys() == {4, 8}


def test_piecewise_out_of_memory_leaves_full_graphs_measured(tiny, tmp_path) -> None:
    result = _run(tiny, tmp_path, [4, 8, 16], runner_factory=lambda m: ScriptedGraphs(m, oom_at={"piecewise": 8}))
    status = {(r.num_tokens, r.mode): r.status for r in result.rows}
    assert [status[(w, "piecewise")] for w in (4, 8, 16)] == ["ok", "oom", "oom"]
    assert [status[(w, "full")] for w in (4, 8, 16)] == ["ok", "ok", "ok"]
    full = {r.num_tokens: r for r in result.rows if r.mode == "full"}
    assert full[16].capture_delta_bytes == 16100 - 2030  # only the 4-token PIECEWISE step was in the pool


def test_eager_out_of_memory_marks_graph_too(tiny, tmp_path) -> None:
    class EagerOOM(ScriptedGraphs):
        def eager(self, num_tokens: int) -> None:
            if num_tokens >= 16:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory (scripted)")
            super().eager(num_tokens)

    result = _run(tiny, tmp_path, [8, 16], runner_factory=EagerOOM)
    status = {(r.num_tokens, r.mode): r.status for r in result.rows}
    assert status[(16, "eager")] == status[(16, "full")] == status[(16, "piecewise")] == "oom"
    assert status[(8, "eager")] == status[(8, "full")] == status[(8, "piecewise")] == "ok"
    assert status[(16, "logits")] == "ok"  # the LM head alone still fits


def test_a_capture_error_is_recorded_for_its_width_and_the_sweep_goes_on(tiny, tmp_path) -> None:
    class Broken(ScriptedGraphs):
        def capture(self, num_tokens, pool):
            if num_tokens == 8:  # e.g. an op illegal under capture, or a recompilation inside one
                raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
            return super().capture(num_tokens, pool)

    assert not is_oom(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert is_oom(RuntimeError("CUDA error: out of memory"))
    try:  # ending a capture that an allocation failure invalidated raises its own error
        try:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (scripted)")
        except RuntimeError:
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture")
    except RuntimeError as chained:
        assert is_oom(chained)
    result = _run(tiny, tmp_path, [4, 8, 16], runner_factory=Broken)
    profile = read_profile(result.csv_path)
    status = {(r.num_tokens, r.mode): r.status for r in profile.rows}
    assert status.pop((8, "full")) == "error"
    assert set(status.values()) == {"ok"} and profile.widths() == [4, 8, 16] and result.complete
    meta = profile.metadata
    assert meta["capture_errors"] == [{"mode": "full", "num_tokens": 8, "error": "RuntimeError: CUDA error: operation "
                                                                               "not permitted when stream is capturing"}]
    assert meta["measurements"]["8"]["full_error"].startswith("RuntimeError") and meta["non_kv"] is None
    # The full graph of 4 was captured after the failed one, into the same pool: 100 bytes more, as without it.
    assert {r.num_tokens: r.capture_delta_bytes for r in profile.rows if r.mode == "full"}[4] == 100


def test_an_error_while_timing_leaves_the_widths_already_timed(tiny, tmp_path) -> None:
    class Fails(ScriptedGraphs):
        def logits(self, num_tokens):
            if num_tokens == 8:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            super().logits(num_tokens)

    with pytest.raises(RuntimeError, match="illegal"):  # timing errors are not measurements: they stop the sweep
        _run(tiny, tmp_path, [1, 2, 4, 8, 16], runner_factory=Fails)
    partial = read_profile(tmp_path / "tiny-cpu.csv")
    # Timed in priority order: the smallest, then decode widths (4, 16, 8) and the others (2) alternately; 8 failed.
    assert partial.widths() == [1, 2, 4, 16] and partial.metadata["complete"] is False
    assert partial.metadata["measurements"]["8"]["piecewise_capture"]["free_delta_bytes"] == 30  # captured, kept
    assert _run(tiny, tmp_path, [1, 2, 4, 8, 16], runner_factory=ScriptedGraphs).measured == [8]


def test_interrupted_sweep_resumes_with_the_same_pool(tiny, tmp_path) -> None:
    # Timed in priority order (both ends, then the middle): interrupted while width 8's FULL graph is timed, 4 and 32
    # are done.
    with pytest.raises(KeyboardInterrupt):
        _run(tiny, tmp_path, [4, 8, 16, 32], runner_factory=lambda m: ScriptedGraphs(m, interrupt_at=("full", 8)))
    partial = read_profile(tmp_path / "tiny-cpu.csv")
    assert partial.widths() == [4, 32] and partial.metadata["complete"] is False

    runners = []

    def factory(model):
        runners.append(ScriptedGraphs(model))
        return runners[-1]

    result = _run(tiny, tmp_path, [4, 8, 16, 32], runner_factory=factory)
    assert result.measured == [8, 16] and result.complete
    # The finished widths re-captured (untimed, no standalone) in their places of vLLM's order.
    assert runners[0].shared() == [("piecewise", 32), ("piecewise", 16), ("piecewise", 8), ("piecewise", 4),
                                   ("full", 32), ("full", 16), ("full", 8), ("full", 4)]
    rows = read_profile(result.csv_path).rows
    piecewise = {r.num_tokens: r for r in rows if r.mode == "piecewise"}
    full = {r.num_tokens: r for r in rows if r.mode == "full"}
    # As one uninterrupted sweep: PIECEWISE 32 * 500 + 30 then 30 each; FULL 32100 into a pool of 16120.
    assert [piecewise[w].capture_delta_bytes for w in (32, 16, 8, 4)] == [16030, 30, 30, 30]
    assert [full[w].capture_delta_bytes for w in (32, 16, 8, 4)] == [32100 - 16120, 100, 100, 100]


def test_max_seconds_stops_early_and_rerun_completes(tiny, tmp_path) -> None:
    stopped = _run(tiny, tmp_path, [1, 2, 3], options=SweepOptions(0, 0, 1, 1, max_seconds=0))
    assert not stopped.complete and stopped.measured == []
    done = _run(tiny, tmp_path, [1, 2, 3])
    assert done.complete and done.measured == [1, 2, 3]  # the smallest first: a key width


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
    import tuner.profile.table as table

    real_replace = table.os.replace
    calls = {"n": 0}

    def failing_replace(src, dst):
        calls["n"] += 1
        # The metadata alone before the first width, then JSON and CSV per width: from the JSON of the second width
        # on, the disk is full.
        if calls["n"] >= 4:
            raise OSError("disk full (scripted)")
        return real_replace(src, dst)

    monkeypatch.setattr(table.os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        _run(tiny, tmp_path, [4, 8])
    monkeypatch.setattr(table.os, "replace", real_replace)
    assert read_profile(tmp_path / "tiny-cpu.csv").widths() == [4]  # the last complete table, never a part
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


def test_fake_clock_drives_the_reported_statistics_and_noisy_widths(tiny, tmp_path) -> None:
    class Clocked(StepRunner):
        def __init__(self, model):
            # Width 4 (timed first, the smallest): eager noisy, logits steady; width 8: eager steady, logits noisy.
            # Each timing is one estimating call, then 3 repetitions (no warm-up budget).
            super().__init__(model, clock=FakeClock([3.0, 1.0, 2.0, 30.0] + [1.0, 1.0, 1.0, 1.0]
                                                    + [1.0, 1.0, 1.0, 1.0] + [1.0, 1.0, 1.0, 2.0]))

    result = _run(tiny, tmp_path, [4, 8], runner_factory=Clocked, options=SweepOptions(0, 0, 3, 3))
    rows = {(r.num_tokens, r.mode): r for r in result.rows}
    assert rows[(4, "eager")].latency_ms == 2.0 and rows[(4, "eager")].latency_iqr_ms == pytest.approx(14.5)
    assert rows[(8, "logits")].latency_ms == 1.0 and rows[(8, "logits")].latency_iqr_ms == pytest.approx(0.5)
    measurements = result.metadata["measurements"]
    assert measurements["4"]["eager"]["noisy"] is True and measurements["4"]["logits"]["noisy"] is False
    assert measurements["8"]["eager"]["noisy"] is False and measurements["8"]["logits"]["noisy"] is True
    assert result.metadata["noisy_widths"] == [4, 8]  # a width counts when any of its timings is noisy


def test_logits_rows_and_no_timed_mode_computes_logits_over_more_than_its_width(tiny, tmp_path) -> None:
    class Counting(ScriptedGraphs):
        """Records (width being timed, tokens the LM head ran over) for every logits computation."""

        def __init__(self, model):
            super().__init__(model)
            self.width = None
            self.logit_calls = []
            real = model.logits

            def logits(hidden):
                self.logit_calls.append((self.width, hidden.shape[0]))
                return real(hidden)

            model.logits = logits

        def eager(self, num_tokens):
            self.width = num_tokens
            super().eager(num_tokens)

        def replay(self, graph):
            self.width = graph.num_tokens
            super().replay(graph)

        def logits(self, num_tokens):
            self.width = num_tokens
            super().logits(num_tokens)

    runners = []
    result = _run(tiny, tmp_path, [3, 8, 13], runner_factory=lambda m: runners.append(Counting(m)) or runners[-1])
    logits = {r.num_tokens: r for r in result.rows if r.mode == "logits"}
    assert sorted(logits) == [3, 8, 13] and all(r.status == "ok" and r.latency_ms > 0 for r in logits.values())
    calls = runners[0].logit_calls
    assert {w for w, _ in calls} == {3, 8, 13}
    assert all(tokens == width for width, tokens in calls)  # the width's own tokens: never padding


def test_non_kv_memory_from_scripted_snapshots(tiny, tmp_path, monkeypatch) -> None:
    """vLLM's non-KV memory: free-memory drop from before the weights to after the profiling step, KV cache
    excluded, plus the step's peak headroom. Every reading here is scripted (fixture bytes, not measured)."""
    class Readings(StepRunner):
        def __init__(self, model):
            super().__init__(model)
            self.snapshots = [
                MemorySnapshot(free_bytes=9_000, reserved_bytes=1_000),  # before the KV cache
                MemorySnapshot(free_bytes=8_000, reserved_bytes=2_000),  # after it: the cache took 1000
                MemorySnapshot(free_bytes=7_400, reserved_bytes=2_300),  # after the profiling step
            ]

        def memory(self):
            return self.snapshots.pop(0) if self.snapshots else MemorySnapshot()

        def profile_memory(self, fn):
            fn()
            return 900, 250  # peak allocated during the step, allocated after it

    monkeypatch.setattr(profile_module, "snapshot", lambda device: MemorySnapshot(free_bytes=10_000,
                                                                                  reserved_bytes=0))
    meta = _run(tiny, tmp_path, [4], runner_factory=Readings).metadata
    # consumed = 10000 - 7400 - 1000 (KV) = 1600; headroom = 900 - 250 = 650
    assert meta["non_kv_cache_bytes"] == 1600 + 650
    non_kv = meta["non_kv"]
    assert non_kv["total_consumed_bytes"] == 1600 and non_kv["peak_headroom_bytes"] == 650
    assert non_kv["kv_cache_excluded_bytes"] == 1000
    # torch holds 2300 - 0 - 1000 (KV) = 1300 of the 1600: the other 300 is memory torch's allocator does not see.
    assert non_kv["non_torch_bytes"] == 300
    assert non_kv["weights_bytes"] > 0 and non_kv["torch_other_bytes"] == (
        1300 - non_kv["weights_bytes"] - non_kv["persistent_buffers_bytes"])
    assert (non_kv["profile_run_tokens"], non_kv["profile_run_requests"]) == (1024, 160)


def test_sweep_time_estimate_is_budgets_plus_assumed_captures() -> None:
    options = SweepOptions(warmup_ms=25, rep_ms=100, standalone=True)
    seconds, how = estimate_sweep_s(10, options, graphs=True, num_layers=32)
    # 10 widths x 4 modes x 0.125 s = 5 s; 10 x (33 pieces + 1 full) x 2 captures x 5 ms = 3.4 s
    assert seconds == pytest.approx(5 + 3.4)
    assert "assumed 5 ms" in how and "on top" in how
    cpu_s, cpu_how = estimate_sweep_s(10, SweepOptions(warmup_ms=2, rep_ms=10), graphs=False, num_layers=2)
    assert cpu_s == pytest.approx(10 * 2 * 0.012) and "capture" not in cpu_how


def test_no_time_left_after_compiling_captures_nothing_and_keeps_the_metadata(tiny, tmp_path) -> None:
    """Set-up and compilation ate the time: no width is started (none could finish), the metadata is written, and a
    rerun measures everything with the whole pool in vLLM's order."""
    first = _run(tiny, tmp_path, [4, 8, 16], runner_factory=ScriptedGraphs,
                 options=SweepOptions(0, 0, 1, 1, max_seconds=0))
    assert first.measured == [] and not first.complete
    assert not (tmp_path / "tiny-cpu.csv").exists()
    meta = json.loads((tmp_path / "tiny-cpu.json").read_text())
    assert meta["widths_done"] == [] and meta["widths_left_for_time"] == [4, 8, 16] and meta["complete"] is False
    runners = []
    rest = _run(tiny, tmp_path, [4, 8, 16], runner_factory=lambda m: runners.append(ScriptedGraphs(m)) or runners[-1])
    assert sorted(rest.measured) == [4, 8, 16] and rest.complete
    assert runners[0].shared() == [("piecewise", 16), ("piecewise", 8), ("piecewise", 4),
                                   ("full", 16), ("full", 8), ("full", 4)]


def test_kernel_count_is_recorded_after_every_timing(tiny, tmp_path) -> None:
    class Kernels(ScriptedGraphs):
        def __init__(self, model):
            super().__init__(model)
            self.events = []

        def logits(self, num_tokens):
            self.events.append(("logits", num_tokens))
            super().logits(num_tokens)

        def kernels_per_layer(self, num_tokens):
            self.events.append(("kernels", num_tokens))
            return {"per_layer": 12.5, "per_step": 25, "num_layers": 2}  # scripted, not a profiler reading

    runners = []
    meta = _run(tiny, tmp_path, [8, 16], runner_factory=lambda m: runners.append(Kernels(m)) or runners[-1]).metadata
    assert runners[0].events[-1] == ("kernels", 4)  # one request of q = 4 tokens, after the last timing
    assert meta["eager_kernels_per_layer"] == 12.5
    assert meta["eager_kernels"] == {"per_layer": 12.5, "per_step": 25, "num_layers": 2, "num_tokens": 4}
