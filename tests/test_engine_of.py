"""The engine a serving configuration gets (`tuner.engines.registry.engine_of`) words the reason its release was
chosen in every file and console line; the reason is no part of the configuration's equality, so the engine's cache
must not hand a configuration read under one reason the engine of an equal one read under another (CI saw the
search's console say an earlier test's reason)."""

from __future__ import annotations

from dataclasses import replace

from tuner.engines.registry import engine_of
from tuner.engines.serving import ServingConfig


def test_equal_configurations_read_for_other_reasons_get_engines_that_say_their_own_reason():
    installed = ServingConfig(max_num_seqs=8, vllm_version="0.33", vllm_version_why="vLLM 0.33.0 is installed here")
    asked = replace(installed, vllm_version_why="asked for by --vllm-version")
    assert installed == asked  # the premise: equal, so a cache keyed by the configuration alone would mix them up
    assert engine_of(installed).release_words == "vLLM 0.33 (vLLM 0.33.0 is installed here)"
    assert engine_of(asked).release_words == "vLLM 0.33 (asked for by --vllm-version)"
    assert engine_of(asked) is engine_of(replace(asked))  # still one engine per configuration and reason
