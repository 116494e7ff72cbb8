"""A Llama-style decode step for one tensor-parallel rank, with random weights and a static KV cache,
shaped like the step vLLM's model runner executes (and captures) for a batch of `num_tokens` tokens."""

from __future__ import annotations

import itertools
import math
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from tuner.shapes import ModelShape

if TYPE_CHECKING:
    from tuner.workload.spec import Workload

__all__ = ["DTYPES", "DecodeModel", "ShardShape", "attention_kernel", "build_model", "memory_asked_bytes",
           "out_of_memory_building"]

DTYPES: dict[str, torch.dtype] = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
"""Workload dtype names to torch dtypes."""


@dataclass(frozen=True)
class ShardShape:
    """The shapes one tensor-parallel rank holds: heads, KV heads, MLP width and vocabulary divided as vLLM
    divides them (KV heads replicated when TP exceeds their count)."""

    hidden_size: int
    """Residual stream width (not sharded)."""
    num_layers: int
    """Decoder layers."""
    num_heads: int
    """Query heads on this rank."""
    num_kv_heads: int
    """KV heads on this rank (at least one)."""
    head_dim: int
    """Width of one head."""
    intermediate_size: int
    """SwiGLU width on this rank."""
    vocab_size: int
    """Vocabulary rows on this rank (padded to a multiple of 64, then split, as vLLM's VocabParallelEmbedding)."""
    rope_theta: float
    """Rotary base."""
    rms_norm_eps: float
    """RMSNorm epsilon."""
    qk_norm: bool
    """Per-head RMSNorm on q and k (Qwen3)."""
    tie_word_embeddings: bool
    """LM head shares the embedding."""

    @classmethod
    def for_rank(cls, shape: ModelShape, tensor_parallel_size: int = 1) -> ShardShape:
        """One rank's share of `shape` at `tensor_parallel_size`."""
        tp = tensor_parallel_size
        if tp < 1 or shape.num_attention_heads % tp or shape.intermediate_size % tp:
            raise ValueError(f"{tensor_parallel_size=} must divide num_attention_heads and intermediate_size")
        return cls(
            hidden_size=shape.hidden_size,
            num_layers=shape.num_layers,
            num_heads=shape.num_attention_heads // tp,
            num_kv_heads=shape.kv_heads_per_rank(tp),
            head_dim=shape.head_dim,
            intermediate_size=shape.intermediate_size // tp,
            vocab_size=shape.vocab_per_rank(tp),
            rope_theta=shape.rope_theta,
            rms_norm_eps=shape.rms_norm_eps,
            qk_norm=shape.qk_norm,
            tie_word_embeddings=shape.tie_word_embeddings,
        )

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


def attention_kernel(shard: ShardShape, dtype: torch.dtype, device: torch.device | str) -> str:
    """Which fused SDPA kernel the lower-right causal attention of this shape gets: `flash`, `efficient` or
    `math` (a materialized mask: slower and larger than what vLLM runs, so worth flagging in the metadata)."""
    device = torch.device(device)
    if device.type != "cuda":
        return "math"
    from torch.backends.cuda import SDPAParams, can_use_efficient_attention, can_use_flash_attention

    q = torch.empty(1, shard.num_heads, 2, shard.head_dim, dtype=dtype, device=device)
    kv = torch.empty(1, shard.num_kv_heads, 4, shard.head_dim, dtype=dtype, device=device)
    params = SDPAParams(q, kv, kv, None, 0.0, False, shard.num_heads != shard.num_kv_heads)
    if can_use_flash_attention(params):
        return "flash"
    if can_use_efficient_attention(params):
        return "efficient"
    return "math"


