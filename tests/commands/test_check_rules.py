"""`cgtune check`'s rules one by one (tuner.check.predictions, called directly): which log it refuses and why, which
figure it reads from which line, which verdict a figure gets, and which notes it adds when. Run directories made by
`cgtune search` on shipped workloads with a synthetic profile (tests/handmade_profiles.py: a fixture, not a
measurement); logs written by tuner/engines/vllm/log_writer.py from the run's own predictions and then changed one
field at a time on the parsed log, so each test holds one rule. Hand values come from what vLLM prints (GiB to 2
decimals, utilizations to 4, concurrency to 2, tokens whole), not from check's own arithmetic."""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # tests/ helpers (import-mode=importlib)
from handmade_profiles import gpu_scale_profile  # noqa: E402

from tuner.check.example import predicted_log  # noqa: E402
from tuner.check.predictions import CheckError, CheckResult, Quantity, check_run, write_calibration  # noqa: E402
from tuner.engines.vllm.startup_log import GIB, StartupLog, parse_startup_log  # noqa: E402

DFLASH = ROOT / "workloads" / "dflash-llama-3.1-8b.yaml"  # V2 runner, one GPU, K = 16, max_num_batched_tokens 8192
SUFFIX_TP2 = ROOT / "workloads" / "suffix-llama-3.1-70b-tp2.yaml"  # V1 runner (suffix decoding), TP 2, K = 8 (q = 9)
SRC = "vllm.log"


def _search_run(tmp: Path, workload: Path) -> Path:
    from tuner.cli import main

    csv = gpu_scale_profile(tmp / "profile", workload)
    out = tmp / "run"
    assert main([str(a) for a in ["search", workload, "--profile", csv, "--out", out, "--trials", 4,
                                  "--no-progress"]]) == 0
    return out


@pytest.fixture(scope="module")
def dflash_run(tmp_path_factory):
    return _search_run(tmp_path_factory.mktemp("dflash"), DFLASH)


@pytest.fixture(scope="module")
def tp2_run(tmp_path_factory):
    return _search_run(tmp_path_factory.mktemp("suffix-tp2"), SUFFIX_TP2)


def copy_run(run_dir: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(run_dir, out)
    return out


def set_list(run_dir: Path, sizes: list[int], name: str = "compilation_config.json") -> None:
    config = json.loads((run_dir / name).read_text())
    config.update(cudagraph_capture_sizes=sizes, max_cudagraph_capture_size=max(sizes, default=0))
    (run_dir / name).write_text(json.dumps(config))


def run_list(run_dir: Path, name: str = "compilation_config.json") -> list[int]:
    return json.loads((run_dir / name).read_text())["cudagraph_capture_sizes"]


def parsed(run_dir: Path, **kwargs) -> StartupLog:
    """The parsed start-up log of the run's own predictions (no errors put in unless given)."""
    kwargs = {"kv_error": 0.0, "pool_error": 0.0, **kwargs}
    return parse_startup_log(predicted_log(run_dir, **kwargs), SRC)


def with_worker(log: StartupLog, i: int = 0, **changes) -> StartupLog:
    """The log with worker `i`'s figures changed (as if vLLM had logged other lines)."""
    workers = list(log.workers)
    workers[i] = replace(workers[i], **changes)
    return replace(log, workers=workers)


def refusal(run_dir: Path, log: StartupLog) -> str:
    with pytest.raises(CheckError) as exc:
        check_run(run_dir, log)
    return str(exc.value)


def brief(sizes: list[int]) -> str:
    """How the refusal names a list: its first six sizes (", ..." when there are more), its length and its max."""
    more = ", ..." if len(sizes) > 6 else ""
    return f"[{', '.join(map(str, sizes[:6]))}{more}] ({len(sizes)} sizes, max {sizes[-1]})"


# ---------------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(("changes", "why"), [
    ({"cudagraph_mode": "NONE"}, "cudagraph_mode NONE"),
    ({"capture_sizes": ()}, "an empty cudagraph_capture_sizes"),
    ({"enforce_eager": True, "cudagraph_mode": "NONE", "capture_sizes": ()}, "enforce_eager=True"),
])
def test_a_log_without_graphs_is_refused_naming_what_turned_them_off(dflash_run, changes, why):
    # Each of the three ways vLLM runs eager is named for itself (enforce_eager first: it implies the other two).
    message = refusal(dflash_run, replace(parsed(dflash_run), **changes))
    assert message == (f"--vllm-log: {SRC}: vLLM ran without CUDA graphs ({why}), so it logged no graph memory to "
                       f"compare")


