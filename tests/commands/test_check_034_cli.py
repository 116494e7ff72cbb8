"""`cgtune check` and `cgtune example` under vLLM 0.34's rules: the shipped DFlash workload and synthetic profile go
through search, report and `check` against a vLLM 0.34 start-up log (the extensible KV cache: no graph-memory estimate,
"Available KV cache memory" the capacity reserved before capture, the KV cache sized after it); a 0.34 log read line
by line; the logs a 0.34 run refuses, in one line with exit 2. When vLLM 0.34.0's code is at hand (CGTUNE_VLLM034_PATH,
a `pip install --no-deps --target DIR vllm==0.34.0` directory), every 0.34 format string the writer uses is held to
the source at its quoted line, and the compilation configs it prints to 0.34's own repr of them.

The profile is a fixture (benchmarks/bench_search.py wrote it) and every log here is BUILT FROM THE RUN'S OWN
PREDICTIONS or from hand-made figures, with made-up errors put in: these tests hold the plumbing, the parsing and the
labels, not any prediction."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # tests/ helpers (import-mode=importlib)
from cli_runner import run  # noqa: E402

from tuner.check.example import LOG_NAME, MADE_UP_ERRORS, predicted_log  # noqa: E402
from tuner.cli import main  # noqa: E402
from tuner.engines.vllm import log_writer  # noqa: E402
from tuner.engines.vllm.log_writer import GIB, VllmWorker, compilation_fields_034, startup_log  # noqa: E402
from tuner.engines.vllm.startup_log import parse_startup_log  # noqa: E402
from tuner.engines.vllm.v034 import log_lines as v034  # noqa: E402
from tuner.engines.vllm.v034.emit import compilation_config_034  # noqa: E402
from tuner.engines.vllm.versions import VERSION_ENV  # noqa: E402
from tuner.workload.spec import load_workload  # noqa: E402

ROWS_034 = ["kv_capacity_bytes", "kv_tokens", "max_concurrency", "graph_pool_bytes", "capture_s", "non_kv_cache_bytes"]
"""The rows of a 0.34 check under the extensible KV cache, in table order: no estimate to compare."""


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """`cgtune example --vllm-version 0.34 --out DIR` from the checkout: (exit code, stdout, DIR)."""
    out = tmp_path_factory.mktemp("example034") / "run"
    stdout = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(stdout):
        mp.chdir(ROOT)
        code = main(["example", "--out", str(out), "--trials", "4", "--no-progress", "--vllm-version", "0.34"])
    return code, stdout.getvalue(), out


@pytest.fixture()
def under_034(monkeypatch):
    """The run directory's workload read under 0.34's rules in this process (the suite pins 0.33)."""
    monkeypatch.setenv(VERSION_ENV, "0.34")


def _summary(out: Path) -> tuple[dict, dict]:
    summary = json.loads((out / "summary.json").read_text())
    return summary, summary["compact" if summary["shipped"]["list"] == "compact" else "tuned"]


def _table(stdout: str) -> dict[str, list[str]]:
    """The check step's table rows by quantity name."""
    check = stdout[stdout.index("== cgtune check"):]
    return {line.split()[0]: line.split() for line in check.splitlines()
            if line.split() and line.split()[0] in {*ROWS_034, "kv_available_bytes", "vllm_graph_estimate_bytes"}}


# ---------------------------------------------------------------------------------------------- cgtune example
def test_the_034_example_runs_search_report_and_check_with_034s_files_and_log(example):
    code, stdout, out = example
    assert code == 0
    steps = [line for line in stdout.splitlines() if line.startswith("== ")]
    assert [s.split()[1:3] for s in steps] == [["cgtune", "search"], ["cgtune", "report"],
                                               ["wrote", f"{out / LOG_NAME}:"], ["cgtune", "check"], ["done:", "every"]]
    cc = json.loads((out / "compilation_config.json").read_text())
    assert "cudagraph_capture_sizes" not in cc and "decode_cudagraph_capture_request_sizes" in cc
    log = (out / LOG_NAME).read_text()
    assert log.startswith("# SYNTHETIC: not vLLM's output. cgtune example wrote this start-up log in vLLM 0.34's "
                          "format")
    assert "Initializing a V1 LLM engine (v0.34.0)" in log and "Using V2 Model Runner" not in log
    assert f"cgtune check {out} against vLLM 0.34.0's log {out / LOG_NAME}" in stdout


