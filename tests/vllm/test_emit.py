"""Emitted vLLM files parse back and pass vLLM's capture-size rules; lists vLLM would change are refused."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml

from tuner.vllm.defaults import default_capture_sizes
from tuner.vllm.emit import (
    COMPILATION_CONFIG_FILE,
    FLAGS_FILE,
    SERVE_YAML_FILE,
    EmitError,
    Provenance,
    render_files,
    validate_capture_sizes,
    write_files,
)

SERVING = dict(max_num_seqs=128, num_speculative_tokens=16, max_num_batched_tokens=8192)
PROVENANCE = Provenance("0.1.0", "reports/x/profile.csv", "handmade test fixture", "dflash (abc)", "2026-01-01T00:00Z",
                        {"source": "exact"})


def render(sizes, model="meta-llama/Llama-3.1-8B", **kw):
    return render_files(sizes, model=model, cudagraph_mode="FULL_AND_PIECEWISE",
                        max_model_len=8192, gpu_memory_utilization=0.9, tensor_parallel_size=1,
                        provenance=PROVENANCE, **{**SERVING, **kw})


def test_the_checkpoint_is_what_vllm_serves():
    files = render([1, 2, 4])
    assert yaml.safe_load(files[SERVE_YAML_FILE])["model"] == "meta-llama/Llama-3.1-8B"
    assert "# usage: vllm serve meta-llama/Llama-3.1-8B <the line below>" in files[FLAGS_FILE]


def test_without_a_checkpoint_a_placeholder_comment_stands_where_the_model_goes():
    # A preset name (qwen3-8b) is no checkpoint vLLM can load: write none, and say where it goes.
    files = render([1, 2, 4], model=None)
    serve = yaml.safe_load(files[SERVE_YAML_FILE])
    assert "model" not in serve
    assert "# model: CHECKPOINT  <- the workload names no checkpoint (set model.name in it" in files[SERVE_YAML_FILE]
    assert "# usage: vllm serve CHECKPOINT --config vllm-serve.yaml" in files[SERVE_YAML_FILE]
    assert "# usage: vllm serve CHECKPOINT <the line below>" in files[FLAGS_FILE]


def test_files_parse_back_and_pass_vllm_rules(tmp_path):
    sizes = [1, 2, 4, 8, 16, 512, 1088, 2176]
    paths = write_files(tmp_path, render(sizes))
    assert sorted(p.name for p in paths) == sorted([COMPILATION_CONFIG_FILE, SERVE_YAML_FILE, FLAGS_FILE])

    cc = json.loads((tmp_path / COMPILATION_CONFIG_FILE).read_text())
    assert cc == {"cudagraph_mode": "FULL_AND_PIECEWISE", "cudagraph_capture_sizes": sizes,
                  "max_cudagraph_capture_size": 2176}

    serve_text = (tmp_path / SERVE_YAML_FILE).read_text()
    assert "# profile: reports/x/profile.csv (device: handmade test fixture)" in serve_text
    serve = yaml.safe_load(serve_text)
    assert serve["compilation-config"] == cc
    assert serve["max-num-seqs"] == 128 and serve["max-num-batched-tokens"] == 8192

    flag = [line for line in (tmp_path / FLAGS_FILE).read_text().splitlines() if not line.startswith("#")]
    argv = shlex.split(flag[0])
    assert argv[0] == "--compilation-config" and json.loads(argv[1]) == cc

    # vLLM keeps an explicit list as it is: sorted, unique, within the token budget, max consistent.
    kept = default_capture_sizes(128, 16, 8192, cudagraph_capture_sizes=cc["cudagraph_capture_sizes"],
                                 max_cudagraph_capture_size=cc["max_cudagraph_capture_size"])
    assert kept.sizes == sizes and kept.max_size == 2176


def test_unsorted_input_is_emitted_sorted_and_unique():
    files = render([16, 4, 4, 1])
    assert json.loads(files[COMPILATION_CONFIG_FILE])["cudagraph_capture_sizes"] == [1, 4, 16]


@pytest.mark.parametrize("sizes, message", [
    ([1, 9000], "max_num_batched_tokens=8192"),
    ([4, 2], "sorted and unique"),
    ([0, 2], "size < 1"),
    ([], "empty"),
])
def test_lists_vllm_would_change_are_refused(sizes, message):
    with pytest.raises(EmitError, match=message):
        validate_capture_sizes(sizes, **SERVING)


def test_empty_list_emits_cudagraph_mode_none():
    files = render([])
    assert json.loads(files[COMPILATION_CONFIG_FILE]) == {"cudagraph_mode": "NONE"}
