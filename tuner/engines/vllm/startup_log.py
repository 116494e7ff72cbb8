"""Read vLLM 0.33's or 0.34's start-up log: the capture list and serving settings the engine ran with, and each
worker's own figures for graph memory, KV cache and capture time, from a whole server log (any prefixes; other lines
ignored), pinned (`--kv-cache-memory-bytes`) or not.

Every pattern below is one of vLLM 0.33.0's INFO format strings (file and line beside it); 0.34.0 logs the same
strings (tuner/engines/vllm/v034/log_lines.py says where), in another order under its extensible KV cache, and no
runner line. Numbers are kept as printed, in vLLM's units (GiB to 2 decimals, whole seconds), with the resolution of
the line they came from. Lines are assigned to processes by vLLM's process tag, `(Worker_TP1 pid=4242)` (vllm/logger.py
`_FORMAT`), so with tensor parallelism every worker's figures are read separately. A 0.34 list is two lists (prefill
token sizes, decode request sizes), read from its compilation config and carried as 0.34's keys
(`tuner.engines.vllm.v034.dispatch.join_keys`)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tuner.engines.vllm.v034.dispatch import join_keys

__all__ = [
    "GIB",
    "LogError",
    "StartupLog",
    "WorkerFigures",
    "parse_startup_log",
    "read_log",
]

GIB = 1 << 30
_NUM = r"-?\d+(?:\.\d+)?"

_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # vLLM's ColoredFormatter (vllm/logging_utils/formatter.py)
_TAG = re.compile(r"\(([^()]+?) pid=(\d+)\)")  # "(%(vllm_process_name)s pid=%(process)d)", vllm/logger.py:28

# v1/engine/core.py:139 "Initializing a V1 LLM engine (v%s) with config: %s" (VllmConfig.__str__, config/vllm.py:2809)
_ENGINE_CONFIG = re.compile(r"Initializing a V1 LLM engine \(v([^)]*)\) with config: (.*)$")
# entrypoints/common/startup.py:96 "non-default args: %s"
_NON_DEFAULT = re.compile(r"non-default args: (\{.*\})")
# v1/worker/gpu_worker.py:513 "Using V2 Model Runner" (info_once, V2 only)
_V2_RUNNER = re.compile(r"Using V2 Model Runner")
# v1/worker/gpu_model_runner.py:6409 "Estimated CUDA graph memory: %.2f GiB total" (V1 only; V2 logs it at DEBUG)
_V1_ESTIMATE = re.compile(rf"Estimated CUDA graph memory: ({_NUM}) GiB total")
# v1/worker/gpu_worker.py:772 "Available KV cache memory: %s GiB" (format_gib: round(b / GiB, 2), printed by str)
_KV_AVAILABLE = re.compile(rf"Available KV cache memory: ({_NUM}) GiB")
# v1/worker/gpu_worker.py:664 (logged at :676; 0.34.0: :696 and :708), the f-string of a pinned start-up in place of
# the line above: "Initial free memory {format_gib(free)} GiB, reserved {format_gib(kv_cache_memory_bytes)} GiB memory
# for KV Cache as specified by kv_cache_memory_bytes config and skipped memory profiling. ..."
_KV_RESERVED = re.compile(rf"Initial free memory ({_NUM}) GiB, reserved ({_NUM}) GiB memory for KV Cache as specified "
                          rf"by kv_cache_memory_bytes config and skipped memory profiling")
# v1/worker/gpu_worker.py:787 "... The current --gpu-memory-utilization=%.4f is equivalent to
# --gpu-memory-utilization=%.4f without CUDA graph memory profiling. ..." (estimate > 0 and enabled)
_UTIL_HINT = re.compile(rf"The current --gpu-memory-utilization=({_NUM}) is equivalent to "
                        rf"--gpu-memory-utilization=({_NUM}) without CUDA graph memory profiling")
# v1/worker/gpu_worker.py:804 (warning) "CUDA graph memory profiling is disabled
# (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0). ..."
_ESTIMATE_DISABLED = re.compile(r"CUDA graph memory profiling is disabled "
                                r"\(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0\)")
# v1/core/kv_cache_utils.py:1147 "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx"
_KV_SIZE = re.compile(rf"(\S+(?: \+ host)?) KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens "
                      rf"per request: ({_NUM})x")
# v1/worker/gpu/model_runner.py:1163 (V2) and gpu_model_runner.py:6516 (V1):
# "Graph capturing finished in %.0f secs, took %.2f GiB"
_CAPTURE = re.compile(rf"Graph capturing finished in ({_NUM}) secs, took ({_NUM}) GiB")
# v1/worker/gpu_worker.py:1003 "CUDA graph pool memory: %s GiB (actual), %s GiB (estimated), difference: %s GiB
# (%.1f%%)." (when an estimate was made)
_POOL = re.compile(rf"CUDA graph pool memory: ({_NUM}) GiB \(actual\), ({_NUM}) GiB \(estimated\)")
# v1/worker/gpu_worker.py:1066, the f-string built at 1044: "Free memory on device (F/T GiB) on startup. Desired GPU
# memory utilization is (U, R GiB). Actual usage is C GiB for consumed memory (weights + non-torch), A GiB for peak
# activation, and G GiB for CUDAGraph memory. ..."
_MEMORY_SUMMARY = re.compile(
    rf"Free memory on device \(({_NUM})/({_NUM}) GiB\) on startup\. Desired GPU memory utilization is "
    rf"\(({_NUM}), ({_NUM}) GiB\)\. Actual usage is ({_NUM}) GiB for consumed memory \(weights \+ non-torch\), "
    rf"({_NUM}) GiB for peak activation, and ({_NUM}) GiB for CUDAGraph memory")

# Inside the engine-config line: CompilationConfig.__repr__ (config/compilation.py:824, a dict repr) and
# SpeculativeConfig.__repr__ (config/speculative.py:2196).
_SIZES = re.compile(r"'cudagraph_capture_sizes': \[([\d,\s]*)\]")  # the quote keeps decoder_replay_... out
# 0.34's two lists (config/compilation.py:762 and :775; their repr at :974), in the engine config after resolution and
# among the non-default args as `--compilation-config` parsed them (None where not given).
_SPLIT = {kind: re.compile(rf"'{field}': (None|\[[\d,\s]*\])")
          for kind, field in (("prefill", "prefill_cudagraph_capture_token_sizes"),
                              ("decode", "decode_cudagraph_capture_request_sizes"))}
_MODE = re.compile(r"'cudagraph_mode': <CUDAGraphMode\.(\w+)")
# VllmConfig.__str__'s last field (config/vllm.py:2843 in 0.33.0, :2924 in 0.34.0), after compilation_config's repr:
# a line without it was cut before its end.
_CONFIG_END = re.compile(r", kernel_config=\S")
_SPEC_NONE = re.compile(r"speculative_config=None\b")
_SPEC = re.compile(r"speculative_config=SpeculativeConfig\(method=(?:'([^']*)'|None), model=.*?, "
                   r"num_spec_tokens=(\d+)\)")
_SETTING = {"tensor_parallel_size": re.compile(r"\btensor_parallel_size=(\d+)"),
            "max_model_len": re.compile(r"\bmax_seq_len=(\d+)"),
            "enforce_eager": re.compile(r"\benforce_eager=(True|False)")}
_ARG = {name: re.compile(rf"'{name}': ({_NUM})\b")
        for name in ("max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization", "max_model_len")}
# `--kv-cache-memory-bytes` (or vllm-serve.yaml's kv-cache-memory-bytes) as the CLI parsed it: a whole number of bytes
# (arg_utils.py human_readable_int), among the non-default args only when it is set.
_KV_PIN_ARG = re.compile(r"'kv_cache_memory_bytes': (\d+)\b")

GIB_RESOLUTION = 0.005
"""Half the last printed digit of a GiB figure (2 decimals)."""


class LogError(ValueError):
    """A log that cannot be read as one vLLM start-up; the message is one line."""


@dataclass
class WorkerFigures:
    """What one worker process logged (GiB as printed, seconds as printed); None where it logged no such line."""

    tag: str
    """vLLM's process tag, e.g. `Worker_TP1 pid=4242` (`EngineCore pid=...` with one GPU; "" when lines carry none)."""
    kv_available_gib: float | None = None
    """"Available KV cache memory": requested - non-KV - the graph-memory estimate it subtracted."""
    kv_reserved_gib: float | None = None
    """A pinned start-up's "reserved X GiB memory for KV Cache as specified by kv_cache_memory_bytes config" (the
    setting, to 2 decimals), logged in place of "Available KV cache memory": no profiling, no estimate."""
    initial_free_gib: float | None = None
    """... "Initial free memory F GiB" of the same line (free device memory when the worker started)."""
    v1_estimate_gib: float | None = None
    """"Estimated CUDA graph memory" (the V1 runner only)."""
    utilization: tuple[float, float] | None = None
    """(current, equivalent-without-the-estimate) gpu_memory_utilization from the hint (4 decimals each)."""
    estimate_disabled: bool = False
    """It warned that VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0 (no estimate subtracted)."""
    captures: list[tuple[float, float, bool]] = field(default_factory=list)
    """Every "Graph capturing finished in S secs, took G GiB", with whether it came after the KV (or pinned) line (the
    real
    capture; V2 logs its estimate's profiling capture too, before it)."""
    pool_actual_gib: float | None = None
    """"CUDA graph pool memory: X GiB (actual)" (the real capture's free-memory drop)."""
    pool_estimated_gib: float | None = None
    """... "Y GiB (estimated)": the estimate it made before the capture."""
    total_gib: float | None = None
    """Device memory, from the memory summary ("Free memory on device (F/T GiB)")."""
    requested_gib: float | None = None
    """ceil(total x gpu_memory_utilization), from the memory summary."""
    summary_utilization: float | None = None
    """gpu_memory_utilization as the memory summary prints it."""

    @property
    def real_capture(self) -> tuple[float, float] | None:
        """(seconds, GiB) of the real capture: the last capture line after the KV line (or the pinned one)."""
        real = [(s, g) for s, g, after in self.captures if after]
        return real[-1] if real else None


