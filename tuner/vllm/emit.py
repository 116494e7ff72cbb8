"""Write a capture list as the files vLLM consumes: a `--compilation-config` JSON, a `vllm serve --config` YAML and
the flag line, each checked against vLLM's own capture-size rules first."""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tuner.vllm.defaults import default_capture_sizes

__all__ = [
    "COMPILATION_CONFIG_FILE",
    "FLAGS_FILE",
    "SERVE_YAML_FILE",
    "EmitError",
    "Provenance",
    "compilation_config",
    "flag_line",
    "render_files",
    "serve_config",
    "validate_capture_sizes",
    "write_files",
]

COMPILATION_CONFIG_FILE = "compilation_config.json"
SERVE_YAML_FILE = "vllm-serve.yaml"
FLAGS_FILE = "vllm-flags.txt"


class EmitError(ValueError):
    """A capture list vLLM would change or reject; the message names the rule."""


@dataclass(frozen=True)
class Provenance:
    """Where an emitted list came from (written as comments where the format allows)."""

    cgtune_version: str
    """cgtune version that made the files."""
    profile: str
    """Profile CSV the cost model was fitted from."""
    device: str
    """GPU the profile was measured on."""
    workload: str
    """Workload name and content hash."""
    created_at: str
    """UTC timestamp."""
    extra: dict[str, str] = field(default_factory=dict)
    """Further lines (source of the list, expected latency ...)."""

    def lines(self) -> list[str]:
        base = [
            f"made by cgtune {self.cgtune_version} on {self.created_at}",
            f"profile: {self.profile} (device: {self.device})",
            f"workload: {self.workload}",
        ]
        return base + [f"{k}: {v}" for k, v in self.extra.items()]


def validate_capture_sizes(
    sizes: Sequence[int], *, max_num_seqs: int, num_speculative_tokens: int, max_num_batched_tokens: int,
    cudagraph_mode: str = "FULL_AND_PIECEWISE",
) -> list[int]:
    """The list as vLLM 0.33 would keep it, or EmitError when vLLM would drop, reorder or reject anything."""
    values = [int(s) for s in sizes]
    if not values:
        raise EmitError("cudagraph_capture_sizes: empty (vLLM needs at least one size; emit cudagraph_mode NONE "
                        "instead)")
    if any(s < 1 for s in values):
        raise EmitError(f"cudagraph_capture_sizes: {values} holds a size < 1")
    if values != sorted(set(values)):
        raise EmitError(f"cudagraph_capture_sizes: {values} must be sorted and unique")
    if values[-1] > max_num_batched_tokens:
        raise EmitError(f"cudagraph_capture_sizes: {values[-1]} > max_num_batched_tokens={max_num_batched_tokens} "
                        f"(vLLM would drop it)")
    kept = default_capture_sizes(
        max_num_seqs, num_speculative_tokens, max_num_batched_tokens, cudagraph_mode=cudagraph_mode,
        cudagraph_capture_sizes=values, max_cudagraph_capture_size=values[-1],
    )
    if kept.sizes != values or kept.max_size != values[-1]:
        raise EmitError(f"cudagraph_capture_sizes: vLLM would keep {kept.sizes} (max {kept.max_size}), not {values}")
    return values


def compilation_config(sizes: Sequence[int], cudagraph_mode: str) -> dict[str, object]:
    """The `--compilation-config` mapping: mode, sorted unique sizes and the consistent max."""
    values = sorted({int(s) for s in sizes})
    if not values or cudagraph_mode == "NONE":
        return {"cudagraph_mode": "NONE"}
    return {"cudagraph_mode": cudagraph_mode, "cudagraph_capture_sizes": values,
            "max_cudagraph_capture_size": values[-1]}


def serve_config(model: str | None, sizes: Sequence[int], *, cudagraph_mode: str, max_num_seqs: int,
                 max_num_batched_tokens: int, max_model_len: int, gpu_memory_utilization: float,
                 tensor_parallel_size: int) -> dict[str, object]:
    """The `vllm serve --config` mapping (keys are CLI flag names); without a checkpoint no `model` key, since
    vLLM would try to load whatever stood there."""
    return {
        **({"model": model} if model else {}),
        "max-num-seqs": max_num_seqs,
        "max-num-batched-tokens": max_num_batched_tokens,
        "max-model-len": max_model_len,
        "gpu-memory-utilization": gpu_memory_utilization,
        "tensor-parallel-size": tensor_parallel_size,
        "compilation-config": compilation_config(sizes, cudagraph_mode),
    }


def flag_line(sizes: Sequence[int], cudagraph_mode: str) -> str:
    """`--compilation-config '{...}'`, shell-quoted, to append to `vllm serve MODEL`."""
    return "--compilation-config " + shlex.quote(json.dumps(compilation_config(sizes, cudagraph_mode),
                                                            separators=(", ", ": ")))


def render_files(sizes: Sequence[int], *, model: str | None, cudagraph_mode: str, max_num_seqs: int,
                 num_speculative_tokens: int, max_num_batched_tokens: int, max_model_len: int,
                 gpu_memory_utilization: float, tensor_parallel_size: int,
                 provenance: Provenance) -> dict[str, str]:
    """File name -> text for the three files; validates the list first (EmitError). `model`: the checkpoint vLLM
    serves (a Hugging Face id or path); None writes a placeholder comment where it goes."""
    values = sorted({int(s) for s in sizes})
    if values and cudagraph_mode != "NONE":
        validate_capture_sizes(values, max_num_seqs=max_num_seqs, num_speculative_tokens=num_speculative_tokens,
                               max_num_batched_tokens=max_num_batched_tokens, cudagraph_mode=cudagraph_mode)
    cc = compilation_config(values, cudagraph_mode)
    # JSON has no comments and vLLM rejects unknown keys, so provenance lives in the other two files.
    cc_text = json.dumps(cc, indent=2) + "\n"
    comments = "".join(f"# {line}\n" for line in provenance.lines())
    serve = serve_config(model, values, cudagraph_mode=cudagraph_mode, max_num_seqs=max_num_seqs,
                         max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
                         gpu_memory_utilization=gpu_memory_utilization, tensor_parallel_size=tensor_parallel_size)
    if model:
        usage = "# usage: vllm serve --config vllm-serve.yaml (add your speculative-config)\n"
        placeholder = ""
    else:
        usage = "# usage: vllm serve CHECKPOINT --config vllm-serve.yaml (add your speculative-config)\n"
        placeholder = ("# model: CHECKPOINT  <- the workload names no checkpoint (set model.name in it, or pass it to "
                       "vllm serve)\n")
    serve_text = comments + usage + placeholder + yaml.safe_dump(serve, sort_keys=False, default_flow_style=None,
                                                                 width=100)
    flags_text = (comments + f"# usage: vllm serve {model or 'CHECKPOINT'} <the line below>\n"
                  + flag_line(values, cudagraph_mode) + "\n")
    return {COMPILATION_CONFIG_FILE: cc_text, SERVE_YAML_FILE: serve_text, FLAGS_FILE: flags_text}


def write_files(out_dir: Path, files: dict[str, str]) -> list[Path]:
    """Write rendered files atomically."""
    from tuner.profile_table import atomic_write_text

    paths = []
    for name, text in files.items():
        atomic_write_text(out_dir / name, text)
        paths.append(out_dir / name)
    return paths
