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
        # vLLM's validate_and_normalize_dynamic_sd_schedule rejects overlapping ranges and a first range after 1.
        (["--max-num-seqs", "64", "--num-speculative-tokens", "3", "--speculative-schedule", "[[1,16,3],[10,64,1]]"],
         "--speculative-schedule: speculative_schedule [[1, 16, 3], [10, 64, 1]]: batch-size ranges (1, 16) and "
         "(10, 64) overlap"),
        (["--max-num-seqs", "64", "--num-speculative-tokens", "3", "--speculative-schedule", "[[2,64,1]]"],
         "the first batch-size range starts at 2; it must start at 1"),
        (["--max-num-seqs", "64", "--speculative-schedule", "[[1,64,1]]"],
         "speculative_schedule needs num_speculative_tokens >= 1, not 0"),
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


def test_a_schedule_sets_the_widest_decode_batch_and_shows_vllms_gap_filling(capsys):
    # K=3 (q=4) for 1..16 requests, K=1 (q=2) from 32 on; 17..31 lie in no range and carry K=3 (vLLM's lookup).
    code, out, err = run(capsys, "defaults", "--max-num-seqs", "256", "--num-speculative-tokens", "3",
                         "--speculative-schedule", "[[1,16,3],[32,200,1]]")
    assert code == 0, err
    lines = {line[:27].strip(): line[28:] for line in out.splitlines() if line[:27].strip()}
    assert lines["speculative schedule"] == ("K=3 for 1..31, K=1 for 32..256 (batch sizes 17..31, 201..256 are in no "
                                             "range: vLLM carries the K of the range before)")
    # Not 256 x 4 = 1024 from the static K: the widest decode step is 256 requests at q = 2.
    assert lines["widest decode batch"] == "256 x 2 = 512 tokens (K=1 at 256 requests under the schedule)"
    assert "max_num_seqs x q" not in out
    # K=16 for up to 64 requests is the widest tier: 64 x 17 = 1088 tokens, above the ceiling, so eager.
    code, out, _ = run(capsys, "defaults", "--max-num-seqs", "128", "--num-speculative-tokens", "16",
                       "--speculative-schedule", "[[1,64,16],[65,128,0]]", "--json")
    assert code == 0 and json.loads(out)["uniform_decode_sizes_without_graph"][-1] == 64 * 17
    code, out, _ = run(capsys, "defaults", "--max-num-seqs", "128", "--num-speculative-tokens", "16",
                       "--speculative-schedule", "[[1,64,16],[65,128,0]]")
    assert "64 x 17 = 1088 tokens (K=16 at 64 requests under the schedule)" in out
