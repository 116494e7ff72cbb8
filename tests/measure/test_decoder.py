"""The decode model: output shapes, determinism, GQA/TP shard shapes, and attention against a naive reference."""

from __future__ import annotations

import math

import pytest
import torch

from tuner.measure.decoder import DecodeModel, ShardShape, attention_kernel
from tuner.shapes import PRESETS, ModelShape

TINY = PRESETS["tiny"]


def _model(shape: ModelShape = TINY, tp: int = 1, **kw: object) -> DecodeModel:
    args = dict(max_num_tokens=40, decode_query_len=4, context_len=12, dtype=torch.float32, seed=0)
    args.update(kw)
    return DecodeModel(ShardShape.for_rank(shape, tp), **args)


@pytest.mark.parametrize("num_tokens", [1, 3, 4, 5, 8, 17, 40])
def test_logits_cover_every_token(num_tokens: int) -> None:
    model = _model()
    logits = model.step(num_tokens)
    assert logits.shape == (num_tokens, TINY.vocab_size)
    assert torch.isfinite(logits).all()
    assert model.forward_hidden(num_tokens).data_ptr() == model.hidden_out.data_ptr()  # static output buffer


def test_same_seed_same_output_and_repeatable_steps() -> None:
    a, b = _model(seed=7), _model(seed=7)
    first = a.step(13).clone()
    assert torch.equal(first, a.step(13))  # the step rewrites the same KV slots: no drift between calls
    assert torch.equal(first, b.step(13))
    assert not torch.equal(first, _model(seed=8).step(13))


def test_requests_are_independent_and_partial_request_is_separate() -> None:
    model = _model()
    full = model.step(8).clone()  # two requests of q = 4
    mixed = model.step(10)  # the same two requests plus a partial one of 2 tokens
    torch.testing.assert_close(mixed[:8], full, rtol=1e-5, atol=1e-5)


def test_width_above_buffers_rejected() -> None:
    with pytest.raises(ValueError, match="num_tokens"):
        _model().step(41)


def test_gqa_and_tp_shard_shapes() -> None:
    llama70 = PRESETS["llama-3.1-70b"]
    s = ShardShape.for_rank(llama70, 2)
    assert (s.num_heads, s.num_kv_heads, s.intermediate_size, s.vocab_size) == (32, 4, 14336, 64128)
    assert s.q_size == 32 * 128 and s.kv_size == 4 * 128
    # More ranks than KV heads: vLLM replicates, each rank keeps one.
    assert ShardShape.for_rank(llama70, 16).num_kv_heads == 1
    with pytest.raises(ValueError):
        ShardShape.for_rank(llama70, 3)


@pytest.mark.parametrize("tp", [1, 2])
def test_tensors_have_one_ranks_shapes_and_bytes(tp: int) -> None:
    shape = ModelShape(64, 2, 8, 4, 16, 96, 250, qk_norm=True)  # odd vocab: padded per rank like vLLM
    model = _model(shape, tp, dtype=torch.bfloat16)
    s = model.shard
    layer = model.layers[0]
    assert layer.qkv.shape == ((s.num_heads + 2 * s.num_kv_heads) * 16, 64)
    assert layer.gate_up.shape == (2 * 96 // tp, 64)
    assert layer.kv_cache.shape == (2, 10, 4 // tp, 12 + 4, 16)  # 40 tokens / q=4 = 10 requests
    assert model.embed.shape == (256 // tp, 64)  # 250 padded to 256 rows, then split
    assert model.weight_bytes() == shape.weight_bytes("bfloat16", tp)
    assert model.kv_cache_bytes() == 2 * 2 * 10 * (4 // tp) * 16 * 16 * 2
    assert model.step(9).shape == (9, 256 // tp)


def test_tied_embeddings_share_weights() -> None:
    shape = ModelShape(64, 1, 4, 2, 16, 128, 256, tie_word_embeddings=True)
    model = _model(shape)
    assert model.lm_head is model.embed
    assert model.weight_bytes() == shape.weight_bytes("float32")


def test_attention_matches_naive_reference() -> None:
    """Token j of a request sees its whole context and the request's new tokens 0..j, through GQA."""
    model = _model(context_len=5)
    s = model.shard
    q = torch.randn(7, s.num_heads, s.head_dim)  # one request of 4 tokens plus one of 3
    k = torch.randn(7, s.num_kv_heads, s.head_dim)
    v = torch.randn(7, s.num_kv_heads, s.head_dim)
    cache = model.layers[0].kv_cache
    out = model._attention(0, q, k, v)
    group = s.num_heads // s.num_kv_heads
    ref = []
    for req, (lo, n) in enumerate(((0, 4), (4, 3))):
        keys = torch.cat([cache[0, req, :, :5], k[lo:lo + n].transpose(0, 1)], dim=1).repeat_interleave(group, 0)
        vals = torch.cat([cache[1, req, :, :5], v[lo:lo + n].transpose(0, 1)], dim=1).repeat_interleave(group, 0)
        scores = q[lo:lo + n].transpose(0, 1) @ keys.transpose(1, 2) / math.sqrt(s.head_dim)
        visible = torch.arange(5 + n)[None, :] <= (5 + torch.arange(n))[:, None]
        scores = scores.masked_fill(~visible, float("-inf"))
        ref.append((scores.softmax(-1) @ vals).transpose(0, 1).reshape(n, -1))
    torch.testing.assert_close(out, torch.cat(ref), rtol=1e-4, atol=1e-5)


def test_cpu_attention_kernel_is_reported_as_math() -> None:
    assert attention_kernel(ShardShape.for_rank(TINY), torch.float32, "cpu") == "math"


def test_compiled_step_matches_eager_with_one_dynamic_graph() -> None:
    """torch.compile sees only the token count vary (attention is an opaque op), so widths with and without a
    partial last request share one graph, width 1 included (the token count is unbacked: no 0/1 specialization)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    eager, compiled = _model(), _model()
    compiled.compile()
    for width in (40, 13, 5, 8, 1, 2):
        torch.testing.assert_close(compiled.step(width), eager.step(width), rtol=1e-4, atol=1e-4)
    assert counters["stats"]["unique_graphs"] == 1


def test_profile_run_is_vllms_memory_profiling_step() -> None:
    """max_num_batched_tokens fresh tokens over max_num_seqs requests, logits for each request's last token;
    wider than the static buffers is fine (it allocates its own inputs)."""
    model = _model()
    assert model.profile_run(1024, 160).shape == (160, TINY.vocab_size)
    logits = model.profile_run(7, 3)  # requests of 3, 2, 2 tokens
    assert logits.shape == (3, TINY.vocab_size) and torch.isfinite(logits).all()
    with pytest.raises(ValueError):
        model.profile_run(2, 3)
