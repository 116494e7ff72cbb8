"""On a CUDA device: FULL and PIECEWISE graph replay reproduce the eager step (plain and compiled), graph memory
and vLLM's non-KV memory read sensibly, the eager step's kernels are counted (skipped without CUDA; run by
scripts/gpu_run.py)."""

from __future__ import annotations

import pytest
import torch

from tuner.measure.decoder import DecodeModel, ShardShape, attention_kernel
from tuner.measure.graphs import capture, new_pool, release_memory
from tuner.measure.piecewise import capture_piece, capture_piecewise
from tuner.measure.profile import SweepOptions, candidate_widths, profile_workload
from tuner.shapes import PRESETS, ModelShape
from tuner.workload.spec import parse_workload

pytestmark = pytest.mark.gpu

# Small enough to capture ~100 graphs in seconds, with GQA (8 heads over 2 KV heads), qk-norm and q = 4.
SMALL = ModelShape(512, 4, 8, 2, 64, 1536, 4096, qk_norm=True)


def _workload(shape: ModelShape, **serving: object):
    model = {k: v for k, v in shape.as_dict().items()}
    spec = {
        "name": "gpu-test",
        "model": {**model, "dtype": "bfloat16"},
        "serving": {"max_num_seqs": 64, "num_speculative_tokens": 3, "max_num_batched_tokens": 1024,
                    "max_model_len": 4096, **serving},
        "traffic": {"requests": {"kind": "uniform", "min": 1, "max": 64}, "mean_context_len": 300},
    }
    return parse_workload(spec)


def _capture_in_vllms_order(model: DecodeModel, widths: list[int]) -> tuple[dict, dict]:
    """Every PIECEWISE step largest first, then every FULL graph largest first, into one pool, each warmed first."""
    pool = new_pool()
    piecewise, full = {}, {}
    for w in sorted(widths, reverse=True):
        model.step(w)
        model.split_step(w)
        piecewise[w] = capture_piecewise(model, w, lambda fn, w=w: capture_piece(fn, w, pool), pool)
    for w in sorted(widths, reverse=True):
        model.step(w)
        full[w] = capture(lambda w=w: model.forward_hidden(w), w, pool=pool)
    return piecewise, full


def _check_replays(model: DecodeModel, widths: list[int], piecewise: dict, full: dict) -> None:
    """Each width replayed after every graph is captured (so memory later graphs reused is rewritten at replay),
    FULL and PIECEWISE, against the eager step."""
    for w in widths:
        eager = model.step(w).float()
        for mode, graph in (("full", full[w]), ("piecewise", piecewise[w])):
            model.hidden_out.zero_()  # a replay that wrote nothing would otherwise read the eager step's output
            graph.replay()
            replayed = model.logits(model.hidden_out[:w]).float()
            torch.testing.assert_close(replayed, eager, rtol=2e-2, atol=3e-2, msg=lambda m: f"{mode} {w}: {m}")


def test_graph_replay_matches_eager_at_every_width() -> None:
    workload = _workload(SMALL)
    widths = candidate_widths(workload)
    model = DecodeModel(ShardShape.for_rank(SMALL), max_num_tokens=max(widths), decode_query_len=4,
                        context_len=300, dtype=torch.bfloat16, device="cuda")
    piecewise, full = _capture_in_vllms_order(model, widths)
    assert all(len(g.pieces) == SMALL.num_layers + 1 for g in piecewise.values())
    _check_replays(model, widths, piecewise, full)
    del piecewise, full
    release_memory("cuda")


def test_llama_attention_runs_on_a_fused_kernel() -> None:
    shard = ShardShape.for_rank(PRESETS["llama-3.1-8b"])
    assert attention_kernel(shard, torch.bfloat16, "cuda") in ("flash", "efficient")


