"""A vLLM 0.34 search's files, parsed by vLLM 0.34.0's own `vllm serve` parser (tests/vllm/vllm_serve_parse.py in a
process of its own, 0.34's code first on its path): the compilation config carries both tuned lists under 0.34's own
names and their caps, and no deprecated field (from which 0.34 would derive the decode request counts itself); the
same files under 0.33's rules stay 0.33's. Skipped where CGTUNE_VLLM034_PATH is not set, unless CGTUNE_REQUIRE_VLLM=1.
The profile is the shipped synthetic one: a test fixture, never a measurement."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
from tuner.engines.engine import flag_file_line  # noqa: E402

DFLASH = ROOT / "workloads/dflash-llama-3.1-8b.yaml"
PROFILE = ROOT / "workloads/profiles/synthetic-dflash-llama-3.1-8b.csv"


def _parse_034(argvs: dict[str, list[str]]) -> dict:
    path = os.environ.get("CGTUNE_VLLM034_PATH")
    if not path or not (Path(path) / "vllm").is_dir():
        reason = "CGTUNE_VLLM034_PATH does not name vLLM 0.34.0's code (pip install --target DIR --no-deps vllm==0.34.0)"
        if os.environ.get("CGTUNE_REQUIRE_VLLM") == "1":
            pytest.fail(f"CGTUNE_REQUIRE_VLLM=1 but {reason}")
        pytest.skip(reason)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([path, str(ROOT)])}
    proc = subprocess.run([sys.executable, str(TESTS / "vllm/vllm_serve_parse.py")], env=env, cwd=ROOT,
                          input=json.dumps({"version": "0.34.0", "parse": argvs}), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    assert answer["status"] == "ok", answer
    return answer["parsed"]


@pytest.fixture(scope="module")
def run_034(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("r034") / "run"
    proc = subprocess.run([sys.executable, "-m", "tuner.cli", "search", str(DFLASH), "--profile", str(PROFILE),
                           "--out", str(out), "--trials", "8", "--no-progress", "--vllm-version", "0.34"],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def test_a_034_search_ships_both_lists_under_034s_names(run_034):
    summary = json.loads((run_034 / "summary.json").read_text())
    shipped = summary[{"compact": "compact", "fastest": "tuned"}[summary["shipped"]["list"]]]
    cc = json.loads((run_034 / "compilation_config.json").read_text())
    assert set(cc) == {"cudagraph_mode", "prefill_cudagraph_capture_token_sizes", "max_prefill_cudagraph_capture_tokens",
                       "decode_cudagraph_capture_request_sizes", "max_decode_cudagraph_capture_requests"}
    assert cc["decode_cudagraph_capture_request_sizes"] == shipped["decode_cudagraph_capture_request_sizes"]
    assert cc["prefill_cudagraph_capture_token_sizes"] == shipped["prefill_cudagraph_capture_token_sizes"]
    assert cc["decode_cudagraph_capture_request_sizes"], "a DFlash deployment's decode steps want decode graphs"
    assert summary["vllm_version"] == "0.34" and summary["kv_sized_after_capture"] is True


def test_vllm_034s_own_parser_reads_both_lists_from_the_yaml_and_the_flag_line(run_034):
    cc = json.loads((run_034 / "compilation_config.json").read_text())
    line = flag_file_line(run_034 / "vllm-flags.txt")
    assert line is not None
    parsed = _parse_034({"yaml": ["--config", str(run_034 / "vllm-serve.yaml")],
                         "flags": ["meta-llama/Llama-3.1-8B-Instruct", *shlex.split(line)]})
    for form in ("yaml", "flags"):
        got = parsed[form]
        for field in ("decode_cudagraph_capture_request_sizes", "prefill_cudagraph_capture_token_sizes",
                      "max_decode_cudagraph_capture_requests", "max_prefill_cudagraph_capture_tokens"):
            assert got[field] == cc[field], (form, field)
        # No deprecated field: 0.34 takes the lists as given instead of deriving them.
        assert got["cudagraph_capture_sizes"] is None and got["max_cudagraph_capture_size"] is None, form
        assert got["max_num_seqs"] == 128 and got["speculative_config"]["num_speculative_tokens"] == 16
