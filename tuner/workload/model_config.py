"""A model described by its Hugging Face `config.json`: the dense shape the stand-in decoder builds from it, what in it
the stand-in cannot build (MoE, MLA, quantized weights or KV, sliding windows, other layer types), and the config.json
written for a preset so vLLM can build the same model offline with dummy weights."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner.fields import WorkloadError
from tuner.shapes import ModelShape

__all__ = ["STAND_IN_ARCHITECTURES", "config_for_shape", "read_config", "shape_from_config", "stand_in_gaps"]

STAND_IN_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
"""Architectures whose layers the stand-in decoder builds as they are (RMSNorm, rotary GQA attention, SwiGLU MLP; Qwen3
adds its per-head q/k norm). Qwen2's q/k/v biases are left out: a few vector adds."""

# config.json keys that mean a layer the stand-in has no code for, each with what it is (first one found is named).
_GAP_KEYS = (
    ("num_local_experts", "MoE"), ("num_experts", "MoE"), ("n_routed_experts", "MoE"),
    ("moe_intermediate_size", "MoE"), ("kv_lora_rank", "MLA attention"), ("q_lora_rank", "MLA attention"),
    ("quantization_config", "quantized weights"), ("sliding_window", "sliding-window attention"),
    ("layer_types", "mixed layer types"), ("linear_attn_config", "linear attention"),
)


