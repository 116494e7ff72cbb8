"""SGLang 0.5.23's speculative-decoding resolution: the (steps, topk, draft tokens) it really runs, and the steps that
change the decode graphs after the list is built."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ALGORITHMS",
    "DFLASH_DEFAULT_BLOCK_SIZE",
    "EAGLE_FAMILY",
    "NGRAM_DEFAULT_DRAFT_TOKENS",
    "NGRAM_DEFAULT_MAX_BFS_BREADTH",
    "SPECULATIVE_MAX_RUNNING_REQUESTS",
    "ResolvedSpeculation",
    "auto_speculative_params",
    "effective_max_running_requests",
    "normalize_algorithm",
    "resolve_eagle_params",
    "resolve_speculation",
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


NGRAM_DEFAULT_DRAFT_TOKENS = 12
"""`_handle_ngram` (speculative_hook.py:1314-1318): speculative_num_draft_tokens when unset."""
NGRAM_DEFAULT_MAX_BFS_BREADTH = 10
"""`--speculative-ngram-max-bfs-breadth` default (arg_groups/fields/spec.py), which NGRAM takes as its topk
(speculative_hook.py:1312)."""
DFLASH_DEFAULT_BLOCK_SIZE = 16
"""`_handle_dflash` (speculative_hook.py:389-424): speculative_num_draft_tokens when unset and the draft model's
config.json names no block_size."""


@dataclass(frozen=True)
class ResolvedSpeculation:
    """The speculative numbers SGLang runs, after its handler for the algorithm."""

    num_steps: int
    """speculative_num_steps."""
    eagle_topk: int
    """speculative_eagle_topk."""
    num_draft_tokens: int
    """speculative_num_draft_tokens: the tokens one request puts into a target-verify graph."""
    changes: tuple[str, ...] = ()
    """What SGLang changed or filled in, each with the rule's source, in words."""


def resolve_speculation(algorithm: str, *, num_steps: int | None, eagle_topk: int | None,
                        num_draft_tokens: int | None, dflash_block_size: int | None = None) -> ResolvedSpeculation:
    """(steps, topk, draft tokens) as `handle_speculative_decoding` resolves them for a builtin algorithm: the EAGLE
    family (EAGLE, EAGLE3, NEXTN, STANDALONE) forces draft tokens = steps + 1 at topk 1 (`resolve_eagle_params`);
    NGRAM takes its BFS breadth as topk, 12 draft tokens when unset and steps = draft // topk; DFLASH runs 1 step at
    topk 1 with draft tokens = its block size (`dflash_block_size`, else the draft model's config, else 16; cgtune
    cannot read the draft model's config, so unset means 16). ValueError, naming the SGLang flag, where SGLang would
    refuse or cgtune would have to guess (EAGLE without steps: SGLang's automatic triple depends on the
    architecture)."""
    name = normalize_algorithm(algorithm)
    changes: list[str] = []
    if name in EAGLE_FAMILY:
        if num_steps is None:
            raise ValueError("speculative_num_steps: missing (unset, SGLang picks steps, topk and draft tokens by the "
                             "model's architecture; give them)")
        topk = 1 if eagle_topk is None else eagle_topk
        if topk > 1 and num_draft_tokens is None:
            raise ValueError(f"speculative_num_draft_tokens: missing (needed with speculative_eagle_topk={topk})")
        draft = num_draft_tokens if num_draft_tokens is not None else num_steps + 1
        steps, topk, resolved = resolve_eagle_params(name, model_arch="", num_steps=num_steps, eagle_topk=topk,
                                                     num_draft_tokens=draft)
        if num_draft_tokens is not None and resolved != num_draft_tokens:
            changes.append(f"speculative_num_draft_tokens {num_draft_tokens} -> {resolved}: SGLang forces steps + 1 "
                           f"at speculative_eagle_topk 1 (speculative_hook.py:1255-1266)")
        return ResolvedSpeculation(steps, topk, resolved, tuple(changes))
    if name == "NGRAM":
        topk = NGRAM_DEFAULT_MAX_BFS_BREADTH
        if eagle_topk is not None and eagle_topk != topk:
            changes.append(f"speculative_eagle_topk {eagle_topk} -> {topk}: NGRAM takes "
                           f"speculative_ngram_max_bfs_breadth (speculative_hook.py:1312)")
        draft = num_draft_tokens
        if draft is None:
            draft = NGRAM_DEFAULT_DRAFT_TOKENS
            changes.append(f"speculative_num_draft_tokens unset -> {draft}: NGRAM's default "
                           f"(speculative_hook.py:1314-1318)")
        steps = num_steps if num_steps is not None else draft // topk
        return ResolvedSpeculation(steps, topk, draft, tuple(changes))
    if name == "DFLASH":
        for flag, value in (("speculative_num_steps", num_steps), ("speculative_eagle_topk", eagle_topk)):
            if value is not None and value != 1:
                changes.append(f"{flag} {value} -> 1: DFLASH runs one step at topk 1 (speculative_hook.py:330-360)")
        if dflash_block_size is not None and num_draft_tokens is not None and dflash_block_size != num_draft_tokens:
            raise ValueError(f"speculative_num_draft_tokens: {num_draft_tokens} differs from "
                             f"speculative_dflash_block_size={dflash_block_size} (SGLang refuses the pair for DFLASH)")
        draft = dflash_block_size if dflash_block_size is not None else num_draft_tokens
        if draft is None:
            draft = DFLASH_DEFAULT_BLOCK_SIZE
            changes.append(f"speculative_num_draft_tokens unset -> {draft}: SGLang reads the draft model's block_size "
                           f"from its config.json, else 16 (speculative_hook.py:389-424); cgtune cannot read it, so "
                           f"{draft} is tuned for and written into the flags (set it to your drafter's block size)")
        return ResolvedSpeculation(1, 1, draft, tuple(changes))
    raise ValueError(f"speculative_algorithm={algorithm!r}: cgtune resolves EAGLE, EAGLE3, NEXTN, STANDALONE, NGRAM "
                     f"and DFLASH only")