@dataclass
class StartupLog:
    """One vLLM start-up as its log tells it."""

    source: str
    """File name (or `stdin`)."""
    vllm_version: str
    """From the engine-config line."""
    capture_sizes: tuple[int, ...]
    """`cudagraph_capture_sizes` of the engine config (after vLLM's own normalisation; before V1's rewrite); a 0.34
    log: its two lists as keys (prefill token sizes, -n for a decode graph of n requests)."""
    cudagraph_mode: str | None
    """The engine config's `cudagraph_mode` (None when the line does not say)."""
    enforce_eager: bool
    num_speculative_tokens: int
    """K from `speculative_config` (0 when it is None)."""
    speculative_method: str | None
    settings: dict[str, float]
    """Serving settings the log states: tensor_parallel_size and max_model_len from the engine config; max_num_seqs,
    max_num_batched_tokens, gpu_memory_utilization (and max_model_len) from "non-default args" when the user set
    them."""
    v2_runner: bool
    """It logged "Using V2 Model Runner"."""
    kv_tokens: int | None
    """"GPU KV cache size: N tokens" (the engine's, once)."""
    max_concurrency: float | None
    concurrency_len: int | None
    """The `tokens per request` of the concurrency figure (max_model_len)."""
    workers: list[WorkerFigures]
    """Workers that logged their KV cache (or the KV cache they reserved, pinned), in order of first appearance."""
    starts: int = 1
    """Engine-config lines in the file (the last start-up is read)."""
    split_lists: bool = False
    """vLLM ran two capture lists (0.34: prefill token sizes and decode request sizes), read as `capture_sizes`."""
    kv_cache_memory_bytes: int | None = None
    """`kv_cache_memory_bytes` among the non-default args (the KV cache pinned per rank); None where they do not
    show it."""
    non_default_args: bool = False
    """The API server's "non-default args" line precedes the start-up (so a setting it lacks was not set)."""

    @property
    def runner(self) -> str | None:
        """`v2` when it said so or the log is of two lists (0.34, whose only runner is V2 and says nothing), `v1` when
        it logged V1's estimate line, else None."""
        if self.v2_runner or self.split_lists:
            return "v2"
        if any(w.v1_estimate_gib is not None for w in self.workers):
            return "v1"
        return None

    @property
    def estimate_disabled(self) -> bool:
        return any(w.estimate_disabled for w in self.workers)

    @property
    def kv_pinned(self) -> bool:
        """vLLM started with `--kv-cache-memory-bytes`, as its non-default args or a worker's reserved line show."""
        return self.kv_cache_memory_bytes is not None or any(w.kv_reserved_gib is not None for w in self.workers)

    @property
    def kv_profiled(self) -> bool:
        """A worker profiled its memory and sized the KV cache itself ("Available KV cache memory")."""
        return any(w.kv_available_gib is not None for w in self.workers)


