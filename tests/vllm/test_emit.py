"""Emitted vLLM files parse back and pass vLLM's capture-size rules; lists vLLM would change are refused."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml

from tuner.engines.vllm.defaults import default_capture_sizes
from tuner.engines.vllm.emit import (
    COMPILATION_CONFIG_FILE,
    COMPILATION_NOTES_FILE,
    FLAGS_FILE,
    SERVE_YAML_FILE,
    EmitError,
    Provenance,
    ServeSettings,
    render_files,
    validate_capture_sizes,
    write_files,
)

SERVING = dict(max_num_seqs=128, num_speculative_tokens=16, max_num_batched_tokens=8192)
PROVENANCE = Provenance("0.1.0", "reports/x/profile.csv", "handmade test fixture", "dflash (abc)", "2026-01-01T00:00Z",
                        {"source": "exact"})
SPECULATIVE = {"method": "dflash", "num_speculative_tokens": 16, "model": "z-lab/LLaMA3.1-8B-DFlash"}


def settings(**kw) -> ServeSettings:
    return ServeSettings(**{"model": "meta-llama/Llama-3.1-8B", "dtype": "bfloat16", "tensor_parallel_size": 1,
                            "max_num_seqs": 128, "max_num_batched_tokens": 8192, "max_model_len": 8192,
                            "gpu_memory_utilization": 0.9, "speculative_config": SPECULATIVE, **kw})


def render(sizes, **kw):
    return render_files(sizes, settings(**kw), cudagraph_mode="FULL_AND_PIECEWISE", provenance=PROVENANCE)


def test_the_checkpoint_is_what_vllm_serves():
    files = render([1, 2, 4])
    assert yaml.safe_load(files[SERVE_YAML_FILE])["model"] == "meta-llama/Llama-3.1-8B"
    assert "# usage: vllm serve meta-llama/Llama-3.1-8B <the line below>" in files[FLAGS_FILE]


def test_environment_and_notes_are_said_in_both_files_and_put_before_vllm_serve():
    env = (("VLLM_USE_V2_MODEL_RUNNER", "0", "the workload pins model_runner v1"),)
    files = render([1, 2, 4], environment=env, notes=("model: <X> stands for the served checkpoint",))
    for name in (SERVE_YAML_FILE, FLAGS_FILE):
        assert "# environment: VLLM_USE_V2_MODEL_RUNNER=0 must be set: the workload pins model_runner v1" in files[name]
        assert "# model: <X> stands for the served checkpoint" in files[name]
    assert "# usage: VLLM_USE_V2_MODEL_RUNNER=0 vllm serve --config vllm-serve.yaml" in files[SERVE_YAML_FILE]
    assert "# usage: VLLM_USE_V2_MODEL_RUNNER=0 vllm serve meta-llama/Llama-3.1-8B <the line" in files[FLAGS_FILE]


def test_files_parse_back_and_pass_vllm_rules(tmp_path):
    sizes = [1, 2, 4, 8, 16, 512, 1088, 2176]
    paths = write_files(tmp_path, render(sizes))
    assert sorted(p.name for p in paths) == sorted([COMPILATION_CONFIG_FILE, SERVE_YAML_FILE, FLAGS_FILE,
                                                    COMPILATION_NOTES_FILE])
    # The JSON's notes beside it: what the other files say as comments, line for line.
    notes = (tmp_path / COMPILATION_NOTES_FILE).read_text().splitlines()
    assert notes[0].startswith(f"# notes on {COMPILATION_CONFIG_FILE}")
    assert notes[1:] == [ln for ln in (tmp_path / SERVE_YAML_FILE).read_text().splitlines()
                         if ln.startswith("#") and not ln.startswith("# usage")]

    cc = json.loads((tmp_path / COMPILATION_CONFIG_FILE).read_text())
    assert cc == {"cudagraph_mode": "FULL_AND_PIECEWISE", "cudagraph_capture_sizes": sizes,
                  "max_cudagraph_capture_size": 2176}

    serve_text = (tmp_path / SERVE_YAML_FILE).read_text()
    assert "# profile: reports/x/profile.csv (device: handmade test fixture)" in serve_text
    serve = yaml.safe_load(serve_text)
    assert serve["compilation-config"] == cc and serve["speculative-config"] == SPECULATIVE
    assert serve["max-num-seqs"] == 128 and serve["max-num-batched-tokens"] == 8192
    assert (serve["max-model-len"], serve["gpu-memory-utilization"], serve["tensor-parallel-size"], serve["dtype"]) \
        == (8192, 0.9, 1, "bfloat16")

    # The flag line holds the same settings as the YAML, key for key, shell-quoted.
    flag = [line for line in (tmp_path / FLAGS_FILE).read_text().splitlines() if not line.startswith("#")]
    argv = shlex.split(flag[0])
    flags = dict(zip(argv[::2], argv[1::2]))
    assert json.loads(flags["--compilation-config"]) == cc
    assert json.loads(flags["--speculative-config"]) == SPECULATIVE
    assert {k: v for k, v in flags.items() if not k.endswith("-config")} == {
        f"--{k}": str(v) for k, v in serve.items() if k != "model" and not k.endswith("-config")}

    # vLLM keeps an explicit list as it is: sorted, unique, within the token budget, max consistent.
    kept = default_capture_sizes(128, 16, 8192, cudagraph_capture_sizes=cc["cudagraph_capture_sizes"],
                                 max_cudagraph_capture_size=cc["max_cudagraph_capture_size"])
    assert kept.sizes == sizes and kept.max_size == 2176


def test_enforce_eager_is_a_bare_flag():
    files = render([], enforce_eager=True, speculative_config=None)
    assert yaml.safe_load(files[SERVE_YAML_FILE])["enforce-eager"] is True
    assert "--enforce-eager --compilation-config" in files[FLAGS_FILE]
    assert "--speculative-config" not in files[FLAGS_FILE]


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


# ---------------------------------------------------------------------------- what the engine hands the emitter
def _serve_settings(speculative=None, **serving):
    from tuner.workload.spec import parse_workload

    spec = {"name": "w", "model": {"preset": "llama-3.1-8b"},
            "serving": {"max_num_seqs": 32, "num_speculative_tokens": 3, **serving},
            "traffic": {"requests": {"kind": "uniform", "min": 1, "max": 32}}}
    if speculative is not None:
        spec["speculative"] = speculative
    w = parse_workload(spec)
    return w.engine.serve_settings(w.deployment)


def test_the_speculative_config_carries_what_was_tuned():
    s = _serve_settings({"method": "eagle", "parallel_drafting": True, "model": "my-org/p-eagle"},
                        speculative_schedule=[[1, 8, 3], [9, 32, 1]])
    assert s.speculative_config == {"method": "eagle", "num_speculative_tokens": 3, "model": "my-org/p-eagle",
                                    "parallel_drafting": True,
                                    "num_speculative_tokens_per_batch_size": [[1, 8, 3], [9, 32, 1]]}
    assert s.model == "meta-llama/Llama-3.1-8B-Instruct" and s.environment == () and s.notes == ()


def test_an_unnamed_method_and_drafter_stand_as_values_vllm_refuses_with_notes():
    s = _serve_settings()  # 3 draft tokens, no speculative section
    assert s.speculative_config == {"method": "<SPECULATIVE METHOD: set speculative.method in the workload, or put "
                                              "vLLM's name for it here>", "num_speculative_tokens": 3}
    assert s.notes[0].startswith("speculative-config.method: <SPECULATIVE METHOD")
    s = _serve_settings({"method": "eagle3"})
    assert s.speculative_config["model"].startswith("<eagle3 DRAFT CHECKPOINT: set speculative.model")
    # mtp's checkpoint defaults to the target in vLLM, and ngram has none: nothing to name there
    assert "model" not in _serve_settings({"method": "mtp"}).speculative_config
    assert "model" not in _serve_settings({"method": "ngram"}).speculative_config


@pytest.mark.parametrize(("serving", "speculative", "env"), [
    ({"model_runner": "v1"}, {"method": "eagle"}, [("VLLM_USE_V2_MODEL_RUNNER", "0")]),
    ({"model_runner": "v1"}, {"method": "suffix"}, []),  # vLLM picks V1 for suffix itself
    ({"model_runner": "v2"}, {"method": "eagle"}, []),  # V2 is vLLM's own pick
    ({"estimate_cudagraph_memory": False}, {"method": "eagle"}, [("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "0")]),
])
def test_the_environment_is_what_vllm_would_not_do_by_itself(serving, speculative, env):
    assert [(name, value) for name, value, _ in _serve_settings(speculative, **serving).environment] == env
