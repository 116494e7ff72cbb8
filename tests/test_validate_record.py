"""What validation.json, its report section and the log say, held to hand values: the device readings each list
carries, the device-mismatch warning, the record's provenance, and what validate_run and validate_candidates pass on
(seed, command, progress, the trace's accounting, the study's model-only trials). Scripted devices (test fixtures,
never measurements), as in test_validate.py, whose helpers these tests reuse."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # test_validate.py's fixtures (import-mode=importlib)
from handmade_profiles import MIB, handmade_profile, handmade_workload  # noqa: E402
from test_validate import (  # noqa: E402
    FIXTURE_DEVICE,
    MIXED_TRAFFIC,
    DeviceScript,
    ScriptedBackend,
    _model,
    _run_dir,
)

from tuner.model.costmodel import CostModel  # noqa: E402
from tuner.report.validation import render_section  # noqa: E402
from tuner.validate.backend import CaptureResult  # noqa: E402
from tuner.validate.trace import plan_trace, predicted_trace_step_ms, sample_trace  # noqa: E402
from tuner.validate.validation import (  # noqa: E402
    PARTIAL_FILE,
    VALIDATION_FILE,
    ValidationError,
    build_record,
    compare_list,
    top_candidates,
    validate_candidates,
    validate_run,
)

PROFILE_DEVICE = "handmade test fixture (not a measurement)"
"""The device the handmade profile's metadata names."""


class DeviceError(RuntimeError):
    """What a device fault raises mid-validation."""


def _plan(model: CostModel, sizes: tuple[int, ...], steps: int = 200, seed: int = 1):
    return plan_trace(sample_trace(model.workload.steps(), steps, seed), model.engine.dispatcher(sizes))


# ---------------------------------------------------------------------------------------------- build_record
def test_a_profile_from_another_device_is_warned_about_and_the_same_device_is_not(tmp_path):
    model = _model(tmp_path)
    assert model.profile.metadata["device_name"] == PROFILE_DEVICE
    trace = sample_trace(model.workload.steps(), 20, seed=0)
    other = build_record(model, {"device_name": "NVIDIA H200"}, trace, {}, seed=0)
    assert other["warnings"] == [f"profile measured on {PROFILE_DEVICE!r}, validated on 'NVIDIA H200': latency "
                                 f"predictions are for another device"]
    same = build_record(model, {"device_name": PROFILE_DEVICE}, trace, {}, seed=0)
    assert same["warnings"] == [] and same["device_name"] == PROFILE_DEVICE


def test_the_record_keeps_the_device_metadata_its_time_and_goals(tmp_path):
    model = _model(tmp_path)
    meta = {"device_name": FIXTURE_DEVICE, "device": "cuda:0", "clock": "CudaEventClock"}
    before = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    record = build_record(model, meta, sample_trace(model.workload.steps(), 20, seed=0), {}, seed=0)
    after = dt.datetime.now(dt.timezone.utc)
    assert record["device"] == meta
    made = dt.datetime.fromisoformat(record["created_at"])
    assert made.utcoffset() == dt.timedelta(0) and before <= made <= after
    # The documented goals: memory within 5%, latency within 3%; 5% charged on top of an exceeding pool.
    assert record["goals"] == {"memory": 0.05, "latency": 0.03, "margin": 0.05}
    section = render_section(record)
    assert "each timed with CUDA events" in section  # read from the device metadata's clock
    assert f"at {record['created_at']}" in section


def test_an_empty_trace_records_zero_tokens_not_nan(tmp_path):
    # Nothing replayed: a mean over no steps is 0 by the record's rule, a number any JSON reader takes.
    model = _model(tmp_path)
    trace = build_record(model, {"device_name": PROFILE_DEVICE}, [], {}, seed=4)["trace"]
    assert trace == {"steps": 0, "seed": 4, "mean_tokens": 0.0, "uniform_decode_share": 0.0}


