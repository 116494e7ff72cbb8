"""The Python API (`import tuner`, docs/api.md) used as a user scripts it: a workload, its engine's default list,
a profile, a search, a run written and read back, and a start-up log held to it."""

from __future__ import annotations

import json
import pkgutil
import re
from pathlib import Path

import pytest

import tuner
from tuner.check.example import EXAMPLE_PROFILE, EXAMPLE_WORKLOAD, predicted_log
from tuner.profile.table import ProfileError
from tuner.workload.spec import WorkloadError

ROOT = Path(__file__).resolve().parents[1]


def test_the_default_list_is_vllms_grid_for_the_baseline_workload() -> None:
    # By hand from vLLM's _set_cudagraph_sizes: q = 1, max_num_seqs 256, so M = min(256 * 1 * 2, 512) = 512;
    # [1, 2, 4] + range(8, 256, 8) + range(256, 513, 16) and the uniform decode size 256 (max_num_seqs <= M).
    workload = tuner.load_workload(ROOT / "workloads/baseline-llama-3.1-8b.yaml")
    expected = (1, 2, 4, *range(8, 256, 8), *range(256, 513, 16))
    assert tuner.default_capture_sizes(workload) == expected


def test_the_default_list_of_an_sglang_workload_is_its_request_grid_in_tokens() -> None:
    # SGLang 0.5.23's speculative default batch sizes start 1..8, 10, 12 (its finer speculative grid); in token
    # widths each is a request count times the decode step's query length, the last the engine's widest default.
    workload = tuner.load_workload(ROOT / "workloads/sglang-eagle-llama-3.1-8b.yaml")
    sizes = tuner.default_capture_sizes(workload)
    q = workload.engine.decode_query_len
    assert q > 1 and all(s % q == 0 for s in sizes)
    assert workload.engine.in_engine_unit(sizes)[:10] == [*range(1, 9), 10, 12]
    assert sizes[-1] == workload.engine.defaults().max_size


def test_bad_input_raises_the_stages_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="is not a file"):
        tuner.load_workload(tmp_path / "missing.yaml")
    with pytest.raises(ProfileError, match="profile CSV not found"):
        tuner.read_profile(tmp_path / "missing.csv")


def test_a_search_written_and_read_back_and_checked_against_a_log(tmp_path: Path) -> None:
    workload = tuner.load_workload(ROOT / EXAMPLE_WORKLOAD)
    profile = tuner.read_profile(ROOT / EXAMPLE_PROFILE)
    assert profile.metadata["device"] == "synthetic" and profile.rows
    model = tuner.cost_model(workload, ROOT / EXAMPLE_PROFILE)
    default = model.evaluate(tuner.default_capture_sizes(workload))

    result = tuner.search_capture_lists(model, trials=30, seed=3, exact_seconds=20)
    # The list found fits, is no slower than the engine's default, and the exact solver's proven bound holds it.
    assert result.chosen.feasible
    assert result.chosen.expected_step_ms <= default.expected_step_ms
    assert result.exact.lower_bound_ms <= result.chosen.expected_step_ms + 1e-9
    assert result.compact is not None and result.compact.tolerance == 0.01
    assert result.compact.evaluation.expected_step_ms <= result.chosen.expected_step_ms * 1.01 + 1e-9

    # The decision record: the lists compared are the search's, and what it ships is what summary.json says.
    decision = tuner.decide(model, result)
    assert decision.tuned is result.chosen and decision.default.capture_sizes == default.capture_sizes
    assert decision.table["compact"].capture_sizes == result.compact.evaluation.capture_sizes
    assert decision.interval.point_ms == pytest.approx(default.expected_step_ms - result.chosen.expected_step_ms)
    run = tmp_path / "run"
    written = tuner.write_run(run, model, decision, command="api test")
    assert {p.name for p in written} >= {"report.md", "summary.json", "compilation_config.json"}
    summary = json.loads((run / "summary.json").read_text())
    assert tuple(summary["tuned"]["capture_sizes"]) == result.chosen.capture_sizes
    assert summary["shipped"]["list"] == decision.ship.name
    assert summary["saving_interval_ms"] == [decision.interval.low_ms, decision.interval.high_ms]

    model_again, result_again = tuner.load_run(run)
    assert result_again.chosen.capture_sizes == result.chosen.capture_sizes
    assert model_again.evaluate(result.chosen.capture_sizes).expected_step_ms == result.chosen.expected_step_ms

    # A start-up log written from the run's own predictions with a KV cache 3% smaller: the check finds that 3%
    # (to vLLM's 16-token blocks) and the pool as predicted, to the 0.01 GiB vLLM logs it in.
    log = run / "vllm.log"
    log.write_text(predicted_log(run, kv_error=-0.03, pool_error=0.0))
    checked = tuner.check_log(run, log)
    figures = checked.as_dict()["quantities"]
    assert figures["kv_available_bytes"]["error_pct"] == pytest.approx(-3.0, abs=0.2)
    pool = figures["graph_pool_bytes"]
    assert abs(pool["logged"] - pool["predicted"]) <= pool["log_resolution"] and pool["within"]
    same = tuner.check_log(run, "stdin", data=log.read_bytes())
    assert same.as_dict()["quantities"] == figures
    # vLLM's estimate as the pool line states it, to its 0.01 GiB; a log cut before that line (V2 logs its estimate
    # nowhere else) leaves the --gpu-memory-utilization hint: (current - equivalent) x device memory, each to 4
    # decimals, so within 1e-4 x the device's memory.
    estimate = figures["vllm_graph_estimate_bytes"]
    assert estimate["source"] == "CUDA graph pool memory: ... (estimated)"
    assert abs(estimate["logged"] - estimate["predicted"]) <= estimate["log_resolution"]
    cut = run / "cut.log"
    cut.write_text("".join(line for line in log.read_text().splitlines(keepends=True)
                           if "CUDA graph pool memory" not in line))
    hint = tuner.check_log(run, cut).as_dict()["quantities"]["vllm_graph_estimate_bytes"]
    total = model.budget.total_memory_bytes
    assert hint["source"] == "--gpu-memory-utilization hint (current - equivalent) x device memory"
    assert hint["log_resolution"] == pytest.approx(1e-4 * total, rel=1e-3)
    assert abs(hint["logged"] - hint["predicted"]) <= hint["log_resolution"]


