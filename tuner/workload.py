"""Workload specs: model shape, vLLM serving config and traffic, validated on load, and the step-width
distribution every later stage weighs latencies by."""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from tuner.engines import ENGINES, EngineDispatcher, EngineSettings, engine_default_requests, engine_runs_as_requests
from tuner.engines import requests_of
from tuner.fields import FieldReader, WorkloadError
from tuner.shapes import DTYPE_BYTES, PRESET_CHECKPOINTS, PRESETS, ModelShape
from tuner.steps import Distribution, Step, Traffic, step_distribution
from tuner.vllm.defaults import (
    CUDAGRAPH_MODES,
    PERFORMANCE_MODES,
    CaptureDefaults,
    default_capture_sizes,
    dense_speculative_schedule,
)
from tuner.vllm.dispatch import Dispatcher
from tuner.vllm.drafter import MODEL_BASED_METHODS, drafter_kv_bytes_per_token, drafter_weight_bytes
from tuner.vllm.runner import (
    MODEL_RUNNERS,
    SPECULATIVE_METHODS,
    effective_cudagraph_mode,
    keeps_dynamic_schedule,
    resolve_model_runner,
    runner_reason,
    runs_as,
)

__all__ = [
    "Distribution",
    "ModelSpec",
    "ServingConfig",
    "SpeculativeSpec",
    "Step",
    "Traffic",
    "Workload",
    "WorkloadError",
    "load_workload",
    "parse_workload",
]

GIB = 1 << 30


# --------------------------------------------------------------------------- spec pieces
@dataclass(frozen=True)
class ModelSpec:
    """The model shape one rank runs, its dtype and tensor parallelism."""

    shape: ModelShape
    """Whole-model shape (a preset or explicit fields)."""
    preset: str | None = None
    """Preset name when the shape came from one."""
    dtype: str = "bfloat16"
    """Weights, activations and KV-cache dtype."""
    tensor_parallel_size: int = 1
    """Ranks the model is sharded over; cgtune measures one rank's share."""
    name: str | None = None
    """The checkpoint vLLM serves (`model.name`: a Hugging Face id or a path), e.g. a fine-tune of the preset."""

    @property
    def label(self) -> str:
        return self.preset or "custom"

    @property
    def checkpoint(self) -> str | None:
        """What `vllm serve` loads: `name`, else the preset's Hugging Face id while the shape is the preset's own
        (an edited shape is some other model); None when neither says."""
        if self.name is not None:
            return self.name
        if self.preset is not None and self.shape == PRESETS.get(self.preset):
            return PRESET_CHECKPOINTS.get(self.preset)
        return None

    def weight_bytes(self) -> int:
        return self.shape.weight_bytes(self.dtype, self.tensor_parallel_size)

    def kv_bytes_per_token(self) -> int:
        return self.shape.kv_bytes_per_token(self.dtype, self.tensor_parallel_size)


