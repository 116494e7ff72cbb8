"""Model shapes cgtune can build a decode step for, or size from a config.json: a preset registry (gpt-fast style),
and the weight and KV-cache bytes vLLM holds for a shape on one tensor-parallel rank (dense or MoE MLP, standard or MLA
attention, model-dtype or FP8 weights)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

__all__ = ["DTYPE_BYTES", "PRESETS", "PRESET_CHECKPOINTS", "VOCAB_PADDING", "ModelShape", "UnsizedModelError"]

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
"""Bytes per element of the dtypes a workload may name."""

VOCAB_PADDING = 64
"""vLLM pads the vocabulary to a multiple of this before sharding it over the ranks
(layers/vocab_parallel_embedding.py `DEFAULT_VOCAB_PADDING_SIZE`)."""

_FP8_SCALE_BYTES = 4  # FP8 weight scales are float32 parameters (quantization/utils/fp8_utils.py)
_MIN_REFINED_BLOCK = 32  # fused_moe/oracle/fp8.py `refine_fp8_moe_block_shape`: a finer block below 32 is refused


class UnsizedModelError(ValueError):
    """A shape whose weights or KV cache cgtune cannot size as vLLM would (the message names the config field)."""


@dataclass(frozen=True)
class ModelShape:
    """A decoder's shape (whole model, before tensor parallelism): a Llama-style dense model by default; MoE, MLA and
    FP8 fields describe the models vLLM builds from DeepSeek-V2/V3, Mixtral and Qwen3-MoE config.json files."""

    hidden_size: int
    """Residual stream width."""
    num_layers: int
    """Decoder layers."""
    num_attention_heads: int
    """Query heads."""
    num_kv_heads: int
    """Key/value heads (grouped-query attention when fewer than query heads; unused by MLA)."""
    head_dim: int
    """Width of one attention head (unused by MLA)."""
    intermediate_size: int
    """SwiGLU MLP width of the dense layers."""
    vocab_size: int
    """Vocabulary (embedding rows, LM-head columns)."""
    rope_theta: float = 500000.0
    """Rotary embedding base."""
    rms_norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    tie_word_embeddings: bool = False
    """LM head shares the embedding matrix (no separate weights)."""
    qk_norm: bool = False
    """Per-head RMSNorm on queries and keys (Qwen3)."""
    qkv_bias: bool = False
    """Biases on the q/k/v projections (Qwen2; `attention_bias` of Llama and Qwen3)."""
    o_proj_bias: bool = False
    """A bias on the output projection (Llama's `attention_bias`)."""
    num_experts: int = 0
    """Routed experts of a MoE layer (0: every layer's MLP is dense)."""
    moe_intermediate_size: int = 0
    """Width of one routed expert's SwiGLU MLP."""
    num_moe_layers: int = 0
    """How many of the layers are MoE layers (the others have the dense MLP)."""
    shared_expert_intermediate_size: int = 0
    """Width of the shared experts' MLP in a MoE layer (DeepSeek: n_shared_experts x moe_intermediate_size)."""
    shared_expert_gate: bool = False
    """A one-output sigmoid gate on the shared expert (Qwen3-MoE's `shared_expert_gate`, never quantized)."""
    router_bias: bool = False
    """The router's float32 score-correction bias, one per expert (DeepSeek-V3's `topk_method: noaux_tc`)."""
    router_quantized: bool = False
    """The router gate takes the checkpoint's quantization (Qwen3-MoE's gate does, unless listed as not converted)."""
    kv_lora_rank: int = 0
    """MLA: the compressed KV width (0: standard attention)."""
    q_lora_rank: int = 0
    """MLA: the compressed query width (0: queries projected straight from the residual stream)."""
    qk_nope_head_dim: int = 0
    """MLA: the part of a query/key head without rotary embedding."""
    qk_rope_head_dim: int = 0
    """MLA: the rotary part of a query/key head (the key's is shared by all heads and cached)."""
    v_head_dim: int = 0
    """MLA: width of one value head."""
    quantization: str | None = None
    """The checkpoint's weight quantization (`fp8`), None for weights in the model dtype."""
    quant_block_n: int = 0
    """FP8 block quantization: output rows per weight scale (0: one scale per tensor)."""
    quant_block_k: int = 0
    """FP8 block quantization: input columns per weight scale."""
    quant_static_activations: bool = False
    """FP8 with `activation_scheme: static`: each quantized layer also loads float32 input scales."""
    weights_unsized: str | None = None
    """Why cgtune cannot size this model's weights (naming the config field), None when it can."""
    kv_unsized: str | None = None
    """Why cgtune cannot size this model's KV cache (naming the config field), None when it can."""

    @classmethod
    def from_name(cls, name: str) -> ModelShape:
        """A preset by name; KeyError lists the known names."""
        try:
            return PRESETS[name]
        except KeyError:
            raise KeyError(f"unknown model preset {name!r}; known: {', '.join(sorted(PRESETS))}") from None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    @property
    def mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2/V3): a compressed KV cache of one latent "head" per token."""
        return self.kv_lora_rank > 0

    def kv_heads_per_rank(self, tensor_parallel_size: int) -> int:
        """vLLM replicates KV heads when TP exceeds their count, so a rank holds at least one."""
        return max(1, self.num_kv_heads // tensor_parallel_size)

    def vocab_per_rank(self, tensor_parallel_size: int) -> int:
        """Embedding (and LM-head) rows one rank holds: the vocabulary padded to `VOCAB_PADDING`, then split evenly
        (vLLM's `VocabParallelEmbedding`)."""
        padded = -(-self.vocab_size // VOCAB_PADDING) * VOCAB_PADDING
        if padded % tensor_parallel_size:
            raise UnsizedModelError(f"tensor_parallel_size={tensor_parallel_size} does not divide the padded "
                                    f"vocabulary ({padded} rows for vocab_size={self.vocab_size}): vLLM refuses it")
        return padded // tensor_parallel_size

    def kv_bytes_per_layer_token(self, dtype: str, tensor_parallel_size: int = 1) -> int:
        """KV-cache bytes one token costs in one attention layer on one rank: K and V of the rank's KV heads, or MLA's
        single latent of kv_lora_rank + qk_rope_head_dim, which every rank holds whole (vLLM's `MLAAttentionSpec`:
        one head, `max_tp_shards=1`, no separate V)."""
        if self.kv_unsized:
            raise UnsizedModelError(self.kv_unsized)
        if self.mla:
            return (self.kv_lora_rank + self.qk_rope_head_dim) * DTYPE_BYTES[dtype]
        return 2 * self.kv_heads_per_rank(tensor_parallel_size) * self.head_dim * DTYPE_BYTES[dtype]

    def kv_bytes_per_token(self, dtype: str, tensor_parallel_size: int = 1) -> int:
        """KV-cache bytes one token costs on one rank, over every layer."""
        return self.num_layers * self.kv_bytes_per_layer_token(dtype, tensor_parallel_size)

    def weight_bytes(self, dtype: str, tensor_parallel_size: int = 1) -> int:
        """Parameter bytes one rank holds once vLLM has loaded the model: what its model classes allocate for the
        checkpoint (heads, MLP widths and vocabulary sharded as vLLM shards them, experts split over the ranks along
        their width as FusedMoE does without expert parallelism, FP8 weights with their float32 scales), plus the
        model-dtype copy of MLA's kv_b_proj that a quantized checkpoint leaves behind (W_UK_T, W_UV). The attention
        layers' FP8 KV-scale placeholders, which vLLM deletes after loading, are not counted.
        UnsizedModelError when the shape says cgtune cannot size it."""
        if self.weights_unsized:
            raise UnsizedModelError(self.weights_unsized)
        tp = tensor_parallel_size
        dt = DTYPE_BYTES[dtype]
        h = self.hidden_size
        attention = self._mla_bytes(dt, tp) if self.mla else self._attention_bytes(dt, tp)
        norms = 2 * h * dt
        dense = self._mlp_bytes(dt, self.intermediate_size // tp)
        moe = self._moe_bytes(dt, tp) if self.num_experts else 0
        layers = self.num_layers * (attention + norms) + self.num_moe_layers * moe
        layers += (self.num_layers - self.num_moe_layers) * dense
        vocab = self.vocab_per_rank(tp) * h * dt
        head = 0 if self.tie_word_embeddings else vocab
        return layers + vocab + head + h * dt  # + the final norm

    def mla_absorbed_bytes(self, dtype: str, tensor_parallel_size: int = 1) -> int:
        """Bytes per MLA layer of the model-dtype kv_b_proj that vLLM's MLA attention keeps after loading (W_UK_T and
        W_UV, `layers/attention/mla_attention.py` `split_kv_b_proj`): views of kv_b_proj's own weight when it is in
        the model dtype, a dequantized copy when it is quantized; 0 without MLA."""
        return self._absorbed(DTYPE_BYTES[dtype], tensor_parallel_size)

    def _absorbed(self, dt: int, tp: int) -> int:
        if not self.mla or self.quantization is None:
            return 0
        return self.num_attention_heads // tp * (self.qk_nope_head_dim + self.v_head_dim) * self.kv_lora_rank * dt

    # ------------------------------------------------------------------ the layers, one rank's share
    def _linear(self, dt: int, out_parts: list[int], in_size: int, *, bias: int = 0, quantized: bool = True) -> int:
        """One linear layer (its output split in `out_parts` fused shards): the weight in the model dtype, or FP8 with
        float32 scales (one per shard, or one per quant_block_n x quant_block_k block of the fused weight; static
        activations add one input scale per shard, Fp8LinearMethod.create_weights); `bias` elements in the model
        dtype either way."""
        rows = sum(out_parts)
        if self.quantization is None or not quantized:
            return (rows * in_size + bias) * dt
        if self.quant_block_n:
            scales = math.ceil(rows / self.quant_block_n) * math.ceil(in_size / self.quant_block_k)
        else:
            scales = len(out_parts) * (2 if self.quant_static_activations else 1)
        return rows * in_size + scales * _FP8_SCALE_BYTES + bias * dt

    def _attention_bytes(self, dt: int, tp: int) -> int:
        heads, kv, hd, h = self.num_attention_heads // tp, self.kv_heads_per_rank(tp), self.head_dim, self.hidden_size
        qkv = self._linear(dt, [heads * hd, kv * hd, kv * hd], h, bias=(heads + 2 * kv) * hd if self.qkv_bias else 0)
        out = self._linear(dt, [h], heads * hd, bias=h if self.o_proj_bias else 0)  # row-parallel: the bias is whole
        return qkv + out + (2 * hd * dt if self.qk_norm else 0)

    def _mla_bytes(self, dt: int, tp: int) -> int:
        """DeepseekV2MLAAttention: replicated down-projections (q and kv fused when q_lora_rank is set), their norms,
        the column-parallel up-projections and the row-parallel output, per rank."""
        heads, h = self.num_attention_heads // tp, self.hidden_size
        qk_head = self.qk_nope_head_dim + self.qk_rope_head_dim
        latent = self.kv_lora_rank + self.qk_rope_head_dim
        if self.q_lora_rank:
            total = self._linear(dt, [self.q_lora_rank, latent], h) + self.q_lora_rank * dt  # + q_a_layernorm
            total += self._linear(dt, [heads * qk_head], self.q_lora_rank)
        else:
            total = self._linear(dt, [latent], h) + self._linear(dt, [heads * qk_head], h)
        total += self.kv_lora_rank * dt  # kv_a_layernorm
        total += self._linear(dt, [heads * (self.qk_nope_head_dim + self.v_head_dim)], self.kv_lora_rank)
        total += self._linear(dt, [h], heads * self.v_head_dim)
        return total + self._absorbed(dt, tp)

    def _mlp_bytes(self, dt: int, width: int) -> int:
        """A SwiGLU MLP `width` wide on this rank: merged gate/up, then down."""
        return self._linear(dt, [width, width], self.hidden_size) + self._linear(dt, [self.hidden_size], width)

    def _moe_bytes(self, dt: int, tp: int) -> int:
        """One MoE layer on one rank: the replicated router (and DeepSeek's float32 correction bias), the shared
        expert, and every routed expert with its width split over the ranks (FusedMoE's w13 and w2)."""
        h, experts = self.hidden_size, self.num_experts
        total = self._linear(dt, [experts], h, quantized=self.router_quantized)
        if self.router_bias:
            total += experts * 4
        if self.shared_expert_intermediate_size:
            total += self._mlp_bytes(dt, self.shared_expert_intermediate_size // tp)
            if self.shared_expert_gate:
                total += h * dt
        width = self.moe_intermediate_size // tp
        weights = experts * 3 * width * h
        if self.quantization is None:
            return total + weights * dt
        if not self.quant_block_n:  # per-tensor FP8: one scale per expert and shard (w1, w3 fused; w2)
            scales = experts * 3 * (2 if self.quant_static_activations else 1)
            return total + weights + scales * _FP8_SCALE_BYTES
        bn, bk = self._moe_blocks(width, tp)
        scales = experts * (2 * math.ceil(width / bn) * math.ceil(h / bk) + math.ceil(h / bn) * math.ceil(width / bk))
        return total + weights + scales * _FP8_SCALE_BYTES

    def _moe_blocks(self, width: int, tp: int) -> tuple[int, int]:
        """The FP8 expert scale blocks at this rank's expert width: the checkpoint's, or the finer square block vLLM
        refines them to when the width does not split into whole blocks (`refine_fp8_moe_block_shape`)."""
        bn, bk = self.quant_block_n, self.quant_block_k
        if width % bn == 0 and (tp == 1 or width % bk == 0):
            return bn, bk
        refined = math.gcd(bn, bk, width, self.hidden_size)
        if refined < _MIN_REFINED_BLOCK:
            raise UnsizedModelError(
                f"moe_intermediate_size={self.moe_intermediate_size} over tensor_parallel_size={tp} gives experts "
                f"{width} wide, which no FP8 block of at least {_MIN_REFINED_BLOCK} divides: vLLM refuses to load it")
        return refined, refined


# Shapes from each model's published config.json.
PRESETS: dict[str, ModelShape] = {
    "llama-3.2-1b": ModelShape(2048, 16, 32, 8, 64, 8192, 128256, 500000.0, 1e-5, tie_word_embeddings=True),
    "llama-3.1-8b": ModelShape(4096, 32, 32, 8, 128, 14336, 128256, 500000.0, 1e-5),
    "llama-3.1-70b": ModelShape(8192, 80, 64, 8, 128, 28672, 128256, 500000.0, 1e-5),
    "mistral-7b": ModelShape(4096, 32, 32, 8, 128, 14336, 32768, 1000000.0, 1e-5),
    "qwen3-1.7b": ModelShape(2048, 28, 16, 8, 128, 6144, 151936, 1000000.0, 1e-6, True, qk_norm=True),
    "qwen3-8b": ModelShape(4096, 36, 32, 8, 128, 12288, 151936, 1000000.0, 1e-6, qk_norm=True),
    "qwen3-32b": ModelShape(5120, 64, 64, 8, 128, 25600, 151936, 1000000.0, 1e-6, qk_norm=True),
    # Not a real model: small enough to run a real decode step on a CPU in tests and CI.
    "tiny": ModelShape(64, 2, 4, 2, 16, 128, 256, 10000.0, 1e-5),
}

# The checkpoint each preset's shape is read from, as `vllm serve` names it (Hugging Face id); `tiny` has none.
PRESET_CHECKPOINTS: dict[str, str] = {
    "llama-3.2-1b": "meta-llama/Llama-3.2-1B-Instruct",
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct",
    "llama-3.1-70b": "meta-llama/Llama-3.1-70B-Instruct",
    "mistral-7b": "mistralai/Mistral-7B-Instruct-v0.3",
    "qwen3-1.7b": "Qwen/Qwen3-1.7B",
    "qwen3-8b": "Qwen/Qwen3-8B",
    "qwen3-32b": "Qwen/Qwen3-32B",
}
