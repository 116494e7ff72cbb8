"""The drafter in the profile sweep, on a CPU: which widths and graph modes it gets per runner and method, its
stand-in sharing the target's tensors, its graphs in vLLM's order in the one shared pool, its rows, metadata, resume
and the non-KV memory; scripted graph runners stand in for CUDA (their byte counts and memory readings are test
fixtures, not measurements)."""

from __future__ import annotations

import json
import weakref
from pathlib import Path

import pytest
import torch

from tuner.cli import main
from tuner.measure.decoder import build_model
from tuner.measure.drafter import build_drafter, drafter_plan, pool_sequence
from tuner.measure.memory import MemorySnapshot
from tuner.measure.profile import StepRunner, SweepOptions, estimate_sweep_s, profile_workload
from tuner.measure.timing import WallClock
from tuner.profile.table import read_profile
from tuner.workload.spec import parse_workload

FAST = SweepOptions(warmup_ms=0, rep_ms=0, min_reps=2, max_reps=2)


def _workload(method: str = "eagle", *, max_num_seqs: int = 2, k: int = 3, drafter: dict | None = None,
              **serving):
    """The tiny model (2 layers, hidden 64, vocab 256) with a drafter; q = k + 1."""
    speculative = {"method": method, **({"drafter": drafter} if drafter is not None else {})}
    if "parallel_drafting" in serving:
        speculative["parallel_drafting"] = serving.pop("parallel_drafting")
    return parse_workload({
        "name": f"tiny-{method}",
        "model": {"preset": "tiny", "dtype": "float32"},
        "speculative": speculative,
        "serving": {"max_num_seqs": max_num_seqs, "num_speculative_tokens": k, "max_num_batched_tokens": 64,
                    "max_model_len": 256, **serving},
        "traffic": {"requests": {"kind": "uniform", "min": 1, "max": max_num_seqs}, "mean_context_len": 16},
    })


# --------------------------------------------------------------------------------------------- the plan
def test_widths_and_graph_modes_follow_the_runner_and_method() -> None:
    # V2 EAGLE, K = 3, max_num_seqs 2: its decode steps run 1 or 2 tokens, and 1 and 2 are candidates (vLLM's grid).
    eagle = drafter_plan(_workload(), [4, 8])
    assert eagle.runner == "v2" and eagle.graph_modes == ("piecewise", "full")
    assert eagle.widths == (1, 2, 4, 8) and eagle.request_widths == (1, 2)
    assert eagle.row_modes == ("drafter_eager", "drafter_piecewise", "drafter_full")
    assert (eagle.shares_embedding, eagle.shares_lm_head, eagle.kv_layers) == (True, True, 1)
    # V2 DFlash: FULL query graphs only, one pass of N x q tokens: no request-count widths.
    dflash = drafter_plan(_workload("dflash", drafter={"num_layers": 2}), [4, 8])
    assert dflash.graph_modes == ("full",) and dflash.widths == (4, 8) and dflash.kv_layers == 2
    # V2 draft_model captures nothing (its speculator's capture is a no-op) and never shares.
    draft = drafter_plan(_workload("draft_model", drafter={"num_layers": 1}), [4, 8])
    assert draft.graph_modes == () and draft.widths == (1, 2, 4, 8)
    assert (draft.shares_embedding, draft.shares_lm_head) == (False, False)
    # V1 (forced): PIECEWISE only; an N-token pass pads to the rewritten list's multiples of q = 4: 2 requests -> 4.
    v1 = drafter_plan(_workload(model_runner="v1"), [8])
    assert v1.runner == "v1" and v1.graph_modes == ("piecewise",) and v1.widths == (4, 8)
    # P-EAGLE drafts in one pass (V1): no request-count widths; K = 1 has no later passes either.
    assert drafter_plan(_workload(parallel_drafting=True), [8]).widths == (8,)
    assert drafter_plan(_workload(k=1), [8]).widths == (8,)
    # No graphs without a mode that has them; explicit widths replace the default ones.
    assert drafter_plan(_workload(cudagraph_mode="NONE"), [8]).graph_modes == ()
    assert drafter_plan(_workload(), [4, 8], widths=[8, 3]).widths == (3, 8)
    assert drafter_plan(parse_workload({
        "name": "plain", "model": {"preset": "tiny", "dtype": "float32"},
        "serving": {"max_num_seqs": 2}, "traffic": {"requests": {"kind": "uniform", "min": 1, "max": 2}},
    }), [8]) is None