def test_the_034_check_table_compares_what_034_logs_with_the_errors_put_in(example):
    _, stdout, out = example
    summary, shipped = _summary(out)
    table = _table(stdout)
    assert list(table) == ROWS_034  # no estimate row, and the capacity in place of 0.33's KV row
    kv, pool = MADE_UP_ERRORS["kv_error"], MADE_UP_ERRORS["pool_error"]
    capacity = summary["requested_bytes"] - summary["non_kv_cache_bytes"]
    assert table["kv_capacity_bytes"][1] == f"{capacity / GIB:.3f}"  # predicted: requested - non-KV
    assert abs(float(table["kv_capacity_bytes"][5].rstrip("%")) - 100 * kv) < 0.05
    # The KV cache kept (sized after capture): 2% smaller, counted in vLLM's whole 16-token blocks.
    assert table["kv_tokens"][1] == f"{shipped['kv_tokens']:,}"
    assert abs(float(table["kv_tokens"][3].rstrip("%")) - 100 * kv) < 0.05  # no unit column for tokens and x
    assert abs(float(table["max_concurrency"][3].rstrip("%")) - 100 * kv) < 0.05
    # The real capture's "took X GiB": 5% larger, to within the line's 2 decimals.
    assert table["graph_pool_bytes"][1] == f"{shipped['graph_memory_bytes'] / GIB:.3f}"
    assert abs(float(table["graph_pool_bytes"][5].rstrip("%")) - 100 * pool) < 0.5
    assert "note: vLLM 0.34 makes no graph-memory estimate under the extensible KV cache" in stdout
    assert "mirrors vLLM" not in stdout  # the log's release is the run's
    prefill, decode = (shipped["prefill_cudagraph_capture_token_sizes"],
                       shipped["decode_cudagraph_capture_request_sizes"])
    assert (f"vLLM ran the run's list as written ({len(prefill) + len(decode)} sizes, max {max(decode, default=0)} "
            f"requests, {max(prefill, default=0)} tokens); runner V2 (predicted V2)") in stdout


def test_the_034_check_json_holds_each_row_to_the_run_and_the_log(example, capsys):
    _, _, out = example
    code, stdout, err = run(capsys, "check", out, "--vllm-log", out / LOG_NAME, "--json", "--vllm-version", "0.34")
    assert code == 0, err
    result = json.loads(stdout)
    summary, shipped = _summary(out)
    q = result["quantities"]
    assert list(q) == ROWS_034 and result["vllm_version"] == "0.34.0" and result["runner"] == "v2"
    assert result["capture_sizes"] == summary["shipped"]["capture_sizes"]  # the keys the run ships
    assert q["kv_capacity_bytes"]["predicted"] == summary["requested_bytes"] - summary["non_kv_cache_bytes"]
    assert q["kv_capacity_bytes"]["source"] == "Available KV cache memory"
    assert q["kv_tokens"]["predicted"] == shipped["kv_tokens"]
    assert q["graph_pool_bytes"]["predicted"] == shipped["graph_memory_bytes"]
    assert q["graph_pool_bytes"]["logged"] == pytest.approx(1.05 * shipped["graph_memory_bytes"], abs=0.005 * GIB)
    # vLLM's non-KV memory: requested (memory summary) - the capacity, no estimate subtracted.
    assert q["non_kv_cache_bytes"]["predicted"] == summary["non_kv_cache_bytes"]


def test_calibrating_on_a_034_log_repredicts_the_capacity(example, capsys, tmp_path):
    _, _, out = example
    code, stdout, err = run(capsys, "check", out, "--vllm-log", out / LOG_NAME, "--json", "--calibrate",
                            tmp_path / "cal.json", "--vllm-version", "0.34")
    assert code == 0, err
    calibration = json.loads(stdout)["calibration"]
    again = calibration["repredicted"]
    assert list(again) == ["kv_capacity_bytes", "graph_pool_bytes", "non_kv_cache_bytes"]
    for name in again:  # the calibrated profile puts every figure at vLLM's, to within the log's rounding
        assert again[name]["predicted"] == pytest.approx(again[name]["logged"], abs=0.01 * GIB), name


