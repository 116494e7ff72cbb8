"""The serving settings of a workload as its engine parsed them: data only, under vLLM's names where every engine
has the setting (request cap, token budget, draft tokens, context length), vLLM's own settings beside them, and the
engine's own in `engine_settings`. What an engine does with them is its `tuner.engines.engine.Engine`'s to answer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tuner.engines.vllm.defaults import CUDAGRAPH_MODES, PERFORMANCE_MODES
from tuner.engines.vllm.drafter import MODEL_BASED_METHODS
from tuner.engines.vllm.lora import LORA_FIELDS, LoraSettings, read_lora
from tuner.engines.vllm.runner import MODEL_RUNNERS
from tuner.engines.vllm.v034.settings import SETTING_FIELDS as VLLM_034_FIELDS
from tuner.engines.vllm.v034.settings import read_034_settings
from tuner.engines.vllm.versions import VERSIONS, VersionConflict, version_choice
from tuner.fields import FieldReader, WorkloadError

__all__ = ["MAX_CAPABILITY_MAJOR", "VLLM_ONLY_FIELDS", "ServingConfig", "parse_capability", "read_serving"]

GIB = 1 << 30

VLLM_ONLY_FIELDS = ("gpu_memory_utilization", "cudagraph_mode", "performance_mode", "max_cudagraph_capture_size",
                    "cudagraph_capture_sizes", "speculative_schedule", "model_runner", "estimate_cudagraph_memory",
                    "vllm_version", "data_parallel_size", *LORA_FIELDS, *VLLM_034_FIELDS)
"""Serving fields only vLLM has: another engine's workload may not set them."""


@dataclass(frozen=True)
class ServingConfig:
    """The serving fields that decide capture sizes, dispatch and the KV budget, as the workload's engine read them."""

    max_num_seqs: int
    """Most requests in one engine step (`--max-num-seqs`)."""
    num_speculative_tokens: int = 0
    """Draft tokens per request per step; decode query length q = 1 + this unless the engine resolved
    `tokens_per_request` otherwise."""
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
    engine: str = "vllm"
    """The engine the workload deploys on (the workload's `engine:`; a key of `tuner.engines.registry.ENGINES`)."""
    tokens_per_request: int | None = None
    """Tokens one request puts in a decode step as the engine resolved its speculative settings (SGLang:
    speculative_num_draft_tokens); None: 1 + num_speculative_tokens."""
    engine_settings: Any = None
    """The engine's own settings (a frozen dataclass of its rulebook; None: it has none beyond these). vLLM 0.34: its
    split capture knobs and extensible KV cache (`tuner.engines.vllm.v034.settings.Vllm034Settings`)."""
    vllm_version: str | None = None
    """The vLLM release the deployment runs (`tuner.engines.vllm.versions.VERSIONS`), as the workload resolved it;
    None: resolved when the engine is bound (`resolve_version`: --vllm-version, the installed vLLM, the default)."""
    vllm_version_why: str | None = field(default=None, compare=False)
    """Why that release, in words every emitted file and the console carry (`version_choice`): pinned by the workload,
    --vllm-version, the run's record, the installed vLLM or the default; None where the workload named no vLLM."""
    lora: LoraSettings | None = None
    """The LoRA adapters served (`enable_lora` and its settings); None: no LoRA."""
    data_parallel_size: int = 1
    """`--data-parallel-size`: engine ranks that each run a share of the requests and agree on every step's padded
    width (this configuration is one rank's)."""

    @property
    def decode_query_len(self) -> int:
        """Tokens per request in a uniform decode step (and per request in a decode graph)."""
        return self.tokens_per_request if self.tokens_per_request is not None else 1 + self.num_speculative_tokens