def test_an_explicit_sharing_is_kept() -> None:
    plan = drafter_plan(_workload(drafter={"shares_lm_head": False}), [4])
    assert (plan.shares_embedding, plan.shares_lm_head) == (True, False)


def test_pool_order_per_runner() -> None:
    # V2: every target graph, PIECEWISE then FULL largest first, then the drafter's in its modes' order.
    assert pool_sequence("v2", [4, 8], ["piecewise", "full"], [1, 8], ["piecewise", "full"]) == [
        ("target", "piecewise", 8), ("target", "piecewise", 4), ("target", "full", 8), ("target", "full", 4),
        ("drafter", "piecewise", 8), ("drafter", "piecewise", 1), ("drafter", "full", 8), ("drafter", "full", 1)]
    # V1: the drafter's PIECEWISE graph right after the target's of its width; a width only the drafter has (4)
    # where the target's PIECEWISE graph of that width would have been.
    assert pool_sequence("v1", [2, 8], ["piecewise", "full"], [2, 4, 8], ["piecewise"]) == [
        ("target", "piecewise", 8), ("drafter", "piecewise", 8), ("drafter", "piecewise", 4),
        ("target", "piecewise", 2), ("drafter", "piecewise", 2), ("target", "full", 8), ("target", "full", 2)]


def test_the_stand_in_shares_the_targets_tensors_and_counts_its_own_weights() -> None:
    workload = _workload(drafter={"num_layers": 2})
    target = build_model(workload, 8, "cpu")
    plan = drafter_plan(workload, [8])
    drafter = build_drafter(workload, plan, target, 8)
    assert drafter.embed is target.embed and drafter.lm_head is target.lm_head
    assert len(drafter.layers) == 2 and drafter.layers[0].kv_cache is not None
    assert drafter.layers[0].kv_cache.data_ptr() != target.layers[0].kv_cache.data_ptr()
    # Its own bytes are what the cost model adds for it: the shape's weights less the shared embedding and head.
    assert drafter.weight_bytes() == workload.drafter_weight_bytes() > 0
    own = _workload("draft_model", drafter={"num_layers": 1})
    t = build_model(own, 8, "cpu")
    d = build_drafter(own, drafter_plan(own, [8]), t, 8)
    assert d.embed is not t.embed and d.weight_bytes() == own.drafter_weight_bytes() == own.drafter.weight_bytes(
        "float32")
    assert d.step(8).shape == (8, 256)


# --------------------------------------------------------------------------------------------- scripted sweeps
class _Pool:
    def __init__(self) -> None:
        self.size = 0


class _Graph:
    def __init__(self, body, num_tokens: int) -> None:
        self.body, self.num_tokens, self.capture_s = body, num_tokens, 0.0

    def replay(self) -> None:
        self.body()


class Scripted(StepRunner):
    """Pretends to capture graphs into pools the target's runner makes: a FULL graph of width w keeps `unit * w`
    bytes of activations in its pool and a PIECEWISE step half that (a pool keeps only the largest), plus 100 bytes
    per FULL graph and 10 per piece; every capture is appended to the shared `log` as (owner, mode, width, pool)."""

    def __init__(self, model, owner: str, unit: int, log: list, pools: weakref.WeakSet, made: list,
                 interrupt: tuple[str, int] | None = None) -> None:
        super().__init__(model, clock=WallClock())
        self.graphs_supported, self.unsupported_reason = True, None
        self.owner, self.unit, self.log, self.pools, self.made = owner, unit, log, pools, made
        self.interrupt = interrupt

    def new_pool(self) -> _Pool:
        pool = _Pool()
        self.pools.add(pool)
        self.made.append(id(pool))
        return pool

    def memory(self) -> MemorySnapshot:
        return MemorySnapshot(free_bytes=10**9 - sum(p.size for p in self.pools), total_bytes=10**9)

    def _graph(self, mode: str, w: int, pool: _Pool, activations: int, overhead: int, body) -> _Graph:
        self.log.append((self.owner, mode, w, pool))
        pool.size = max(pool.size, activations) + overhead
        graph = _Graph(body, w)
        graph.pool = pool  # type: ignore[attr-defined]  # a live graph keeps its pool, as a CUDA graph does
        if self.interrupt == (mode, w):
            def stop() -> None:
                raise KeyboardInterrupt
            graph.body = stop
        return graph

    def capture(self, num_tokens: int, pool: _Pool) -> _Graph:
        return self._graph("full", num_tokens, pool, self.unit * num_tokens, 100,
                           lambda: self.model.forward_hidden(num_tokens))

    def capture_piecewise(self, num_tokens: int, pool: _Pool) -> _Graph:
        pieces = len(self.model.layers) + 1
        return self._graph("piecewise", num_tokens, pool, self.unit * num_tokens // 2, 10 * pieces,
                           lambda: self.model.split_step(num_tokens))


