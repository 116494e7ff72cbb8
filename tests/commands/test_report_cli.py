"""The CLI side of the report: `search`/`tune` flags that change the cost model (--off-peak-weight, --allow-mismatch,
--allow-noisy), the printed summary (vLLM's estimate beside the real pool, KV in GiB and tokens, the list that runs),
and `report`/`validate` re-using the settings a run recorded. Hand-made profiles: test fixtures, never measurements."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ helpers (import-mode=importlib)
from handmade_profiles import MIB, handmade_spec, mixed_traffic, write_handmade_inputs  # noqa: E402
from cli_runner import run  # noqa: E402


SPEC = handmade_spec(name="flags-hand", max_num_seqs=24, num_speculative_tokens=1, max_num_batched_tokens=64,
                     traffic=mixed_traffic(24, 64))
PEAK = handmade_spec(name="peak-cli", max_num_seqs=32, max_num_batched_tokens=32,
                     traffic={"requests": {"kind": "uniform", "min": 28, "max": 32}})
"""q = 1 and only 28..32-request decode steps: small widths matter off-peak alone. With 181 MiB of device memory the
estimate leaves room for three sizes (a 2 MiB PIECEWISE and a 2 MiB FULL graph each)."""


def edit_metadata(profile: Path, **changes) -> None:
    meta_path = profile.with_suffix(".json")
    meta = json.loads(meta_path.read_text())
    meta.update(changes)
    meta_path.write_text(json.dumps(meta))


@pytest.fixture()
def inputs(tmp_path):
    return write_handmade_inputs(tmp_path, SPEC, list(range(1, 65)), total_memory_bytes=400 * MIB,
                                 standalone_bytes=lambda w: 2 * w * MIB, delta_bytes=lambda w: 2 * MIB)


@pytest.fixture()
def peak(tmp_path):
    folder = tmp_path / "peak"
    folder.mkdir()
    return write_handmade_inputs(folder, PEAK, list(range(1, 33)), total_memory_bytes=181 * MIB,
                                 standalone_bytes=lambda w: 2 * MIB, delta_bytes=lambda w: 2 * MIB)


def search(capsys, wl, profile, out, *extra, command="search", trials=6):
    return run(capsys, command, wl, "--profile", profile, "--out", out, "--trials", trials, "--no-progress", *extra)


# ---------------------------------------------------------------------------------------------- --off-peak-weight
def test_off_peak_weight_changes_the_chosen_list_and_the_run_remembers_it(peak, tmp_path, capsys):
    wl, profile, _ = peak
    code, stdout, err = search(capsys, wl, profile, tmp_path / "w0", trials=12)
    assert code == 0, err
    quiet = json.loads((tmp_path / "w0/compilation_config.json").read_text())["cudagraph_capture_sizes"]
    assert quiet[0] >= 28  # graphs only where the workload's 28..32-request steps are
    # Off-peak, a one-request step pads to the 28-token graph: slower than vLLM's default there.
    assert "WARNING: off-peak (1..32 requests, uniform) the tuned list is slower" in stdout

    code, stdout, err = search(capsys, wl, profile, tmp_path / "w5", "--off-peak-weight", 0.5, trials=12)
    assert code == 0, err
    mixed = json.loads((tmp_path / "w5/compilation_config.json").read_text())["cudagraph_capture_sizes"]
    assert mixed[0] < 28 and len(mixed) <= 3  # a graph for the small off-peak steps, within the same memory
    data = json.loads((tmp_path / "w5/summary.json").read_text())
    assert data["cost_model"]["off_peak_weight"] == 0.5 and "-offpeak0.5-" in data["study"]["name"]
    assert data["off_peak"]["tuned_step_ms"] < json.loads((tmp_path / "w0/summary.json").read_text())[
        "off_peak"]["tuned_step_ms"]

    # `cgtune report` re-renders under the weight the search used: same figures, and the report says so.
    code, _, err = run(capsys, "report", tmp_path / "w5")
    assert code == 0, err
    again = json.loads((tmp_path / "w5/summary.json").read_text())
    assert again["tuned"]["expected_step_ms"] == data["tuned"]["expected_step_ms"]
    assert "This search weighed 50% off-peak traffic into its objective (`--off-peak-weight 0.5`)." in (
        tmp_path / "w5/report.md").read_text()


@pytest.mark.parametrize("value, message", [("1.5", "1.5 must be in 0..1"), ("-0.1", "-0.1 must be in 0..1"),
                                            ("x", "'x' is not a number"), ("nan", "nan must be in 0..1")])
def test_a_bad_off_peak_weight_is_one_line(inputs, tmp_path, capsys, value, message):
    wl, profile, _ = inputs
    code, _, err = search(capsys, wl, profile, tmp_path / "bad", "--off-peak-weight", value)
    assert code == 2 and "--off-peak-weight" in err and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "bad").exists()


def test_fleet_workers_weigh_trials_with_the_coordinators_settings(inputs, tmp_path, capsys):
    import optuna

    from tuner.search.workers import FLEET_ATTR, FleetSpec, fleet_model

    wl, profile, _ = inputs
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    code, out, err = search(capsys, wl, profile, tmp_path / "fleet", "--workers", 0, "--off-peak-weight", 0.2,
                            "--allow-mismatch", "--allow-outliers", "--max-capture-seconds", 30, "--max-graphs", 200,
                            "--storage", url, command="tune")
    assert code == 0, err
    name = out.split("fleet study ", 1)[1].split()[0]
    spec = FleetSpec.from_dict(optuna.load_study(study_name=name, storage=url).user_attrs[FLEET_ATTR])
    assert spec.model_settings == {"off_peak_weight": 0.2, "allow_mismatch": True, "allow_outliers": True,
                                   "piecewise_fallback": "eager", "load_steps": None, "max_capture_s": 30.0,
                                   "max_graphs": 200}
    with fleet_model(spec) as model:  # what every worker rebuilds
        assert model.off_peak_weight == 0.2 and model.allow_mismatch and model.allow_outliers
        assert (model.max_capture_s, model.max_graphs) == (30.0, 200)  # the start-up budget reaches the workers


# ---------------------------------------------------------------------------------------------- noise
@pytest.mark.parametrize("flagged, refused", [(16, False), (17, True)])
def test_search_refuses_a_profile_with_more_than_a_quarter_noisy_decision_widths(inputs, tmp_path, capsys,
                                                                                 flagged, refused):
    wl, profile, _ = inputs
    edit_metadata(profile, noisy_widths=list(range(1, flagged + 1)))  # the 64 widths 1..64 are the decision's
    out = tmp_path / "run"
    code, stdout, err = search(capsys, wl, profile, out)
    if refused:  # 17 / 64 = 27% > 25%
        assert code == 2 and len(err.strip().splitlines()) == 1
        assert "17 of the 64 widths the decision rests on (27%, more than 25%) were flagged noisy" in err
        assert "--allow-noisy" in err and not out.exists()
        code, stdout, err = search(capsys, wl, profile, out, "--allow-noisy")
    assert code == 0, err
    assert f"noisy timings: {flagged} of the 64 decision widths ({flagged / 64:.0%}) were flagged" in stdout
    noise = json.loads((out / "summary.json").read_text())["noisy_widths"]
    assert noise["count"] == flagged and noise["decision_widths"] == 64 and noise["share"] == flagged / 64


def test_tune_refuses_noisy_too_and_the_report_counts_them(inputs, tmp_path, capsys):
    wl, profile, _ = inputs
    edit_metadata(profile, noisy_widths=list(range(1, 33)))
    code, _, err = search(capsys, wl, profile, tmp_path / "t", command="tune")
    assert code == 2 and "32 of the 64 widths the decision rests on (50%" in err and not (tmp_path / "t").exists()
    code, _, err = search(capsys, wl, profile, tmp_path / "t", "--allow-noisy", command="tune")
    assert code == 0, err
    report = (tmp_path / "t/report.md").read_text()
    assert "- timing noise: 32 of the 64 widths the decision rests on (50%) are flagged noisy" in report
    assert "more than a quarter" in report


# ---------------------------------------------------------------------------------------------- --allow-mismatch
def test_allow_mismatch_on_search_tune_and_report(inputs, tmp_path, capsys):
    wl, profile, _ = inputs
    edit_metadata(profile, decode_query_len=5)  # the workload's q is 2
    code, _, err = search(capsys, wl, profile, tmp_path / "no")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "decode_query_len=5" in err and "pass --allow-mismatch" in err and not (tmp_path / "no").exists()

    out = tmp_path / "yes"
    code, _, err = search(capsys, wl, profile, out, "--allow-mismatch", command="tune")
    assert code == 0, err
    report = (out / "report.md").read_text()
    assert "allowed mismatch: hand.csv: measured with decode_query_len=5" in report
    assert json.loads((out / "summary.json").read_text())["cost_model"]["allow_mismatch"] is True
    # Re-rendering uses the recorded setting, with or without the flag.
    assert run(capsys, "report", out)[0] == 0
    assert run(capsys, "report", out, "--allow-mismatch")[0] == 0

    # A run directory that does not record it (as written before this setting was recorded) needs the flag.
    data = json.loads((out / "summary.json").read_text())
    del data["cost_model"]
    (out / "summary.json").write_text(json.dumps(data))
    code, _, err = run(capsys, "report", out)
    assert code == 2 and "pass --allow-mismatch" in err
    code, _, err = run(capsys, "report", out, "--allow-mismatch")
    assert code == 0, err
    assert json.loads((out / "summary.json").read_text())["cost_model"]["allow_mismatch"] is True


@pytest.fixture()
def scripted(monkeypatch, gpu_host_without_vllm):
    """Stand-in for the GPU: the scripted backend of tests/test_validate.py (its numbers are fixtures)."""
    import tuner.validate.validation
    from test_validate import ScriptedBackend

    monkeypatch.setattr(tuner.validate.validation, "require_cuda", lambda: "cpu")
    monkeypatch.setattr(tuner.validate.validation, "build_backend",
                        lambda model, lists, device, **kw: ScriptedBackend(model))


def test_validate_uses_the_recorded_mismatch_setting_or_the_flag(inputs, tmp_path, capsys, scripted):
    wl, profile, _ = inputs
    edit_metadata(profile, decode_query_len=5)
    out = tmp_path / "run"
    assert search(capsys, wl, profile, out, "--allow-mismatch")[0] == 0
    code, _, err = run(capsys, "validate", out, "--steps", 200)
    assert code == 0, err

    data = json.loads((out / "summary.json").read_text())
    del data["cost_model"]  # an older run directory
    (out / "summary.json").write_text(json.dumps(data))
    code, _, err = run(capsys, "validate", out, "--steps", 200)
    assert code == 2 and "pass --allow-mismatch" in err
    code, _, err = run(capsys, "validate", out, "--steps", 200, "--allow-mismatch")
    assert code == 0, err
    assert json.loads((out / "summary.json").read_text())["cost_model"]["allow_mismatch"] is True
    assert json.loads((out / "validation.json").read_text())["command"].endswith("--allow-mismatch")

    # The GPU box's path (no optuna: the exact solver writes RUN_DIR) takes the setting too.
    code, _, err = run(capsys, "validate", tmp_path / "fresh", "--workload", wl, "--profile", profile, "--steps", 200)
    assert code == 2 and "pass --allow-mismatch" in err and not (tmp_path / "fresh").exists()
    code, _, err = run(capsys, "validate", tmp_path / "fresh", "--workload", wl, "--profile", profile, "--steps", 200,
                       "--allow-mismatch")
    assert code == 0, err
    assert json.loads((tmp_path / "fresh" / "summary.json").read_text())["cost_model"]["allow_mismatch"] is True


# ---------------------------------------------------------------------------------------------- printed summary
def test_printed_summary_agrees_with_summary_json_on_estimate_pool_and_kv(inputs, tmp_path, capsys):
    """A consistency check: the printed lines carry the run's own summary.json figures (the figures themselves are
    held to hand values in the cost-model tests), plus the KV figures of vLLM's default list by hand."""
    wl, profile, _ = inputs
    out = tmp_path / "run"
    code, stdout, err = search(capsys, wl, profile, out)
    assert code == 0, err
    s = json.loads((out / "summary.json").read_text())
    t, d = s["tuned"], s["default"]
    gib = 1 << 30
    assert (f"graph memory: vLLM estimate {t['vllm_graph_estimate_bytes'] / gib:.3f} GiB (default "
            f"{d['vllm_graph_estimate_bytes'] / gib:.3f}), real pool {t['graph_memory_bytes'] / gib:.3f} GiB (default "
            f"{d['graph_memory_bytes'] / gib:.3f})") in stdout
    assert (f"KV cache {t['kv_available_bytes'] / gib:.3f} GiB = {t['kv_tokens']:,} tokens, max concurrency "
            f"{t['max_concurrency']:.2f}x (default {d['kv_available_bytes'] / gib:.3f} GiB = {d['kv_tokens']:,} "
            f"tokens)") in stdout
    assert t["kv_tokens"] == t["kv_available_bytes"] // (16 * 512) * 16 and "runs as another list" not in stdout
    # vLLM's default by hand (facts file, V2): 1, 2, 4, 8, 16..64 by 8 is 11 PIECEWISE graphs and FULL windows 2, 4,
    # 8, 16, 24, 32, 40, 48 (up to 24 requests x q 2), 19 graphs; PIECEWISE 64 alone 128 MiB + 18 x 2 = 164 MiB. The
    # estimate counts PIECEWISE in full and the 8 FULL as 2 + 7 x max(2, 1) MiB: 164 MiB too. KV = ceil(400 MiB x 0.9)
    # - non-KV (100 weights + 50 activations) - 164 = 46 MiB = 0.045 GiB, 46 MiB / 512 B per token = 94,208 tokens.
    assert (d["vllm_graph_estimate_bytes"], d["graph_memory_bytes"], d["kv_available_bytes"]) == (164 * MIB,) * 2 + (
        46 * MIB,)
    assert "(default 0.160), real pool" in stdout and "(default 0.045 GiB = 94,208 tokens)" in stdout