class _Layer:
    """One decoder layer's weights (fused QKV and gate/up as vLLM fuses them) and its KV cache."""

    def __init__(self, s: ShardShape, make: Callable) -> None:
        h = s.hidden_size
        self.input_norm = make((h,), None)
        self.qkv = make((s.q_size + 2 * s.kv_size, h), h)
        self.o_proj = make((h, s.q_size), s.q_size)
        self.post_norm = make((h,), None)
        self.gate_up = make((2 * s.intermediate_size, h), h)
        self.down = make((h, s.intermediate_size), s.intermediate_size)
        self.q_norm = make((s.head_dim,), None) if s.qk_norm else None
        self.k_norm = make((s.head_dim,), None) if s.qk_norm else None
        self.kv_cache: torch.Tensor | None = None  # [2, requests, kv_heads, context_len + q, head_dim]

    def weights(self) -> list[torch.Tensor]:
        ws = [self.input_norm, self.qkv, self.o_proj, self.post_norm, self.gate_up, self.down]
        return ws + [w for w in (self.q_norm, self.k_norm) if w is not None]

    def pre_attention(self) -> tuple[torch.Tensor | None, ...]:
        """Weights up to attention, as `_qkv` takes them (tensors, so one compiled piece serves every layer)."""
        return self.input_norm, self.qkv, self.q_norm, self.k_norm

    def post_attention(self) -> tuple[torch.Tensor, ...]:
        """Weights after attention, as `_post_attention` takes them."""
        return self.o_proj, self.post_norm, self.gate_up, self.down


