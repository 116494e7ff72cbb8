"""vLLM 0.34's own start-up checks on the speculative fields cgtune reads, where they differ from 0.33's: the methods
0.34 knows (`SpeculativeMethod`) and parallel drafting, which only DFlash and DSpark take (`SpeculativeConfig`)."""

from __future__ import annotations

__all__ = ["VLLM_034_METHODS", "speculative_refusals_034"]

VLLM_034_METHODS = ("ngram", "draft_model", "suffix", "eagle", "eagle3", "extract_hidden_states", "mtp", "dflash",
                    "ngram_gpu", "dspark")
"""The built-in methods of 0.34's `SpeculativeConfig.method` among those cgtune's workloads name (custom_class is
0.33's; 0.34 takes custom speculators registered by name)."""


def speculative_refusals_034(method: str | None, parallel_drafting: bool) -> list[tuple[str, object, str | None]]:
    """`(field, value, vLLM 0.34's reason or None)` for what `SpeculativeConfig` checks of the method and parallel
    drafting."""
    unknown = (f"Unknown speculative method {method!r}." if method is not None and method not in VLLM_034_METHODS
               else None)  # vLLM goes on to list its built-in methods (some forty MTP model types among them)
    parallel = (f"parallel_drafting is only supported by the dflash and dspark methods, not {method!r}."
                if parallel_drafting and method not in ("dflash", "dspark") else None)
    return [("speculative.method", method, unknown), ("speculative.parallel_drafting", parallel_drafting, parallel)]
