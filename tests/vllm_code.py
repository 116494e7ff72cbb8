"""Where the tests find vLLM's own code for their cross-checks: vLLM 0.33.0 installed in this venv (`pip install
--no-deps vllm==0.33.0`), vLLM 0.34.0's in a directory of its own (`pip install --target DIR --no-deps vllm==0.34.0`,
named by CGTUNE_VLLM034_PATH). A test without it skips, and fails where CGTUNE_REQUIRE_VLLM=1 (.ci/run)."""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

import pytest

__all__ = ["REQUIRED", "require_vllm_033", "vllm_034_code"]

REQUIRED = os.environ.get("CGTUNE_REQUIRE_VLLM") == "1"
"""CI installs both and sets this: the cross-checks may not skip."""


def _missing(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"CGTUNE_REQUIRE_VLLM=1 but {reason}")
    pytest.skip(reason)


def require_vllm_033() -> None:
    """Skip (fail where REQUIRED) unless vllm 0.33.0 is installed."""
    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        version = None
    if version != "0.33.0":
        _missing(f"vllm==0.33.0 is not installed (found {version})")


def vllm_034_code() -> Path:
    """The directory holding vLLM 0.34.0's code (CGTUNE_VLLM034_PATH); skips (fails where REQUIRED) without it."""
    path = os.environ.get("CGTUNE_VLLM034_PATH")
    if not path or not (Path(path) / "vllm").is_dir():
        _missing("CGTUNE_VLLM034_PATH does not name vLLM 0.34.0's code (pip install --target DIR --no-deps "
                 "vllm==0.34.0)")
    return Path(path)
