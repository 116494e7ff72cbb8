"""The shipped MoE + MTP workload (workloads/mtp1-deepseek-v3-tp8.yaml: DeepSeek-V3's published config.json, FP8, MLA,
256 experts, at TP 8 with its MTP module) through `cgtune defaults` and `cgtune search` under vLLM 0.33 and 0.34, on a
synthetic profile at H200 scale (tests/handmade_profiles.py: made-up latencies, a fixture, never a measurement), its
files read back by each release's own `vllm serve` parser (tests/vllm/vllm_serve_parse.py). What is checked: the KV
budget the search priced is the one a rank of this model leaves (its MoE weights and its MTP module's, MLA's KV per
token), and the files deploy this model as tuned."""

from __future__ import annotations

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
from handmade_profiles import GIB, gpu_scale_profile  # noqa: E402
from vllm_code import require_vllm_033, vllm_034_code  # noqa: E402

from tuner.workload.spec import load_workload  # noqa: E402

WORKLOAD = ROOT / "workloads" / "mtp1-deepseek-v3-tp8.yaml"
ACTIVATION_BYTES = 4 * GIB  # gpu_scale_profile's activation peak
LATENT = 512 + 64  # kv_lora_rank + qk_rope_head_dim: the one MLA "head" vLLM caches per token and layer


@pytest.fixture(scope="module")
def profile(tmp_path_factory) -> Path:
    return gpu_scale_profile(tmp_path_factory.mktemp("profile"), WORKLOAD)


@pytest.fixture(scope="module", params=["0.33", "0.34"])
def searched(request, profile, tmp_path_factory) -> tuple[str, Path]:
    from tuner.cli import main

    out = tmp_path_factory.mktemp(f"run{request.param}") / "run"
    with contextlib.redirect_stdout(io.StringIO()):
        code = main(["search", str(WORKLOAD), "--profile", str(profile), "--out", str(out), "--trials", "4",
                     "--exact-seconds", "3", "--no-progress", "--vllm-version", request.param])
    assert code == 0
    return request.param, out


def test_the_workload_is_sized_as_a_rank_of_deepseek_v3_holds_it():
    wl = load_workload(WORKLOAD)
    s = wl.model.shape
    assert (s.num_experts, s.kv_lora_rank, s.quantization, wl.model.tensor_parallel_size) == (256, 512, "fp8", 8)
    # The MTP module is one MoE layer of the target's kind, with MLA's KV cache beside the target's 61 layers.
    assert (wl.drafter.num_layers, wl.drafter.num_moe_layers, wl.drafter.kv_lora_rank) == (1, 1, 512)
    assert wl.kv_bytes_per_token() == (61 + 1) * LATENT * 2
    # A rank holds ~1/8 of the ~640 GiB checkpoint (the published size is held in tests/test_model_weights.py).
    assert 75 * GIB < wl.model.weight_bytes() < 85 * GIB and 1 * GIB < wl.drafter_weight_bytes() < 2 * GIB


@pytest.mark.parametrize("release", ["0.33", "0.34"])
def test_defaults_for_the_moe_workload(capsys, release):
    code, out, err = run(capsys, "defaults", WORKLOAD, "--json", "--vllm-version", release)
    assert code == 0, err
    answer = json.loads(out)
    assert answer["model_runner"] == "v2" and answer["uniform_decode_sizes_without_graph"] == []
    assert max(answer["cudagraph_capture_sizes"]) == 512  # 256 requests x q 2, at the 512-token ceiling
    if release == "0.34":
        assert answer["vllm_version"] == "0.34" and max(answer["decode_cudagraph_capture_request_sizes"]) == 256


def test_the_search_prices_the_kv_cache_this_model_leaves(searched):
    release, out = searched
    wl = load_workload(WORKLOAD)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["kv_bytes_per_token"] == wl.kv_bytes_per_token()
    # The profile measured no non-KV memory: the rank's weights, the MTP module's and the activation peak stand in.
    assert summary["non_kv_cache_bytes"] == wl.model.weight_bytes() + wl.drafter_weight_bytes() + ACTIVATION_BYTES
    shipped = summary[{"compact": "compact", "fastest": "tuned"}[summary["shipped"]["list"]]]
    assert shipped["kv_tokens"] * summary["kv_bytes_per_token"] <= shipped["kv_available_bytes"]
    usable = summary["total_memory_bytes"] * summary["gpu_memory_utilization"] - summary["non_kv_cache_bytes"]
    assert shipped["kv_available_bytes"] <= usable and shipped["kv_available_bytes"] < 45 * GIB
    assert summary["vllm_version"] == release


@pytest.mark.slow  # a vLLM import per release (~15 s each on 2 cores)
def test_the_files_deploy_the_tuned_model_as_vllms_own_parser_reads_them(searched):
    release, out = searched
    if release == "0.33":
        require_vllm_033()
        pythonpath = str(ROOT)
    else:
        pythonpath = os.pathsep.join([str(vllm_034_code()), str(ROOT)])
    proc = subprocess.run([sys.executable, str(ROOT / "tests/vllm/vllm_serve_parse.py")], cwd=ROOT, text=True,
                          input=json.dumps({"version": f"{release}.0", "parse": {
                              "yaml": ["--config", str(out / "vllm-serve.yaml")]}}),
                          env={**os.environ, "PYTHONPATH": pythonpath}, capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    assert answer["status"] == "ok", answer
    got = answer["parsed"]["yaml"]
    assert (got["model"], got["tensor_parallel_size"], got["max_num_seqs"]) == ("deepseek-ai/DeepSeek-V3", 8, 256)
    assert got["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 1}
    compilation = json.loads((out / "compilation_config.json").read_text())
    for field, value in compilation.items():
        if field != "cudagraph_mode":
            assert got[field] == value, field
