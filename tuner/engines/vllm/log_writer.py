"""vLLM 0.33's start-up log for a list, written as vLLM writes it: vLLM 0.33.0's own format strings (each quoted in
tuner/engines/vllm/log_lines.py with its file and line in vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl) through
vLLM's own log-line format (vllm/logger.py:28 `_FORMAT`) by the standard `logging.Formatter`, as vLLM's handler formats
them. The figures in it are the caller's (data in, no run read here): the no-GPU example's stand-in for a real start-up
(`cgtune example`) and the `cgtune check` tests' fixtures. Never a measurement."""

from __future__ import annotations

import logging
from dataclasses import dataclass

# The format strings, verbatim, live beside it (the report predicts the lines with them): imported, not retyped.
from tuner.engines.vllm.log_lines import (CAPTURE, ENGINE_CONFIG, ESTIMATE_DISABLED, GIB, KV_AVAILABLE, KV_SIZE,
                                          LOADING, MODEL_LOADING, NON_DEFAULT_ARGS, POOL, UTIL_HINT, V1_ESTIMATE,
                                          V2_RUNNER, WARMUP, format_gib)

__all__ = ["GIB", "VllmWorker", "format_gib", "startup_log"]

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


def _engine_config(*, sizes: list[int], mode: str, method: str | None, k: int, tp: int, max_model_len: int,
                   enforce_eager: bool) -> str:
    """VllmConfig.__str__ (vllm/config/vllm.py:2809), fields in its order; the speculative config as
    SpeculativeConfig.__repr__ (vllm/config/speculative.py:2196) writes it."""
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
            f"compilation_config={_compilation_config(sizes, mode)}, kernel_config=KernelConfig()")


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


@dataclass
class VllmWorker:
    """The figures one worker logs (bytes and seconds)."""

    kv_available_bytes: float
    estimate_bytes: float
    pool_bytes: float
    capture_s: float
    process: tuple[str, int] = ("EngineCore", 4100)
    """vLLM's process name and pid: `EngineCore` runs the worker with one GPU, `Worker_TP<n>` with several."""
    requested_bytes: float | None = None
    """For the memory summary line (None: no summary line, as with --kv-cache-memory)."""
    total_bytes: float = 150.0 * GIB
    free_bytes: float = 149.0 * GIB


def startup_log(workers: list[VllmWorker], *, capture_sizes: list[int], kv_tokens: int, max_concurrency: float,
                runner: str = "v2", max_model_len: int = 8192, method: str | None = None, k: int = 0,
                max_num_seqs: int | None = None, gpu_memory_utilization: float = 0.9, estimate_enabled: bool = True,
                cudagraph_mode: str = "FULL_AND_PIECEWISE", enforce_eager: bool = False, version: str = "0.33.0",
                prefix: str = "", color: bool = False, end_after: str | None = None) -> str:
    """One `vllm serve` start-up, lines in vLLM's order: the API server's non-default args, the engine config, each
    worker's loading, (V2) profiling capture, KV line and hint, the engine's KV size, each worker's capture, pool line
    and memory summary. `end_after`: cut the log after the first line holding that text (a truncated log)."""
    w = _Writer(prefix, color)
    api, engine = ("APIServer", 4000), ("EngineCore", 4100)
    tp = len(workers)
    args = {"model_tag": "meta-llama/Llama-3.1-8B-Instruct", "config": "vllm-serve.yaml"}
    if max_num_seqs is not None:
        args["max_num_seqs"] = max_num_seqs
    if gpu_memory_utilization != 0.9:
        args["gpu_memory_utilization"] = gpu_memory_utilization
    args["compilation_config"] = {"cudagraph_mode": cudagraph_mode, "cudagraph_capture_sizes": capture_sizes}
    w.log(api, "utils.py:96", NON_DEFAULT_ARGS, args)
    w.log(engine, "core.py:139", ENGINE_CONFIG, version,
          _engine_config(sizes=[] if enforce_eager else capture_sizes, mode="NONE" if enforce_eager else cudagraph_mode,
                         method=method, k=k, tp=tp, max_model_len=max_model_len, enforce_eager=enforce_eager))
    for x in workers:
        if runner == "v2":
            w.log(x.process, "gpu_worker.py:513", V2_RUNNER)
        w.log(x.process, "model_runner.py:399", LOADING)
        w.log(x.process, "model_runner.py:428", MODEL_LOADING, format_gib(16.06 * GIB), 11.25)
    graphs = not enforce_eager
    for x in workers:
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
            diff = abs(x.pool_bytes - x.estimate_bytes)
            w.log(x.process, "gpu_worker.py:1003", POOL, round(x.pool_bytes / GIB, 2), round(x.estimate_bytes / GIB, 2),
                  round(diff / GIB, 2), 100 * diff / max(x.pool_bytes, 1))
        if x.requested_bytes is not None:
            estimate = x.estimate_bytes if estimate_enabled and graphs else 0.0
            non_kv = x.requested_bytes - x.kv_available_bytes - estimate
            w.log(x.process, "gpu_worker.py:1066", _memory_summary(
                free=x.free_bytes, total=x.total_bytes, util=gpu_memory_utilization, requested=x.requested_bytes,
                consumed=non_kv - 1.5 * GIB, activation=1.5 * GIB + estimate, graphs=x.pool_bytes if graphs else 0.0,
                kv=x.kv_available_bytes))
    lines = w.lines
    if end_after is not None:
        lines = lines[:next(i for i, line in enumerate(lines) if end_after in line) + 1]
    return "\n".join(lines) + "\n"
