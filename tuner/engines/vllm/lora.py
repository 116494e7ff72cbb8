"""vLLM's multi-LoRA rules for CUDA graphs: the LoRA capture cases (each graph is captured once per case), which case
a step's active adapters dispatch to, the LoRA weight buffers vLLM sets aside, and the serving fields that switch them
on. Read from vLLM 0.33.0 and 0.34.0: `get_captured_lora_counts` (vllm/lora/utils.py), V2's `get_lora_capture_cases`
(v1/worker/gpu/lora_utils.py) and `CudaGraphManager._build_lora_dispatch_map` (v1/worker/gpu/cudagraph_utils.py, the
same in both releases), V1's `CudagraphDispatcher._get_lora_cases` and `dispatch` (0.33's v1/cudagraph_dispatcher.py),
and the LoRA layers' `create_lora_weights` (vllm/lora/layers/)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tuner.fields import FieldReader, WorkloadError

__all__ = ["LORA_FIELDS", "LORA_RANKS", "NO_GRAPH", "LoraSettings", "capture_cases", "captured_lora_counts",
           "case_text", "dispatch_cases", "lora_flags", "lora_weight_bytes", "read_lora"]

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ranks vLLM accepts for `--max-lora-rank` (`MaxLoRARanks`, vllm/config/lora.py)."""
LORA_FIELDS = ("enable_lora", "max_loras", "max_lora_rank", "specialize_active_lora", "cudagraph_specialize_lora")
"""The `serving:` fields of a LoRA deployment, under vLLM's names."""
NO_GRAPH = -1
"""`dispatch_cases`' answer for a step whose LoRA case no graph was captured for (it runs eager)."""


@dataclass(frozen=True)
class LoraSettings:
    """A deployment serving LoRA adapters (`--enable-lora`), as vLLM's LoRAConfig and CompilationConfig take it."""

    max_loras: int = 1
    """`--max-loras`: the most adapters active in one step (each has a slot in every LoRA weight buffer)."""
    max_lora_rank: int = 16
    """`--max-lora-rank`: the rank every buffer slot is sized for."""
    specialize_active_lora: bool = False
    """`--specialize-active-lora`: a graph per power of two of active adapters up to max_loras (and max_loras + 1)."""
    cudagraph_specialize_lora: bool = True
    """`compilation_config.cudagraph_specialize_lora`: graphs without LoRA beside the LoRA graphs."""


def captured_lora_counts(max_loras: int, specialize: bool) -> list[int]:
    """`get_captured_lora_counts`: the active-adapter counts LoRA graphs are captured for: max_loras + 1 alone, or with
    `specialize` every power of two up to max_loras + 1 and max_loras + 1 itself."""
    if not specialize:
        return [max_loras + 1]
    return [n for n in range(1, max_loras + 2) if (n & (n - 1)) == 0 or n == max_loras + 1]


def capture_cases(lora: LoraSettings | None, runner: str) -> tuple[int, ...]:
    """The LoRA cases every graph is captured once for, in the order one width's graphs enter the pool (0: no adapter
    active). V2 (`get_lora_capture_cases`; the manager sorts its descriptors by tokens, stably, so a width's cases keep
    this order): 0 and the captured counts, or 0 and max_loras + 1 without `cudagraph_specialize_lora`. V1
    (`_get_lora_cases`; `get_capture_descs` sorts by (tokens, case) descending): the same cases largest first, but
    without `cudagraph_specialize_lora` only max_loras + 1, no graph without LoRA."""
    if lora is None:
        return (0,)
    if lora.cudagraph_specialize_lora:
        cases = [0, *captured_lora_counts(lora.max_loras, lora.specialize_active_lora)]
    else:
        cases = [0, lora.max_loras + 1] if runner == "v2" else [lora.max_loras + 1]
    return tuple(sorted(cases, reverse=runner == "v1"))


def dispatch_cases(lora: LoraSettings | None, runner: str, active: np.ndarray) -> np.ndarray:
    """The LoRA case each step dispatches to, for its count of distinct active adapters (`active`); NO_GRAPH where no
    graph was captured for that case, so the step runs eager. V2 (`_resolve_effective_loras`): 0 stays 0, n > 0 takes
    the smallest captured count >= n (above the largest, the largest). V1 (`CudagraphDispatcher.dispatch`): n > 0 takes
    the smallest captured count >= n with `specialize_active_lora`, else max_loras + 1; 0 has a graph only where
    `cudagraph_specialize_lora` captured the no-LoRA case."""
    active = np.asarray(active, dtype=np.int64)
    if lora is None:
        return np.zeros(len(active), dtype=np.int64)
    cases = capture_cases(lora, runner)
    with_lora = sorted(c for c in cases if c > 0)
    if runner == "v2" or lora.specialize_active_lora:
        idx = np.minimum(np.searchsorted(np.array(with_lora), active, side="left"), len(with_lora) - 1)
        out = np.where(active > 0, np.array(with_lora)[idx], 0)
    else:
        out = np.where(active > 0, lora.max_loras + 1, 0)
    return np.where(np.isin(out, cases), out, NO_GRAPH)