def test_no_speedup_is_recorded_over_a_tuned_mean_of_zero(tmp_path):
    # A clock too coarse for the steps reads 0 ms each: a speedup over that is undefined, so it is left out.
    model = _model(tmp_path)
    d, t = model.evaluate(model.default_sizes), model.evaluate((4, 8, 16))
    d_plan, t_plan = _plan(model, d.capture_sizes), _plan(model, t.capture_sizes)
    results = {"default": compare_list(model, "default", d, d_plan, [1.0] * len(d_plan), CaptureResult(86 * MIB)),
               "tuned": compare_list(model, "tuned", t, t_plan, [0.0] * len(t_plan), CaptureResult(42 * MIB))}
    assert results["tuned"].measured_step_ms == 0.0
    record = build_record(model, {"device_name": PROFILE_DEVICE}, [], results, seed=1)
    assert "measured_speedup_tuned_over_default" not in record
    assert "predicted_speedup_tuned_over_default" not in record
    results["tuned"] = compare_list(model, "tuned", t, t_plan, [0.5] * len(t_plan), CaptureResult(42 * MIB))
    record = build_record(model, {"device_name": PROFILE_DEVICE}, [], results, seed=1)
    assert record["measured_speedup_tuned_over_default"] == pytest.approx(2.0)  # 1.0 ms over 0.5 ms


# ---------------------------------------------------------------------------------------------- one list's record
def test_each_lists_record_carries_the_device_readings_and_its_warnings(tmp_path):
    """tuned (4, 8, 16): 6 graphs, predicted pool and V2 estimate 32 + 5 x 2 = 42 MiB (test_validate's hand values).
    Scripted: the pool 50 MiB (NVML 53, reserved 48), the estimate 38 MiB, 1.25 s of capture, 3 MiB left behind."""
    model = _model(tmp_path)
    e = model.evaluate((4, 8, 16))
    plan = _plan(model, e.capture_sizes)
    capture = CaptureResult(50 * MIB, nvml_delta_bytes=53 * MIB, reserved_delta_bytes=48 * MIB, capture_s=1.25)
    r = compare_list(model, "tuned", e, plan, predicted_trace_step_ms(model, plan), capture, residual_bytes=3 * MIB,
                     measured_estimate_bytes=38 * MIB)
    wide = model.evaluate((4, 8, 16, 24))
    oom = compare_list(model, "exact", wide, _plan(model, wide.capture_sizes), [],
                       CaptureResult(None, capture_s=0.5, oom="scripted: CUDA out of memory"))
    record = build_record(model, {"device_name": PROFILE_DEVICE}, [], {"tuned": r, "exact": oom}, seed=1)

    tuned = record["tuned"]
    assert (tuned["measured_graph_bytes"], tuned["nvml_graph_bytes"], tuned["reserved_graph_bytes"]) == (
        50 * MIB, 53 * MIB, 48 * MIB)
    assert (tuned["capture_s"], tuned["residual_bytes"], tuned["oom"]) == (1.25, 3 * MIB, None)
    assert (tuned["predicted_estimate_bytes"], tuned["measured_estimate_bytes"]) == (42 * MIB, 38 * MIB)
    assert tuned["estimate_error"] == pytest.approx(42 / 38 - 1)
    assert tuned["required_kv_bytes"] == model.budget.required_kv_bytes  # the deployment's, as given
    # 50 MiB > 42 x 1.05: charged 52.5 MiB (0.051 GiB), 50 / 42 - 1 = 19.0% over; 42 / 38 - 1 = +10.5% estimate error.
    assert tuned["warnings"] == [
        "tuned: MEASURED GRAPH MEMORY 0.049 GiB EXCEEDS THE PREDICTION 0.041 GiB by 19.0% (margin 5%): the fit "
        "check charges 0.051 GiB",
        "tuned: predicted vLLM estimate 0.041 GiB is +10.5% off the measured 0.037 GiB (goal 5%)"]
    assert tuned["fits"]  # 38 + 100 MiB unrequested - 52.5 charged leaves headroom

    exact = record["exact"]
    assert (exact["oom"], exact["capture_s"], exact["measured_graph_bytes"], exact["fits"]) == (
        "scripted: CUDA out of memory", 0.5, None, False)
    assert exact["warnings"] == ["exact: capture ran out of memory on the device (scripted: CUDA out of memory); "
                                 "this list does not fit and is never emitted"]
    assert record["warnings"] == tuned["warnings"] + exact["warnings"]
    rows = {line.split("|")[1].strip(): line.split("|")[-2].strip() for line in render_section(record).splitlines()
            if line.startswith("| tuned ") or line.startswith("| exact ")}
    assert rows == {"tuned": "yes", "exact": "no: out of memory"}


