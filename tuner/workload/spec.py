"""Read and validate a workload file into its data: model shape, speculative setup, serving settings (read by the
workload's engine, `tuner.engines.engine`) and traffic (whose step distribution is `tuner.steps`')."""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.engines.engine import Deployment, Engine
from tuner.engines.registry import ENGINES, engine_class, engine_of
from tuner.engines.serving import ServingConfig
from tuner.engines.vllm.drafter import (
    DRAFT_CHECKPOINT_METHODS,
    MODEL_BASED_METHODS,
    PARALLEL_DRAFTING_METHODS,
    drafter_kv_bytes_per_token,
    drafter_kv_layers,
    drafter_shares,
    drafter_weight_bytes,
)
from tuner.engines.vllm.lora import lora_weight_bytes
from tuner.engines.vllm.runner import SPECULATIVE_METHODS
from tuner.fields import FieldReader, WorkloadError
from tuner.shapes import DTYPE_BYTES, PRESET_CHECKPOINTS, PRESETS, ModelShape
from tuner.workload.load import Load, parse_load
from tuner.steps import Distribution, Step, Traffic, step_distribution
from tuner.yaml_file import YamlFileError, read_yaml

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
    config: dict[str, Any] | None = field(default=None, compare=False, repr=False)
    """The model's Hugging Face config.json (`model.config`, or the one in a local `model.name` directory): the shape
    is read from it, and `cgtune profile --backend vllm` builds vLLM's model from it, dummy weights, no download."""
    config_path: str | None = None
    """Where `config` was read from."""

    @property
    def stand_in_gaps(self) -> list[str]:
        """What in the model the stand-in decoder cannot build (MoE, MLA, quantized weights, ...); empty when it can."""
        from tuner.workload.model_config import stand_in_gaps

        return stand_in_gaps(self.config) if self.config is not None else []

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
    model: str | None = None
    """The draft checkpoint the engine loads (`speculative.model`: a Hugging Face id or a path); None: not named (the
    emitted files then hold a value the engine refuses, with a comment saying what to put there)."""

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
    """Serving settings, as the workload's engine read them (`engine:`, default vllm)."""
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
    load: Load | None = None
    """The load the deployment will see (`traffic.load`: arrivals, prompt and output lengths, acceptance), which the
    load model (`tuner.load`) turns into the step distribution a list makes of it; None when the workload names none."""

    @property
    def engine(self) -> Engine:
        """The engine the workload deploys on, answering for its serving settings (`tuner.engines.registry`)."""
        return engine_of(self.serving)

    @property
    def deployment(self) -> Deployment:
        """What the engine's files must carry beyond the serving section: checkpoints, dtype, tensor parallelism."""
        return Deployment(checkpoint=self.model.checkpoint,
                          draft_checkpoint=self.speculative.model if self.speculative is not None else None,
                          dtype=self.model.dtype, tensor_parallel_size=self.model.tensor_parallel_size)

    @property
    def content_hash(self) -> str:
        """Stable 12-hex-digit hash of the spec and any trace it reads."""
        canonical = json.dumps(self.spec, sort_keys=True, default=str) + repr(self.traffic.trace)
        if self.model.config is not None:  # the model a config.json describes is part of what was measured
            canonical += json.dumps(self.model.config, sort_keys=True, default=str)
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

    def lora_weight_bytes(self) -> int:
        """Bytes of the LoRA weight buffers vLLM sets aside on one rank (`serving.enable_lora`; 0 without LoRA)."""
        lora, m = self.serving.lora, self.model
        if lora is None:
            return 0
        sh = m.shape
        return lora_weight_bytes(lora, hidden_size=sh.hidden_size, num_layers=sh.num_layers,
                                 num_attention_heads=sh.num_attention_heads, num_kv_heads=sh.num_kv_heads,
                                 head_dim=sh.head_dim, intermediate_size=sh.intermediate_size,
                                 vocab_size=sh.vocab_size, dtype_bytes=DTYPE_BYTES[m.dtype],
                                 tensor_parallel_size=m.tensor_parallel_size)

    def kv_bytes_per_token(self) -> int:
        """KV bytes one token costs on one rank: the target's layers and the drafter's (vLLM gives draft attention
        layers KV cache beside the target's)."""
        return self.model.kv_bytes_per_token() + self.drafter_kv_bytes_per_token()

    def kv_layer_groups(self) -> tuple[tuple[int, int, int, int], ...]:
        """`(attention layers, KV heads on one rank, head_dim, bytes per element)`: the target's, then the drafter's
        (where it has KV layers); `kv_bytes_per_token` is their 2 x layers x heads x head_dim x bytes summed."""
        m, tp, size = self.model, self.model.tensor_parallel_size, DTYPE_BYTES[self.model.dtype]
        groups = [(m.shape.num_layers, m.shape.kv_heads_per_rank(tp), m.shape.head_dim, size)]
        spec = self.speculative
        if spec is not None and spec.drafter is not None and spec.method is not None:
            layers = drafter_kv_layers(spec.method, spec.drafter.num_layers,
                                       num_nextn_predict_layers=spec.num_nextn_predict_layers)
            if layers:
                groups.append((layers, spec.drafter.kv_heads_per_rank(tp), spec.drafter.head_dim, size))
        return tuple(groups)

    @property
    def required_kv_bytes(self) -> int:
        """KV bytes the deployment needs: the explicit amount, else one max_model_len request; never less than the
        engine refuses to start below (vLLM: one request's whole blocks and the null block)."""
        return self.required_kv_bytes_at(self.kv_bytes_per_token())

    def required_kv_bytes_at(self, per_token: int) -> int:
        """`required_kv_bytes` for `per_token` KV bytes a token (a profile measured through vLLM records the engine's
        own figure, which holds for MLA, FP8 KV and MoE models the shape cannot describe)."""
        stated = self.serving.required_kv_bytes
        if stated is None:
            stated = self.serving.max_model_len * per_token
        return max(stated, self.engine.start_kv_bytes(per_token))

    def steps(self) -> list[Step]:
        """The step distribution (`tuner.steps`): `Step`s with probabilities summing to 1, sorted by width."""
        return step_distribution(self.traffic, self.engine.decode_query_lens())


