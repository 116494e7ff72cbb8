"""Write a capture list as the files vLLM consumes: a `--compilation-config` JSON, a `vllm serve --config` YAML and
the flag line, the last two with every serving, speculative and environment setting the tuning assumed, the list
checked against vLLM's own capture-size rules first."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tuner.engines.vllm.defaults import default_capture_sizes
from tuner.engines.vllm.lora import LoraSettings, lora_flags

__all__ = [
    "COMPILATION_CONFIG_FILE",
    "COMPILATION_NOTES_FILE",
    "FLAGS_FILE",
    "NEEDS_DRAFT_CHECKPOINT",
    "SERVE_YAML_FILE",
    "EmitError",
    "Provenance",
    "ServeSettings",
    "compilation_config",
    "env_prefix",
    "flag_args",
    "flag_line",
    "render_files",
    "serve_config",
    "validate_capture_sizes",
    "write_files",
]

NEEDS_DRAFT_CHECKPOINT = ("eagle", "eagle3", "dflash", "draft_model", "custom_class")
"""Methods vLLM refuses without `speculative-config.model` (`SpeculativeConfig.__post_init__`: "num_speculative_tokens
was provided but without speculative model"); mtp and dspark default to the target, the model-free methods to their
own name."""

COMPILATION_CONFIG_FILE = "compilation_config.json"
COMPILATION_NOTES_FILE = "compilation_config.about.txt"
"""Beside the JSON, which carries no comments (vLLM refuses a key its CompilationConfig does not have): the notes the
other two files carry as comments, the vLLM release first."""
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
    release: str | None = None
    """The engine release the files are for and why that one (`Engine.release_words`); None: not said."""

    def lines(self) -> list[str]:
        base = [f"for {self.release}; another release reads these settings otherwise or refuses them"] \
            if self.release else []
        base += [
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


@dataclass(frozen=True)
class ServeSettings:
    """Everything besides the compilation config that a `vllm serve` must be given to run what was tuned: the
    serving flags, the speculative config and the environment."""

    model: str
    """The served checkpoint (or a placeholder vLLM refuses, `tuner.engines.engine.placeholder`)."""
    dtype: str
    """--dtype: the dtype the profile measured."""
    tensor_parallel_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    gpu_memory_utilization: float
    enforce_eager: bool = False
    speculative_config: dict[str, object] | None = None
    """--speculative-config (method, num_speculative_tokens, model, ...); None without speculation."""
    environment: tuple[tuple[str, str, str], ...] = ()
    """`(variable, value, why)` that must be set in vLLM's environment."""
    notes: tuple[str, ...] = ()
    """What the user must still put in (a placeholder's meaning), as comment lines."""
    kv_cache_memory_bytes: int | None = None
    """--kv-cache-memory-bytes: the KV cache pinned per rank (None: vLLM sizes it itself)."""
    performance_mode: str = "balanced"
    """--performance-mode: interactivity changes vLLM's default capture sizes (every width up to 32); written where it
    is not vLLM's default, balanced."""
    extensible_kv_cache: bool | None = None
    """vLLM 0.34's extensible KV cache: False is written (`--disable-extensible-kv-cache`, the parser's EnableDisable
    flag: a YAML `enable-extensible-kv-cache: false` would be dropped) where the workload sizes the KV cache without
    it; None: vLLM's default."""
    data_parallel_size: int = 1
    """--data-parallel-size: ranks that agree on every step's padded width."""
    lora: LoraSettings | None = None
    """--enable-lora and its settings (`cudagraph_specialize_lora` in the compilation config); None: no LoRA."""

    @property
    def num_speculative_tokens(self) -> int:
        return int(self.speculative_config["num_speculative_tokens"]) if self.speculative_config else 0


def env_prefix(environment: Sequence[tuple[str, str, str]]) -> str:
    """`VAR=value ` for each `(variable, value, why)`, to put before `vllm serve` ('' without any)."""
    return "".join(f"{name}={shlex.quote(value)} " for name, value, _ in environment)


CompilationConfig = Callable[[Sequence[int], str], dict[str, object]]
"""A version's `--compilation-config` mapping of a list and a cudagraph mode (0.33: `compilation_config`)."""


def with_lora(cc: dict[str, object], lora: LoraSettings | None) -> dict[str, object]:
    """A compilation config with `cudagraph_specialize_lora` as the LoRA deployment was tuned (it decides whether the
    graphs without LoRA are captured)."""
    if lora is None or cc.get("cudagraph_mode") == "NONE":
        return cc
    return {**cc, "cudagraph_specialize_lora": lora.cudagraph_specialize_lora}


def serve_config(sizes: Sequence[int], settings: ServeSettings, cudagraph_mode: str,
                 compilation: CompilationConfig = compilation_config) -> dict[str, object]:
    """The `vllm serve --config` mapping (keys are CLI flag names, in the order a reader checks them)."""
    s = settings
    return {
        "model": s.model,
        "dtype": s.dtype,
        "tensor-parallel-size": s.tensor_parallel_size,
        **({"data-parallel-size": s.data_parallel_size} if s.data_parallel_size > 1 else {}),
        "max-model-len": s.max_model_len,
        "max-num-seqs": s.max_num_seqs,
        "max-num-batched-tokens": s.max_num_batched_tokens,
        "gpu-memory-utilization": s.gpu_memory_utilization,
        **({"kv-cache-memory-bytes": s.kv_cache_memory_bytes} if s.kv_cache_memory_bytes is not None else {}),
        **({"disable-extensible-kv-cache": True} if s.extensible_kv_cache is False else {}),
        **({"performance-mode": s.performance_mode} if s.performance_mode != "balanced" else {}),
        **({"enforce-eager": True} if s.enforce_eager else {}),
        **({"speculative-config": s.speculative_config} if s.speculative_config else {}),
        **lora_flags(s.lora),
        "compilation-config": with_lora(compilation(sizes, cudagraph_mode), s.lora),
    }


def flag_args(sizes: Sequence[int], settings: ServeSettings, cudagraph_mode: str,
              compilation: CompilationConfig = compilation_config) -> list[str]:
    """The same settings as `vllm serve MODEL` arguments (the model stays positional: not among them)."""
    args: list[str] = []
    for key, value in serve_config(sizes, settings, cudagraph_mode, compilation).items():
        if key == "model":
            continue
        if value is True:
            args.append(f"--{key}")
        else:
            args += [f"--{key}", json.dumps(value, separators=(", ", ": ")) if isinstance(value, dict) else str(value)]
    return args


def flag_line(sizes: Sequence[int], settings: ServeSettings, cudagraph_mode: str,
              compilation: CompilationConfig = compilation_config) -> str:
    """`--max-num-seqs N ... --compilation-config '{...}'`, shell-quoted, to append to `vllm serve MODEL`."""
    return shlex.join(flag_args(sizes, settings, cudagraph_mode, compilation))


def render_files(sizes: Sequence[int], settings: ServeSettings, *, cudagraph_mode: str,
                 provenance: Provenance, compilation: CompilationConfig | None = None) -> dict[str, str]:
    """File name -> text for the three files and the JSON's notes (COMPILATION_NOTES_FILE); validates the list first
    (EmitError). The YAML and the flag file carry every setting the tuning assumed, the environment it needs and what
    a placeholder stands for, as comments (the release the files are for first), and the notes file says the same of
    the JSON.
    `compilation`: another version's compilation config, its list already validated by that version's rules (None:
    0.33's, validated here)."""
    values = sorted({int(s) for s in sizes})
    if compilation is None:
        compilation = compilation_config
        if values and cudagraph_mode != "NONE":
            validate_capture_sizes(values, max_num_seqs=settings.max_num_seqs,
                                   num_speculative_tokens=settings.num_speculative_tokens,
                                   max_num_batched_tokens=settings.max_num_batched_tokens,
                                   cudagraph_mode=cudagraph_mode)
    cc = with_lora(compilation(values, cudagraph_mode), settings.lora)
    # JSON has no comments and vLLM rejects unknown keys: its provenance is in the other two files and a note beside it.
    cc_text = json.dumps(cc, indent=2) + "\n"
    comments = "".join(f"# {line}\n" for line in provenance.lines())
    comments += "".join(f"# environment: {name}={value} must be set: {why}\n" for name, value, why in
                        settings.environment)
    comments += "".join(f"# {note}\n" for note in settings.notes)
    env = env_prefix(settings.environment)
    serve_text = (comments + f"# usage: {env}vllm serve --config {SERVE_YAML_FILE}\n"
                  + yaml.safe_dump(serve_config(values, settings, cudagraph_mode, compilation), sort_keys=False,
                                   default_flow_style=None, width=100))
    flags_text = (comments + f"# usage: {env}vllm serve {shlex.quote(settings.model)} <the line below>\n"
                  + flag_line(values, settings, cudagraph_mode, compilation) + "\n")
    notes_text = (f"# notes on {COMPILATION_CONFIG_FILE} (JSON carries no comments, and vLLM refuses a key its "
                  f"compilation config does not have)\n" + comments)
    return {COMPILATION_CONFIG_FILE: cc_text, SERVE_YAML_FILE: serve_text, FLAGS_FILE: flags_text,
            COMPILATION_NOTES_FILE: notes_text}


def write_files(out_dir: Path, files: dict[str, str]) -> list[Path]:
    """Write rendered files atomically."""
    from tuner.profile.table import atomic_write_text

    paths = []
    for name, text in files.items():
        atomic_write_text(out_dir / name, text)
        paths.append(out_dir / name)
    return paths