def read_log(path: str | Path, data: bytes | None = None) -> tuple[str, str]:
    """(source name, text) of a log file, or of `data` (stdin's bytes) when given; LogError when it is not UTF-8."""
    source = "stdin" if data is not None else str(path)
    if data is None:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise LogError(f"--vllm-log: {source!r} cannot be read ({exc.strerror or exc})") from None
    try:
        return source, data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LogError(f"--vllm-log: {source} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                       f"{exc.start}); pass vLLM's log as it wrote it") from None


def _numbers(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text))


def _release(version: str) -> tuple[int, ...]:
    """(major, minor) of a printed version (`0.34.0` -> (0, 34)); () when it is not numeric."""
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else ()


def _split_keys(source: str, version: str, config: str, args: str) -> tuple[int, ...] | None:
    """A 0.34 log's two lists as keys: from the engine config (what vLLM resolved), else from the compilation config
    among the non-default args (what it was given); None for a log of one list (0.33's, which has neither field).
    LogError when a 0.34 log (by its fields or its version) states neither list anywhere, and ran graphs."""
    named = False
    for text in (config, args):
        found = {kind: m for kind, rx in _SPLIT.items() if (m := rx.search(text))}
        lists = {kind: _numbers(m.group(1)) for kind, m in found.items() if m.group(1) != "None"}
        if lists:
            return join_keys(lists.get("prefill", ()), lists.get("decode", ()))
        named = named or bool(found)
    if not named and not _release(version) >= (0, 34):
        return None
    mode = _MODE.search(config)
    if mode is not None and mode.group(1) == "NONE":  # no graphs: no list to read
        return ()
    raise LogError(f"--vllm-log: {source}: vLLM {version}'s engine-config line states neither "
                   f"'prefill_cudagraph_capture_token_sizes' nor 'decode_cudagraph_capture_request_sizes' (nor do its "
                   f"non-default args)")


