"""The weights and KV bytes per token cgtune sizes from a config.json, held to what vLLM holds: to the published
checkpoints of real models (their config.json files ship in workloads/models/), and, for tiny models of every family
cgtune sizes, to vLLM's own model classes (0.33 and 0.34) built on the meta device as one tensor-parallel rank builds
them (tests/vllm/model_weights_oracle.py); and what cannot be sized refused in one line naming the field."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tuner.engines.vllm.drafter import drafter_kv_bytes_per_token, drafter_weight_bytes
from tuner.shapes import PRESETS, ModelShape, UnsizedModelError
from tuner.workload.model_config import shape_from_config

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/vllm_code.py (import-mode=importlib)
from vllm_code import require_vllm_033, vllm_034_code  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "workloads" / "models"
ORACLE = ROOT / "tests" / "vllm" / "model_weights_oracle.py"


def shape_of(config: dict[str, Any]) -> ModelShape:
    return ModelShape(**shape_from_config(config, "model.config"))


def read(name: str) -> dict[str, Any]:
    return json.loads((MODELS / name / "config.json").read_text())


# --------------------------------------------------------------------------------- published checkpoint sizes
# Published sizes (bytes), each with where it is from. A checkpoint holds the parameters vLLM loads; vLLM holds no
# padding for these vocabularies (multiples of 64).
QWEN3_30B_A3B_BYTES = 61_064_245_248
"""Qwen/Qwen3-30B-A3B on Hugging Face: model.safetensors.index.json `metadata.total_size` (bf16, 16 shards)."""
DEEPSEEK_V3_BYTES = 688_586_727_753
"""deepseek-ai/DeepSeek-V3 on Hugging Face at revision afb92e1fa402c2be2a9eb085312bb02e0384d6c7: the bytes of its
163 safetensors files (FP8 e4m3 weights in 128x128 blocks with float32 scales; the file headers are a few MB of it).
The checkpoint holds the 61 layers and the MTP module (layer 61, with its own copies of the embedding and head)."""
LLAMA_31_8B_BYTES = 16_060_522_496
"""meta-llama/Llama-3.1-8B-Instruct on Hugging Face: model.safetensors.index.json `metadata.total_size` (bf16)."""


def test_qwen3_30b_a3b_is_its_published_checkpoint_experts_and_all():
    shape = shape_of(read("qwen3-30b-a3b"))
    assert (shape.num_experts, shape.num_moe_layers, shape.moe_intermediate_size) == (128, 48, 768)
    assert shape.weight_bytes("bfloat16") == QWEN3_30B_A3B_BYTES  # the dense reading gave 6.68 GB
    assert shape.kv_bytes_per_token("bfloat16") == 2 * 48 * 4 * 128 * 2


def test_deepseek_v3_fp8_mla_moe_is_its_published_checkpoint():
    shape = shape_of(read("deepseek-v3"))
    assert (shape.quantization, shape.quant_block_n, shape.kv_lora_rank, shape.num_moe_layers) == ("fp8", 128, 512, 58)
    # The checkpoint: the target as vLLM allocates it (less the model-dtype W_UK/W_UV copy that loading leaves behind,
    # which no file holds), and the MTP module with its own embedding and LM head.
    target = shape.weight_bytes("bfloat16") - shape.num_layers * shape.mla_absorbed_bytes("bfloat16")
    mtp = dataclasses.replace(shape, num_layers=1, num_moe_layers=1)
    module = (drafter_weight_bytes("mtp", mtp, shape, "bfloat16", shares_embedding=False, shares_lm_head=False)
              - mtp.mla_absorbed_bytes("bfloat16"))
    assert abs((target + module) / DEEPSEEK_V3_BYTES - 1) < 0.001
    # MLA caches one latent per token and layer, kv_lora_rank + qk_rope_head_dim wide, whole on every rank.
    assert shape.kv_bytes_per_token("bfloat16") == shape.kv_bytes_per_token("bfloat16", 8) == 61 * (512 + 64) * 2


def test_llama_31_8b_preset_is_its_published_checkpoint():
    assert PRESETS["llama-3.1-8b"].weight_bytes("bfloat16") == LLAMA_31_8B_BYTES


# --------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(("change", "field"), [
    ({"quantization_config": {"quant_method": "awq", "bits": 4}},
     "model.config.quantization_config.quant_method='awq' cannot be sized"),
    ({"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic",
                              "modules_to_not_convert": ["model.layers.0.self_attn.q_proj"]}},
     "model.config.quantization_config.modules_to_not_convert names 'model.layers.0.self_attn.q_proj'"),
    ({"architectures": ["GPT2LMHeadModel"]}, "model.config.architectures=['GPT2LMHeadModel'] cannot be sized"),
    ({"mlp_bias": True}, "model.config.mlp_bias=True cannot be sized"),
])
def test_what_cannot_be_sized_is_refused_in_one_line_naming_the_field(change, field):
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256}
    shape = shape_of({**config, **change})
    with pytest.raises(UnsizedModelError) as exc:
        shape.weight_bytes("bfloat16")
    assert str(exc.value).startswith(field) and "\n" not in str(exc.value)


def test_an_fp8_expert_width_no_block_divides_is_refused_as_vllm_refuses_it():
    config = {**TINY["qwen3_moe"], "moe_intermediate_size": 96, "quantization_config": FP8_BLOCK}
    shape = shape_of(config)
    assert shape.weight_bytes("bfloat16", 1) > 0  # 96 wide: vLLM refines the 128 blocks to gcd(128, 96, 64) = 32
    with pytest.raises(UnsizedModelError, match="no FP8 block of at least 32 divides"):
        shape.weight_bytes("bfloat16", 4)  # 24 wide


# --------------------------------------------------------------------------------- vLLM's own model classes
BASE = {"hidden_act": "silu", "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "torch_dtype": "bfloat16", "tie_word_embeddings": False}
FP8_BLOCK = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]}
FP8_TENSOR_STATIC = {"quant_method": "fp8", "activation_scheme": "static"}
TINY: dict[str, dict[str, Any]] = {
    # Vocabulary 300 pads to 320 rows; attention_bias puts biases on q/k/v and o_proj.
    "llama": {**BASE, "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 256,
              "vocab_size": 300, "attention_bias": True},
    "qwen2": {**BASE, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1, "intermediate_size": 256,
              "vocab_size": 260, "tie_word_embeddings": True},
    "qwen3": {**BASE, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 256,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
              "intermediate_size": 512, "vocab_size": 512},
    "mixtral": {**BASE, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 128,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 256,
                "num_local_experts": 4, "num_experts_per_tok": 2, "vocab_size": 256, "tie_word_embeddings": True},
    # One dense layer (mlp_only_layers), a shared expert with its gate.
    "qwen3_moe": {**BASE, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 256,
                  "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
                  "intermediate_size": 512, "moe_intermediate_size": 256, "num_experts": 8, "num_experts_per_tok": 2,
                  "decoder_sparse_step": 1, "mlp_only_layers": [1], "norm_topk_prob": True, "vocab_size": 300,
                  "shared_expert_intermediate_size": 256},
    # DeepSeek-V3-like: MLA with q_lora_rank, a dense first layer, a shared expert, the noaux_tc router bias.
    "deepseek_v3": {**BASE, "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
                    "hidden_size": 256, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4,
                    "intermediate_size": 512, "moe_intermediate_size": 256, "n_routed_experts": 8,
                    "n_shared_experts": 1, "num_experts_per_tok": 2, "first_k_dense_replace": 1, "moe_layer_freq": 1,
                    "n_group": 2, "topk_group": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
                    "norm_topk_prob": True, "routed_scaling_factor": 2.5, "kv_lora_rank": 128, "q_lora_rank": 256,
                    "qk_nope_head_dim": 64, "qk_rope_head_dim": 64, "v_head_dim": 64, "num_nextn_predict_layers": 1,
                    "vocab_size": 1000},
    # DeepSeek-V2-Lite-like: MLA without q_lora_rank, two shared experts, MoE every other layer, a greedy router.
    "deepseek_v2": {**BASE, "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
                    "hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
                    "intermediate_size": 256, "moe_intermediate_size": 64, "n_routed_experts": 4,
                    "n_shared_experts": 2, "num_experts_per_tok": 2, "first_k_dense_replace": 1, "moe_layer_freq": 2,
                    "n_group": 1, "topk_group": 1, "topk_method": "greedy", "kv_lora_rank": 64, "q_lora_rank": None,
                    "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32, "vocab_size": 500},
}
GATES = [f"model.layers.{i}.mlp.gate" for i in (0, 2)]
# (name, config, tensor-parallel ranks, with DeepSeek's MTP module)
CASES = [
    ("llama", TINY["llama"], 2, False),
    ("qwen2 tied", TINY["qwen2"], 2, False),
    ("qwen3 fp8 blocks", {**TINY["qwen3"], "quantization_config": FP8_BLOCK}, 2, False),
    ("qwen3 fp8 per tensor, static", {**TINY["qwen3"], "quantization_config": FP8_TENSOR_STATIC}, 2, False),
    ("mixtral", TINY["mixtral"], 2, False),
    ("qwen3-moe", TINY["qwen3_moe"], 1, False),
    ("qwen3-moe", TINY["qwen3_moe"], 4, False),
    ("qwen3-moe fp8, gates quantized", {**TINY["qwen3_moe"], "quantization_config": FP8_BLOCK}, 1, False),
    ("qwen3-moe fp8 refined blocks, gates not", {**TINY["qwen3_moe"], "moe_intermediate_size": 96, "quantization_config":
                                               {**FP8_BLOCK, "modules_to_not_convert": ["lm_head", *GATES]}}, 1, False),
    ("deepseek-v3 fp8 + mtp", {**TINY["deepseek_v3"], "quantization_config": FP8_BLOCK}, 2, True),
    ("deepseek-v3 + mtp", TINY["deepseek_v3"], 4, True),
    ("deepseek-v2", TINY["deepseek_v2"], 2, False),
]


def _oracle(pythonpath: str | None) -> list[dict[str, Any]]:
    cases = [{"config": config, "tp": tp, "dtype": "bfloat16", "mtp": mtp} for _, config, tp, mtp in CASES]
    env = {**os.environ, "PYTHONPATH": pythonpath} if pythonpath else {**os.environ}
    proc = subprocess.run([sys.executable, str(ORACLE)], input=json.dumps(cases), capture_output=True, text=True,
                          timeout=900, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module", params=["0.33", "0.34"])
def vllm_answers(request) -> list[dict[str, Any]]:
    if request.param == "0.33":
        require_vllm_033()
        answers = _oracle(None)
    else:
        answers = _oracle(str(vllm_034_code()))
    assert {a["version"] for a in answers} == {"0.33.0" if request.param == "0.33" else "0.34.0"}
    return answers


@pytest.mark.parametrize("index", range(len(CASES)), ids=[f"{c[0]} tp{c[2]}" for c in CASES])
def test_weights_and_kv_are_what_vllms_own_model_classes_hold_on_one_rank(vllm_answers, index):
    name, config, tp, mtp = CASES[index]
    answer = vllm_answers[index]
    shape = shape_of(config)
    assert shape.weight_bytes("bfloat16", tp) == answer["weights_bytes"], name
    assert shape.kv_bytes_per_token("bfloat16", tp) == answer["kv_bytes_per_token"], name
    if mtp:  # one MTP module: a MoE layer past the dense ones, sharing the target's embedding and head
        module = dataclasses.replace(shape, num_layers=1, num_moe_layers=1)
        assert drafter_weight_bytes("mtp", module, shape, "bfloat16", tp) == answer["mtp_weights_bytes"], name
        assert drafter_kv_bytes_per_token("mtp", module, "bfloat16", tp) == answer["mtp_kv_bytes_per_token"], name
