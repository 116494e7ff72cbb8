"""Multi-LoRA and data-parallel deployments in the workload and the cost model: the fields refused one line each, the
graphs and pool multiplied by the LoRA cases, the steps priced by the adapter mix (no saving claimed for a case nothing
measured, the case's rows where measured), the LoRA weight buffers in the non-KV memory, a data-parallel rank's steps
held to every joint draw of the ranks by vLLM's agreement, and the exact solver's answer held to brute force. The
profiles are hand-made test fixtures (tests/handmade_profiles.py), never measurements."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest

from handmade_profiles import GIB, MIB, handmade_profile, handmade_spec
from tuner.engines.vllm.data_parallel import synced_dispatch
from tuner.fields import WorkloadError
from tuner.model.capture_time import predicted_capture_s
from tuner.model.costmodel import CostModel
from tuner.profile.table import ProfileRow, lora_mode, read_profile, write_profile
from tuner.search.exact import brute_force, exact_solve
from tuner.workload.spec import parse_workload

WIDTHS = list(range(1, 65))


def _workload(version: str, traffic: dict | None = None, **serving: object):
    spec = handmade_spec(vllm_version=version, **serving)
    spec["traffic"] = {"requests": {"kind": "uniform", "min": 1, "max": 8}, "mixed_share": 0.3,
                       "mixed_tokens": {"kind": "histogram", "counts": {3: 1, 10: 1, 40: 1}}, **(traffic or {})}
    return parse_workload(spec)


def _model(tmp_path: Path, version: str, traffic: dict | None = None, **serving: object) -> CostModel:
    wl = _workload(version, traffic, **serving)
    csv = handmade_profile(tmp_path / f"{version}-{len(list(tmp_path.iterdir()))}", wl, WIDTHS,
                           piecewise_ms=lambda w: 0.8 + 0.01 * w, total_memory_bytes=8 * GIB)
    return CostModel.from_files(csv, wl)


LORA = {"enable_lora": True, "max_loras": 3}


# ------------------------------------------------------------------------------------------------ the fields
@pytest.mark.parametrize("serving, traffic, field", [
    ({"max_loras": 2}, {}, "serving.max_loras"),
    ({**LORA, "max_lora_rank": 12}, {"active_loras": {0: 1}}, "serving.max_lora_rank"),
    (LORA, {}, "traffic.active_loras"),
    (LORA, {"active_loras": {4: 1}}, "traffic.active_loras.4"),
    (LORA, {"active_loras": {0: -1}}, "traffic.active_loras.0"),
    ({}, {"active_loras": {0: 1}}, "traffic.active_loras"),
    ({"data_parallel_size": 0}, {}, "serving.data_parallel_size"),
])
def test_a_bad_lora_or_dp_field_is_refused_naming_it(serving, traffic, field):
    with pytest.raises(WorkloadError) as exc:
        _workload("0.34", traffic, **serving)
    assert str(exc.value).startswith(field + ":") and "\n" not in str(exc.value)


def test_what_is_not_modelled_is_refused_naming_the_field():
    eagle = {"method": "eagle", "drafter": {"num_layers": 1}}
    for serving, field in ((LORA, "serving.enable_lora"), ({"data_parallel_size": 2}, "serving.data_parallel_size")):
        spec = handmade_spec(num_speculative_tokens=2, speculative=eagle, max_num_batched_tokens=64, **serving)
        spec["traffic"]["active_loras"] = {0: 1} if "enable_lora" in serving else None
        spec["traffic"] = {k: v for k, v in spec["traffic"].items() if v is not None}
        with pytest.raises(WorkloadError, match=f"^{field}: "):
            parse_workload(spec)
    # V1 without the no-LoRA graphs runs a rank with no adapter eager, and every rank with it.
    spec = handmade_spec(vllm_version="0.33", model_runner="v1", data_parallel_size=2,
                         **{**LORA, "cudagraph_specialize_lora": False})
    spec["traffic"]["active_loras"] = {0: 1}
    with pytest.raises(WorkloadError, match="^serving.cudagraph_specialize_lora: false with data_parallel_size 2"):
        parse_workload(spec)


# ------------------------------------------------------------------------------------------------ LoRA
@pytest.mark.parametrize("version", ["0.33", "0.34"])
def test_lora_multiplies_the_graphs_their_pool_and_capture_time(tmp_path, version):
    base = _model(tmp_path, version)
    lora = _model(tmp_path, version, {"active_loras": {0: 1, 2: 1}}, **LORA)
    sizes = base.default_sizes
    assert lora.engine.lora_cases() == (0, 4)  # cudagraph_specialize_lora: none and max_loras + 1
    assert lora.graphs(sizes) == [g for g in base.graphs(sizes) for _ in (0, 4)]
    # Each LoRA twin is captured right after its graph, at its delta: the pool grows by every graph's delta once more.
    deltas = sum(g.delta_bytes for g in base.graph_costs(sizes))
    assert lora.graph_memory_bytes(sizes) == base.graph_memory_bytes(sizes) + deltas
    assert predicted_capture_s(lora, lora.runs_as(sizes)) == pytest.approx(2 * predicted_capture_s(base, base.runs_as(
        sizes)))
    assert lora.budget.non_kv_cache_bytes == base.budget.non_kv_cache_bytes + lora.workload.lora_weight_bytes() > 0


@pytest.mark.parametrize("version", ["0.33", "0.34"])
def test_a_case_nothing_measured_is_charged_its_eager_step_on_every_list(tmp_path, version):
    base = _model(tmp_path, version)
    none_active = _model(tmp_path, version, {"active_loras": {0: 1}}, **LORA)
    half = _model(tmp_path, version, {"active_loras": {0: 1, 2: 1}}, **LORA)
    empty = base.evaluate(()).expected_step_ms
    for sizes in (base.default_sizes, (), base.candidates[:5]):
        assert none_active.expected_step_ms(sizes) == pytest.approx(base.expected_step_ms(sizes))
        # Half the steps hold adapters: half the saving a list makes, the other half charged eager whatever the list.
        assert empty - half.expected_step_ms(sizes) == pytest.approx((empty - base.expected_step_ms(sizes)) / 2)
    assert any("no saving is claimed" in n for n in half.notes)


def _with_lora_rows(csv: Path, case: int, eager, full) -> Path:
    profile = read_profile(csv)
    rows = list(profile.rows)
    for w in WIDTHS:
        rows.append(ProfileRow(w, lora_mode(case, "eager"), "ok", latency_ms=eager(w)))
        rows.append(ProfileRow(w, lora_mode(case, "full"), "ok", latency_ms=full(w), capture_delta_bytes=2 * MIB,
                               standalone_bytes=w * MIB))
    return write_profile(csv.parent, csv.stem, rows, profile.metadata)


def test_a_measured_case_is_priced_from_its_own_rows(tmp_path):
    wl = _workload("0.34", {"requests": {"kind": "histogram", "counts": {4: 1}}, "mixed_share": 0.0,
                            "active_loras": {2: 1}}, **LORA)
    csv = handmade_profile(tmp_path, wl, WIDTHS, total_memory_bytes=8 * GIB)
    m = CostModel.from_files(_with_lora_rows(csv, 4, lambda w: 5.0 + w, lambda w: 2.0 + w), wl)
    # Every step: 4 decode requests with 2 adapters (case 4): eager 9 ms, its FULL graph of 4 requests 6 ms.
    assert m.expected_step_ms(()) == pytest.approx(9.0)
    assert m.expected_step_ms((-4,)) == pytest.approx(6.0) and m.expected_step_ms((-8,)) == pytest.approx(10.0)
    assert m.program_gaps  # the program follows the case-0 graphs only: the solver says so


def test_v1_without_the_no_lora_graphs_runs_a_step_with_no_adapter_eager(tmp_path):
    kw = {**LORA, "cudagraph_specialize_lora": False, "model_runner": "v1"}
    m = _model(tmp_path, "0.33", {"active_loras": {0: 1}}, **kw)
    base = _model(tmp_path, "0.33")
    assert m.engine.lora_cases() == (4,)
    assert m.expected_step_ms(base.default_sizes) == pytest.approx(base.eager_step_ms())


def test_the_034_exact_solver_proves_the_lora_optimum_brute_force_finds(tmp_path):
    m = _model(tmp_path, "0.34", {"active_loras": {0: 2, 1: 1, 3: 1}}, **LORA)
    cands = [-8, -4, -2, -1, 4, 16, 40, 64]
    got = exact_solve(m, candidates=cands)
    assert got.exact_memory and not got.unproven
    assert got.best.expected_step_ms == pytest.approx(brute_force(m, cands).expected_step_ms)


# ------------------------------------------------------------------------------------------------ data parallel
def _brute_dp(m: CostModel, base: CostModel, sizes: tuple[int, ...]) -> float:
    """A rank's expected step over every joint draw of two ranks, each run by vLLM's agreement (`synced_dispatch`) and
    priced from the profile's curves: eager at the width it runs at (its logits for its own tokens), else its graph."""
    d = m.engine.dispatcher(m.runs_as(sizes))
    steps = base.steps
    utc = base.step_dispatch_keys()[0]
    total = 0.0
    for (i, a), (j, b) in itertools.product(enumerate(steps), repeat=2):
        mode, width = synced_dispatch(d, [(a.num_tokens, int(utc[i])), (b.num_tokens, int(utc[j]))], 0)
        own = a.num_tokens
        logits = float(m.logits_at(own))
        lat = (float(m.eager_ms(width)) - float(m.logits_at(width)) + logits if mode == "NONE"
               else float(m.graph_body_ms(width, mode)) + logits)
        total += a.probability * b.probability * lat
    return total