@pytest.mark.parametrize("other", [[1, 2, 4, 8, 16, 32, 64], [1, 2, 4, 8, 16, 32], [3]])
def test_a_log_of_another_list_names_both_lists_by_their_head_length_and_max(dflash_run, other):
    # 7 sizes: six shown and ", ..."; 6 sizes: all shown, no ellipsis; V2 runs the list as written, so no "runs as".
    sizes = run_list(dflash_run)
    assert len(sizes) > 6
    message = refusal(dflash_run, replace(parsed(dflash_run), capture_sizes=tuple(other)))
    assert message == (f"--vllm-log: {SRC}: vLLM ran cudagraph_capture_sizes={brief(other)}, not the run's list "
                       f"{brief(sizes)}; start vLLM with the run's vllm-serve.yaml")


def test_a_run_that_emitted_no_graphs_is_named_so_in_the_refusal(dflash_run, tmp_path):
    run = copy_run(dflash_run, tmp_path)
    set_list(run, [])
    message = refusal(run, replace(parsed(dflash_run), capture_sizes=(1, 2, 4)))
    assert "not the run's list [] (no graphs); start vLLM" in message


def test_a_v1_run_refusal_says_what_its_list_runs_as_too(tp2_run, tmp_path):
    # V1 rounds an explicit list up to multiples of q = 9 when speculating: [8, 9, 19, 36] runs as [9, 27, 36].
    run = copy_run(tp2_run, tmp_path)
    set_list(run, [8, 9, 19, 36])
    message = refusal(run, replace(parsed(tp2_run, tp=2), capture_sizes=(9, 18)))
    assert message.endswith("not the run's list [8, 9, 19, 36] (4 sizes, max 36) nor what it runs as, "
                            "[9, 27, 36] (3 sizes, max 36); start vLLM with the run's vllm-serve.yaml")


@pytest.mark.parametrize(("name", "value", "wanted"), [
    ("max_num_batched_tokens", 4096, "8192"),
    ("tensor_parallel_size", 2, "1"),
    ("gpu_memory_utilization", 0.9001, "0.9"),  # one in the 4th decimal: another setting
])
def test_every_serving_setting_the_log_states_is_held_to_the_workloads(dflash_run, name, value, wanted):
    log = parsed(dflash_run)
    message = refusal(dflash_run, replace(log, settings={**log.settings, name: value}))
    assert message == f"--vllm-log: {SRC}: vLLM ran {name}={value:g}, the run's workload has {wanted}"


def test_a_setting_within_half_the_4th_decimal_is_the_same_setting(dflash_run):
    # 0.90004 prints as 0.9000 at vLLM's 4 decimals: the workload's 0.9, not a refusal.
    log = parsed(dflash_run)
    result = check_run(dflash_run, replace(log, settings={**log.settings, "gpu_memory_utilization": 0.90004}))
    assert "graph_pool_bytes" in result.quantities


def test_a_log_cut_before_an_untagged_workers_capture_names_no_worker(dflash_run):
    log = parsed(dflash_run)
    w = log.workers[0]
    message = refusal(dflash_run, with_worker(log, tag="", captures=[c for c in w.captures if not c[2]]))
    assert "ends before vLLM's graph capture finished (no \"Graph capturing finished\" line" in message


