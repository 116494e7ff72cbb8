"""Markers: `gpu` tests skip without CUDA; `postgres` tests skip without a server URL (but CI requires them); `slow`
end-to-end cases are left out of the whole suite run bare (`python -m pytest -q`: no -m, no paths; `-m slow` runs them,
and a run naming paths runs what they hold); the `pg_url` fixture: a fresh database on that server per test. A workload
that does not pin `serving.vllm_version` runs under vLLM 0.33's rules here (the suite's 0.33 tests), whatever vLLM is
installed: 0.34's tests pin 0.34. A run ends with one line counting what it skipped, by cause, what each cause needs,
and the slow cases it left out (tests/skip_summary.py)."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Generator
from pathlib import Path

import pytest

from tuner.engines.vllm.versions import VERSION_ENV

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/skip_summary.py (import-mode=importlib)
from skip_summary import skip_line  # noqa: E402

# Set before any workload is read, and inherited by every command a test runs: without it the rules would follow
# whichever vLLM this machine has installed (CI installs 0.33's code for the oracle) or cgtune's default (0.34).
os.environ[VERSION_ENV] = "0.33"

_SLOW_LEFT_OUT = pytest.StashKey[int]()


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # torch only where a test asks for a GPU: importing it costs a run that has none (a one-file run) seconds
    has_cuda = any("gpu" in item.keywords for item in items) and _cuda_available()
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
    # Only the bare whole-suite run leaves the slow cases out, so it stays short on a laptop; a run that names paths
    # (.ci/run's other jobs, a developer's one file or node id) or a -m expression gets exactly what it asked for.
    if not config.option.markexpr and config.args_source == pytest.Config.ArgsSource.TESTPATHS:
        slow = [item for item in items if item.get_closest_marker("slow") is not None]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if item.get_closest_marker("slow") is None]
        config.stash[_SLOW_LEFT_OUT] = len(slow)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> Generator[None]:
    # A wrapper run first, so its code after the yield runs last: below pytest's own "short test summary info" (whose
    # -ra lists every skip, one line each), right above the final counts, where a reader looks.
    yield
    reports = terminalreporter.stats.get("skipped", [])
    # A skip's longrepr is (path, line, "Skipped: reason"), for a test and for a module skipped at collection alike.
    line = skip_line((r.longrepr[2] if isinstance(r.longrepr, tuple) else str(r.longrepr) for r in reports),
                     terminalreporter.config.stash.get(_SLOW_LEFT_OUT, 0))
    if line:
        terminalreporter.write_line(line, yellow=True)


@pytest.fixture()
def pg_url():
    """A fresh database on the test server for each test, dropped afterwards."""
    import psycopg2
    from sqlalchemy.engine import make_url

    base = make_url(os.environ["CGTUNE_TEST_POSTGRES_URL"])
    name = f"cgtune_fleet_{uuid.uuid4().hex[:10]}"
    kw = dict(host=base.host, port=base.port, user=base.username, password=base.password, dbname=base.database)
    conn = psycopg2.connect(**kw)
    conn.autocommit = True
    conn.cursor().execute(f"CREATE DATABASE {name}")
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        conn.cursor().execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.close()


@pytest.fixture()
def gpu_host_without_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """For a test that fakes a CUDA host: that host has no vLLM installed (as the lent GPU machine has none), so
    `--backend auto` takes the stand-in there, whatever vLLM this machine has (CI installs 0.33's code for the
    oracle, which `auto` would otherwise take on a CUDA device)."""
    from tuner.measure.vllm_engine import api

    monkeypatch.setattr(api, "installed_version", lambda: (None, None))
