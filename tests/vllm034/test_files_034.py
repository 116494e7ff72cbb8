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
from vllm_code import vllm_034_code

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
from tuner.engines.engine import flag_file_line  # noqa: E402

DFLASH = ROOT / "workloads/dflash-llama-3.1-8b.yaml"
PROFILE = ROOT / "workloads/profiles/synthetic-dflash-llama-3.1-8b.csv"


def _parse_034(argvs: dict[str, list[str]]) -> dict:
    path = str(vllm_034_code())
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


def test_every_private_name_the_adapter_touches_is_in_the_034_wheel():
    # `--backend vllm` on a CUDA host with vLLM 0.34: the names, parameters and fields its hooks use (V1's, which 0.34
    # removed, left out), read from 0.34's own modules.
    path = os.environ.get("CGTUNE_VLLM034_PATH")
    if not path:
        if os.environ.get("CGTUNE_REQUIRE_VLLM") == "1":
            pytest.fail("CGTUNE_REQUIRE_VLLM=1 but CGTUNE_VLLM034_PATH is not set")
        pytest.skip("CGTUNE_VLLM034_PATH does not name vLLM 0.34.0's code")
    code = ("import json, vllm; from tuner.measure.vllm_engine.api import check_api; "
            "print(json.dumps([vllm.__version__, check_api()]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([path, str(ROOT)])})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == ["0.34.0", []]


def test_a_profile_through_vllm_034_asks_for_both_lists(tmp_path):
    # What `--backend vllm` hands LLM(compilation_config=...) under 0.34: every timed width a prefill size, every
    # multiple of q a decode size of its requests (the deprecated list would leave the decode sizes to vLLM).
    from tuner.measure.vllm_engine.engine import engine_args
    from tuner.workload.spec import parse_workload

    sys.path.insert(0, str(TESTS))
    from handmade_profiles import handmade_spec

    wl = parse_workload(handmade_spec(max_num_seqs=8, num_speculative_tokens=3, max_num_batched_tokens=32,
                                      vllm_version="0.34"))
    args = engine_args(wl, "m", [1, 4, 8, 10, 32], device="cuda", compile=True)
    assert args["compilation_config"] == {"prefill_cudagraph_capture_token_sizes": [1, 4, 8, 10, 32],
                                          "decode_cudagraph_capture_request_sizes": [1, 2, 8],
                                          "cudagraph_mode": "FULL_AND_PIECEWISE"}
