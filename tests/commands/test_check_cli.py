"""`cgtune check RUN_DIR --vllm-log FILE`: run directories made by `cgtune search` on shipped workloads with a
synthetic profile at GPU scale (tests/handmade_profiles.py; made-up numbers: a fixture, not a measurement), held to
vLLM start-up logs written from vLLM 0.33's own format strings (tuner/engines/vllm/log_writer.py).

The logs here are BUILT FROM THE RUN'S OWN PREDICTIONS (summary.json) with known errors put in (KV cache -2%, real
pool +5%, ...): they test the plumbing and the parsing (that cgtune reads back the errors put in, to within the log's
rounding), not the accuracy of any prediction."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # tests/ helpers (import-mode=importlib)
from cli_runner import run  # noqa: E402
from handmade_profiles import gpu_scale_profile  # noqa: E402

from tuner.check.example import predicted_log  # noqa: E402
from tuner.check.example import run_predictions as predicted  # noqa: E402
from tuner.engines.vllm.log_writer import GIB  # noqa: E402
from tuner.model.capture_time import predicted_capture_s as predicted_capture_s_of  # noqa: E402
from tuner.model.costmodel import CostModel  # noqa: E402
from tuner.decision.run_dir import load_run  # noqa: E402
from tuner.workload.spec import load_workload  # noqa: E402

DFLASH = ROOT / "workloads" / "dflash-llama-3.1-8b.yaml"  # V2 runner, one GPU, DFlash K = 16
SUFFIX_TP2 = ROOT / "workloads" / "suffix-llama-3.1-70b-tp2.yaml"  # V1 runner (suffix decoding), TP 2, K = 8


def _search_run(tmp: Path, workload: Path) -> Path:
    csv = gpu_scale_profile(tmp / "profile", workload)
    out = tmp / "run"
    code = run_quiet(["search", workload, "--profile", csv, "--out", out, "--trials", 4, "--no-progress"])
    assert code == 0
    return out


def run_quiet(argv: list[object]) -> int:
    """`cgtune ARGV` with its output dropped: a test that sets up a module fixture reads only its own command's."""
    from tuner.cli import main

    with contextlib.redirect_stdout(io.StringIO()):
        return main([str(a) for a in argv])


@pytest.fixture(scope="module")
def dflash_run(tmp_path_factory):
    return _search_run(tmp_path_factory.mktemp("dflash"), DFLASH)


@pytest.fixture(scope="module")
def tp2_run(tmp_path_factory):
    return _search_run(tmp_path_factory.mktemp("suffix-tp2"), SUFFIX_TP2)


def test_the_recorded_capture_time_is_the_cost_models(dflash_run):
    """The capture time the logs carry is summary.json's for the shipped list: the cost model's own."""
    model, _ = load_run(dflash_run)
    summary = json.loads((dflash_run / "summary.json").read_text())
    recorded = predicted(dflash_run)["capture_s"]
    assert recorded == predicted_capture_s_of(model, model.evaluate(summary["shipped"]["capture_sizes"]).runs_as)


def log_from_predictions(run_dir: Path, *, kv_error: float = -0.02, pool_error: float = 0.05, **kwargs) -> str:
    """A start-up log BUILT FROM THE RUN'S OWN PREDICTIONS with known errors put in
    (`tuner.check.example.predicted_log`). Tests plumbing, not accuracy."""
    return predicted_log(run_dir, kv_error=kv_error, pool_error=pool_error, **kwargs)


def write(tmp_path: Path, text: str, name: str = "vllm.log") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def check_json(capsys, run_dir: Path, log: Path, *extra) -> tuple[int, dict, str]:
    code, out, err = run(capsys, "check", run_dir, "--vllm-log", log, "--json", *extra)
    return code, (json.loads(out) if out else {}), err