# ---------------------------------------------------------------------------------------------- refusals
def _refused(capsys, out: Path, log: Path) -> str:
    code, stdout, err = run(capsys, "check", out, "--vllm-log", log, "--vllm-version", "0.34")
    assert code == 2 and stdout == "" and err.count("\n") == 1, err
    return err


def test_a_033_log_for_a_034_run_is_refused_naming_both_releases(example, capsys, tmp_path, under_034):
    _, _, out = example
    engine = load_workload(out / "workload.yaml").engine
    keys = json.loads((out / "summary.json").read_text())["shipped"]["capture_sizes"]
    # The same deployment as 0.33 would log it: one list of the graphs' token widths.
    path = tmp_path / "vllm-033.log"
    path.write_text(predicted_log(out, kv_error=0.0, pool_error=0.0, version="0.33.0",
                                  capture_sizes=engine.key_widths(keys)))
    err = _refused(capsys, out, path)
    assert err == (f"cgtune check: error: --vllm-log: {path}: the log is of vLLM 0.33.0, which ran one capture list; "
                   f"the run follows vLLM 0.34's rules (two capture lists): start vLLM 0.34 with the run's "
                   f"vllm-serve.yaml, or tune for the log's release (--vllm-version 0.33)\n")


@pytest.mark.parametrize(("end_after", "why"), [
    ("Available KV cache memory", "ends before vLLM logged its KV cache size"),
    # 0.34 sizes the KV cache after the capture: a log cut after the capture still lacks the KV size.
    ("Graph capturing finished", "ends before vLLM logged its KV cache size"),
    ("Loading model from scratch", "ends before vLLM sized its KV cache"),
])
def test_a_truncated_034_log_is_refused_in_one_line(example, capsys, tmp_path, under_034, end_after, why):
    _, _, out = example
    path = tmp_path / "cut.log"
    path.write_text(predicted_log(out, kv_error=0.0, pool_error=0.0, end_after=end_after))
    assert _refused(capsys, out, path).startswith(f"cgtune check: error: --vllm-log: {path} {why}")


def test_a_034_log_of_another_list_names_both_lists(example, capsys, tmp_path, under_034):
    _, _, out = example
    path = tmp_path / "other.log"
    path.write_text(predicted_log(out, kv_error=0.0, pool_error=0.0, capture_sizes=[-2, -1, 1, 2, 4]))
    err = _refused(capsys, out, path)
    assert ("vLLM ran decode_cudagraph_capture_request_sizes=[1, 2] (2 sizes, max 2), "
            "prefill_cudagraph_capture_token_sizes=[1, 2, 4] (3 sizes, max 4), not the run's lists "
            "decode_cudagraph_capture_request_sizes=[") in err


def test_a_034_log_with_an_estimate_ran_without_the_extensible_kv_cache(example, capsys, tmp_path, under_034):
    _, _, out = example
    keys = json.loads((out / "summary.json").read_text())["shipped"]["capture_sizes"]
    worker = VllmWorker(kv_available_bytes=100 * GIB, estimate_bytes=1.5 * GIB, pool_bytes=1.4 * GIB, capture_s=2)
    path = tmp_path / "estimate.log"
    path.write_text(startup_log([worker], capture_sizes=keys, kv_tokens=700_000, max_concurrency=85.45, method="dflash",
                                k=16, max_num_seqs=128, gpu_memory_utilization=0.9, version="0.34.0", extensible=False))
    assert _refused(capsys, out, path) == (
        f"cgtune check: error: --vllm-log: {path}: vLLM logged a graph-memory estimate, so it sized the KV cache "
        f"without the extensible KV cache; the run's workload has it (serving.extensible_kv_cache: true)\n")


