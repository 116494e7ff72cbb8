"""The host's share of an eager step, on a CPU with injected clocks (their samples are test fixtures): recorded per
width beside the step's time, host-bound widths named in the metadata and in the report line; and the attention
metadata built once per width computes exactly what SDPA's causal bias computed in every layer."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from tuner.measure.decoder import DecodeModel, ShardShape
from tuner.measure.profile import StepRunner, SweepOptions, profile_workload
from tuner.measure.timing import FakeClock, HostClock
from tuner.profile.host_cost import host_bound_widths, host_line, host_times
from tuner.shapes import PRESETS
from tuner.workload.spec import load_workload

ROOT = Path(__file__).resolve().parents[2]


class _HostTimed(StepRunner):
    """Eager steps of width 4 take 1.0 ms on the device clock and 0.95 ms to issue (host-bound); width 64 takes
    3.0 ms and 0.5 ms to issue. Each timing, the host's too: one estimating call and 2 repetitions."""

    def __init__(self, model) -> None:
        # Timed in priority order: 4 (the smallest decode width) before 64. Eager then logits per width.
        super().__init__(model, clock=FakeClock([1.0] * 3 + [0.1] * 3 + [3.0] * 3 + [0.2] * 3))
        self.host_clock = FakeClock([0.95] * 3 + [0.5] * 3)


def test_host_time_is_recorded_beside_the_eager_step_and_host_bound_widths_named(tmp_path) -> None:
    tiny = load_workload(ROOT / "workloads" / "tiny-cpu.yaml")
    result = profile_workload(tiny, tmp_path, widths=[4, 64], device="cpu", compile=False, progress=False,
                              options=SweepOptions(0, 0, 2, 2), runner_factory=_HostTimed)
    meta = result.metadata
    assert meta["measurements"]["4"]["eager_host"]["samples_ms"] == [0.95, 0.95]
    assert host_times(meta) == {4: (0.95, 1.0), 64: (0.5, 3.0)}
    assert meta["host_bound_widths"] == host_bound_widths(meta) == [4]
    line = host_line(meta)
    assert line.startswith("eager step HOST-BOUND at 1 of 2 widths") and "up to 4 tokens" in line
    assert "host 0.95 of 1.00 ms at 4 tokens, 0.50 of 3.00 ms at 64" in line


def test_a_cpu_profile_has_no_host_times() -> None:
    assert host_line({"measurements": {"4": {"eager": {"median_ms": 1.0}}}}) is None


def test_host_clock_times_the_call_between_two_synchronizations() -> None:
    events = []
    clock = HostClock(lambda: events.append("sync"))
    samples = clock.time_ms(lambda: events.append("step"), 2)
    assert events == ["sync", "step", "sync", "sync", "step", "sync"] and len(samples) == 2
    assert all(s >= 0 for s in samples)


def test_attention_metadata_built_once_per_width_computes_what_the_causal_bias_did() -> None:
    model = DecodeModel(ShardShape.for_rank(PRESETS["tiny"]), max_num_tokens=40, decode_query_len=4,
                        context_len=12, dtype=torch.float32, seed=0)
    s = model.shard
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(13, s.num_heads, s.head_dim, generator=gen)
    k = torch.randn(13, s.num_kv_heads, s.head_dim, generator=gen)
    v = torch.randn(13, s.num_kv_heads, s.head_dim, generator=gen)
    out = model.attention(0, q, k, v)
    assert model._step_groups(13) is model._step_groups(13)  # built once for the width
    cache = model.layers[0].kv_cache
    expected = []
    for first, requests, length in ((0, 3, 4), (3, 1, 1)):  # 3 requests of 4 tokens, then one of 1
        lo = first * 4
        qr = q[lo:lo + requests * length].view(requests, length, s.num_heads, s.head_dim).transpose(1, 2)
        c = cache[:, first:first + requests, :, :12 + length]
        o = F.scaled_dot_product_attention(qr, c[0], c[1], attn_mask=causal_lower_right(length, 12 + length),
                                           enable_gqa=s.num_heads != s.num_kv_heads)
        expected.append(o.transpose(1, 2).reshape(requests * length, s.q_size))
    assert torch.equal(out, torch.cat(expected))  # bit for bit: the same mask, the same kernel
