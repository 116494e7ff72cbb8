"""vLLM 0.34's files carry what changes what vLLM resolves, and the default is costed as vLLM resolves it (issue 48):
the decode token budget a deployment runs with is written where vLLM's own default for the files would differ, the
default's keys are dispatched as vLLM resolves the deployment's settings, the default written out falls back to the
deployment's own fields where lists would resolve otherwise, and the YAML names the performance mode and the
extensible KV cache where the workload departs from vLLM's defaults. The numbers are vLLM 0.34's, as
tests/vllm034/test_files_engine_034.py holds them to its own code; these tests run without it."""

from __future__ import annotations

import json

import pytest
import yaml

from tuner.engines.engine import Deployment
from tuner.engines.serving import ServingConfig
from tuner.engines.vllm.emit import COMPILATION_CONFIG_FILE, FLAGS_FILE, SERVE_YAML_FILE, EmitError, Provenance
from tuner.engines.vllm.v034.dispatch import join_keys
from tuner.engines.vllm.v034.engine import Vllm034Engine
from tuner.engines.vllm.v034.settings import Vllm034Settings

STAMP = Provenance("test", "-", "-", "-", "-")
DEPLOYMENT = Deployment("org/model", None, "bfloat16", 1)


def _engine(**serving: object) -> Vllm034Engine:
    settings = {k: serving.pop(k) for k in list(serving) if k in Vllm034Settings.__dataclass_fields__}
    return Vllm034Engine(ServingConfig(**{"vllm_version": "0.34", **serving},  # type: ignore[arg-type]
                                       engine_settings=Vllm034Settings(**settings)))  # type: ignore[arg-type]


def _files(engine: Vllm034Engine, keys: tuple[int, ...]) -> tuple[dict, dict, str]:
    mode = engine.dispatcher(engine.probe_sizes()).cudagraph_mode
    files = engine.render_files(keys, DEPLOYMENT, cudagraph_mode=mode, provenance=STAMP)
    return json.loads(files[COMPILATION_CONFIG_FILE]), yaml.safe_load(files[SERVE_YAML_FILE]), files[FLAGS_FILE]


def _decode(engine: Vllm034Engine, keys: tuple[int, ...]) -> list[tuple[int, int]]:
    """`(requests, tokens)` of the FULL decode graphs cgtune costs for the keys, widest first."""
    return [(n, t) for _, t, q, n in engine.dispatcher(keys).manager_graphs() if q is not None]


def test_sm100_files_carry_a_decode_budget_above_vllms_8192():
    # SM100, 512 requests, K = 24, budget 16384: without the field vLLM clamps at 327 requests (8175 tokens).
    e = _engine(max_num_seqs=512, num_speculative_tokens=24, speculative_method="ngram", max_num_batched_tokens=16384,
                gpu_capability=(10, 0), max_decode_tokens=16384)
    keys = join_keys([1, 2, 4, 8, 4096, 16384], [1, 2, 4, 64, 327, 512])
    cc, serve, flags = _files(e, keys)
    assert cc["max_decode_cudagraph_capture_tokens"] == 16384
    assert serve["compilation-config"] == cc and '"max_decode_cudagraph_capture_tokens": 16384' in flags
    assert _decode(e, keys)[0] == (512, 12800)
    # the same deployment with vLLM's own 8192 writes nothing, and costs the clamp vLLM makes
    e = _engine(max_num_seqs=512, num_speculative_tokens=24, speculative_method="ngram", max_num_batched_tokens=16384,
                gpu_capability=(10, 0))
    cc, _, _ = _files(e, join_keys([1, 16384], [1, 2, 4, 64, 327]))
    assert "max_decode_cudagraph_capture_tokens" not in cc
    assert _decode(e, join_keys([1, 16384], [1, 2, 4, 64, 327]))[0] == (327, 8175)