def test_a_034_log_without_its_lists_is_refused_in_one_line(example, capsys, tmp_path, under_034):
    _, _, out = example
    text = predicted_log(out, kv_error=0.0, pool_error=0.0)
    for field in ("prefill_cudagraph_capture_token_sizes", "decode_cudagraph_capture_request_sizes"):
        text = text.replace(f"'{field}'", "'gone'")
    path = tmp_path / "nolists.log"
    path.write_text(text)
    assert _refused(capsys, out, path) == (
        f"cgtune check: error: --vllm-log: {path}: vLLM 0.34.0's engine-config line states neither "
        f"'prefill_cudagraph_capture_token_sizes' nor 'decode_cudagraph_capture_request_sizes' (nor do its "
        f"non-default args)\n")


def test_a_later_releases_log_gets_a_note_naming_the_runs_release(example, tmp_path, under_034):
    from tuner.check.predictions import check_run

    _, _, out = example
    text = predicted_log(out, kv_error=0.0, pool_error=0.0).replace("(v0.34.0)", "(v0.35.1)")
    result = check_run(out, parse_startup_log(text, "vllm.log"))
    assert "the log is of vLLM 0.35.1; cgtune mirrors vLLM 0.34's rules" in result.notes


# ---------------------------------------------------------------------------------------------- a 0.34 log, read
KEYS = [-30, -16, -4, -2, -1, 1, 2, 4, 8, 512]
W0 = VllmWorker(kv_available_bytes=104.5 * GIB, estimate_bytes=0.0, pool_bytes=1.62 * GIB, capture_s=9,
                process=("Worker_TP0", 5101), requested_bytes=126.9 * GIB)
W1 = VllmWorker(kv_available_bytes=104.46 * GIB, estimate_bytes=0.0, pool_bytes=1.66 * GIB, capture_s=10,
                process=("Worker_TP1", 5102), requested_bytes=126.9 * GIB)
LOG_034 = dict(capture_sizes=KEYS, kv_tokens=681_232, max_concurrency=83.16, method="dflash", k=16, max_num_seqs=128,
               gpu_memory_utilization=0.9, version="0.34.0")


def _messages(text: str) -> list[tuple[str, str]]:
    """(the `[file:line]` vLLM printed, the message) of every line."""
    out = []
    for line in text.splitlines():
        head, message = line.split("] ", 1)
        out.append((head.rsplit("[", 1)[1], message))
    return out


def _at(fmt: str) -> str:
    name, line = v034.WHERE[fmt]
    return f"{name.rsplit('/', 1)[1]}:{line}"


def test_a_034_log_is_written_line_by_line_in_034s_order_through_034s_format_strings():
    text = startup_log([W0, W1], **LOG_034)
    lines = _messages(text)
    summary_file, _, summary_line = v034.MEMORY_SUMMARY_AT
    summary_at = f"{summary_file.rsplit('/', 1)[1]}:{summary_line}"
    assert [where for where, _ in lines] == [
        _at(v034.NON_DEFAULT_ARGS), _at(v034.ENGINE_CONFIG),
        _at(v034.LOADING), _at(v034.MODEL_LOADING), _at(v034.LOADING), _at(v034.MODEL_LOADING),
        _at(v034.KV_AVAILABLE), _at(v034.KV_AVAILABLE),  # the capacity; no estimate, so no hint
        _at(v034.CAPTURE), summary_at, _at(v034.CAPTURE), summary_at,  # the real capture, then ...
        _at(v034.KV_SIZE),  # ... the KV cache sized after it
    ]
    messages = [m for _, m in lines]
    assert messages[6:8] == [v034.KV_AVAILABLE % "104.5", v034.KV_AVAILABLE % "104.46"]
    assert messages[8] == v034.CAPTURE % (9, 1.62) and messages[10] == v034.CAPTURE % (10, 1.66)
    assert messages[12] == v034.KV_SIZE % ("GPU", "681,232", "8,192", 83.16)
    assert messages[0].startswith("non-default args: {'model_tag': 'meta-llama/Llama-3.1-8B-Instruct', 'config': "
                                  "'vllm-serve.yaml', 'max_num_seqs': 128, 'gpu_memory_utilization': 0.9, "
                                  "'compilation_config': {'mode': None, ")
    assert messages[1].startswith(v034.ENGINE_CONFIG.split("%s")[0] + "0.34.0) with config: model=")
    assert "Graph capturing finished" not in text.split("Available KV cache memory")[0]  # no profiling capture