def test_every_api_name_is_documented_and_none_is_a_stage_name() -> None:
    # A name equal to a subpackage would be replaced by the subpackage once any module imports it.
    stages = {m.name for m in pkgutil.iter_modules(tuner.__path__)}
    assert not set(tuner.__all__) & stages
    doc = (ROOT / "docs/api.md").read_text()
    for name in tuner.__all__:
        assert callable(getattr(tuner, name)) or name == "__version__"
        if name != "__version__":
            assert getattr(tuner, name).__doc__, name
        assert re.search(rf"^#+ `?{re.escape(name)}\b", doc, re.M), f"docs/api.md has no section for {name}"


def _snippets() -> list[str]:
    """docs/api.md's Python blocks, in order."""
    return re.findall(r"^```python\n(.*?)^```", (ROOT / "docs/api.md").read_text(), re.S | re.M)


@pytest.mark.slow
@pytest.mark.parametrize("release", ["0.33", "0.34"])
def test_every_snippet_of_the_api_page_runs_as_a_reader_runs_it(tmp_path, monkeypatch, capsys, release) -> None:
    # Issue 50: under 0.34 the page printed a default list's internal keys under a heading that said tokens, read a
    # quantity 0.34 does not log, and checked a start-up log no reader has. Here every block runs as written, from a
    # folder holding the checkout's workloads, under each release; what it prints is the release's own words.
    from tuner.engines.vllm import versions

    snippets = _snippets()
    assert snippets and "runs/dflash" in snippets[-1]
    monkeypatch.setenv(versions.VERSION_ENV, release)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "workloads").symlink_to(ROOT / "workloads")
    scope: dict = {}
    for code in snippets:
        exec(compile(code, "docs/api.md", "exec"), scope)  # noqa: S102 - the page's own code, as a reader runs it
    printed = capsys.readouterr().out.splitlines()
    engine = scope["workload"].engine
    assert engine.version == release and printed[0] == engine.release_words
    kinds = engine.graph_kinds(scope["default"])
    # Every graph is printed at its token widths (a 0.34 decode graph of n requests at n x 17), none at a key below 1.
    assert printed[1:1 + len(kinds)] == [f"{len(w)} {what} ({mode}): {w[0]}..{w[-1]} tokens" for what, mode, w in kinds]
    assert all(min(w) >= 1 for _, _, w in kinds)
    assert (tmp_path / "runs/dflash/summary.json").is_file()
    names = [line.split()[0] for line in printed if line.split() and line.split()[0] in scope["check"].quantities]
    assert names and ("kv_capacity_bytes" if release == "0.34" else "kv_available_bytes") in names
