"""A model given by its config.json (`model.config`, or a local `model.name` directory): its shape, what in it the stand-in
decoder cannot build, the refusals of bad input, and a profile's own KV bytes per token winning over the shape's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tuner.model.costmodel import CostModel, ModelError
from tuner.workload.model_config import stand_in_gaps
from tuner.workload.spec import WorkloadError, load_workload, parse_workload

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/handmade_profiles.py (import-mode=importlib)
from handmade_profiles import handmade_profile, handmade_spec  # noqa: E402

LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256, "rope_theta": 10000.0,
         "rms_norm_eps": 1e-5}


def _spec(tmp_path: Path, config: dict | str, **model: object) -> dict:
    spec = handmade_spec()
    if isinstance(config, dict):
        (tmp_path / "m").mkdir(exist_ok=True)
        (tmp_path / "m" / "config.json").write_text(json.dumps(config))
        config = "m/config.json"
    spec["model"] = {"config": config, "dtype": "float32", **model}
    return spec


def test_the_shape_is_read_from_the_config_next_to_the_workload(tmp_path):
    spec = _spec(tmp_path, LLAMA)
    (tmp_path / "w.yaml").write_text(json.dumps(spec))
    wl = load_workload(tmp_path / "w.yaml")
    s = wl.model.shape
    assert (s.hidden_size, s.num_layers, s.num_attention_heads, s.num_kv_heads, s.head_dim) == (64, 2, 4, 2, 16)
    assert wl.model.stand_in_gaps == [] and wl.model.config_path == str(tmp_path / "m" / "config.json")
    assert wl.kv_bytes_per_token() == 2 * 2 * 2 * 16 * 4


def test_a_directory_named_as_the_model_gives_its_config(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({**LLAMA, "num_hidden_layers": 3}))
    spec = handmade_spec()
    spec["model"] = {"name": "ckpt", "dtype": "float32"}
    wl = parse_workload(spec, base_dir=tmp_path)
    assert wl.model.shape.num_layers == 3 and wl.model.checkpoint == "ckpt"


def test_an_explicit_field_overrides_the_config_and_the_config_is_part_of_the_hash(tmp_path):
    a = parse_workload(_spec(tmp_path, LLAMA, num_layers=5), base_dir=tmp_path)
    assert a.model.shape.num_layers == 5
    before = parse_workload(_spec(tmp_path, LLAMA), base_dir=tmp_path).content_hash
    after = parse_workload(_spec(tmp_path, {**LLAMA, "intermediate_size": 256}), base_dir=tmp_path).content_hash
    assert before != after


@pytest.mark.parametrize(("config", "message"), [
    ("missing.json", "model.config: '.*missing.json' does not exist"),
    ("[1, 2]", "holds a JSON list, not a config object"),
    ("{not json", "is not a readable JSON file"),
    ({**LLAMA, "hidden_size": "64"}, "model.config: hidden_size='64' must be a whole number >= 1"),
])
def test_a_bad_config_is_refused_in_one_line_naming_the_field(tmp_path, config, message):
    if isinstance(config, str) and config != "missing.json":
        (tmp_path / "bad.json").write_text(config)
        config = "bad.json"
    with pytest.raises(WorkloadError, match=message) as exc:
        parse_workload(_spec(tmp_path, config), base_dir=tmp_path)
    assert "\n" not in str(exc.value)


def test_a_preset_and_a_config_together_are_refused(tmp_path):
    with pytest.raises(WorkloadError, match="model.preset: give a preset or a config.json"):
        parse_workload(_spec(tmp_path, LLAMA, preset="tiny"), base_dir=tmp_path)


@pytest.mark.parametrize(("extra", "gap"), [
    ({"architectures": ["MixtralForCausalLM"], "num_local_experts": 8}, "MoE (num_local_experts=8)"),
    ({"architectures": ["Qwen3MoeForCausalLM"], "num_experts": 128}, "MoE (num_experts=128)"),
    ({"architectures": ["DeepseekV3ForCausalLM"], "kv_lora_rank": 512, "n_routed_experts": 256}, "MLA attention"),
    ({"quantization_config": {"quant_method": "fp8"}}, "quantized weights (quantization_config={...})"),
    ({"sliding_window": 4096}, "sliding-window attention (sliding_window=4096)"),
    ({"architectures": ["GPT2LMHeadModel"]}, "architecture GPT2LMHeadModel"),
])
def test_what_the_stand_in_cannot_build_is_named(extra, gap):
    assert any(g.startswith(gap) for g in stand_in_gaps({**LLAMA, **extra}))


def test_a_window_a_config_carries_but_does_not_use_is_no_gap():
    qwen2 = {**LLAMA, "architectures": ["Qwen2ForCausalLM"], "sliding_window": 32768, "use_sliding_window": False,
             "layer_types": ["full_attention", "full_attention"]}
    assert stand_in_gaps(qwen2) == []


def test_the_kv_bytes_per_token_the_engine_measured_win_over_the_shapes(tmp_path):
    wl = parse_workload(handmade_spec(max_num_seqs=8, max_num_batched_tokens=64), base_dir=tmp_path)
    csv_path = handmade_profile(tmp_path, wl, [1, 2, 4, 8, 16, 32, 64])
    shape_model = CostModel.from_files(csv_path, wl)
    meta_path = csv_path.with_suffix(".json")
    meta = json.loads(meta_path.read_text())
    measured = 3 * wl.kv_bytes_per_token()  # as an MLA or FP8 model's spec would differ from the shape's formula
    meta["kv_cache"] = {"bytes_per_token": measured}
    meta_path.write_text(json.dumps(meta))
    engine_model = CostModel.from_files(csv_path, wl)
    assert shape_model.kv_bytes_per_token == wl.kv_bytes_per_token()
    assert engine_model.kv_bytes_per_token == measured
    assert engine_model.budget.required_kv_bytes == wl.required_kv_bytes_at(measured) > wl.required_kv_bytes
    meta["kv_cache"] = {"bytes_per_token": 0}
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ModelError, match="kv_cache.bytes_per_token=0 must be a whole byte count"):
        CostModel.from_files(csv_path, wl)


def test_a_model_cgtune_cannot_size_is_refused_in_one_line_unless_the_profile_measured_it(tmp_path, capsys):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from cli_runner import run

    awq = {**LLAMA, "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}}
    spec = _spec(tmp_path, awq)
    (tmp_path / "w.yaml").write_text(json.dumps(spec))
    wl = load_workload(tmp_path / "w.yaml")
    unmeasured = handmade_profile(tmp_path / "p", wl, [1, 2, 4, 8], weights_bytes=None, name="unmeasured")
    field = "model.config.quantization_config.quant_method='awq' cannot be sized"
    with pytest.raises(ModelError, match=field):
        CostModel.from_files(unmeasured, wl)
    code, _, err = run(capsys, "search", tmp_path / "w.yaml", "--profile", unmeasured, "--out", tmp_path / "run",
                       "--trials", 2, "--no-progress")
    (line,) = err.strip().splitlines()
    assert code == 2 and field in line and not (tmp_path / "run").exists()
    # Measured through the engine, the weights are the engine's own figure.
    measured = handmade_profile(tmp_path / "p", wl, [1, 2, 4, 8], weights_bytes=123_456, name="measured")
    assert CostModel.from_files(measured, wl).budget.non_kv_cache_bytes == 123_456 + 50 * 2**20


def test_a_moe_configs_layer_count_is_not_overridden(tmp_path):
    moe = {**LLAMA, "architectures": ["MixtralForCausalLM"], "num_local_experts": 4}
    with pytest.raises(WorkloadError, match="model.num_layers: a MoE config.json's layer count cannot be changed"):
        parse_workload(_spec(tmp_path, moe, num_layers=4), base_dir=tmp_path)


@pytest.mark.parametrize(("method", "moe_layers", "mla"), [("mtp", 1, True), ("eagle", 0, False)])
def test_an_mtp_module_is_the_targets_kind_of_layer_and_an_eagle_head_a_dense_one(tmp_path, method, moe_layers, mla):
    target = json.loads((Path(__file__).resolve().parents[1] / "workloads/models/deepseek-v3/config.json").read_text())
    spec = _spec(tmp_path, target, dtype="bfloat16")
    spec["speculative"] = {"method": method, "drafter": {"num_layers": 1}}
    spec["serving"]["num_speculative_tokens"] = 1
    drafter = parse_workload(spec, base_dir=tmp_path).drafter
    assert (drafter.num_moe_layers, drafter.mla, drafter.quantization is not None) == (moe_layers, mla, mla)