def test_a_run_dir_whose_list_is_unreadable_or_refused_by_vllm_or_without_a_search_is_one_line(tp2_run, tmp_path):
    log = parsed(tp2_run, tp=2)
    run = copy_run(tp2_run, tmp_path)
    (run / "compilation_config.json").write_text("{not json")
    message = refusal(run, log)
    assert message.startswith(f"run_dir: {run / 'compilation_config.json'} is unreadable (JSONDecodeError: ")
    # V1 with q = 9 refuses a list whose max is below q: vLLM would not start on it.
    shutil.copyfile(tp2_run / "compilation_config.json", run / "compilation_config.json")
    set_list(run, [1, 2, 4])
    message = refusal(run, log)
    assert message.startswith(f"run_dir: {run}/compilation_config.json: a list vLLM refuses (cudagraph_capture_sizes: "
                              f"no valid size after rounding to a multiple of q=9")
    # The log is of the run's list, but the run has no search to rebuild the cost model from: load_run's first line.
    shutil.copyfile(tp2_run / "compilation_config.json", run / "compilation_config.json")
    (run / "search.json").unlink()
    assert refusal(run, log) == f"run_dir: {run}: no search.json (not a cgtune search or tune output directory)"


def test_a_log_of_the_compact_list_beside_a_run_that_ships_the_fastest_is_checked_against_it(dflash_run, tmp_path):
    # The fixture ships compact; swap the files so it ships the fastest and keeps compilation_config.compact.json.
    run = copy_run(dflash_run, tmp_path)
    compact = run_list(run)
    (run / "compilation_config.json").rename(run / "compilation_config.compact.json")
    (run / "compilation_config.fastest.json").rename(run / "compilation_config.json")
    assert run_list(run) != compact
    result = check_run(run, replace(parsed(dflash_run), capture_sizes=tuple(compact)))
    assert result.evaluation.capture_sizes == tuple(compact) and result.list_kind == "as written"


# ---------------------------------------------------------------------------------------------- estimate off
@pytest.fixture(scope="module")
def estimate_off_run(dflash_run, tmp_path_factory):
    """The dflash run with estimate_cudagraph_memory: false (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0)."""
    run = tmp_path_factory.mktemp("estimate-off") / "run"
    shutil.copytree(dflash_run, run)
    text = (run / "workload.yaml").read_text()
    assert "\nserving:\n" in text
    (run / "workload.yaml").write_text(text.replace("\nserving:\n", "\nserving:\n  estimate_cudagraph_memory: false\n"))
    return run


def test_with_the_estimate_off_non_kv_is_requested_less_kv_and_the_estimate_is_not_compared(estimate_off_run):
    # vLLM subtracted no estimate, though its pool line still prints one: non-KV = requested - available KV.
    log = parsed(estimate_off_run, estimate_enabled=False)
    w = log.workers[0]
    assert w.estimate_disabled and w.pool_estimated_gib is not None
    result = check_run(estimate_off_run, log)
    assert "vllm_graph_estimate_bytes" not in result.quantities
    assert any("vllm_graph_estimate_bytes is not compared" in n for n in result.notes)
    non_kv = result.quantities["non_kv_cache_bytes"]
    assert non_kv.logged == pytest.approx((w.requested_gib - w.kv_available_gib) * GIB, abs=1)


def test_a_log_with_the_estimate_on_is_refused_by_a_run_with_it_off(estimate_off_run):
    message = refusal(estimate_off_run, parsed(estimate_off_run))
    assert message == (f"--vllm-log: {SRC}: vLLM ran with VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1, the run's "
                       f"workload has estimate_cudagraph_memory: false")


# ---------------------------------------------------------------------------------------------- figures
def test_the_hint_gives_the_estimate_on_vllms_device_or_else_the_profiles(dflash_run):
    # Without a pool line, the estimate is (current - equivalent utilization) x device memory: the memory summary's
    # device when it printed one (80 GiB here), the profile's (141 GiB, summary.json) when it did not.
    log = with_worker(parsed(dflash_run), pool_estimated_gib=None)
    current, equivalent = log.workers[0].utilization
    assert current - equivalent > 0.01
    result = check_run(dflash_run, with_worker(log, total_gib=80.0))
    estimate = result.quantities["vllm_graph_estimate_bytes"]
    assert estimate.logged == pytest.approx((current - equivalent) * 80 * GIB, rel=1e-9)
    assert any("vLLM's device has 80.0 GiB, the profile's 141.00 GiB" in n for n in result.notes)
    profile_total = json.loads((dflash_run / "summary.json").read_text())["total_memory_bytes"]
    assert profile_total == 141 * GIB
    result = check_run(dflash_run, with_worker(log, total_gib=None))
    estimate = result.quantities["vllm_graph_estimate_bytes"]
    assert estimate.logged == pytest.approx((current - equivalent) * profile_total, rel=1e-9)
    assert not any("measured on another GPU" in n for n in result.notes)


