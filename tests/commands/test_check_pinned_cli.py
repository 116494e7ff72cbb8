"""`cgtune check` on a run whose files pin the KV cache (`cgtune validate --pin-kv`: summary.json's `kv_pin`, the
shipped files' `--kv-cache-memory-bytes`), held to vLLM start-up logs written from vLLM's own format strings, pinned
(each worker's "Initial free memory ... reserved X GiB memory for KV Cache as specified by kv_cache_memory_bytes" line
in place of its KV line; no estimate, no memory summary) or not, under vLLM 0.33 and 0.34.

The run is `cgtune search` of the shipped DFlash workload on a synthetic profile at GPU scale
(tests/handmade_profiles.py: made-up numbers, a fixture); the pin is written into its summary.json by hand (what
`cgtune validate --pin-kv` records there, from an engine this machine has none of), and the logs are BUILT FROM THE
RUN'S OWN PREDICTIONS (`tuner.check.example.predicted_log`) with a known pool error put in: they test the pinned
path's plumbing and refusals, not the accuracy of any prediction."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # tests/ helpers (import-mode=importlib)
sys.path.insert(0, str(ROOT / "tests" / "commands"))
from cli_runner import run  # noqa: E402
from handmade_profiles import gpu_scale_profile  # noqa: E402
from test_check_cli import run_quiet  # noqa: E402

from tuner.check.example import predicted_log, run_predictions  # noqa: E402
from tuner.engines.vllm.log_lines import GIB, kv_reserved_line  # noqa: E402
from tuner.engines.vllm.startup_log import parse_startup_log  # noqa: E402

DFLASH = ROOT / "workloads" / "dflash-llama-3.1-8b.yaml"
PIN_GIB = 37.4  # a pin well inside the device, chosen by hand
POOL_ERROR = 0.05


def _searched(tmp: Path, version: str) -> Path:
    csv = gpu_scale_profile(tmp / "profile", DFLASH)
    out = tmp / "run"
    assert run_quiet(["search", DFLASH, "--profile", csv, "--out", out, "--trials", 4, "--no-progress",
                      "--vllm-version", version]) == 0
    return out


@pytest.fixture(scope="module", params=["0.33", "0.34"])
def searched(request, tmp_path_factory) -> Path:
    return _searched(tmp_path_factory.mktemp(f"pinned-{request.param}"), request.param)


def _pinned_copy(searched: Path, tmp_path: Path, pin_bytes: int | None) -> Path:
    """A copy of the run, its summary.json pinning the shipped list's KV cache at `pin_bytes` (None: no pin)."""
    run_dir = tmp_path / "run"
    shutil.copytree(searched, run_dir)
    if pin_bytes is not None:
        summary = json.loads((run_dir / "summary.json").read_text())
        summary["kv_pin"] = {"bytes": pin_bytes, "capture_sizes": run_predictions(run_dir)["sizes"],
                             "how": "written by the test", "measured_kv_bytes": pin_bytes, "list": "compact"}
        (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


def _check(run_dir: Path, tmp_path: Path, log: str, capsys) -> tuple[int, str, str]:
    path = tmp_path / "vllm.log"
    path.write_text(log)
    capsys.readouterr()
    return run(capsys, "check", run_dir, "--vllm-log", path)


PIN = int(PIN_GIB * GIB)


def test_a_pinned_start_up_is_read_as_pinned_with_the_kv_cache_it_reserved(searched, tmp_path):
    log = parse_startup_log(predicted_log(searched, kv_error=0.0, pool_error=POOL_ERROR, kv_cache_memory_bytes=PIN))
    assert log.kv_pinned and log.kv_cache_memory_bytes == PIN and log.non_default_args
    (w,) = log.workers
    assert w.kv_reserved_gib == round(PIN / GIB, 2) and w.kv_available_gib is None  # no profiling, no KV line
    assert w.pool_estimated_gib is None and w.utilization is None and w.v1_estimate_gib is None  # no estimate
    assert w.real_capture is not None  # the capture after the reserved line is the real one
    assert w.real_capture[1] == pytest.approx(run_predictions(searched)["pool"] * (1 + POOL_ERROR) / GIB, abs=0.005)


def test_the_reserved_line_is_vllms_f_string_filled_as_format_gib_fills_it():
    line = kv_reserved_line(139.5 * GIB, int(37.456 * GIB))
    assert line.startswith("Initial free memory 139.5 GiB, reserved 37.46 GiB memory for KV Cache as specified by "
                           "kv_cache_memory_bytes config and skipped memory profiling.")
    assert line.endswith("update it correspondingly.")


def test_a_pinned_run_is_held_to_a_pinned_start_up_the_kv_cache_being_the_pins(searched, tmp_path, capsys):
    run_dir = _pinned_copy(searched, tmp_path, PIN)
    per_token = run_predictions(run_dir)["kv_bytes_per_token"]
    code, out, err = _check(run_dir, tmp_path, predicted_log(run_dir, kv_error=0.0, pool_error=POOL_ERROR,
                                                             kv_cache_memory_bytes=PIN), capsys)
    assert code == 0, err
    assert f"KV cache: pinned, --kv-cache-memory-bytes {PIN} ({PIN / GIB:.3f} GiB per rank)" in out
    rows = {line.split()[0]: line for line in out.splitlines() if line and line.split()[0].endswith(("_bytes", "_s",
                                                                                                     "_tokens", "cy"))}
    assert rows["kv_pinned_bytes"].split()[1:6] == [f"{PIN_GIB:.3f}", "GiB", f"{PIN_GIB:.3f}", "GiB", "+0.00%"]
    assert "rounding" in rows["kv_pinned_bytes"]  # the reserved line's 2 decimals cover it
    assert "vllm_graph_estimate_bytes" not in rows and "non_kv_cache_bytes" not in rows  # vLLM made neither
    assert "kv_available_bytes" not in rows
    pool = rows["graph_pool_bytes"].split()
    predicted_gib = float(pool[1])  # the pool error put in, read back within the 2-decimal GiB the log prints
    assert float(pool[5].rstrip("%")) == pytest.approx(100 * POOL_ERROR, abs=100 * 0.005 / predicted_gib)
    # The KV size line's tokens are the pin's by vLLM's block rule (16-token blocks), not the unpinned prediction's.
    assert rows["kv_tokens"].split()[1].replace(",", "") == str(PIN // per_token // 16 * 16)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["kv_pin"]["bytes"] == PIN  # check reads the run, it writes nothing into it


@pytest.mark.parametrize(("log_pin", "words"), [
    (None, "ran without the run's --kv-cache-memory-bytes"),
    (PIN + 3 * GIB, "its non-default args have kv_cache_memory_bytes="),
])
def test_a_pinned_run_refuses_a_start_up_not_pinned_as_its_files_say(searched, tmp_path, capsys, log_pin, words):
    run_dir = _pinned_copy(searched, tmp_path, PIN)
    extra = {} if log_pin is None else {"kv_cache_memory_bytes": log_pin}
    code, out, err = _check(run_dir, tmp_path, predicted_log(run_dir, kv_error=-0.02, pool_error=POOL_ERROR, **extra),
                            capsys)
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert words in line and str(PIN) in line and "vllm-serve.yaml" in line


def test_a_pinned_start_up_of_a_run_that_pins_nothing_is_refused_in_one_line(searched, tmp_path, capsys):
    run_dir = _pinned_copy(searched, tmp_path, None)
    code, out, err = _check(run_dir, tmp_path, predicted_log(run_dir, kv_error=0.0, pool_error=POOL_ERROR,
                                                             kv_cache_memory_bytes=PIN), capsys)
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert f"vLLM ran with --kv-cache-memory-bytes {PIN}" in line and "records no kv_pin" in line