# ------------------------------------------------------------------------------------------------ weight buffers
def lora_weight_bytes(lora: LoraSettings, *, hidden_size: int, num_layers: int, num_attention_heads: int,
                      num_kv_heads: int, head_dim: int, intermediate_size: int, vocab_size: int, dtype_bytes: int,
                      tensor_parallel_size: int = 1) -> int:
    """Bytes of the LoRA weight buffers vLLM allocates on one rank of a dense decoder (Llama, Mistral, Qwen2/3: the
    linear layers `qkv_proj`, `o_proj`, `gate_up_proj`, `down_proj` and the `embed_tokens` / `lm_head` embedding
    modules), each sized for max_loras slots of max_lora_rank (`create_lora_weights`, fully_sharded_loras off, the
    LoRA dtype the model's):
    - a column-parallel layer of s slices (QKV: q, k, v; gate_up: gate, up): lora_a s x (L, R, in), lora_b (L, out of
      each slice on the rank, R);
    - a row-parallel layer (o_proj, down_proj): lora_a (L, R, in on the rank), lora_b (L, out, R);
    - `embed_tokens`: lora_a (L, vocab, R), lora_b (L, hidden, R); `lm_head` (its logits processor): lora_a
      (L, R, hidden), lora_b (L, vocab, R), the whole vocabulary on every rank.
    KV heads on a rank are num_kv_heads / tp, at least 1 (replicated when tp exceeds them)."""
    L, R, tp = lora.max_loras, lora.max_lora_rank, tensor_parallel_size
    h, q_out = hidden_size, num_attention_heads * head_dim // tp
    kv_out = max(1, num_kv_heads // tp) * head_dim
    inter = intermediate_size // tp
    per_layer = (3 * R * h + R * (q_out + 2 * kv_out)      # qkv_proj: three slices
                 + R * q_out + h * R                       # o_proj
                 + 2 * R * h + R * 2 * inter               # gate_up_proj: two slices
                 + R * inter + h * R)                      # down_proj
    embeddings = (vocab_size * R + h * R) + (R * h + vocab_size * R)  # embed_tokens, lm_head
    return L * (num_layers * per_layer + embeddings) * dtype_bytes


# ------------------------------------------------------------------------------------------------ serving fields
def read_lora(r: FieldReader, *, speculative_method: str | None, model_based_drafter: bool) -> LoraSettings | None:
    """The LoRA fields of a `serving:` section (None without `enable_lora: true`); a LoRA field without it, or a LoRA
    deployment cgtune does not model, is refused naming the field."""
    enabled = r.bool("enable_lora", False)
    given = [key for key in LORA_FIELDS[1:] if r.has(key)]
    if not enabled:
        if given:
            raise WorkloadError(f"{r.at(given[0])}: a LoRA setting, but serving.enable_lora is not true (vLLM ignores "
                                f"it without --enable-lora)")
        return None
    if model_based_drafter:
        raise WorkloadError(f"{r.at('enable_lora')}: true with the {speculative_method} drafter: cgtune does not model "
                            f"the drafter's graphs under LoRA (vLLM V1 runs it eager in LoRA capture cases)")
    rank = r.int("max_lora_rank", 16)
    if rank not in LORA_RANKS:
        raise WorkloadError(f"{r.at('max_lora_rank')}: {rank} must be one of {', '.join(map(str, LORA_RANKS))} "
                            f"(vLLM's MaxLoRARanks)")
    return LoraSettings(max_loras=r.int("max_loras", 1, minimum=1), max_lora_rank=rank,
                        specialize_active_lora=r.bool("specialize_active_lora", False),
                        cudagraph_specialize_lora=r.bool("cudagraph_specialize_lora", True))


def lora_flags(lora: LoraSettings | None) -> dict[str, Any]:
    """The `vllm serve` settings (YAML keys, flag names without dashes) that give vLLM the LoRA deployment tuned."""
    if lora is None:
        return {}
    out: dict[str, Any] = {"enable-lora": True, "max-loras": lora.max_loras, "max-lora-rank": lora.max_lora_rank}
    if lora.specialize_active_lora:
        out["specialize-active-lora"] = True
    return out


def case_text(cases: Sequence[int], max_loras: int) -> str:
    """The LoRA cases in words, each with the active-adapter counts it serves: `0 (no adapter), 4 (1-3 adapters)`."""
    out, prev = [], 0
    for c in sorted(cases):
        if c == 0:
            out.append("0 (no adapter)")
            continue
        lo, hi = prev + 1, min(c, max_loras)
        out.append(f"{c} (vLLM's dummy steps only)" if lo > hi else
                   f"{c} ({lo} adapter{'s' if lo > 1 else ''})" if lo == hi else f"{c} ({lo}-{hi} adapters)")
        prev = c
    return ", ".join(out)
