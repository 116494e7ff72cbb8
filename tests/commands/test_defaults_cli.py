"""`cgtune defaults`: flags named as vLLM names them, workload files, JSON, one-line errors with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

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


def test_a_schedules_tier_steps_are_decode_steps(tmp_path, capsys):
    # K=16 for 1..64 requests, K=0 from 65: the 65..128-request steps of one token each are decode steps at their
    # tier's query length 1 (V2 captures FULL graphs for it), not mixed steps: the eager share counts all 128
    # request counts, and only 31..64 (17 tokens each, above the 512-token default) run eager.
    code, out, _ = run(capsys, "defaults", "--max-num-seqs", "128", "--num-speculative-tokens", "16",
                       "--speculative-schedule", "[[1,64,16],[65,128,0]]", "--json")
    data = json.loads(out)
    assert code == 0 and data["decode_request_counts"] == list(range(1, 129))
    assert data["eager_request_counts"] == list(range(31, 65)) and data["decode_step_share"] == 1.0
    # Suffix decoding runs on V1, which drops a dynamic schedule: static K, and the table says so.
    spec = yaml.safe_load((ROOT / "workloads/suffix-llama-3.1-8b.yaml").read_text())
    spec["serving"]["speculative_schedule"] = [[1, 16, 24], [17, spec["serving"]["max_num_seqs"], 4]]
    path = tmp_path / "suffix-schedule.yaml"
    path.write_text(yaml.safe_dump(spec))
    code, out, _ = run(capsys, "defaults", str(path))
    assert code == 0
    assert table_rows(out)["speculative schedule"] == [
        "dropped: the V1 runner runs no dynamic schedule for method 'suffix', every step drafts K=24"]


# --------------------------------------------------------------------------- what runs eager, per engine
def table_rows(out: str) -> dict[str, list[str]]:
    """Table rows by key (the text before two spaces), each key's values in order."""
    rows: dict[str, list[str]] = {}
    for line in out.splitlines():
        key, _, value = line.lstrip().partition("  ")
        if key.strip() and value:
            rows.setdefault(key.strip(), []).append(value.strip())
    return rows


def test_eager_share_without_a_workload_is_the_issue_example(capsys):
    # 128 seqs x q 17 over 1..128 requests (no workload: each request count equally likely): the default stops at
    # 512 tokens, so 31..128 requests (527..2176 tokens) run eager: 98 of 128 counts = 76.6% of decode steps, and
    # sum(31..128) / sum(1..128) = 7791 / 8256 = 94.4% of their tokens.
    code, out, _ = run(capsys, "defaults", "--max-num-seqs", "128", "--num-speculative-tokens", "16", "--json")
    data = json.loads(out)
    assert code == 0
    assert data["eager_step_share"] == pytest.approx(98 / 128)
    assert data["eager_token_share"] == pytest.approx(7791 / 8256)
    assert data["eager_request_counts"] == list(range(31, 129))
    assert data["model_runner"] == "v2" and data["runs_as"] == data["cudagraph_capture_sizes"]
    code, out, _ = run(capsys, "defaults", "--max-num-seqs", "128", "--num-speculative-tokens", "16")
    assert table_rows(out)["eager share"] == [
        "no workload, uniform decode traffic: over 1..128 requests: 98 of 128 request counts eager = 76.6% of decode "
        "steps, 94.4% of their tokens"]


def test_eager_share_follows_the_workloads_traffic(capsys):
    # DFlash-like: decode steps of 32..128 requests, all above the 512-token default (30 x 17 = 510 is its last
    # decode graph), so every decode step runs eager; 5% of steps are mixed and not counted.
    code, out, _ = run(capsys, "defaults", str(ROOT / "workloads/dflash-llama-3.1-8b.yaml"), "--json")
    data = json.loads(out)
    assert data["eager_step_share"] == pytest.approx(1.0) and data["eager_token_share"] == pytest.approx(1.0)
    assert data["decode_request_counts"] == list(range(32, 129)) and data["decode_step_share"] == pytest.approx(0.95)
    # The DFlash drafter's passes run without a graph at the same batches (issue 14 item 4).
    passes = {p["role"]: p for p in data["eager_drafter_passes"]}
    assert set(passes) == {"context", "query"}
    assert passes["query"]["request_counts"] == list(range(32, 129))
    assert passes["query"]["widths"] == [n * 17 for n in range(32, 129)]


