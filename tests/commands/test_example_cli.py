"""`cgtune example` (issue 29): with no GPU, the shipped DFlash workload and the shipped synthetic example profile go
through search, report and `check` against a start-up log written for the shipped list, every output saying that its
numbers are synthetic. The profile is a fixture (benchmarks/bench_search.py wrote it), and the log is BUILT FROM THE
RUN'S OWN PREDICTIONS with made-up errors: these tests hold the plumbing and the labels, not any prediction."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # tests/ helpers (import-mode=importlib)
from cli_runner import run  # noqa: E402

from tuner.check.example import EXAMPLE_PROFILE, EXAMPLE_WORKLOAD, LOG_NAME, MADE_UP_ERRORS  # noqa: E402
from tuner.cli import main  # noqa: E402


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """`cgtune example --out DIR` from the checkout, as the README runs it: (exit code, stdout, DIR)."""
    out = tmp_path_factory.mktemp("example") / "run"
    stdout = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(stdout):
        mp.chdir(ROOT)
        code = main(["example", "--out", str(out), "--trials", "4", "--no-progress"])
    return code, stdout.getvalue(), out


def test_the_example_runs_search_report_and_check_in_that_order(example):
    code, stdout, out = example
    assert code == 0
    steps = [line for line in stdout.splitlines() if line.startswith("== ")]
    assert [s.split()[1:3] for s in steps] == [["cgtune", "search"], ["cgtune", "report"],
                                               ["wrote", f"{out / LOG_NAME}:"], ["cgtune", "check"], ["done:", "every"]]
    assert steps[0].endswith(f"--out {out} --trials 4 --no-progress") and str(EXAMPLE_PROFILE) in steps[0]
    for name in ("report.md", "summary.json", "vllm-serve.yaml", "vllm-serve.fastest.yaml", "compilation_config.json",
                 "vllm-flags.txt", LOG_NAME):
        assert (out / name).is_file(), name
    assert list((out / "plots").glob("*.png"))


def test_check_reads_back_the_errors_the_written_log_carries(example):
    _, stdout, out = example
    table = {line.split()[0]: line.split() for line in stdout.splitlines()
             if line.split() and line.split()[0] in ("kv_available_bytes", "graph_pool_bytes", "kv_tokens")}
    kv, pool = MADE_UP_ERRORS["kv_error"], MADE_UP_ERRORS["pool_error"]
    # vLLM prints GiB to 2 decimals and counts whole 16-token blocks: the errors come back to within that.
    assert abs(float(table["kv_available_bytes"][5].rstrip("%")) - 100 * kv) < 0.05
    assert abs(float(table["graph_pool_bytes"][5].rstrip("%")) - 100 * pool) < 0.5
    assert table["kv_tokens"][3] != table["kv_tokens"][1]


def test_every_output_says_its_numbers_are_synthetic(example):
    _, stdout, out = example
    assert (out / LOG_NAME).read_text().startswith("# SYNTHETIC: not vLLM's output.")
    assert "synthetic" in json.loads((out / "profile.json").read_text())["device_name"]
    for name in ("vllm-serve.yaml", "vllm-serve.fastest.yaml", "vllm-flags.txt"):
        head = [line for line in (out / name).read_text().splitlines() if line.startswith("#")]
        assert any("synthetic" in line for line in head), name
    report = (out / "report.md").read_text()
    assert "synthetic/hand-made profile, not a measurement" in report
    assert "every number above is SYNTHETIC" in stdout


def test_the_report_step_names_the_shipped_list_and_the_file_of_the_other(example):
    _, stdout, out = example
    summary = json.loads((out / "summary.json").read_text())
    assert summary["shipped"]["list"] == "compact"  # recommended on this profile, so it ships
    compact, tuned = summary["compact"]["capture_sizes"], summary["tuned"]["capture_sizes"]
    report_step = stdout[stdout.index("== cgtune report"):]
    line = next(line for line in report_step.splitlines() if line.startswith("shipped: "))
    assert line == (f"shipped: the compact list ({len(compact)} graphs, max {compact[-1]}) in "
                    f"{out / 'compilation_config.json'}; the fastest ({summary['source']}) list ({len(tuned)} "
                    f"graphs, max {tuned[-1]}) in {out / 'compilation_config.fastest.json'}")


def test_outside_a_checkout_it_is_one_line_and_exit_2_with_nothing_written(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, stdout, err = run(capsys, "example", "--out", tmp_path / "run")
    assert code == 2 and stdout == ""
    assert err.strip() == (f"cgtune example: error: --workload: {str(EXAMPLE_WORKLOAD)!r} not found (run cgtune "
                           f"example from a cgtune checkout, or name the file)")
    assert not (tmp_path / "run").exists()
    code, _, err = run(capsys, "example", "--out", tmp_path / "run", "--workload", ROOT / EXAMPLE_WORKLOAD)
    assert code == 2 and "--profile: " in err and not (tmp_path / "run").exists()


def test_the_shipped_example_profile_is_what_the_benchmark_writes(tmp_path):
    """The shipped files are the benchmark's synthetic profile, regenerated (a changed workload or generator must
    regenerate them: benchmarks/bench_search.py --write-profile workloads/profiles --name ...)."""
    subprocess.run([sys.executable, str(ROOT / "benchmarks/bench_search.py"), "--write-profile", str(tmp_path),
                    "--name", EXAMPLE_PROFILE.stem], check=True, capture_output=True, cwd=ROOT)
    csv = tmp_path / EXAMPLE_PROFILE.name
    for suffix in (".csv", ".json"):
        assert csv.with_suffix(suffix).read_text() == (ROOT / EXAMPLE_PROFILE).with_suffix(suffix).read_text(), suffix


def test_report_csv_writes_the_per_width_table_a_notebook_reads(example, tmp_path, capsys):
    import pandas as pd

    from tuner.profile.table import read_profile

    _, _, out = example
    code, stdout, err = run(capsys, "report", out, "--csv", "-")
    assert code == 0, err
    assert stdout.startswith("num_tokens,eager_ms,full_ms,full_capture_delta_bytes,full_standalone_bytes,")
    assert "wrote 15 files" in err  # the table alone on stdout
    frame = pd.read_csv(io.StringIO(stdout))
    profile = read_profile(out / "profile.csv")
    full = profile.by_mode("full")
    assert frame["num_tokens"].tolist() == profile.widths()
    assert frame["full_ms"].tolist() == [full[w].latency_ms for w in profile.widths()]
    assert frame["full_standalone_bytes"].dtype == "int64"
    summary = json.loads((out / "summary.json").read_text())
    assert frame.loc[frame["in_shipped"], "num_tokens"].tolist() == summary["shipped"]["capture_sizes"]
    assert frame.loc[frame["in_tuned"], "num_tokens"].tolist() == summary["tuned"]["capture_sizes"]
    saving = frame["eager_ms"] - frame["full_ms"]
    assert (frame["full_saving_ms"] - saving).abs().max() == 0
    code, _, err = run(capsys, "report", out, "--csv", out)
    assert code == 2 and err.strip() == f"cgtune report: error: --csv: {str(out)!r} exists and is not a file"
