"""On a CUDA device: graph replay reproduces the eager step, and graph memory readings behave (skipped without
CUDA; run by scripts/gpu_profile.sh)."""

from __future__ import annotations

import pytest
import torch

from tuner.measure.decoder import DecodeModel, ShardShape, attention_kernel
from tuner.measure.graphs import capture, new_pool, release_memory
from tuner.measure.profile import SweepOptions, candidate_widths, profile_workload
from tuner.models import PRESETS, ModelShape
from tuner.workload import parse_workload

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


def test_graph_replay_matches_eager_at_every_width() -> None:
    workload = _workload(SMALL)
    widths = candidate_widths(workload)
    model = DecodeModel(ShardShape.for_rank(SMALL), max_num_tokens=max(widths), decode_query_len=4,
                        context_len=300, dtype=torch.bfloat16, device="cuda")
    pool = new_pool()
    graphs = {}
    for w in sorted(widths, reverse=True):  # vLLM's order, one shared pool
        model.step(w)
        graphs[w] = capture(lambda w=w: model.forward_hidden(w), w, pool=pool)
    for w in widths:
        eager = model.step(w).float()
        graphs[w].replay()
        replayed = model.logits(model.hidden_out[:w]).float()
        torch.testing.assert_close(replayed, eager, rtol=2e-2, atol=3e-2, msg=lambda m: f"width {w}: {m}")
    del graphs
    release_memory("cuda")


def test_llama_attention_runs_on_a_fused_kernel() -> None:
    shard = ShardShape.for_rank(PRESETS["llama-3.1-8b"])
    assert attention_kernel(shard, torch.bfloat16, "cuda") in ("flash", "efficient")


def test_sweep_memory_readings(tmp_path) -> None:
    shape = ModelShape(2048, 2, 16, 8, 128, 8192, 32000)
    workload = _workload(shape, max_num_seqs=1024, max_num_batched_tokens=8192)
    widths = [16, 512, 4096]
    result = profile_workload(workload, tmp_path, widths=widths, device="cuda", progress=False,
                              options=SweepOptions(warmup_ms=5, rep_ms=20, min_reps=3))
    full = {r.num_tokens: r for r in result.rows if r.mode == "full"}
    eager = {r.num_tokens: r for r in result.rows if r.mode == "eager"}
    assert all(full[w].status == eager[w].status == "ok" for w in widths)
    assert all(full[w].latency_ms > 0 and eager[w].latency_ms > 0 for w in widths)
    standalone = [full[w].standalone_bytes for w in widths]
    assert None not in standalone and standalone == sorted(standalone) and standalone[-1] > standalone[0]
    deltas = [full[w].capture_delta_bytes for w in widths]
    assert None not in deltas and full[4096].capture_delta_bytes > 0  # the first (largest) graph pays the pool
    assert sum(deltas) <= sum(standalone)  # smaller graphs reuse the largest one's memory
    meta = result.metadata
    assert meta["device_name"] and meta["compute_capability"] and meta["total_memory_bytes"] > 0
    assert meta["activation_peak_bytes"] > 0 and meta["kv_cache_bytes"] > 0
    peaks = meta["activation_peaks"]
    assert peaks["profile_run_bytes"] > 0 and peaks["decode_step_bytes"] > 0
    assert meta["activation_peak_bytes"] == max(peaks["profile_run_bytes"], peaks["decode_step_bytes"])


def test_compiled_graph_replay_matches_eager() -> None:
    model = DecodeModel(ShardShape.for_rank(SMALL), max_num_tokens=64, decode_query_len=4, context_len=300,
                        dtype=torch.bfloat16, device="cuda")
    reference = {w: model.step(w).float().clone() for w in (64, 13, 1)}
    model.compile()
    pool = new_pool()
    for w in (64, 13, 1):
        model.step(w)  # compiles (once for every width > 1) before the capture, as vLLM warms up
        graph = capture(lambda w=w: model.forward_hidden(w), w, pool=pool)
        graph.replay()
        replayed = model.logits(model.hidden_out[:w]).float()
        torch.testing.assert_close(replayed, reference[w], rtol=2e-2, atol=3e-2, msg=lambda m: f"width {w}: {m}")


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
                              options=SweepOptions(warmup_ms=2, rep_ms=5, min_reps=2), runner_factory=Hog)
    status = {(r.num_tokens, r.mode): r for r in result.rows}
    assert [status[(w, "full")].status for w in (8, 16, 64, 128)] == ["ok", "ok", "oom", "oom"]
    assert all(status[(w, "eager")].status == "ok" for w in (8, 16, 64, 128))
    assert status[(16, "full")].latency_ms > 0 and status[(16, "full")].capture_delta_bytes is not None
