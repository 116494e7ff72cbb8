"""PIECEWISE graphs: the decode step split at every attention call, each piece between attentions captured as
its own CUDA graph for one width and attention run eagerly between the replays, as vLLM runs a mixed batch."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tuner.measure import graphs as _graphs
from tuner.measure.decoder import DecodeModel

__all__ = ["NOT_VLLM", "Piece", "PiecewiseGraph", "capture_piece", "capture_piecewise"]

NOT_VLLM = (
    "a stand-in for vLLM's PIECEWISE graphs: cgtune's own step split at every attention call as vLLM splits "
    "its compiled graph, each piece captured as a CUDA graph into the shared pool (compiled pieces when the "
    "profile is compiled), attention eager between the replays; vLLM's own kernels and fusion are not used, "
    "and attention copies into the buffer the piece before it allocated (vLLM writes there directly)"
)
"""What piecewise rows are, in one line, for the profile metadata."""


@dataclass
class Piece:
    """One captured piece: what replays it, and the tensors it writes at every replay."""

    graph: Any
    """Has `replay()`: a CapturedGraph on CUDA, a stand-in in tests."""
    outputs: tuple[torch.Tensor, ...]
    """The piece's outputs at their captured addresses: (h, q, k, v, attention output) before an attention,
    (hidden_out slice,) for the last piece."""
    capture_s: float = 0.0
    """Seconds the capture took."""


@dataclass
class PiecewiseGraph:
    """One width's PIECEWISE step: `num_layers + 1` pieces, replayed in order with attention between them."""

    model: DecodeModel
    """The model whose attention (and KV cache) runs between the pieces."""
    num_tokens: int
    """Width the pieces were captured at."""
    pieces: list[Piece]
    """Piece 0 .. piece L, in step order."""
    pool: Any = None
    """Pool the pieces allocated from (kept so it outlives the capture)."""

    @property
    def capture_s(self) -> float:
        return sum(p.capture_s for p in self.pieces)

    def replay(self) -> None:
        """The step's body: each piece replayed, attention run eagerly after every piece but the last into the
        buffer that piece allocated; the final hidden states land in `model.hidden_out[:num_tokens]`."""
        last = len(self.pieces) - 1
        with torch.no_grad():
            for i, piece in enumerate(self.pieces):
                piece.graph.replay()
                if i < last:
                    _, q, k, v, o = piece.outputs
                    self.model.attention(i, q, k, v, out=o)


CapturePiece = Callable[[Callable[[], Sequence[torch.Tensor]]], tuple[Piece, Sequence[torch.Tensor]]]
"""Captures one piece's callable; returns the Piece (what replays it) and the outputs the capture produced,
which feed the next piece's capture."""


def capture_piece(fn: Callable[[], Sequence[torch.Tensor]], num_tokens: int, pool: Any
                  ) -> tuple[Piece, Sequence[torch.Tensor]]:
    """Capture one piece as a CUDA graph in `pool`. The Piece keeps its outputs as weak references, as vLLM's
    piecewise backend does: once the step's capture is over and the caller drops the returned (owning) outputs,
    graphs captured later may reuse their memory, which is safe because no two steps replay at once."""
    graph = _graphs.capture(fn, num_tokens, pool=pool)
    outputs = tuple(graph.output)
    graph.output = None
    return Piece(graph, tuple(_graphs.weak_ref(t) for t in outputs), graph.capture_s), outputs


def capture_piecewise(model: DecodeModel, num_tokens: int, capture: CapturePiece, pool: Any = None
                      ) -> PiecewiseGraph:
    """Run `model.split_step(num_tokens)` once, capturing every piece with `capture` (attention runs eagerly
    between the captures, as at replay); the pieces in order as one PiecewiseGraph."""
    pieces: list[Piece] = []

    def call_piece(index: int, fn: Callable, inputs: Sequence) -> Sequence[torch.Tensor]:
        piece, outputs = capture(lambda: fn(*inputs))
        pieces.append(piece)
        return outputs

    model.split_step(num_tokens, call_piece)
    return PiecewiseGraph(model=model, num_tokens=num_tokens, pieces=pieces, pool=pool)
