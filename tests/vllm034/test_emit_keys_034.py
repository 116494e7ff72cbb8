"""The keys of a vLLM 0.34 list pair through its compilation config and back (`compilation_config_034`,
`keys_of_compilation_config`: what `cgtune check` reads of a run), and a list vLLM 0.34 would not keep refused before
any file is written (`render_034_files`). Needs no vLLM (test_files_034.py parses the files with 0.34's own parser)."""

from __future__ import annotations

import json

import pytest

from tuner.engines.registry import engine_of
from tuner.engines.serving import ServingConfig
from tuner.engines.vllm.emit import COMPILATION_CONFIG_FILE, EmitError, Provenance, ServeSettings
from tuner.engines.vllm.v034.dispatch import join_keys
from tuner.engines.vllm.v034.emit import compilation_config_034, keys_of_compilation_config, render_034_files

BOTH = join_keys([8, 512], [1, 30])
# the deployment the config is read back under: vLLM 0.34 on an H200 with room for both lists
ENGINE = engine_of(ServingConfig(max_num_seqs=256, max_num_batched_tokens=2048, gpu_capability=(9, 0),
                                 vllm_version="0.34"))


@pytest.mark.parametrize("keys", [BOTH, join_keys([8, 512], []), join_keys([], [1, 30])],
                         ids=["both lists", "prefill only", "decode only"])
def test_a_list_pair_goes_through_its_compilation_config_and_back(keys):
    config = compilation_config_034(keys, "FULL_AND_PIECEWISE")
    assert config["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    assert keys_of_compilation_config(ENGINE, json.loads(json.dumps(config))) == keys


@pytest.mark.parametrize(("keys", "mode"), [((), "FULL_AND_PIECEWISE"), (BOTH, "NONE")], ids=["no keys", "mode NONE"])
def test_nothing_captured_is_written_as_mode_none_and_read_back_as_no_keys(keys, mode):
    config = compilation_config_034(keys, mode)
    assert config == {"cudagraph_mode": "NONE"}
    assert keys_of_compilation_config(ENGINE, config) == ()


def test_a_list_vllm_would_not_keep_is_refused_before_any_file_is_written():
    # 256 x 17 with 2048 tokens: 121 requests would be captured at 120 (2048 // 17).
    engine = engine_of(ServingConfig(max_num_seqs=256, num_speculative_tokens=16, max_num_batched_tokens=2048,
                                     gpu_capability=(10, 0), vllm_version="0.34"))
    settings = ServeSettings(model="m", dtype="bfloat16", tensor_parallel_size=1, max_num_seqs=256,
                             max_num_batched_tokens=2048, max_model_len=8192, gpu_memory_utilization=0.9)
    provenance = Provenance("test", "no profile", "no device", "no workload", "now")
    files = render_034_files(engine, join_keys([2048], [120]), settings, cudagraph_mode="FULL_AND_PIECEWISE",
                             provenance=provenance)
    assert keys_of_compilation_config(engine, json.loads(files[COMPILATION_CONFIG_FILE])) == join_keys([2048], [120])
    with pytest.raises(EmitError, match="captures 120 requests"):
        render_034_files(engine, join_keys([2048], [121]), settings, cudagraph_mode="FULL_AND_PIECEWISE",
                         provenance=provenance)


def test_an_empty_list_pair_ships_mode_none_with_no_capture_fields():
    # No graph chosen under a capturing mode: the files say NONE and carry no capture field (none is resolved first).
    settings = ServeSettings(model="m", dtype="bfloat16", tensor_parallel_size=1, max_num_seqs=256,
                             max_num_batched_tokens=2048, max_model_len=8192, gpu_memory_utilization=0.9)
    files = render_034_files(ENGINE, (), settings, cudagraph_mode="FULL_AND_PIECEWISE",
                             provenance=Provenance("test", "no profile", "no device", "no workload", "now"))
    assert json.loads(files[COMPILATION_CONFIG_FILE]) == {"cudagraph_mode": "NONE"}
    # a deployment in mode NONE ships NONE whatever list it is handed: nothing is resolved, nothing refused
    files = render_034_files(ENGINE, (-4, 64), settings, cudagraph_mode="NONE",
                             provenance=Provenance("test", "no profile", "no device", "no workload", "now"))
    assert json.loads(files[COMPILATION_CONFIG_FILE]) == {"cudagraph_mode": "NONE"}