def _scripted(**kw):
    """A runner factory (the target's runner first, then the drafter's: 1000 and 100 bytes per token) and what they
    record: the shared capture log and the ids of the pools made, the shared pool first."""
    log: list = []
    made: list = []
    pools: weakref.WeakSet = weakref.WeakSet()
    runners: dict[str, Scripted] = {}

    def factory(model):
        owner = "drafter" if runners else "target"
        runners[owner] = Scripted(model, owner, 1000 if owner == "target" else 100, log, pools, made,
                                  kw.get(f"{owner}_interrupt"))
        return runners[owner]

    def shared() -> list[tuple[str, str, int]]:
        return [(o, m, w) for o, m, w, p in log if id(p) == made[0]]

    return factory, runners, shared


def _sweep(workload, out: Path, widths, **kw):
    kw.setdefault("options", FAST)
    kw.setdefault("device", "cpu")
    return profile_workload(workload, out, widths=widths, compile=False, progress=False, **kw)


def _rows(result) -> dict[tuple[int, str], object]:
    return {(r.num_tokens, r.mode): r for r in result.rows}


def test_v2_eagle_drafter_graphs_enter_the_pool_after_every_target_graph(tmp_path) -> None:
    factory, runners, shared = _scripted()
    result = _sweep(_workload(), tmp_path, [4, 8], runner_factory=factory)
    assert shared() == [
        ("target", "piecewise", 8), ("target", "piecewise", 4), ("target", "full", 8), ("target", "full", 4),
        *[("drafter", "piecewise", w) for w in (8, 4, 2, 1)], *[("drafter", "full", w) for w in (8, 4, 2, 1)]]
    rows = _rows(result)
    # Target: PIECEWISE 8 x 500 + 3 pieces x 10, then 30; FULL 8000 + 100 into a pool of 4060, then 100.
    assert [rows[(w, "piecewise")].capture_delta_bytes for w in (8, 4)] == [4030, 30]
    assert [rows[(w, "full")].capture_delta_bytes for w in (8, 4)] == [8100 - 4060, 100]
    # Drafter (1 layer, 100 bytes per token): the pool already holds 8000 bytes of activations, so each graph adds
    # its overhead only (2 pieces x 10; 100); alone, w x 50 + 20 and w x 100 + 100.
    for w in (8, 4, 2, 1):
        pw, full = rows[(w, "drafter_piecewise")], rows[(w, "drafter_full")]
        assert (pw.status, pw.capture_delta_bytes, pw.standalone_bytes) == ("ok", 20, w * 50 + 20)
        assert (full.status, full.capture_delta_bytes, full.standalone_bytes) == ("ok", 100, w * 100 + 100)
        assert rows[(w, "drafter_eager")].status == "ok" and rows[(w, "drafter_eager")].latency_ms > 0
    # The request-count widths 1 and 2 are the drafter's alone: no target rows there.
    assert {w for w, m in rows if not m.startswith("drafter_")} == {4, 8}
    # Timed in priority order: the smallest width (the drafter's alone) first, then both ends' spread.
    assert result.measured == [8, 4] and result.drafter_measured == [1, 8, 4, 2] and result.complete
    meta = read_profile(result.csv_path).metadata
    drafter = meta["drafter"]
    assert drafter["method"] == "eagle" and drafter["shape"] == _workload().drafter.as_dict()
    assert drafter["weights_bytes"] == _workload().drafter_weight_bytes() and drafter["kv_layers"] == 1
    assert drafter["graph_modes"] == ["piecewise", "full"] and drafter["widths_done"] == [1, 2, 4, 8]
    assert set(drafter["measurements"]["8"]) >= {"eager", "piecewise", "full", "piecewise_capture", "capture"}
    assert meta["widths_done"] == [4, 8]