def test_printed_summary_says_when_the_tuned_list_runs_as_another(tmp_path, capsys):
    from tuner.commands.search import _print_summary
    from tuner.decision.record import decide
    from tuner.search.exact import ExactResult
    from tuner.model.costmodel import CostModel
    from tuner.search.study import SearchResult

    spec = handmade_spec(name="suffix-print", max_num_seqs=16, num_speculative_tokens=2, max_num_batched_tokens=64)
    spec["speculative"] = {"method": "suffix"}  # V1 rewrites an explicit list when speculating
    _, profile, workload = write_handmade_inputs(tmp_path, spec, list(range(1, 65)), total_memory_bytes=1000 * MIB)
    model = CostModel.from_files(profile, workload)
    chosen, default = model.evaluate((1, 2, 4, 8, 16, 24)), model.evaluate(model.default_sizes)  # hand-picked
    result = SearchResult(chosen, "exact", ExactResult(chosen, [chosen], MIB, True, 0), None, default, "none",
                          "none", "latency", {}, [], [])
    _print_summary(decide(model, result), [], tmp_path, model)
    stdout = capsys.readouterr().out
    assert "tuned list (exact solver; see the notes in summary.json): 6 graphs, max 24" in stdout
    assert "it runs as another list: the V1 runner rewrites it to 5 graphs (multiples of q = 3): [3, 6, 9, 18, 24]" \
        in stdout


