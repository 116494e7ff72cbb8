"""The files `cgtune tune` hands over, parsed THE WAY EACH ENGINE PARSES THEM, carry what was tuned: vLLM 0.33.0's own
`vllm serve` parser reads `vllm-serve.yaml` (`--config`) and the flag line (tests/vllm/vllm_serve_parse.py), SGLang
0.5.23's own `ServerArgs` parser reads the flag line (tests/sglang/sglang_serve_parse.py), and a stand-in for
TensorRT-LLM's `TorchLlmArgs` validation, with the source it mirrors, reads the YAML (tests/trtllm/trtllm_llm_args.py).
Each parsed q, request cap and list must equal the workload's and summary.json's tuned list; a checkpoint the workload
does not name stands as a value the engine refuses; every printed command is shell-quoted.

The vLLM and SGLang parsers run in processes of their own and skip with the reason where the engine is not installed,
unless CGTUNE_REQUIRE_VLLM=1 / CGTUNE_REQUIRE_SGLANG=1 (.ci/run sets both): then a missing engine fails. Hand-made
profiles: test fixtures, never measurements."""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))  # tests/ helpers (import-mode=importlib)
sys.path.insert(0, str(TESTS / "trtllm"))
from handmade_profiles import (  # noqa: E402
    handmade_spec, shipped_profile, tune_quietly, write_handmade_inputs)
from cli_runner import run  # noqa: E402
from trtllm_llm_args import LlmArgsError, load_extra_llm_api_options  # noqa: E402

from tuner.cli import main  # noqa: E402
from tuner.engines.engine import flag_file_line, placeholder  # noqa: E402
from tuner.workload.spec import load_workload  # noqa: E402

ROOT = TESTS.parent
METHOD_PLACEHOLDER = placeholder("SPECULATIVE METHOD", "speculative.method", "vLLM's name for it")
"""What vllm-serve.yaml says for draft tokens without a method (tests/vllm/test_emit.py checks it is written)."""
DFLASH = ROOT / "workloads/dflash-llama-3.1-8b.yaml"
SGLANG = ROOT / "workloads/sglang-eagle-llama-3.1-8b.yaml"
TRTLLM = ROOT / "workloads/trtllm-eagle3-llama-3.1-8b.yaml"
EXAMPLE_PROFILE = ROOT / "workloads/profiles/synthetic-dflash-llama-3.1-8b.csv"


def _tune(tmp: Path, workload: Path, widths: list[int]) -> Path:
    """`cgtune tune` of a shipped workload on a hand-made profile at `widths`: the run directory."""
    profile = shipped_profile(tmp / "profiles", workload, widths)
    assert tune_quietly(workload, profile, tmp / "run") == 0
    return tmp / "run"


def _flag_line(path: Path) -> str:
    line = flag_file_line(path)
    assert line is not None
    return line


def _engine_parse(script: Path, request: dict[str, Any], *, package: str, version: str, require: str) -> dict:
    """Run an engine's own parser in a process of its own: its answer, or a skip (a failure under `require`=1)."""
    reason = None
    try:
        installed = importlib.metadata.version(package)
        if installed != version:
            reason = f"{package} {installed} is installed; the test runs {package} {version}'s parser"
    except importlib.metadata.PackageNotFoundError:
        reason = (f"{package}=={version} is not installed (pip install --no-deps {package}=={version} and the extra "
                  f"{package}-oracle, as .ci/run does)")
    if reason is None:
        proc = subprocess.run([sys.executable, str(script)], input=json.dumps(request), capture_output=True,
                              text=True, timeout=600, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-4000:]
        answer = json.loads(proc.stdout.strip().splitlines()[-1])
        if answer["status"] == "ok":
            return answer
        reason = answer["reason"]
    if os.environ.get(require) == "1":
        pytest.fail(f"{require}=1 but {reason}")
    pytest.skip(reason)