# ---------------------------------------------------------------------------------------------- must show
def test_known_errors_put_into_a_log_of_the_runs_own_predictions_are_read_back_within_the_logs_rounding(
        dflash_run, tmp_path, capsys):
    p = predicted(dflash_run)
    log = write(tmp_path, log_from_predictions(dflash_run, kv_error=-0.02, pool_error=0.05))
    code, data, err = check_json(capsys, dflash_run, log)
    assert code == 0, err
    assert data["list_matches"] is True and data["list"] == "as written" and data["runner"] == "v2"
    assert data["runner_predicted"] == "v2" and data["workers"] == ["EngineCore pid=4100"]
    q = data["quantities"]
    assert list(q) == ["vllm_graph_estimate_bytes", "kv_available_bytes", "kv_tokens", "max_concurrency",
                       "graph_pool_bytes", "capture_s", "non_kv_cache_bytes"]
    # The JSON a script reads: every quantity's fields (one worker: no per-worker breakdown), the log's version.
    for name, fields in q.items():
        assert list(fields) == ["predicted", "logged", "error_pct", "within", "unit", "log_resolution",
                                "tolerance_pct", "source"], name
    assert [q[n]["unit"] for n in q] == ["bytes", "bytes", "tokens", "x", "bytes", "s", "bytes"]
    assert q["kv_available_bytes"]["source"].startswith("Available KV cache memory")
    assert list(data) == ["list_matches", "list", "capture_sizes", "runner", "runner_predicted", "vllm_version", "log",
                          "workers", "quantities", "notes", "calibration"] and data["vllm_version"]
    half_gib = 0.005 * GIB  # vLLM prints GiB to 2 decimals
    # The errors put in come back to within what the log's rounding allows (in percent of the prediction).
    assert abs(q["kv_available_bytes"]["error_pct"] - (-2.0)) <= 100 * half_gib / p["kv"]
    assert abs(q["graph_pool_bytes"]["error_pct"] - 5.0) <= 100 * half_gib / p["pool"]
    assert abs(q["kv_tokens"]["error_pct"] - (-2.0)) <= 100 * 17 / q["kv_tokens"]["predicted"]  # 16-token blocks
    assert abs(q["vllm_graph_estimate_bytes"]["error_pct"]) <= 100 * half_gib / p["estimate"]
    assert q["vllm_graph_estimate_bytes"]["within"] == "rounding"
    assert q["kv_available_bytes"]["within"] == "neither"  # 2% of ~100 GiB: far beyond 0.005 GiB, no tolerance stated
    pool_pct = q["graph_pool_bytes"]["error_pct"]
    assert q["graph_pool_bytes"]["within"] == ("tolerance" if abs(pool_pct) <= 5.0 else "neither")
    # Non-KV by vLLM's own rule, requested - KV - estimate: the 2% of KV the log lacks went there.
    expected_non_kv_pct = 100 * 0.02 * p["kv"] / p["non_kv"]
    assert abs(q["non_kv_cache_bytes"]["error_pct"] - expected_non_kv_pct) <= 100 * 3 * half_gib / p["non_kv"]
    assert q["capture_s"]["within"] == "rounding" and q["capture_s"]["predicted"] > 0  # the log prints whole seconds
    assert data["calibration"] is None

    code, out, err = run(capsys, "check", dflash_run, "--vllm-log", log)
    assert code == 0 and err == ""
    assert "vLLM ran the run's list as written" in out
    row = next(line for line in out.splitlines() if line.startswith("kv_available_bytes"))
    assert "-2.00%" in row and row.rstrip().endswith("no")


def test_a_log_of_another_list_is_refused_in_one_line_and_nothing_is_written(dflash_run, tmp_path, capsys):
    default = list(load_workload(dflash_run / "workload.yaml").engine.defaults().sizes)
    log = write(tmp_path, log_from_predictions(dflash_run, capture_sizes=default))
    out_json = tmp_path / "cal" / "calibrated.json"
    code, out, err = run(capsys, "check", dflash_run, "--vllm-log", log, "--calibrate", out_json)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "(it is vLLM's default for the workload), not the run's list" in err
    assert not (tmp_path / "cal").exists()


def test_a_log_of_the_list_not_shipped_is_checked_against_that_list(dflash_run, tmp_path, capsys):
    # The run ships one list and keeps the other's files beside it: starting vLLM with those is a run of this run too.
    summary = json.loads((dflash_run / "summary.json").read_text())
    other = summary["shipped"]["other"]
    assert other is not None, "the fixture's run ships one list of two"
    log = write(tmp_path, log_from_predictions(dflash_run, capture_sizes=other["capture_sizes"]))
    code, data, err = check_json(capsys, dflash_run, log)
    assert code == 0, err
    assert data["capture_sizes"] == other["capture_sizes"] != summary["shipped"]["capture_sizes"]