def test_a_width_histogram_answers_how_much_traffic_runs_eager(tmp_path, capsys):
    # As `cgtune workload from-metrics` writes it: step widths, the multiples of q within max_num_seqs taken as
    # decode steps. q = 17: 170 (10 requests, graph) weighs 3, 1700 (100 requests, eager) weighs 1, a mixed 4000-token
    # step weighs 1 and is not counted. Decode steps: 1 of 4 eager by count; 1700 / (3 x 170 + 1700) of the tokens.
    spec = yaml.safe_load((ROOT / "workloads/dflash-llama-3.1-8b.yaml").read_text())
    spec["traffic"] = {"widths": {"kind": "histogram", "counts": {170: 3, 1700: 1, 4000: 1}}}
    path = tmp_path / "observed.yaml"
    path.write_text(yaml.safe_dump(spec))
    code, out, _ = run(capsys, "defaults", str(path), "--json")
    data = json.loads(out)
    assert code == 0
    assert data["eager_step_share"] == pytest.approx(0.25)
    assert data["eager_token_share"] == pytest.approx(1700 / 2210)
    assert data["decode_request_counts"] == [10, 100] and data["eager_request_counts"] == [100]
    assert data["decode_step_share"] == pytest.approx(0.8)


def test_v1_runner_and_the_list_that_runs(capsys):
    # Suffix decoding runs on V1, which rewrites the explicit default list when speculating (q = 25): every size
    # rounded up to a multiple of 25, those above the old max dropped: 25, 50, ..., 500.
    code, out, _ = run(capsys, "defaults", str(ROOT / "workloads/suffix-llama-3.1-8b.yaml"))
    rows = table_rows(out)
    assert code == 0
    assert rows["model runner"] == ["V1: vLLM 0.33 has no V2 support for speculative method 'suffix'"]
    assert rows["runs as"][0].startswith("20 graphs: the V1 runner rewrites the list when speculating")
    code, out, _ = run(capsys, "defaults", str(ROOT / "workloads/suffix-llama-3.1-8b.yaml"), "--json")
    data = json.loads(out)
    assert data["runs_as"] == list(range(25, 501, 25)) and data["model_runner"] == "v1"
    assert data["runs_as"] != data["cudagraph_capture_sizes"]


def test_eagle_drafter_passes_above_the_default_run_eager(capsys):
    # EAGLE-like, 128 seqs x q 8: the default stops at 512 tokens = 64 requests; V2's draft step 0 replays the
    # target's graphs, so at 65..128 requests (520..1024 tokens) it runs eager.
    code, out, _ = run(capsys, "defaults", str(ROOT / "workloads/eagle-llama-3.2-1b.yaml"))
    assert code == 0
    assert table_rows(out)["drafter eager"] == [
        "v2 eagle prefill passes at N = 65..128 (520..1024 tokens, step 8) run eager"]


def test_sglang_defaults_in_requests_with_token_widths(capsys):
    code, out, err = run(capsys, "defaults", str(ROOT / "workloads/sglang-eagle-llama-3.1-8b.yaml"))
    assert code == 0, err
    rows = table_rows(out)
    assert rows["engine"][0].startswith("SGLang 0.5.23: decode graphs counted in requests, each holding bs x 4 tokens")
    assert rows["request pool"] == ["128 (max_running_requests)"]
    assert rows["requests"][0].split()[:9] == ["1", "2", "3", "4", "5", "6", "7", "8", "10"]
    assert rows["tokens"][0].split()[:9] == ["4", "8", "12", "16", "20", "24", "28", "32", "40"]
    assert rows["eager decode batches"] == ["none: every decode batch up to 128 requests replays a graph"]
    code, out, _ = run(capsys, "defaults", str(ROOT / "workloads/sglang-eagle-llama-3.1-8b.yaml"), "--json")
    data = json.loads(out)
    assert data["batch_sizes"][-1] == 128 and data["token_widths"] == [b * 4 for b in data["batch_sizes"]]
    assert data["eager_step_share"] == 0.0 and data["eager_batch_sizes"] == []


