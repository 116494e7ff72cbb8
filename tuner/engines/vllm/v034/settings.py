"""vLLM 0.34's own serving settings: the split capture knobs (`CompilationConfig`'s prefill token sizes and decode
request sizes, their caps, the decode token budget) and the extensible KV cache, read from a workload's `serving:`
section; 0.33 has none of them."""

from __future__ import annotations

from dataclasses import dataclass

from tuner.fields import FieldReader, WorkloadError

__all__ = ["SETTING_FIELDS", "Vllm034Settings", "read_034_settings"]

SETTING_FIELDS = ("prefill_cudagraph_capture_token_sizes", "max_prefill_cudagraph_capture_tokens",
                  "decode_cudagraph_capture_request_sizes", "max_decode_cudagraph_capture_requests",
                  "max_decode_cudagraph_capture_tokens", "extensible_kv_cache")
"""The `serving:` fields only vLLM 0.34 takes (under its own names)."""


@dataclass(frozen=True)
class Vllm034Settings:
    """The 0.34 settings of a deployment, as the workload gives them (None: vLLM's default)."""

    prefill_token_sizes: tuple[int, ...] | None = None
    """`prefill_cudagraph_capture_token_sizes`: token counts of the mixed (prefill) graphs."""
    max_prefill_tokens: int | None = None
    """`max_prefill_cudagraph_capture_tokens`: their cap (alone, it makes the prefill grid up to it)."""
    decode_request_sizes: tuple[int, ...] | None = None
    """`decode_cudagraph_capture_request_sizes`: request counts of the uniform decode graphs."""
    max_decode_requests: int | None = None
    """`max_decode_cudagraph_capture_requests`: their cap (alone, it makes the request grid up to it)."""
    max_decode_tokens: int | None = None
    """`max_decode_cudagraph_capture_tokens`: the most tokens a decode graph holds (8192 on SM100 by default)."""
    extensible_kv_cache: bool = True
    """`--enable-extensible-kv-cache` (on by default on CUDA): the KV cache is sized from the memory left after the
    graphs are captured, not from a graph-memory estimate made before."""


def _sizes(r: FieldReader, key: str) -> tuple[int, ...] | None:
    value = r.raw(key)
    if value is None:
        return None
    if not isinstance(value, list) or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in value):
        raise WorkloadError(f"{r.at(key)}: {value!r} must be a list of positive integers ([] captures none)")
    return tuple(value)


def read_034_settings(r: FieldReader) -> Vllm034Settings:
    """The 0.34 fields of a `serving:` section (each taken, so a 0.33 workload that sets one can be refused)."""
    return Vllm034Settings(
        prefill_token_sizes=_sizes(r, "prefill_cudagraph_capture_token_sizes"),
        max_prefill_tokens=r.int("max_prefill_cudagraph_capture_tokens", None, minimum=0),
        decode_request_sizes=_sizes(r, "decode_cudagraph_capture_request_sizes"),
        max_decode_requests=r.int("max_decode_cudagraph_capture_requests", None, minimum=0),
        max_decode_tokens=r.int("max_decode_cudagraph_capture_tokens", None, minimum=1),
        extensible_kv_cache=r.bool("extensible_kv_cache", True),
    )