# ---------------------------------------------------------------------------------------------- other refusals
@pytest.mark.parametrize(("overrides", "message"), [
    ({"k": 3, "method": "eagle"}, "vLLM ran num_speculative_tokens=3 (its speculative_config), the run's workload "
                                  "has 16"),
    ({"k": 0, "method": None}, "vLLM ran num_speculative_tokens=0"),
    ({"max_num_seqs": 256}, "vLLM ran max_num_seqs=256, the run's workload has 128"),
    ({"max_model_len": 4096}, "vLLM ran max_model_len=4096, the run's workload has 8192"),
    ({"gpu_memory_utilization": 0.85}, "vLLM ran gpu_memory_utilization=0.85, the run's workload has 0.9"),
    ({"estimate_enabled": False}, "vLLM ran with VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0, the run's workload has "
                                  "estimate_cudagraph_memory: true"),
    ({"enforce_eager": True}, "vLLM ran without CUDA graphs (enforce_eager=True)"),
    ({"end_after": "Model loading took"}, "ends before vLLM sized its KV cache"),
    ({"end_after": "Available KV cache memory"}, "ends before vLLM logged its KV cache size"),
    ({"end_after": "GPU KV cache size"}, "ends before vLLM's graph capture finished (EngineCore pid=4100)"),
])
def test_a_log_of_another_configuration_or_cut_short_is_one_line_exit_2(dflash_run, tmp_path, capsys, overrides,
                                                                         message):
    log = write(tmp_path, log_from_predictions(dflash_run, **overrides))
    code, out, err = run(capsys, "check", dflash_run, "--vllm-log", log, "--calibrate", tmp_path / "c.json")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("cgtune check: error: --vllm-log: ") and message in err
    assert not list(tmp_path.glob("c.*"))


def test_bad_files_and_flags_are_one_line_exit_2(dflash_run, tmp_path, capsys):
    good = log_from_predictions(dflash_run)
    cases = [
        (["--vllm-log", tmp_path / "missing.log"], "cannot be read"),
        (["--vllm-log", tmp_path / "latin1.log"], "is not UTF-8 text (byte 0xe9"),
        (["--vllm-log", write(tmp_path, "just some server output\n", "other.log")], "holds no vLLM engine-config line"),
        (["--vllm-log", write(tmp_path, good), "--fail-over", "-1"], "argument --fail-over: -1.0 must be a finite number >= 0"),
        (["--vllm-log", write(tmp_path, good), "--calibrate", tmp_path / "c.yaml"], "must end in .json"),
        (["--vllm-log", write(tmp_path, good), "--calibrate", dflash_run / "profile.json", "--force"],
         "is the run's own profile"),
    ]
    (tmp_path / "latin1.log").write_bytes(good.encode() + "caf\u00e9\n".encode("latin-1"))
    for extra, message in cases:
        code, out, err = run(capsys, "check", dflash_run, *extra)
        assert (code, out) == (2, "") and err.count("\n") == 1 and message in err, (extra, err)
    code, out, err = run(capsys, "check", tmp_path / "nowhere", "--vllm-log", write(tmp_path, good))
    assert code == 2 and "run_dir: " in err and "is not a directory" in err
    not_a_run = tmp_path / "empty"
    not_a_run.mkdir()
    code, out, err = run(capsys, "check", not_a_run, "--vllm-log", write(tmp_path, good))
    assert code == 2 and "holds no readable workload.yaml" in err
    sglang = tmp_path / "sglang-run"
    sglang.mkdir()
    shutil.copyfile(ROOT / "workloads" / "sglang-eagle-llama-3.1-8b.yaml", sglang / "workload.yaml")
    code, out, err = run(capsys, "check", sglang, "--vllm-log", write(tmp_path, good))
    assert code == 2 and "is a sglang run; cgtune check reads vLLM's log only" in err
    assert not list(tmp_path.glob("c.*"))


def test_fail_over_exits_1_only_when_an_error_beyond_the_logs_rounding_exceeds_it(dflash_run, tmp_path, capsys,
                                                                                   monkeypatch):
    log = write(tmp_path, log_from_predictions(dflash_run, kv_error=-0.02, pool_error=0.0))
    code, _, err = check_json(capsys, dflash_run, log, "--fail-over", "1")
    assert code == 1 and "kv_available_bytes" in err and "graph_pool_bytes" not in err
    # The largest error: the non-KV memory, which holds the 2% of KV cache the log lacks (~10% of it).
    assert check_json(capsys, dflash_run, log, "--fail-over", "15")[0] == 0
    slow = write(tmp_path, log_from_predictions(dflash_run, kv_error=0.0, pool_error=0.0, capture_s=300), "slow.log")
    code, _, err = check_json(capsys, dflash_run, slow, "--fail-over", "15")
    assert code == 1 and err == "cgtune check: capture_s more than 15% off (--fail-over)\n"
    # From stdin, a log that prints the predictions themselves: every figure within its rounding, so even 0% passes.
    exact = log_from_predictions(dflash_run, kv_error=0.0, pool_error=0.0)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(exact.encode())))
    code, data, err = check_json(capsys, dflash_run, "-", "--fail-over", "0")
    assert code == 0, err
    assert data["log"] == "stdin" and {q["within"] for q in data["quantities"].values()} == {"rounding"}


