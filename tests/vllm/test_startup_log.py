"""Reading vLLM 0.33's start-up log (`tuner.engines.vllm.startup_log`): logs written from vLLM's own format strings
(tests/vllm_startup_logs.py quotes each with its file and line) with hand-made numbers, for the V1 and V2 runners, one
and two workers, vLLM's prefixes (process tags, VLLM_LOGGING_PREFIX, colour), and the logs it refuses. When the vLLM
0.33.0 wheel is at hand, every quoted format string is checked against the wheel's source at the quoted line."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import zipfile
from pathlib import Path

import pytest

import tuner.engines.vllm.log_lines as fx
from tuner.engines.vllm import log_writer
from tuner.engines.vllm.log_writer import GIB, VllmWorker, startup_log
from tuner.engines.vllm.startup_log import LogError, parse_startup_log, read_log

SIZES = [1, 2, 4, 8, 16, 17, 24, 32, 34, 512, 544, 2176]
# Hand-made figures (not measurements): worker 0 and worker 1 of a TP 2 deployment differ a little, as ranks do.
W0 = VllmWorker(kv_available_bytes=100.25 * GIB, estimate_bytes=3.67 * GIB, pool_bytes=3.31 * GIB, capture_s=21,
                process=("Worker_TP0", 5101), requested_bytes=126.9 * GIB)
W1 = VllmWorker(kv_available_bytes=100.19 * GIB, estimate_bytes=3.68 * GIB, pool_bytes=3.36 * GIB, capture_s=23,
                process=("Worker_TP1", 5102), requested_bytes=126.9 * GIB)
ONE = VllmWorker(kv_available_bytes=102.24 * GIB, estimate_bytes=3.67 * GIB, pool_bytes=3.15 * GIB, capture_s=18,
                 requested_bytes=126.9 * GIB)
KV = dict(kv_tokens=724_352, max_concurrency=88.42)


def parse(text: str):
    return parse_startup_log(text, "vllm.log")


def test_v2_one_gpu_reads_the_list_settings_and_the_real_capture_not_the_estimates_profiling_capture():
    log = parse(startup_log([ONE], capture_sizes=SIZES, method="dflash", k=16, max_num_seqs=128, **KV))
    assert log.capture_sizes == tuple(SIZES) and log.cudagraph_mode == "FULL_AND_PIECEWISE"
    assert (log.num_speculative_tokens, log.speculative_method) == (16, "dflash")
    assert log.settings == {"max_num_seqs": 128, "max_model_len": 8192, "tensor_parallel_size": 1,
                            "gpu_memory_utilization": 0.9}
    assert log.runner == "v2" and log.vllm_version == "0.33.0" and not log.estimate_disabled
    assert (log.kv_tokens, log.max_concurrency, log.concurrency_len) == (724_352, 88.42, 8192)
    [w] = log.workers
    assert w.tag == "EngineCore pid=4100"  # one GPU: the worker runs inside the engine-core process
    assert w.kv_available_gib == 102.24 and w.pool_actual_gib == 3.15 and w.pool_estimated_gib == 3.67
    # V2 logs "Graph capturing finished" twice: its estimate's throwaway capture (before the KV line), then the real
    # one.
    assert [after for _, _, after in w.captures] == [False, True]
    assert w.real_capture == (18.0, 3.15)
    assert w.utilization == (0.9, round(0.9 - 3.67 / 150, 4))
    assert (w.total_gib, w.requested_gib, w.summary_utilization) == (150.0, 126.9, 0.9)


def test_v1_is_told_by_its_estimate_line_and_logs_one_capture():
    log = parse(startup_log([ONE], capture_sizes=[25, 50, 75], runner="v1", method="suffix", k=24, **KV))
    assert log.runner == "v1" and log.speculative_method == "suffix" and log.num_speculative_tokens == 24
    [w] = log.workers
    assert w.v1_estimate_gib == 3.67 and len(w.captures) == 1 and w.real_capture == (18.0, 3.15)


def test_two_workers_are_read_apart_by_their_process_tags():
    log = parse(startup_log([W0, W1], capture_sizes=SIZES, runner="v1", method="suffix", k=8, **KV))
    assert log.settings["tensor_parallel_size"] == 2
    assert [w.tag for w in log.workers] == ["Worker_TP0 pid=5101", "Worker_TP1 pid=5102"]
    assert [w.kv_available_gib for w in log.workers] == [100.25, 100.19]
    assert [w.real_capture for w in log.workers] == [(21.0, 3.31), (23.0, 3.36)]
    assert [w.v1_estimate_gib for w in log.workers] == [3.67, 3.68]


@pytest.mark.parametrize("style", [dict(prefix="[node-3] "), dict(color=True), dict(prefix="srv| ", color=True)])
def test_vllms_logging_prefix_and_colour_change_nothing(style):
    plain = parse(startup_log([W0, W1], capture_sizes=SIZES, method="eagle", k=3, **KV))
    styled = parse(startup_log([W0, W1], capture_sizes=SIZES, method="eagle", k=3, **KV, **style))
    assert styled == plain


def test_a_dp_engine_tag_and_lines_without_any_tag_are_read_too():
    text = startup_log([ONE], capture_sizes=SIZES, **KV).replace("(EngineCore pid=4100)", "(EngineCore_DP0 pid=77)")
    assert parse(text).workers[0].tag == "EngineCore_DP0 pid=77"
    untagged = "\n".join(line.split(") ", 1)[1] for line in text.splitlines())  # e.g. a handler without the tag
    log = parse(untagged)
    assert [w.tag for w in log.workers] == [""] and log.workers[0].real_capture == (18.0, 3.15)


def test_other_lines_are_ignored_and_of_two_start_ups_the_last_is_read():
    first = startup_log([ONE], capture_sizes=[1, 2, 4], **KV)
    second = startup_log([W0, W1], capture_sizes=SIZES, method="eagle", k=3, max_num_seqs=64, **KV)
    noise = "Traceback (most recent call last):\nGET /v1/models 200 OK\n\x00 binary-looking but UTF-8 line\n"
    log = parse(noise + first + noise + second + noise)
    assert log.starts == 2 and log.capture_sizes == tuple(SIZES) and log.settings["max_num_seqs"] == 64
    assert [w.tag for w in log.workers] == ["Worker_TP0 pid=5101", "Worker_TP1 pid=5102"]


def test_the_list_is_read_from_cudagraph_capture_sizes_not_the_decoder_replay_list_beside_it():
    text = startup_log([ONE], capture_sizes=SIZES, **KV).replace(
        "'decoder_replay_cudagraph_capture_sizes': []", "'decoder_replay_cudagraph_capture_sizes': [3, 5]")
    assert "[3, 5]" in text and parse(text).capture_sizes == tuple(SIZES)


def test_the_estimate_switched_off_is_seen_from_vllms_warning():
    log = parse(startup_log([ONE], capture_sizes=SIZES, estimate_enabled=False, **KV))
    assert log.estimate_disabled and log.workers[0].utilization is None


def test_enforce_eager_logs_no_graph_lines():
    log = parse(startup_log([ONE], capture_sizes=SIZES, enforce_eager=True, **KV))
    assert log.enforce_eager and log.capture_sizes == () and log.workers[0].captures == []


def test_a_truncated_log_keeps_what_it_has():
    log = parse(startup_log([ONE], capture_sizes=SIZES, end_after="Available KV cache memory", **KV))
    assert log.workers[0].kv_available_gib == 102.24 and log.workers[0].real_capture is None and log.kv_tokens is None


def test_a_log_without_the_engine_config_line_is_refused_in_one_line():
    text = "\n".join(line for line in startup_log([ONE], capture_sizes=SIZES, **KV).splitlines()
                     if "Initializing a V1 LLM engine" not in line)
    with pytest.raises(LogError, match=r"^--vllm-log: vllm.log holds no vLLM engine-config line") as exc:
        parse(text)
    assert "\n" not in str(exc.value)


def test_a_non_utf8_file_is_refused_naming_the_byte(tmp_path):
    path = tmp_path / "vllm.log"
    path.write_bytes(startup_log([ONE], capture_sizes=SIZES, **KV).encode() + b"\xff\xfe garbage\n")
    with pytest.raises(LogError, match=r"is not UTF-8 text \(byte 0xff at offset \d+\)"):
        read_log(path)
    assert read_log("-", b"plain\n") == ("stdin", "plain\n")


# ---------------------------------------------------------------------------------------------- the wheel itself
WHEEL = Path(os.environ.get("CGTUNE_VLLM_WHEEL", "/tmp/wheels/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"))
REQUIRED = os.environ.get("CGTUNE_REQUIRE_VLLM") == "1"
"""CI installs vLLM 0.33.0 (--no-deps) and sets this: the check then reads the installed package's source and may not
skip."""


def _installed_vllm_033() -> Path | None:
    """The installed vllm package's folder when it is 0.33.0 (found without importing it: its import sets
    process-wide options), else None."""
    try:
        if importlib.metadata.version("vllm") != "0.33.0":
            return None
    except importlib.metadata.PackageNotFoundError:
        return None
    spec = importlib.util.find_spec("vllm")
    return Path(next(iter(spec.submodule_search_locations))).parent if spec and spec.submodule_search_locations \
        else None


def _vllm_sources(names: set[str]) -> dict[str, str] | None:
    """vLLM 0.33.0's source files by their path in the wheel: from the installed package, else from the wheel file."""
    root = _installed_vllm_033()
    if root is not None:
        return {name: (root / name).read_text() for name in names}
    if WHEEL.is_file():
        with zipfile.ZipFile(WHEEL) as wheel:
            return {name: wheel.read(name).decode() for name in names}
    return None