def test_a_034_log_is_read_back_two_lists_as_keys_each_workers_figures():
    log = parse_startup_log(startup_log([W0, W1], **LOG_034), "vllm.log")
    assert log.split_lists and log.capture_sizes == tuple(KEYS) and log.vllm_version == "0.34.0"
    assert log.runner == "v2" and log.cudagraph_mode == "FULL_AND_PIECEWISE" and not log.estimate_disabled
    assert (log.num_speculative_tokens, log.speculative_method) == (16, "dflash")
    assert log.settings == {"max_num_seqs": 128, "gpu_memory_utilization": 0.9, "tensor_parallel_size": 2,
                            "max_model_len": 8192}
    assert (log.kv_tokens, log.max_concurrency, log.concurrency_len) == (681_232, 83.16, 8192)
    assert [w.tag for w in log.workers] == ["Worker_TP0 pid=5101", "Worker_TP1 pid=5102"]
    assert [w.kv_available_gib for w in log.workers] == [104.5, 104.46]
    assert [w.real_capture for w in log.workers] == [(9.0, 1.62), (10.0, 1.66)]
    for w in log.workers:  # no estimate of any kind
        assert (w.pool_actual_gib, w.pool_estimated_gib, w.utilization, w.v1_estimate_gib) == (None, None, None, None)
        assert (w.total_gib, w.requested_gib, w.summary_utilization) == (150.0, 126.9, 0.9)


def test_a_034_log_without_the_extensible_kv_cache_is_033s_flow_in_034s_strings():
    est = [VllmWorker(kv_available_bytes=100.0 * GIB, estimate_bytes=3.0 * GIB, pool_bytes=3.1 * GIB, capture_s=12)]
    lines = _messages(startup_log(est, **LOG_034, extensible=False))
    assert [where for where, _ in lines][2:] == [
        _at(v034.LOADING), _at(v034.MODEL_LOADING), _at(v034.CAPTURE), _at(v034.KV_AVAILABLE), _at(v034.UTIL_HINT),
        _at(v034.KV_SIZE), _at(v034.CAPTURE), _at(v034.POOL)]
    off = startup_log(est, **LOG_034, extensible=False, estimate_enabled=False)
    assert v034.ESTIMATE_DISABLED in off and "and increasing" not in off and "CUDA graph pool memory" not in off
    log = parse_startup_log(off, "vllm.log")
    assert log.estimate_disabled and log.workers[0].real_capture == (12.0, 3.1)


def test_the_lists_are_read_from_the_non_default_args_when_the_engine_config_lacks_them():
    text = startup_log([W0], **LOG_034)
    head, engine_line, rest = text.split("\n", 2)
    for field in ("prefill_cudagraph_capture_token_sizes", "decode_cudagraph_capture_request_sizes"):
        engine_line = engine_line.replace(f"'{field}'", "'gone'")
    assert parse_startup_log("\n".join([head, engine_line, rest]), "vllm.log").capture_sizes == tuple(KEYS)


def test_the_writer_refuses_a_v1_runner_and_an_unknown_release():
    with pytest.raises(ValueError, match="V2 model runner only"):
        startup_log([W0], **{**LOG_034, "runner": "v1"})
    with pytest.raises(ValueError, match="0.33's and 0.34's start-up logs only"):
        startup_log([W0], **{**LOG_034, "version": "0.35.0"})


# ---------------------------------------------------------------------------------------------- the 0.34 wheel itself
REQUIRED = os.environ.get("CGTUNE_REQUIRE_VLLM") == "1"
"""CI puts vLLM 0.34.0's code in a --target directory and sets this: the checks then may not skip."""


def _vllm034() -> Path:
    path = os.environ.get("CGTUNE_VLLM034_PATH")
    if not path or not (Path(path) / "vllm").is_dir():
        reason = ("CGTUNE_VLLM034_PATH does not name vLLM 0.34.0's code (pip install --target DIR --no-deps "
                  "vllm==0.34.0)")
        if REQUIRED:
            pytest.fail(f"CGTUNE_REQUIRE_VLLM=1 but {reason}")
        pytest.skip(reason)
    return Path(path)


