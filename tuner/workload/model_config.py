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
    """ModelShape fields read from a config.json (the attention and MLP widths its dense layers would have); a MoE
    model's expert widths are not in them, which is why `stand_in_gaps` names it."""
    cfg = dict(config.get("text_config") or {}) or dict(config)  # multimodal configs nest the decoder's
    heads = _config_int(cfg, "num_attention_heads", at)
    hidden = _config_int(cfg, "hidden_size", at)
    values: dict[str, Any] = {
        "hidden_size": hidden,
        "num_layers": _config_int(cfg, "num_hidden_layers", at),
        "num_attention_heads": heads,
        "num_kv_heads": _config_int(cfg, "num_key_value_heads", at) if "num_key_value_heads" in cfg else heads,
        "head_dim": _config_int(cfg, "head_dim", at) if cfg.get("head_dim") is not None else hidden // heads,
        "intermediate_size": _config_int(cfg, "intermediate_size", at),
        "vocab_size": _config_int(cfg, "vocab_size", at),
        "tie_word_embeddings": bool(config.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))),
        "qk_norm": "Qwen3" in " ".join(_architectures(config)),
    }
    for key in ("rope_theta", "rms_norm_eps"):
        value = cfg.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            values[key] = float(value)
    return values


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
