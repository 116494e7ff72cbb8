"""Workload specs: model shape, vLLM serving config and traffic, validated on load, and the step-width
distribution every later stage weighs latencies by."""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tuner.models import DTYPE_BYTES, PRESETS, ModelShape
from tuner.vllm.defaults import (
    CUDAGRAPH_MODES,
    PERFORMANCE_MODES,
    CaptureDefaults,
    InvalidScheduleError,
    default_capture_sizes,
    dense_speculative_schedule,
)
from tuner.vllm.dispatch import Dispatcher

__all__ = [
    "Distribution",
    "ModelSpec",
    "ServingConfig",
    "Step",
    "Traffic",
    "Workload",
    "WorkloadError",
    "load_workload",
    "parse_workload",
]

GIB = 1 << 30


class WorkloadError(ValueError):
    """A workload field with a bad value; the message starts with the field path."""


# --------------------------------------------------------------------------- field readers
class _Reader:
    """Reads typed fields out of a mapping and names the full field path in every error."""

    def __init__(self, data: object, path: str) -> None:
        if not isinstance(data, Mapping):
            raise WorkloadError(f"{path or 'workload'}: {data!r} must be a mapping")
        self.data = data
        self.path = path
        self.used: set[str] = set()

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def raw(self, key: str, default: Any = None) -> Any:
        self.used.add(key)
        return self.data.get(key, default)

    def int(self, key: str, default: Any = ..., *, minimum: int | None = None, maximum: int | None = None) -> Any:
        value = self.raw(key)
        if value is None:
            if default is ...:
                raise WorkloadError(f"{self.at(key)}: missing (an integer is required)")
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise WorkloadError(f"{self.at(key)}: {value!r} must be an integer")
        if minimum is not None and value < minimum:
            raise WorkloadError(f"{self.at(key)}: {value} must be >= {minimum}")
        if maximum is not None and value > maximum:
            raise WorkloadError(f"{self.at(key)}: {value} must be <= {maximum}")
        return value

    def float(self, key: str, default: Any = ..., *, minimum: float | None = None, maximum: float | None = None,
              exclusive_minimum: bool = False) -> Any:
        value = self.raw(key)
        if value is None:
            if default is ...:
                raise WorkloadError(f"{self.at(key)}: missing (a number is required)")
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
            raise WorkloadError(f"{self.at(key)}: {value!r} must be a number")
        if minimum is not None and (value <= minimum if exclusive_minimum else value < minimum):
            raise WorkloadError(f"{self.at(key)}: {value} must be {'>' if exclusive_minimum else '>='} {minimum}")
        if maximum is not None and value > maximum:
            raise WorkloadError(f"{self.at(key)}: {value} must be <= {maximum}")
        return float(value)

    def str(self, key: str, default: Any = ..., *, choices: tuple[str, ...] | None = None) -> Any:
        value = self.raw(key)
        if value is None:
            if default is ...:
                raise WorkloadError(f"{self.at(key)}: missing (a string is required)")
            return default
        if not isinstance(value, str):
            raise WorkloadError(f"{self.at(key)}: {value!r} must be a string")
        if choices is not None and value not in choices:
            raise WorkloadError(f"{self.at(key)}: {value!r} must be one of {', '.join(choices)}")
        return value

    def bool(self, key: str, default: bool) -> bool:
        value = self.raw(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise WorkloadError(f"{self.at(key)}: {value!r} must be true or false")
        return value

    def sub(self, key: str) -> _Reader:
        return _Reader(self.raw(key), self.at(key))

    def done(self) -> None:
        unknown = sorted(set(map(str, self.data)) - self.used)
        if unknown:
            raise WorkloadError(f"{self.at(unknown[0])}: unknown field")


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

    @property
    def label(self) -> str:
        return self.preset or "custom"

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

    @property
    def decode_query_len(self) -> int:
        return 1 + self.num_speculative_tokens

    def decode_query_lens(self) -> list[int]:
        """Tokens per request in a decode step of n requests (index n; index 0 unused): 1 + K(n) with K from the
        dynamic speculative schedule (vLLM's dense lookup; an invalid schedule is ignored, as vLLM does), else q."""
        if self.speculative_schedule and self.num_speculative_tokens > 0:
            try:
                dense = dense_speculative_schedule(
                    [list(e) for e in self.speculative_schedule], self.max_num_seqs, self.num_speculative_tokens)
                return [1 + k for k in dense]
            except InvalidScheduleError:
                pass
        return [self.decode_query_len] * (self.max_num_seqs + 1)

    def defaults(self) -> CaptureDefaults:
        """vLLM's capture list for this config."""
        return default_capture_sizes(
            self.max_num_seqs,
            self.num_speculative_tokens,
            self.max_num_batched_tokens,
            gpu_capability=self.gpu_capability,
            performance_mode=self.performance_mode,
            cudagraph_mode=self.cudagraph_mode,
            max_cudagraph_capture_size=self.max_cudagraph_capture_size,
            cudagraph_capture_sizes=self.cudagraph_capture_sizes,
            speculative_schedule=[list(e) for e in self.speculative_schedule] if self.speculative_schedule else None,
            enforce_eager=self.enforce_eager,
        )

    def dispatcher(self, capture_sizes: list[int] | tuple[int, ...]) -> Dispatcher:
        """How vLLM would dispatch steps with this capture list."""
        mode = "NONE" if self.enforce_eager else self.cudagraph_mode
        return Dispatcher(
            capture_sizes, cudagraph_mode=mode, decode_query_len=self.decode_query_len, max_num_seqs=self.max_num_seqs
        )


@dataclass(frozen=True)
class Distribution:
    """A distribution over positive integers: uniform over [min, max] or a weighted histogram."""

    kind: str
    """`uniform` or `histogram`."""
    min: int = 1
    """Smallest value (uniform)."""
    max: int = 1
    """Largest value (uniform)."""
    counts: tuple[tuple[int, float], ...] = ()
    """`(value, weight)` pairs (histogram); weights need not sum to 1."""

    def pmf(self) -> dict[int, float]:
        """Probability of each value."""
        if self.kind == "uniform":
            n = self.max - self.min + 1
            return {v: 1.0 / n for v in range(self.min, self.max + 1)}
        total = sum(w for _, w in self.counts)
        return {v: w / total for v, w in self.counts if w > 0}

    @property
    def largest(self) -> int:
        return self.max if self.kind == "uniform" else max(v for v, w in self.counts if w > 0)


@dataclass(frozen=True)
class Step:
    """One kind of engine step and how often it happens."""

    num_tokens: int
    """Tokens in the step (its width)."""
    uniform_decode: bool
    """Every request contributes exactly q tokens (FULL decode graphs apply)."""
    probability: float
    """Share of steps of this kind."""


@dataclass(frozen=True)
class Traffic:
    """What the engine's steps look like."""

    requests: Distribution | None = None
    """Requests in a uniform decode step (width = requests x q)."""
    mixed_share: float = 0.0
    """Share of steps that are mixed (prefill chunks with decodes): no uniform decode graph applies."""
    mixed_tokens: Distribution | None = None
    """Tokens in a mixed step."""
    mean_context_len: int = 2048
    """Mean tokens already in each request's KV cache during decode (attention cost)."""
    widths: Distribution | None = None
    """Observed step widths (tokens per step), e.g. from vLLM's iteration-tokens histogram."""
    trace: tuple[tuple[int, bool], ...] = ()
    """Per-step `(num_tokens, uniform_decode)` rows from a CSV trace."""
    source_note: str = ""
    """How the traffic was obtained and what was assumed (free text)."""


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

    @property
    def content_hash(self) -> str:
        """Stable 12-hex-digit hash of the spec and any trace it reads."""
        canonical = json.dumps(self.spec, sort_keys=True, default=str) + repr(self.traffic.trace)
        return hashlib.sha256(canonical.encode()).hexdigest()[:12]

    @property
    def required_kv_bytes(self) -> int:
        """KV bytes the deployment needs: the explicit amount, else one max_model_len request."""
        if self.serving.required_kv_bytes is not None:
            return self.serving.required_kv_bytes
        return self.serving.max_model_len * self.model.kv_bytes_per_token()

    def steps(self) -> list[Step]:
        """The step-width distribution: `Step`s with probabilities summing to 1, sorted by width."""
        s = self.serving
        q = s.decode_query_len
        t = self.traffic
        probs: dict[tuple[int, bool], float] = {}

        def add(width: int, uniform: bool, p: float) -> None:
            if p > 0:
                probs[(width, uniform)] = probs.get((width, uniform), 0.0) + p

        if t.trace:
            for width, uniform in t.trace:
                add(width, uniform, 1.0 / len(t.trace))
        elif t.widths is not None:
            # A width histogram does not say which steps were pure decode; assume the multiples of q
            # that fit max_num_seqs requests were (vLLM's metric has no such label).
            for width, p in t.widths.pmf().items():
                add(width, width % q == 0 and width // q <= s.max_num_seqs, p)
        else:
            decode_share = 1.0 - t.mixed_share
            if t.requests is not None:
                query_lens = s.decode_query_lens()
                for n, p in t.requests.pmf().items():
                    # vLLM counts a step as uniform decode (FULL decode graphs) only at the configured q; a
                    # dynamic schedule's shorter drafts make the step dispatch like a mixed batch.
                    add(n * query_lens[n], query_lens[n] == q, decode_share * p)
            if t.mixed_tokens is not None:
                for width, p in t.mixed_tokens.pmf().items():
                    add(width, False, t.mixed_share * p)
        return [Step(w, u, p) for (w, u), p in sorted(probs.items())]


# --------------------------------------------------------------------------- parsing
def _parse_model(r: _Reader) -> ModelSpec:
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
    r.done()
    return ModelSpec(shape=shape, preset=preset, dtype=dtype, tensor_parallel_size=tp)


def _parse_capability(r: _Reader, key: str) -> tuple[int, int]:
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


def _parse_serving(r: _Reader) -> ServingConfig:
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
    )
    r.done()
    try:
        config.defaults()
    except ValueError as exc:
        raise WorkloadError(f"{r.path}: {exc}") from None
    return config


def _parse_distribution(r: _Reader, upper: int, upper_name: str) -> Distribution:
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
    q = serving.decode_query_len
    rows: list[tuple[int, bool]] = []
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        if not reader.fieldnames or "num_tokens" not in reader.fieldnames:
            raise WorkloadError(f"{where}: {path.name} needs a num_tokens column")
        for line, row in enumerate(reader, start=2):
            try:
                tokens = int(row["num_tokens"])
                reqs = int(row["num_reqs"]) if row.get("num_reqs") not in (None, "") else None
            except ValueError:
                raise WorkloadError(f"{where}: {path.name} line {line}: counts must be integers") from None
            if tokens < 1 or tokens > serving.max_num_batched_tokens:
                raise WorkloadError(
                    f"{where}: {path.name} line {line}: num_tokens={tokens} must be in 1..max_num_batched_tokens"
                )
            flag = (row.get("is_uniform_decode") or "").strip().lower()
            if flag:
                if flag not in ("true", "false", "1", "0"):
                    raise WorkloadError(f"{where}: {path.name} line {line}: is_uniform_decode={flag!r} must be true/false")
                uniform = flag in ("true", "1")
            elif reqs is not None:
                uniform = tokens == reqs * q
            else:
                uniform = tokens % q == 0 and tokens // q <= serving.max_num_seqs
            rows.append((tokens, uniform))
    if not rows:
        raise WorkloadError(f"{where}: {path.name} has no steps")
    return tuple(rows)


def _parse_traffic(r: _Reader, serving: ServingConfig, base_dir: Path) -> Traffic:
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
    r = _Reader(data, "")
    name = r.str("name")
    if not name or any(c in name for c in "/\\ \t\n"):
        raise WorkloadError(f"name: {name!r} must be non-empty without spaces or slashes")
    description = r.str("description", "")
    model = _parse_model(r.sub("model"))
    serving = _parse_serving(r.sub("serving"))
    traffic = _parse_traffic(r.sub("traffic"), serving, base_dir or Path.cwd())
    r.done()
    if model.shape.num_kv_heads % model.tensor_parallel_size and model.tensor_parallel_size < model.shape.num_kv_heads:
        raise WorkloadError(
            f"model.tensor_parallel_size: {model.tensor_parallel_size} must divide num_kv_heads={model.shape.num_kv_heads}"
        )
    return Workload(name=name, model=model, serving=serving, traffic=traffic, description=description, path=path,
                    spec=dict(data))  # type: ignore[arg-type]


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
    return parse_workload(data, base_dir=p.parent, path=p)
