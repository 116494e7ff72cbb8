"""A stand-in for how TensorRT-LLM loads an `--extra_llm_api_options` YAML into `TorchLlmArgs` (TensorRT-LLM cannot be
installed here: its wheel needs CUDA). It mirrors tensorrt_llm/llmapi/llm_args.py at NVIDIA/TensorRT-LLM commit
0004396720054fd8e205cbf616f21f0b57c6b412, for the keys cgtune writes, independently of cgtune's own rulebook:

- every config is a `StrictBaseModel` (pydantic `extra="forbid"`): an unknown key is refused;
- `speculative_config` is a union tagged by `decoding_type`: `Literal["Eagle"]` (EagleDecodingConfig), `"Eagle3"`
  (Eagle3DecodingConfig), `"NGram"`, `"Draft_Target"` (DraftTargetDecodingConfig), `"MTP"`; any other tag (the
  older "DraftTarget") is refused;
- `DecodingBaseConfig.speculative_model` (alias `speculative_model_dir`); `EagleDecodingConfig.validate_eagle_config`
  ("max_draft_len must be > 0 for Eagle") and `validate_speculative_model` ("Draft model must be provided for
  EAGLE"); `DraftTargetDecodingConfig.validate_draft_target_config` ("max_draft_len must be > 0 for DraftTarget",
  "speculative_model must be specified for DraftTarget"); `NGramDecodingConfig.validate_ngram_config`;
- `DecodingBaseConfig.tokens_per_gen_step` = 1 + max_total_draft_tokens, which a linear tree sets to max_draft_len;
- `TorchLlmArgs.infer_cuda_graph_config_mode` (a mapping without `mode` is a decode config) and
  `BaseCudaGraphConfig.validate_base_cuda_graph_config` (batch_sizes sorted; max_batch_size derived, or equal to
  max(batch_sizes) when both are given);
- `KvCacheConfig.free_gpu_memory_fraction` in [0, 1]."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

__all__ = ["LlmArgs", "LlmArgsError", "load_extra_llm_api_options"]

_TOP_LEVEL = {"max_batch_size", "max_num_tokens", "max_seq_len", "tensor_parallel_size", "cuda_graph_config",
              "kv_cache_config", "speculative_config"}
"""The TorchLlmArgs fields cgtune writes (the model has many more; a key outside them is refused here)."""
_CUDA_GRAPH = {"mode", "batch_sizes", "max_batch_size", "enable_padding"}
_DECODING_BASE = {"decoding_type", "max_draft_len", "max_total_draft_tokens", "speculative_model",
                  "speculative_model_dir", "max_concurrency", "draft_len_schedule", "load_format"}
_TAGS = ("Eagle", "Eagle3", "NGram", "Draft_Target", "MTP")


class LlmArgsError(ValueError):
    """What TensorRT-LLM's pydantic validation would raise."""


@dataclass(frozen=True)
class LlmArgs:
    """The validated values cgtune tuned for."""

    max_batch_size: int
    max_num_tokens: int
    max_seq_len: int | None
    tensor_parallel_size: int
    cuda_graph_batch_sizes: list[int]
    cuda_graph_max_batch_size: int
    enable_padding: bool
    free_gpu_memory_fraction: float
    decoding_type: str | None
    max_draft_len: int
    speculative_model: str | None

    @property
    def tokens_per_gen_step(self) -> int:
        """1 + max_total_draft_tokens (= max_draft_len on a linear tree); 1 without speculation."""
        return 1 + self.max_draft_len


def _strict(mapping: Any, allowed: set[str], where: str) -> dict[str, Any]:
    if not isinstance(mapping, dict):
        raise LlmArgsError(f"{where}: {mapping!r} is not a mapping")
    extra = sorted(set(mapping) - allowed)
    if extra:
        raise LlmArgsError(f"{where}.{extra[0]}: Extra inputs are not permitted")
    return mapping


def _speculative(config: Any) -> tuple[str, int, str | None]:
    config = _strict(config, _DECODING_BASE, "speculative_config")
    tag = config.get("decoding_type")
    if tag not in _TAGS:
        raise LlmArgsError(f"speculative_config: Input tag {tag!r} found using 'decoding_type' does not match any of "
                           f"the expected tags")
    draft = config.get("max_draft_len")
    if draft is not None and (not isinstance(draft, int) or draft < 0):
        raise LlmArgsError(f"speculative_config.max_draft_len: {draft!r} must be a non-negative integer")
    model = config.get("speculative_model", config.get("speculative_model_dir"))
    if tag in ("Eagle", "Eagle3"):
        if not draft:
            raise LlmArgsError("max_draft_len must be > 0 for Eagle")
        if model is None:
            raise LlmArgsError("Draft model must be provided for EAGLE")
    elif tag == "Draft_Target":
        if draft is None or draft <= 0:
            raise LlmArgsError("max_draft_len must be > 0 for DraftTarget")
        if model is None:
            raise LlmArgsError("speculative_model must be specified for DraftTarget")
    elif tag == "NGram" and (draft is None or draft <= 0):
        raise LlmArgsError("max_draft_len must be > 0 for NGram")
    return tag, int(draft or 0), model


def load_extra_llm_api_options(text: str) -> LlmArgs:
    """The YAML as TorchLlmArgs validates it (LlmArgsError where it would refuse it)."""
    options = _strict(yaml.safe_load(text), _TOP_LEVEL, "extra_llm_api_options")
    graph = _strict(options.get("cuda_graph_config") or {}, _CUDA_GRAPH, "cuda_graph_config")
    if graph.get("mode", "decode") != "decode":
        raise LlmArgsError("cuda_graph_config.mode: cgtune writes decode configs only")
    sizes = sorted(graph.get("batch_sizes") or [])
    graph_max = graph.get("max_batch_size", 0)
    if not sizes:
        raise LlmArgsError("cuda_graph_config.batch_sizes: empty (TensorRT-LLM would generate its default)")
    if graph_max not in (0, sizes[-1]):
        raise LlmArgsError("CudaGraphConfig.max_batch_size is incompatible with CudaGraphConfig.batch_sizes")
    kv = _strict(options.get("kv_cache_config") or {}, {"free_gpu_memory_fraction"}, "kv_cache_config")
    fraction = kv.get("free_gpu_memory_fraction", 0.9)
    if not 0 <= fraction <= 1:
        raise LlmArgsError(f"kv_cache_config.free_gpu_memory_fraction: {fraction} must be in [0, 1]")
    tag, draft, model = (None, 0, None)
    if options.get("speculative_config") is not None:
        tag, draft, model = _speculative(options["speculative_config"])
    return LlmArgs(max_batch_size=options.get("max_batch_size", 2048), max_num_tokens=options.get("max_num_tokens", 8192),
                   max_seq_len=options.get("max_seq_len"), tensor_parallel_size=options.get("tensor_parallel_size", 1),
                   cuda_graph_batch_sizes=sizes, cuda_graph_max_batch_size=sizes[-1],
                   enable_padding=bool(graph.get("enable_padding", False)), free_gpu_memory_fraction=fraction,
                   decoding_type=tag, max_draft_len=draft, speculative_model=model)
