"""The PIECEWISE split on a CPU: the step split at every attention call computes what the unsplit step computes,
run directly, through stand-in graphs (a "capture" records the piece, a replay reruns it into the recorded
outputs, as a CUDA graph writes its static outputs), and compiled; plus the weak references the CUDA pieces keep."""

from __future__ import annotations

import pytest
import torch

from tuner.measure.decoder import DecodeModel, ShardShape, _rope
from tuner.measure.graphs import weak_ref
from tuner.measure.piecewise import Piece, PiecewiseGraph
from tuner.measure.profile import StepRunner
from tuner.shapes import PRESETS, ModelShape

QWEN_LIKE = ModelShape(64, 3, 4, 2, 16, 128, 256, qk_norm=True)  # 3 layers: a middle piece; GQA; qk-norm


def _model(shape: ModelShape = PRESETS["tiny"], **kw: object) -> DecodeModel:
    args = dict(max_num_tokens=24, decode_query_len=4, context_len=12, dtype=torch.float32, seed=0)
    args.update(kw)
    return DecodeModel(ShardShape.for_rank(shape), **args)


class _StandIn:
    """A recorded piece: `replay()` reruns it on the inputs it was captured with and writes the results into the
    tensors the capture returned, so everything downstream reads the same addresses, as with a CUDA graph."""

    def __init__(self, fn, outputs) -> None:
        self.fn, self.outputs, self.replays = fn, outputs, 0

    def replay(self) -> None:
        self.replays += 1
        for recorded, fresh in zip(self.outputs, self.fn()):
            if fresh.data_ptr() != recorded.data_ptr():
                recorded.copy_(fresh)


class StandInGraphs(StepRunner):
    """A runner whose piece captures are stand-ins (the CPU has no CUDA graphs)."""

    def __init__(self, model) -> None:
        super().__init__(model)
        self.recorded: list[_StandIn] = []

    def capture_piece(self, fn, num_tokens, pool):
        outputs = tuple(fn())
        graph = _StandIn(fn, outputs)
        self.recorded.append(graph)
        return Piece(graph, outputs), outputs


@pytest.mark.parametrize("shape", [PRESETS["tiny"], QWEN_LIKE], ids=["llama-like", "qwen-like"])
@pytest.mark.parametrize("width", [1, 3, 4, 13, 24])
def test_split_step_equals_the_unsplit_step(shape: ModelShape, width: int) -> None:
    model = _model(shape)
    unsplit = model.forward_hidden(width).clone()
    model.hidden_out.zero_()
    torch.testing.assert_close(model.split_step(width), unsplit, rtol=1e-6, atol=1e-6)


def test_split_step_runs_attention_between_pieces_in_order() -> None:
    model = _model(QWEN_LIKE)
    calls: list[tuple[str, int]] = []
    real = model._attention

    def attention(layer, q, k, v, out=None):
        calls.append(("attention", layer))
        assert out is not None and out.shape == (q.shape[0], model.shard.q_size)  # the buffer the piece allocated
        return real(layer, q, k, v, out)

    model._attention = attention
    model.split_step(9, lambda index, fn, inputs: (calls.append(("piece", index)), fn(*inputs))[1])
    assert calls == [("piece", 0), ("attention", 0), ("piece", 1), ("attention", 1), ("piece", 2),
                     ("attention", 2), ("piece", 3)]


@pytest.mark.parametrize("shape", [PRESETS["tiny"], QWEN_LIKE], ids=["llama-like", "qwen-like"])
def test_stand_in_piecewise_graphs_replay_the_unsplit_step(shape: ModelShape) -> None:
    model = _model(shape)
    runner = StandInGraphs(model)
    width = 13  # three requests of q = 4 and one of 1 token
    graph = runner.capture_piecewise(width, pool=None)
    assert isinstance(graph, PiecewiseGraph) and len(graph.pieces) == shape.num_layers + 1
    # New tokens in the static inputs: a replay must read them (as a CUDA graph reads its input buffers) and
    # write the step's hidden states into hidden_out, which is zeroed first so a replay that wrote nothing fails.
    model.input_ids[:width] = torch.randint(0, shape.vocab_size, (width,))
    expected = model.forward_hidden(width).clone()
    model.hidden_out.zero_()
    runner.replay(graph)
    torch.testing.assert_close(model.hidden_out[:width], expected, rtol=1e-6, atol=1e-6)
    assert [g.replays for g in runner.recorded] == [1] * (shape.num_layers + 1)