def test_sm90_files_carry_a_decode_budget_vllm_has_none_of():
    # SM90, max_num_seqs 2, max_num_batched_tokens 2, budget 1: FULL 1 alone (vLLM captured FULL 2 too without it).
    e = _engine(max_num_seqs=2, max_num_batched_tokens=2, max_decode_tokens=1)
    keys = join_keys([1, 2], [1, 2])
    cc, _, _ = _files(e, keys)
    assert cc["max_decode_cudagraph_capture_tokens"] == 1 and _decode(e, keys) == [(1, 1)]
    assert e.dispatcher(keys).dispatch_desc(2, 2, 1) == ("PIECEWISE", 2, None)


def test_the_default_with_a_deprecated_field_is_costed_as_vllm_resolves_it_and_its_budget_kept():
    # SM100, 257 requests, K = 31, max_cudagraph_capture_size 16384: the deprecated field turns the wide defaults and
    # their 8192-token budget off, so the default's FULL decode graphs reach 257 requests (8224 tokens).
    e = _engine(max_num_seqs=257, num_speculative_tokens=31, speculative_method="ngram", max_num_batched_tokens=16384,
                gpu_capability=(10, 0), max_cudagraph_capture_size=16384)
    default = tuple(e.defaults().sizes)
    assert _decode(e, default)[0] == (257, 8224)
    assert e.dispatcher(default).dispatch_desc(257, 8224, 32) == ("FULL", 8224, 257)
    # a tuned pair keeps the deployment's no-budget (written as the token budget, which bounds every decode graph)
    tuned = join_keys([1, 16384], [1, 200, 257])
    cc, _, _ = _files(e, tuned)
    assert cc["max_decode_cudagraph_capture_tokens"] == 16384 and _decode(e, tuned)[0] == (257, 8224)


def test_the_default_written_out_is_the_deployments_own_fields_where_lists_resolve_otherwise():
    # FULL_DECODE_ONLY with a deprecated cap: vLLM keeps the prefill sizes in the record the decode graphs are bounded
    # by, which lists written out would not; the default's files are the deployment's own settings.
    e = _engine(max_num_seqs=3, max_num_batched_tokens=64, gpu_capability=(10, 0), cudagraph_mode="FULL_DECODE_ONLY",
                max_cudagraph_capture_size=809)
    cc, _, _ = _files(e, tuple(e.defaults().sizes))
    assert cc == {"cudagraph_mode": "FULL_DECODE_ONLY", "max_cudagraph_capture_size": 809}
    # a tuned pair is written as lists
    cc, _, _ = _files(e, join_keys([8], [1, 3]))
    assert cc["decode_cudagraph_capture_request_sizes"] == [1, 3]


def test_a_size_vllm_would_drop_or_capture_smaller_is_refused_in_one_line():
    e = _engine(max_num_seqs=8, max_num_batched_tokens=64)
    with pytest.raises(EmitError, match=r"^prefill_cudagraph_capture_token_sizes: 65 > max_num_batched_tokens=64 "):
        _files(e, join_keys([1, 65], [1]))
    with pytest.raises(EmitError, match=r"^decode_cudagraph_capture_request_sizes: 9 > max_num_seqs=8 "):
        _files(e, join_keys([1], [9]))
    e = _engine(max_num_seqs=8, max_num_batched_tokens=64, max_decode_tokens=5)
    with pytest.raises(EmitError, match=r"captures 5 requests \(the most its decode token budget holds\)"):
        _files(e, join_keys([1], [1, 8]))


def test_the_yaml_names_the_performance_mode_and_an_extensible_kv_cache_turned_off():
    e = _engine(max_num_seqs=8, max_num_batched_tokens=64, performance_mode="interactivity",
                extensible_kv_cache=False)
    _, serve, flags = _files(e, join_keys([1, 8], [1]))
    # vLLM's parser takes --disable-extensible-kv-cache (EnableDisableAction): `enable-...: false` would be dropped
    assert serve["performance-mode"] == "interactivity" and serve["disable-extensible-kv-cache"] is True
    assert "--performance-mode interactivity" in flags and "--disable-extensible-kv-cache" in flags
    _, serve, flags = _files(_engine(max_num_seqs=8, max_num_batched_tokens=64), join_keys([1, 8], [1]))
    assert "performance-mode" not in serve and "disable-extensible-kv-cache" not in serve