def test_v2_dflash_drafter_has_full_graphs_only(tmp_path) -> None:
    factory, _, shared = _scripted()
    result = _sweep(_workload("dflash", drafter={"num_layers": 2}), tmp_path, [4, 8], runner_factory=factory)
    assert [e for e in shared() if e[0] == "drafter"] == [("drafter", "full", 8), ("drafter", "full", 4)]
    modes = {m for _, m in _rows(result)}
    assert "drafter_piecewise" not in modes and {"drafter_eager", "drafter_full"} <= modes


def test_v1_drafter_graph_follows_the_targets_piecewise_graph_of_its_width(tmp_path) -> None:
    factory, _, shared = _scripted()
    result = _sweep(_workload(model_runner="v1"), tmp_path, [8], runner_factory=factory)
    # Width 4 is the drafter's alone (two requests' decode pass pads to it): it comes where the target's would.
    assert shared() == [("target", "piecewise", 8), ("drafter", "piecewise", 8), ("drafter", "piecewise", 4),
                        ("target", "full", 8)]
    rows = _rows(result)
    assert "drafter_full" not in {m for _, m in rows}
    # The drafter's PIECEWISE 8 enters a pool holding the target's 4000 + 30: it adds its 2 pieces' 20 bytes.
    assert rows[(8, "drafter_piecewise")].capture_delta_bytes == 20
    assert rows[(8, "full")].capture_delta_bytes == 8100 - 4070


def test_draft_model_on_v2_gets_eager_rows_only(tmp_path) -> None:
    factory, _, shared = _scripted()
    result = _sweep(_workload("draft_model", drafter={"num_layers": 1}), tmp_path, [4], runner_factory=factory)
    assert all(o == "target" for o, _, _ in shared())
    assert sorted(m for (w, m) in _rows(result) if m.startswith("drafter_")) == ["drafter_eager"] * 3  # 1, 2, 4


def test_cpu_drafter_rows_are_eager_with_graph_rows_unsupported(tmp_path) -> None:
    result = _sweep(_workload(), tmp_path, [4, 8])
    rows = _rows(result)
    for w in (1, 2, 4, 8):
        assert rows[(w, "drafter_eager")].status == "ok" and rows[(w, "drafter_eager")].latency_ms > 0
        assert rows[(w, "drafter_piecewise")].status == rows[(w, "drafter_full")].status == "unsupported"
    meta = result.metadata
    assert meta["drafter"]["measurements"]["1"]["full_unsupported"] == "CUDA graphs need a CUDA device"
    assert meta["non_kv_cache_bytes"] is None  # nothing read on a CPU


def test_interrupted_drafter_timing_resumes_with_the_pool_rebuilt(tmp_path) -> None:
    workload = _workload()
    factory, _, _ = _scripted(drafter_interrupt=("full", 2))
    with pytest.raises(KeyboardInterrupt):  # while the drafter's FULL graph at 2 is timed
        _sweep(workload, tmp_path, [4, 8], runner_factory=factory)
    partial = read_profile(tmp_path / "tiny-eagle.csv")
    assert partial.metadata["widths_done"] == [4, 8] and partial.metadata["drafter"]["widths_done"] == [1, 4, 8]
    assert partial.metadata["complete"] is False

    factory, _, shared = _scripted()
    result = _sweep(workload, tmp_path, [4, 8], runner_factory=factory)
    assert result.measured == [] and result.drafter_measured == [2] and result.complete
    # Every graph re-captured (untimed) in its place, so the drafter's deltas read as in one sweep.
    assert shared() == [
        ("target", "piecewise", 8), ("target", "piecewise", 4), ("target", "full", 8), ("target", "full", 4),
        *[("drafter", "piecewise", w) for w in (8, 4, 2, 1)], *[("drafter", "full", w) for w in (8, 4, 2, 1)]]
    rows = _rows(result)
    assert rows[(2, "drafter_piecewise")].capture_delta_bytes == 20 and rows[(8, "full")].capture_delta_bytes == 4040
    assert read_profile(result.csv_path).metadata["drafter"]["widths_done"] == [1, 2, 4, 8]


def test_resume_refuses_dropped_drafter_widths(tmp_path) -> None:
    _sweep(_workload(), tmp_path, [4, 8])
    with pytest.raises(ValueError, match="widths this run does not ask for"):
        _sweep(_workload(), tmp_path, [4, 8], drafter_widths=[4, 8])


