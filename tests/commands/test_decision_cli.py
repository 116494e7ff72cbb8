"""`cgtune tune` on the shipped DFlash workload with a synthetic GPU-scale profile (tests/handmade_profiles.py, the
shape of benchmarks/bench_search.py's generator, with seeded timing samples: made-up numbers, a fixture, never a
measurement): the compact list and the saving's interval in summary.json and report.md, held to the cost model; the
--tolerance flag; `search` naming the command that writes the report; `status` saying which list ships and why."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ helpers (import-mode=importlib)
from handmade_profiles import gpu_scale_profile, handmade_profile, handmade_spec, with_timing  # noqa: E402

from tuner.cli import main  # noqa: E402
from tuner.model.capture_time import predicted_capture_s  # noqa: E402
from tuner.profile.table import read_profile  # noqa: E402
from tuner.decision.run_dir import load_run  # noqa: E402
from tuner.search.compact import choose_compact, counted_bytes  # noqa: E402
from tuner.search.saving_interval import saving_interval  # noqa: E402
from tuner.workload.spec import load_workload  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DFLASH = ROOT / "workloads" / "dflash-llama-3.1-8b.yaml"  # V2, DFlash K = 16 (q 17), 128 seqs, one H200
GIB = 1 << 30


def noisy(csv: Path, *, spread: float = 0.02, n: int = 15, seed: int = 3) -> Path:
    """The profile with seeded timing samples (relative spread `spread`) for every eager and full reading."""
    rng = np.random.default_rng(seed)
    samples = {(r.mode, r.num_tokens): list(r.latency_ms * (1 + spread * rng.standard_normal(n)))
               for r in read_profile(csv).rows if r.mode in ("eager", "full") and r.status == "ok"}
    return with_timing(csv, samples=samples)


@pytest.fixture(scope="module")
def dflash_tune(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dflash")
    profile = noisy(gpu_scale_profile(tmp / "profile", DFLASH))
    out = tmp / "run"
    code, stdout, err = run(["tune", DFLASH, "--profile", profile, "--out", out, "--trials", 4, "--no-progress"])
    assert code == 0, err
    return out, stdout


@pytest.mark.slow
def test_dflash_summary_holds_the_compact_list_shaped_like_tuned_and_every_list_its_capture_time(dflash_tune):
    out, _ = dflash_tune
    data = json.loads((out / "summary.json").read_text())
    model, search = load_run(out)
    assert data["tolerance"] == 0.01
    assert set(data["compact"]) == set(data["tuned"])  # the same figures, the same keys
    for name in ("default", "tuned", "compact", "exact", "widest", "sglang", "ideal"):
        e = model.evaluate(data[name]["capture_sizes"])
        assert data[name]["num_graphs"] == len(e.capture_sizes)
        assert data[name]["capture_s"] == pytest.approx(predicted_capture_s(model, e.runs_as))
        assert data[name]["capture_s"] == pytest.approx(0.01 * len(model.graph_costs(e.runs_as)))  # 0.01 s each
    # The compact list under the cost model: recomputed from the run's own copies as the search chose it (against
    # its exact answer and lists), the same list and figures.
    choice = choose_compact(model, 0.01, known=[search.chosen, search.study_best, search.exact.best],
                            fastest=search.exact)
    c = choice.evaluation
    assert data["compact"]["capture_sizes"] == list(c.capture_sizes)
    assert data["compact"]["expected_step_ms"] == c.expected_step_ms
    assert data["compact"]["vllm_graph_estimate_bytes"] == c.graph_estimate_bytes == counted_bytes(model, c)
    assert data["compact"]["graph_memory_bytes"] == c.graph_memory_bytes
    fastest = min(data["tuned"]["expected_step_ms"], data["exact"]["expected_step_ms"])
    assert data["compact_choice"]["fastest_ms"] == pytest.approx(fastest)
    assert c.expected_step_ms <= fastest * 1.01 + 1e-12 and c.feasible
    # DFlash on H200 scale: the tuned list's estimate is the price of its last fraction of a percent.
    share = 1 - c.graph_estimate_bytes / data["tuned"]["vllm_graph_estimate_bytes"]
    assert data["compact_choice"]["saved_share"] == pytest.approx(share)
    assert data["compact_choice"]["recommended"] == (share >= 0.25) is True
    assert data["compact"]["num_graphs"] < data["tuned"]["num_graphs"]
    assert data["compact"]["capture_s"] < data["tuned"]["capture_s"]
    # Memory rounded to units at this scale: not proven the least, but a floor below it is, and recorded.
    floor = data["compact_choice"]["floor_bytes"]
    assert data["compact_choice"]["proven"] is False and choice.floor_bytes == floor
    assert 0.9 * c.graph_estimate_bytes < floor <= c.graph_estimate_bytes


@pytest.mark.slow
def test_dflash_saving_interval_is_the_seeded_bootstrap_on_the_profiles_samples(dflash_tune):
    out, stdout = dflash_tune
    data = json.loads((out / "summary.json").read_text())
    model, _ = load_run(out)
    iv = saving_interval(model, data["default"]["capture_sizes"], data["tuned"]["capture_sizes"])
    assert data["saving_interval_ms"] == [iv.low_ms, iv.high_ms]
    point = data["default"]["expected_step_ms"] - data["tuned"]["expected_step_ms"]
    assert data["saving_interval"]["point_ms"] == pytest.approx(point)
    assert iv.low_ms < point < iv.high_ms and not data["saving_interval"]["includes_zero"]
    assert data["saving_interval"]["readings_from_samples"] == sum(
        1 for r in model.profile.rows if r.mode in ("eager", "full") and r.status == "ok")
    assert f"95% bootstrap interval [{iv.low_ms:+.4f}, {iv.high_ms:+.4f}] ms" in stdout


@pytest.mark.slow
def test_dflash_report_shows_both_lists_recommends_the_compact_one_and_the_drafters_share(dflash_tune):
    out, stdout = dflash_tune
    data = json.loads((out / "summary.json").read_text())
    report = (out / "report.md").read_text()
    lo, hi = data["saving_interval_ms"]
    assert f"bootstrap interval **[{lo:+.4f}, {hi:+.4f}] ms**" in report and "includes 0" not in report
    t, c = data["tuned"], data["compact"]
    for name, e in (("tuned", t), ("compact", c)):
        assert (f"| {name} | {e['num_graphs']} | {e['expected_step_ms']:.4f} | "
                f"{e['vllm_graph_estimate_bytes'] / GIB:.3f} GiB | {e['graph_memory_bytes'] / GIB:.3f} GiB | "
                f"{e['kv_available_bytes'] / GIB:.3f} GiB | {e['capture_s']:.1f} s |") in report
    assert "**Recommended: the compact list.**" in report and "RECOMMENDED" in stdout
    floor = data["compact_choice"]["floor_bytes"]
    assert (f"not proven the least: proven, no list within the tolerance counts less than {floor / GIB:.3f} GiB "
            f"({1 - floor / c['vllm_graph_estimate_bytes']:.1%} below it)") in report
    assert f"`{c['capture_sizes']}`" in report
    # No graphs at all: the drafter's eager passes included (the empty list under the cost model).
    model, _ = load_run(out)
    empty = model.evaluate(())
    assert data["no_graphs_step_ms"] == empty.expected_step_ms > model.eager_step_ms() and empty.drafter_step_ms > 0
    assert (f"No graphs at all: {empty.expected_step_ms:.4f} ms per step ({model.eager_step_ms():.4f} ms target + "
            f"{empty.drafter_step_ms:.4f} ms drafter).") in report
    # The per-width table lists only widths saving at least 0.1% of the step; one line sums the rest.
    rows = data["what_changed"]["above_default_max"]
    listed = [r for r in rows if r["saved_ms"] >= 0.001 * t["expected_step_ms"]]
    assert len(listed) < len(rows)
    assert sum(f"\n| {r['num_tokens']} | " in report for r in rows) == len(listed)
    assert f"| {len(rows) - len(listed)} more, each saving less than 0.1% (" in report


def test_tolerance_is_recorded_and_a_rerender_keeps_the_compact_choice(tmp_path):
    wl, profile = small_inputs(tmp_path)
    out = tmp_path / "run"
    code, stdout, err = run(["search", wl, "--profile", profile, "--out", out, "--trials", 3, "--no-progress",
                             "--tolerance", "0.2"])
    assert code == 0, err
    search = json.loads((out / "search.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    assert search["compact"]["tolerance"] == summary["tolerance"] == 0.2
    assert summary["compact"]["capture_sizes"] == search["compact"]["capture_sizes"]
    # `search` writes no report.md and names the one command that does.
    assert not (out / "report.md").exists() and f"report.md and plots: cgtune report {out}" in stdout
    assert run(["report", out])[0] == 0
    again = json.loads((out / "summary.json").read_text())
    assert again["tolerance"] == 0.2 and again["compact"] == summary["compact"]
    assert json.loads((out / "search.json").read_text())["compact"] == search["compact"]
    assert "within 20.0% of the fastest" in (out / "report.md").read_text()


@pytest.mark.parametrize("value", ["2", "-0.01", "nan", "x"])
def test_a_bad_tolerance_is_one_line_exit_2_and_nothing_written(tmp_path, value):
    wl, profile = small_inputs(tmp_path)
    out = tmp_path / "run"
    code, stdout, err = run(["tune", wl, "--profile", profile, "--out", out, "--tolerance", value, "--no-progress"])
    assert code == 2 and not out.exists()
    [line] = err.strip().splitlines()[-1:]
    assert "--tolerance" in line and value.lstrip("-") in line


def test_status_says_which_list_ships_and_why(tmp_path):
    wl, profile = small_inputs(tmp_path)
    out = tmp_path / "run"
    # One trial: the study holds only vLLM's default, more than 1% slower than the exact optimum, so the exact list
    # ships.
    assert run(["search", wl, "--profile", profile, "--out", out, "--trials", 1, "--no-progress"])[0] == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["source"] == "exact" and summary["study"]["gap_to_exact"] > 0.01
    url = f"sqlite:///{out / 'study.db'}"
    code, stdout, _ = run(["status", "--storage", url])
    assert code == 0
    # The lists in the engine's words (vLLM 0.33: graphs and the widest).
    sizes = summary["capture_sizes"]
    assert (f"  tuned: the exact solver's list, {len(sizes)} graphs, max {sizes[-1]}, not the study's best above "
            f"({out / 'summary.json'}): The exact solver's answer is used: the study's best was not within 1% of it "
            f"({summary['study']['gap_to_exact']:.2%} slower).") in stdout
    # And which list the run's files carry (issue 29: the recommendation is deployed, not only printed).
    shipped = summary["shipped"]
    assert (f"  ships: the compact list, {len(shipped['capture_sizes'])} graphs, max {shipped['capture_sizes'][-1]}, "
            f"in the run's files: {shipped['why']}"
            if shipped["list"] == "compact" else f"  ships: the tuned list in the run's files: {shipped['why']}"
            ) in stdout
    code, stdout, _ = run(["status", "--storage", url, "--json"])
    [study] = json.loads(stdout)["studies"]
    assert study["ships"]["source"] == "exact" and study["ships"]["num_graphs"] == len(summary["capture_sizes"])
    # A storage with no run directory beside it: the rule, not a guess.
    (out / "summary.json").unlink()
    code, stdout, _ = run(["status", "--storage", url])
    assert code == 0 and "  ships: decided when `cgtune search`/`tune` writes the run directory" in stdout


def small_inputs(tmp_path: Path) -> tuple[Path, Path]:
    """A tiny vLLM workload (q 4, 8 seqs, mixed steps) and its hand-made profile, written as a command reads them."""
    import yaml

    spec = handmade_spec(name="small", max_num_seqs=8, num_speculative_tokens=3, max_num_batched_tokens=64,
                         traffic={"requests": {"kind": "uniform", "min": 1, "max": 8}, "mixed_share": 0.2,
                                  "mixed_tokens": {"kind": "uniform", "min": 1, "max": 64}})
    wl = tmp_path / "small.yaml"
    wl.write_text(yaml.safe_dump(spec))
    profile = handmade_profile(tmp_path / "profiles", load_workload(wl), list(range(1, 65)),
                               eager_ms=lambda w: 3.0 + 0.01 * w, full_ms=lambda w: 0.5 + 0.01 * w)
    return wl, profile


def run(argv: list[object]) -> tuple[int, str, str]:
    """`cgtune ARGV` in-process: (exit code, stdout, stderr); usable in a module fixture, where capsys is not."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()