QUOTED = [  # (format string in the fixtures, file in the wheel, line of the logging call)
    (fx.ENGINE_CONFIG, "vllm/v1/engine/core.py", 139),
    (fx.NON_DEFAULT_ARGS, "vllm/entrypoints/common/startup.py", 96),
    (fx.V2_RUNNER, "vllm/v1/worker/gpu_worker.py", 513),
    (fx.LOADING, "vllm/v1/worker/gpu/model_runner.py", 399),
    (fx.MODEL_LOADING, "vllm/v1/worker/gpu/model_runner.py", 428),
    (fx.V1_ESTIMATE, "vllm/v1/worker/gpu_model_runner.py", 6409),
    (fx.KV_AVAILABLE, "vllm/v1/worker/gpu_worker.py", 772),
    (fx.UTIL_HINT, "vllm/v1/worker/gpu_worker.py", 787),
    (fx.ESTIMATE_DISABLED, "vllm/v1/worker/gpu_worker.py", 804),
    (fx.KV_SIZE, "vllm/v1/core/kv_cache_utils.py", 1147),
    (fx.WARMUP, "vllm/v1/worker/gpu_worker.py", 971),
    (fx.CAPTURE, "vllm/v1/worker/gpu/model_runner.py", 1163),
    (fx.CAPTURE, "vllm/v1/worker/gpu_model_runner.py", 6516),
    (fx.POOL, "vllm/v1/worker/gpu_worker.py", 1003),
]