def test_without_an_actual_pool_line_the_real_pool_is_the_capture_lines(dflash_run):
    log = parsed(dflash_run)
    w = log.workers[0]
    seconds, _ = w.real_capture
    log = with_worker(log, pool_actual_gib=None, captures=[*w.captures[:-1], (seconds, 1.9, True)])
    assert check_run(dflash_run, log).quantities["graph_pool_bytes"].logged == pytest.approx(1.9 * GIB)


def test_a_worker_that_logged_no_estimate_compares_neither_the_estimate_nor_non_kv(dflash_run):
    # Non-KV needs the estimate vLLM subtracted: without any estimate line it is not compared (and nothing fails).
    log = with_worker(parsed(dflash_run), pool_estimated_gib=None, utilization=None)
    result = check_run(dflash_run, log)
    assert "graph_pool_bytes" in result.quantities and "kv_available_bytes" in result.quantities
    assert "vllm_graph_estimate_bytes" not in result.quantities and "non_kv_cache_bytes" not in result.quantities


@pytest.mark.parametrize(("off_gib", "within"), [(0.0125, "rounding"), (0.0175, "neither")])
def test_non_kv_is_within_rounding_up_to_three_half_hundredths_of_a_gib(dflash_run, off_gib, within):
    # requested - KV - estimate: three figures each printed to 0.01 GiB, so up to 3 x 0.005 GiB of rounding.
    log = parsed(dflash_run)
    w = log.workers[0]
    predicted = check_run(dflash_run, log).quantities["non_kv_cache_bytes"].predicted / GIB
    requested = predicted + w.kv_available_gib + w.pool_estimated_gib + off_gib
    q = check_run(dflash_run, with_worker(log, requested_gib=requested)).quantities["non_kv_cache_bytes"]
    assert q.logged / GIB - predicted == pytest.approx(off_gib, abs=1e-9)
    assert q.within == within


def test_without_a_memory_summary_non_kv_is_not_compared_and_a_note_says_why(dflash_run):
    result = check_run(dflash_run, with_worker(parsed(dflash_run), requested_gib=None))
    assert "non_kv_cache_bytes" not in result.quantities
    assert any(n.startswith("non_kv_cache_bytes is not compared: the log has no memory summary line")
               for n in result.notes)


def test_concurrency_is_within_rounding_only_to_half_its_second_decimal_and_tokens_not_at_all(dflash_run):
    log = parsed(dflash_run)
    exact = check_run(dflash_run, log).quantities
    concurrency, tokens = exact["max_concurrency"].predicted, exact["kv_tokens"].predicted
    near = check_run(dflash_run, replace(log, max_concurrency=concurrency + 0.004)).quantities
    assert near["max_concurrency"].within == "rounding"
    far = check_run(dflash_run, replace(log, max_concurrency=concurrency + 0.5, kv_tokens=int(tokens) - 16))
    # No tolerance is stated for either: past the log's rounding they are "neither".
    assert far.quantities["max_concurrency"].within == "neither" and far.quantities["kv_tokens"].within == "neither"


def test_the_stated_tolerance_is_reported_in_percent(dflash_run):
    # cgtune states its graph memory within 5% (MEMORY_GOAL); for the KV cache it states none.
    q = {name: x.as_dict() for name, x in check_run(dflash_run, parsed(dflash_run)).quantities.items()}
    assert q["graph_pool_bytes"]["tolerance_pct"] == pytest.approx(5.0)
    assert q["vllm_graph_estimate_bytes"]["tolerance_pct"] == pytest.approx(5.0)
    assert q["kv_available_bytes"]["tolerance_pct"] is None


