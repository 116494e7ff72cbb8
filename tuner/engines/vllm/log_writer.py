"""vLLM 0.33's or 0.34's start-up log for a list, written as vLLM writes it: the release's own format strings (0.33.0's
quoted in tuner/engines/vllm/log_lines.py with its file and line in vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl,
0.34.0's in tuner/engines/vllm/v034/log_lines.py) through vLLM's own log-line format (vllm/logger.py:28 `_FORMAT`, the
same in both) by the standard `logging.Formatter`, as vLLM's handler formats them. The figures in it are the caller's
(data in, no run read here): the no-GPU example's stand-in for a real start-up (`cgtune example`) and the `cgtune
check` tests' fixtures. Never a measurement."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

# The format strings, verbatim, live beside it (the report predicts the lines with them): imported, not retyped.
from tuner.engines.vllm.log_lines import (CAPTURE, ENGINE_CONFIG, ESTIMATE_DISABLED, GIB, KV_AVAILABLE, KV_RESERVED_AT,
                                          KV_SIZE, LOADING, MODEL_LOADING, NON_DEFAULT_ARGS, POOL, UTIL_HINT,
                                          V1_ESTIMATE, V2_RUNNER, WARMUP, format_gib, kv_reserved_line)
from tuner.engines.vllm.v034 import log_lines as v034
from tuner.engines.vllm.v034.dispatch import split_keys

__all__ = ["GIB", "VllmWorker", "compilation_fields_034", "default_record_034", "format_gib", "startup_log",
           "startup_log_034"]

# vllm/logger.py:28-32 (VLLM_LOGGING_PREFIX prepended) and :33.
_FORMAT = "(%(vllm_process_name)s pid=%(process)d) %(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s"
_DATE_FORMAT = "%m-%d %H:%M:%S"
# vllm/logging_utils/formatter.py ColoredFormatter: cyan process tag, grey time and file, green INFO.
_CYAN, _GREY, _GREEN, _RESET, _TAG_RESET = "\033[0;36m", "\033[90m", "\033[32m", "\033[0m", "\033[0;0m"


def _memory_summary(*, free: float, total: float, util: float, requested: float, consumed: float, activation: float,
                    graphs: float, kv: float) -> str:
    """The f-string of v1/worker/gpu_worker.py:1044-1064 (logged at :1066), redundancy buffer 150 MiB (:1032)."""
    to_requested = int(requested - consumed - activation - graphs - 150 * (1 << 20))
    to_gpu = int(free - consumed - activation - graphs - 150 * (1 << 20))
    return (f"Free memory on device ({format_gib(free)}/{format_gib(total)} GiB) on startup. Desired GPU memory "
            f"utilization is ({util}, {format_gib(requested)} GiB). Actual usage is {format_gib(consumed)} GiB for "
            f"consumed memory (weights + non-torch), {format_gib(activation)} GiB for peak activation, and "
            f"{format_gib(graphs)} GiB for CUDAGraph memory. Replace gpu_memory_utilization config with "
            f"`--kv-cache-memory={to_requested}` ({format_gib(to_requested)} GiB) to fit into requested memory, or "
            f"`--kv-cache-memory={to_gpu}` ({format_gib(to_gpu)} GiB) to fully utilize gpu memory. Current kv cache "
            f"memory in use is {format_gib(kv)} GiB.")


def _compilation_config(sizes: list[int], mode: str) -> str:
    """CompilationConfig.__repr__ (vllm/config/compilation.py:824), as printed by running it from the 0.33.0 wheel,
    with the mode and the list put in."""
    mode_value = {"NONE": "0", "PIECEWISE": "1", "FULL": "2", "FULL_DECODE_ONLY": "(2, 0)",
                  "FULL_AND_PIECEWISE": "(2, 1)"}[mode]
    return ("{'mode': <CompilationMode.VLLM_COMPILE: 3>, 'debug_dump_path': None, 'cache_dir': '', "
            "'compile_cache_save_format': 'binary', 'backend': 'inductor', 'custom_ops': ['none'], "
            "'ir_enable_torch_wrap': None, 'splitting_ops': ['vllm::unified_attention'], 'compile_mm_encoder': False, "
            "'cudagraph_mm_encoder': False, 'encoder_cudagraph_token_budgets': [], "
            "'encoder_cudagraph_max_vision_items_per_batch': 0, 'encoder_cudagraph_max_frames_per_batch': None, "
            "'cudagraph_decoder_replay': True, 'decoder_replay_cudagraph_capture_sizes': [], "
            "'decoder_replay_trim_threshold': 768, 'compile_sizes': [], 'compile_ranges_endpoints': [8192], "
            "'inductor_compile_config': {'enable_auto_functionalized_v2': False, 'combo_kernels': True, "
            "'benchmark_combo_kernel': True}, 'inductor_passes': {}, "
            f"'cudagraph_mode': <CUDAGraphMode.{mode}: {mode_value}>, 'cudagraph_num_of_warmups': 1, "
            f"'cudagraph_capture_sizes': {sizes}, 'cudagraph_copy_inputs': False, 'cudagraph_specialize_lora': True, "
            f"'use_inductor_graph_partition': False, 'pass_config': {{}}, "
            f"'max_cudagraph_capture_size': {max(sizes, default=0)}, 'dynamic_shapes_config': {{'type': "
            "<DynamicShapesType.BACKED: 'backed'>, 'evaluate_guards': False, 'assume_32_bit_indexing': False}, "
            "'local_cache_dir': None, 'fast_moe_cold_start': None, 'static_all_moe_layers': []}")


def _engine_config(*, compilation: str, method: str | None, k: int, tp: int, max_model_len: int,
                   enforce_eager: bool) -> str:
    """VllmConfig.__str__ (vllm/config/vllm.py:2809; 0.34.0: :2890, the same fields in the same order), with the
    compilation config's repr given; the speculative config as SpeculativeConfig.__repr__ (vllm/config/
    speculative.py:2196; 0.34.0: :1829, the same format) writes it."""
    model = "meta-llama/Llama-3.1-8B-Instruct"
    draft = None if method in (None, "ngram", "suffix") else "z-lab/dflash-draft"
    spec = "None" if method is None else f"SpeculativeConfig(method={method!r}, model={draft!r}, num_spec_tokens={k})"
    return (f"model={model!r}, speculative_config={spec}, tokenizer={model!r}, skip_tokenizer_init=False, "
            f"tokenizer_mode=auto, revision=None, tokenizer_revision=None, trust_remote_code=False, "
            f"dtype=torch.bfloat16, "
            f"max_seq_len={max_model_len}, download_dir=None, load_format=auto, tensor_parallel_size={tp}, "
            f"pipeline_parallel_size=1, data_parallel_size=1, decode_context_parallel_size=1, dcp_comm_backend=ag_rs, "
            f"disable_custom_all_reduce=False, quantization=None, quantization_config=None, "
            f"enforce_eager={enforce_eager}, aux_output_config=None, kv_cache_dtype=auto, device_config=cuda, "
            f"structured_outputs_config=StructuredOutputsConfig(backend='auto'), "
            f"observability_config=ObservabilityConfig(), seed=0, served_model_name={model}, "
            f"enable_prefix_caching=True, enable_chunked_prefill=True, pooler_config=None, "
            f"compilation_config={compilation}, kernel_config=KernelConfig()")


class _Writer:
    """Formats records as vLLM's handler does."""

    def __init__(self, prefix: str, color: bool) -> None:
        fmt = prefix + _FORMAT
        if color:  # ColoredFormatter.__init__'s replacements
            fmt = fmt.replace("(%(vllm_process_name)s pid=%(process)d)",
                              f"{_CYAN}(%(vllm_process_name)s pid=%(process)d){_TAG_RESET}")
            fmt = fmt.replace("%(asctime)s", f"{_GREY}%(asctime)s{_RESET}")
            fmt = fmt.replace("[%(fileinfo)s:%(lineno)d]", f"{_GREY}[%(fileinfo)s:%(lineno)d]{_RESET}")
        self.color = color
        self.formatter = logging.Formatter(fmt, _DATE_FORMAT)
        self.lines: list[str] = []

    def log(self, process: tuple[str, int], where: str, msg: str, *args: object, level: str = "INFO") -> None:
        filename, lineno = where.split(":")
        record = logging.LogRecord("vllm", getattr(logging, level), filename, int(lineno), msg, args or None, None)
        record.created = 1_790_000_000.0 + len(self.lines)  # a fixed clock: the fixtures do not change between runs
        record.vllm_process_name, record.process, record.fileinfo = process[0], process[1], filename
        if self.color:
            record.levelname = f"{_GREEN if level == 'INFO' else ''}{level}{_RESET}"
        self.lines.append(self.formatter.format(record))

    def text(self, end_after: str | None) -> str:
        """The log, cut after the first line holding `end_after` when given."""
        lines = self.lines
        if end_after is not None:
            lines = lines[:next(i for i, line in enumerate(lines) if end_after in line) + 1]
        return "\n".join(lines) + "\n"


