"""vLLM's engine built in this process for a workload: the model directory it loads (the workload's own, or a
config.json written for it, dummy weights, no download), the engine arguments the workload's serving settings and the
candidate widths make, and the start-up log vLLM writes while it builds."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tuner.workload.spec import Workload

__all__ = ["StartupLines", "engine_args", "engine_environment", "environment", "model_source", "scratch_dir",
           "unsupported_reason"]

# The model-free methods whose target step is the same whoever drafts: vLLM is given ngram for them (the workload's
# q tokens per request in every decode step), as it needs a method to run q > 1.
_MODEL_FREE = (None, "ngram", "suffix")


def unsupported_reason(workload: Workload) -> str | None:
    """Why the vLLM backend cannot profile `workload` yet (None when it can)."""
    spec = workload.speculative
    if spec is not None and spec.drafter is not None:
        return (f"speculative.method {spec.method}: its draft model's passes are not measured through vLLM yet "
                f"(profile it with --backend stand-in)")
    if workload.engine.name != "vllm":
        return f"engine {workload.engine.name}: the vLLM backend measures vLLM's own runner (use --backend stand-in)"
    return None


def model_source(workload: Workload, scratch: Path) -> tuple[str, str]:
    """(the model directory vLLM loads, how cgtune made it): the workload's config.json (`model.config`, or a local
    `model.name` directory's), else the one its preset or shape fields describe, written under `scratch`. vLLM builds it
    with dummy weights, offline: a step's cost depends on the architecture and shapes, not on the weights' values."""
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
    model_dir = scratch / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(config, indent=1))
    return str(model_dir), how


def engine_args(workload: Workload, model: str, widths: Sequence[int], *, device: str, compile: bool,
                seed: int = 0) -> dict[str, Any]:
    """`LLM(**args)` for the workload: its serving settings, dummy weights, no tokenizer, cgtune's worker extension, and
    on CUDA the widths as the capture list (PIECEWISE and FULL graphs, as vLLM's default mode captures them)."""
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
    spec = workload.speculative
    if s.num_speculative_tokens and (spec is None or spec.method in _MODEL_FREE):
        args["speculative_config"] = {"method": "ngram", "num_speculative_tokens": s.num_speculative_tokens,
                                      "prompt_lookup_max": 4, "prompt_lookup_min": 1}
    return args


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