# --------------------------------------------------------------------------- parsing
_SHAPE_INTS = ("hidden_size", "num_layers", "num_attention_heads", "num_kv_heads", "head_dim", "intermediate_size",
               "vocab_size")
"""The shape's widths a workload may give (over a preset's or a config.json's)."""


def _parse_model(r: FieldReader, base_dir: Path) -> ModelSpec:
    preset = r.str("preset", None)
    fields = (*_SHAPE_INTS, "rope_theta", "rms_norm_eps", "tie_word_embeddings", "qk_norm")  # a workload may set
    r.takes(*fields)
    explicit = {k: r.raw(k) for k in fields if r.has(k)}
    name = _checkpoint(r, "name", "my-org/llama-ft")
    config, config_path = _model_config(r, name, base_dir)
    if preset is not None:
        if preset not in PRESETS:
            raise WorkloadError(f"{r.at('preset')}: {preset!r} is not a known preset ({', '.join(sorted(PRESETS))})")
        if config is not None:
            raise WorkloadError(f"{r.at('preset')}: give a preset or a config.json ({config_path}), not both")
        base = PRESETS[preset].as_dict()
    elif config is not None:
        from tuner.workload.model_config import shape_from_config

        base = shape_from_config(config, r.at("config"))
    else:
        base = {}
    values: dict[str, Any] = {**base}
    for key in _SHAPE_INTS:
        if key in explicit or key not in base:
            values[key] = r.int(key, minimum=1)
    if "num_layers" in explicit and base.get("num_moe_layers"):
        raise WorkloadError(f"{r.at('num_layers')}: a MoE config.json's layer count cannot be changed here (which "
                            f"layers are MoE layers is read from the config); edit the config.json")
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
    for key in ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size"):
        if getattr(shape, key) % tp:
            raise WorkloadError(f"{r.at('tensor_parallel_size')}: {tp} must divide {key}={getattr(shape, key)}")
    r.done()
    return ModelSpec(shape=shape, preset=preset, dtype=dtype, tensor_parallel_size=tp, name=name, config=config,
                     config_path=config_path)