@dataclass
class VllmWorker:
    """The figures one worker logs (bytes and seconds)."""

    kv_available_bytes: float
    estimate_bytes: float
    """Neither is logged by a pinned start-up (`kv_cache_memory_bytes`), which reserves the setting instead."""
    pool_bytes: float
    capture_s: float
    process: tuple[str, int] = ("EngineCore", 4100)
    """vLLM's process name and pid: `EngineCore` runs the worker with one GPU, `Worker_TP<n>` with several."""
    requested_bytes: float | None = None
    """For the memory summary line (None: no summary line, as with --kv-cache-memory)."""
    total_bytes: float = 150.0 * GIB
    free_bytes: float = 149.0 * GIB
    """Free device memory at start-up (the memory summary's, and a pinned start-up's "Initial free memory")."""


def _pinned_where(at: tuple[str, int, int]) -> str:
    """The [file:line] of the pinned line's logging call."""
    name, _, line = at
    return f"{name.rsplit('/', 1)[-1]}:{line}"


def startup_log(workers: list[VllmWorker], *, capture_sizes: Sequence[int], kv_tokens: int, max_concurrency: float,
                runner: str = "v2", max_model_len: int = 8192, method: str | None = None, k: int = 0,
                max_num_seqs: int | None = None, gpu_memory_utilization: float | None = None,
                estimate_enabled: bool = True, cudagraph_mode: str = "FULL_AND_PIECEWISE", enforce_eager: bool = False,
                version: str = "0.33.0", extensible: bool = True, record: Sequence[int] | None = None,
                kv_cache_memory_bytes: int | None = None, prefix: str = "", color: bool = False,
                end_after: str | None = None) -> str:
    """One `vllm serve` start-up of vLLM `version` (0.33.x or 0.34.x), lines in that release's order (0.34:
    `startup_log_034`). 0.33: the API server's non-default args, the engine config, each worker's loading, (V2)
    profiling capture, KV line and hint, the engine's KV size, each worker's capture, pool line and memory summary.
    `kv_cache_memory_bytes`: a pinned start-up (`--kv-cache-memory-bytes`, among the non-default args): each worker
    logs the KV cache it reserved (the setting) in place of its KV line, and skips its memory profiling, so no
    estimate (V1's line, V2's profiling capture, the hint or the warning, the pool line) and no memory summary
    (printed only when kv_cache_memory_bytes is None); the KV size and the capture are logged as without it.
    `gpu_memory_utilization`: None for the release's default (not among the non-default args; 0.33: 0.9, as 0.9 is);
    `extensible` and `record` are 0.34's. `end_after`: cut the log after the first line holding that text (a truncated
    log)."""
    if _release(version) == "0.34":
        return startup_log_034(workers, capture_sizes=capture_sizes, kv_tokens=kv_tokens,
                               max_concurrency=max_concurrency, runner=runner, max_model_len=max_model_len,
                               method=method, k=k, max_num_seqs=max_num_seqs,
                               gpu_memory_utilization=gpu_memory_utilization, estimate_enabled=estimate_enabled,
                               cudagraph_mode=cudagraph_mode, enforce_eager=enforce_eager, version=version,
                               extensible=extensible, record=record, kv_cache_memory_bytes=kv_cache_memory_bytes,
                               prefix=prefix, color=color, end_after=end_after)
    if _release(version) != "0.33":
        raise ValueError(f"{version=}: cgtune writes vLLM 0.33's and 0.34's start-up logs only")
    capture_sizes = list(capture_sizes)
    w = _Writer(prefix, color)
    api, engine = ("APIServer", 4000), ("EngineCore", 4100)
    tp = len(workers)
    args = {"model_tag": "meta-llama/Llama-3.1-8B-Instruct", "config": "vllm-serve.yaml"}
    if max_num_seqs is not None:
        args["max_num_seqs"] = max_num_seqs
    if gpu_memory_utilization not in (None, 0.9):
        args["gpu_memory_utilization"] = gpu_memory_utilization
    if kv_cache_memory_bytes is not None:  # CacheConfig's flag, added right after --gpu-memory-utilization
        args["kv_cache_memory_bytes"] = int(kv_cache_memory_bytes)
    gpu_memory_utilization = 0.9 if gpu_memory_utilization is None else gpu_memory_utilization
    args["compilation_config"] = {"cudagraph_mode": cudagraph_mode, "cudagraph_capture_sizes": capture_sizes}
    w.log(api, "utils.py:96", NON_DEFAULT_ARGS, args)
    compilation = _compilation_config([] if enforce_eager else capture_sizes,
                                      "NONE" if enforce_eager else cudagraph_mode)
    w.log(engine, "core.py:139", ENGINE_CONFIG, version,
          _engine_config(compilation=compilation, method=method, k=k, tp=tp, max_model_len=max_model_len,
                         enforce_eager=enforce_eager))
    for x in workers:
        if runner == "v2":
            w.log(x.process, "gpu_worker.py:513", V2_RUNNER)
        w.log(x.process, "model_runner.py:399", LOADING)
        w.log(x.process, "model_runner.py:428", MODEL_LOADING, format_gib(16.06 * GIB), 11.25)
    graphs = not enforce_eager
    pinned = kv_cache_memory_bytes is not None
    for x in workers:
        if pinned:  # gpu_worker.py:656: the pin's branch returns before the profiling, the estimate and its lines
            w.log(x.process, _pinned_where(KV_RESERVED_AT), kv_reserved_line(x.free_bytes, int(kv_cache_memory_bytes)))
            continue
        if graphs and runner == "v1":
            w.log(x.process, "gpu_model_runner.py:6409", V1_ESTIMATE, x.estimate_bytes / GIB)
        if graphs and runner == "v2":  # V2's estimate captures into a throwaway pool, and says so (capture_model)
            w.log(x.process, "model_runner.py:1163", CAPTURE, x.capture_s / 3, x.estimate_bytes / GIB)
        w.log(x.process, "gpu_worker.py:772", KV_AVAILABLE, format_gib(x.kv_available_bytes))
        if graphs and estimate_enabled:
            delta = x.estimate_bytes / x.total_bytes
            w.log(x.process, "gpu_worker.py:787", UTIL_HINT, gpu_memory_utilization,
                  round(gpu_memory_utilization - delta, 4), min(round(gpu_memory_utilization + delta, 4), 1.0))
        elif graphs:
            w.log(x.process, "gpu_worker.py:804", ESTIMATE_DISABLED, gpu_memory_utilization,
                  min(round(gpu_memory_utilization + x.estimate_bytes / x.total_bytes, 4), 1.0), level="WARNING")
    w.log(engine, "kv_cache_utils.py:1147", KV_SIZE, "GPU", f"{kv_tokens:,}", f"{max_model_len:,}", max_concurrency)
    for x in workers:
        if graphs:
            for size in sorted(capture_sizes, reverse=True)[:2]:
                w.log(x.process, "gpu_worker.py:971", WARMUP, size)
            w.log(x.process, "model_runner.py:1163" if runner == "v2" else "gpu_model_runner.py:6516", CAPTURE,
                  x.capture_s, x.pool_bytes / GIB)
            if not pinned:  # gpu_worker.py:997: only where an estimate was made
                diff = abs(x.pool_bytes - x.estimate_bytes)
                w.log(x.process, "gpu_worker.py:1003", POOL, round(x.pool_bytes / GIB, 2),
                      round(x.estimate_bytes / GIB, 2), round(diff / GIB, 2), 100 * diff / max(x.pool_bytes, 1))
        if x.requested_bytes is not None and not pinned:  # gpu_worker.py:1012: only when kv_cache_memory_bytes is None
            estimate = x.estimate_bytes if estimate_enabled and graphs else 0.0
            non_kv = x.requested_bytes - x.kv_available_bytes - estimate
            w.log(x.process, "gpu_worker.py:1066", _memory_summary(
                free=x.free_bytes, total=x.total_bytes, util=gpu_memory_utilization, requested=x.requested_bytes,
                consumed=non_kv - 1.5 * GIB, activation=1.5 * GIB + estimate, graphs=x.pool_bytes if graphs else 0.0,
                kv=x.kv_available_bytes))
    return w.text(end_after)


