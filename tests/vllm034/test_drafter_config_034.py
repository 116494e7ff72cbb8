"""The draft model `cgtune profile --backend vllm` writes for each model-based method, read by vLLM 0.34.0's own config
code (tests/vllm/drafter_config_check.py in a process of its own, 0.34's code first on its path), as
tests/vllm/test_drafter_config.py holds it to 0.33's. Skipped where CGTUNE_VLLM034_PATH is not set, unless
CGTUNE_REQUIRE_VLLM=1."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from vllm_code import vllm_034_code

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "vllm"))  # test_drafter_config's helpers (import-mode=importlib)
from test_drafter_config import assert_vllm_builds_each_drafter, run_check  # noqa: E402


@pytest.mark.slow  # vLLM builds every drafter in a subprocess (~40 s): CI's slow run holds it
def test_vllm_034_builds_the_drafter_cgtune_writes_for_each_method():
    answer = run_check(str(vllm_034_code()))
    assert answer["version"] == "0.34.0"
    assert_vllm_builds_each_drafter(answer, dflash_parallel=False)
