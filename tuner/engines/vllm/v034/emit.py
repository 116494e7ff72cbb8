"""A vLLM 0.34 list pair written as 0.34 reads it: `prefill_cudagraph_capture_token_sizes` and
`decode_cudagraph_capture_request_sizes`, each with its cap, and the decode token budget where vLLM's own would differ
(the deprecated `cudagraph_capture_sizes` would make 0.34 derive the decode request counts from it, not take
cgtune's). Before anything is written, the compilation config is resolved as vLLM 0.34 resolves it and its graphs held
to the ones cgtune costed for the list: a file that would make the engine build anything else is refused."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tuner.engines.vllm.emit import EmitError, Provenance, ServeSettings, render_files
from tuner.engines.vllm.v034.dispatch import Dispatcher034, join_keys, split_keys

__all__ = ["COMPILATION_FIELDS", "compilation_config_034", "files_fields", "keys_of_compilation_config", "list_fields",
           "render_034_files"]

COMPILATION_FIELDS = {
    "cudagraph_capture_sizes": "cudagraph_capture_sizes",
    "max_cudagraph_capture_size": "max_cudagraph_capture_size",
    "prefill_cudagraph_capture_token_sizes": "prefill_token_sizes",
    "max_prefill_cudagraph_capture_tokens": "max_prefill_tokens",
    "decode_cudagraph_capture_request_sizes": "decode_request_sizes",
    "max_decode_cudagraph_capture_requests": "max_decode_requests",
    "max_decode_cudagraph_capture_tokens": "max_decode_tokens",
}
"""`CompilationConfig`'s capture fields -> `tuner.engines.vllm.v034.defaults.resolve_capture_sizes`' arguments: every
field of a `--compilation-config` besides `cudagraph_mode` that changes what 0.34 captures."""


def list_fields(keys: Sequence[int]) -> dict[str, Any]:
    """Both lists of `keys`, each capped at its max (so vLLM builds no grid and drops nothing)."""
    prefill, decode = split_keys(keys)
    return {"prefill_cudagraph_capture_token_sizes": prefill,
            "max_prefill_cudagraph_capture_tokens": max(prefill, default=0),
            "decode_cudagraph_capture_request_sizes": decode,
            "max_decode_cudagraph_capture_requests": max(decode, default=0)}


def compilation_config_034(keys: Sequence[int], cudagraph_mode: str,
                           fields: dict[str, Any] | None = None) -> dict[str, object]:
    """The `--compilation-config` mapping: the mode and the capture fields (`fields`; by default `list_fields(keys)`);
    none under cudagraph_mode NONE or without keys."""
    if cudagraph_mode == "NONE" or not keys:
        return {"cudagraph_mode": "NONE"}
    return {"cudagraph_mode": cudagraph_mode, **(list_fields(keys) if fields is None else fields)}


def keys_of_compilation_config(engine: Any, config: dict[str, Any]) -> tuple[int, ...]:
    """The keys of the list pair vLLM 0.34 (`engine`: the workload's) resolves from a `--compilation-config` mapping
    (none under cudagraph_mode NONE); KeyError, TypeError or ValueError for a mapping of another shape or one vLLM
    refuses."""
    mode = config.get("cudagraph_mode", engine.serving.cudagraph_mode)
    if mode == "NONE":
        return ()
    unknown = sorted(set(config) - set(COMPILATION_FIELDS) - {"cudagraph_mode"})
    if unknown:
        raise KeyError(unknown[0])
    fields = {k: v for k, v in config.items() if k in COMPILATION_FIELDS}
    if not any(isinstance(fields.get(k), list) for k in ("prefill_cudagraph_capture_token_sizes",
                                                          "decode_cudagraph_capture_request_sizes")):
        raise KeyError("prefill_cudagraph_capture_token_sizes")
    split = engine.resolve_fields(fields, mode)
    return join_keys(split.prefill_token_sizes, split.decode_request_sizes)


def _signature(d: Dispatcher034) -> tuple[Any, ...]:
    """What decides every graph the target and its drafter capture and every dispatch: the mode, the graphs in capture
    order, the decode request sizes and the most tokens a decode graph holds (the drafter's shapes follow them)."""
    return d.cudagraph_mode, d.manager_graphs(), d.decode_request_sizes, d.decode_max_tokens


def files_fields(engine: Any, keys: Sequence[int], cudagraph_mode: str) -> dict[str, Any]:
    """The capture fields the files write for `keys` under `engine` (the workload's 0.34 Engine), after resolving them
    as vLLM 0.34 does and holding the graphs to what cgtune costs for the keys (`engine.dispatcher`): the lists with
    their caps and decode token budget; for the default's keys where the lists written out would resolve otherwise (a
    deprecated field set), the deployment's own fields, which are the default. EmitError when vLLM would drop a size,
    capture a decode size at a smaller one (its token budget), or build other graphs than were costed."""
    prefill, decode = split_keys(keys)
    s = engine.serving
    costed = _signature(engine.dispatcher(keys))
    fields = engine.list_fields(prefill, decode)
    emitted = _resolved(engine, fields, cudagraph_mode)
    if tuple(engine.runs_as(keys)) == tuple(engine.defaults().sizes):  # vLLM's own default: as it resolves it
        for choice in (fields, engine.deployment_fields()):
            if _signature(_resolved(engine, choice, cudagraph_mode)) == costed:
                return choice
    if emitted.prefill_token_sizes != prefill or emitted.decode_request_sizes != decode:
        dropped = ([f"prefill_cudagraph_capture_token_sizes: {max(prefill)} > max_num_batched_tokens="
                    f"{s.max_num_batched_tokens}"] if prefill and max(prefill) > s.max_num_batched_tokens else []) + \
            ([f"decode_cudagraph_capture_request_sizes: {max(decode)} > max_num_seqs={s.max_num_seqs}"]
             if decode and max(decode) > s.max_num_seqs else [])
        raise EmitError(f"{dropped[0]} (vLLM 0.34 would drop it)" if dropped else
                        f"vLLM 0.34 would keep prefill {emitted.prefill_token_sizes} and decode "
                        f"{emitted.decode_request_sizes}, not {prefill} and {decode}")
    clamped = sorted({n for n, _ in emitted.decode_shapes} - set(decode))
    if clamped:
        raise EmitError(f"decode_cudagraph_capture_request_sizes: vLLM 0.34 captures {clamped[0]} requests (the most "
                        f"its decode token budget holds) in place of a larger size; write that size instead")
    if _signature(emitted) != costed:
        raise EmitError(f"vLLM 0.34 would capture other graphs from these files than the ones costed for prefill "
                        f"{prefill} and decode {decode}")
    return fields


def _resolved(engine: Any, fields: dict[str, Any], cudagraph_mode: str) -> Dispatcher034:
    """The target manager vLLM 0.34 builds from a compilation config's capture fields (EmitError where it refuses)."""
    try:
        split = engine.resolve_fields(fields, cudagraph_mode)
    except ValueError as exc:
        raise EmitError(f"vLLM 0.34 refuses the compilation config {fields}: {exc}") from None
    return Dispatcher034.from_split(split, max_num_seqs=engine.serving.max_num_seqs,
                                    uniform_decode_query_len=engine.decode_query_len)


def render_034_files(engine: Any, keys: Sequence[int], settings: ServeSettings, *, cudagraph_mode: str,
                     provenance: Provenance | None) -> dict[str, str]:
    """The three files (`tuner.engines.vllm.emit.render_files`) with 0.34's compilation config, checked first."""
    fields = files_fields(engine, keys, cudagraph_mode) if keys and cudagraph_mode != "NONE" else {}
    return render_files(keys, settings, cudagraph_mode=cudagraph_mode, provenance=provenance,  # type: ignore[arg-type]
                        compilation=lambda values, mode: compilation_config_034(values, mode, fields))