# ---------------------------------------------------------------------------------------------- re-render
def test_report_re_renders_report_md_and_summary_json_byte_identical(inputs, tmp_path, capsys, monkeypatch):
    # A run re-rendered from its own files says the same, to the byte, and decides nothing again: the decision is
    # read from summary.json (no bootstrap, no compact solve, no per-width re-evaluation); a decision that moved on
    # re-render (or a provenance line that did) would show here.
    import tuner.decision.record as record

    wl, profile, _ = inputs
    out = tmp_path / "run"
    code, _, err = search(capsys, wl, profile, out, command="tune")
    assert code == 0, err
    first = {name: (out / name).read_bytes() for name in ("report.md", "summary.json", "search.json")}

    def decided(*a, **k):
        raise AssertionError("cgtune report decided again")

    with monkeypatch.context() as m:
        for name in ("decide", "saving_interval", "what_changed", "off_peak", "compact_of"):
            m.setattr(record, name, decided)
        code, _, err = run(capsys, "report", out)
    assert code == 0, err
    for name, data in first.items():
        assert (out / name).read_bytes() == data, f"{name} changed on re-render"

    # The record keeps the seconds each stage took when it was made; a re-render that decides nothing keeps them.
    timings = json.loads(first["summary.json"])["timings"]
    assert {"exact_s", "study_s", "compact_s", "compare_s", "what_changed_s", "off_peak_s", "interval_s"} <= set(timings)
    assert all(v >= 0 for v in timings.values())

    # A summary older than a field is decided anew (the interval drawn again from its seed): the same report, the
    # same summary but for the decision's own seconds, which are the new decision's.
    data = json.loads(first["summary.json"])
    del data["off_peak"]
    (out / "summary.json").write_text(json.dumps(data))
    code, _, err = run(capsys, "report", out)
    assert code == 0, err
    assert (out / "report.md").read_bytes() == first["report.md"]
    again = json.loads((out / "summary.json").read_text())
    assert {k: v for k, v in again.items() if k != "timings"} == {
        k: v for k, v in json.loads(first["summary.json"]).items() if k != "timings"}
    assert {k: again["timings"][k] for k in ("exact_s", "study_s", "compact_s")} == {
        k: timings[k] for k in ("exact_s", "study_s", "compact_s")}  # the search's, read back from search.json