@dataclass(frozen=True)
class ServingConfig:
    """The vLLM serving fields that decide capture sizes, dispatch and the KV budget."""

    max_num_seqs: int
    """Most requests in one engine step (`--max-num-seqs`)."""
    num_speculative_tokens: int = 0
    """Draft tokens per request per step; decode query length q = 1 + this."""
    max_num_batched_tokens: int = 8192
    """Token budget of one step (`--max-num-batched-tokens`)."""
    max_model_len: int = 8192
    """Longest request; the KV cache must hold at least one."""
    gpu_memory_utilization: float = 0.9
    """Share of device memory vLLM may use (`--gpu-memory-utilization`)."""
    required_kv_bytes: int | None = None
    """KV-cache bytes the deployment needs (from `required_kv_gib`); default: one max_model_len request."""
    cudagraph_mode: str = "FULL_AND_PIECEWISE"
    """vLLM `cudagraph_mode` (the -O2/-O3 default is FULL_AND_PIECEWISE)."""
    performance_mode: str = "balanced"
    """vLLM `performance_mode`; `interactivity` captures every width up to 32."""
    gpu_capability: tuple[int, int] = (9, 0)
    """Compute capability of the target GPU (decides the 512/1024 ceiling)."""
    max_cudagraph_capture_size: int | None = None
    """User-given `max_cudagraph_capture_size`, if any."""
    cudagraph_capture_sizes: tuple[int, ...] | None = None
    """User-given explicit capture list, if any."""
    speculative_schedule: tuple[tuple[int, int, int], ...] | None = None
    """Dynamic speculative decoding (`num_speculative_tokens_per_batch_size`)."""
    enforce_eager: bool = False
    """`--enforce-eager`: no graphs at all."""
    model_runner: str = "auto"
    """vLLM's model runner: `auto` (vLLM's choice: V1 for suffix decoding and the other V1-only cases, else V2),
    `v1` (`VLLM_USE_V2_MODEL_RUNNER=0`) or `v2`."""
    estimate_cudagraph_memory: bool = True
    """`VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS` (default 1): vLLM subtracts its graph-memory estimate from the KV
    cache before capturing; false makes the estimate 0."""
    speculative_method: str | None = None
    """Speculative method (from the workload's `speculative.method`); None: not named."""
    parallel_drafting: bool = False
    """Parallel drafting (from `speculative.parallel_drafting`; P-EAGLE/PARD run on V1)."""
    engine_settings: EngineSettings | None = None
    """SGLang's or TensorRT-LLM's own settings when the workload's engine is not vLLM (None: vLLM)."""

    @property
    def engine(self) -> str:
        """`vllm`, `sglang` or `trtllm`."""
        return self.engine_settings.engine if self.engine_settings is not None else "vllm"

    @property
    def decode_query_len(self) -> int:
        """Tokens per request in a uniform decode step (and per request in a decode graph)."""
        if self.engine_settings is not None:
            return self.engine_settings.tokens_per_request
        return 1 + self.num_speculative_tokens

    @property
    def runner(self) -> str:
        """The model runner that runs (`v1` or `v2`; vLLM's names, also for the other engines' single runner)."""
        if self.engine_settings is not None:
            return "v2"
        return resolve_model_runner(self.model_runner, self.speculative_method,
                                    parallel_drafting=self.parallel_drafting)

    @property
    def runner_reason(self) -> str:
        """Why that runner (a few words)."""
        return runner_reason(self.model_runner, self.speculative_method, parallel_drafting=self.parallel_drafting)

    @property
    def dynamic_schedule(self) -> tuple[tuple[int, int, int], ...] | None:
        """The dynamic speculative schedule vLLM runs: `speculative_schedule`, unless the V1 runner drops it for the
        speculative method (`keeps_dynamic_schedule`: suffix and custom_class then run static K); None without one."""
        if not self.speculative_schedule or self.num_speculative_tokens <= 0:
            return None
        return self.speculative_schedule if keeps_dynamic_schedule(self.runner, self.speculative_method) else None

    @property
    def effective_cudagraph_mode(self) -> str:
        """The cudagraph mode the runner uses (NONE under enforce_eager; V1 drops full graphs under a dynamic
        speculative schedule it keeps)."""
        if self.enforce_eager:
            return "NONE"
        if self.engine_settings is not None:
            return "FULL_DECODE_ONLY"  # decode graphs only: prefill and mixed steps run without them
        return effective_cudagraph_mode(self.cudagraph_mode, self.runner,
                                        dynamic_schedule=self.dynamic_schedule is not None)

    def runs_as(self, capture_sizes: list[int] | tuple[int, ...]) -> tuple[int, ...]:
        """The list the runner captures for a list written into the config (after vLLM drops sizes above the
        token budget): V1 rewrites it when speculating, V2 keeps it. ValueError when V1 refuses it. SGLang and
        TensorRT-LLM filter their batch sizes against their request caps (token widths in, token widths out)."""
        e = self.engine_settings
        if e is not None:
            q = self.decode_query_len
            runs = engine_runs_as_requests(e, requests_of(capture_sizes, q), max_num_seqs=self.max_num_seqs,
                                           max_num_batched_tokens=self.max_num_batched_tokens)
            return tuple(b * q for b in runs)
        kept = sorted({int(s) for s in capture_sizes if 1 <= int(s) <= self.max_num_batched_tokens})
        return tuple(runs_as(kept, runner=self.runner, cudagraph_mode=self.effective_cudagraph_mode,
                             decode_query_len=self.decode_query_len))

    def decode_query_lens(self) -> list[int]:
        """Tokens per request in a decode step of n requests (index n; index 0 unused): 1 + K(n) with K from the
        dynamic speculative schedule in force (vLLM's dense lookup; the schedule was validated on load), else q."""
        if self.dynamic_schedule is not None:
            dense = dense_speculative_schedule(
                [list(e) for e in self.dynamic_schedule], self.max_num_seqs, self.num_speculative_tokens)
            return [1 + k for k in dense]
        return [self.decode_query_len] * (self.max_num_seqs + 1)

    def decode_step(self, num_tokens: int) -> tuple[int, int] | None:
        """`(requests, query length)` of the uniform decode step `num_tokens` wide (the fewest requests when the
        schedule's tiers allow several), None when no decode step of max_num_seqs requests or fewer is that wide."""
        return self._decode_steps.get(num_tokens)

    @cached_property
    def _decode_steps(self) -> dict[int, tuple[int, int]]:
        query_lens = self.decode_query_lens()
        # Fewest requests last, so they win a width two tiers share.
        return {n * query_lens[n]: (n, query_lens[n]) for n in range(self.max_num_seqs, 0, -1)}

    def engine_requests(self, capture_sizes: list[int] | tuple[int, ...]) -> list[int]:
        """A list of token widths as the engine's batch sizes (requests; vLLM counts tokens: unchanged)."""
        if self.engine_settings is None:
            return sorted(set(capture_sizes))
        return requests_of(capture_sizes, self.decode_query_len)

    def defaults(self, *, gpu_memory_mib: float | None = None) -> CaptureDefaults:
        """The engine's default capture list for this config (token widths; for SGLang and TensorRT-LLM the
        generated batch-size list as written, times tokens per request). `gpu_memory_mib`: the device's, for SGLang
        defaults that read it when the workload does not say."""
        e = self.engine_settings
        if e is not None:
            q = self.decode_query_len
            written = engine_default_requests(e, max_num_seqs=self.max_num_seqs,
                                              max_num_batched_tokens=self.max_num_batched_tokens,
                                              gpu_memory_mib=gpu_memory_mib)
            runs = engine_runs_as_requests(e, written, max_num_seqs=self.max_num_seqs,
                                           max_num_batched_tokens=self.max_num_batched_tokens)
            rule = EngineDispatcher(e, runs, max_num_seqs=self.max_num_seqs).rule
            eager = [n * q for n in range(1, self.max_num_seqs + 1) if rule.dispatch(n).eager]
            return CaptureDefaults([b * q for b in written], max(written) * q if written else 0, eager)
        return default_capture_sizes(
            self.max_num_seqs,
            self.num_speculative_tokens,
            self.max_num_batched_tokens,
            gpu_capability=self.gpu_capability,
            performance_mode=self.performance_mode,
            cudagraph_mode=self.cudagraph_mode,
            max_cudagraph_capture_size=self.max_cudagraph_capture_size,
            cudagraph_capture_sizes=self.cudagraph_capture_sizes,
            speculative_schedule=[list(e) for e in self.dynamic_schedule] if self.dynamic_schedule else None,
            enforce_eager=self.enforce_eager,
        )

    def dispatcher(self, capture_sizes: list[int] | tuple[int, ...]) -> Dispatcher:
        """How the engine would dispatch steps with this capture list (the list as it runs)."""
        if self.engine_settings is not None:
            q = self.decode_query_len
            return EngineDispatcher(self.engine_settings,  # type: ignore[return-value]
                                    [w // q for w in self.runs_as(capture_sizes)], max_num_seqs=self.max_num_seqs)
        # V2 captures FULL decode graphs per dynamic tier; V1 runs a schedule it keeps PIECEWISE.
        tiers = sorted(set(self.decode_query_lens()[1:])) if self.runner == "v2" else None
        return Dispatcher(
            self.runs_as(capture_sizes), cudagraph_mode=self.effective_cudagraph_mode,
            decode_query_len=self.decode_query_len, max_num_seqs=self.max_num_seqs, runner=self.runner,
            decode_query_lens=tiers,
        )


@dataclass(frozen=True)
class SpeculativeSpec:
    """The workload's `speculative:` section: which method drafts the `num_speculative_tokens`, and with what."""

    method: str | None = None
    """vLLM's speculative method (eagle, eagle3, mtp, dflash, draft_model, ngram, suffix, ...)."""
    parallel_drafting: bool = False
    """One drafter pass per step for all K drafts (P-EAGLE, PARD; DFlash always drafts in parallel)."""
    drafter: ModelShape | None = None
    """The draft model's shape (model-based methods; None for model-free ones)."""
    shares_embedding: bool | None = None
    """The drafter uses the target's embedding (None: vLLM's default for the method)."""
    shares_lm_head: bool | None = None
    """The drafter uses the target's LM head (None: vLLM's default for the method)."""
    num_nextn_predict_layers: int | None = None
    """MTP: the predict layers that get KV cache (default: the drafter's layer count)."""

    @property
    def model_based(self) -> bool:
        """A draft model runs: its passes, graphs, weights and KV layers count."""
        return self.drafter is not None


@dataclass(frozen=True)
class Workload:
    """A validated workload: model, serving config and traffic."""

    name: str
    """Short identifier used in file and study names."""
    model: ModelSpec
    """Model shape, dtype and tensor parallelism."""
    serving: ServingConfig
    """vLLM serving config."""
    traffic: Traffic
    """Step-width distribution inputs."""
    description: str = ""
    """What deployment this stands for."""
    path: Path | None = None
    """File it was loaded from."""
    spec: dict[str, Any] = field(default_factory=dict, repr=False)
    """The raw mapping it was parsed from (for hashing and re-emitting)."""
    speculative: SpeculativeSpec | None = None
    """The speculative-decoding setup (method, drafter), when the workload names one."""

    @property
    def content_hash(self) -> str:
        """Stable 12-hex-digit hash of the spec and any trace it reads."""
        canonical = json.dumps(self.spec, sort_keys=True, default=str) + repr(self.traffic.trace)
        return hashlib.sha256(canonical.encode()).hexdigest()[:12]

    @property
    def drafter(self) -> ModelShape | None:
        """The draft model's shape, when a model-based drafter runs."""
        return self.speculative.drafter if self.speculative is not None else None

    def drafter_kv_bytes_per_token(self) -> int:
        """KV bytes the drafter's attention layers add per token on one rank (0 without a draft model)."""
        spec = self.speculative
        if spec is None or spec.drafter is None or spec.method is None:
            return 0
        return drafter_kv_bytes_per_token(spec.method, spec.drafter, self.model.dtype, self.model.tensor_parallel_size,
                                          num_nextn_predict_layers=spec.num_nextn_predict_layers)

    def drafter_weight_bytes(self) -> int:
        """Parameter bytes the drafter adds on one rank, shared embedding and LM head not counted twice."""
        spec = self.speculative
        if spec is None or spec.drafter is None or spec.method is None:
            return 0
        m = self.model
        return drafter_weight_bytes(spec.method, spec.drafter, m.shape, m.dtype, m.tensor_parallel_size,
                                    shares_embedding=spec.shares_embedding, shares_lm_head=spec.shares_lm_head)

    def kv_bytes_per_token(self) -> int:
        """KV bytes one token costs on one rank: the target's layers and the drafter's (vLLM gives draft attention
        layers KV cache beside the target's)."""
        return self.model.kv_bytes_per_token() + self.drafter_kv_bytes_per_token()

    @property
    def required_kv_bytes(self) -> int:
        """KV bytes the deployment needs: the explicit amount, else one max_model_len request."""
        if self.serving.required_kv_bytes is not None:
            return self.serving.required_kv_bytes
        return self.serving.max_model_len * self.kv_bytes_per_token()

    def steps(self) -> list[Step]:
        """The step distribution (`tuner.steps`): `Step`s with probabilities summing to 1, sorted by width."""
        return step_distribution(self.traffic, self.serving.decode_query_lens())


# --------------------------------------------------------------------------- parsing
def _parse_model(r: FieldReader) -> ModelSpec:
    preset = r.str("preset", None)
    fields = ModelShape.__dataclass_fields__
    explicit = {k: r.raw(k) for k in fields if r.has(k)}
    if preset is not None:
        if preset not in PRESETS:
            raise WorkloadError(f"{r.at('preset')}: {preset!r} is not a known preset ({', '.join(sorted(PRESETS))})")
        base = PRESETS[preset].as_dict()
    else:
        base = {}
    values: dict[str, Any] = {**base}
    for key in ("hidden_size", "num_layers", "num_attention_heads", "num_kv_heads", "head_dim",
                "intermediate_size", "vocab_size"):
        if key in explicit or key not in base:
            values[key] = r.int(key, minimum=1)
    if "rope_theta" in explicit:
        values["rope_theta"] = r.float("rope_theta", minimum=0.0, exclusive_minimum=True)
    if "rms_norm_eps" in explicit:
        values["rms_norm_eps"] = r.float("rms_norm_eps", minimum=0.0, exclusive_minimum=True)
    for key in ("tie_word_embeddings", "qk_norm"):
        if key in explicit:
            values[key] = r.bool(key, False)
    shape = ModelShape(**values)
    if shape.num_attention_heads % shape.num_kv_heads:
        raise WorkloadError(
            f"{r.at('num_kv_heads')}: {shape.num_kv_heads} must divide num_attention_heads={shape.num_attention_heads}"
        )
    dtype = r.str("dtype", "bfloat16", choices=tuple(DTYPE_BYTES))
    tp = r.int("tensor_parallel_size", 1, minimum=1)
    if shape.num_attention_heads % tp:
        raise WorkloadError(
            f"{r.at('tensor_parallel_size')}: {tp} must divide num_attention_heads={shape.num_attention_heads}"
        )
    if shape.intermediate_size % tp:
        raise WorkloadError(
            f"{r.at('tensor_parallel_size')}: {tp} must divide intermediate_size={shape.intermediate_size}"
        )
    name = r.str("name", None)
    if name is not None and (not name.strip() or name != name.strip() or "\n" in name):
        raise WorkloadError(f"{r.at('name')}: {name!r} must be a checkpoint name without surrounding spaces "
                            f"(e.g. my-org/llama-ft)")
    r.done()
    return ModelSpec(shape=shape, preset=preset, dtype=dtype, tensor_parallel_size=tp, name=name)


def _parse_capability(r: FieldReader, key: str) -> tuple[int, int]:
    value = r.raw(key, "9.0")
    text = str(value)
    try:
        major, minor = (int(p) for p in text.split("."))
    except ValueError:
        raise WorkloadError(f"{r.at(key)}: {value!r} must look like 9.0 (major.minor)") from None
    if major < 0 or minor < 0:
        raise WorkloadError(f"{r.at(key)}: {value!r} must look like 9.0 (major.minor)")
    return major, minor


def _parse_schedule(value: object, where: str) -> tuple[tuple[int, int, int], ...]:
    if not isinstance(value, list) or not value:
        raise WorkloadError(f"{where}: {value!r} must be a non-empty list of [start, end, K]")
    out = []
    for i, entry in enumerate(value):
        if (not isinstance(entry, list) or len(entry) != 3
                or any(isinstance(x, bool) or not isinstance(x, int) for x in entry)):
            raise WorkloadError(f"{where}[{i}]: {entry!r} must be [start, end, K] integers")
        out.append((entry[0], entry[1], entry[2]))
    return tuple(out)


_SHAPE_INTS = ("hidden_size", "num_layers", "num_attention_heads", "num_kv_heads", "head_dim", "intermediate_size",
               "vocab_size")


def _parse_drafter(r: FieldReader, method: str, target: ModelSpec) -> ModelShape:
    """The draft model's shape: a preset, or the target's widths with the fields given (an EAGLE head or MTP module:
    one layer by default; a DFlash drafter or a draft model must say their layer count)."""
    preset = r.str("preset", None)
    if preset is not None and preset not in PRESETS:
        raise WorkloadError(f"{r.at('preset')}: {preset!r} is not a known preset ({', '.join(sorted(PRESETS))})")
    values: dict[str, Any] = (PRESETS[preset] if preset else target.shape).as_dict()
    for key in _SHAPE_INTS:
        if r.has(key):
            values[key] = r.int(key, minimum=1)
    for key in ("rope_theta", "rms_norm_eps"):
        if r.has(key):
            values[key] = r.float(key, minimum=0.0, exclusive_minimum=True)
    for key in ("tie_word_embeddings", "qk_norm"):
        if r.has(key):
            values[key] = r.bool(key, False)
    if preset is None and not r.has("num_layers"):
        if method in ("dflash", "draft_model"):
            raise WorkloadError(f"{r.at('num_layers')}: missing (the {method} drafter's layer count, or a preset)")
        values["num_layers"] = 1  # an EAGLE head or an MTP module: one decoder layer
    shape = ModelShape(**values)
    if shape.num_attention_heads % shape.num_kv_heads:
        raise WorkloadError(f"{r.at('num_kv_heads')}: {shape.num_kv_heads} must divide num_attention_heads="
                            f"{shape.num_attention_heads}")
    tp = target.tensor_parallel_size
    if shape.num_attention_heads % tp or shape.intermediate_size % tp:
        raise WorkloadError(f"{r.path}: the drafter's heads ({shape.num_attention_heads}) and intermediate_size "
                            f"({shape.intermediate_size}) must divide by tensor_parallel_size={tp}")
    return shape


def _parse_speculative(r: FieldReader, target: ModelSpec) -> SpeculativeSpec:
    method = r.str("method", None, choices=SPECULATIVE_METHODS)
    parallel = r.bool("parallel_drafting", False)
    drafter = None
    shares_embedding = shares_lm_head = predict_layers = None
    if method in MODEL_BASED_METHODS:
        sub = r.sub("drafter") if r.has("drafter") else FieldReader({}, r.at("drafter"))
        shares_embedding = sub.raw("shares_embedding")
        shares_lm_head = sub.raw("shares_lm_head")
        for key, value in (("shares_embedding", shares_embedding), ("shares_lm_head", shares_lm_head)):
            if value is not None and not isinstance(value, bool):
                raise WorkloadError(f"{sub.at(key)}: {value!r} must be true or false")
        predict_layers = sub.int("num_nextn_predict_layers", None, minimum=1) if method == "mtp" else None
        drafter = _parse_drafter(sub, method, target)
        sub.done()
        try:  # vLLM's sharing rules: a shared embedding/head needs the target's vocabulary and width
            drafter_weight_bytes(method, drafter, target.shape, target.dtype, target.tensor_parallel_size,
                                 shares_embedding=shares_embedding, shares_lm_head=shares_lm_head)
        except ValueError as exc:
            raise WorkloadError(f"{sub.path}: {exc}") from None
    elif r.has("drafter"):
        raise WorkloadError(f"{r.at('drafter')}: method {method!r} has no draft model (model-free)")
    r.done()
    return SpeculativeSpec(method=method, parallel_drafting=parallel, drafter=drafter,
                           shares_embedding=shares_embedding, shares_lm_head=shares_lm_head,
                           num_nextn_predict_layers=predict_layers)


# Each engine's own names for the settings ServingConfig keeps under vLLM's names.
_ENGINE_ALIASES: dict[str, dict[str, str]] = {
    "sglang": {"max_running_requests": "max_num_seqs", "chunked_prefill_size": "max_num_batched_tokens",
               "context_length": "max_model_len", "speculative_num_steps": "num_speculative_tokens"},
    "trtllm": {"max_batch_size": "max_num_seqs", "max_num_tokens": "max_num_batched_tokens",
               "max_seq_len": "max_model_len", "max_draft_len": "num_speculative_tokens"},
}
_VLLM_ONLY = ("gpu_memory_utilization", "cudagraph_mode", "performance_mode", "max_cudagraph_capture_size",
              "cudagraph_capture_sizes", "speculative_schedule", "model_runner", "estimate_cudagraph_memory")
# vLLM's speculative methods as SGLang names its algorithms.
_SGLANG_ALGORITHMS = {"eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "NEXTN", "dflash": "DFLASH", "ngram": "NGRAM",
                      "draft_model": "STANDALONE"}
# vLLM's speculative methods as TensorRT-LLM names its decoding types (llmapi/llm_args.py `decoding_type` literals).
_TRTLLM_DECODING_TYPES = {"eagle": "Eagle", "eagle3": "Eagle3", "mtp": "MTP", "ngram": "NGram",
                          "draft_model": "DraftTarget"}


def _engine_aliases(r: FieldReader, engine: str) -> None:
    """Read an engine's own names into vLLM's (one name per setting); refuse vLLM-only settings elsewhere."""
    if engine == "vllm":
        return
    for key in _VLLM_ONLY:
        if r.has(key):
            raise WorkloadError(f"{r.at(key)}: a vLLM setting; engine {engine} has none (see the README's engine "
                                f"section)")
    data = dict(r.data)
    for native, ours in _ENGINE_ALIASES[engine].items():
        if native in data:
            if ours in data:
                raise WorkloadError(f"{r.at(native)}: give {native} or {ours}, not both")
            data[ours] = data.pop(native)
            r.used.add(native)
    r.data = data


def _engine_method(r: FieldReader, engine: str, spec_tokens: int, speculative: SpeculativeSpec | None) -> str | None:
    """The engine's own name for the workload's speculative method (SGLang's algorithm, TensorRT-LLM's
    decoding_type); None without speculation. Draft tokens need a method the engine has."""
    names, what, tokens_key = {
        "sglang": (_SGLANG_ALGORITHMS, "SGLang speculative algorithm", "num_speculative_tokens"),
        "trtllm": (_TRTLLM_DECODING_TYPES, "TensorRT-LLM decoding_type", "max_draft_len"),
    }[engine]
    method = speculative.method if speculative else None
    native = names.get(method) if method else None
    if method is not None and native is None:
        raise WorkloadError(f"speculative.method: {method!r} has no {what} ({', '.join(names)})")
    if spec_tokens and native is None:
        raise WorkloadError(f"{r.at(tokens_key)}: {spec_tokens} needs speculative.method with engine {engine} (its "
                            f"{what})")
    return native


def _parse_engine_settings(r: FieldReader, engine: str, spec_tokens: int,
                           speculative: SpeculativeSpec | None) -> EngineSettings | None:
    if engine == "vllm":
        return None
    native = _engine_method(r, engine, spec_tokens, speculative)
    if engine == "sglang":
        topk = r.int("speculative_eagle_topk", 1, minimum=1)
        draft = r.int("speculative_num_draft_tokens", None, minimum=1)
        if native is not None and draft is None:
            if topk > 1:
                raise WorkloadError(f"{r.at('speculative_num_draft_tokens')}: missing (needed with "
                                    f"speculative_eagle_topk={topk})")
            draft = spec_tokens + 1  # SGLang forces num_draft_tokens = num_steps + 1 with topk 1
        return EngineSettings(
            "sglang", tokens_per_request=draft if native is not None else 1, speculative_algorithm=native,
            mem_fraction_static=r.float("mem_fraction_static", None, minimum=0.0, maximum=1.0, exclusive_minimum=True),
            gpu_memory_mib=r.float("gpu_memory_mib", None, minimum=0.0, exclusive_minimum=True))
    return EngineSettings(
        "trtllm", tokens_per_request=1 + spec_tokens, decoding_type=native,
        enable_padding=r.bool("enable_padding", False),
        free_gpu_memory_fraction=r.float("free_gpu_memory_fraction", 0.9, minimum=0.0, maximum=1.0,
                                         exclusive_minimum=True))


def _parse_serving(r: FieldReader, speculative: SpeculativeSpec | None = None, engine: str = "vllm") -> ServingConfig:
    _engine_aliases(r, engine)
    max_num_seqs = r.int("max_num_seqs", minimum=1)
    spec_tokens = r.int("num_speculative_tokens", 0, minimum=0)
    mnbt = r.int("max_num_batched_tokens", 8192, minimum=1)
    max_model_len = r.int("max_model_len", 8192, minimum=1)
    util = r.float("gpu_memory_utilization", 0.9, minimum=0.0, maximum=1.0, exclusive_minimum=True)
    required_gib = r.float("required_kv_gib", None, minimum=0.0, exclusive_minimum=True)
    sizes = r.raw("cudagraph_capture_sizes")
    if sizes is not None:
        if (not isinstance(sizes, list) or not sizes
                or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in sizes)):
            raise WorkloadError(f"{r.at('cudagraph_capture_sizes')}: {sizes!r} must be a non-empty list of positive integers")
        sizes = tuple(sizes)
    schedule = r.raw("speculative_schedule")
    config = ServingConfig(
        max_num_seqs=max_num_seqs,
        num_speculative_tokens=spec_tokens,
        max_num_batched_tokens=mnbt,
        max_model_len=max_model_len,
        gpu_memory_utilization=util,
        required_kv_bytes=None if required_gib is None else int(required_gib * GIB),
        cudagraph_mode=r.str("cudagraph_mode", "FULL_AND_PIECEWISE", choices=CUDAGRAPH_MODES),
        performance_mode=r.str("performance_mode", "balanced", choices=PERFORMANCE_MODES),
        gpu_capability=_parse_capability(r, "gpu_capability"),
        max_cudagraph_capture_size=r.int("max_cudagraph_capture_size", None, minimum=1),
        cudagraph_capture_sizes=sizes,
        speculative_schedule=None if schedule is None else _parse_schedule(schedule, r.at("speculative_schedule")),
        enforce_eager=r.bool("enforce_eager", False),
        model_runner=r.str("model_runner", "auto", choices=MODEL_RUNNERS),
        estimate_cudagraph_memory=r.bool("estimate_cudagraph_memory", True),
        speculative_method=speculative.method if speculative else None,
        parallel_drafting=speculative.parallel_drafting if speculative else False,
        engine_settings=_parse_engine_settings(r, engine, spec_tokens, speculative),
    )
    r.done()
    if config.speculative_method is not None and spec_tokens == 0:
        raise WorkloadError(f"{r.at('num_speculative_tokens')}: 0 must be >= 1 with speculative.method="
                            f"{config.speculative_method!r}")
    try:
        config.runs_as(config.defaults().sizes)
    except ValueError as exc:
        raise WorkloadError(f"{r.path}: {exc}") from None
    return config


def _parse_distribution(r: FieldReader, upper: int, upper_name: str) -> Distribution:
    kind = r.str("kind", "uniform", choices=("uniform", "histogram"))
    if kind == "uniform":
        lo = r.int("min", 1, minimum=1)
        hi = r.int("max", minimum=1)
        if hi > upper:
            raise WorkloadError(f"{r.at('max')}: {hi} must be <= {upper_name}={upper}")
        if lo > hi:
            raise WorkloadError(f"{r.at('min')}: {lo} must be <= max={hi}")
        r.done()
        return Distribution("uniform", lo, hi)
    counts = r.raw("counts")
    where = r.at("counts")
    if not isinstance(counts, Mapping) or not counts:
        raise WorkloadError(f"{where}: {counts!r} must be a non-empty mapping of value: weight")
    pairs = []
    for key, weight in counts.items():
        try:
            value = int(key)
        except (TypeError, ValueError):
            raise WorkloadError(f"{where}.{key}: key must be a positive integer") from None
        if value < 1 or str(value) != str(key).strip():
            raise WorkloadError(f"{where}.{key}: key must be a positive integer")
        if value > upper:
            raise WorkloadError(f"{where}.{key}: {value} must be <= {upper_name}={upper}")
        if isinstance(weight, bool) or not isinstance(weight, int | float) or weight != weight or weight < 0:
            raise WorkloadError(f"{where}.{key}: {weight!r} must be a weight >= 0")
        pairs.append((value, float(weight)))
    if sum(w for _, w in pairs) <= 0:
        raise WorkloadError(f"{where}: weights must not all be 0")
    r.done()
    return Distribution("histogram", counts=tuple(sorted(pairs)))


def _read_trace(path: Path, where: str, serving: ServingConfig) -> tuple[tuple[int, bool], ...]:
    """Per-step CSV: `num_tokens`, optional `num_reqs` and `is_uniform_decode` (true/false/1/0)."""
    if not path.is_file():
        raise WorkloadError(f"{where}: {str(path)!r} is not a file")
    query_lens = serving.decode_query_lens()
    rows: list[tuple[int, bool]] = []
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        if not reader.fieldnames or "num_tokens" not in reader.fieldnames:
            raise WorkloadError(f"{where}: {path.name} needs a num_tokens column")
        for line, row in enumerate(reader, start=2):
            values: dict[str, int | None] = {}
            for column in ("num_tokens", "num_reqs"):
                text = row.get(column)
                if column == "num_reqs" and text in (None, ""):
                    values[column] = None
                    continue
                try:
                    values[column] = int(text)  # type: ignore[arg-type]
                except (TypeError, ValueError):
                    raise WorkloadError(f"{where}: {path.name} line {line}: {column}={text!r} must be an integer") \
                        from None
            tokens, reqs = values["num_tokens"], values["num_reqs"]
            assert tokens is not None
            if tokens < 1 or tokens > serving.max_num_batched_tokens:
                raise WorkloadError(
                    f"{where}: {path.name} line {line}: num_tokens={tokens} must be in "
                    f"1..max_num_batched_tokens={serving.max_num_batched_tokens}"
                )
            flag = (row.get("is_uniform_decode") or "").strip().lower()
            if flag:
                if flag not in ("true", "false", "1", "0"):
                    raise WorkloadError(f"{where}: {path.name} line {line}: is_uniform_decode={flag!r} must be true/false")
                uniform = flag in ("true", "1")
            elif reqs is not None:
                uniform = 1 <= reqs <= serving.max_num_seqs and tokens == reqs * query_lens[reqs]
            else:
                uniform = serving.decode_step(tokens) is not None
            rows.append((tokens, uniform))
    if not rows:
        raise WorkloadError(f"{where}: {path.name} has no steps")
    return tuple(rows)


def _parse_traffic(r: FieldReader, serving: ServingConfig, base_dir: Path) -> Traffic:
    mean_ctx = r.int("mean_context_len", 2048, minimum=1, maximum=serving.max_model_len)
    note = r.str("source_note", "")
    if r.has("trace"):
        path = base_dir / r.str("trace")
        trace = _read_trace(path, r.at("trace"), serving)
        r.done()
        return Traffic(mean_context_len=mean_ctx, trace=trace, source_note=note)
    if r.has("widths"):
        widths = _parse_distribution(r.sub("widths"), serving.max_num_batched_tokens, "max_num_batched_tokens")
        r.done()
        return Traffic(mean_context_len=mean_ctx, widths=widths, source_note=note)
    mixed_share = r.float("mixed_share", 0.0, minimum=0.0, maximum=1.0)
    requests = None
    if r.has("requests"):
        requests = _parse_distribution(r.sub("requests"), serving.max_num_seqs, "max_num_seqs")
        query_lens = serving.decode_query_lens()
        widest, n = max((n * query_lens[n], n) for n in requests.pmf())
        if widest > serving.max_num_batched_tokens:
            raise WorkloadError(
                f"{r.at('requests')}: {n} requests x q={query_lens[n]} = {widest} tokens "
                f"exceed max_num_batched_tokens={serving.max_num_batched_tokens}"
            )
    elif mixed_share < 1.0:
        raise WorkloadError(f"{r.at('requests')}: missing (needed unless mixed_share is 1, or trace/widths is given)")
    mixed = None
    if r.has("mixed_tokens"):
        mixed = _parse_distribution(r.sub("mixed_tokens"), serving.max_num_batched_tokens, "max_num_batched_tokens")
    elif mixed_share > 0:
        raise WorkloadError(f"{r.at('mixed_tokens')}: missing (needed when mixed_share > 0)")
    r.done()
    return Traffic(requests=requests, mixed_share=mixed_share, mixed_tokens=mixed, mean_context_len=mean_ctx,
                   source_note=note)


def parse_workload(data: object, *, base_dir: Path | None = None, path: Path | None = None) -> Workload:
    """Validate a workload mapping; raises WorkloadError naming the first bad field."""
    r = FieldReader(data, "")
    name = r.str("name")
    if not name or any(c in name for c in "/\\ \t\n"):
        raise WorkloadError(f"name: {name!r} must be non-empty without spaces or slashes")
    description = r.str("description", "")
    model = _parse_model(r.sub("model"))
    engine = r.str("engine", "vllm", choices=ENGINES)
    speculative = _parse_speculative(r.sub("speculative"), model) if r.has("speculative") else None
    serving = _parse_serving(r.sub("serving"), speculative, engine)
    traffic = _parse_traffic(r.sub("traffic"), serving, base_dir or Path.cwd())
    r.done()
    if model.shape.num_kv_heads % model.tensor_parallel_size and model.tensor_parallel_size < model.shape.num_kv_heads:
        raise WorkloadError(
            f"model.tensor_parallel_size: {model.tensor_parallel_size} must divide num_kv_heads={model.shape.num_kv_heads}"
        )
    return Workload(name=name, model=model, serving=serving, traffic=traffic, description=description, path=path,
                    spec=dict(data), speculative=speculative)  # type: ignore[arg-type]


def load_workload(path: str | Path) -> Workload:
    """Load and validate a workload YAML file (safe loader only: no tags, no code)."""
    p = Path(path)
    if not p.is_file():
        raise WorkloadError(f"workload: {str(p)!r} is not a file")
    try:
        # The C safe loader when present: same safety as yaml.safe_load, ~10x faster on the large
        # width histograms `cgtune workload from-metrics` writes.
        data = yaml.load(p.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise WorkloadError(f"workload: {p.name} is not valid YAML{where}") from None
    if data is None:
        raise WorkloadError(f"workload: {p.name} is empty (it needs name, model, serving and traffic)")
    if not isinstance(data, Mapping):
        raise WorkloadError(f"workload: {p.name} holds a YAML {type(data).__name__}: it must be a mapping of name, "
                            f"model, serving and traffic")
    return parse_workload(data, base_dir=p.parent, path=p)
