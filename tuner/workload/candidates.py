"""Candidate capture sizes of a serving config: the one definition profile, search and traffic import share."""

from __future__ import annotations

from tuner.engines.registry import engine_of
from tuner.engines.serving import ServingConfig
from tuner.engines.vllm.defaults import capture_ceiling

__all__ = ["VLLM_STRIDE_TOKENS", "candidate_widths", "decode_widths"]

VLLM_STRIDE_TOKENS = 16
"""vLLM's own grid step from 256 tokens up; the finest stride worth resolving above the ceiling."""


def decode_widths(serving: ServingConfig) -> list[int]:
    """Every uniform decode width (requests x query length, for each speculative tier) within the token budget."""
    return engine_of(serving).decode_widths()


def candidate_widths(serving: ServingConfig, *, stride_tokens: int = VLLM_STRIDE_TOKENS) -> list[int]:
    """Widths the tuner may capture: vLLM's default grid (and any user list), every uniform decode width, and a
    stride grid above the ceiling up to min(max_num_batched_tokens, q x max_num_seqs).

    FULL-decode graphs round a size up to a multiple of q; those rounded widths are decode widths already.
    """
    if stride_tokens < 1:
        raise ValueError(f"{stride_tokens=} must be >= 1")
    top = min(serving.max_num_batched_tokens, serving.decode_query_len * serving.max_num_seqs)
    ceiling = min(capture_ceiling(serving.gpu_capability), top)
    widths = set(engine_of(serving).defaults().sizes) | set(decode_widths(serving))
    widths |= set(range(ceiling + stride_tokens, top + 1, stride_tokens)) | {top}
    return sorted(w for w in widths if 1 <= w <= serving.max_num_batched_tokens)