def test_the_drafters_share_of_the_estimate_is_in_the_record(tmp_path):
    """EAGLE drafter (test_validate's hand-made profile): its graphs, PIECEWISE and FULL at 4, 8, 16, add 0.5 MiB each
    to the pool and, counted in full by the V2 estimate, 6 x 0.5 = 3 MiB to vLLM's estimate: the record keeps both
    shares under the names its drafter note gives them."""
    wl = handmade_workload(num_speculative_tokens=1, max_num_seqs=12, max_num_batched_tokens=32, traffic=MIXED_TRAFFIC,
                           speculative={"method": "eagle"})
    model = CostModel.from_files(handmade_profile(tmp_path / "profile", wl, list(range(1, 33)),
                                                  standalone_bytes=lambda w: 2 * w * MIB), wl)
    e = model.evaluate((4, 8, 16))
    plan = _plan(model, e.capture_sizes)
    r = compare_list(model, "tuned", e, plan, predicted_trace_step_ms(model, plan), CaptureResult(42 * MIB),
                     measured_estimate_bytes=42 * MIB)
    record = build_record(model, {"device_name": PROFILE_DEVICE}, [], {"tuned": r}, seed=0)
    assert (record["tuned"]["drafter_graph_bytes"], record["tuned"]["drafter_estimate_bytes"]) == (3 * MIB, 3 * MIB)
    assert any("its share of vLLM's estimate (drafter_estimate_bytes)" in n for n in record["notes"])


# ---------------------------------------------------------------------------------------------- validate_run
def test_validate_run_records_its_seed_and_command_and_reports_progress(tmp_path):
    run, model, _ = _run_dir(tmp_path)
    said: list[str] = []
    record = validate_run(run, num_steps=200, seed=3, backend=ScriptedBackend(model), command="pytest",
                          progress=said.append)
    on_disk = json.loads((run / VALIDATION_FILE).read_text())
    assert (on_disk["trace"]["seed"], on_disk["command"]) == (record["trace"]["seed"], record["command"]) == (
        3, "pytest")
    assert "made by `pytest`" in (run / "report.md").read_text()
    # default: PIECEWISE 1..32 (7) + FULL 2..24 (5) graphs; tuned 1..24: PIECEWISE 24 + FULL 12 (q = 2).
    assert said == ["default: capturing 12 graphs, max 32", "default: replaying 200 steps",
                    "tuned: capturing 36 graphs, max 24", "tuned: replaying 200 steps"]
    # A library caller's own memory margin is the one the record states (not the module's 5%).
    again = validate_run(run, num_steps=50, seed=3, backend=ScriptedBackend(model), margin=0.2)
    assert again["goals"]["margin"] == 0.2 == json.loads((run / VALIDATION_FILE).read_text())["goals"]["margin"]


def test_validate_run_without_a_directory_names_it(tmp_path):
    missing = tmp_path / "missing"
    with pytest.raises(ValidationError) as caught:
        validate_run(missing)
    assert str(caught.value) == f"run_dir: {str(missing)!r} is not a directory"


def test_validate_run_logs_that_nothing_is_emitted(tmp_path, caplog):
    run, model, _ = _run_dir(tmp_path)
    with caplog.at_level("WARNING", logger="tuner.validate.validation"):
        record = validate_run(run, num_steps=100, backend=ScriptedBackend(model, oom_above=0))
    assert record["emitted"] is None
    assert "TUNED LIST DOES NOT FIT ON THE DEVICE: emitted nothing instead" in caplog.messages


class _EagerBackend(ScriptedBackend):
    """Test fixture: a device without CUDA graphs (the CPU rehearsal), its numbers scripted."""

    device_name = "cpu rehearsal (scripted)"
    graphs_supported = False


def test_a_device_without_graphs_says_its_numbers_are_no_validation(tmp_path):
    run, model, _ = _run_dir(tmp_path)
    record = validate_run(run, num_steps=100, backend=_EagerBackend(model))
    said = ("cpu rehearsal (scripted): no CUDA graphs here, graph steps ran eagerly; these are no validation "
            "numbers")
    assert record["warnings"][-1] == said
    assert json.loads((run / VALIDATION_FILE).read_text())["warnings"][-1] == said


