"""The draft model `cgtune profile --backend vllm` writes for each model-based method, read by vLLM 0.34.0's own config
code (tests/vllm/drafter_config_check.py in a process of its own, 0.34's code first on its path), as
tests/vllm/test_drafter_config.py holds it to 0.33's. Skipped where CGTUNE_VLLM034_PATH is not set, unless
CGTUNE_REQUIRE_VLLM=1."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "vllm"))  # test_drafter_config's helpers (import-mode=importlib)
from test_drafter_config import assert_vllm_builds_each_drafter, run_check  # noqa: E402


def test_vllm_034_builds_the_drafter_cgtune_writes_for_each_method():
    path = os.environ.get("CGTUNE_VLLM034_PATH")
    if not path or not (Path(path) / "vllm").is_dir():
        reason = "CGTUNE_VLLM034_PATH does not name vLLM 0.34.0's code (pip install --target DIR --no-deps vllm==0.34.0)"
        if os.environ.get("CGTUNE_REQUIRE_VLLM") == "1":
            pytest.fail(f"CGTUNE_REQUIRE_VLLM=1 but {reason}")
        pytest.skip(reason)
    answer = run_check(path)
    assert answer["version"] == "0.34.0"
    assert_vllm_builds_each_drafter(answer, dflash_parallel=False)