# ---------------------------------------------------------------------------------------------------------- vLLM
@pytest.fixture(scope="module")
def vllm_runs(tmp_path_factory):
    """The shipped DFlash workload (q 17, 128 seqs; its drafter checkpoint not named), and a tiny EAGLE workload that
    names both checkpoints, pins the V1 runner and turns vLLM's graph-memory estimate off (the environment)."""
    tmp = tmp_path_factory.mktemp("vllm")
    dflash = _tune(tmp / "dflash", DFLASH, sorted(set(range(1, 513)) | set(range(17, 2177, 17)) | {4096, 8192}))
    spec = handmade_spec(name="eagle-v1", max_num_seqs=12, num_speculative_tokens=3, max_num_batched_tokens=64,
                         model_runner="v1", estimate_cudagraph_memory=False,
                         speculative={"method": "eagle", "model": "my-org/tiny-eagle", "drafter": {"num_layers": 1}})
    spec["model"]["name"] = "my-org/tiny-ft"
    (tmp / "eagle").mkdir()
    wl_path, profile, _ = write_handmade_inputs(tmp / "eagle", spec, list(range(1, 65)))
    eagle = tmp / "eagle" / "run"
    assert tune_quietly(wl_path, profile, eagle) == 0
    # The DFlash workload on the shipped example profile (synthetic, GPU scale), through `cgtune example`: there the
    # compact list is recommended, so it ships, the fastest beside it.
    compact = tmp / "example"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["example", "--out", str(compact), "--trials", "4", "--no-progress",
                     "--workload", str(DFLASH), "--profile", str(EXAMPLE_PROFILE)]) == 0
    runs = {"dflash": (dflash, load_workload(DFLASH)), "eagle-v1": (eagle, load_workload(wl_path)),
            "example": (compact, load_workload(DFLASH))}
    request = {"parse": {}, "refuse": [placeholder("dflash DRAFT CHECKPOINT", "speculative.model"),
                                       "meta-llama/Llama-3.1-8B-Instruct"],
               "refuse_method": [METHOD_PLACEHOLDER, "ngram"]}
    for name, (out, workload) in runs.items():
        request["parse"][f"{name} yaml"] = ["--config", str(out / "vllm-serve.yaml")]
        request["parse"][f"{name} flags"] = [workload.model.checkpoint, *shlex.split(_flag_line(out / "vllm-flags.txt"))]
        other = json.loads((out / "summary.json").read_text())["shipped"]["other"]
        if other is not None:  # the list not shipped: its files beside the shipped one's
            request["parse"][f"{name} other yaml"] = ["--config", str(out / f"vllm-serve.{other['list']}.yaml")]
            request["parse"][f"{name} other flags"] = [
                workload.model.checkpoint, *shlex.split(_flag_line(out / f"vllm-flags.{other['list']}.txt"))]
    answer = _engine_parse(TESTS / "vllm/vllm_serve_parse.py", request, package="vllm", version="0.33.0",
                           require="CGTUNE_REQUIRE_VLLM")
    return runs, answer


@pytest.mark.parametrize("name", ["dflash", "eagle-v1", "example"])
@pytest.mark.parametrize("form", ["yaml", "flags"])
@pytest.mark.slow
def test_vllms_own_parser_reads_the_tuned_deployment(vllm_runs, name, form):
    runs, answer = vllm_runs
    out, workload = runs[name]
    s = workload.serving
    parsed = answer["parsed"][f"{name} {form}"]
    summary = json.loads((out / "summary.json").read_text())
    spec = parsed["speculative_config"]
    # q, the request cap and the list vLLM reads are what was tuned.
    assert 1 + spec["num_speculative_tokens"] == workload.engine.decode_query_len
    assert parsed["max_num_seqs"] == s.max_num_seqs
    shipped = summary["shipped"]
    assert parsed["cudagraph_capture_sizes"] == shipped["capture_sizes"]
    assert parsed["max_cudagraph_capture_size"] == shipped["capture_sizes"][-1]
    assert shipped["capture_sizes"] == summary[{"compact": "compact", "fastest": "tuned"}[shipped["list"]]][
        "capture_sizes"]
    if shipped["other"] is not None:
        other = answer["parsed"][f"{name} other {form}"]
        assert other["cudagraph_capture_sizes"] == shipped["other"]["capture_sizes"]
        assert {k: v for k, v in other.items() if "capture_size" not in k} == \
            {k: v for k, v in parsed.items() if "capture_size" not in k}  # the same deployment, another list
    assert parsed["cudagraph_mode"] == s.cudagraph_mode
    # Everything else the tuning assumed.
    assert (parsed["max_num_batched_tokens"], parsed["max_model_len"], parsed["gpu_memory_utilization"]) == \
        (s.max_num_batched_tokens, s.max_model_len, s.gpu_memory_utilization)
    assert (parsed["model"], parsed["dtype"], parsed["tensor_parallel_size"]) == \
        (workload.model.checkpoint, workload.model.dtype, workload.model.tensor_parallel_size)
    assert spec["method"] == workload.speculative.method