def _call_at(source: str, line: int) -> ast.Call:
    """The logging call that starts at `line`."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and node.lineno == line and node.args:
            return node
    raise AssertionError(f"no call with arguments starts at line {line}")


def _literal_at(source: str, line: int) -> str:
    """The format string of the logging call that starts at `line` (adjacent literals joined, as Python joins them)."""
    arg = _call_at(source, line).args[0]
    assert isinstance(arg, ast.Constant) and isinstance(arg.value, str), f"line {line}: no literal format string"
    return arg.value


def _fstring_parts(source: str, line: int, *, assigned: bool = True) -> list[str]:
    """The literal parts of the f-string assigned (else returned) at `line`."""
    kind = ast.Assign if assigned else ast.Return
    [value] = [n.value for n in ast.walk(ast.parse(source)) if isinstance(n, kind) and n.lineno == line]
    assert isinstance(value, ast.JoinedStr)
    return [p.value for p in value.values if isinstance(p, ast.Constant)]


def _in_order(text: str, parts: list[str]) -> None:
    at = 0
    for part in parts:
        at = text.index(part, at) + len(part)


def test_every_034_format_string_is_the_wheels_own_at_the_quoted_line():
    root = _vllm034()
    assert (root / "vllm-0.34.0.dist-info").is_dir(), f"{root} holds another vLLM than 0.34.0"
    read = {name: (root / name).read_text() for name in {f for f, _ in v034.WHERE.values()}
            | {"vllm/logger.py", "vllm/config/vllm.py", "vllm/config/speculative.py", v034.MEMORY_SUMMARY_AT[0]}}
    for fmt, (name, line) in v034.WHERE.items():
        assert _literal_at(read[name], line) == fmt, f"{name}:{line}"
    # vllm/logger.py:28: the line format (an f-string: VLLM_LOGGING_PREFIX, then these literal parts).
    assert "".join(_fstring_parts(read["vllm/logger.py"], 28)) == log_writer._FORMAT
    text = startup_log([W0], **LOG_034)
    lines = text.splitlines()
    # gpu_worker.py:1153: the memory summary's f-string, logged at :1175 (`logger.info(msg)`).
    name, fstring_line, call_line = v034.MEMORY_SUMMARY_AT
    call = _call_at(read[name], call_line)
    assert isinstance(call.args[0], ast.Name) and call.args[0].id == "msg"
    _in_order(next(line for line in lines if "Free memory on device" in line), _fstring_parts(read[name], fstring_line))
    # config/vllm.py:2890 VllmConfig.__str__ and config/speculative.py:1829 SpeculativeConfig.__repr__: the engine
    # config line's literal parts, in order.
    engine_line = next(line for line in lines if "Initializing a V1 LLM engine" in line)
    _in_order(engine_line, _fstring_parts(read["vllm/config/vllm.py"], 2891, assigned=False))
    assert "SpeculativeConfig(method='dflash', model='z-lab/dflash-draft', num_spec_tokens=16)" in engine_line
    assert 'return f"SpeculativeConfig({method=}, {model=}, {num_spec_tokens=})"' in read["vllm/config/speculative.py"]
    # gpu_worker.py:696: a pinned start-up's f-string (0.33's literal parts), logged at :708 (`logger.info(msg)`).
    name, fstring_line, call_line = v034.KV_RESERVED_AT
    source = (root / name).read_text()
    assert _fstring_parts(source, fstring_line) == list(v034.KV_RESERVED_PARTS)
    call = _call_at(source, call_line)
    assert isinstance(call.args[0], ast.Name) and call.args[0].id == "msg"


# Run by vLLM 0.34.0's own code in a process of its own (its import sets process-wide state; the venv holds 0.33):
# CompilationConfig's repr of each `--compilation-config` mapping, and of each configuration after vLLM's own
# resolution (tests/vllm034/vllm034_oracle.py), as (field, printed value) pairs in its order.
_REPR_SCRIPT = r"""
import json, sys
import vllm
import vllm.config.compilation as compilation
import vllm034_oracle as oracle
from pydantic import TypeAdapter
from vllm.config import CompilationConfig