def test_no_time_left_leaves_the_drafter_widths_for_the_rerun_too(tmp_path) -> None:
    factory, _, _ = _scripted()
    first = _sweep(_workload(), tmp_path, [4, 8], runner_factory=factory,
                   options=SweepOptions(0, 0, 1, 1, max_seconds=0))
    assert first.measured == [] and first.drafter_measured == [] and not first.complete
    assert first.metadata["widths_left_for_time"] == [1, 2, 4, 8]
    factory, _, _ = _scripted()
    rest = _sweep(_workload(), tmp_path, [4, 8], runner_factory=factory)
    assert rest.measured == [8, 4] and rest.drafter_measured == [1, 8, 4, 2] and rest.complete


def test_non_kv_memory_counts_the_drafter_and_its_profiling_pass(tmp_path, monkeypatch) -> None:
    from tuner.measure import profile as profile_module

    calls = []

    class Readings(StepRunner):
        def __init__(self, model):
            super().__init__(model)
            self.snapshots = [MemorySnapshot(free_bytes=9_000), MemorySnapshot(free_bytes=8_000),
                              MemorySnapshot(free_bytes=7_000)]

        def memory(self):
            return self.snapshots.pop(0) if self.snapshots else MemorySnapshot()

        def profile_memory(self, fn):
            real = type(self.model).profile_run

            def record(model, tokens, requests):
                calls.append((len(model.layers), tokens, requests))
                return real(model, tokens, requests)

            monkeypatch.setattr(type(self.model), "profile_run", record)
            fn()
            monkeypatch.setattr(type(self.model), "profile_run", real)
            return 500, 100  # scripted: peak allocated during the step, allocated after it

    monkeypatch.setattr(profile_module, "snapshot", lambda device: MemorySnapshot(free_bytes=10_000))
    workload = _workload(drafter={"num_layers": 2})
    meta = _sweep(workload, tmp_path, [4], runner_factory=Readings).metadata
    # The target's profiling step, then the drafter's pass over the same tokens (64 over 2 requests).
    assert calls == [(2, 64, 2), (2, 64, 2)]
    # consumed = 10000 - 7000 - 1000 (both KV caches) = 2000; headroom 400.
    assert meta["non_kv_cache_bytes"] == 2400
    target_weights = workload.model.weight_bytes()
    assert meta["non_kv"]["weights_bytes"] == target_weights + workload.drafter_weight_bytes()
    assert meta["non_kv"]["drafter_weights_bytes"] == meta["drafter"]["weights_bytes"]
    assert meta["weights_bytes"] == target_weights  # the target's alone, as before


def test_sweep_estimate_counts_the_drafter() -> None:
    plan = drafter_plan(_workload("dflash", drafter={"num_layers": 5}), [8])
    options = SweepOptions(warmup_ms=25, rep_ms=100, standalone=True)
    seconds, how = estimate_sweep_s(10, options, graphs=True, num_layers=32, drafter=plan, drafter_widths=4)
    # Target 10 x 4 modes, drafter 4 x (eager + FULL) = 48 timings x 0.125 s; captures: 10 x 34 x 2 + 4 x 1 x 2.
    assert seconds == pytest.approx(48 * 0.125 + (680 + 8) * 0.005)
    assert "4 drafter widths x 2" in how


# --------------------------------------------------------------------------------------------- the command
def _write(tmp_path: Path, **serving) -> Path:
    path = tmp_path / "tiny-eagle.yaml"
    path.write_text(json.dumps({
        "name": "tiny-eagle", "model": {"preset": "tiny", "dtype": "float32"}, "speculative": {"method": "eagle"},
        "serving": {"max_num_seqs": 16, "num_speculative_tokens": 3, "max_num_batched_tokens": 128,
                    "max_model_len": 256, **serving},
        "traffic": {"requests": {"kind": "uniform", "min": 1, "max": 16}, "mean_context_len": 16}}))
    return path