def _engine_config(source: str, line: str, args: str) -> dict:
    m = _ENGINE_CONFIG.search(line)
    assert m is not None
    version, config = m.group(1), m.group(2)
    if not _CONFIG_END.search(config):
        # A line cut short would read as a config without its lists (as "ran without CUDA graphs", say).
        raise LogError(f"--vllm-log: {source}: vLLM {version}'s engine-config line is cut short (it ends before "
                       f"kernel_config=..., the last field VllmConfig writes): a log cut mid-line? pass the whole log")
    sizes = _SIZES.search(config)
    mode = _MODE.search(config)
    eager = _SETTING["enforce_eager"].search(config)
    spec = _SPEC.search(config)
    if spec is None and not _SPEC_NONE.search(config):
        raise LogError(f"--vllm-log: {source}: the engine-config line has no speculative_config vLLM 0.33 writes "
                       f"(SpeculativeConfig(method=..., model=..., num_spec_tokens=K) or None)")
    settings = {name: float(s.group(1)) for name, rx in _SETTING.items() if name != "enforce_eager"
                if (s := rx.search(config))}
    keys = _split_keys(source, version, config, args)
    return {"vllm_version": version, "split_lists": keys is not None,
            "capture_sizes": keys if keys is not None else _numbers(sizes.group(1)) if sizes else None,
            "cudagraph_mode": mode.group(1) if mode else None,
            "enforce_eager": bool(eager and eager.group(1) == "True"),
            "num_speculative_tokens": int(spec.group(2)) if spec else 0,
            "speculative_method": spec.group(1) if spec else None, "settings": settings}