def test_the_backend_is_built_for_the_runs_own_model(tmp_path, monkeypatch):
    import tuner.validate.validation

    run, model, _ = _run_dir(tmp_path)
    built = []

    def build(m, lists, device):  # stands in for the device's model
        built.append((m, device))
        return DeviceScript(m, {}, otherwise=(100 * MIB, 0.5, 0.01))

    monkeypatch.setattr(tuner.validate.validation, "build_backend", build)
    validate_run(run, num_steps=50, device="cpu")
    [(m, device)] = built
    assert device == "cpu" and isinstance(m, CostModel)
    assert (m.workload.name, m.default_sizes) == (model.workload.name, model.default_sizes)


def test_the_library_replays_3000_steps_by_default(tmp_path):
    # The documented default of `cgtune validate --steps` and `tune --validate-steps`, for library callers too.
    run, model, search = _run_dir(tmp_path)
    record = validate_run(run, backend=ScriptedBackend(model))
    assert (record["trace"]["steps"], record["trace"]["sampled"]) == (3000, 3000)
    _, record = validate_candidates(run, model, search, 1, backend=ScriptedBackend(model), record_study=False)
    assert (record["trace"]["steps"], record["trace"]["sampled"]) == (3000, 3000)


def test_validate_run_judges_every_list_with_the_callers_margin_in_the_partial_record_too(tmp_path):
    """default (1..32): 12 graphs, predicted pool and V2 estimate 2 x 32 + 11 x 2 = 86 MiB. Scripted: its pool 95 MiB,
    10.5% over: beyond the module's 5%, within the caller's 20%, so no warning and the fit check charges the 95 MiB
    as measured: headroom = 86 estimate + 100 MiB unrequested - 95 = 91 MiB (5% would charge 99.75 and warn). The
    device faults on the tuned list: the partial record states the 20% the default was judged with."""
    run, model, _ = _run_dir(tmp_path)
    backend = DeviceScript(model, {model.default_sizes: (95 * MIB, 0.6, 0.0117)})
    real_capture = backend.capture

    def capture(graphs):  # default is measured first; the device faults on the tuned list's capture
        if tuple(graphs) != tuple(model.graphs(model.default_sizes)):
            raise DeviceError("CUDA error: an illegal memory access was encountered")
        return real_capture(graphs)

    backend.capture = capture
    with pytest.raises(DeviceError):
        validate_run(run, num_steps=100, backend=backend, margin=0.2)
    partial = json.loads((run / PARTIAL_FILE).read_text())
    assert partial["lists"] == ["default"] and partial["goals"]["margin"] == 0.2
    assert partial["default"]["warnings"] == [] and partial["default"]["capture_headroom_bytes"] == 91 * MIB


def test_validate_run_without_emitting_says_only_that_the_tuned_list_does_not_fit(tmp_path):
    # Every capture runs out of memory: no list fits, so there is none that "would have been emitted" to name.
    run, model, _ = _run_dir(tmp_path)
    record = validate_run(run, num_steps=100, backend=ScriptedBackend(model, oom_above=0), emit=False)
    said = ["--no-emit: the vllm files still hold the tuned list, which does NOT fit by measured memory"]
    assert record["emitted"] is None and record["notes"] == said
    assert json.loads((run / VALIDATION_FILE).read_text())["notes"] == said


# ---------------------------------------------------------------------------------------------- validate_candidates
def test_validate_candidates_builds_the_backend_for_its_own_model(tmp_path, monkeypatch):
    import tuner.validate.validation

    run, model, search = _run_dir(tmp_path)
    built = []

    def build(m, lists, device):  # stands in for the device's model
        built.append((m, device))
        return DeviceScript(m, {}, otherwise=(100 * MIB, 0.5, 0.01))

    monkeypatch.setattr(tuner.validate.validation, "require_cuda", lambda: "cuda:7")
    monkeypatch.setattr(tuner.validate.validation, "build_backend", build)
    validate_candidates(run, model, search, 1, num_steps=50, record_study=False)
    assert built == [(model, "cuda:7")]


def test_validate_candidates_without_a_storage_url_or_a_command(tmp_path):
    """An empty storage URL names no study: nothing to record into (record_study left on), the run goes on. No
    command given: the record says none and the report its own name."""
    run, model, search = _run_dir(tmp_path)
    search = dataclasses.replace(search, storage="")
    _, record = validate_candidates(run, model, search, 1, backend=DeviceScript(model, {}, otherwise=(
        100 * MIB, 0.5, 0.01)), num_steps=50)
    assert record["command"] == "" == json.loads((run / VALIDATION_FILE).read_text())["command"]
    assert "made by `cgtune validate`" in (run / "report.md").read_text()