@pytest.mark.slow
def test_the_examples_deployment_carries_the_recommended_compact_list_and_the_fastest_beside_it(vllm_runs):
    """Issue 29: on the shipped DFlash workload with the shipped example profile, vllm-serve.yaml holds the compact
    list the report recommends and vllm-serve.fastest.yaml the fastest, both as vLLM 0.33's own parser reads them."""
    runs, answer = vllm_runs
    out, _ = runs["example"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["compact_choice"]["recommended"] and summary["shipped"]["list"] == "compact"
    compact, fastest = answer["parsed"]["example yaml"], answer["parsed"]["example other yaml"]
    assert compact["cudagraph_capture_sizes"] == summary["compact"]["capture_sizes"]
    assert fastest["cudagraph_capture_sizes"] == summary["tuned"]["capture_sizes"] != compact["cudagraph_capture_sizes"]
    assert "# list: the compact list" in (out / "vllm-serve.yaml").read_text()
    assert "usage: vllm serve --config vllm-serve.fastest.yaml" in (out / "vllm-serve.fastest.yaml").read_text()


@pytest.mark.slow
def test_the_unnamed_drafter_is_a_value_vllm_refuses(vllm_runs):
    runs, answer = vllm_runs
    out, _ = runs["dflash"]
    value = placeholder("dflash DRAFT CHECKPOINT", "speculative.model")
    assert answer["parsed"]["dflash yaml"]["speculative_config"]["model"] == value
    assert "# speculative-config.model: <dflash DRAFT CHECKPOINT: set speculative.model in the workload" in \
        (out / "vllm-serve.yaml").read_text()
    refused = answer["refused"][value]
    assert "Invalid repository ID or local directory specified" in refused["vllm"]
    assert refused["repo_id"] is not None  # refused for its form, not for being absent
    assert answer["refused"]["meta-llama/Llama-3.1-8B-Instruct"]["repo_id"] is None
    # draft tokens without a method: the method's placeholder is no method vLLM has
    assert "Input should be 'ngram', 'draft_model'" in answer["refused_methods"][METHOD_PLACEHOLDER]
    assert answer["refused_methods"]["ngram"] is None  # a method vLLM has (and needs no checkpoint for)


@pytest.mark.slow
def test_a_named_drafter_the_pinned_runner_and_the_estimate_switch_reach_vllm(vllm_runs):
    runs, answer = vllm_runs
    out, _ = runs["eagle-v1"]
    assert answer["parsed"]["eagle-v1 yaml"]["speculative_config"] == {
        "method": "eagle", "num_speculative_tokens": 3, "model": "my-org/tiny-eagle"}
    text = (out / "vllm-serve.yaml").read_text()
    assert "# environment: VLLM_USE_V2_MODEL_RUNNER=0 must be set: the workload pins model_runner v1" in text
    assert "# environment: VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0 must be set" in text
    assert ("# usage: VLLM_USE_V2_MODEL_RUNNER=0 VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0 vllm serve --config "
            "vllm-serve.yaml") in text


def test_the_printed_vllm_line_is_the_flag_file_behind_the_environment(tmp_path, capsys):
    spec = handmade_spec(name="eagle-v1", max_num_seqs=12, num_speculative_tokens=3, max_num_batched_tokens=64,
                         model_runner="v1", speculative={"method": "eagle", "drafter": {"num_layers": 1}})
    wl_path, profile, _ = write_handmade_inputs(tmp_path, spec, list(range(1, 65)))
    out = tmp_path / "my runs" / "eagle v1"
    code, printed, err = run(capsys, "search", wl_path, "--profile", profile, "--out", out, "--trials", 8,
                             "--no-progress")
    assert code == 0, err
    lines = printed.strip().splitlines()
    line = next(x for x in lines if "vllm serve" in x)
    argv = shlex.split(line)
    assert argv[:3] == ["VLLM_USE_V2_MODEL_RUNNER=0", "vllm", "serve"]
    # The report command after it is quoted too: the folder has spaces.
    assert shlex.split(lines[-1].split(": ", 1)[1]) == ["cgtune", "report", str(out)]
    assert argv[3] == placeholder("CHECKPOINT", "model.name")  # the tiny preset has no checkpoint
    assert argv[4:] == shlex.split(_flag_line(out / "vllm-flags.txt"))


# -------------------------------------------------------------------------------------------------------- SGLang
@pytest.fixture(scope="module")
def sglang_runs(tmp_path_factory):
    """The shipped EAGLE workload (3 steps, topk 1: q 4), and the same with speculative_num_draft_tokens 6, which
    SGLang forces back to steps + 1 = 4."""
    tmp = tmp_path_factory.mktemp("sglang")
    widths = sorted(set(range(4, 513, 4)) | {2048, 4096, 8192})
    shipped = _tune(tmp / "shipped", SGLANG, widths)
    data = yaml.safe_load(SGLANG.read_text())
    data["serving"]["speculative_num_draft_tokens"] = 6
    data["speculative"]["model"] = "my-org/eagle-llama"
    six = tmp / "six.yaml"
    six.write_text(yaml.safe_dump(data))
    forced = _tune(tmp / "six", six, widths)
    runs = {"shipped": (shipped, load_workload(SGLANG)), "six": (forced, load_workload(six))}
    request = {"parse": {name: ["--model-path", "meta-llama/Llama-3.1-8B-Instruct",
                                *shlex.split(_flag_line(out / "sglang-flags.txt"))]
                         for name, (out, _) in runs.items()}}
    answer = _engine_parse(TESTS / "sglang/sglang_serve_parse.py", request, package="sglang", version="0.5.23",
                           require="CGTUNE_REQUIRE_SGLANG")
    return runs, answer


@pytest.mark.parametrize("name", ["shipped", "six"])
@pytest.mark.slow
def test_sglangs_own_parser_reads_the_tuned_deployment(sglang_runs, name):
    runs, answer = sglang_runs
    out, workload = runs[name]
    parsed = answer["parsed"][name]
    summary = json.loads((out / "summary.json").read_text())
    q = workload.engine.decode_query_len
    assert q == 4  # SGLang's resolution: topk 1 forces steps + 1, whatever the workload wrote
    # The four speculative flags, as resolved: SGLang's topk-1 rule (speculative_hook.py:1255-1266) leaves them be.
    assert (parsed["speculative_algorithm"], parsed["speculative_num_steps"], parsed["speculative_eagle_topk"],
            parsed["speculative_num_draft_tokens"]) == ("EAGLE", 3, 1, q)
    assert parsed["max_running_requests"] == workload.serving.max_num_seqs == 128
    tuned = summary["engine"]["batch_sizes"]
    assert tuned == [w // q for w in summary["capture_sizes"]]
    assert parsed["cuda_graph_config"] == {"decode": {"bs": tuned}} and parsed["cuda_graph_bs_decode"] is None
    assert (parsed["context_length"], parsed["chunked_prefill_size"], parsed["tp_size"], parsed["dtype"]) == \
        (8192, 8192, 1, "bfloat16")
    assert parsed["mem_fraction_static"] is None  # SGLang's automatic fraction, as modelled


@pytest.mark.slow
def test_sglang_draft_model_path_is_named_or_a_value_sglang_refuses(sglang_runs):
    runs, answer = sglang_runs
    assert answer["parsed"]["six"]["speculative_draft_model_path"] == "my-org/eagle-llama"
    value = answer["parsed"]["shipped"]["speculative_draft_model_path"]
    assert value == placeholder("EAGLE DRAFT CHECKPOINT", "speculative.model")
    assert not Path(value).exists() and " " in value and value.startswith("<")  # neither a path nor a repo id
    assert "# --speculative-draft-model-path: <EAGLE DRAFT CHECKPOINT" in (runs["shipped"][0] / "sglang-flags.txt"
                                                                          ).read_text()


@pytest.mark.slow
def test_sglang_report_says_what_sglang_resolved(sglang_runs):
    runs, _ = sglang_runs
    out, _ = runs["six"]
    report = (out / "report.md").read_text()
    assert "speculative_num_draft_tokens 6 -> 4: SGLang forces steps + 1 at speculative_eagle_topk 1" in report


# -------------------------------------------------------------------------------------------------- TensorRT-LLM
@pytest.fixture(scope="module")
def trtllm_run(tmp_path_factory):
    """The shipped EAGLE-3 workload (max_draft_len 3: q 4, 256 requests), tuned into a folder with spaces."""
    tmp = tmp_path_factory.mktemp("trtllm")
    profile = shipped_profile(tmp / "profiles", TRTLLM, sorted(set(range(4, 1025, 4)) | {2048, 4096, 8192}))
    return tmp / "my runs" / "eagle 3", profile


def test_trtllm_loads_the_tuned_deployment_as_its_llm_args_do(trtllm_run, capsys):
    out, profile = trtllm_run
    code, printed, err = run(capsys, "tune", TRTLLM, "--profile", profile, "--out", out, "--trials", 12,
                             "--no-progress")
    assert code == 0, err
    workload = load_workload(TRTLLM)
    summary = json.loads((out / "summary.json").read_text())
    args = load_extra_llm_api_options((out / "trtllm-extra-llm-api-options.yaml").read_text())
    q = workload.engine.decode_query_len
    assert args.tokens_per_gen_step == q == 4 and args.decoding_type == "Eagle3"
    assert args.max_batch_size == workload.serving.max_num_seqs == 256
    # The file carries the shipped list (the compact one when recommended); summary's engine figures are the tuned's.
    assert args.cuda_graph_batch_sizes == [w // q for w in summary["shipped"]["capture_sizes"]]
    assert summary["engine"]["batch_sizes"] == [w // q for w in summary["capture_sizes"]]
    assert args.enable_padding and (args.max_seq_len, args.max_num_tokens, args.tensor_parallel_size) == (8192, 8192, 1)
    assert args.speculative_model == placeholder("Eagle3 DRAFT CHECKPOINT", "speculative.model")
    # The printed command is shell-quoted: the --out path with spaces stays one argument.
    line = next(ln for ln in printed.splitlines() if ln.startswith("trtllm-serve "))
    assert shlex.split(line) == ["trtllm-serve", "meta-llama/Llama-3.1-8B-Instruct", "--extra_llm_api_options",
                                 str(out / "trtllm-extra-llm-api-options.yaml")]


def test_draft_models_get_the_current_tag_and_their_checkpoint(tmp_path):
    data = yaml.safe_load(TRTLLM.read_text())
    data["speculative"] = {"method": "draft_model", "model": "my-org/llama-1b-draft",
                           "drafter": {"preset": "llama-3.2-1b"}}
    path = tmp_path / "draft.yaml"
    path.write_text(yaml.safe_dump(data))
    workload = load_workload(path)
    files = workload.engine.render_files([4 * b for b in (1, 2, 4, 8, 256)], workload.deployment,
                                         cudagraph_mode="FULL_DECODE_ONLY")
    args = load_extra_llm_api_options(files["trtllm-extra-llm-api-options.yaml"])
    assert (args.decoding_type, args.speculative_model, args.tokens_per_gen_step) == \
        ("Draft_Target", "my-org/llama-1b-draft", 4)


@pytest.mark.parametrize(("speculative", "message"), [
    ({"decoding_type": "DraftTarget", "max_draft_len": 3, "speculative_model": "x"}, "does not match any"),
    ({"decoding_type": "Eagle3", "max_draft_len": 3}, "Draft model must be provided for EAGLE"),
    ({"decoding_type": "Draft_Target", "max_draft_len": 3}, "speculative_model must be specified for DraftTarget"),
])
def test_the_stand_in_refuses_what_trtllm_refuses(speculative, message):
    # The stand-in's own checks, against the messages of llm_args.py it mirrors: the tag cgtune wrote before and a
    # drafter left out are refused.
    text = yaml.safe_dump({"max_batch_size": 8, "cuda_graph_config": {"batch_sizes": [1, 2]},
                           "speculative_config": speculative})
    with pytest.raises(LlmArgsError, match=message):
        load_extra_llm_api_options(text)
