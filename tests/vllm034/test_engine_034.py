"""The 0.34 engine's smaller surfaces that issue 47's mutation run found untested (each test fails for the wrong rule
it names): the KV cache of a deployment that turns the extensible KV cache off, vLLM's warnings on `cgtune defaults`,
and the sizes a tuned list adds above a default with no decode graphs."""

from __future__ import annotations

import sys
from pathlib import Path

from tuner.engines.serving import ServingConfig
from tuner.engines.vllm.engine import VllmEngine
from tuner.engines.vllm.memory import KvRule
from tuner.engines.vllm.v034.engine import Vllm034Engine
from tuner.engines.vllm.v034.settings import Vllm034Settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ helpers (import-mode=importlib)
from cli_runner import run  # noqa: E402

GIB = 1 << 30


def engine(**settings: object) -> Vllm034Engine:
    return Vllm034Engine(ServingConfig(max_num_seqs=64, num_speculative_tokens=3, speculative_method="ngram",
                                       vllm_version="0.34", engine_settings=Vllm034Settings(**settings)))


def test_without_the_extensible_kv_cache_the_kv_cache_is_sized_by_033s_rule_from_the_same_figures():
    # vLLM 0.34 with --no-enable-extensible-kv-cache sizes the KV cache before capture from the estimate, 0.33's code
    # (requested - non-KV - estimate); every figure given reaches that rule.
    figures = dict(total_memory_bytes=141 * GIB, non_kv_cache_bytes=20 * GIB, weights_bytes=lambda: 16 * GIB,
                   required_kv_bytes=4 * GIB, tensor_parallel_size=1)
    rule = engine(extensible_kv_cache=False).kv_rule(**figures, notes=[])
    assert isinstance(rule, KvRule)
    base = VllmEngine(ServingConfig(max_num_seqs=64, vllm_version="0.33"))
    assert rule == base.kv_rule(**figures, notes=[])
    assert rule.total_memory_bytes == 141 * GIB and rule.non_kv_cache_bytes == 20 * GIB


def test_cgtune_defaults_prints_vllms_warnings_for_the_deployment(capsys):
    code, out, err = run(capsys, "defaults", "--vllm-version", "0.34", "--max-num-seqs", "8",
                         "--cudagraph-capture-sizes", "1", "2", "4")
    assert code == 0, err
    assert any(line.startswith("warning") and "cudagraph_capture_sizes and max_cudagraph_capture_size are deprecated"
               in line for line in out.splitlines()), out


def test_sizes_added_above_a_default_without_decode_graphs_are_every_decode_size_and_the_wider_prefill_sizes():
    e = engine(max_decode_requests=0, prefill_token_sizes=(64, 128))
    default = e.defaults().sizes
    assert all(k > 0 for k in default) and max(default) == 128  # no decode graph in the default
    assert e.added_above(default, [-4, -1, 64, 256]) == [-4, -1, 256]