def test_validate_candidates_records_the_callers_margin_and_command_in_the_partial_record_and_the_last(tmp_path):
    """default: predicted 86 MiB, scripted 95 MiB (10.5% over): within the caller's 20%, no warning, headroom
    86 + 100 - 95 = 91 MiB (test_validate_run_judges_every_list_with_the_callers_margin_in_the_partial_record_too).
    The device faults on the next list; a later run that finishes records the same command."""
    run, model, search = _run_dir(tmp_path)
    backend = DeviceScript(model, {model.default_sizes: (95 * MIB, 0.6, 0.0117)})
    real_capture = backend.capture

    def capture(graphs):  # default is measured first; the device faults on the next list
        if tuple(graphs) != tuple(model.graphs(model.default_sizes)):
            raise DeviceError("CUDA error: an illegal memory access was encountered")
        return real_capture(graphs)

    backend.capture = capture
    with pytest.raises(DeviceError):
        validate_candidates(run, model, search, 2, backend=backend, num_steps=100, margin=0.2, command="pytest",
                            record_study=False)
    partial = json.loads((run / PARTIAL_FILE).read_text())
    assert partial["lists"] == ["default"] and (partial["command"], partial["goals"]["margin"]) == ("pytest", 0.2)
    assert partial["default"]["warnings"] == [] and partial["default"]["capture_headroom_bytes"] == 91 * MIB
    full = DeviceScript(model, {model.default_sizes: (95 * MIB, 0.6, 0.0117)}, otherwise=(100 * MIB, 0.5, 0.01))
    _, record = validate_candidates(run, model, search, 2, backend=full, num_steps=100, margin=0.2, command="pytest",
                                    record_study=False)
    assert (record["command"], record["goals"]["margin"]) == ("pytest", 0.2)
    assert record["default"]["warnings"] == [] and record["default"]["capture_headroom_bytes"] == 91 * MIB
    assert "made by `pytest`" in (run / "report.md").read_text() and not (run / PARTIAL_FILE).exists()


def test_the_models_pick_is_measured_even_outside_the_top_k(tmp_path):
    """k = 1 ranks the exact optimum (1..24) first; the search's pick (2, 6, 12), slower by prediction, is measured
    under its own name. Storage "in-memory" (a study that is gone with its process): nothing to record into."""
    run, model, search = _run_dir(tmp_path)
    pick = model.evaluate((2, 6, 12))
    assert pick.feasible and top_candidates(model, search, 1)[0].capture_sizes == tuple(range(1, 25))
    search = dataclasses.replace(search, chosen=pick, storage="in-memory")
    # Scripted: the pick 60 MiB and 0.35 + 0.01 ms per token; every other list 100 MiB and 0.5 + 0.01.
    backend = DeviceScript(model, {(2, 6, 12): (60 * MIB, 0.35, 0.01)}, otherwise=(100 * MIB, 0.5, 0.01))
    chosen, record = validate_candidates(run, model, search, 1, backend=backend, num_steps=200)
    assert record["lists"] == ["default", "candidate-1", "tuned"]
    assert record["candidates"]["tuned"] == record["tuned"]["capture_sizes"] == [2, 6, 12]
    assert record["tuned"]["measured_graph_bytes"] == 60 * MIB
    tokens = [s.num_tokens for s in sample_trace(model.workload.steps(), 200, 0)]
    assert record["tuned"]["measured_step_ms"] == pytest.approx(0.35 + 0.01 * sum(tokens) / 200)
    assert record["emitted"] == "tuned" and chosen is search  # measured fastest, and it fits


