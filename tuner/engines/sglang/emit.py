"""Write a decode batch-size list as the files SGLang 0.5.23 consumes: the `sglang serve` flag line (the serving and
speculative flags the tuning assumed, the list as `--cuda-graph-config` JSON) and that JSON on its own, each checked
first against what SGLang would really capture."""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tuner.engines.sglang.capture import captured_batch_sizes, request_pool_size

if TYPE_CHECKING:
    from tuner.engines.vllm.emit import Provenance

__all__ = [
    "CUDA_GRAPH_CONFIG_FILE",
    "FLAGS_FILE",
    "EmitError",
    "LaunchSettings",
    "cuda_graph_config",
    "flag_line",
    "launch_args",
    "render_files",
    "validate_decode_batch_sizes",
]

FLAGS_FILE = "sglang-flags.txt"
CUDA_GRAPH_CONFIG_FILE = "sglang-cuda-graph-config.json"


class EmitError(ValueError):
    """A decode list SGLang would change or reject; the one-line message names the flag and the value."""


def validate_decode_batch_sizes(batch_sizes: Sequence[int], *, max_running_requests: int, attn_dp_size: int = 1,
                                mul_base: int = 1, tokens_per_request: int = 1,
                                two_batch_overlap: bool = False) -> list[int]:
    """The list as SGLang would capture it, or EmitError when SGLang would drop, add or reject a size.

    The request pool (max_running_requests // attn_dp_size, per DP rank) caps the list: a size above it is dropped
    and the pool size added instead. Sizes the alignment filter drops (bs x tokens_per_request not a multiple of
    mul_base) are refused too. A list ending below the pool is valid; batches above its max run eager.
    """
    values = [int(s) for s in batch_sizes]
    if not values:
        raise EmitError("cuda_graph_bs_decode: [] is empty (emit --disable-decode-cuda-graph instead)")
    if min(values) < 1:
        raise EmitError(f"cuda_graph_bs_decode: {values} holds a size < 1")
    if values != sorted(set(values)):
        raise EmitError(f"cuda_graph_bs_decode: {values} must be sorted and unique")
    pool = request_pool_size(max_running_requests=max_running_requests, attn_dp_size=attn_dp_size)
    if values[-1] > pool:
        raise EmitError(f"cuda_graph_bs_decode: {values[-1]} > request pool {pool} (max_running_requests="
                        f"{max_running_requests} / attn_dp_size={attn_dp_size}); SGLang would drop it and capture "
                        f"{pool}")
    kept = captured_batch_sizes(values, pool, mul_base=mul_base, captured_req_width=tokens_per_request,
                                two_batch_overlap=two_batch_overlap)
    if kept != values:
        raise EmitError(f"cuda_graph_bs_decode: SGLang would capture {kept}, not {values} (mul_base={mul_base}, "
                        f"tokens_per_request={tokens_per_request})")
    return values


def cuda_graph_config(batch_sizes: Sequence[int]) -> dict[str, dict[str, list[int]]]:
    """The `--cuda-graph-config` mapping for the decode phase (its allowed keys: backend, max_bs, bs)."""
    return {"decode": {"bs": sorted({int(s) for s in batch_sizes})}}


@dataclass(frozen=True)
class LaunchSettings:
    """Everything besides the decode list that `sglang serve --model-path MODEL` must be given to run what was tuned."""

    max_running_requests: int
    """Pinned: unset, speculative decoding sets it to 48 after the list is built and cuts the list there."""
    context_length: int
    chunked_prefill_size: int
    tp_size: int
    dtype: str
    mem_fraction_static: float | None = None
    """None: SGLang's automatic fraction (what cgtune modelled), so no flag."""
    speculative: tuple[tuple[str, object], ...] = ()
    """`(flag without --, value)`: the algorithm, draft model path and the three numbers as SGLang resolves them;
    without them SGLang runs no speculation (1 token per request), with the algorithm alone its automatic triple."""
    notes: tuple[str, ...] = ()
    """What the user must still put in (a placeholder's meaning), as comment lines."""


def launch_args(batch_sizes: Sequence[int], settings: LaunchSettings) -> list[str]:
    """The `sglang serve` arguments after `--model-path MODEL`; the list as `--cuda-graph-config` JSON (a string,
    never a file path: SGLang parses the argument as JSON)."""
    s = settings
    args = ["--max-running-requests", str(s.max_running_requests), "--context-length", str(s.context_length),
            "--chunked-prefill-size", str(s.chunked_prefill_size), "--tp-size", str(s.tp_size), "--dtype", s.dtype]
    if s.mem_fraction_static is not None:
        args += ["--mem-fraction-static", str(s.mem_fraction_static)]
    for flag, value in s.speculative:
        args += [f"--{flag}", str(value)]
    return args + ["--cuda-graph-config", json.dumps(cuda_graph_config(batch_sizes), separators=(",", ":"))]


def flag_line(batch_sizes: Sequence[int], settings: LaunchSettings) -> str:
    """`--max-running-requests N ... --cuda-graph-config '{"decode":{"bs":[...]}}'`, shell-quoted, to append to
    `sglang serve --model-path MODEL`.

    Never the pre-0.5.23 `--cuda-graph-bs` / `--cuda-graph-max-bs`: 0.5.23 no longer registers them and argparse
    aborts on them as ambiguous prefixes of the -decode/-prefill flags.
    """
    return shlex.join(launch_args(batch_sizes, settings))


def render_files(batch_sizes: Sequence[int], settings: LaunchSettings, *, tokens_per_request: int = 1,
                 attn_dp_size: int = 1, mul_base: int = 1, two_batch_overlap: bool = False,
                 provenance: Provenance | None = None) -> dict[str, str]:
    """File name -> text for the flag file and the JSON; validates the list first (EmitError)."""
    values = validate_decode_batch_sizes(batch_sizes, max_running_requests=settings.max_running_requests,
                                         attn_dp_size=attn_dp_size, mul_base=mul_base,
                                         tokens_per_request=tokens_per_request, two_batch_overlap=two_batch_overlap)
    comments = "".join(f"# {line}\n" for line in (provenance.lines() if provenance is not None else []))
    comments += "".join(f"# {note}\n" for note in settings.notes)
    flags_text = (
        comments
        + "# usage: sglang serve --model-path MODEL <the line below>\n"
        + f"# sizes are requests per DP rank; each graph holds bs x {tokens_per_request} token(s)\n"
        + flag_line(values, settings) + "\n"
    )
    # JSON has no comments and SGLang rejects unknown keys, so provenance lives in the flag file only.
    return {FLAGS_FILE: flags_text, CUDA_GRAPH_CONFIG_FILE: json.dumps(cuda_graph_config(values), indent=2) + "\n"}