def test_sweep_memory_readings(tmp_path) -> None:
    shape = ModelShape(2048, 2, 16, 8, 128, 8192, 32000)
    workload = _workload(shape, max_num_seqs=1024, max_num_batched_tokens=8192)
    widths = [16, 512, 4096]
    result = profile_workload(workload, tmp_path, widths=widths, device="cuda", progress=False, compile=False,
                              options=SweepOptions(warmup_ms=5, rep_ms=20, min_reps=3))
    rows = {(r.num_tokens, r.mode): r for r in result.rows}
    assert all(rows[(w, m)].status == "ok" and rows[(w, m)].latency_ms > 0
               for w in widths for m in ("eager", "full", "piecewise", "logits"))
    for mode in ("full", "piecewise"):
        standalone = [rows[(w, mode)].standalone_bytes for w in widths]
        assert None not in standalone and standalone == sorted(standalone) and standalone[-1] > standalone[0]
        deltas = [rows[(w, mode)].capture_delta_bytes for w in widths]
        assert None not in deltas and sum(deltas) <= sum(standalone)  # smaller graphs reuse the pool's memory
    assert rows[(4096, "piecewise")].capture_delta_bytes > 0  # the first (largest) graph pays the pool
    assert all(rows[(w, "logits")].latency_ms < rows[(w, "eager")].latency_ms for w in widths)
    meta = result.metadata
    assert meta["capture_order"] == "piecewise-then-full" and meta["compiled"] is False
    assert meta["device_name"] and meta["compute_capability"] and meta["total_memory_bytes"] > 0
    assert meta["activation_peak_bytes"] > 0 and meta["kv_cache_bytes"] > 0
    peaks = meta["activation_peaks"]
    assert peaks["profile_run_bytes"] > 0 and peaks["decode_step_bytes"] > 0
    assert meta["activation_peak_bytes"] == max(peaks["profile_run_bytes"], peaks["decode_step_bytes"])
    # vLLM's non-KV memory: at least the weights and buffers, KV cache excluded, the profiling step's peak on top.
    non_kv = meta["non_kv"]
    assert meta["non_kv_cache_bytes"] == non_kv["total_consumed_bytes"] + non_kv["peak_headroom_bytes"]
    assert non_kv["total_consumed_bytes"] >= meta["weights_bytes"] + non_kv["persistent_buffers_bytes"]
    assert non_kv["total_consumed_bytes"] < meta["weights_bytes"] + meta["kv_cache_bytes"]
    assert non_kv["kv_cache_excluded_bytes"] >= meta["kv_cache_bytes"] and non_kv["peak_headroom_bytes"] > 0
    # A plain eager layer: RMSNorm x2, QKV, rotary (3), KV writes (2), attention, addmm x2, gate/up, SiLU, mul.
    assert 8 <= meta["eager_kernels_per_layer"] <= 30


def test_compiled_graph_replay_matches_eager() -> None:
    """Compiled FULL graphs and compiled PIECEWISE pieces, captured in vLLM's order, replay the plain step."""
    model = DecodeModel(ShardShape.for_rank(SMALL), max_num_tokens=64, decode_query_len=4, context_len=300,
                        dtype=torch.bfloat16, device="cuda")
    widths = [64, 13, 1]
    reference = {w: model.step(w).float().clone() for w in widths}
    model.compile()
    piecewise, full = _capture_in_vllms_order(model, widths)  # warms (compiles) each width before its capture
    for w in widths:
        for mode, graph in (("full", full[w]), ("piecewise", piecewise[w])):
            model.hidden_out.zero_()
            graph.replay()
            replayed = model.logits(model.hidden_out[:w]).float()
            torch.testing.assert_close(replayed, reference[w], rtol=2e-2, atol=3e-2,
                                       msg=lambda m: f"{mode} {w}: {m}")


def test_compiled_sweep_records_compile_time_and_kernels(tmp_path) -> None:
    result = profile_workload(_workload(SMALL), tmp_path, widths=[4, 64], device="cuda", progress=False,
                              options=SweepOptions(warmup_ms=2, rep_ms=5, min_reps=2))
    meta = result.metadata
    assert meta["compiled"] is True and meta["compile_s"] > 0
    assert 3 <= meta["eager_kernels_per_layer"] <= 30  # Inductor fuses: fewer than the plain step's
    assert all(r.status == "ok" for r in result.rows)


def test_real_out_of_memory_in_capture_is_survived(tmp_path) -> None:
    """An allocation larger than the device inside the capture: the allocator raises during capture, the
    capture is ended and dropped, the width is `oom`, and smaller widths still capture and replay."""
    from tuner.measure import graphs
    from tuner.measure.profile import StepRunner

    total = torch.cuda.get_device_properties(0).total_memory

    class Hog(StepRunner):
        def capture(self, num_tokens, pool):
            if num_tokens < 64:
                return super().capture(num_tokens, pool)

            def too_big() -> None:
                self.model.forward_hidden(num_tokens)
                torch.empty(2 * total, dtype=torch.uint8, device="cuda")

            return graphs.capture(too_big, num_tokens, pool=pool)

    result = profile_workload(_workload(SMALL), tmp_path, widths=[8, 16, 64, 128], device="cuda", progress=False,
                              compile=False, options=SweepOptions(warmup_ms=2, rep_ms=5, min_reps=2),
                              runner_factory=Hog)
    status = {(r.num_tokens, r.mode): r for r in result.rows}
    assert [status[(w, "full")].status for w in (8, 16, 64, 128)] == ["ok", "ok", "oom", "oom"]
    assert all(status[(w, m)].status == "ok" for w in (8, 16, 64, 128) for m in ("eager", "piecewise", "logits"))
    assert status[(16, "full")].latency_ms > 0 and status[(16, "full")].capture_delta_bytes is not None