# ---------------------------------------------------------------------------------------------- vLLM 0.34
def _release(version: str) -> str:
    """The minor release of a version string (`0.34` for 0.34.0)."""
    return ".".join(version.split(".")[:2])


_MODE_VALUE = {"NONE": "0", "PIECEWISE": "1", "FULL": "2", "FULL_DECODE_ONLY": "(2, 0)",
               "FULL_AND_PIECEWISE": "(2, 1)"}
"""CUDAGraphMode's values, as its enum repr prints them (the same in 0.33 and 0.34)."""
_SPLITTING_OPS_034 = [
    "vllm::unified_attention_with_output", "vllm::unified_mla_attention_with_output", "vllm::mamba_mixer2",
    "vllm::mamba_mixer", "vllm::short_conv", "vllm::zaya_cca", "vllm::qwen4_exp_ple_short_conv",
    "vllm::qwen4_exp_qsa_with_output", "vllm::qwen4_exp_qsa_prepare_with_output", "vllm::linear_attention",
    "vllm::qwen_gdn_attention_core", "vllm::qwen_gdn_attention_core_fused_norm_packed", "vllm::gdn_attention_core_xpu",
    "vllm::olmo_hybrid_gdn_full_forward", "vllm::sparse_attn_indexer", "vllm::rocm_aiter_sparse_attn_indexer",
    "vllm::deepseek_v4_attention", "vllm::hpc_rope_norm_forward", "vllm::step5_csa_attention",
    "vllm::unified_kv_cache_update", "vllm::unified_mla_kv_cache_update"]