def _model_config(r: FieldReader, name: str | None, base_dir: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The model's config.json: `model.config` (a path, relative to the workload file), else the one in a local
    `model.name` directory; (None, None) when neither gives one."""
    from tuner.workload.model_config import read_config

    given = r.str("config", None)
    if given is not None:
        path = Path(given) if Path(given).is_absolute() else base_dir / given
        if path.is_dir():
            path = path / "config.json"
        return read_config(path, r.at("config")), str(path)
    if name is not None and (base_dir / name).is_dir() and (base_dir / name / "config.json").is_file():
        path = base_dir / name / "config.json"
        return read_config(path, r.at("name")), str(path)
    return None, None


def _checkpoint(r: FieldReader, key: str, example: str) -> str | None:
    """A checkpoint the engine loads (a Hugging Face id or a path), as it will stand on a command line."""
    name = r.str(key, None)
    if name is not None and (not name.strip() or name != name.strip() or "\n" in name):
        raise WorkloadError(f"{r.at(key)}: {name!r} must be a checkpoint name without surrounding spaces "
                            f"(e.g. {example})")
    return name


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
    if preset is None:
        values.update(_drafter_layers(method, values))
    shape = ModelShape(**values)
    if shape.num_attention_heads % shape.num_kv_heads:
        raise WorkloadError(f"{r.at('num_kv_heads')}: {shape.num_kv_heads} must divide num_attention_heads="
                            f"{shape.num_attention_heads}")
    tp = target.tensor_parallel_size
    if shape.num_attention_heads % tp or shape.intermediate_size % tp:
        raise WorkloadError(f"{r.path}: the drafter's heads ({shape.num_attention_heads}) and intermediate_size "
                            f"({shape.intermediate_size}) must divide by tensor_parallel_size={tp}")
    return shape


_TARGET_ONLY = ("num_experts", "moe_intermediate_size", "num_moe_layers", "shared_expert_intermediate_size",
                "shared_expert_gate", "router_bias", "router_quantized", "kv_lora_rank", "q_lora_rank",
                "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "quantization", "quant_block_n", "quant_block_k",
                "quant_static_activations", "weights_unsized", "kv_unsized")
"""The target's MoE, MLA and quantization fields: an MTP module's decoder layer has them; a separately trained
drafter (an EAGLE head, a DFlash drafter, a draft model) is a dense model in the model dtype."""


def _drafter_layers(method: str, values: dict[str, Any]) -> dict[str, Any]:
    """What the drafter's layers take of the target's MoE, MLA and quantization (see `_TARGET_ONLY`): an MTP module's
    layer is the target's kind of layer, a MoE layer when the target has experts (DeepSeek's MTP layers follow the
    last dense one, deepseek_mtp.py); any other drafter's layers are dense and unquantized."""
    if method == "mtp":
        return {"num_moe_layers": values["num_layers"] if values["num_experts"] else 0}
    defaults = ModelShape.__dataclass_fields__
    return {k: defaults[k].default for k in _TARGET_ONLY}


