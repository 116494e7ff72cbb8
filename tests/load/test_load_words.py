"""The `--rate` words (issue 50): each list's state at the rate as the cliff rule found it (one settled point, TWO
operating points, or not settled: a backlog still being worked off, never called a cliff), and a WARNING, on the
console and in bold in report.md, wherever the list the files carry does not serve the load as asked (a cliff or no
settled point at the rate, a start falling behind, a TPOT p99 above --tpot-slo, a held rate below --rate). The facts
are hand-written records (what summary.json holds), not simulations."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tuner.decision.load_facts import LoadFacts
from tuner.report.load import load_console_lines, load_lines, shipped_warning

MODEL = SimpleNamespace(engine=SimpleNamespace(list_label=lambda name: {"default": "vLLM default"}.get(name, name)))


def _start(p99: float, keeps_up: bool = True) -> dict:
    return {"mean_step_width": 100.0, "tpot_p50_ms": p99 / 2, "tpot_p99_ms": p99, "ttft_p99_ms": 50.0,
            "throughput_tok_s": 1000.0, "mean_queue_len": 0.0, "keeps_up": keeps_up, "uniform_share": 0.9}


def _point(p99: float, *, cliff: bool = False, settled: bool = True, keeps_up: bool = True) -> dict:
    why = ("two operating points (empty vs saturated start): mean step width 100 vs 200" if cliff else
           "not settled: the saturated start was still working off its backlog in a 120 s run" if not settled else
           "one operating point: mean step width and TPOT p50 within 10%, both starts keep up")
    return {"capture_sizes": [1, 2], "cliff": cliff, "settled": settled, "why": why, "tpot_p99_ms": p99,
            "empty": _start(p99), "saturated": _start(p99, keeps_up)}


def _facts(at_rate: dict, stable: dict | None = None, slo: float | None = 40.0) -> LoadFacts:
    search = {"rate_per_s": 12.0, "duration_s": 30.0, "why": "converged", "chosen": 0,
              "iterations": [{"index": 0, "capture_sizes": [1, 2], "added": [], "removed": [],
                              "mean_step_width": 100.0, "tpot_p99_ms": 3.9, "cliff": False}]}
    load = {"prompt_tokens": {"min": 256, "max": 2048}, "output_tokens": {"min": 1024, "max": 1024},
            "acceptance": 6.5, "seed": 0}
    held = stable if stable is not None else {name: {"rate_per_s": 60.0, "capped": False, "bracket": [1.0, 80.0],
                                                     "precision": 0.05, "probes": []} for name in at_rate}
    return LoadFacts(search, load, slo, at_rate, {}, held)


def test_a_list_that_holds_the_rate_is_said_to_and_no_warning_is_raised() -> None:
    facts = _facts({"default": _point(3.9), "tuned": _point(3.9), "compact": _point(3.9)})
    lines = load_console_lines(MODEL, facts, "compact")
    assert lines[1] == "under the load at 12 req/s: tuned TPOT p99 3.900 ms; holds 60 req/s at TPOT p99 <= 40 ms"
    assert not any("TWO" in line or "WARNING" in line or "not settled" in line for line in lines)
    assert shipped_warning(facts, "compact") is None
    assert not any("Warning" in line for line in load_lines(MODEL, facts, "compact"))


def test_a_backlog_still_worked_off_is_not_called_a_cliff_and_the_shipped_list_is_warned_of() -> None:
    facts = _facts({"default": _point(3.9), "tuned": _point(3.9, settled=False), "compact": _point(3.9)})
    lines = load_console_lines(MODEL, facts, "tuned")
    tuned = next(line for line in lines if ": tuned TPOT" in line)
    assert "(not settled: the saturated start was still working off its backlog)" in tuned and "TWO" not in tuned
    assert lines[-1] == ("WARNING: the shipped (tuned) list does not serve the load as asked: at 12 req/s it has not "
                         "settled: the saturated start was still working off its backlog (see report.md, Under the "
                         "load)")
    report = "\n".join(load_lines(MODEL, facts, "tuned"))
    assert "- tuned: not settled: the saturated start was still working off its backlog in a 120 s run." in report
    assert "- No list compared has two operating points at 12 requests/s." in report
    assert "**Warning: the shipped (tuned) list does not serve the load as asked: at 12 req/s it has not settled" \
        in report


@pytest.mark.parametrize(("point", "held", "said"), [
    (_point(3.9, cliff=True), 60.0, "at 12 req/s it has TWO operating points: a cliff"),
    (_point(3.9, keeps_up=False), 60.0, "at 12 req/s a start falls behind (its waiting queue grows)"),
    (_point(55.0), 60.0, "its TPOT p99 at 12 req/s, 55.000 ms, is above the 40 ms target"),
    (_point(3.9), 8.5, "it holds 8.5 req/s at most, below the 12 asked"),
    (_point(3.9), None, "it holds no rate in the bracket searched"),
])
def test_each_way_the_shipped_list_fails_the_load_is_a_warning_naming_it(point: dict, held: float | None,
                                                                         said: str) -> None:
    stable = {"compact": {"rate_per_s": held, "capped": False, "bracket": [1.0, 80.0], "precision": 0.05,
                          "probes": []}}
    facts = _facts({"tuned": _point(3.9), "compact": point}, stable)
    warning = shipped_warning(facts, "compact")
    assert warning == f"the shipped (compact) list does not serve the load as asked: {said}"
    assert shipped_warning(facts, "tuned") is None  # the other list serves it: no warning when it ships
    cliff_said = [line for line in load_console_lines(MODEL, facts, "compact") if "TWO operating points" in line]
    assert len(cliff_said) == (2 if point["cliff"] else 0)  # its own line and the warning, only for a cliff