"""`CompilationConfig.set_splitting_ops_for_v1`'s list in 0.34.0 (VLLM_COMPILE splits at every attention op)."""
_INDUCTOR = "{'enable_auto_functionalized_v2': False, 'combo_kernels': True, 'benchmark_combo_kernel': True}"
_DYNAMIC_SHAPES = ("{'type': <DynamicShapesType.BACKED: 'backed'>, 'evaluate_guards': False, "
                   "'assume_32_bit_indexing': False}")


def compilation_fields_034(*, mode: str | None, prefill: list[int] | None, max_prefill: int | None,
                           decode: list[int] | None, max_decode: int | None, record: list[int] | None = None,
                           resolved: bool, enforce_eager: bool = False) -> list[tuple[str, str]]:
    """CompilationConfig.__repr__ of 0.34.0 (vllm/config/compilation.py:974, a dict of every field) as (field, printed
    value) pairs in its field order: `resolved`, as the engine config prints it after VllmConfig resolved it (the mode
    and sizes put in; the other fields as a VLLM_COMPILE start-up sets them); else as `--compilation-config` parses the
    user's JSON (`TypeAdapter(CompilationConfig).validate_json`, arg_utils.py:371: fields not given stay None) and
    "non-default args" prints it. tests/commands/test_check_034_cli.py holds both to the 0.34.0 code."""
    cuda_mode = "None" if mode is None else f"<CUDAGraphMode.{mode}: {_MODE_VALUE[mode]}>"
    return [
        ("mode", "<CompilationMode.VLLM_COMPILE: 3>" if resolved else "None"), ("debug_dump_path", "None"),
        ("cache_dir", "''"), ("compile_cache_save_format", "'binary'"), ("backend", "'inductor'"),
        ("custom_ops", "['none']" if resolved else "[]"), ("ir_enable_torch_wrap", "None"),
        ("splitting_ops", repr(_SPLITTING_OPS_034) if resolved else "None"), ("compile_mm_encoder", "False"),
        ("cudagraph_mm_encoder", "False"), ("encoder_cudagraph_token_budgets", "[]"),
        ("encoder_cudagraph_max_token_budget", "5120"), ("encoder_cudagraph_max_vision_items_per_batch", "0"),
        ("encoder_cudagraph_max_frames_per_batch", "None"), ("cudagraph_decoder_replay", "True"),
        ("decoder_replay_cudagraph_capture_sizes", "[]"), ("decoder_replay_trim_threshold", "768"),
        ("compile_sizes", "[]" if resolved else "None"), ("compile_ranges_endpoints", "[8192]" if resolved else "None"),
        ("inductor_compile_config", _INDUCTOR), ("inductor_passes", "{}"), ("cudagraph_mode", cuda_mode),
        ("use_breakable_cudagraph", "False" if resolved else "None"),
        # vllm.py:1916-1923: one warm-up run before each capture unless enforce_eager.
        ("cudagraph_num_of_warmups", "1" if resolved and not enforce_eager else "0"),
        ("cudagraph_capture_sizes", repr(record)), ("prefill_cudagraph_capture_token_sizes", repr(prefill)),
        ("max_prefill_cudagraph_capture_tokens", repr(max_prefill)),
        ("decode_cudagraph_capture_request_sizes", repr(decode)),
        ("max_decode_cudagraph_capture_requests", repr(max_decode)), ("max_decode_cudagraph_capture_tokens", "None"),
        ("cudagraph_copy_inputs", "False"), ("cudagraph_specialize_lora", "True"),
        ("use_inductor_graph_partition", "False" if resolved else "None"), ("pass_config", "{}"),
        ("max_cudagraph_capture_size", repr(max(record, default=0)) if record is not None else "None"),
        ("dynamic_shapes_config", _DYNAMIC_SHAPES), ("local_cache_dir", "None"), ("fast_moe_cold_start", "None"),
        ("static_all_moe_layers", "[]"),
    ]