def test_a_negative_capture_reading_is_invalid_not_a_number_and_cannot_calibrate(dflash_run, tmp_path, capsys):
    log = write(tmp_path, log_from_predictions(dflash_run, pool_error=-3.0))  # "took -X GiB", as in vLLM issue 25779
    code, data, err = check_json(capsys, dflash_run, log)
    assert code == 0, err
    assert "graph_pool_bytes" not in data["quantities"] and "kv_available_bytes" in data["quantities"]
    assert any("logged a negative graph capture" in n for n in data["notes"])
    code, out, err = run(capsys, "check", dflash_run, "--vllm-log", log, "--calibrate", tmp_path / "c.json")
    assert (code, out) == (2, "") and "--calibrate: the log gives no valid real graph pool" in err
    assert not list(tmp_path.glob("c.*"))


# ---------------------------------------------------------------------------------------------- V1, TP 2
def test_tensor_parallel_workers_are_compared_one_by_one_and_the_worst_is_reported(tp2_run, tmp_path, capsys):
    p = predicted(tp2_run)
    log = write(tmp_path, log_from_predictions(tp2_run, tp=2, pool_error=0.01, worst_pool_error=0.08, kv_error=0.0))
    code, data, err = check_json(capsys, tp2_run, log)
    assert code == 0, err
    assert data["runner"] == data["runner_predicted"] == "v1"
    assert data["workers"] == ["Worker_TP0 pid=7000", "Worker_TP1 pid=7001"]
    pool = data["quantities"]["graph_pool_bytes"]
    assert set(pool["workers"]) == {"Worker_TP0 pid=7000", "Worker_TP1 pid=7001"}
    assert abs(pool["error_pct"] - 8.0) <= 100 * 0.005 * GIB / p["pool"] and pool["within"] == "neither"
    assert data["quantities"]["vllm_graph_estimate_bytes"]["within"] == "rounding"
    code, out, _ = run(capsys, "check", tp2_run, "--vllm-log", log)
    per_worker = [line.split(": ", 1)[1] for line in out.splitlines() if "per worker:" in line]
    assert code == 0 and len(per_worker) == 1  # only where the workers disagree: the real pool
    assert per_worker[0].startswith("Worker_TP0 pid=7000: ") and ", Worker_TP1 pid=7001: " in per_worker[0]