def fields(config):
    captured = {}
    def grab(d):  # CompilationConfig.__repr__ ends in str(dict): the dict it prints, taken whole
        captured["d"] = d
        return ""
    compilation.str = grab
    try:
        config.__repr__()
    finally:
        del compilation.str
    return [[k, repr(v)] for k, v in captured["d"].items()]

request = json.loads(sys.stdin.read())
orc = oracle.load()
cli = [fields(TypeAdapter(CompilationConfig).validate_json(json.dumps(c))) for c in request["cli"]]
resolved = []
for case in request["resolved"]:
    with orc.patched():
        r = orc.resolve(oracle.Config(**case))
    assert r.error is None, r.error
    resolved.append(fields(r.vllm_config.compilation_config))
print(json.dumps({"vllm_version": vllm.__version__, "cli": cli, "resolved": resolved}))
"""

PREFILL, DECODE = "prefill_cudagraph_capture_token_sizes", "decode_cudagraph_capture_request_sizes"
_START_UP_FIELDS = {"custom_ops": "['none']", "compile_sizes": "[]", "compile_ranges_endpoints": "[8192]",
                    "cudagraph_num_of_warmups": "1", "use_inductor_graph_partition": "False"}
"""Fields a whole start-up's VllmConfig.__post_init__ sets after the capture sizes (custom ops, compile ranges, the
warm-up count, graph partition), which the oracle's resolution does not run: the writer prints them as a
FULL_AND_PIECEWISE start-up on one H200 at max_num_batched_tokens 8192 resolves them."""


def test_the_compilation_configs_the_writer_prints_are_034s_own_repr_of_them(example, under_034):
    root = _vllm034()
    _, _, out = example
    engine = load_workload(out / "workload.yaml").engine
    run_keys = json.loads((out / "summary.json").read_text())["shipped"]["capture_sizes"]
    cases = [(run_keys, "FULL_AND_PIECEWISE"), *((KEYS, mode) for mode in ("FULL_AND_PIECEWISE", "FULL_DECODE_ONLY",
                                                                           "PIECEWISE", "FULL"))]
    serving = dict(max_num_seqs=128, max_num_batched_tokens=8192, num_speculative_tokens=16,
                   speculative_method="dflash")  # the example workload's
    given = [compilation_config_034(keys, mode) for keys, mode in cases]
    request = {"cli": given,
               "resolved": [dict(serving, cudagraph_mode=mode, prefill_token_sizes=cc[PREFILL],
                                 decode_request_sizes=cc[DECODE]) for (_, mode), cc in zip(cases, given)]}
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_USE_BREAKABLE_CUDAGRAPH", "VLLM_BATCH_INVARIANT")}
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(ROOT / "tests/vllm034"), str(ROOT)])
    env["VLLM_CONFIGURE_LOGGING"] = "0"  # vLLM's own handler would write to stdout, where the answer goes
    proc = subprocess.run([sys.executable, "-c", _REPR_SCRIPT], input=json.dumps(request), capture_output=True,
                          text=True, timeout=600, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    assert answer["vllm_version"] == "0.34.0"
    for (keys, mode), cc, theirs in zip(cases, request["cli"], answer["cli"]):
        fields = dict(mode=mode, prefill=cc[PREFILL], max_prefill=cc["max_prefill_cudagraph_capture_tokens"],
                      decode=cc[DECODE], max_decode=cc["max_decode_cudagraph_capture_requests"])
        assert [list(f) for f in compilation_fields_034(**fields, resolved=False)] == theirs, (keys, mode)
    for (keys, mode), cc, theirs in zip(cases, request["cli"], answer["resolved"]):
        record = engine.key_widths(keys) if keys == run_keys else log_writer.default_record_034(keys, k=16,
                                                                                                 cudagraph_mode=mode)
        prefill, decode = cc[PREFILL], cc[DECODE]
        ours = compilation_fields_034(mode=mode, prefill=prefill, max_prefill=max(prefill, default=0), decode=decode,
                                      max_decode=max(decode, default=0), record=record, resolved=True)
        assert [name for name, _ in ours] == [name for name, _ in theirs], (keys, mode)
        for (name, value), (_, their_value) in zip(ours, theirs):
            assert value == _START_UP_FIELDS.get(name, their_value), (keys, mode, name)