@pytest.mark.parametrize("version", ["0.33", "0.34"])
def test_a_dp_rank_replays_every_joint_draw_as_vllm_agrees_it(tmp_path, version):
    base = _model(tmp_path, version)
    m = _model(tmp_path, version, data_parallel_size=2)
    assert sum(st.probability for st in m.steps) == pytest.approx(1.0)
    lists = (base.default_sizes, (), tuple(base.candidates[:3]), tuple(base.candidates[-4:]))
    for sizes in lists:
        assert m.expected_step_ms(sizes) == pytest.approx(_brute_dp(m, base, sizes)), sizes
    # The widest rank's width: a rank replays wider graphs than its own traffic, so DP is slower than one rank.
    assert m.expected_step_ms(base.default_sizes) > base.expected_step_ms(base.default_sizes)
    # Per token: a rank's step serves its own tokens, not the widest rank's.
    assert m.mean_tokens == pytest.approx(base.mean_tokens)
    assert m.evaluate(base.default_sizes).per_token_ms == pytest.approx(
        m.expected_step_ms(base.default_sizes) / base.mean_tokens)


def test_dp_drops_a_dynamic_schedule(tmp_path):
    schedule = [[1, 4, 3], [5, 8, 1]]
    one = _workload("0.33", num_speculative_tokens=3, speculative_schedule=schedule, max_num_batched_tokens=64,
                    speculative={"method": "ngram"}, data_parallel_size=1)
    two = dataclasses.replace(one, serving=dataclasses.replace(one.serving, data_parallel_size=2))
    assert one.engine.dynamic_schedule is not None and two.engine.dynamic_schedule is None
    assert set(two.engine.decode_query_lens()[1:]) == {4} != set(one.engine.decode_query_lens()[1:])
    assert any("drops speculative_schedule under data_parallel_size 2" in n
               for n in two.engine.setting_notes(two.engine.dispatcher(two.engine.probe_sizes())))


def test_many_joint_draws_are_sampled_with_a_fixed_seed():
    from tuner.steps import Step, rank_steps

    steps = [Step(w, False, 1 / 40, None, None) for w in range(1, 41)]
    drawn = rank_steps(steps, 4, [0] * 40)  # 40^4 joint steps: too many to list
    assert drawn == rank_steps(steps, 4, [0] * 40) and sum(s.probability for s in drawn) == pytest.approx(1.0)
    # The widest of 4 uniform draws over 1..40: P(max <= 20) = (1/2)^4.
    assert sum(s.probability for s in drawn if s.num_tokens <= 20) == pytest.approx(1 / 16, abs=0.01)
    assert np.all([s.ranks.own_tokens <= s.num_tokens for s in drawn])