class DecodeModel:
    """One rank's decode step: embedding, decoder layers (RMSNorm, fused QKV, rotary, GQA attention over a
    static KV cache with `q` query tokens per request under a bottom-right causal mask, output projection,
    SwiGLU MLP), final norm, then LM-head logits for every token. Where PyTorch has a fused op the step uses
    it (RMSNorm, the residual add inside the projection GEMM, rotary in three ops for q and k together), so
    the plain eager step is closer to vLLM's fused custom ops.

    Inputs live in static buffers sized to `max_num_tokens`; a step of T tokens reads their first T entries
    and `forward_hidden(T)` writes into a static output buffer, so a CUDA graph captured at T replays on the
    same slices, as in vLLM. A step of T tokens is `T // q` requests of `q` tokens plus, when q does not
    divide T, one request with the remaining tokens (vLLM pads such steps; its attention is varlen).
    Every request has `context_len` tokens already cached. Logits are computed outside `forward_hidden`
    because vLLM computes them after the (possibly graphed) forward, eagerly.

    `split_step` runs the same step split at every attention call, as vLLM's piecewise backend splits its
    compiled graph; the sweep captures each piece as a CUDA graph (PIECEWISE). With `allocate_kv_cache=False`
    the KV cache is allocated later by `allocate_kv_cache()`, so vLLM's memory profiling, which runs before
    vLLM allocates its KV cache, can be measured without it. A speculative drafter is a DecodeModel of the
    drafter's shape given the target's embedding and LM head (`shared_embed`, `shared_lm_head`) where it shares them.
    """

    def __init__(
        self,
        shard: ShardShape,
        *,
        max_num_tokens: int,
        decode_query_len: int,
        context_len: int,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str = "cpu",
        seed: int = 0,
        allocate_kv_cache: bool = True,
        shared_embed: torch.Tensor | None = None,
        shared_lm_head: torch.Tensor | None = None,
    ) -> None:
        if max_num_tokens < 1:
            raise ValueError(f"{max_num_tokens=} must be >= 1")
        if decode_query_len < 1:
            raise ValueError(f"{decode_query_len=} must be >= 1")
        if context_len < 1:
            raise ValueError(f"{context_len=} must be >= 1")
        self.shard = shard
        self.max_num_tokens = max_num_tokens
        self.decode_query_len = decode_query_len
        self.context_len = context_len
        self.dtype = dtype
        self.device = torch.device(device)
        s = shard
        gen = torch.Generator(device=self.device)
        gen.manual_seed(seed)

        def make(shape: tuple[int, ...], fan_in: int | None) -> torch.Tensor:
            t = torch.empty(shape, dtype=dtype, device=self.device)
            if fan_in is None:  # norm weights: near 1, as trained models' are
                return t.normal_(1.0, 0.02, generator=gen)
            # 1/sqrt(fan_in) keeps activations O(1) through the layers, so bf16 stays finite and comparable.
            return t.normal_(0.0, 1.0 / math.sqrt(fan_in), generator=gen)

        for what, tensor in (("shared_embed", shared_embed), ("shared_lm_head", shared_lm_head)):
            if tensor is not None and (tuple(tensor.shape) != (s.vocab_size, s.hidden_size) or tensor.dtype != dtype
                                       or tensor.device.type != self.device.type):
                raise ValueError(f"{what}: {tuple(tensor.shape)} {tensor.dtype} on {tensor.device} must be "
                                 f"({s.vocab_size}, {s.hidden_size}) {dtype} on {self.device}")
        with torch.no_grad():
            # A drafter that shares the target's embedding or LM head holds the target's tensor, not a copy: vLLM
            # deletes the duplicate after loading, so the memory is the target's alone.
            self.embed = make((s.vocab_size, s.hidden_size), 1) if shared_embed is None else shared_embed
            self.max_requests = -(-max_num_tokens // decode_query_len)
            cache_len = context_len + decode_query_len
            self.layers = [_Layer(s, make) for _ in range(s.num_layers)]
            self.final_norm = make((s.hidden_size,), None)
            if s.tie_word_embeddings:
                self.lm_head = self.embed
            else:
                self.lm_head = (make((s.vocab_size, s.hidden_size), s.hidden_size) if shared_lm_head is None
                                else shared_lm_head)
            self._shared = tuple(t for t in (shared_embed, shared_lm_head) if t is not None)

            inv_freq = 1.0 / (s.rope_theta ** (torch.arange(0, s.head_dim, 2, dtype=torch.float32) / s.head_dim))
            angles = torch.outer(torch.arange(cache_len, dtype=torch.float32), inv_freq)
            # Full head width, the sine's first half negated: rotate-halves then takes one multiply-add (`_rope`).
            self.cos = torch.cat((angles.cos(), angles.cos()), dim=-1).to(dtype=dtype, device=self.device)
            self.sin = torch.cat((-angles.sin(), angles.sin()), dim=-1).to(dtype=dtype, device=self.device)

            # Static inputs: token i belongs to request i // q and sits at position context_len + i % q.
            self.input_ids = torch.randint(0, s.vocab_size, (max_num_tokens,), generator=gen, device=self.device)
            self.positions = (torch.arange(max_num_tokens, device=self.device) % decode_query_len) + context_len
            self.hidden_out = torch.zeros(max_num_tokens, s.hidden_size, dtype=dtype, device=self.device)
        self._seed = seed
        if allocate_kv_cache:
            self.allocate_kv_cache()
        self.attention_kernel = attention_kernel(shard, dtype, self.device)
        """Fused SDPA kernel the attention runs on (`flash`, `efficient` or `math`)."""
        # A plain bool fixed here: under dynamic=True, Dynamo would turn a comparison of int fields into a SymBool.
        self._enable_gqa = bool(shard.num_heads != shard.num_kv_heads)
        self._forward_hidden = self._forward_hidden_eager
        self._pieces: tuple[Callable, Callable, Callable] = (_piece_first, _piece_middle, _piece_last)
        self._compiled = False
        self._groups: dict[int, tuple] = {}  # num_tokens -> the step's attention metadata (`_step_groups`)
        # A number in the order models are built, not id(self): it is a constant in the compiled graph, so a second
        # process building the same models in the same order finds the first one's compiled code in Inductor's cache.
        self._key = next(_MODEL_KEYS)
        _MODELS[self._key] = self

    def allocate_kv_cache(self) -> None:
        """Allocate the static KV cache (random values, so the context holds no uninitialized NaNs); once."""
        if self.layers and self.layers[0].kv_cache is not None:
            raise RuntimeError("the KV cache is already allocated")
        s = self.shard
        # A generator of its own: the values do not depend on when the cache is allocated.
        gen = torch.Generator(device=self.device)
        gen.manual_seed(self._seed + 1)
        with torch.no_grad():
            for layer in self.layers:
                kv = torch.empty(2, self.max_requests, s.num_kv_heads, self.context_len + self.decode_query_len,
                                 s.head_dim, dtype=self.dtype, device=self.device)
                layer.kv_cache = kv.normal_(0.0, 1.0, generator=gen)

    # ------------------------------------------------------------------ sizes
    def weights(self) -> list[torch.Tensor]:
        """Parameters this model holds itself (a tensor shared with another model, given as `shared_embed` or
        `shared_lm_head`, is that model's)."""
        ws = [self.embed, self.final_norm] + [w for layer in self.layers for w in layer.weights()]
        ws = ws if self.shard.tie_word_embeddings else ws + [self.lm_head]
        return [w for w in ws if not any(w is t for t in self._shared)]

    def weight_bytes(self) -> int:
        """Bytes of parameters this rank holds (shared tensors excluded)."""
        return sum(w.numel() * w.element_size() for w in self.weights())

    def kv_cache_bytes(self) -> int:
        """Bytes of the static KV cache (every layer, K and V, max requests x (context + q) slots), allocated or
        not yet."""
        s = self.shard
        slots = self.max_requests * (self.context_len + self.decode_query_len)
        return 2 * s.num_layers * slots * s.num_kv_heads * s.head_dim * self.dtype.itemsize

    def persistent_buffer_bytes(self) -> int:
        """Bytes of the static buffers besides weights and KV cache: inputs, rotary tables, the output buffer."""
        return sum(t.numel() * t.element_size() for t in (self.input_ids, self.positions, self.hidden_out,
                                                             self.cos, self.sin))

    @property
    def compiled(self) -> bool:
        """Whether the step runs through torch.compile."""
        return self._compiled

    def compile(self, **kwargs: object) -> None:
        """Route `forward_hidden` through torch.compile with the token dimension dynamic and attention as an
        opaque op, so one compiled graph serves every width, as vLLM compiles once; `split_step`'s pieces are
        compiled too (one graph each for the first, the middle and the last piece). Compilation happens at the
        first call of each."""
        kwargs.setdefault("fullgraph", True)  # a graph break would silently measure eager code as "compiled"
        self._forward_hidden = torch.compile(self._forward_hidden_eager, **kwargs)
        self._pieces = tuple(torch.compile(fn, **kwargs) for fn in (_piece_first, _piece_middle, _piece_last))
        self._compiled = True

    # ------------------------------------------------------------------ step
    def forward_hidden(self, num_tokens: int) -> torch.Tensor:
        """The transformer body for the first `num_tokens` tokens of the static inputs; writes the final
        normed hidden states into the static `hidden_out[:num_tokens]` and returns that slice."""
        if not 1 <= num_tokens <= self.max_num_tokens:
            raise ValueError(f"{num_tokens=} must be in 1..{self.max_num_tokens}")
        ids = self.input_ids[:num_tokens]
        pos = self.positions[:num_tokens]
        if self._compiled:
            self._mark_dynamic(ids, pos)
        with torch.no_grad():
            return self._forward_hidden(ids, pos)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM-head logits for every token (speculative verification scores every draft position)."""
        with torch.no_grad():
            return F.linear(hidden, self.lm_head)

    def step(self, num_tokens: int) -> torch.Tensor:
        """One eager decode step: body and logits, `[num_tokens, vocab_size]`."""
        return self.logits(self.forward_hidden(num_tokens))

    def split_step(self, num_tokens: int, call_piece: Callable[[int, Callable, Sequence], Sequence] | None = None
                   ) -> torch.Tensor:
        """`forward_hidden(num_tokens)` split at every attention call, as vLLM's piecewise backend splits the
        compiled graph: piece 0 (embedding, layer 0 up to attention), piece i (layer i-1 after attention, layer
        i up to attention), piece L (the last layer after attention, final norm into `hidden_out`). Each piece
        before an attention allocates that attention's output, and attention runs eagerly between the pieces,
        writing the KV cache and that output, as vLLM's attention op does outside its piecewise graphs.

        `call_piece(index, fn, inputs)` runs piece `index` as `fn(*inputs)` and returns its outputs (default:
        calls it); the sweep captures each piece as a CUDA graph there. Returns `hidden_out[:num_tokens]`."""
        if not 1 <= num_tokens <= self.max_num_tokens:
            raise ValueError(f"{num_tokens=} must be in 1..{self.max_num_tokens}")
        if call_piece is None:
            def call_piece(index: int, fn: Callable, inputs: Sequence) -> Sequence:
                return fn(*inputs)
        s = self.shard
        first, middle, last = self._pieces
        ids, pos, out = self.input_ids[:num_tokens], self.positions[:num_tokens], self.hidden_out[:num_tokens]
        num_layers = len(self.layers)
        with torch.no_grad():
            inputs = (s, ids, pos, self.embed, self.cos, self.sin, self.layers[0].pre_attention())
            if self._compiled:
                self._mark_dynamic(ids, pos, out)
            h, q, k, v, o = call_piece(0, first, inputs)
            for i in range(num_layers):
                self._attention(i, q, k, v, out=o)  # eager: vLLM's attention runs outside its piecewise graphs
                del q, k, v  # freed as vLLM's split module frees them: later pieces may reuse their memory
                post = self.layers[i].post_attention()
                if self._compiled:
                    self._mark_dynamic(h, o)
                if i + 1 < num_layers:
                    inputs = (s, h, o, pos, self.cos, self.sin, post, self.layers[i + 1].pre_attention())
                    h, q, k, v, o = call_piece(i + 1, middle, inputs)
                else:
                    (out,) = call_piece(num_layers, last, (s, h, o, post, self.final_norm, out))
        return out

    def attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  out: torch.Tensor | None = None) -> torch.Tensor:
        """Layer `layer`'s attention, eagerly (what runs between PIECEWISE graph pieces); see `_attention`."""
        with torch.no_grad():
            return self._attention(layer, q, k, v, out)

    @staticmethod
    def _mark_dynamic(*tensors: torch.Tensor) -> None:
        # Only the token dimension varies: model constants stay static. Unbacked, so width 1 gets no graph of its
        # own (a dynamic size is otherwise specialized at 0 and 1): one compilation serves every width, as vLLM
        # compiles one graph for all sizes.
        for t in tensors:
            torch._dynamo.decorators.mark_unbacked(t, 0)

    def profile_run(self, num_tokens: int, num_requests: int) -> torch.Tensor:
        """The step vLLM's memory profiling runs before it sizes the KV cache (`profile_run`): `num_tokens`
        fresh tokens (max_num_batched_tokens) split over `num_requests` requests (max_num_seqs), attending
        causally among themselves with no cached context, then logits for each request's last token. Eager,
        with its own temporary inputs, so it may be wider than the static buffers; returns the logits."""
        if not 1 <= num_requests <= num_tokens:
            raise ValueError(f"{num_requests=} must be in 1..{num_tokens=}")
        s = self.shard
        eps = s.rms_norm_eps
        with torch.no_grad():
            ids = torch.randint(0, s.vocab_size, (num_tokens,), device=self.device)
            per_request, extra = divmod(num_tokens, num_requests)
            lengths = [per_request + (1 if r < extra else 0) for r in range(num_requests)]
            # Positions past the rotary table wrap around: they change values, not memory or work.
            pos = torch.cat([torch.arange(n, device=self.device) for n in lengths]) % self.cos.shape[0]
            cos = self.cos[pos].unsqueeze(1)
            sin = self.sin[pos].unsqueeze(1)
            h = F.embedding(ids, self.embed)
            for layer in self.layers:
                q, k, v = _qkv(s, h, cos, sin, *layer.pre_attention())
                outs, lo = [], 0
                # Requests of equal length attend as one batch (at most two lengths: per_request and +1).
                for length in sorted(set(lengths), reverse=True):
                    count = lengths.count(length)
                    hi = lo + count * length
                    batch = [x[lo:hi].view(count, length, -1, s.head_dim).transpose(1, 2) for x in (q, k, v)]
                    o = F.scaled_dot_product_attention(*batch, is_causal=True, enable_gqa=self._enable_gqa)
                    outs.append(o.transpose(1, 2).reshape(count * length, s.q_size))
                    lo = hi
                h = _post_attention(s, h, torch.cat(outs) if len(outs) > 1 else outs[0], *layer.post_attention())
            last = torch.tensor(lengths, device=self.device).cumsum(0) - 1
            return self.logits(F.rms_norm(h[last], (s.hidden_size,), self.final_norm, eps))

    def _forward_hidden_eager(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        s = self.shard
        eps = s.rms_norm_eps
        num_tokens = ids.shape[0]
        cos = self.cos[pos].unsqueeze(1)  # [T, 1, head_dim], broadcast over heads
        sin = self.sin[pos].unsqueeze(1)
        h = F.embedding(ids, self.embed)
        compiled = self._compiled
        for i, layer in enumerate(self.layers):
            q, k, v = _qkv(s, h, cos, sin, *layer.pre_attention())
            if compiled:
                o = torch.ops.cgtune.decode_attention(q, k, v, self._key, i)
            else:  # called directly: the custom op's dispatch would add host time per layer to eager steps
                o = self._attention(i, q, k, v)
            h = _post_attention(s, h, o, *layer.post_attention())
        # narrow, not a slice: a slice clamps its end, which gives the unbacked token count a second symbol that
        # torch 2.11 (the GPU host's) cannot prove equal to the first at the copy.
        out = self.hidden_out.narrow(0, 0, num_tokens)
        out.copy_(F.rms_norm(h, (s.hidden_size,), self.final_norm, eps))
        return out

    def _step_groups(self, num_tokens: int) -> tuple[tuple[int, int, int, int, int, object], ...]:
        """The step's attention metadata, built once per width as vLLM builds it once per step rather than in every
        layer: per request group (`num_tokens // q` requests of q tokens, then one of the rest) its token range, first
        request, request count, query length and mask. Bottom-right causal: new token j sees the whole context and
        new tokens 0..j, which speculative verification needs. On CUDA the mask is SDPA's causal bias (it keeps SDPA
        on its fused kernels); elsewhere SDPA would materialize that bias in every call, so it is materialized here,
        once: the same boolean mask, the same math kernel."""
        groups = self._groups.get(num_tokens)
        if groups is None:
            ql, ctx = self.decode_query_len, self.context_len
            n_full, rest = divmod(num_tokens, ql)
            groups = []
            for first, requests, length in ((0, n_full, ql), (n_full, 1 if rest else 0, rest)):
                if requests:
                    mask = causal_lower_right(length, ctx + length)
                    if self.device.type != "cuda":
                        mask = mask._materialize(self.device)
                    groups.append((first * ql, first * ql + requests * length, first, requests, length, mask))
            groups = self._groups[num_tokens] = tuple(groups)
        return groups

    def _attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   out: torch.Tensor | None = None) -> torch.Tensor:
        """Write the new keys/values after each request's context, then attend over context + new tokens:
        `T // q` requests of q tokens, and one request with the `T % q` remaining tokens if any. With `out`
        (`[T, q_size]`), the result is copied into it (a piecewise step's static buffer: one copy per request
        group that vLLM's attention, writing there directly, does not make); else returned as a new tensor
        (a view of SDPA's output where its layout allows)."""
        s = self.shard
        kv_cache = self.layers[layer].kv_cache
        if kv_cache is None:
            raise RuntimeError("the KV cache is not allocated: call allocate_kv_cache() before a decode step")
        ctx = self.context_len
        outs = []
        for lo, hi, first, requests, length, mask in self._step_groups(q.shape[0]):
            cache = kv_cache[:, first:first + requests, :, :ctx + length]
            qr = q[lo:hi].view(requests, length, s.num_heads, s.head_dim).transpose(1, 2)
            cache[0, :, :, ctx:].copy_(k[lo:hi].view(requests, length, s.num_kv_heads, s.head_dim).transpose(1, 2))
            cache[1, :, :, ctx:].copy_(v[lo:hi].view(requests, length, s.num_kv_heads, s.head_dim).transpose(1, 2))
            o = F.scaled_dot_product_attention(qr, cache[0], cache[1], attn_mask=mask, enable_gqa=self._enable_gqa)
            if out is not None:
                out[lo:hi].view(requests, length, s.num_heads, s.head_dim).copy_(o.transpose(1, 2))
            else:
                outs.append(o.transpose(1, 2).reshape(requests * length, s.q_size))
        if out is not None:
            return out
        return outs[0] if len(outs) == 1 else torch.cat(outs)


# Models by key, so the attention custom op can find its KV cache without taking it as a (mutated) argument.
_MODELS: weakref.WeakValueDictionary[int, DecodeModel] = weakref.WeakValueDictionary()
_MODEL_KEYS = itertools.count()


@torch.library.custom_op("cgtune::decode_attention", mutates_args=())
def _decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, model_key: int, layer: int) -> torch.Tensor:
    """Attention as one opaque op for torch.compile, as vLLM registers its attention: Inductor compiles
    everything around it, and the ragged request split inside stays eager Python, so only the token count
    is dynamic. The KV-cache write is hidden from the compiler like vLLM's (the cache is looked up, not
    passed), so Inductor never copies the cache to functionalize it."""
    return _MODELS[model_key]._attention(layer, q, k, v)


