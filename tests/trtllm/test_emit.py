"""Emitted TensorRT-LLM YAML parses back and passes its validator and filter; lists it would change are refused."""

from __future__ import annotations

import pytest
import yaml

from tuner.engines.trtllm import resolve_cuda_graph_config
from tuner.engines.trtllm.emit import EXTRA_OPTIONS_FILE, EmitError, render_files, validate_batch_sizes
from tuner.engines.vllm.emit import Provenance

PROVENANCE = Provenance("0.1.0", "reports/x/profile.csv", "handmade test fixture", "trtllm-mtp (abc)",
                        "2026-01-01T00:00Z", {"source": "exact"})
SIZES = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256]


def test_yaml_parses_back_with_every_key():
    files = render_files(SIZES, max_batch_size=256, max_num_tokens=8192, free_gpu_memory_fraction=0.85,
                         provenance=PROVENANCE)
    assert list(files) == [EXTRA_OPTIONS_FILE]
    text = files[EXTRA_OPTIONS_FILE]
    assert "# profile: reports/x/profile.csv (device: handmade test fixture)" in text
    options = yaml.safe_load(text)
    assert options == {
        "max_batch_size": 256,
        "max_num_tokens": 8192,
        "cuda_graph_config": {"enable_padding": True, "batch_sizes": SIZES},
        "kv_cache_config": {"free_gpu_memory_fraction": 0.85},
    }
    # TensorRT-LLM's validator accepts it unchanged, and no cuda_graph_config.max_batch_size sits beside the list.
    graph = options["cuda_graph_config"]
    assert "max_batch_size" not in graph
    assert resolve_cuda_graph_config(graph["batch_sizes"], 0, enable_padding=graph["enable_padding"]) == (SIZES, 256)


def test_speculative_config_is_written():
    spec = {"decoding_type": "MTP", "max_draft_len": 3}
    files = render_files([1, 2, 4, 8, 64, 256], max_batch_size=256, max_num_tokens=1024, speculative_config=spec)
    options = yaml.safe_load(files[EXTRA_OPTIONS_FILE])
    assert options["speculative_config"] == spec


def test_list_above_the_token_cap_is_refused_in_one_line():
    # MTP draft 3, max_num_tokens 1024: cap = min(512, 1024 // 4) = 256, so 512 would become 256.
    with pytest.raises(EmitError) as info:
        validate_batch_sizes([1, 64, 256, 512], max_batch_size=512, max_num_tokens=1024,
                             speculative_config={"decoding_type": "MTP", "max_draft_len": 3})
    message = str(info.value)
    assert message.startswith("cuda_graph_config.batch_sizes: 512 > 256 = min(max_batch_size=512, "
                              "max_num_tokens=1024 // 4); TensorRT-LLM would capture [1, 64, 256]")
    assert "\n" not in message


def test_list_above_the_llm_max_batch_size_is_refused_without_padding_too():
    with pytest.raises(EmitError, match=r"would capture \[1, 8\]$"):
        validate_batch_sizes([1, 8, 64], max_batch_size=32, enable_padding=False)


def test_mismatched_cuda_graph_max_is_refused():
    with pytest.raises(EmitError, match=r"^cuda_graph_config.max_batch_size=128 must equal max\(batch_sizes\)=64"):
        validate_batch_sizes([1, 8, 64], cuda_graph_max_batch_size=128)
    assert validate_batch_sizes([1, 8, 64], cuda_graph_max_batch_size=64) == [1, 8, 64]


@pytest.mark.parametrize(
    ("sizes", "pattern"),
    [([], r"^cuda_graph_config.batch_sizes: \[\] is empty"), ([0, 8], r"holds a size < 1"),
     ([8, 4], r"must be sorted and unique"), ([4, 4], r"must be sorted and unique")],
)
def test_malformed_lists_are_refused(sizes, pattern):
    with pytest.raises(EmitError, match=pattern):
        render_files(sizes)


def test_missing_draft_len_schedule_keys_are_refused():
    spec = {"decoding_type": "Eagle3", "max_draft_len": 4, "draft_len_schedule": {8: 4, 32: 2}}
    with pytest.raises(EmitError, match=r"lacks draft_len_schedule keys; TensorRT-LLM would capture \[1, 8, 16, 32, "
                                        r"64\]$"):
        validate_batch_sizes([1, 16, 64], speculative_config=spec)
    assert validate_batch_sizes([1, 8, 16, 32, 64], speculative_config=spec) == [1, 8, 16, 32, 64]


@pytest.mark.parametrize(
    ("spec", "pattern"),
    [({"max_draft_len": 3}, r"^speculative_config: .* has no decoding_type$"),
     ({"decoding_type": "MTP", "max_draft_len": 0}, r"^speculative_config.max_draft_len: 0 must be an integer >= 1$")],
)
def test_bad_speculative_config_is_refused(spec, pattern):
    with pytest.raises(EmitError, match=pattern):
        validate_batch_sizes([1, 2], speculative_config=spec)


def test_bad_fraction_is_refused():
    with pytest.raises(EmitError, match=r"^kv_cache_config.free_gpu_memory_fraction: 1.2 must be in \(0, 1\]$"):
        render_files([1, 2], free_gpu_memory_fraction=1.2)