def parse_startup_log(text: str, source: str = "log") -> StartupLog:
    """The last vLLM start-up in `text` (a whole server log). LogError (one line) when it holds none, or when its
    engine config has no capture list; completeness (the KV and capture lines) is the caller's to judge."""
    lines = [_ANSI.sub("", raw) for raw in text.splitlines()]
    starts = [i for i, line in enumerate(lines) if _ENGINE_CONFIG.search(line)]
    if not starts:
        raise LogError(f"--vllm-log: {source} holds no vLLM engine-config line (\"Initializing a V1 LLM engine (v...) "
                       f"with config: ...\"); pass the whole log from the start of `vllm serve`")
    first = starts[-1]
    # "non-default args" comes from the API server before the engine starts: the last one before this start-up.
    args = next((m.group(1) for line in reversed(lines[:first]) if (m := _NON_DEFAULT.search(line))), None)
    logged_args, args = args is not None, args or ""
    config = _engine_config(source, lines[first], args)
    if config["capture_sizes"] is None:
        raise LogError(f"--vllm-log: {source}: the engine-config line holds no 'cudagraph_capture_sizes'")
    settings = {name: float(m.group(1)) for name, rx in _ARG.items() if (m := rx.search(args))}
    settings.update(config.pop("settings"))
    figures = _startup_figures(lines[first + 1:])
    # Without the flag in "non-default args", the utilization the workers printed (hint, memory summary).
    printed = [u for w in figures["workers"]
               for u in (w.utilization[0] if w.utilization else None, w.summary_utilization) if u is not None]
    if printed and "gpu_memory_utilization" not in settings:
        settings["gpu_memory_utilization"] = printed[0]
    pin = _KV_PIN_ARG.search(args)
    return StartupLog(source=source, starts=len(starts), settings=settings, **config, **figures,
                      kv_cache_memory_bytes=int(pin.group(1)) if pin else None, non_default_args=logged_args)


def _startup_figures(lines: Iterable[str]) -> dict:
    """Every worker's figures and the engine's KV size, from the lines after the engine-config line."""
    workers: dict[str, WorkerFigures] = {}
    pending: dict[str, list[tuple[float, float, bool]]] = {}  # capture lines of a tag before its KV line
    v2 = False
    kv: tuple[int, float, int] | None = None
    for line in lines:
        tag_match = _TAG.search(line)
        tag = f"{tag_match.group(1)} pid={tag_match.group(2)}" if tag_match else ""
        if _V2_RUNNER.search(line):
            v2 = True
        elif m := _KV_AVAILABLE.search(line):
            w = workers.setdefault(tag, WorkerFigures(tag))
            w.kv_available_gib = float(m.group(1))
            w.captures[:0] = pending.pop(tag, [])
        elif m := _KV_RESERVED.search(line):
            w = workers.setdefault(tag, WorkerFigures(tag))
            w.initial_free_gib, w.kv_reserved_gib = float(m.group(1)), float(m.group(2))
            w.captures[:0] = pending.pop(tag, [])
        elif m := _KV_SIZE.search(line):
            kv = (int(m.group(2).replace(",", "")), float(m.group(4)), int(m.group(3).replace(",", "")))
        elif m := _CAPTURE.search(line):
            after = tag in workers and _sized(workers[tag])
            target = workers[tag].captures if after else pending.setdefault(tag, [])
            target.append((float(m.group(1)), float(m.group(2)), after))
        else:
            _worker_line(line, tag, workers)
    return {"v2_runner": v2, "workers": [w for w in workers.values() if _sized(w)],
            "kv_tokens": kv[0] if kv else None, "max_concurrency": kv[1] if kv else None,
            "concurrency_len": kv[2] if kv else None}


def _sized(w: WorkerFigures) -> bool:
    """The worker logged its KV cache: the one it sized, or the one it reserved as pinned."""
    return w.kv_available_gib is not None or w.kv_reserved_gib is not None


def _worker_line(line: str, tag: str, workers: dict[str, WorkerFigures]) -> None:
    """The per-worker lines that need no ordering: V1's estimate, the hint, the pool line, the memory summary."""
    def worker() -> WorkerFigures:
        return workers.setdefault(tag, WorkerFigures(tag))

    if m := _V1_ESTIMATE.search(line):
        worker().v1_estimate_gib = float(m.group(1))
    elif m := _UTIL_HINT.search(line):
        worker().utilization = (float(m.group(1)), float(m.group(2)))
    elif _ESTIMATE_DISABLED.search(line):
        worker().estimate_disabled = True
    elif m := _POOL.search(line):
        w = worker()
        w.pool_actual_gib, w.pool_estimated_gib = float(m.group(1)), float(m.group(2))
    elif m := _MEMORY_SUMMARY.search(line):
        w = worker()
        w.total_gib, w.summary_utilization, w.requested_gib = float(m.group(2)), float(m.group(3)), float(m.group(4))