def test_validate_candidates_writes_the_record_with_the_traces_accounting(tmp_path):
    run, model, search = _run_dir(tmp_path)
    backend = DeviceScript(model, {}, otherwise=(100 * MIB, 0.5, 0.01))
    backend.max_num_tokens = 20
    _, record = validate_candidates(run, model, search, 2, backend=backend, num_steps=300, seed=2,
                                    record_study=False)
    wider = sum(s.num_tokens > 20 for s in sample_trace(model.workload.steps(), 300, 2))
    assert wider > 0
    trace = record["trace"]
    assert (trace["sampled"], trace["replayed"], trace["excluded"], trace["max_num_tokens"], trace["steps"]) == (
        300, 300 - wider, wider, 20, 300 - wider)
    on_disk = json.loads((run / VALIDATION_FILE).read_text())
    assert on_disk == json.loads(json.dumps(record)) and on_disk["candidates"]  # every figure finite here
    assert not (run / PARTIAL_FILE).exists()


def test_validate_candidates_dying_midway_keeps_the_lists_it_measured(tmp_path):
    run, model, search = _run_dir(tmp_path)
    backend = DeviceScript(model, {model.default_sizes: (90 * MIB, 0.6, 0.0117)})
    real_capture = backend.capture

    def capture(graphs):  # default is measured first; the device faults on the next list
        if tuple(graphs) != tuple(model.graphs(model.default_sizes)):
            raise DeviceError("CUDA error: an illegal memory access was encountered")
        return real_capture(graphs)

    backend.capture = capture
    with pytest.raises(DeviceError):
        validate_candidates(run, model, search, 2, backend=backend, num_steps=100, record_study=False)
    assert not (run / VALIDATION_FILE).exists()
    partial = json.loads((run / PARTIAL_FILE).read_text())
    assert partial["partial"] is True and partial["lists"] == ["default"]
    assert partial["pending"] == ["tuned", "candidate-2"]
    assert partial["default"]["measured_graph_bytes"] == 90 * MIB


def test_validate_candidates_logs_that_nothing_is_emitted(tmp_path, caplog):
    run, model, search = _run_dir(tmp_path)
    backend = DeviceScript(model, {}, otherwise=(10 * 1024 * MIB, 0.5, 0.01))  # 10 GiB pools: nothing fits
    with caplog.at_level("WARNING", logger="tuner.validate.validation"):
        chosen, record = validate_candidates(run, model, search, 2, backend=backend, num_steps=100,
                                             record_study=False)
    assert chosen is None and record["emitted"] is None
    assert "NO VALIDATED LIST FITS ON THE DEVICE: nothing is emitted" in caplog.messages


def test_candidates_come_from_the_studys_complete_model_only_trials(tmp_path):
    """The study's finished model-only trials join the candidates; a failed trial, one GPU-measured earlier and one
    without an evaluation do not; the measurements go to the search's own study, not another in the storage."""
    optuna = pytest.importorskip("optuna")
    from optuna.trial import TrialState, create_trial

    run, model, search = _run_dir(tmp_path)
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name=search.study_name, storage=url)
    other = optuna.create_study(study_name="another-study", storage=url)

    def trial(sizes, state=TrialState.COMPLETE, **attrs):
        values = [1.0] if state == TrialState.COMPLETE else None
        ev = {"evaluation": {"capture_sizes": sizes}} if sizes is not None else {}
        study.add_trial(create_trial(state=state, values=values, user_attrs={**ev, **attrs}))

    trial([6, 10])  # a model-only trial: a candidate
    trial([2, 6, 12], state=TrialState.FAIL)
    trial([3, 5], source="gpu-validation")  # an earlier GPU measurement, not a model-only trial
    trial(None)
    pool = {search.chosen.capture_sizes, search.exact.best.capture_sizes,
            *(e.capture_sizes for e in search.exact.front)}
    assert not pool & {(6, 10), (2, 6, 12), (3, 5)} and all(model.evaluate(s).feasible
                                                             for s in ((6, 10), (2, 6, 12), (3, 5)))
    search = dataclasses.replace(search, storage=url)
    backend = DeviceScript(model, {}, otherwise=(100 * MIB, 0.5, 0.01))
    _, record = validate_candidates(run, model, search, 20, backend=backend, num_steps=50)  # k above every list
    measured = list(record["candidates"].values())
    assert [6, 10] in measured and [2, 6, 12] not in measured and [3, 5] not in measured
    assert len(measured) == len(pool | {model.default_sizes, (6, 10)})
    gpu = [t for t in optuna.load_study(study_name=search.study_name, storage=url).trials
           if t.user_attrs.get("source") == "gpu-validation"]
    assert len(gpu) == 1 + len(measured) and not other.trials  # the earlier one and one per distinct list