def _literal_at(source: str, line: int) -> str:
    """The format string of the logging call that starts at `line` (adjacent literals joined, as Python joins them)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and node.lineno == line and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                return arg.value
    raise AssertionError(f"no logging call with a literal format string starts at line {line}")


def test_every_quoted_format_string_is_the_wheels_own_at_the_quoted_line():
    sources = _vllm_sources({f for _, f, _ in QUOTED} | {"vllm/logger.py", "vllm/v1/worker/gpu_worker.py"})
    if sources is None:
        reason = f"vLLM 0.33.0 neither installed nor its wheel at {WHEEL} (set CGTUNE_VLLM_WHEEL)"
        if REQUIRED:
            pytest.fail(f"CGTUNE_REQUIRE_VLLM=1 but {reason}")
        pytest.skip(reason)
    for fmt, name, line in QUOTED:
        assert _literal_at(sources[name], line) == fmt, f"{name}:{line}"
    # vllm/logger.py:28: the line format (an f-string: VLLM_LOGGING_PREFIX, then these literal parts).
    assert "".join(_fstring_parts(sources["vllm/logger.py"], 28)) == log_writer._FORMAT
    # v1/worker/gpu_worker.py:1044: the memory summary's f-string: its literal parts, in order, in the fixture's line.
    summary = startup_log([ONE], capture_sizes=SIZES, **KV).splitlines()[-1]
    at = 0
    for part in _fstring_parts(sources["vllm/v1/worker/gpu_worker.py"], 1044):
        at = summary.index(part, at) + len(part)


def _fstring_parts(source: str, line: int) -> list[str]:
    """The literal parts of the f-string assigned at `line`."""
    [value] = [n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Assign) and n.lineno == line]
    assert isinstance(value, ast.JoinedStr)
    return [p.value for p in value.values if isinstance(p, ast.Constant)]


def test_the_pinned_start_ups_line_is_the_wheels_f_string_logged_where_quoted():
    """A pinned start-up's line (KV_RESERVED_PARTS: gpu_worker.py's f-string, `logger.info(msg)` below it) in 0.33.0."""
    name, fstring_line, call_line = fx.KV_RESERVED_AT
    sources = _vllm_sources({name})
    if sources is None:
        reason = f"vLLM 0.33.0 neither installed nor its wheel at {WHEEL} (set CGTUNE_VLLM_WHEEL)"
        if REQUIRED:
            pytest.fail(f"CGTUNE_REQUIRE_VLLM=1 but {reason}")
        pytest.skip(reason)
    assert _fstring_parts(sources[name], fstring_line) == list(fx.KV_RESERVED_PARTS)
    [call] = [n for n in ast.walk(ast.parse(sources[name])) if isinstance(n, ast.Call) and n.lineno == call_line]
    assert ast.unparse(call) == "logger.info(msg)"


@pytest.mark.parametrize(("version", "lists"), [
    ("0.33.0", dict(capture_sizes=SIZES)),
    # 0.34: two lists, the decode list first in the compilation config, as the shipped DFlash list has it.
    ("0.34.0", dict(capture_sizes=[-128, -64, -34], record=[578, 1088, 2176], extensible=True)),
])
@pytest.mark.parametrize("keep", [0.2, 0.5, 0.8, 0.95, 0.99])
def test_an_engine_config_line_cut_mid_line_is_refused_not_read_as_another_config(version, lists, keep):
    # Issue 50: a 0.34 log cut inside the compilation config read as "vLLM ran without CUDA graphs". VllmConfig's
    # line ends with kernel_config (config/vllm.py:2843 in 0.33.0, :2924 in 0.34.0): without it the line was cut.
    whole = startup_log([ONE], method="dflash", k=16, max_num_seqs=128, version=version, **lists, **KV)
    assert parse(whole).vllm_version == version
    lines = whole.splitlines()
    at = next(i for i, line in enumerate(lines) if "Initializing a V1 LLM engine" in line)
    cut = "\n".join([*lines[:at], lines[at][:int(len(lines[at]) * keep)]])
    with pytest.raises(LogError, match=rf"^--vllm-log: vllm.log: vLLM {version}'s engine-config line is cut short "
                                       rf"\(it ends before kernel_config=") as exc:
        parse(cut)
    assert "\n" not in str(exc.value)