def read_serving(r: FieldReader, *, speculative_method: str | None, parallel_drafting: bool, engine: str = "vllm",
                 own: Callable[[int], tuple[Any, int, int]] | None = None) -> ServingConfig:
    """The serving section's fields under vLLM's names (an engine's own names already read into them), then the
    engine's own settings: `own(num_speculative_tokens)` gives `(engine_settings, tokens_per_request,
    num_speculative_tokens)`, the last two as the engine resolves its speculative numbers."""
    max_num_seqs = r.int("max_num_seqs", minimum=1)
    spec_tokens = r.int("num_speculative_tokens", 0, minimum=0)
    mnbt = r.int("max_num_batched_tokens", 8192, minimum=1)
    if engine == "vllm" and max_num_seqs > mnbt:
        # vLLM's SchedulerConfig refuses it at start-up ("max_num_batched_tokens (...) must be greater than or equal to
        # max_num_seqs (...)"); a step never holds more requests than tokens.
        raise WorkloadError(f"{r.at('max_num_seqs')}: {max_num_seqs} must be <= max_num_batched_tokens={mnbt} (vLLM "
                            f"refuses a max_num_seqs above max_num_batched_tokens at start-up)")
    try:  # vLLM's own refusal first; then the most cgtune models
        check_max_num_seqs(max_num_seqs, r.at("max_num_seqs"))
    except ValueError as exc:
        raise WorkloadError(str(exc)) from None
    max_model_len = r.int("max_model_len", 8192, minimum=1)
    version, version_why = _vllm_version(r) if engine == "vllm" else (None, None)
    settings_034 = read_034_settings(r) if engine == "vllm" else None
    if version == "0.33":
        given = [key for key in VLLM_034_FIELDS if r.has(key)]
        if given:
            raise WorkloadError(f"{r.at(given[0])}: a vLLM 0.34 setting, but serving.vllm_version is 0.33 (0.33 "
                                f"captures one list: cudagraph_capture_sizes)")
    # vLLM 0.34 requests all device memory by default where its KV cache is sized after capture (0.92 without).
    util_default = 0.9 if version != "0.34" else (1.0 if settings_034 and settings_034.extensible_kv_cache else 0.92)
    util = r.float("gpu_memory_utilization", util_default, minimum=0.0, maximum=1.0, exclusive_minimum=True)
    required_gib = r.float("required_kv_gib", None, minimum=0.0, exclusive_minimum=True)
    sizes = r.raw("cudagraph_capture_sizes")
    if sizes is not None:
        if (not isinstance(sizes, list) or not sizes
                or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in sizes)):
            raise WorkloadError(f"{r.at('cudagraph_capture_sizes')}: {sizes!r} must be a non-empty list of positive "
                                f"integers")
        sizes = tuple(sizes)
    schedule = r.raw("speculative_schedule")
    shared = dict(
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
        data_parallel_size=r.int("data_parallel_size", 1, minimum=1),
    )
    if engine == "vllm":
        drafter = speculative_method in MODEL_BASED_METHODS
        if shared["data_parallel_size"] > 1 and drafter:
            raise WorkloadError(f"{r.at('data_parallel_size')}: {shared['data_parallel_size']} with the "
                                f"{speculative_method} drafter: cgtune does not model the drafter's passes across "
                                f"data-parallel ranks")
        lora = shared["lora"] = read_lora(r, speculative_method=speculative_method, model_based_drafter=drafter)
        if lora is not None and spec_tokens and mnbt < max_num_seqs * (spec_tokens + 1):
            # EngineArgs.create_engine_config refuses it ("Consider increasing max_num_batched_tokens or decreasing
            # num_speculative_tokens").
            raise WorkloadError(f"{r.at('max_num_batched_tokens')}: {mnbt} must be >= max_num_seqs x (1 + "
                                f"num_speculative_tokens) = {max_num_seqs * (spec_tokens + 1)} with LoRA (vLLM refuses "
                                f"less at start-up)")
    settings, tokens_per_request = (settings_034 if version == "0.34" else None), None
    if own is not None:
        settings, tokens_per_request, shared["num_speculative_tokens"] = own(spec_tokens)
    config = ServingConfig(**shared, speculative_method=speculative_method, parallel_drafting=parallel_drafting,
                           engine=engine, tokens_per_request=tokens_per_request, engine_settings=settings,
                           vllm_version=version, vllm_version_why=version_why)
    r.done()
    if config.speculative_method is not None and config.decode_query_len <= 1:
        raise WorkloadError(f"{r.at('num_speculative_tokens')}: {spec_tokens} must be >= 1 with speculative.method="
                            f"{config.speculative_method!r}")
    return config


def _vllm_version(r: FieldReader) -> tuple[str, str]:
    """`serving.vllm_version` resolved (`auto` or absent: --vllm-version, the installed vLLM, the default), and why
    (`version_choice`). A conflicting --vllm-version is refused as it stands (VersionConflict names the flag)."""
    value = r.raw("vllm_version", "auto")
    # YAML reads an unquoted 0.34 as a number: the version it spells.
    requested = f"{value:g}" if isinstance(value, float) else value
    if requested not in ("auto", *VERSIONS):
        raise WorkloadError(f"{r.at('vllm_version')}: {value!r} must be one of auto, {', '.join(VERSIONS)} (the vLLM "
                            f"releases cgtune speaks; another version's rules are not modelled)")
    try:
        return version_choice(requested)
    except VersionConflict:
        raise
    except ValueError as exc:
        raise WorkloadError(f"{r.at('vllm_version')}: {exc}") from None


MAX_NUM_SEQS = 1 << 16
"""The most requests per step cgtune models (vLLM's defaults are 256 to 1024): every request count up to max_num_seqs is
a decode step the cost model weighs and a decode size it may offer, so the work grows with it; a larger value is a typo
that would run for hours, not a deployment."""


def check_max_num_seqs(value: int, where: str) -> int:
    """`value` when cgtune models that many requests per step; else ValueError naming `where` and the value."""
    if value > MAX_NUM_SEQS:
        raise ValueError(f"{where}: {value} must be <= {MAX_NUM_SEQS} (the most requests per step cgtune models; "
                         f"vLLM's defaults are 256 to 1024)")
    return value


MAX_CAPABILITY_MAJOR = 12
"""The newest CUDA compute capability generation (12.x: consumer Blackwell); a larger one is a typo, not a GPU."""


def parse_capability(text: str) -> tuple[int, int]:
    """A CUDA compute capability written `major.minor` (9.0, 10.0); ValueError saying what it must look like."""
    try:
        major, minor = (int(p) for p in text.split("."))
    except ValueError:
        raise ValueError("must look like 9.0 (major.minor)") from None
    if not 1 <= major <= MAX_CAPABILITY_MAJOR or not 0 <= minor <= 9:
        raise ValueError(f"is not a CUDA compute capability (1.0 to {MAX_CAPABILITY_MAJOR}.9: 9.0 for H100/H200, "
                         f"10.0 for B200)")
    return major, minor


def _parse_capability(r: FieldReader, key: str) -> tuple[int, int]:
    value = r.raw(key, "9.0")
    try:
        return parse_capability(str(value))
    except ValueError as exc:
        raise WorkloadError(f"{r.at(key)}: {value!r} {exc}") from None


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
