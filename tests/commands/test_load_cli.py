"""`cgtune search --rate R --tpot-slo MS`: the list chosen at the load's fixed point, the iterations on the console
and in search.json and summary.json, the lists' figures under the load in report.md with the TPOT-by-rate plot, a
re-render that simulates nothing, a validation that emits another list simulating the lists again, and bad load flags
refused in one line. The cliff profile (eager 4x the graph's per
token) with traffic of 1..8 decoding requests: hand-made, a test fixture, never a measurement."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ helpers (import-mode=importlib)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "load"))
from cli_runner import run  # noqa: E402
from handmade_profiles import handmade_profile, handmade_spec  # noqa: E402
from load_profiles import cliff_eager, cliff_graph  # noqa: E402

from tuner.report.load import LOAD_PLOT  # noqa: E402
from tuner.workload.spec import parse_workload  # noqa: E402

LOAD = {"rate_per_s": 100.0, "prompt_tokens": 16, "output_tokens": 64}


def write_inputs(tmp: Path, load: dict | None = LOAD) -> tuple[Path, Path]:
    traffic: dict = {"requests": {"kind": "uniform", "min": 1, "max": 8}}
    if load is not None:
        traffic["load"] = load
    spec = handmade_spec(name="cliff", max_num_seqs=64, max_num_batched_tokens=256, max_model_len=128,
                         traffic=traffic)
    wl_path = tmp / "cliff.yaml"
    wl_path.write_text(yaml.safe_dump(spec))
    profile = handmade_profile(tmp, parse_workload(spec), list(range(1, 257)), eager_ms=cliff_eager,
                               full_ms=cliff_graph, piecewise_ms=cliff_graph, name="cliff")
    return wl_path, profile


@pytest.fixture(scope="module")
def load_run(tmp_path_factory: pytest.TempPathFactory):
    """One load-aware search for the module (capsys is per test: its output is captured by redirection)."""
    import contextlib
    import io

    from tuner.cli import main

    tmp = tmp_path_factory.mktemp("load-cli")
    wl, profile = write_inputs(tmp)
    out = tmp / "run"
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main([str(a) for a in ("search", wl, "--profile", profile, "--out", out, "--rate", "180",
                                      "--tpot-slo", "2", "--load-duration", "4", "--trials", "20", "--no-progress")])
    assert code == 0, stderr.getvalue()
    return wl, profile, out, stdout.getvalue()


@pytest.mark.slow
def test_the_search_iterates_to_the_fixed_point_and_records_it(load_run) -> None:
    _, _, out, stdout = load_run
    assert "load 180 req/s, iteration 0: 8 graphs (max 8; the expected-step answer)" in stdout
    assert "load: converged: iteration" in stdout
    summary = json.loads((out / "summary.json").read_text())
    search = json.loads((out / "search.json").read_text())
    facts = summary["load"]
    assert facts["search"] == search["load"]
    its = facts["search"]["iterations"]
    assert facts["search"]["converged"] and its[-1]["capture_sizes"] == its[-2]["capture_sizes"]
    chosen = its[facts["search"]["chosen"]]
    # The shipped run was searched on the chosen iteration's distribution: its exact answer is the chosen list.
    assert search["exact"]["best"] == chosen["capture_sizes"]
    assert summary["cost_model"]["load_steps"], "the objective weighed the simulated steps"
    # The lists under the load: at the rate, over the sweep, and each one's held rate under the target.
    assert set(facts["at_rate"]) == set(facts["sweep"]) == set(facts["stable"]) == {
        "default", "tuned", "compact", "expected-step"}
    assert facts["at_rate"]["expected-step"]["capture_sizes"] == its[0]["capture_sizes"]
    assert facts["at_rate"]["tuned"]["capture_sizes"] == summary["capture_sizes"]
    assert all(len(rows) == 8 for rows in facts["sweep"].values())
    # Must-show: the fixed point's TPOT p99 is no worse than the expected-step answer's, and here far better.
    assert facts["at_rate"]["tuned"]["tpot_p99_ms"] < facts["at_rate"]["expected-step"]["tpot_p99_ms"] / 4
    held = {name: v["rate_per_s"] for name, v in facts["stable"].items()}
    assert held["tuned"] > held["expected-step"]
    assert "under the load at 180 req/s: tuned TPOT p99" in stdout
    assert {"load_search_s", "load_s"} <= set(summary["timings"])


@pytest.mark.slow
def test_the_report_shows_the_load_and_re_renders_without_simulating(load_run, capsys, monkeypatch) -> None:
    import tuner.decision.record as record
    import tuner.load.cliff as cliff
    import tuner.load.scheduler as scheduler

    _, _, out, _ = load_run
    code, _, err = run(capsys, "report", out)
    assert code == 0, err
    text = (out / "report.md").read_text()
    section = text[text.index("## Under the load"):text.index("## Search")]
    assert "180 requests/s" in section and "| 0 | 8 | 8 |" in section and "(chosen)" in section
    assert "Highest rate each list holds" in section and f"plots/{LOAD_PLOT}" in section
    assert (out / "plots" / LOAD_PLOT).stat().st_size > 0
    first = {name: (out / name).read_bytes() for name in ("report.md", "summary.json", "search.json")}

    def simulated(*a, **k):
        raise AssertionError("cgtune report simulated the load again")

    with monkeypatch.context() as m:
        m.setattr(record, "load_facts", simulated)
        m.setattr(record, "decide", simulated)
        m.setattr(cliff, "operating_points", simulated)
        m.setattr(scheduler, "schedule", simulated)
        code, _, err = run(capsys, "report", out)
    assert code == 0, err
    for name, data in first.items():
        assert (out / name).read_bytes() == data, f"{name} changed on re-render"


@pytest.mark.slow
def test_a_search_without_rate_in_the_same_dir_drops_the_load_outputs(load_run, capsys, tmp_path) -> None:
    wl, profile, out, _ = load_run
    import shutil

    again = tmp_path / "run"
    shutil.copytree(out, again)
    code, _, err = run(capsys, "tune", wl, "--profile", profile, "--out", again, "--trials", "20", "--no-progress")
    assert code == 0, err
    summary = json.loads((again / "summary.json").read_text())
    assert "load" not in summary and summary["cost_model"]["load_steps"] is None
    assert not (again / "plots" / LOAD_PLOT).exists()
    assert "## Under the load" not in (again / "report.md").read_text()


@pytest.mark.slow
def test_with_workers_the_fleet_study_weighs_the_fixed_points_steps(load_run, capsys, tmp_path) -> None:
    # The fixed point runs before the study is planned, so the spec every worker rebuilds its model from carries the
    # simulated steps: one local worker on SQLite ends where the in-process search did, and the load section follows.
    wl, profile, out, _ = load_run
    fleet = tmp_path / "run"
    code, stdout, err = run(capsys, "tune", wl, "--profile", profile, "--out", fleet, "--rate", "180", "--tpot-slo",
                            "2", "--load-duration", "4", "--trials", "20", "--storage",
                            f"sqlite:///{tmp_path / 'fleet.db'}", "--workers", "1", "--no-progress")
    assert code == 0, err
    assert "load: converged: iteration" in stdout
    alone, workers = (json.loads((d / "summary.json").read_text()) for d in (out, fleet))
    steps = alone["cost_model"]["load_steps"]
    assert steps and workers["cost_model"]["load_steps"] == steps
    assert workers["study"]["name"].endswith("-fleet") and "-load" in workers["study"]["name"]
    assert workers["study"]["name"] == alone["study"]["name"] + "-fleet"
    assert workers["load"]["search"] == alone["load"]["search"]
    assert workers["capture_sizes"] == alone["capture_sizes"]
    assert workers["load"]["at_rate"]["tuned"] == alone["load"]["at_rate"]["tuned"]
    assert "## Under the load" in (fleet / "report.md").read_text()


@pytest.mark.slow
def test_a_validation_that_emits_another_list_puts_the_lists_under_the_load_again(load_run, tmp_path) -> None:
    # The tuned list does not fit by the (scripted) measured memory, so validate emits the default and decides again:
    # the decision's lists are then the default twice, and the load section follows them, the fixed point as recorded.
    import shutil

    from test_validate import ScriptedBackend  # the scripted device of the validate tests (plumbing, not accuracy)

    from tuner.decision.run_dir import load_run as read_run
    from tuner.validate.validation import validate_run

    _, _, out, _ = load_run
    again = tmp_path / "run"
    shutil.copytree(out, again)
    before = json.loads((again / "summary.json").read_text())["load"]
    model, search = read_run(again)
    # Neither the tuned list nor the list the files ship (validation measures both) fits.
    shipped = model.evaluate(json.loads((again / "summary.json").read_text())["shipped"]["capture_sizes"])
    factors = {e.capture_sizes[-1]: (e.graph_estimate_bytes + model.budget.slack_bytes + 2**20) / e.graph_memory_bytes
               for e in (search.chosen, shipped)}
    record = validate_run(again, num_steps=200, backend=ScriptedBackend(model, memory_factor=factors))
    assert record["emitted"] == "default"
    summary = json.loads((again / "summary.json").read_text())
    facts = summary["load"]
    assert facts["search"] == before["search"] == json.loads((again / "search.json").read_text())["load"]
    assert summary["capture_sizes"] == list(model.default_sizes)
    assert facts["at_rate"]["tuned"]["capture_sizes"] == list(model.default_sizes) != before["at_rate"]["tuned"][
        "capture_sizes"]
    # The emitted list is simulated afresh: its figures are the default's, which were simulated the same way.
    assert facts["at_rate"]["tuned"] == facts["at_rate"]["default"] == before["at_rate"]["default"]
    assert facts["sweep"]["tuned"] == before["sweep"]["default"]
    assert "## Under the load" in (again / "report.md").read_text()


def one_line(code: int, out: str, err: str, needle: str) -> None:
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err and needle in err, err


def test_bad_load_flags_are_one_line_and_write_nothing(tmp_path, capsys) -> None:
    wl, profile = write_inputs(tmp_path)
    (tmp_path / "bare").mkdir()
    bare, _ = write_inputs(tmp_path / "bare", load=None)
    out = tmp_path / "run"
    one_line(*run(capsys, "search", bare, "--profile", profile, "--out", out, "--rate", "10"),
             "--rate: workload cliff has no traffic.load section")
    one_line(*run(capsys, "search", wl, "--profile", profile, "--out", out, "--tpot-slo", "5"),
             "--tpot-slo: needs --rate")
    code, _, err = run(capsys, "search", wl, "--profile", profile, "--out", out, "--rate", "0")
    assert code == 2 and "--rate: 0 must be a finite number > 0" in err
    code, _, err = run(capsys, "search", wl, "--profile", profile, "--out", out, "--rate", "5",
                       "--load-iterations", "0")
    assert code == 2 and "--load-iterations" in err
    assert not out.exists()
