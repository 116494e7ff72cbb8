"""vLLM 0.33's start-up log lines: its INFO (and one WARNING) format strings, quoted verbatim from the 0.33.0 wheel with
their file and line, its number formatting, and the memory lines it will print for a capture list, so a report's
prediction reads as vLLM prints it and the test fixtures write logs through the very same strings
(tests/vllm/test_startup_log.py holds each to the wheel's source)."""

from __future__ import annotations

__all__ = [
    "CAPTURE",
    "ENGINE_CONFIG",
    "ESTIMATE_DISABLED",
    "GIB",
    "KV_AVAILABLE",
    "KV_RESERVED_AT",
    "KV_RESERVED_PARTS",
    "KV_SIZE",
    "LOADING",
    "MODEL_LOADING",
    "NON_DEFAULT_ARGS",
    "POOL",
    "UTIL_HINT",
    "V1_ESTIMATE",
    "V2_RUNNER",
    "WARMUP",
    "estimate_line_note",
    "format_gib",
    "kv_reserved_line",
    "memory_lines",
]

GIB = 1 << 30

ENGINE_CONFIG = "Initializing a V1 LLM engine (v%s) with config: %s"  # v1/engine/core.py:139
NON_DEFAULT_ARGS = "non-default args: %s"  # entrypoints/common/startup.py:96
V2_RUNNER = "Using V2 Model Runner"  # v1/worker/gpu_worker.py:513
LOADING = "Loading model from scratch..."  # v1/worker/gpu/model_runner.py:399
MODEL_LOADING = "Model loading took %s GiB memory and %.6f seconds"  # v1/worker/gpu/model_runner.py:428
V1_ESTIMATE = "Estimated CUDA graph memory: %.2f GiB total"  # v1/worker/gpu_model_runner.py:6409 (V1 only)
KV_AVAILABLE = "Available KV cache memory: %s GiB"  # v1/worker/gpu_worker.py:772
KV_RESERVED_PARTS = (  # the literal parts of the f-string at v1/worker/gpu_worker.py:664, logged at :676 in place of
    # KV_AVAILABLE when kv_cache_memory_bytes is set: format_gib(init free memory), then format_gib(the setting)
    "Initial free memory ",
    " GiB, reserved ",
    " GiB memory for "
    "KV Cache as specified by kv_cache_memory_bytes config and "
    "skipped memory profiling. This does not respect the "
    "gpu_memory_utilization config. Only use kv_cache_memory_bytes "
    "config when you want manual control of KV cache memory "
    "size. If OOM'ed, check the difference of initial free "
    "memory between the current run and the previous run "
    "where kv_cache_memory_bytes is suggested and update it "
    "correspondingly.",
)
KV_RESERVED_AT = ("vllm/v1/worker/gpu_worker.py", 664, 676)
"""(file, line of the f-string, line of the logging call) of the pinned start-up's line in 0.33.0."""
UTIL_HINT = (  # v1/worker/gpu_worker.py:787 (an estimate > 0, subtracted)
    "CUDA graph memory profiling is enabled (default since "
    "v0.21.0). The current --gpu-memory-utilization=%.4f is "
    "equivalent to --gpu-memory-utilization=%.4f without "
    "CUDA graph memory profiling. To maintain the same "
    "effective KV cache size as before, increase "
    "--gpu-memory-utilization to %.4f. To disable, set "
    "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0."
)
ESTIMATE_DISABLED = (  # v1/worker/gpu_worker.py:804 (WARNING; an estimate > 0, not subtracted)
    "CUDA graph memory profiling is disabled "
    "(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0). "
    "Without it, CUDA graph memory is not accounted for "
    "during KV cache allocation, which may require lowering "
    "--gpu-memory-utilization to avoid OOM. Consider "
    "re-enabling it (the default as of v0.21.0) and increasing "
    "--gpu-memory-utilization from %.4f to %.4f."
)
KV_SIZE = ("%s KV cache size: %s tokens, "  # v1/core/kv_cache_utils.py:1147
           "Maximum concurrency for %s tokens per request: %.2fx")
WARMUP = "Compile and warming up model for size %d"  # v1/worker/gpu_worker.py:971
CAPTURE = "Graph capturing finished in %.0f secs, took %.2f GiB"  # v1/worker/gpu/model_runner.py:1163 (V2),
# v1/worker/gpu_model_runner.py:6516 (V1)
POOL = ("CUDA graph pool memory: %s GiB (actual), %s GiB (estimated), "  # v1/worker/gpu_worker.py:1003
        "difference: %s GiB (%.1f%%).")


def format_gib(b: float) -> str:
    """vllm/utils/mem_utils.py:30: GiB rounded to 2 decimals, printed by str (5.1, not 5.10)."""
    return f"{round(b / GIB, 2)}"


def kv_reserved_line(free_bytes: float, kv_cache_memory_bytes: int) -> str:
    """The line a worker logs when kv_cache_memory_bytes pins its KV cache (gpu_worker.py determine_available_memory's
    first branch, the same f-string in 0.33.0 and 0.34.0): its free memory at start-up and the setting, each through
    format_gib. It then skips the memory profiling, the graph-memory estimate and every line made of them."""
    start, reserved, rest = KV_RESERVED_PARTS
    return f"{start}{format_gib(free_bytes)}{reserved}{format_gib(kv_cache_memory_bytes)}{rest}"


def estimate_line_note(runner: str) -> str:
    """Where the runner logs its graph-memory estimate at INFO, in words."""
    if runner == "v1":
        return "V1 logs its estimate on a line of its own"
    return "V2 logs its estimate only through the gpu_memory_utilization hint and the pool line after the capture"


def memory_lines(*, runner: str, captures: bool, profiled_estimate_bytes: float, estimate_enabled: bool,
                 kv_available_bytes: float, kv_tokens: int, max_model_len: int, max_concurrency: float,
                 total_memory_bytes: float, gpu_memory_utilization: float, pool_bytes: float) -> list[str]:
    """The memory lines vLLM 0.33 logs, in its order, for a list with these figures: V1's estimate (V2 logs its own
    only at DEBUG), the KV cache it sized, the gpu_memory_utilization hint (or, with the estimate switched off, the
    warning) when its profiled estimate is above 0, the KV size and concurrency (one line), and after the real capture
    the pool beside the estimate (gpu_worker.py:995: the GiB lambda rounds to 2 decimals)."""
    lines = []
    if runner == "v1" and captures:
        lines.append(V1_ESTIMATE % (profiled_estimate_bytes / GIB))
    lines.append(KV_AVAILABLE % format_gib(kv_available_bytes))
    delta = profiled_estimate_bytes / total_memory_bytes
    suggested = min(round(gpu_memory_utilization + delta, 4), 1.0)
    if profiled_estimate_bytes > 0 and estimate_enabled:
        lines.append(UTIL_HINT % (gpu_memory_utilization, round(gpu_memory_utilization - delta, 4), suggested))
    elif profiled_estimate_bytes > 0:
        lines.append(ESTIMATE_DISABLED % (gpu_memory_utilization, suggested))
    lines.append(KV_SIZE % ("GPU", f"{kv_tokens:,}", f"{max_model_len:,}", max_concurrency))
    if profiled_estimate_bytes > 0:
        diff = abs(pool_bytes - profiled_estimate_bytes)
        lines.append(POOL % (round(pool_bytes / GIB, 2), round(profiled_estimate_bytes / GIB, 2), round(diff / GIB, 2),
                             100 * diff / max(pool_bytes, 1)))
    return lines
