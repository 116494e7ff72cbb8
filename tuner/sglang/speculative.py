"""SGLang 0.5.23's speculative-decoding resolution steps that change the decode graphs after the list is built."""

from __future__ import annotations

__all__ = [
    "ALGORITHMS",
    "EAGLE_FAMILY",
    "SPECULATIVE_MAX_RUNNING_REQUESTS",
    "auto_speculative_params",
    "effective_max_running_requests",
    "normalize_algorithm",
    "resolve_eagle_params",
]

ALGORITHMS = ("DFLASH", "UNO", "DSPARK", "EAGLE", "EAGLE3", "FROZEN_KV_MTP", "STANDALONE", "NGRAM")
"""Builtin `SpeculativeAlgorithm` names (speculative/spec_info.py); NEXTN is an alias of EAGLE."""

EAGLE_FAMILY = frozenset({"EAGLE", "EAGLE3", "STANDALONE"})
"""Algorithms handled by `_handle_eagle_family` (spec_info.py: `is_eagle() or is_standalone()`, minus
FROZEN_KV_MTP, which has its own handler)."""

SPECULATIVE_MAX_RUNNING_REQUESTS = 48
"""What the speculative handlers set `max_running_requests` to when the user left it unset."""

# Handlers that declare max_running_requests=48 when unset (speculative_hook.py: _handle_dflash, _handle_dspark,
# _handle_frozen_kv_mtp, _handle_eagle_family, _handle_ngram). _handle_uno does not.
_SETS_MAX_RUNNING_REQUESTS = frozenset({"DFLASH", "DSPARK", "FROZEN_KV_MTP", "NGRAM"}) | EAGLE_FAMILY

# `_auto_choose_speculative_params` (speculative_hook.py:1430-1461): (num_steps, eagle_topk, num_draft_tokens).
_AUTO_PARAMS_LLAMA_GROK = (5, 4, 8)
_AUTO_PARAMS_DEFAULT = (3, 1, 4)
_LLAMA_GROK_ARCHS = frozenset({"LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM"})


def normalize_algorithm(algorithm: str | None) -> str | None:
    """Upper-cased algorithm name with SGLang's reserved alias applied (NEXTN -> EAGLE); None stays None."""
    if algorithm is None:
        return None
    name = algorithm.upper()
    if name == "NEXTN":
        return "EAGLE"
    if name not in ALGORITHMS:
        raise ValueError(f"speculative_algorithm={algorithm!r} must be one of {', '.join(ALGORITHMS)} or NEXTN")
    return name


def effective_max_running_requests(algorithm: str | None, max_running_requests: int | None) -> int | None:
    """max_running_requests after `handle_speculative_decoding`: 48 when unset for EAGLE/EAGLE3/NEXTN/STANDALONE,
    FROZEN_KV_MTP, DFLASH, DSPARK and NGRAM.

    This runs AFTER `handle_gpu_memory_settings` has built the decode list and the memory fraction
    (arg_groups/pipeline.py), so a list built up to 256 is cut to <= 48 at capture while the graph reserve in
    mem_fraction_static still counts 2 x 256 MiB.
    """
    name = normalize_algorithm(algorithm)
    if max_running_requests is None and name in _SETS_MAX_RUNNING_REQUESTS:
        return SPECULATIVE_MAX_RUNNING_REQUESTS
    return max_running_requests


def auto_speculative_params(algorithm: str, model_arch: str) -> tuple[int, int, int]:
    """(num_steps, eagle_topk, num_draft_tokens) SGLang picks when `--speculative-num-steps` is unset."""
    if normalize_algorithm(algorithm) == "STANDALONE":
        return _AUTO_PARAMS_DEFAULT
    return _AUTO_PARAMS_LLAMA_GROK if model_arch in _LLAMA_GROK_ARCHS else _AUTO_PARAMS_DEFAULT


def resolve_eagle_params(algorithm: str, *, model_arch: str, num_steps: int | None = None,
                         eagle_topk: int | None = None, num_draft_tokens: int | None = None) -> tuple[int, int, int]:
    """(num_steps, eagle_topk, num_draft_tokens) after `_handle_eagle_family` (speculative_hook.py:1156-1266).

    Unset num_steps takes the automatic triple (SGLang asserts topk and draft tokens are unset too); with topk == 1,
    num_draft_tokens is forced to num_steps + 1, which is the per-request token width of every verify graph.
    Adaptive speculation (`--speculative-adaptive`) is not modelled.
    """
    name = normalize_algorithm(algorithm)
    if name not in EAGLE_FAMILY:
        raise ValueError(f"speculative_algorithm={algorithm!r} is not in the EAGLE family "
                         f"({', '.join(sorted(EAGLE_FAMILY))}, NEXTN)")
    if num_steps is None:
        if eagle_topk is not None or num_draft_tokens is not None:
            raise ValueError(f"speculative_num_steps=None needs eagle_topk and num_draft_tokens unset too "
                             f"(got eagle_topk={eagle_topk}, num_draft_tokens={num_draft_tokens}); SGLang asserts it")
        num_steps, eagle_topk, num_draft_tokens = auto_speculative_params(name, model_arch)
    if eagle_topk is None or num_draft_tokens is None:
        # SGLang fills a partial triple from model-specific defaults elsewhere; cgtune does not guess them.
        raise ValueError(f"speculative_num_steps={num_steps}: give eagle_topk and num_draft_tokens too "
                         f"(got eagle_topk={eagle_topk}, num_draft_tokens={num_draft_tokens}; partial defaults "
                         f"are not modelled)")
    if eagle_topk == 1 and num_draft_tokens != num_steps + 1:
        num_draft_tokens = num_steps + 1
    return num_steps, eagle_topk, num_draft_tokens
