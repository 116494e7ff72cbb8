"""`cgtune defaults`: flags named as vLLM names them, workload files, JSON, one-line errors with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.cli import main

ROOT = Path(__file__).resolve().parents[2]


def run(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse exits on its own errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def test_json_output_for_dflash(capsys):
    code, out, err = run(capsys, "defaults", "--max-num-seqs", "128", "--num-speculative-tokens", "16", "--json")
    assert code == 0 and err == ""
    data = json.loads(out)
    assert data["max_cudagraph_capture_size"] == 512
    assert data["cudagraph_capture_sizes"][-1] == 512 and 2176 not in data["cudagraph_capture_sizes"]
    assert data["uniform_decode_sizes_without_graph"] == list(range(527, 2177, 17))


def test_all_flags(capsys):
    code, out, _ = run(capsys, "defaults", "--max-num-seqs", "256", "--num-speculative-tokens", "3",
                       "--max-num-batched-tokens", "4096", "--gpu-capability", "10.0", "--performance-mode",
                       "interactivity", "--cudagraph-mode", "FULL_DECODE_ONLY", "--speculative-schedule",
                       "[[1,16,3],[17,256,1]]", "--json")
    data = json.loads(out)
    assert code == 0
    assert data["cudagraph_capture_sizes"][:32] == list(range(1, 33))
    assert data["max_cudagraph_capture_size"] == 1024


def test_explicit_list_flag(capsys):
    code, out, _ = run(capsys, "defaults", "--max-num-seqs", "8", "--cudagraph-capture-sizes", "8", "1", "8",
                       "--json")
    assert code == 0 and json.loads(out)["cudagraph_capture_sizes"] == [1, 8]


def test_workload_file_table(capsys):
    code, out, _ = run(capsys, "defaults", str(ROOT / "workloads/suffix-llama-3.1-8b.yaml"))
    assert code == 0
    assert "256 x 25 = 6400 tokens" in out
    assert "525..6400 step 25" in out


def test_truncation_warning_in_table(capsys):
    code, out, _ = run(capsys, "defaults", "--max-num-seqs", "64", "--max-cudagraph-capture-size", "100")
    assert code == 0 and "Truncating max_cudagraph_capture_size to 96" in out


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--max-num-seqs", "x"], "argument --max-num-seqs: 'x' is not an integer"),
        (["--max-num-seqs", "0"], "argument --max-num-seqs: 0 must be >= 1"),
        (["--max-num-seqs", "8", "--num-speculative-tokens", "-1"], "--num-speculative-tokens: -1 must be >= 0"),
        (["--max-num-seqs", "8", "--gpu-capability", "9"], "--gpu-capability: '9' must look like 9.0"),
        (["--max-num-seqs", "8", "--cudagraph-mode", "ALL"], "--cudagraph-mode: invalid choice: 'ALL'"),
        (["--max-num-seqs", "8", "--speculative-schedule", "[[1,2]]"], "--speculative-schedule: '[[1,2]]' must be"),
        (["--max-num-seqs", "8", "--speculative-schedule", "{"], "--speculative-schedule: '{' is not JSON"),
        (["--max-num-seqs", "8", "--cudagraph-capture-sizes", "4", "--max-cudagraph-capture-size", "8"],
         "customized max_cudagraph_capture_size(=8) should be consistent"),
        ([], "--max-num-seqs: required"),
        (["workloads/none.yaml"], "workloads/none.yaml: workload: 'workloads/none.yaml' is not a file"),
        (["workloads/tiny-cpu.yaml", "--max-num-seqs", "4"], "--max-num-seqs: give either a workload file or flags"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, argv, needle):
    code, out, err = run(capsys, "defaults", *argv)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and needle in err
    assert "Traceback" not in err


def test_bad_workload_field_names_path(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "workloads/tiny-cpu.yaml").read_text().replace("max: 160}", "max: -3}"))
    code, _, err = run(capsys, "defaults", str(bad))
    assert code == 2 and "traffic.requests.max: -3 must be >= 1" in err


def test_console_script_entry_point():
    result = subprocess.run([sys.executable, "-m", "tuner.cli", "defaults", "--max-num-seqs", "32",
                             "--num-speculative-tokens", "16", "--json"], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0
    assert json.loads(result.stdout)["uniform_decode_sizes_without_graph"] == [527, 544]


def test_help_explains_every_flag(capsys):
    with pytest.raises(SystemExit):
        main(["defaults", "--help"])
    out = capsys.readouterr().out
    for flag in ("--max-num-seqs", "--num-speculative-tokens", "--max-num-batched-tokens", "--gpu-capability",
                 "--performance-mode", "--cudagraph-mode", "--max-cudagraph-capture-size",
                 "--cudagraph-capture-sizes", "--speculative-schedule", "--enforce-eager", "--json"):
        assert flag in out


def test_defaults_imports_no_heavy_library():
    # `cgtune defaults` answers in a fraction of a second: the parser must not pull in torch or optuna.
    code = ("import sys; from tuner.cli import main; main(['defaults', '--max-num-seqs', '8', '--json']); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'optuna', 'matplotlib', 'pandas'}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0
    assert result.stdout.strip().splitlines()[-1] == "[]"