def _parse_speculative(r: FieldReader, target: ModelSpec) -> SpeculativeSpec:
    method = r.str("method", None, choices=SPECULATIVE_METHODS)
    parallel = r.bool("parallel_drafting", False)
    if parallel and method not in PARALLEL_DRAFTING_METHODS:
        # vLLM would accept the flag and quietly fall back to its V1 runner for it (config/vllm.py).
        raise WorkloadError(f"{r.at('parallel_drafting')}: true needs a drafter trained to draft in parallel "
                            f"(method {', '.join(PARALLEL_DRAFTING_METHODS)}), not method {method!r}")
    checkpoint = _checkpoint(r, "model", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")
    if checkpoint is not None and method not in DRAFT_CHECKPOINT_METHODS:
        raise WorkloadError(f"{r.at('model')}: {checkpoint!r} names a draft checkpoint, but method {method!r} has "
                            f"no draft model")
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
            drafter_shares(method, drafter, target.shape, shares_embedding=shares_embedding,
                           shares_lm_head=shares_lm_head)
        except ValueError as exc:
            raise WorkloadError(f"{sub.path}: {exc}") from None
    elif r.has("drafter"):
        raise WorkloadError(f"{r.at('drafter')}: method {method!r} has no draft model (model-free)")
    r.done()
    return SpeculativeSpec(method=method, parallel_drafting=parallel, drafter=drafter,
                           shares_embedding=shares_embedding, shares_lm_head=shares_lm_head,
                           num_nextn_predict_layers=predict_layers, model=checkpoint)


def _parse_serving(r: FieldReader, speculative: SpeculativeSpec | None, engine: str) -> ServingConfig:
    """The serving section, read by the workload's engine in its own words; a default list the engine refuses is
    refused here."""
    config = engine_class(engine).parse_serving(
        r, speculative_method=speculative.method if speculative else None,
        parallel_drafting=speculative.parallel_drafting if speculative else False)
    answers = engine_of(config)
    refusal = answers.config_refusal()  # the engine's own start-up checks: it would not start
    if refusal is not None:
        raise WorkloadError(refusal)
    try:
        answers.runs_as(answers.defaults().sizes)
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


def _read_trace(path: Path, where: str, serving: ServingConfig) -> tuple[tuple[int, bool, int | None], ...]:
    """Per-step CSV: `num_tokens`, optional `num_reqs` and `is_uniform_decode` (true/false/1/0); rows of `(num_tokens,
    uniform_decode, num_reqs or None)`."""
    if not path.is_file():
        raise WorkloadError(f"{where}: {str(path)!r} is not a file")
    engine = engine_of(serving)
    query_lens = engine.decode_query_lens()
    cap_name, budget_name = engine.field_name("max_num_seqs"), engine.field_name("max_num_batched_tokens")
    rows: list[tuple[int, bool, int | None]] = []
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
            at = f"{where}: {path.name} line {line}"
            if tokens < 1 or tokens > serving.max_num_batched_tokens:
                raise WorkloadError(f"{at}: num_tokens={tokens} must be in 1..{budget_name}="
                                    f"{serving.max_num_batched_tokens}")
            if reqs is not None:
                decode = 1 <= reqs <= serving.max_num_seqs and tokens == reqs * query_lens[reqs]
            else:
                decode = engine.decode_step(tokens) is not None
            flag = (row.get("is_uniform_decode") or "").strip().lower()
            if flag and flag not in ("true", "false", "1", "0"):
                raise WorkloadError(f"{at}: is_uniform_decode={flag!r} must be true/false")
            if flag in ("true", "1") and not decode:
                # A step the engine cannot run as a uniform decode step must not be costed as one.
                if reqs is None:
                    what = f"num_tokens={tokens} is no decode step of 1..{cap_name}={serving.max_num_seqs} requests"
                elif not 1 <= reqs <= serving.max_num_seqs:
                    what = f"num_reqs={reqs} must be in 1..{cap_name}={serving.max_num_seqs}"
                else:
                    what = (f"num_tokens={tokens} is not num_reqs={reqs} x q={query_lens[reqs]} = "
                            f"{reqs * query_lens[reqs]}")
                raise WorkloadError(f"{at}: is_uniform_decode={flag} but {what}: not a uniform decode step")
            if reqs is not None and not 1 <= reqs <= min(tokens, serving.max_num_seqs):
                raise WorkloadError(f"{at}: num_reqs={reqs} must be in 1..min(num_tokens={tokens}, "
                                    f"{cap_name}={serving.max_num_seqs})")
            rows.append((tokens, flag in ("true", "1") if flag else decode, reqs))
    if not rows:
        raise WorkloadError(f"{where}: {path.name} has no steps")
    return tuple(rows)


def _parse_active_loras(r: FieldReader, serving: ServingConfig) -> tuple[tuple[int, float], ...]:
    """`traffic.active_loras`: the share of steps with each count of distinct LoRA adapters active (0 to max_loras),
    required with `serving.enable_lora`, refused without it."""
    if serving.lora is None:
        if r.has("active_loras"):
            raise WorkloadError(f"{r.at('active_loras')}: an adapter mix, but serving.enable_lora is not true")
        return ()
    counts, where = r.raw("active_loras"), r.at("active_loras")
    top = serving.lora.max_loras
    if counts is None:
        raise WorkloadError(f"{where}: missing (with serving.enable_lora: the share of steps with 0..{top} adapters "
                            f"active, e.g. {{0: 0.2, 1: 0.5, {top}: 0.3}})")
    if not isinstance(counts, Mapping) or not counts:
        raise WorkloadError(f"{where}: {counts!r} must be a non-empty mapping of active adapters: weight")
    pairs = []
    for key, weight in counts.items():
        if isinstance(key, bool) or not isinstance(key, int | str) or not str(key).strip().isdigit():
            raise WorkloadError(f"{where}.{key}: key must be a count of adapters, 0 to max_loras={top}")
        value = int(key)
        if value > top:
            raise WorkloadError(f"{where}.{key}: {value} must be <= serving.max_loras={top} (vLLM runs at most "
                                f"max_loras adapters in one step)")
        if isinstance(weight, bool) or not isinstance(weight, int | float) or weight != weight or weight < 0:
            raise WorkloadError(f"{where}.{key}: {weight!r} must be a weight >= 0")
        pairs.append((value, float(weight)))
    if sum(w for _, w in pairs) <= 0:
        raise WorkloadError(f"{where}: weights must not all be 0")
    return tuple(sorted(pairs))


def _parse_traffic(r: FieldReader, serving: ServingConfig, base_dir: Path) -> Traffic:
    engine = engine_of(serving)
    cap_name, budget_name = engine.field_name("max_num_seqs"), engine.field_name("max_num_batched_tokens")
    adapters = _parse_active_loras(r, serving)
    mean_ctx = r.int("mean_context_len", 2048, minimum=1)
    if r.has("mean_context_len") and mean_ctx > serving.max_model_len:
        # Named with its bound: the user may have changed max_model_len, not this field.
        raise WorkloadError(f"{r.at('mean_context_len')}: {mean_ctx} must be <= serving.max_model_len="
                            f"{serving.max_model_len} (a request's context cannot exceed it)")
    note = r.str("source_note", "")
    if r.has("trace"):
        path = base_dir / r.str("trace")
        trace = _read_trace(path, r.at("trace"), serving)
        r.done()
        return Traffic(mean_context_len=mean_ctx, trace=trace, source_note=note, active_loras=adapters)
    if r.has("widths"):
        widths = _parse_distribution(r.sub("widths"), serving.max_num_batched_tokens, budget_name)
        r.done()
        return Traffic(mean_context_len=mean_ctx, widths=widths, source_note=note, active_loras=adapters)
    mixed_share = r.float("mixed_share", 0.0, minimum=0.0, maximum=1.0)
    requests = None
    if r.has("requests"):
        requests = _parse_distribution(r.sub("requests"), serving.max_num_seqs, cap_name)
        query_lens = engine.decode_query_lens()
        widest, n = max((n * query_lens[n], n) for n in requests.pmf())
        if widest > serving.max_num_batched_tokens:
            raise WorkloadError(
                f"{r.at('requests')}: {n} requests x q={query_lens[n]} = {widest} tokens "
                f"exceed {budget_name}={serving.max_num_batched_tokens}"
            )
    elif mixed_share < 1.0:
        raise WorkloadError(f"{r.at('requests')}: missing (needed unless mixed_share is 1, or trace/widths is given)")
    mixed = None
    if r.has("mixed_tokens"):
        mixed = _parse_distribution(r.sub("mixed_tokens"), serving.max_num_batched_tokens, budget_name)
    elif mixed_share > 0:
        raise WorkloadError(f"{r.at('mixed_tokens')}: missing (needed when mixed_share > 0)")
    r.done()
    return Traffic(requests=requests, mixed_share=mixed_share, mixed_tokens=mixed, mean_context_len=mean_ctx,
                   source_note=note, active_loras=adapters)


def parse_workload(data: object, *, base_dir: Path | None = None, path: Path | None = None) -> Workload:
    """Validate a workload mapping; raises WorkloadError naming the first bad field."""
    r = FieldReader(data, "")
    name = r.str("name")
    if not name or any(c in name for c in "/\\ \t\n"):
        raise WorkloadError(f"name: {name!r} must be non-empty without spaces or slashes")
    description = r.str("description", "")
    model = _parse_model(r.sub("model"), base_dir or Path.cwd())
    engine = r.str("engine", "vllm", choices=tuple(ENGINES))
    speculative = _parse_speculative(r.sub("speculative"), model) if r.has("speculative") else None
    serving = _parse_serving(r.sub("serving"), speculative, engine)
    traffic_r = r.sub("traffic")
    load = None
    if traffic_r.has("load"):
        load = parse_load(traffic_r.sub("load"), engine_of(serving).decode_query_len, serving.max_model_len,
                          base_dir or Path.cwd())
    traffic = _parse_traffic(traffic_r, serving, base_dir or Path.cwd())
    r.done()
    if serving.lora is not None and model.stand_in_gaps:
        raise WorkloadError(f"serving.enable_lora: true on a model with {model.stand_in_gaps[0]}: cgtune sizes vLLM's "
                            f"LoRA weight buffers for dense decoders only")
    if model.shape.num_kv_heads % model.tensor_parallel_size and model.tensor_parallel_size < model.shape.num_kv_heads:
        raise WorkloadError(
            f"model.tensor_parallel_size: {model.tensor_parallel_size} must divide num_kv_heads={model.shape.num_kv_heads}"
        )
    return Workload(name=name, model=model, serving=serving, traffic=traffic, description=description, path=path,
                    spec=dict(data), speculative=speculative, load=load)  # type: ignore[arg-type]


def load_workload(path: str | Path) -> Workload:
    """Load and validate a workload YAML file (`tuner.yaml_file`: UTF-8, safe loader only, no duplicate keys)."""
    p = Path(path)
    if not p.is_file():
        raise WorkloadError(f"workload: {str(p)!r} is not a file")
    try:
        data = read_yaml(p)
    except YamlFileError as exc:
        raise WorkloadError(f"workload: {exc}") from None
    if data is None:
        raise WorkloadError(f"workload: {p.name} is empty (it needs name, model, serving and traffic)")
    if not isinstance(data, Mapping):
        raise WorkloadError(f"workload: {p.name} holds a YAML {type(data).__name__}: it must be a mapping of name, "
                            f"model, serving and traffic")
    return parse_workload(data, base_dir=p.parent, path=p)