def test_lean_rotary_is_neox_rotate_halves() -> None:
    """The three-op rotary equals vLLM's native NeoX form, x1 cos - x2 sin | x2 cos + x1 sin, exactly in float32
    and within bf16 rounding in bf16; the model's tables hold cos twice and sin with its first half negated."""
    torch.manual_seed(0)
    x = torch.randn(5, 6, 16)
    angles = torch.randn(5, 1, 8)
    cos_half, sin_half = angles.cos(), angles.sin()
    x1, x2 = x.chunk(2, dim=-1)
    reference = torch.cat((x1 * cos_half - x2 * sin_half, x2 * cos_half + x1 * sin_half), dim=-1)
    cos = torch.cat((cos_half, cos_half), dim=-1)
    sin = torch.cat((-sin_half, sin_half), dim=-1)
    torch.testing.assert_close(_rope(x, cos, sin), reference, rtol=1e-6, atol=1e-6)
    bf = torch.bfloat16
    torch.testing.assert_close(_rope(x.to(bf), cos.to(bf), sin.to(bf)).float(), reference, rtol=2e-2, atol=2e-2)
    model = _model()
    half = model.shard.head_dim // 2
    torch.testing.assert_close(model.cos[:, :half], model.cos[:, half:])
    torch.testing.assert_close(model.sin[:, :half], -model.sin[:, half:])


def test_compiled_step_and_pieces_match_eager_in_bf16() -> None:
    """torch.compile (one dynamic-width graph for the step, one per kind of piece) gives the plain step's hidden
    states within bf16 tolerance, unsplit and split."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    shape = ModelShape(64, 3, 4, 2, 16, 128, 256)
    plain = _model(shape, dtype=torch.bfloat16, max_num_tokens=16, seed=3)
    compiled = _model(shape, dtype=torch.bfloat16, max_num_tokens=16, seed=3)
    compiled.compile()
    assert compiled.compiled and not plain.compiled
    for width in (16, 5):
        expected = plain.forward_hidden(width).float().clone()
        unsplit = compiled.forward_hidden(width).float().clone()
        compiled.hidden_out.zero_()
        split = compiled.split_step(width).float()
        for got in (unsplit, split):
            # Inductor keeps fused intermediates in float32 where eager rounds each op to bf16: a few elements
            # differ by 2-3 bf16 steps (1/64 at magnitude 2-4), the whole by well under 1%.
            torch.testing.assert_close(got, expected, rtol=2e-2, atol=6e-2)
            assert (got - expected).norm() / expected.norm() < 1e-2
    assert counters["stats"]["unique_graphs"] == 4  # the step, the first, middle and last piece: no recompiles


def test_weak_ref_aliases_without_owning() -> None:
    base = torch.arange(12.0).view(3, 4)
    view = base[1:, 1:3]
    alias = weak_ref(view)
    assert alias.data_ptr() == view.data_ptr() and alias.shape == view.shape and alias.stride() == view.stride()
    base.fill_(7.0)
    assert torch.equal(alias, torch.full((2, 2), 7.0))
    assert alias.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()


def test_cuda_piece_capture_hands_on_owning_outputs_and_keeps_weak_ones(monkeypatch) -> None:
    """capture_piece's contract, with the CUDA capture replaced by a recorder: the caller gets the capture's own
    (owning) outputs to feed the next piece; the Piece keeps aliases of them, and the graph drops its reference."""
    from tuner.measure import graphs, piecewise

    captured = []

    def fake_capture(fn, num_tokens, *, pool=None):
        captured.append((num_tokens, pool))
        return graphs.CapturedGraph(graph=None, num_tokens=num_tokens, pool=pool, capture_s=0.25, output=fn())

    monkeypatch.setattr(graphs, "capture", fake_capture)
    a, b = torch.ones(3), torch.zeros(2, 2)
    piece, outputs = piecewise.capture_piece(lambda: (a, b), 7, "pool")
    assert captured == [(7, "pool")] and outputs[0] is a and outputs[1] is b
    assert [t.data_ptr() for t in piece.outputs] == [a.data_ptr(), b.data_ptr()]
    assert all(p is not o for p, o in zip(piece.outputs, outputs))
    assert piece.graph.output is None and piece.capture_s == 0.25