def test_the_worker_furthest_from_the_prediction_is_reported_even_below_it(tp2_run):
    # TP0's pool 1% above the prediction, TP1's 8% below: the report carries TP1's, not the larger figure.
    log = parsed(tp2_run, tp=2, pool_error=0.01, worst_pool_error=-0.08)
    result = check_run(tp2_run, log)
    pool = result.quantities["graph_pool_bytes"]
    assert pool.logged == pool.workers["Worker_TP1 pid=7001"] < pool.workers["Worker_TP0 pid=7000"]
    assert pool.error == pytest.approx(-0.08, abs=0.005 * GIB / pool.predicted)
    # Both ranks logged with their tags: no note about lines that cannot be told apart.
    assert not any("cannot be told apart" in n for n in result.notes)


def test_at_tp_2_a_single_untagged_worker_gets_a_note(tp2_run):
    log = parsed(tp2_run, tp=2)
    result = check_run(tp2_run, replace(log, workers=[replace(log.workers[0], tag="")]))
    assert any(n.startswith("1 worker(s) logged a KV cache at tensor_parallel_size 2") for n in result.notes)


# ---------------------------------------------------------------------------------------------- notes
def test_a_log_of_the_runs_own_setup_gets_only_the_capture_time_note(dflash_run):
    # vLLM 0.33, the list as written, max_num_seqs stated, one worker at TP 1, the profile's device: nothing to say
    # but how capture_s is predicted (the profile records capture times).
    result = check_run(dflash_run, parsed(dflash_run))
    assert "capture_s" in result.quantities
    assert len(result.notes) == 1 and result.notes[0].startswith("capture_s predicted = the profile's capture seconds")


def test_notes_on_another_vllm_version_and_an_unstated_max_num_seqs(dflash_run):
    log = parsed(dflash_run)
    settings = {k: v for k, v in log.settings.items() if k != "max_num_seqs"}
    result = check_run(dflash_run, replace(log, vllm_version="0.34.1", settings=settings))
    assert "the log is of vLLM 0.34.1; cgtune mirrors vLLM 0.33's rules" in result.notes
    assert any(n.startswith("the log does not state max_num_seqs") for n in result.notes)


def test_a_profile_without_capture_times_compares_no_capture_s_and_says_so(dflash_run, tmp_path):
    run = copy_run(dflash_run, tmp_path)
    lines = (run / "profile.csv").read_text().splitlines()
    assert lines[0].endswith(",capture_s")
    (run / "profile.csv").write_text("\n".join([lines[0]] + [line.rsplit(",", 1)[0] + "," for line in lines[1:]])
                                     + "\n")
    result = check_run(run, parsed(dflash_run))
    assert "capture_s" not in result.quantities
    assert any(n.startswith("capture_s is not compared: the profile records no capture time") for n in result.notes)
    assert not any(n.startswith("capture_s predicted") for n in result.notes)


# ---------------------------------------------------------------------------------------------- verdicts, calibration
def _with_quantity(result: CheckResult, q: Quantity) -> CheckResult:
    return replace(result, quantities={**result.quantities, q.name: q})


def test_fail_over_counts_a_figure_only_strictly_beyond_the_percent(dflash_run):
    # 2 predicted, 3 logged: exactly 50% off. --fail-over 50 lets it through; 49.9 does not.
    result = check_run(dflash_run, parsed(dflash_run))
    only = replace(result, quantities={"x": Quantity("x", "s", 2.0, 3.0, 0.0, None, "test")})
    assert only.over(50) == [] and only.over(49.9) == ["x"]


def test_calibration_needs_a_real_pool_above_zero_predicted_and_logged(dflash_run, tmp_path):
    # A pool vLLM logged as 0 GiB, or one cgtune predicted as 0 bytes, gives no scale; nothing is written.
    zero_logged = check_run(dflash_run, with_worker(parsed(dflash_run), pool_actual_gib=0.0))
    assert zero_logged.quantities["graph_pool_bytes"].logged == 0
    result = check_run(dflash_run, parsed(dflash_run))
    zero_predicted = _with_quantity(result, replace(result.quantities["graph_pool_bytes"], predicted=0.0))
    for bad in (zero_logged, zero_predicted):
        with pytest.raises(CheckError, match=r"^--calibrate: the log gives no valid real graph pool to calibrate on$"):
            write_calibration(bad, tmp_path / "cal.json", command="test")
    assert not list(tmp_path.iterdir())