def read_config(path: Path, at: str) -> dict[str, Any]:
    """A config.json as a mapping; WorkloadError naming `at` and the file for one that is missing or not a JSON
    object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise WorkloadError(f"{at}: {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WorkloadError(f"{at}: {str(path)!r} is not a readable JSON file ({exc})") from None
    if not isinstance(data, dict):
        raise WorkloadError(f"{at}: {str(path)!r} holds a JSON {type(data).__name__}, not a config object")
    return data


def _config_int(config: Mapping[str, Any], key: str, at: str) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise WorkloadError(f"{at}: {key}={value!r} must be a whole number >= 1 (a decoder's config.json has it)")
    return value


def shape_from_config(config: Mapping[str, Any], at: str) -> dict[str, Any]:
    """ModelShape fields read from a config.json as vLLM's model class for its architecture reads them: the attention
    (standard, or DeepSeek's MLA), the dense MLP, the MoE layers (experts, shared experts, router) and an FP8
    checkpoint's quantization. What cgtune cannot size is not refused here (a profile measured through vLLM records
    the engine's own figures) but recorded in `weights_unsized` / `kv_unsized`, one line naming the field, for
    `ModelShape.weight_bytes` / `kv_bytes_per_token` to raise when no measurement stands in."""
    cfg = dict(config.get("text_config") or {}) or dict(config)  # multimodal configs nest the decoder's
    heads = _config_int(cfg, "num_attention_heads", at)
    hidden = _config_int(cfg, "hidden_size", at)
    archs = _architectures(config)
    values: dict[str, Any] = {
        "hidden_size": hidden,
        "num_layers": _config_int(cfg, "num_hidden_layers", at),
        "num_attention_heads": heads,
        "num_kv_heads": _config_int(cfg, "num_key_value_heads", at) if "num_key_value_heads" in cfg else heads,
        "head_dim": _config_int(cfg, "head_dim", at) if cfg.get("head_dim") is not None else hidden // heads,
        "intermediate_size": _config_int(cfg, "intermediate_size", at),
        "vocab_size": _config_int(cfg, "vocab_size", at),
        "tie_word_embeddings": bool(config.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))),
        "qk_norm": "Qwen3" in " ".join(archs),
    }
    for key in ("rope_theta", "rms_norm_eps"):
        value = cfg.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            values[key] = float(value)
    # Every other field at its default (rope_theta and rms_norm_eps only where the config gives them, as before).
    values = {**{k: f.default for k, f in ModelShape.__dataclass_fields__.items()
                 if k not in (*values, "rope_theta", "rms_norm_eps")}, **values}
    family = next((_FAMILIES[a] for a in archs if a in _FAMILIES), None)
    if archs and family is None:
        unsized = (f"{at}.architectures={archs!r} cannot be sized (cgtune sizes "
                   f"{', '.join(sorted(_FAMILIES))})")
        return {**values, "weights_unsized": unsized, "kv_unsized": unsized}
    _read_family(family or "llama", cfg, values, at)
    _read_quantization(cfg, values, at)
    return values


# Each architecture cgtune sizes -> the vLLM model file that builds it (vllm/model_executor/models/).
_FAMILIES = {
    "LlamaForCausalLM": "llama", "MistralForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3", "MixtralForCausalLM": "mixtral", "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekV2ForCausalLM": "deepseek_v2", "DeepseekV3ForCausalLM": "deepseek_v2",
}


def _count(cfg: Mapping[str, Any], key: str, at: str, default: int = 0) -> int:
    """A whole-number field >= 0 (`default` when absent or null)."""
    value = cfg.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise WorkloadError(f"{at}: {key}={value!r} must be a whole number >= 0")
    return value


def _read_family(family: str, cfg: Mapping[str, Any], values: dict[str, Any], at: str) -> None:
    """The fields the family's vLLM model file reads beyond a Llama's (into `values`)."""
    layers = values["num_layers"]
    if family == "llama":  # llama.py: `attention_bias` (or `bias`) on q/k/v and o_proj; `qkv_bias` overrides q/k/v
        bias = bool(cfg.get("attention_bias") or cfg.get("bias"))
        values.update(qkv_bias=bool(cfg.get("qkv_bias", bias)), o_proj_bias=bias)
        if cfg.get("mlp_bias"):
            values["weights_unsized"] = f"{at}.mlp_bias={cfg['mlp_bias']!r} cannot be sized (MLP biases)"
    elif family == "qwen2":  # qwen2.py: q/k/v always biased
        values["qkv_bias"] = True
    elif family in ("qwen3", "qwen3_moe"):
        values["qkv_bias"] = bool(cfg.get("attention_bias", False))
    if family == "mixtral":  # mixtral.py: every layer MoE, the experts as wide as `intermediate_size`
        values.update(num_experts=_config_int(cfg, "num_local_experts", at),
                      moe_intermediate_size=values["intermediate_size"], num_moe_layers=layers)
    elif family == "qwen3_moe":  # qwen3_moe.py Qwen3MoeDecoderLayer: MoE unless in mlp_only_layers or off the step
        experts = _count(cfg, "num_experts", at) or _count(cfg, "num_local_experts", at)
        step = _count(cfg, "decoder_sparse_step", at, 1) or 1
        only = cfg.get("mlp_only_layers") or []
        moe = sum(1 for i in range(layers) if i not in only and experts > 0 and (i + 1) % step == 0)
        shared = _count(cfg, "shared_expert_intermediate_size", at)
        values.update(num_experts=experts, moe_intermediate_size=_count(cfg, "moe_intermediate_size", at),
                      num_moe_layers=moe, shared_expert_intermediate_size=shared, shared_expert_gate=shared > 0,
                      router_quantized=True)  # GateLinear takes the quant config (see _read_quantization)
    elif family == "deepseek_v2":
        _read_deepseek(cfg, values, at)


def _read_deepseek(cfg: Mapping[str, Any], values: dict[str, Any], at: str) -> None:
    """deepseek_v2.py: MLA attention, dense layers before `first_k_dense_replace` and off `moe_layer_freq`, the
    shared experts as one MLP n_shared_experts x moe_intermediate_size wide, the router's float32 correction bias
    with `topk_method: noaux_tc`, and an LM head never tied to the embedding."""
    dims = {k: _count(cfg, k, at) for k in ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                                            "v_head_dim")}
    if cfg.get("model_type") == "deepseek" or not (dims["qk_nope_head_dim"] or dims["qk_rope_head_dim"]):
        values["weights_unsized"] = values["kv_unsized"] = (
            f"{at}.qk_nope_head_dim/qk_rope_head_dim=0 cannot be sized (DeepSeek's multi-head attention, not MLA)")
        return
    if cfg.get("index_topk") is not None:  # DeepSeek-V3.2's sparse attention: an indexer and its own cache
        values["weights_unsized"] = values["kv_unsized"] = (
            f"{at}.index_topk={cfg['index_topk']!r} cannot be sized (DeepSeek sparse attention's indexer)")
        return
    if not dims["kv_lora_rank"]:
        raise WorkloadError(f"{at}: kv_lora_rank={cfg.get('kv_lora_rank')!r} must be a whole number >= 1 (MLA)")
    experts = _count(cfg, "n_routed_experts", at)
    first_dense = _count(cfg, "first_k_dense_replace", at)
    freq = _count(cfg, "moe_layer_freq", at, 1) or 1
    moe = sum(1 for i in range(values["num_layers"]) if experts and i >= first_dense and i % freq == 0)
    shared = _count(cfg, "n_shared_experts", at)
    moe_width = _count(cfg, "moe_intermediate_size", at)
    values.update(dims, num_experts=experts, moe_intermediate_size=moe_width, num_moe_layers=moe,
                  shared_expert_intermediate_size=moe_width * shared,
                  router_bias=cfg.get("topk_method") == "noaux_tc", tie_word_embeddings=False)


def _read_quantization(cfg: Mapping[str, Any], values: dict[str, Any], at: str) -> None:
    """An FP8 checkpoint's `quantization_config` (vLLM's Fp8Config.from_config); any other method is left unsized.
    Layers named not converted may only be the router gates (all of them) and the embedding or LM head (which FP8
    never quantizes); any other list is left unsized."""
    quant = cfg.get("quantization_config")
    if not quant:
        values["router_quantized"] = False
        return
    field = f"{at}.quantization_config"
    method = quant.get("quant_method") if isinstance(quant, Mapping) else None
    if method != "fp8":
        values["weights_unsized"] = (f"{field}.quant_method={method!r} cannot be sized (cgtune sizes fp8 checkpoints; "
                                     f"profile it through vLLM, --backend vllm, for the engine's own figure)")
        return
    block = quant.get("weight_block_size")
    if block is not None and not (isinstance(block, list) and len(block) == 2
                                  and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
        raise WorkloadError(f"{field}.weight_block_size={block!r} must be two whole numbers >= 1")
    if quant.get("store_dtype") is not None:
        values["weights_unsized"] = f"{field}.store_dtype={quant['store_dtype']!r} cannot be sized"
        return
    values.update(quantization="fp8", quant_block_n=block[0] if block else 0, quant_block_k=block[1] if block else 0,
                  quant_static_activations=quant.get("activation_scheme") == "static")
    key = "ignored_layers" if quant.get("ignored_layers") else "modules_to_not_convert"
    skipped = [m for m in quant.get(key) or [] if not (m == "lm_head" or str(m).endswith("embed_tokens"))]
    gates = {f"model.layers.{i}.mlp.gate" for i in range(values["num_layers"])}
    if any(m not in gates for m in skipped):
        shown = next(m for m in skipped if m not in gates)
        values["weights_unsized"] = (f"{field}.{key} names {shown!r}, which cgtune cannot size (it sizes a list of "
                                     f"router gates, the embedding and the LM head)")
    elif skipped and values["router_quantized"]:
        moe_gates = values["num_moe_layers"]
        if len(set(skipped)) < moe_gates:
            values["weights_unsized"] = (f"{field}.{key} leaves {len(set(skipped))} of {moe_gates} router gates "
                                         f"unquantized, which cgtune cannot size")
        values["router_quantized"] = False


def _architectures(config: Mapping[str, Any]) -> list[str]:
    archs = config.get("architectures")
    return [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []


def stand_in_gaps(config: Mapping[str, Any]) -> list[str]:
    """What in `config` the stand-in decoder cannot build, each as `what (key=value)`; empty for a dense model of an
    architecture it builds."""
    gaps = []
    archs = _architectures(config)
    if archs and not set(archs) & set(STAND_IN_ARCHITECTURES):
        gaps.append(f"architecture {'/'.join(archs)}")
    cfg = {**config, **(config.get("text_config") or {})}
    seen = set()
    for key, what in _GAP_KEYS:
        value = cfg.get(key)
        if value in (None, 0, False, [], {}) or what in seen:
            continue
        if key == "sliding_window" and cfg.get("use_sliding_window") is False:
            continue  # Qwen2/Qwen3 configs carry a window they do not use
        if key == "layer_types" and isinstance(value, list) and set(value) <= {"full_attention"}:
            continue
        seen.add(what)
        shown = "{...}" if isinstance(value, dict) else json.dumps(value)[:40]
        gaps.append(f"{what} ({key}={shown})")
    kv_dtype = cfg.get("kv_cache_dtype")
    if isinstance(kv_dtype, str) and kv_dtype.startswith("fp8"):
        gaps.append(f"FP8 KV cache (kv_cache_dtype={kv_dtype})")
    return gaps


def config_for_shape(shape: ModelShape, dtype: str, max_model_len: int) -> dict[str, Any]:
    """The config.json of the Llama (or, with per-head q/k norm, Qwen3) model `shape` describes: what vLLM needs to
    build it with dummy weights and no download."""
    arch, model_type = ("Qwen3ForCausalLM", "qwen3") if shape.qk_norm else ("LlamaForCausalLM", "llama")
    return {
        "architectures": [arch], "model_type": model_type, "hidden_size": shape.hidden_size,
        "num_hidden_layers": shape.num_layers, "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_kv_heads, "head_dim": shape.head_dim,
        "intermediate_size": shape.intermediate_size, "vocab_size": shape.vocab_size,
        "max_position_embeddings": max_model_len, "rope_theta": shape.rope_theta, "rms_norm_eps": shape.rms_norm_eps,
        "tie_word_embeddings": shape.tie_word_embeddings, "hidden_act": "silu", "torch_dtype": dtype,
        "bos_token_id": 1, "eos_token_id": 2,
    }