@_decode_attention.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, model_key: int, layer: int) -> torch.Tensor:
    return q.new_empty(q.shape[0], q.shape[1] * q.shape[2])


def _qkv(s: ShardShape, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, input_norm: torch.Tensor,
         qkv: torch.Tensor, q_norm: torch.Tensor | None, k_norm: torch.Tensor | None
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Input norm, fused QKV projection, Qwen3's per-head q/k norms, rotary: `[T, heads, head_dim]` each."""
    num_tokens = h.shape[0]
    a = F.rms_norm(h, (s.hidden_size,), input_norm, s.rms_norm_eps)
    fused = F.linear(a, qkv)
    v = fused[:, s.q_size + s.kv_size:].view(num_tokens, s.num_kv_heads, s.head_dim)
    if q_norm is None:
        # q and k heads sit side by side in the fused output: one rotary pass covers both.
        qk = _rope(fused[:, :s.q_size + s.kv_size].view(num_tokens, s.num_heads + s.num_kv_heads, s.head_dim),
                   cos, sin)
        q, k = qk.split([s.num_heads, s.num_kv_heads], dim=1)
        return q, k, v
    q = fused[:, :s.q_size].view(num_tokens, s.num_heads, s.head_dim)
    k = fused[:, s.q_size:s.q_size + s.kv_size].view(num_tokens, s.num_kv_heads, s.head_dim)
    q = F.rms_norm(q, (s.head_dim,), q_norm, s.rms_norm_eps)
    k = F.rms_norm(k, (s.head_dim,), k_norm, s.rms_norm_eps)
    return _rope(q, cos, sin), _rope(k, cos, sin), v


def _post_attention(s: ShardShape, h: torch.Tensor, o: torch.Tensor, o_proj: torch.Tensor, post_norm: torch.Tensor,
                    gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """Output projection added to the residual stream, then post-attention norm and SwiGLU MLP, added too; each
    residual add rides in its GEMM (addmm), as one kernel."""
    h = torch.addmm(h, o, o_proj.t())
    m = F.rms_norm(h, (s.hidden_size,), post_norm, s.rms_norm_eps)
    gate, up = F.linear(m, gate_up).chunk(2, dim=-1)
    return torch.addmm(h, F.silu(gate) * up, down.t())


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX-style rotary embedding (rotate halves), as vLLM applies it to Llama and Qwen:
    `[x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin]`, written `x * cos + [x2, x1] * sin'` with `sin'` the
    table whose first half is negated, so three ops (multiply, concatenate, multiply-add) instead of seven."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.addcmul(x * cos, torch.cat((x2, x1), dim=-1), sin)


# The step's pieces between attention calls (see DecodeModel.split_step). Weights are arguments, not looked up by
# layer index, so one compiled graph serves every middle piece.
def _piece_first(s: ShardShape, ids: torch.Tensor, pos: torch.Tensor, embed: torch.Tensor, cos_table: torch.Tensor,
                 sin_table: torch.Tensor, pre: tuple) -> tuple[torch.Tensor, ...]:
    """Embedding and layer 0 up to attention; allocates the attention's output, as vLLM's piece does."""
    h = F.embedding(ids, embed)
    q, k, v = _qkv(s, h, cos_table[pos].unsqueeze(1), sin_table[pos].unsqueeze(1), *pre)
    return h, q, k, v, h.new_empty(h.shape[0], s.q_size)


def _piece_middle(s: ShardShape, h: torch.Tensor, o: torch.Tensor, pos: torch.Tensor, cos_table: torch.Tensor,
                  sin_table: torch.Tensor, post: tuple, pre: tuple) -> tuple[torch.Tensor, ...]:
    """Layer i-1 after attention, layer i up to attention (rotary tables read per piece, as each vLLM layer reads
    its cos/sin cache)."""
    h = _post_attention(s, h, o, *post)
    q, k, v = _qkv(s, h, cos_table[pos].unsqueeze(1), sin_table[pos].unsqueeze(1), *pre)
    return h, q, k, v, h.new_empty(h.shape[0], s.q_size)


def _piece_last(s: ShardShape, h: torch.Tensor, o: torch.Tensor, post: tuple, final_norm: torch.Tensor,
                out: torch.Tensor) -> tuple[torch.Tensor]:
    """The last layer after attention and the final norm, written into the static output."""
    h = _post_attention(s, h, o, *post)
    torch._check(h.shape[0] == out.shape[0])  # one unbacked token count; torch 2.11 cannot prove it unaided
    out.copy_(F.rms_norm(h, (s.hidden_size,), final_norm, s.rms_norm_eps))
    return (out,)


def build_model(workload: Workload, max_num_tokens: int, device: torch.device | str, *, shape: ModelShape | None = None,
                seed: int = 0, allocate_kv_cache: bool = True, shared_embed: torch.Tensor | None = None,
                shared_lm_head: torch.Tensor | None = None) -> DecodeModel:
    """A decode step of `shape` (the workload's model when None) for one rank of the workload, with a static KV
    cache at its mean context length (allocated later by the caller when `allocate_kv_cache` is False)."""
    m = workload.model
    return DecodeModel(
        ShardShape.for_rank(m.shape if shape is None else shape, m.tensor_parallel_size),
        max_num_tokens=max_num_tokens,
        decode_query_len=workload.serving.decode_query_len,
        context_len=workload.traffic.mean_context_len,
        dtype=DTYPES[m.dtype],
        device=device,
        seed=seed,
        allocate_kv_cache=allocate_kv_cache,
        shared_embed=shared_embed,
        shared_lm_head=shared_lm_head,
    )


def memory_asked_bytes(workload: Workload, max_num_tokens: int) -> tuple[int, int]:
    """(weights, KV cache) bytes `build_model` asks for one rank of the workload with buffers `max_num_tokens` wide,
    the drafter's included: what a run needs before its first step."""
    m, s = workload.model, workload.serving
    requests = -(-max_num_tokens // s.decode_query_len)
    # The drafter's KV layers too: its cache is as wide as the target's at most.
    kv = workload.kv_bytes_per_token() * requests * (workload.traffic.mean_context_len + s.decode_query_len)
    return m.weight_bytes() + workload.drafter_weight_bytes(), kv


def out_of_memory_building(workload: Workload, max_num_tokens: int, device: torch.device | str) -> str:
    """The one line for a model or KV cache that does not fit the device: the workload and the memory it asked."""
    device = torch.device(device)
    weights, kv = memory_asked_bytes(workload, max_num_tokens)
    on = f"{device}"
    if device.type == "cuda":
        on += f" ({torch.cuda.get_device_properties(device).total_memory / 2**30:.1f} GiB)"
    return (f"{workload.name}: out of memory building the model on {on}: it asks {weights / 2**30:.1f} GiB of "
            f"weights and {kv / 2**30:.1f} GiB of KV cache for {max_num_tokens} tokens at context "
            f"{workload.traffic.mean_context_len}")