class _Printed(str):
    """Text a dict's repr prints as it is: an object's own repr (the CompilationConfig among the non-default args)."""

    def __repr__(self) -> str:
        return str(self)


def _dict_text(fields: list[tuple[str, str]]) -> str:
    """A dict's repr from its keys and their printed values."""
    return "{" + ", ".join(f"{name!r}: {value}" for name, value in fields) + "}"


def default_record_034(keys: Sequence[int], *, k: int, cudagraph_mode: str) -> list[int]:
    """0.34's `cudagraph_capture_sizes` record of a pair of lists where the caller gives none: every graph's token
    count (vllm.py:2681-2732), decode graphs at q = 1 + k (no decode token budget, one query length, no drafter
    graphs) and the prefill sizes unless the mode captures no mixed graphs (FULL_DECODE_ONLY)."""
    prefill, decode = split_keys(keys)
    widths = {n * (1 + k) for n in decode}  # recorded even where no decode table is captured (FULL, PIECEWISE)
    if cudagraph_mode != "FULL_DECODE_ONLY":
        widths |= set(prefill)
    return sorted(widths) if cudagraph_mode != "NONE" else []


def startup_log_034(workers: list[VllmWorker], *, capture_sizes: Sequence[int], kv_tokens: int,
                    max_concurrency: float, runner: str = "v2", max_model_len: int = 8192, method: str | None = None,
                    k: int = 0, max_num_seqs: int | None = None, gpu_memory_utilization: float | None = None,
                    estimate_enabled: bool = True, cudagraph_mode: str = "FULL_AND_PIECEWISE",
                    enforce_eager: bool = False, version: str = "0.34.0", extensible: bool = True,
                    record: Sequence[int] | None = None, kv_cache_memory_bytes: int | None = None,
                    prefix: str = "", color: bool = False, end_after: str | None = None) -> str:
    """One vLLM 0.34 `vllm serve` start-up for a list's keys (`capture_sizes`: prefill token sizes, and -n for a decode
    graph of n requests), in 0.34's order. With the extensible KV cache (`extensible`, 0.34's default): non-default
    args (both lists and their caps), the engine config, each worker's loading, its "Available KV cache memory" (a
    worker's `kv_available_bytes`: the capacity it reserves; no estimate, so no hint), each worker's real capture and
    memory summary, then the engine's KV size (sized after the capture). Without it, 0.33's V2 flow through 0.34's
    strings: the estimate's profiling capture, the KV line, the hint (or, with the estimate off, 0.34's shorter
    warning, and no estimate at all), the KV size, the capture, the pool line where an estimate was made. 0.34 logs
    no runner line (V2 is its only runner) and, its record lying in the one compile range, no warm-up sizes.
    `record`: the engine config's `cudagraph_capture_sizes` (default `default_record_034`). `kv_cache_memory_bytes`:
    a pinned start-up (among the non-default args), which turns the extensible KV cache off whatever `extensible`
    says (vllm.py _resolve_extensible_kv_cache): each worker's reserved line in place of its KV line, no estimate,
    the KV size before the capture, no pool line and no memory summary."""
    if runner != "v2":
        raise ValueError(f"{runner=}: vLLM 0.34 has the V2 model runner only")

    def where(fmt: str) -> str:  # the [file:line] vLLM 0.34.0 prints for a format string
        name, line = v034.WHERE[fmt]
        return f"{name.rsplit('/', 1)[-1]}:{line}"

    w = _Writer(prefix, color)
    api, engine = ("APIServer", 4000), ("EngineCore", 4100)
    prefill, decode = split_keys(capture_sizes)
    args: dict[str, object] = {"model_tag": "meta-llama/Llama-3.1-8B-Instruct", "config": "vllm-serve.yaml"}
    if max_num_seqs is not None:
        args["max_num_seqs"] = max_num_seqs
    if gpu_memory_utilization is not None:  # 0.34's default is None (resolved below): any value given is non-default
        args["gpu_memory_utilization"] = gpu_memory_utilization
    pinned = kv_cache_memory_bytes is not None
    if pinned:  # CacheConfig's flag, added right after --gpu-memory-utilization
        args["kv_cache_memory_bytes"] = int(kv_cache_memory_bytes)
        extensible = False
    # The compilation config vLLM was given: the run's files (tuner.engines.vllm.v034.emit), parsed by the CLI.
    given = (dict(mode="NONE", prefill=None, max_prefill=None, decode=None, max_decode=None)
             if cudagraph_mode == "NONE" or not capture_sizes else
             dict(mode=cudagraph_mode, prefill=prefill, max_prefill=max(prefill, default=0), decode=decode,
                  max_decode=max(decode, default=0)))
    args["compilation_config"] = _Printed(_dict_text(compilation_fields_034(**given, resolved=False)))
    w.log(api, where(v034.NON_DEFAULT_ARGS), v034.NON_DEFAULT_ARGS, args)
    graphs = not enforce_eager and cudagraph_mode != "NONE" and bool(capture_sizes)
    mode = cudagraph_mode if graphs else "NONE"
    if record is None:
        record = default_record_034(capture_sizes, k=k, cudagraph_mode=mode)
    resolved = compilation_fields_034(mode=mode, prefill=prefill, decode=decode, record=list(record) if graphs else [],
                                      max_prefill=max(prefill, default=0) if graphs else None,
                                      max_decode=max(decode, default=0) if graphs else None, resolved=True,
                                      enforce_eager=enforce_eager)
    w.log(engine, where(v034.ENGINE_CONFIG), v034.ENGINE_CONFIG, version,
          _engine_config(compilation=_dict_text(resolved), method=method, k=k, tp=len(workers),
                         max_model_len=max_model_len, enforce_eager=enforce_eager))
    for x in workers:
        w.log(x.process, where(v034.LOADING), v034.LOADING)
        w.log(x.process, where(v034.MODEL_LOADING), v034.MODEL_LOADING, format_gib(16.06 * GIB), 11.25)
    # cache.py:494-501: None resolves to 1.0 with the extensible KV cache, 0.92 without.
    util = gpu_memory_utilization if gpu_memory_utilization is not None else 1.0 if extensible else 0.92
    # gpu_worker.py:742-747: the estimate is made only where its flag is on; model_runner.py:1121: 0 (none made, no
    # profiling capture) under the extensible KV cache.
    estimated = graphs and estimate_enabled and not extensible and not pinned
    for x in workers:
        if pinned:  # gpu_worker.py:688: the pin's branch returns before the profiling, the estimate and its lines
            w.log(x.process, _pinned_where(v034.KV_RESERVED_AT),
                  v034.kv_reserved_line(x.free_bytes, int(kv_cache_memory_bytes)))
            continue
        if estimated:
            w.log(x.process, where(v034.CAPTURE), v034.CAPTURE, x.capture_s / 3, x.estimate_bytes / GIB)
        w.log(x.process, where(v034.KV_AVAILABLE), v034.KV_AVAILABLE, format_gib(x.kv_available_bytes))
        if estimated and x.estimate_bytes > 0:
            delta = x.estimate_bytes / x.total_bytes
            w.log(x.process, where(v034.UTIL_HINT), v034.UTIL_HINT, util, round(util - delta, 4),
                  min(round(util + delta, 4), 1.0))
        elif graphs and not estimate_enabled and not extensible:
            w.log(x.process, where(v034.ESTIMATE_DISABLED), v034.ESTIMATE_DISABLED, level="WARNING")
    kv_size = (engine, where(v034.KV_SIZE), v034.KV_SIZE, "GPU", f"{kv_tokens:,}", f"{max_model_len:,}",
               max_concurrency)
    if not extensible:  # core.py:383: sized before the capture; under the extensible cache only after it
        w.log(*kv_size)
    for x in workers:
        if graphs:
            w.log(x.process, where(v034.CAPTURE), v034.CAPTURE, x.capture_s, x.pool_bytes / GIB)
        if estimated and x.estimate_bytes > 0:
            diff = abs(x.pool_bytes - x.estimate_bytes)
            w.log(x.process, where(v034.POOL), v034.POOL, round(x.pool_bytes / GIB, 2),
                  round(x.estimate_bytes / GIB, 2), round(diff / GIB, 2), 100 * diff / max(x.pool_bytes, 1))
        if x.requested_bytes is not None and not pinned:  # gpu_worker.py:1121: only when kv_cache_memory_bytes is None
            estimate = x.estimate_bytes if estimated else 0.0
            non_kv = x.requested_bytes - x.kv_available_bytes - estimate
            name, _, line = v034.MEMORY_SUMMARY_AT
            w.log(x.process, f"{name.rsplit('/', 1)[-1]}:{line}", _memory_summary(
                free=x.free_bytes, total=x.total_bytes, util=util, requested=x.requested_bytes,
                consumed=non_kv - 1.5 * GIB, activation=1.5 * GIB + estimate, graphs=x.pool_bytes if graphs else 0.0,
                kv=x.kv_available_bytes))
    if extensible:
        w.log(*kv_size)
    return w.text(end_after)
