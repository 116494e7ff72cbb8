"""Workload specs: shipped files load, every field is validated with its path, the step distribution."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from tuner.shapes import PRESETS, ModelShape
from tuner.workload.spec import WorkloadError, load_workload, parse_workload

WORKLOADS = sorted((Path(__file__).parent.parent / "workloads").glob("*.yaml"))

BASE = {
    "name": "w",
    "model": {"preset": "llama-3.1-8b"},
    "serving": {"max_num_seqs": 8, "num_speculative_tokens": 3},
    "traffic": {"requests": {"kind": "uniform", "min": 1, "max": 8}},
}


def with_(path: str, value):
    data = copy.deepcopy(BASE)
    *parents, leaf = path.split(".")
    node = data
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value
    return data


@pytest.mark.parametrize("path", WORKLOADS, ids=lambda p: p.name)
def test_shipped_workloads_load_and_have_distributions(path):
    w = load_workload(path)
    steps = w.steps()
    assert abs(sum(s.probability for s in steps) - 1.0) < 1e-9
    assert all(1 <= s.num_tokens <= w.serving.max_num_batched_tokens for s in steps)
    assert path.read_text().startswith("#"), "each shipped workload says what deployment it stands for"


def test_shipped_workloads_cover_the_issue():
    names = {load_workload(p).name: load_workload(p) for p in WORKLOADS}
    by_shape = {(w.serving.max_num_seqs, w.serving.num_speculative_tokens) for w in names.values()}
    assert {(128, 16), (256, 24), (300, 1), (32, 16)} <= by_shape
    assert any(w.serving.num_speculative_tokens == 0 for w in names.values())
    assert any(w.model.preset in ("llama-3.2-1b", "qwen3-1.7b") and w.serving.num_speculative_tokens
               for w in names.values())
    assert any("tiny" in p.name for p in WORKLOADS)
    binding = [w for w in names.values() if w.serving.required_kv_bytes is not None]
    assert len(binding) >= 2


def test_presets_have_real_shapes():
    llama8 = ModelShape.from_name("llama-3.1-8b")
    assert (llama8.hidden_size, llama8.num_layers, llama8.num_kv_heads, llama8.intermediate_size) == (4096, 32, 8, 14336)
    # 8B parameters in bf16 are ~15 GiB; KV per token = 2 x 32 layers x 8 heads x 128 x 2 bytes.
    assert 14.5 < llama8.weight_bytes("bfloat16") / 2**30 < 15.5
    assert llama8.kv_bytes_per_token("bfloat16") == 131072
    for name in ("llama-3.2-1b", "qwen3-1.7b", "qwen3-8b", "qwen3-32b", "mistral-7b", "llama-3.1-70b"):
        assert name in PRESETS


def test_tensor_parallel_shards_one_rank():
    llama70 = ModelShape.from_name("llama-3.1-70b")
    assert llama70.kv_heads_per_rank(2) == 4 and llama70.kv_heads_per_rank(16) == 1
    assert llama70.weight_bytes("bfloat16", 2) < llama70.weight_bytes("bfloat16") * 0.51


def test_uniform_traffic_steps():
    w = parse_workload(BASE)
    steps = w.steps()
    assert [s.num_tokens for s in steps] == [4 * n for n in range(1, 9)]
    assert all(s.uniform_decode and s.probability == pytest.approx(1 / 8) for s in steps)


def test_mixed_share_splits_probability():
    data = with_("traffic.mixed_share", 0.25)
    data["traffic"]["mixed_tokens"] = {"kind": "histogram", "counts": {100: 1, 300: 3}}
    steps = parse_workload(data).steps()
    mixed = {s.num_tokens: s.probability for s in steps if not s.uniform_decode}
    assert mixed == {100: pytest.approx(0.0625), 300: pytest.approx(0.1875)}
    assert sum(s.probability for s in steps if s.uniform_decode) == pytest.approx(0.75)


def test_trace_traffic(tmp_path):
    (tmp_path / "steps.csv").write_text("num_tokens,num_reqs\n8,2\n8,2\n9,3\n12\n")
    data = with_("traffic", {"trace": "steps.csv"})
    (tmp_path / "w.yaml").write_text(yaml.safe_dump(data))
    steps = load_workload(tmp_path / "w.yaml").steps()
    assert [(s.num_tokens, s.uniform_decode, round(s.probability, 2)) for s in steps] == [
        (8, True, 0.5), (9, False, 0.25), (12, True, 0.25)]


def test_widths_histogram_assumes_decode_at_multiples_of_q():
    data = with_("traffic", {"widths": {"kind": "histogram", "counts": {4: 1, 6: 1, 64: 2}}})
    steps = parse_workload(data).steps()
    assert [(s.num_tokens, s.uniform_decode) for s in steps] == [(4, True), (6, False), (64, False)]


def test_required_kv_defaults_to_one_max_model_len_request_in_vllms_whole_blocks():
    # vLLM starts only with one request's whole 16-token blocks (1000 tokens: 63) plus the null block.
    w = parse_workload(with_("serving.max_model_len", 1000))
    assert w.required_kv_bytes == (63 + 1) * 16 * 131072
    w = parse_workload(with_("serving.required_kv_gib", 5.12))
    assert w.required_kv_bytes == int(5.12 * 2**30)
    # Asking for less than vLLM starts with does not make it start: the start need stands.
    data = with_("serving.required_kv_gib", 0.001)
    data["serving"]["max_model_len"] = 1000
    w = parse_workload(data)
    assert w.required_kv_bytes == 64 * 16 * 131072 > int(0.001 * 2**30)


def test_content_hash_changes_with_content():
    assert parse_workload(BASE).content_hash == parse_workload(copy.deepcopy(BASE)).content_hash
    assert parse_workload(BASE).content_hash != parse_workload(with_("serving.max_num_seqs", 9)).content_hash


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("traffic.requests.max", -3, "traffic.requests.max: -3 must be >= 1"),
        ("traffic.requests.max", 9, "traffic.requests.max: 9 must be <= max_num_seqs=8"),
        ("traffic.requests.min", "x", "traffic.requests.min: 'x' must be an integer"),
        ("traffic.requests.kind", "normal", "traffic.requests.kind: 'normal' must be one of uniform, histogram"),
        ("traffic.mixed_share", 1.5, "traffic.mixed_share: 1.5 must be <= 1"),
        ("traffic.mixed_share", 0.5, "traffic.mixed_tokens: missing"),
        ("traffic.mean_context_len", 0, "traffic.mean_context_len: 0 must be >= 1"),
        ("serving.max_num_seqs", 0, "serving.max_num_seqs: 0 must be >= 1"),
        ("serving.num_speculative_tokens", -1, "serving.num_speculative_tokens: -1 must be >= 0"),
        ("serving.gpu_memory_utilization", 0, "serving.gpu_memory_utilization: 0 must be > 0"),
        ("serving.gpu_memory_utilization", 1.2, "serving.gpu_memory_utilization: 1.2 must be <= 1"),
        ("serving.cudagraph_mode", "ALL", "serving.cudagraph_mode: 'ALL' must be one of"),
        ("serving.gpu_capability", "nine", "serving.gpu_capability: 'nine' must look like 9.0"),
        ("serving.cudagraph_capture_sizes", [0, 4], "serving.cudagraph_capture_sizes: [0, 4] must be"),
        ("serving.speculative_schedule", [[1, 2]], "serving.speculative_schedule[0]: [1, 2] must be"),
        ("serving.max_num_batched_tokens", 16, "traffic.requests: 8 requests x q=4 = 32 tokens exceed"),
        ("serving.colour", "red", "serving.colour: unknown field"),
        ("model.preset", "gpt-9", "model.preset: 'gpt-9' is not a known preset"),
        ("model.dtype", "int3", "model.dtype: 'int3' must be one of"),
        ("model.tensor_parallel_size", 3, "model.tensor_parallel_size: 3 must divide num_attention_heads=32"),
        ("model.num_kv_heads", 5, "model.num_kv_heads: 5 must divide num_attention_heads=32"),
        ("name", "a b", "name: 'a b' must be non-empty"),
        ("traffic.trace", "nope.csv", "traffic.trace: "),
    ],
)
def test_bad_fields_name_path_and_value(path, value, message):
    with pytest.raises(WorkloadError) as info:
        parse_workload(with_(path, value))
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_user_max_inconsistent_with_list_is_a_serving_error():
    data = with_("serving.cudagraph_capture_sizes", [4, 8])
    data["serving"]["max_cudagraph_capture_size"] = 16
    with pytest.raises(WorkloadError, match=r"^serving: vLLM 0\.3\d refuses to start with these capture settings: "
                                            r"customized max_cudagraph_capture_size"):
        parse_workload(data)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(WorkloadError, match="is not a file"):
        load_workload(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("name: [unclosed\n")
    with pytest.raises(WorkloadError, match="not valid YAML"):
        load_workload(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(WorkloadError, match="must be a mapping"):
        load_workload(tmp_path / "list.yaml")


def test_yaml_tags_are_not_executed(tmp_path):
    (tmp_path / "evil.yaml").write_text("name: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(WorkloadError, match="not valid YAML"):
        load_workload(tmp_path / "evil.yaml")


def test_dynamic_schedule_sets_each_steps_query_length():
    # K=3 (q=4) up to 4 requests, K=1 (q=2) from 5 on: 6 requests make a 12-token decode step at query length 2,
    # which vLLM V2 dispatches as uniform at 2 (its tier's FULL graphs), beside the 3-request step at 4.
    data = with_("serving.speculative_schedule", [[1, 4, 3], [5, 8, 1]])
    steps = [(s.num_tokens, s.uniform_decode, s.query_len, s.num_reqs) for s in parse_workload(data).steps()]
    assert steps == [(4, True, 4, 1), (8, True, 4, 2), (10, True, 2, 5), (12, True, 2, 6), (12, True, 4, 3),
                     (14, True, 2, 7), (16, True, 2, 8), (16, True, 4, 4)]
    assert parse_workload(data).engine.decode_query_lens()[1:] == [4, 4, 4, 4, 2, 2, 2, 2]


def test_a_schedule_vllm_rejects_is_refused_naming_the_field():
    # vLLM's validate_and_normalize_dynamic_sd_schedule rejects both, and vLLM would not start with them.
    for schedule, message in (([[2, 8, 1]], "must start at 1"), ([[1, 4, 3], [4, 8, 1]], r"\(1, 4\) and \(4, 8\)")):
        with pytest.raises(WorkloadError,
                           match=rf"^serving: vLLM 0\.3\d refuses to start .*speculative_schedule .*{message}"):
            parse_workload(with_("serving.speculative_schedule", schedule))


def test_empty_or_non_mapping_file_says_so(tmp_path):
    (tmp_path / "empty.yaml").write_text("# just a comment\n")
    with pytest.raises(WorkloadError, match=r"^workload: empty.yaml is empty \(it needs name, model, serving"):
        load_workload(tmp_path / "empty.yaml")
    (tmp_path / "text.yaml").write_text("hello\n")
    with pytest.raises(WorkloadError, match="^workload: text.yaml holds a YAML str: it must be a mapping"):
        load_workload(tmp_path / "text.yaml")


@pytest.mark.parametrize(("row", "message"), [
    ("12x,1", "line 3: num_tokens='12x' must be an integer"),
    ("12,two", "line 3: num_reqs='two' must be an integer"),
    (",1", "line 3: num_tokens='' must be an integer"),
    ("9000,1", r"line 3: num_tokens=9000 must be in 1..max_num_batched_tokens=8192"),
    ("0,1", r"line 3: num_tokens=0 must be in 1..max_num_batched_tokens=8192"),
    ("12,13", r"line 3: num_reqs=13 must be in 1..min\(num_tokens=12, max_num_seqs=\d+\)"),
    ("600,0", r"line 3: num_reqs=0 must be in 1..min\(num_tokens=600, max_num_seqs=\d+\)"),
])
def test_a_bad_trace_value_names_its_column_and_value(tmp_path, row, message):
    (tmp_path / "steps.csv").write_text(f"num_tokens,num_reqs\n8,2\n{row}\n")
    data = copy.deepcopy(BASE)
    data["traffic"] = {"trace": "steps.csv"}
    with pytest.raises(WorkloadError, match=f"^traffic.trace: steps.csv {message}$"):
        parse_workload(data, base_dir=tmp_path)


def test_model_checkpoint_from_name_or_preset():
    # A preset carries its Hugging Face id; model.name (a fine-tune, a local path) replaces it.
    assert parse_workload(BASE).model.checkpoint == "meta-llama/Llama-3.1-8B-Instruct"
    assert parse_workload(with_("model.preset", "qwen3-8b")).model.checkpoint == "Qwen/Qwen3-8B"
    assert parse_workload(with_("model.name", "my-org/ft")).model.checkpoint == "my-org/ft"
    # tiny is no published model; an edited preset shape is no longer that checkpoint; explicit shapes name none.
    assert parse_workload(with_("model.preset", "tiny")).model.checkpoint is None
    assert parse_workload(with_("model.num_layers", 2)).model.checkpoint is None
    explicit = dict(PRESETS["tiny"].as_dict())
    assert parse_workload(with_("model", {k: explicit[k] for k in (
        "hidden_size", "num_layers", "num_attention_heads", "num_kv_heads", "head_dim", "intermediate_size",
        "vocab_size")})).model.checkpoint is None
    for bad in ("", " my-org/ft", 3):
        with pytest.raises(WorkloadError, match="^model.name: "):
            parse_workload(with_("model.name", bad))
