"""A vLLM 0.34 list pair written as 0.34 reads it: `prefill_cudagraph_capture_token_sizes` and
`decode_cudagraph_capture_request_sizes`, each with its cap, in the compilation config (the deprecated
`cudagraph_capture_sizes` would make 0.34 derive the decode request counts from it, not take cgtune's), checked
against 0.34's own resolution first."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tuner.engines.vllm.emit import EmitError, Provenance, ServeSettings, render_files
from tuner.engines.vllm.v034.dispatch import join_keys, split_keys

__all__ = ["compilation_config_034", "keys_of_compilation_config", "render_034_files", "validate_034_lists"]


def compilation_config_034(keys: Sequence[int], cudagraph_mode: str) -> dict[str, object]:
    """The `--compilation-config` mapping: the mode, both lists and their caps (each cap the list's max, so vLLM
    builds no grid and checks nothing away)."""
    prefill, decode = split_keys(keys)
    if (not prefill and not decode) or cudagraph_mode == "NONE":
        return {"cudagraph_mode": "NONE"}
    return {"cudagraph_mode": cudagraph_mode,
            "prefill_cudagraph_capture_token_sizes": prefill,
            "max_prefill_cudagraph_capture_tokens": max(prefill, default=0),
            "decode_cudagraph_capture_request_sizes": decode,
            "max_decode_cudagraph_capture_requests": max(decode, default=0)}


_LIST_FIELDS = ("prefill_cudagraph_capture_token_sizes", "decode_cudagraph_capture_request_sizes")


def keys_of_compilation_config(config: dict[str, Any]) -> tuple[int, ...]:
    """The keys of the list pair a `--compilation-config` mapping gives vLLM 0.34 (`compilation_config_034`'s inverse:
    none under cudagraph_mode NONE); KeyError, TypeError or ValueError for a mapping of another shape."""
    if config.get("cudagraph_mode") == "NONE" and not any(k in config for k in _LIST_FIELDS):
        return ()
    return join_keys([int(t) for t in config["prefill_cudagraph_capture_token_sizes"]],
                     [int(n) for n in config["decode_cudagraph_capture_request_sizes"]])


def validate_034_lists(engine: Any, keys: Sequence[int]) -> None:
    """EmitError when vLLM 0.34 (`engine`: its rulebook's Engine) would drop a size or capture another graph than the
    keys say: a prefill size above the token budget, a decode size above max_num_seqs, or one past the most requests a
    decode graph may hold (its token budget), which vLLM captures at that limit instead."""
    s = engine.serving
    prefill, decode = split_keys(keys)
    if [t for t in prefill if t > s.max_num_batched_tokens]:
        raise EmitError(f"prefill_cudagraph_capture_token_sizes: {max(prefill)} > max_num_batched_tokens="
                        f"{s.max_num_batched_tokens} (vLLM 0.34 would drop it)")
    if [n for n in decode if n > s.max_num_seqs]:
        raise EmitError(f"decode_cudagraph_capture_request_sizes: {max(decode)} > max_num_seqs={s.max_num_seqs} "
                        f"(vLLM 0.34 would drop it)")
    split = engine.resolve(prefill=prefill, decode=decode, from_workload=False)
    if split.prefill_token_sizes != prefill or split.decode_request_sizes != decode:
        raise EmitError(f"vLLM 0.34 would keep prefill {split.prefill_token_sizes} and decode "
                        f"{split.decode_request_sizes}, not {prefill} and {decode}")
    d = engine.dispatcher(keys)
    clamped = sorted({n for n, _ in d.decode_shapes} - set(decode))
    if clamped:
        raise EmitError(f"decode_cudagraph_capture_request_sizes: vLLM 0.34 captures {clamped[0]} requests (the most "
                        f"its decode token budget holds) in place of a larger size; write that size instead")


def render_034_files(engine: Any, keys: Sequence[int], settings: ServeSettings, *, cudagraph_mode: str,
                     provenance: Provenance | None) -> dict[str, str]:
    """The three files (`tuner.engines.vllm.emit.render_files`) with 0.34's compilation config."""
    if keys and cudagraph_mode != "NONE":
        validate_034_lists(engine, keys)
    return render_files(keys, settings, cudagraph_mode=cudagraph_mode, provenance=provenance,  # type: ignore[arg-type]
                        compilation=compilation_config_034)
