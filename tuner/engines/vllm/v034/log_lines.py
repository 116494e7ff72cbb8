"""vLLM 0.34's start-up log lines: the format strings of the 0.34.0 wheel that cgtune writes and reads, each with the
file and line of its logging call in that wheel (tests/commands/test_check_034_cli.py holds each to the source). Most
are 0.33's strings, unchanged, at other lines (imported, not retyped); 0.34 changed the estimate-disabled warning,
and dropped the V2 runner's line (V2 is its only runner). The extensible KV cache's own lines ("Memory after warmup:
...", "Extended KV cache to ...") are not here: cgtune neither writes nor reads them (their figures, free memory
after warm-up and torch's limit, are nothing it predicts)."""

from __future__ import annotations

from tuner.engines.vllm.log_lines import (CAPTURE, ENGINE_CONFIG, KV_AVAILABLE, KV_RESERVED_PARTS, KV_SIZE, LOADING,
                                          MODEL_LOADING, NON_DEFAULT_ARGS, POOL, UTIL_HINT, WARMUP, kv_reserved_line)

__all__ = [
    "CAPTURE",
    "ENGINE_CONFIG",
    "ESTIMATE_DISABLED",
    "KV_AVAILABLE",
    "KV_RESERVED_AT",
    "KV_RESERVED_PARTS",
    "KV_SIZE",
    "LOADING",
    "MEMORY_SUMMARY_AT",
    "MODEL_LOADING",
    "NON_DEFAULT_ARGS",
    "POOL",
    "UTIL_HINT",
    "WARMUP",
    "WHERE",
    "kv_reserved_line",
]

ESTIMATE_DISABLED = (  # v1/worker/gpu_worker.py:828 (WARNING; 0.34 dropped 0.33's "and increasing ..." suffix and
    # prints it only without the extensible KV cache)
    "CUDA graph memory profiling is disabled "
    "(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0). "
    "Without it, CUDA graph memory is not accounted for "
    "during KV cache allocation, which may require lowering "
    "--gpu-memory-utilization to avoid OOM. Consider "
    "re-enabling it (the default as of v0.21.0)."
)
WHERE = {  # format string -> (file in the 0.34.0 wheel, line of the logging call), as the log's [file:line] shows it
    ENGINE_CONFIG: ("vllm/v1/engine/core.py", 153),
    NON_DEFAULT_ARGS: ("vllm/entrypoints/common/startup.py", 96),
    LOADING: ("vllm/v1/worker/gpu/model_runner.py", 412),
    MODEL_LOADING: ("vllm/v1/worker/gpu/model_runner.py", 441),
    KV_AVAILABLE: ("vllm/v1/worker/gpu_worker.py", 795),
    UTIL_HINT: ("vllm/v1/worker/gpu_worker.py", 809),
    ESTIMATE_DISABLED: ("vllm/v1/worker/gpu_worker.py", 828),
    KV_SIZE: ("vllm/v1/core/kv_cache_utils.py", 1168),
    WARMUP: ("vllm/v1/worker/gpu_worker.py", 1059),
    CAPTURE: ("vllm/v1/worker/gpu/model_runner.py", 1216),
    POOL: ("vllm/v1/worker/gpu_worker.py", 1112),
}
"""Where 0.34.0 logs each line. The memory summary is an f-string (gpu_worker.py:1153, logged at :1175): its literal
parts are 0.33's, in the same order."""
MEMORY_SUMMARY_AT = ("vllm/v1/worker/gpu_worker.py", 1153, 1175)
"""(file, line of the f-string, line of the logging call) of 0.34.0's memory summary."""
KV_RESERVED_AT = ("vllm/v1/worker/gpu_worker.py", 696, 708)
"""(file, line of the f-string, line of the logging call) of 0.34.0's pinned start-up line: 0.33's f-string
(KV_RESERVED_PARTS), unchanged. Pinned, 0.34 also turns its extensible KV cache off (vllm.py
_resolve_extensible_kv_cache), so the KV cache is sized before the capture, as without it."""
