"""Write a batch-size list as the `extra_llm_api_options` YAML TensorRT-LLM's PyTorch backend consumes
(`trtllm-serve MODEL --extra_llm_api_options FILE`), checked first against its validator and engine filter."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import yaml

from tuner.engines.trtllm.capture import captured_batch_sizes
from tuner.engines.trtllm.defaults import (
    DEFAULT_FREE_GPU_MEMORY_FRACTION,
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_MAX_NUM_TOKENS,
    merge_schedule_keys,
    resolve_cuda_graph_config,
)

if TYPE_CHECKING:
    from tuner.engines.vllm.emit import Provenance

__all__ = [
    "EXTRA_OPTIONS_FILE",
    "EmitError",
    "extra_llm_api_options",
    "render_files",
    "validate_batch_sizes",
]

EXTRA_OPTIONS_FILE = "trtllm-extra-llm-api-options.yaml"


class EmitError(ValueError):
    """A batch-size list TensorRT-LLM would reject or change; the one-line message names the key and the value."""


def _speculative_draft_tokens(speculative_config: Mapping[str, object] | None) -> tuple[int, int | None]:
    """(max_draft_len, max_total_draft_tokens or None) from a speculative_config mapping; (0, None) without one."""
    if speculative_config is None:
        return 0, None
    if "decoding_type" not in speculative_config:
        raise EmitError(f"speculative_config: {dict(speculative_config)} has no decoding_type")
    draft = speculative_config.get("max_draft_len")
    if not isinstance(draft, int) or isinstance(draft, bool) or draft < 1:
        raise EmitError(f"speculative_config.max_draft_len: {draft!r} must be an integer >= 1")
    total = speculative_config.get("max_total_draft_tokens")
    if total is not None and (not isinstance(total, int) or isinstance(total, bool) or total < draft):
        raise EmitError(f"speculative_config.max_total_draft_tokens: {total!r} must be an integer >= max_draft_len")
    return draft, total


def validate_batch_sizes(batch_sizes: Sequence[int], *, max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
                         max_num_tokens: int = DEFAULT_MAX_NUM_TOKENS, enable_padding: bool = True,
                         cuda_graph_max_batch_size: int = 0,
                         speculative_config: Mapping[str, object] | None = None) -> list[int]:
    """The list as TensorRT-LLM would capture it, or EmitError when it would reject, drop, add or merge a size.

    Rejected: an empty list (TensorRT-LLM would silently generate its default instead), sizes < 1, duplicates or an
    unsorted list, and a `cuda_graph_config.max_batch_size` other than max(list). Changed: sizes above
    min(max_batch_size, max_num_tokens // (1 + draft tokens)) are dropped by the engine (the cap is appended with
    padding), and `draft_len_schedule` keys missing from the list are merged in.
    """
    values = [int(s) for s in batch_sizes]
    if not values:
        raise EmitError("cuda_graph_config.batch_sizes: [] is empty (TensorRT-LLM would use its default list; emit "
                        "cuda_graph_config: null to disable graphs)")
    if min(values) < 1:
        raise EmitError(f"cuda_graph_config.batch_sizes: {values} holds a size < 1")
    if values != sorted(set(values)):
        raise EmitError(f"cuda_graph_config.batch_sizes: {values} must be sorted and unique")
    try:
        resolve_cuda_graph_config(values, cuda_graph_max_batch_size, enable_padding=enable_padding)
    except ValueError as exc:
        raise EmitError(str(exc)) from None
    draft, total = _speculative_draft_tokens(speculative_config)
    tokens_per_request = 1 + (draft if total is None else total)
    cap = min(max_batch_size, max_num_tokens // tokens_per_request)
    kept = captured_batch_sizes(values, max_batch_size=max_batch_size, max_num_tokens=max_num_tokens,
                                max_total_draft_tokens=tokens_per_request - 1, enable_padding=enable_padding)
    if kept != values:
        raise EmitError(f"cuda_graph_config.batch_sizes: {values[-1]} > {cap} = min(max_batch_size={max_batch_size}, "
                        f"max_num_tokens={max_num_tokens} // {tokens_per_request}); TensorRT-LLM would capture "
                        f"{kept}")
    schedule = speculative_config.get("draft_len_schedule") if speculative_config is not None else None
    if isinstance(schedule, Mapping):
        merged = merge_schedule_keys(values, {int(k): int(v) for k, v in schedule.items()})
        if merged != values:
            raise EmitError(f"cuda_graph_config.batch_sizes: {values} lacks draft_len_schedule keys; TensorRT-LLM "
                            f"would capture {merged}")
    return values


def extra_llm_api_options(batch_sizes: Sequence[int], *, max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
                          max_num_tokens: int = DEFAULT_MAX_NUM_TOKENS, max_seq_len: int | None = None,
                          tensor_parallel_size: int | None = None, enable_padding: bool = True,
                          free_gpu_memory_fraction: float = DEFAULT_FREE_GPU_MEMORY_FRACTION,
                          speculative_config: Mapping[str, object] | None = None) -> dict[str, object]:
    """The YAML mapping. `cuda_graph_config.max_batch_size` is left out on purpose: next to `batch_sizes` it must equal
    max(batch_sizes) or TensorRT-LLM raises, and the validator derives it anyway."""
    if not 0 < free_gpu_memory_fraction <= 1:
        raise EmitError(f"kv_cache_config.free_gpu_memory_fraction: {free_gpu_memory_fraction} must be in (0, 1]")
    options: dict[str, object] = {
        "max_batch_size": max_batch_size,
        "max_num_tokens": max_num_tokens,
        **({"max_seq_len": max_seq_len} if max_seq_len is not None else {}),
        **({"tensor_parallel_size": tensor_parallel_size} if tensor_parallel_size is not None else {}),
        # enable_padding defaults to false in TensorRT-LLM: a sparse list without it sends every unlisted size eager.
        "cuda_graph_config": {"enable_padding": enable_padding, "batch_sizes": sorted({int(s) for s in batch_sizes})},
        "kv_cache_config": {"free_gpu_memory_fraction": free_gpu_memory_fraction},
    }
    if speculative_config is not None:
        options["speculative_config"] = dict(speculative_config)
    return options


def render_files(batch_sizes: Sequence[int], *, max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
                 max_num_tokens: int = DEFAULT_MAX_NUM_TOKENS, max_seq_len: int | None = None,
                 tensor_parallel_size: int | None = None, enable_padding: bool = True,
                 free_gpu_memory_fraction: float = DEFAULT_FREE_GPU_MEMORY_FRACTION,
                 speculative_config: Mapping[str, object] | None = None, notes: Sequence[str] = (),
                 provenance: Provenance | None = None) -> dict[str, str]:
    """File name -> text for the YAML; validates the list first (EmitError). `notes`: comment lines on what the user
    must still put in."""
    values = validate_batch_sizes(batch_sizes, max_batch_size=max_batch_size, max_num_tokens=max_num_tokens,
                                  enable_padding=enable_padding, speculative_config=speculative_config)
    options = extra_llm_api_options(values, max_batch_size=max_batch_size, max_num_tokens=max_num_tokens,
                                    max_seq_len=max_seq_len, tensor_parallel_size=tensor_parallel_size,
                                    enable_padding=enable_padding, free_gpu_memory_fraction=free_gpu_memory_fraction,
                                    speculative_config=speculative_config)
    comments = "".join(f"# {line}\n" for line in (provenance.lines() if provenance is not None else []))
    comments += "".join(f"# {note}\n" for note in notes)
    text = (
        comments
        + f"# usage: trtllm-serve MODEL --extra_llm_api_options {EXTRA_OPTIONS_FILE}\n"
        + "# keep every graph key here: YAML-vs-flag precedence differs between trtllm-serve versions\n"
        + yaml.safe_dump(options, sort_keys=False, default_flow_style=None, width=100)
    )
    return {EXTRA_OPTIONS_FILE: text}