def test_sglang_batches_between_the_lists_max_and_the_pool_run_eager(tmp_path, capsys):
    # No speculation, 300 running requests on a 143771-MiB GPU: SGLang's max_bs is 256 (its table, tp < 4), below the
    # pool, so 257..300 requests run eager. Traffic 1..300: 44 of 300 counts; sum(257..300) / sum(1..300) =
    # 12254 / 45150 of the tokens.
    spec = {"name": "sg", "engine": "sglang", "model": {"preset": "tiny"},
            "serving": {"max_running_requests": 300, "chunked_prefill_size": 1024, "gpu_memory_mib": 143771},
            "traffic": {"requests": {"kind": "uniform", "min": 1, "max": 300}}}
    path = tmp_path / "sg.yaml"
    path.write_text(yaml.safe_dump(spec))
    code, out, _ = run(capsys, "defaults", str(path), "--json")
    data = json.loads(out)
    assert code == 0 and data["max_bs"] == 256 and data["request_cap"] == 300
    assert data["batch_sizes"][:6] == [1, 2, 4, 8, 12, 16] and data["batch_sizes"][-1] == 256
    assert data["eager_batch_sizes"] == list(range(257, 301))
    assert data["eager_step_share"] == pytest.approx(44 / 300)
    assert data["eager_token_share"] == pytest.approx(12254 / 45150)
    code, out, _ = run(capsys, "defaults", str(path))
    assert table_rows(out)["eager decode batches"] == [
        "257..300 requests (between the list's max 256 and the request pool 300) run eager"]


def test_trtllm_defaults_stop_at_128_and_without_padding_replay_exact_sizes_only(tmp_path, capsys):
    # The shipped EAGLE-3 workload: padding on, TensorRT-LLM's default max 128 whatever max_batch_size (256) says.
    # Traffic 32..256 requests: 129..256 eager = 128 of 225 counts; tokens sum(129..256) / sum(32..256) =
    # 24640 / 32400.
    code, out, _ = run(capsys, "defaults", str(ROOT / "workloads/trtllm-eagle3-llama-3.1-8b.yaml"), "--json")
    data = json.loads(out)
    assert code == 0
    assert data["batch_sizes"] == [1, 2, 4, *range(8, 129, 8)] and data["request_cap"] == 256
    assert data["eager_batch_sizes"] == list(range(129, 257))
    assert data["eager_step_share"] == pytest.approx(128 / 225)
    assert data["eager_token_share"] == pytest.approx(24640 / 32400)
    # Padding off (TensorRT-LLM's default): [1..31, 32, 64, 128], and every batch size without a graph of its own
    # size runs eager: 33..63, 65..127, 129..256.
    spec = yaml.safe_load((ROOT / "workloads/trtllm-eagle3-llama-3.1-8b.yaml").read_text())
    spec["serving"]["enable_padding"] = False
    path = tmp_path / "nopad.yaml"
    path.write_text(yaml.safe_dump(spec))
    code, out, _ = run(capsys, "defaults", str(path), "--json")
    data = json.loads(out)
    assert data["batch_sizes"] == [*range(1, 33), 64, 128]
    assert data["eager_batch_sizes"] == [*range(33, 64), *range(65, 128), *range(129, 257)]
    code, out, _ = run(capsys, "defaults", str(path))
    rows = table_rows(out)
    assert rows["eager decode batches"] == [
        "33..63, 65..127, 129..256 requests (no graph of their own size (padding off)) run eager"]
    assert "enable_padding false (its default: only exactly captured sizes replay)" in rows["cuda_graph_config"][0]


@pytest.mark.parametrize("workload", ["sglang-eagle-llama-3.1-8b", "trtllm-eagle3-llama-3.1-8b",
                                      "dflash-llama-3.1-8b"])
def test_defaults_of_a_workload_imports_no_heavy_library(workload):
    code = (f"import sys; from tuner.cli import main; main(['defaults', 'workloads/{workload}.yaml', '--json']); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'optuna', 'matplotlib', 'pandas'}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"