def test_dry_run_lists_the_drafter_widths(tmp_path, capsys) -> None:
    assert main(["profile", str(_write(tmp_path)), "--device", "cpu", "--out", str(tmp_path / "o"),
                 "--sizes", "8", "64", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "drafter (eagle, 1 layer, runner v2, graphs PIECEWISE/FULL: unsupported on cpu): 2 widths: 8 64" in out
    assert main(["profile", str(_write(tmp_path)), "--device", "cpu", "--out", str(tmp_path / "o"),
                 "--max-widths", "4", "--dry-run"]) == 0
    out = capsys.readouterr().out
    # The thinned sweep (1 44 64 128) plus the request counts it lacks (candidates <= 16: 2 4 8 12 16), thinned to
    # 4 the same way (ends kept, the rest spread by rank).
    assert "tiny-eagle: 4 widths on cpu (compiled): 1 44 64 128" in out
    assert ("8 widths: 1 2 4 12 16 44 64 128; 4 of them (2 4 12 16) are request counts its N-token passes pad to"
            in out)
    assert "4 widths x 2 timed modes + 8 drafter widths x 1 x 2+10 ms budgets" in out
    assert not (tmp_path / "o").exists()


def test_profile_command_writes_the_drafter_rows(tmp_path, capsys) -> None:
    assert main(["profile", str(_write(tmp_path)), "--device", "cpu", "--out", str(tmp_path / "o"),
                 "--sizes", "4", "8", "--no-compile", "--no-progress"]) == 0
    out = capsys.readouterr().out
    profile = read_profile(tmp_path / "o" / "tiny-eagle.csv")
    assert set(profile.by_mode("drafter_eager")) == {4, 8}  # --sizes: exactly these, the drafter's too
    assert "drafter: eagle (1 layer, runner v2, graphs PIECEWISE/FULL)" in out and "drafter    eager ms" in out
    assert profile.metadata["drafter"]["weights_bytes"] > 0


def test_shared_tensor_of_another_shape_is_refused() -> None:
    from tuner.measure.decoder import DecodeModel, ShardShape
    from tuner.shapes import PRESETS

    shard = ShardShape.for_rank(PRESETS["tiny"])
    with pytest.raises(ValueError, match=r"shared_embed: \(7, 64\) torch.float32 on cpu must be \(256, 64\)"):
        DecodeModel(shard, max_num_tokens=3, decode_query_len=1, context_len=4, dtype=torch.float32,
                    shared_embed=torch.zeros(7, 64))


# --------------------------------------------------------------------------------------------- on CUDA
@pytest.mark.gpu
def test_drafter_sweep_and_replays_on_cuda(tmp_path) -> None:
    """On a CUDA device (run by scripts/gpu_run.py): every drafter row of a V2 EAGLE workload is measured, its
    standalone footprints are real, non-KV memory counts its weights, and its graphs, captured after the target's in
    one pool, replay its eager pass (the target's embedding and LM head shared)."""
    from tuner.measure.graphs import capture, new_pool, release_memory
    from tuner.measure.piecewise import capture_piece, capture_piecewise

    workload = _workload(drafter={"num_layers": 2})
    result = _sweep(workload, tmp_path, [4, 8], device="cuda", options=SweepOptions(warmup_ms=2, rep_ms=5, min_reps=2))
    rows = _rows(result)
    for w in (1, 2, 4, 8):
        for mode in ("drafter_eager", "drafter_piecewise", "drafter_full"):
            assert rows[(w, mode)].status == "ok" and rows[(w, mode)].latency_ms > 0, (w, mode)
        assert rows[(w, "drafter_full")].standalone_bytes > 0
    meta = result.metadata
    assert meta["non_kv"]["weights_bytes"] == workload.model.weight_bytes() + workload.drafter_weight_bytes()
    release_memory("cuda", collect=True)

    target = build_model(workload, 8, "cuda")
    drafter = build_drafter(workload, drafter_plan(workload, [8]), target, 8)
    pool = new_pool()
    graphs = []
    for model in (target, drafter):  # V2: the drafter's graphs after the target's, one pool
        for w in (8, 4):
            model.step(w)
            model.split_step(w)
            graphs.append((model, w, capture_piecewise(model, w, lambda fn, w=w: capture_piece(fn, w, pool), pool)))
        for w in (8, 4):
            graphs.append((model, w, capture(lambda m=model, w=w: m.forward_hidden(w), w, pool=pool)))
    for model, w, graph in graphs:
        eager = model.step(w).float()
        model.hidden_out.zero_()
        graph.replay()
        torch.testing.assert_close(model.logits(model.hidden_out[:w]).float(), eager, rtol=1e-3, atol=1e-3)
    del graphs
    release_memory("cuda")
