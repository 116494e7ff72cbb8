"""Markers: `gpu` tests skip without CUDA; `postgres` tests skip without a server URL (but CI requires them)."""

from __future__ import annotations

import os

import pytest


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    has_cuda = _cuda_available()
    pg_url = os.environ.get("CGTUNE_TEST_POSTGRES_URL")
    require_pg = os.environ.get("CGTUNE_REQUIRE_POSTGRES") == "1"
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
        if "postgres" in item.keywords and not pg_url:
            if require_pg:
                raise pytest.UsageError("CGTUNE_REQUIRE_POSTGRES=1 but CGTUNE_TEST_POSTGRES_URL is not set")
            item.add_marker(pytest.mark.skip(
                reason="no PostgreSQL server: run `eval \"$(scripts/ci_postgres.sh start)\"` to start one"))