def test_a_list_as_the_v1_runner_runs_it_is_accepted_and_said_so(tp2_run, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(tp2_run, run_dir)
    q = load_workload(run_dir / "workload.yaml").serving.decode_query_len
    written = [q - 1, q, 2 * q + 1, 4 * q]  # V1 rounds up to multiples of q when speculating: runs as [q, 3q, 4q]
    config = json.loads((run_dir / "compilation_config.json").read_text())
    config.update(cudagraph_capture_sizes=written, max_cudagraph_capture_size=written[-1])
    (run_dir / "compilation_config.json").write_text(json.dumps(config))
    log = write(tmp_path, log_from_predictions(run_dir, tp=2, capture_sizes=[q, 3 * q, 4 * q]))
    code, data, err = check_json(capsys, run_dir, log)
    assert code == 0, err
    assert data["list"] == "as the V1 runner runs it" and data["capture_sizes"] == [q, 3 * q, 4 * q]
    assert any("V1 rewrites an explicit list" in n for n in data["notes"])


# ---------------------------------------------------------------------------------------------- --calibrate
@pytest.mark.slow
def test_calibrate_writes_a_profile_pair_that_replans_on_vllms_non_kv_and_real_pool(dflash_run, tmp_path, capsys):
    p = predicted(dflash_run)
    log = write(tmp_path, log_from_predictions(dflash_run, kv_error=-0.02, pool_error=0.05))
    out_json = tmp_path / "profiles" / "dflash-vllm.json"
    code, data, err = check_json(capsys, dflash_run, log, "--calibrate", out_json)
    assert code == 0, err
    cal = data["calibration"]
    assert cal["json"] == str(out_json) and cal["csv"] == str(out_json.with_suffix(".csv"))
    assert out_json.with_suffix(".csv").read_bytes() == (dflash_run / "profile.csv").read_bytes()
    meta = json.loads(out_json.read_text())
    block = meta["vllm_calibration"]
    assert block["from_vllm_log"] == ["graph_memory_scale", "non_kv_cache_bytes"]
    assert "non_kv_cache_bytes" not in block["from_profile"] and "latency_ms" in block["from_profile"]
    logged_pool = round(p["pool"] * 1.05 / GIB, 2) * GIB  # what the log printed
    assert block["graph_memory_scale"] == pytest.approx(logged_pool / p["pool"], rel=1e-9)
    assert meta["non_kv_cache_bytes"] == round(data["quantities"]["non_kv_cache_bytes"]["logged"])
    # Where it came from, for whoever reads the pair later: the log, the list vLLM ran, the command, both pools.
    assert block["log"] == str(log) and block["capture_sizes"] == p["sizes"]
    assert block["command"].startswith("cgtune check ") and "--calibrate" in block["command"]
    assert block["graph_pool_bytes"] == {"logged": round(logged_pool), "predicted": round(p["pool"])}
    assert block["non_kv_cache_bytes_from_log"] is True
    assert cal["non_kv_cache_bytes"] == meta["non_kv_cache_bytes"] and cal["graph_memory_scale"] == \
        block["graph_memory_scale"]
    assert sorted(cal["repredicted"]) == ["graph_pool_bytes", "kv_available_bytes", "non_kv_cache_bytes",
                                          "vllm_graph_estimate_bytes"]
    # The same list under the calibrated profile: the real pool and the non-KV memory are now vLLM's.
    again = cal["repredicted"]
    assert again["graph_pool_bytes"]["predicted"] == pytest.approx(logged_pool, rel=1e-6)  # each row rounded to a byte
    assert again["non_kv_cache_bytes"]["predicted"] == meta["non_kv_cache_bytes"]

    # `cgtune search --profile OUT.csv` re-plans on it, and its report says what came from vLLM's log.
    out = tmp_path / "replanned"
    code, _, err = run(capsys, "tune", DFLASH, "--profile", out_json.with_suffix(".csv"), "--out", out, "--trials", 4,
                       "--no-progress")
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["non_kv_cache_bytes"] == meta["non_kv_cache_bytes"]
    report = (out / "report.md").read_text()
    assert "calibrated on vLLM's start-up log" in report and "from the profile: latencies" in report

    # An existing pair is kept unless --force.
    code, _, err = run(capsys, "check", dflash_run, "--vllm-log", log, "--calibrate", out_json)
    assert code == 2 and "exists (pass --force" in err
    assert run(capsys, "check", dflash_run, "--vllm-log", log, "--calibrate", out_json, "--force")[0] == 0


def test_a_calibrated_profile_scales_every_graph_memory_reading_and_a_second_calibration_compounds(
        dflash_run, tmp_path, capsys):
    log = write(tmp_path, log_from_predictions(dflash_run, kv_error=0.0, pool_error=0.05))
    first = tmp_path / "first.json"
    assert check_json(capsys, dflash_run, log, "--calibrate", first)[0] == 0
    wl = load_workload(DFLASH)
    plain = CostModel.from_files(dflash_run / "profile.csv", wl)
    calibrated = CostModel.from_files(first.with_suffix(".csv"), wl)
    scale = json.loads(first.read_text())["vllm_calibration"]["graph_memory_scale"]
    sizes = predicted(dflash_run)["sizes"]
    for mode in ("full", "drafter_full"):
        for w, row in plain.profile.by_mode(mode).items():
            assert calibrated.profile.by_mode(mode)[w].standalone_bytes == round(row.standalone_bytes * scale)
    assert calibrated.evaluate(sizes).graph_memory_bytes == pytest.approx(
        plain.evaluate(sizes).graph_memory_bytes * scale, rel=1e-4)
    # vLLM's non-KV memory holds the drafter's weights already: the cost model must not add them again.
    assert not any("measured without the drafter" in n for n in calibrated.notes)
    assert any("measured without the drafter" in n for n in plain.notes)

    # A run searched on the calibrated profile, checked against the same log again: the scale compounds, so the
    # second calibration's real pool is still vLLM's.
    run2 = tmp_path / "run2"
    assert run_quiet(["search", DFLASH, "--profile", first.with_suffix(".csv"), "--out", run2, "--trials", 4,
                      "--no-progress"]) == 0
    shutil.copyfile(dflash_run / "compilation_config.json", run2 / "compilation_config.json")
    second = tmp_path / "second.json"
    code, data, err = check_json(capsys, run2, log, "--calibrate", second)
    assert code == 0, err
    assert data["quantities"]["graph_pool_bytes"]["within"] == "rounding"
    assert json.loads(second.read_text())["vllm_calibration"]["graph_memory_scale"] == pytest.approx(scale, rel=1e-3)
