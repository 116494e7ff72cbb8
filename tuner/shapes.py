"""Model shapes cgtune can build a decode step for: a preset registry (gpt-fast style) and byte counts."""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["DTYPE_BYTES", "PRESETS", "PRESET_CHECKPOINTS", "ModelShape"]

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
"""Bytes per element of the dtypes a workload may name."""


@dataclass(frozen=True)
class ModelShape:
    """A Llama-style decoder's shape (whole model, before tensor parallelism)."""

    hidden_size: int
    """Residual stream width."""
    num_layers: int
    """Decoder layers."""
    num_attention_heads: int
    """Query heads."""
    num_kv_heads: int
    """Key/value heads (grouped-query attention when fewer than query heads)."""
    head_dim: int
    """Width of one attention head."""
    intermediate_size: int
    """SwiGLU MLP width."""
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

    @classmethod
    def from_name(cls, name: str) -> ModelShape:
        """A preset by name; KeyError lists the known names."""
        try:
            return PRESETS[name]
        except KeyError:
            raise KeyError(f"unknown model preset {name!r}; known: {', '.join(sorted(PRESETS))}") from None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def kv_heads_per_rank(self, tensor_parallel_size: int) -> int:
        """vLLM replicates KV heads when TP exceeds their count, so a rank holds at least one."""
        return max(1, self.num_kv_heads // tensor_parallel_size)

    def kv_bytes_per_token(self, dtype: str, tensor_parallel_size: int = 1) -> int:
        """KV-cache bytes one token costs on one rank: 2 (K, V) x layers x kv heads x head_dim x dtype."""
        return (
            2 * self.num_layers * self.kv_heads_per_rank(tensor_parallel_size) * self.head_dim * DTYPE_BYTES[dtype]
        )

    def weight_bytes(self, dtype: str, tensor_parallel_size: int = 1) -> int:
        """Parameter bytes one rank holds (heads, MLP and vocabulary sharded as vLLM shards them)."""
        tp = tensor_parallel_size
        heads = self.num_attention_heads // tp
        kv = self.kv_heads_per_rank(tp)
        inter = self.intermediate_size // tp
        vocab = -(-self.vocab_size // tp)
        per_layer = (
            self.hidden_size * (heads + 2 * kv) * self.head_dim  # qkv projection
            + heads * self.head_dim * self.hidden_size  # output projection
            + 3 * self.hidden_size * inter  # gate, up, down
            + 2 * self.hidden_size  # two RMSNorms
            + (2 * self.head_dim if self.qk_norm else 0)
        )
        embed = vocab * self.hidden_size
        head = 0 if self.tie_word_embeddings else vocab * self.hidden_size
        return (self.num_layers * per_layer + embed + head + self.hidden_size) * DTYPE_BYTES[dtype]


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
