"""Cost model on hand-made profiles: latencies and memory equal the hand sums, bad profiles are one-line errors."""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/handmade_profiles.py (import-mode=importlib)
from handmade_profiles import MIB, handmade_profile, handmade_workload  # noqa: E402

from tuner.model.costmodel import GIB, CostModel, ModelError, crossover_width
from tuner.profile.table import read_profile


def model_for(tmp_path, workload=None, widths=(1, 2, 4, 8), **kwargs):
    workload = workload or handmade_workload()
    return CostModel.from_files(handmade_profile(tmp_path, workload, list(widths), **kwargs), workload)


def test_expected_latency_equals_hand_sum(tmp_path):
    m = model_for(tmp_path)  # steps 1..8 tokens, p = 1/8 each, all uniform decode (q = 1)
    # eager(w) = 1 + 0.01 w, full(w) = 0.5 + 0.01 w; (2, 8): widths 1-2 replay the 2-graph, 3-8 the 8-graph.
    assert m.expected_step_ms((2, 8)) == pytest.approx((2 * 0.52 + 6 * 0.58) / 8)
    # (4,): 1-4 pad to 4; 5-8 run eager at their own width.
    assert m.expected_step_ms((4,)) == pytest.approx((4 * 0.54 + 1.05 + 1.06 + 1.07 + 1.08) / 8)
    assert m.expected_step_ms(()) == pytest.approx(1.045)
    assert m.eager_step_ms() == pytest.approx(1.045)
    assert m.per_token_ms((2, 8)) == pytest.approx(m.expected_step_ms((2, 8)) / 4.5)


def test_eager_latency_is_interpolated_monotonically(tmp_path):
    noisy = {1: 1.0, 2: 2.0, 4: 1.5, 8: 3.0}  # width 4 measured faster than width 2
    m = model_for(tmp_path, eager_ms=noisy.get)
    assert float(m.eager_ms(4)) == pytest.approx(2.0)
    assert float(m.eager_ms(3)) == pytest.approx(2.0)
    assert float(m.eager_ms(6)) == pytest.approx(2.5)
    # Above the widest measured width: along the last segment's slope ((3 - 2) / 4 per token).
    assert float(m.eager_ms(12)) == pytest.approx(4.0)


def test_full_decode_rounding_and_padding_follow_vllm_dispatch(tmp_path):
    wl = handmade_workload(num_speculative_tokens=3, max_num_seqs=4, max_num_batched_tokens=32)  # q = 4
    m = model_for(tmp_path, wl, widths=(4, 6, 8, 16))
    # With (6,) the FULL decode graph would be 8 > max 6: not captured; a 4-token decode step pads to the
    # PIECEWISE 6-graph, costed at eager(6) since the profile has no piecewise rows.
    assert m.step_latency_ms(4, True, (6,)) == pytest.approx(1.06)
    assert m.step_latency_ms(4, True, (6, 8)) == pytest.approx(0.58)  # FULL decode graph at 8
    assert m.step_latency_ms(12, True, (6, 8)) == pytest.approx(1.12)  # above the max: eager
    assert any("no piecewise rows" in n for n in m.notes)


def test_piecewise_rows_are_used_for_mixed_steps(tmp_path):
    wl = handmade_workload(traffic={"requests": {"kind": "uniform", "min": 1, "max": 8}, "mixed_share": 0.5,
                                    "mixed_tokens": {"kind": "uniform", "min": 1, "max": 8}})
    m = model_for(tmp_path, wl, piecewise_ms=lambda w: 0.8 + 0.01 * w)
    assert m.step_latency_ms(3, False, (4,)) == pytest.approx(0.84)
    assert m.step_latency_ms(3, True, (4,)) == pytest.approx(0.54)
    assert not any("no piecewise rows" in n for n in m.notes)


def test_vectorised_latency_matches_dispatcher(tmp_path):
    wl = handmade_workload(num_speculative_tokens=2, max_num_seqs=6, max_num_batched_tokens=48,
                           traffic={"requests": {"kind": "uniform", "min": 1, "max": 6}, "mixed_share": 0.3,
                                    "mixed_tokens": {"kind": "uniform", "min": 1, "max": 48}})
    m = model_for(tmp_path, wl, widths=(1, 3, 5, 6, 9, 12, 17, 18, 30, 48), piecewise_ms=lambda w: 0.9 + 0.01 * w)
    rnd = random.Random(0)
    for _ in range(30):
        sizes = tuple(sorted(rnd.sample(range(1, 49), rnd.randint(1, 6))))
        hand = sum(s.probability * m.step_latency_ms(s.num_tokens, s.uniform_decode, sizes) for s in m.steps)
        assert m.expected_step_ms(sizes) == pytest.approx(hand)


def test_graph_memory_is_first_graph_standalone_plus_deltas(tmp_path):
    kwargs = dict(standalone_bytes=lambda w: 10 * w * MIB, delta_bytes=lambda w: w * MIB)
    m = model_for(tmp_path, **kwargs)
    # FULL_AND_PIECEWISE captures PIECEWISE 8, 2 then FULL 8, 2 (q = 1); no piecewise rows, so their memory
    # comes from the full rows: standalone(8) + delta(2) + delta(8) + delta(2).
    assert m.graphs((2, 8)) == [("PIECEWISE", 8), ("PIECEWISE", 2), ("FULL", 8), ("FULL", 2)]
    assert m.graph_memory_bytes((2, 8)) == (80 + 2 + 8 + 2) * MIB
    assert m.graph_memory_bytes(()) == 0
    e = m.evaluate((2, 8))
    assert e.kv_available_bytes == int(1000 * MIB * 0.9) - 100 * MIB - 50 * MIB - 92 * MIB
    # vLLM starts with one max_model_len request's whole 16-token blocks plus the null block: (64 / 16 + 1) blocks of
    # 16 tokens x the tiny fp32 model's 512 KV bytes per token.
    assert e.required_kv_bytes == (64 // 16 + 1) * 16 * 512
    assert e.kv_margin_gib == pytest.approx((e.kv_available_bytes - 5 * 16 * 512) / GIB)
    assert e.feasible

    full_only = model_for(tmp_path / "full", handmade_workload(cudagraph_mode="FULL"), **kwargs)
    assert full_only.graph_memory_bytes((2, 8)) == (80 + 2) * MIB


def test_graph_memory_with_piecewise_rows_and_decode_rounding(tmp_path):
    wl = handmade_workload(num_speculative_tokens=1, max_num_seqs=8, max_num_batched_tokens=32)  # q = 2
    m = model_for(tmp_path, wl, widths=(1, 2, 3, 4, 8), piecewise_ms=lambda w: 0.8,
                  standalone_bytes=lambda w: 10 * w * MIB, delta_bytes=lambda w: w * MIB)
    # (3, 4): PIECEWISE 4, 3; FULL decode graphs round 3 -> 4 and 4 -> 4, so one FULL graph at 4.
    assert m.graphs((3, 4)) == [("PIECEWISE", 4), ("PIECEWISE", 3), ("FULL", 4)]
    assert m.graph_memory_bytes((3, 4)) == (40 + 3 + 4) * MIB


def test_oom_width_is_no_candidate_and_makes_a_list_infeasible(tmp_path):
    m = model_for(tmp_path, oom=(8,))
    assert m.candidates == [1, 2, 4]
    e = m.evaluate((4, 8))
    assert not e.feasible and "8 ran out of memory" in e.why_infeasible


def test_unsupported_piecewise_rows_keep_widths_as_candidates(tmp_path):
    m = model_for(tmp_path, piecewise_unsupported=True)
    assert m.candidates == [1, 2, 4, 8]
    assert any("no piecewise rows" in n for n in m.notes)
    assert m.evaluate((2, 8)).feasible


def test_kv_shortfall_is_infeasible(tmp_path):
    m = model_for(tmp_path, total_memory_bytes=200 * MIB, weights_bytes=100 * MIB, activation_peak_bytes=60 * MIB,
                  standalone_bytes=lambda w: 2 * w * MIB)
    # No non_kv_cache_bytes in the fixture: weights + activation peak stand in for vLLM's non-KV memory.
    assert m.budget.non_kv_cache_bytes == 160 * MIB
    assert m.budget.estimate_budget_bytes == math.ceil(200 * MIB * 0.9) - 160 * MIB - (64 // 16 + 1) * 16 * 512
    assert any("no non_kv_cache_bytes" in n for n in m.notes)
    assert m.evaluate((4,)).feasible
    e = m.evaluate((1, 2, 4, 8))
    assert not e.feasible and "vLLM would not start" in e.why_infeasible


def test_a_list_that_fits_the_real_pool_but_not_vllms_estimate_is_rejected(tmp_path):
    # Deltas shrink with width, so vLLM's V2 estimate, which extrapolates every FULL graph from the second largest
    # (7 MiB), is far above the real pool (the deltas 1..7 MiB). The old rule (real pool) called this list fine.
    wl = handmade_workload()
    kwargs = dict(standalone_bytes=lambda w: 10 * w * MIB, delta_bytes=lambda w: w * MIB)
    probe = model_for(tmp_path / "probe", wl, widths=range(1, 9), **kwargs)
    sizes = tuple(range(1, 9))
    real, estimate = probe.memory(sizes)
    assert (real, estimate) == ((80 + 28 + 8 + 28) * MIB, (80 + 28 + 8 + 7 * 7) * MIB)
    # Total memory such that the KV cache left beside the REAL pool is exactly the requirement plus 5 MiB.
    required = wl.required_kv_bytes
    total = int((150 * MIB + real + required + 5 * MIB) / 0.9) + 1
    m = model_for(tmp_path / "m", wl, widths=range(1, 9), total_memory_bytes=total, **kwargs)
    assert m.budget.requested_bytes - 150 * MIB - real - required >= 5 * MIB  # the old rule: fits
    e = m.evaluate(sizes)
    assert not e.feasible and not e.starts
    short = required - e.kv_available_bytes
    assert short == estimate - real - (m.budget.requested_bytes - 150 * MIB - real - required)
    assert e.why_infeasible.startswith("vLLM would not start") and f"{short / GIB:.3f} GiB short" in e.why_infeasible


def test_the_real_capture_must_fit_beside_the_estimate(tmp_path):
    # With the estimate switched off vLLM subtracts nothing: the real pool must fit in what it does not request.
    wl = handmade_workload(estimate_cudagraph_memory=False)
    m = model_for(tmp_path, wl, total_memory_bytes=1000 * MIB, standalone_bytes=lambda w: 30 * w * MIB)
    assert m.memory((8,))[1] == (240 + 2) * MIB  # profiled, but not applied
    assert m.graph_estimate_bytes((8,)) == 0
    e = m.evaluate((8,))
    # summary.json's vllm_graph_estimate_bytes is what vLLM subtracts: nothing; the profiled figure sits beside it.
    assert e.as_dict()["vllm_graph_estimate_bytes"] == 0
    assert e.as_dict()["vllm_graph_estimate_profiled_bytes"] == (240 + 2) * MIB
    assert e.kv_available_bytes == m.budget.requested_bytes - 150 * MIB
    assert e.capture_headroom_bytes == 100 * MIB - (240 + 2) * MIB
    assert not e.feasible and e.why_infeasible.startswith("the real capture would run out of memory")
    assert m.evaluate((2,)).feasible  # 60 + 2 MiB fits in the 100 MiB vLLM leaves
    assert m.memory_fits((2,)) and not m.memory_fits((8,))
    # A pool of exactly what vLLM leaves fits: 49 x 2 MiB alone + a 2 MiB delta = 100 MiB, headroom 0.
    edge = model_for(tmp_path / "edge", wl, total_memory_bytes=1000 * MIB, standalone_bytes=lambda w: 49 * w * MIB)
    e = edge.evaluate((2,))
    assert e.capture_headroom_bytes == 0 and e.feasible and e.as_dict()["feasible"] is True
    assert edge.memory_fits((2,))


def test_profile_from_another_model_shape_is_an_error(tmp_path):
    wl = handmade_workload()
    path = handmade_profile(tmp_path, wl, [1, 2], shape_override={"num_layers": 3})
    with pytest.raises(ModelError, match=r"another model shape \(model.shape.num_layers=3"):
        CostModel.from_files(path, wl)


def test_a_float_shape_field_matches_within_float_rounding_and_not_beyond(tmp_path):
    # rope_theta as JSON wrote it back (a last-digit difference) is the same model; a tenth off is another.
    wl = handmade_workload()
    theta = wl.model.shape.rope_theta
    close = handmade_profile(tmp_path / "close", wl, [1, 2], shape_override={"rope_theta": theta * (1 + 1e-12)})
    assert CostModel.from_files(close, wl).profile.metadata["model"]["shape"]["rope_theta"] != theta
    far = handmade_profile(tmp_path / "far", wl, [1, 2], shape_override={"rope_theta": theta * 1.1})
    with pytest.raises(ModelError, match=r"another model shape \(model.shape.rope_theta="):
        CostModel.from_files(far, wl)


def test_check_profile_matches_refuses_another_step_unless_allowed(tmp_path):
    # Called as a library function, the check refuses by default and names the workload field to change.
    from tuner.model.costmodel import check_profile_matches
    from tuner.profile.table import read_profile

    wl = handmade_workload()
    path = handmade_profile(tmp_path, wl, [1, 2])
    _set_meta(path, context_len=wl.traffic.mean_context_len + 1)
    profile = read_profile(path)
    with pytest.raises(ModelError, match=r"^hand.csv: measured with context_len=.*\(traffic.mean_context_len\); "
                                         r"pass --allow-mismatch"):
        check_profile_matches(profile, wl)
    notes = check_profile_matches(profile, wl, allow_mismatch=True)
    assert any(n.startswith("allowed mismatch: hand.csv: measured with context_len=") for n in notes)


@pytest.mark.parametrize("graphs, why", [("CUDA graphs need a CUDA device", "CUDA graphs need a CUDA device"),
                                         (None, "a CPU profile?")])
def test_a_profile_without_graph_rows_is_refused_for_a_graph_workload_saying_why(tmp_path, graphs, why):
    # A CPU profile has eager rows only; searching graphs on it is refused in one line that says why there are none
    # (the profile's own words where it records them) and what to do instead.
    from tuner.profile.table import read_profile, write_profile

    wl = handmade_workload()
    p = read_profile(handmade_profile(tmp_path / "src", wl, [1, 2, 4]))
    meta = {**p.metadata, "device": "cpu", **({"graphs": graphs} if graphs else {})}
    path = write_profile(tmp_path, "cpu", [r for r in p.rows if r.mode == "eager"], meta)
    with pytest.raises(ModelError) as err:
        CostModel.from_files(path, wl)
    assert str(err.value) == (f"cpu.csv: no full rows with status ok (no graph was measured; {why}); profile on a GPU, "
                              f"or search a workload with serving.enforce_eager: true")


def test_profile_from_another_dtype_is_named_with_its_file_and_value(tmp_path):
    wl = handmade_workload()  # float32
    path = handmade_profile(tmp_path, wl, [1, 2])
    _set_meta(path, model={**json.loads(path.with_suffix(".json").read_text())["model"], "dtype": "bfloat16"})
    with pytest.raises(ModelError) as err:
        CostModel.from_files(path, wl)
    assert str(err.value) == "hand.csv: measured with model.dtype='bfloat16', workload hand has 'float32'"


def test_the_kv_rule_takes_the_profiles_measured_weights_and_activations(tmp_path):
    # An activation peak of 0 is a measurement like any other (not a missing one): non-KV = 123 + 0 MiB.
    m = model_for(tmp_path, weights_bytes=123 * MIB, activation_peak_bytes=0)
    assert m.budget.non_kv_cache_bytes == 123 * MIB
    assert m.evaluate(()).kv_available_bytes == math.ceil(1000 * MIB * 0.9) - 123 * MIB
    path = handmade_profile(tmp_path / "bad", handmade_workload(), [1, 2], activation_peak_bytes=-1)
    with pytest.raises(ModelError) as err:
        CostModel.from_files(path, handmade_workload())
    assert str(err.value) == "hand.csv: metadata activation_peak_bytes=-1 must be a byte count >= 0"
    _set_meta(path, activation_peak_bytes=50 * MIB, weights_bytes="lots")
    with pytest.raises(ModelError) as err:
        CostModel.from_files(path, handmade_workload())
    assert str(err.value) == "hand.csv: metadata weights_bytes='lots' must be a byte count >= 0"


def test_noisy_logits_are_read_as_a_running_max_and_their_absence_is_noted(tmp_path):
    from tuner.profile.table import ProfileRow, read_profile, write_profile

    wl = handmade_workload()
    path = handmade_profile(tmp_path, wl, [1, 2, 4, 8])
    assert any(n.startswith("no logits rows in hand.csv: ") for n in CostModel.from_files(path, wl).notes)
    p = read_profile(path)
    noisy = {1: 0.1, 2: 0.2, 4: 0.05, 8: 0.8}  # the 4-token reading is noise: wider never costs less
    rows = p.rows + [ProfileRow(w, "logits", "ok", latency_ms=ms, latency_iqr_ms=0.0) for w, ms in noisy.items()]
    m = CostModel.from_files(write_profile(tmp_path, "noisy-logits", rows, p.metadata), wl)
    assert [float(m.logits_at(w)) for w in (1, 2, 4, 8)] == pytest.approx([0.1, 0.2, 0.2, 0.8])


@pytest.mark.parametrize("fallback, what", [
    ("eager", "the eager latency at the padded width (no launch saving credited)"),
    ("full", "the FULL graph latency at the padded width")])
def test_a_profile_without_piecewise_rows_says_how_piecewise_graphs_are_costed(tmp_path, fallback, what):
    wl = handmade_workload()  # FULL_AND_PIECEWISE on V2
    m = CostModel.from_files(handmade_profile(tmp_path, wl, [1, 2, 4, 8]), wl, piecewise_fallback=fallback)
    assert (f"no piecewise rows with status ok in hand.csv: PIECEWISE (mixed-batch) graphs are costed at {what}, "
            f"and their memory is taken from the full rows") in m.notes


def test_full_rows_captured_without_piecewise_graphs_are_noted_for_v2(tmp_path):
    wl = handmade_workload()
    path = handmade_profile(tmp_path, wl, [1, 2, 4, 8])
    note = "hand.csv captured its full graphs without piecewise graphs in the pool"
    assert any(n.startswith(note) for n in CostModel.from_files(path, wl).notes)
    _set_meta(path, capture_order="piecewise-then-full")  # as `cgtune profile` captures them now
    assert not any(n.startswith(note) for n in CostModel.from_files(path, wl).notes)


def test_the_ideal_list_is_every_width_up_to_the_widest_step(tmp_path):
    m = model_for(tmp_path)  # steps 1..8 tokens
    assert m.ideal().capture_sizes == (1, 2, 3, 4, 5, 6, 7, 8)


def test_off_peak_weight_is_noted(tmp_path):
    wl = handmade_workload()
    m = CostModel.from_files(handmade_profile(tmp_path, wl, [1, 2, 4, 8]), wl, off_peak_weight=0.25)
    assert "the objective mixes 25% off-peak decode traffic (uniform over 1..8 requests) into the workload's steps" \
        in m.notes


def test_profile_without_memory_metadata_is_an_error(tmp_path):
    wl = handmade_workload()
    path = handmade_profile(tmp_path, wl, [1, 2], total_memory_bytes=None)
    with pytest.raises(ModelError, match="total_memory_bytes is missing"):
        CostModel.from_files(path, wl)


def test_missing_column_is_an_error(tmp_path):
    wl = handmade_workload()
    path = handmade_profile(tmp_path, wl, [1, 2])
    text = path.read_text().splitlines()
    path.write_text("\n".join(line.rsplit(",", 1)[0] for line in text) + "\n")  # drop capture_s
    with pytest.raises(ModelError, match="missing column 'capture_s'"):
        CostModel.from_files(path, wl)


def test_crossover_width(tmp_path):
    wl = handmade_workload(max_num_batched_tokens=8192)
    path = handmade_profile(tmp_path, wl, [1, 512, 1024, 2048, 4096, 8192])
    # The graph saves 0.5 ms of 1 + 0.01 w: 2.3% at 2048, 1.2% at 4096.
    assert crossover_width(read_profile(path)) == 4096
    assert crossover_width(read_profile(path), threshold=0.001) is None


def _set_meta(path, **values):
    import json

    meta_path = path.with_suffix(".json")
    meta = json.loads(meta_path.read_text())
    meta.update(values)
    meta_path.write_text(json.dumps(meta))
    return path


@pytest.mark.parametrize(("key", "value", "workload_kwargs"), [
    ("decode_query_len", 4, {}),  # workload q = 1
    ("context_len", 4096, {}),  # workload mean_context_len 2048
    ("compute_capability", "10.0", {}),  # workload gpu_capability 9.0 (the 512 ceiling, not 1024)
    ("compiled", False, {}),  # vLLM runs the compiled model unless enforce_eager
    ("compiled", True, {"enforce_eager": True}),
])
def test_profile_measured_for_another_step_is_refused(tmp_path, key, value, workload_kwargs):
    wl = handmade_workload(**workload_kwargs)
    path = _set_meta(handmade_profile(tmp_path, wl, [1, 2, 4, 8]), **{key: value})
    with pytest.raises(ModelError, match=rf"measured with {key}=.*--allow-mismatch"):
        CostModel.from_files(path, wl)
    m = CostModel.from_files(path, wl, allow_mismatch=True)
    assert any(n.startswith("allowed mismatch") and key in n for n in m.notes)


def test_matching_step_metadata_is_accepted_and_missing_keys_are_noted(tmp_path):
    wl = handmade_workload()
    path = _set_meta(handmade_profile(tmp_path, wl, [1, 2]), decode_query_len=1, context_len=2048,
                     compute_capability="9.0")
    m = CostModel.from_files(path, wl)
    assert not any("mismatch" in n or "does not record" in n for n in m.notes)
    bare = CostModel.from_files(handmade_profile(tmp_path / "bare", wl, [1, 2]), wl)
    assert any("does not record decode_query_len" in n for n in bare.notes)


def test_padded_graph_steps_pay_logits_for_their_real_tokens(tmp_path):
    from tuner.profile.table import ProfileRow, read_profile, write_profile

    wl = handmade_workload()
    path = handmade_profile(tmp_path, wl, [1, 2, 4, 8])
    p = read_profile(path)
    rows = p.rows + [ProfileRow(w, "logits", "ok", latency_ms=0.1 * w, latency_iqr_ms=0.0) for w in (1, 2, 4, 8)]
    path = write_profile(tmp_path, "with-logits", rows, p.metadata)
    m = CostModel.from_files(path, wl)
    # A 3-token step padded to the 8-graph: full(8) - logits(8) + logits(3) = 0.58 - 0.8 + 0.3.
    assert m.step_latency_ms(3, True, (8,)) == pytest.approx(0.58 - 0.8 + 0.3)
    assert m.step_latency_ms(8, True, (8,)) == pytest.approx(0.58)  # unpadded: as measured
    assert m.step_latency_ms(3, True, (2,)) == pytest.approx(1.03)  # eager: its own width, logits included
    sizes = (2, 8)
    hand = sum(s.probability * m.step_latency_ms(s.num_tokens, s.uniform_decode, sizes) for s in m.steps)
    assert m.expected_step_ms(sizes) == pytest.approx(hand)


def test_mixed_steps_on_a_piecewise_graph_pay_logits_for_their_real_tokens(tmp_path):
    # Mixed steps (prefill with decode) replay PIECEWISE graphs, padded like decode steps; the LM head still runs
    # after the graph over the real tokens only, as on the FULL branch above.
    traffic = {"requests": {"kind": "uniform", "min": 1, "max": 8}, "mixed_share": 0.5,
               "mixed_tokens": {"kind": "uniform", "min": 9, "max": 16}}
    wl = handmade_workload(max_num_batched_tokens=16, traffic=traffic)
    path = handmade_profile(tmp_path, wl, [1, 2, 4, 8, 16], piecewise_ms=lambda w: 0.7 + 0.01 * w,
                            logits_ms=lambda w: 0.05 * w)
    m = CostModel.from_files(path, wl)
    assert m.mixed_mode == "PIECEWISE"
    # An 11-token mixed step padded to the 16-graph: piecewise(16) - logits(16) + logits(11) = 0.86 - 0.8 + 0.55.
    assert m.step_latency_ms(11, False, (8, 16)) == pytest.approx(0.86 - 0.8 + 0.55)
    assert m.step_latency_ms(16, False, (8, 16)) == pytest.approx(0.86)  # unpadded: as measured
    assert m.step_latency_ms(11, False, (8,)) == pytest.approx(1.11)  # above the list: eager at its own width
    sizes = (8, 16)
    mixed = [s for s in m.steps if not s.uniform_decode]
    assert mixed and all(9 <= s.num_tokens <= 16 for s in mixed)
    hand = sum(s.probability * m.step_latency_ms(s.num_tokens, s.uniform_decode, sizes) for s in m.steps)
    assert m.expected_step_ms(sizes) == pytest.approx(hand)
    # Against hand values for the mixed share: each 9..16-token step pays 0.06 + 0.05 * T.
    by_hand = sum(s.probability * (0.06 + 0.05 * s.num_tokens) for s in mixed)
    assert sum(s.probability * m.step_latency_ms(s.num_tokens, False, sizes) for s in mixed) == pytest.approx(by_hand)


@pytest.mark.parametrize(("piecewise_ms", "lower"), [(lambda w: 0.7 + 0.01 * w, True), (lambda w: 1.3 + 0.01 * w, False)])
def test_a_width_covering_mixed_steps_pays_only_when_piecewise_is_faster(tmp_path, piecewise_ms, lower):
    # Decode steps of 1..8 requests (q = 1) and mixed steps of 9..16 tokens, half and half; the list (8,) leaves the
    # mixed steps eager. Adding 16 puts them on its PIECEWISE graph: each pays piecewise(16) instead of eager(w).
    traffic = {"requests": {"kind": "uniform", "min": 1, "max": 8}, "mixed_share": 0.5,
               "mixed_tokens": {"kind": "uniform", "min": 9, "max": 16}}
    wl = handmade_workload(max_num_batched_tokens=16, traffic=traffic)
    m = model_for(tmp_path, wl, widths=(1, 2, 4, 8, 16), piecewise_ms=piecewise_ms)
    eager_mixed = sum(1.0 + 0.01 * w for w in range(9, 17)) / 8
    saving = 0.5 * (eager_mixed - piecewise_ms(16))
    change = m.expected_step_ms((8,)) - m.expected_step_ms((8, 16))
    assert change == pytest.approx(saving)
    assert (change > 0) is lower


def test_v1_candidates_are_multiples_of_q_within_the_widest_decode_batch(tmp_path):
    wl = handmade_workload(num_speculative_tokens=3, max_num_seqs=4, max_num_batched_tokens=32, model_runner="v1")
    m = model_for(tmp_path, wl, widths=range(1, 33))
    assert m.runner == "v1" and m.v1_rewrite
    assert m.candidates == [4, 8, 12, 16]
    e = m.evaluate((1, 2, 6, 16))
    assert e.runs_as == (4, 8, 16)
    assert ("the V1 runner rewrites lists when speculating: the search offers multiples of q = 4 up to the widest "
            "decode batch (16 tokens; wider ones would serve mixed steps only), lists V1 runs as written") in m.notes


def test_full_decode_only_candidates_are_the_decode_windows(tmp_path):
    # Only the rounded decode graphs exist: multiples of q = 2 up to max_num_seqs 4 x q.
    wl = handmade_workload(num_speculative_tokens=1, max_num_seqs=4, max_num_batched_tokens=32,
                           cudagraph_mode="FULL_DECODE_ONLY")
    assert model_for(tmp_path, wl, widths=range(1, 33)).candidates == [2, 4, 6, 8]


def test_noisy_share_counts_the_widths_the_decision_rests_on(tmp_path):
    wl = handmade_workload()
    path = _set_meta(handmade_profile(tmp_path, wl, [1, 2, 4, 8, 16]), noisy_widths=[2, 16])
    m = CostModel.from_files(path, wl)
    # Steps reach 8 tokens; the decision rests on the graph candidates (all five) and the eager widths up to 8.
    assert m.decision_widths() == [1, 2, 4, 8, 16]
    assert m.noisy_share == pytest.approx(2 / 5)
    # A profile without the list: the per-width measurement details flag them.
    detail = {"2": {"eager": {"noisy": False}, "full": {"noisy": True}}, "4": {"eager": {"noisy": False}}}
    path = _set_meta(handmade_profile(tmp_path / "detail", wl, [1, 2, 4, 8]), measurements=detail)
    assert CostModel.from_files(path, wl).noisy_widths == [2]
    # The widest step's eager width counts even where its graph ran out of memory (no candidate there).
    oom = CostModel.from_files(handmade_profile(tmp_path / "oom", wl, [1, 2, 4, 8, 16], oom=(8,)), wl)
    assert oom.candidates == [1, 2, 4, 16] and oom.decision_widths() == [1, 2, 4, 8, 16]


# ---------------------------------------------------------------------------------------------- rules by hand
# Each of these was a mutant of costmodel.py the suite let through (scripts/mutation.sh, issue 33).
def _rows_with(path, mode: str, width: int, **changes):
    """The profile at `path` with the `mode` row at `width` replaced (dataclasses.replace), written beside it."""
    import dataclasses

    from tuner.profile.table import read_profile, write_profile

    p = read_profile(path)
    rows = [dataclasses.replace(r, **changes) if (r.mode, r.num_tokens) == (mode, width) else r for r in p.rows]
    return write_profile(path.parent / "edited", "edited", rows, p.metadata)


def test_a_capture_that_failed_or_ran_out_of_memory_keeps_its_width_out_with_the_reason(tmp_path):
    wl = handmade_workload()
    base = handmade_profile(tmp_path, wl, [1, 2, 4, 8], piecewise_ms=lambda w: 0.8 + 0.01 * w)
    failed = CostModel.from_files(_rows_with(base, "full", 4, status="error", latency_ms=None,
                                             capture_delta_bytes=None, standalone_bytes=None), wl)
    e = failed.evaluate((2, 4))
    assert not e.feasible and e.why_infeasible == ("the capture of width 4 failed while profiling (the profile's "
                                                   "capture_errors)")
    assert failed.evaluate((2, 8)).feasible
    # A PIECEWISE capture that ran out of memory keeps its width out as a FULL one does.
    oom = CostModel.from_files(_rows_with(base, "piecewise", 8, status="oom", latency_ms=None,
                                          capture_delta_bytes=None, standalone_bytes=None), wl)
    assert oom.oom_widths == [8]
    assert oom.evaluate((4, 8)).why_infeasible == "width 8 ran out of memory while the profile captured it"


def test_without_piecewise_rows_a_mixed_graph_step_costs_eager_or_full_as_asked(tmp_path):
    wl = handmade_workload()
    path = handmade_profile(tmp_path, wl, [1, 2, 4, 8], eager_ms=lambda w: 1.0 + 0.01 * w,
                            full_ms=lambda w: 0.5 + 0.01 * w)
    eager = CostModel.from_files(path, wl)
    full = CostModel.from_files(path, wl, piecewise_fallback="full")
    assert eager.graph_latency_ms(4, "PIECEWISE") == pytest.approx(1.04)
    assert full.graph_latency_ms(4, "PIECEWISE") == pytest.approx(0.54)


def test_the_off_peak_step_is_the_mean_over_one_to_max_num_seqs_requests_by_hand(tmp_path):
    # q = 1, no list: every off-peak decode step of n = 1..8 requests runs eager at 1 + 0.01 n ms: mean 1.045 ms;
    # with (8,) every one pads to 8 and replays it at 0.5 + 0.08 ms.
    m = model_for(tmp_path)
    assert m.off_peak_step_ms(()) == pytest.approx(1.045)
    assert m.off_peak_step_ms((8,)) == pytest.approx(0.58)


def test_an_evaluation_as_a_dict_names_its_figures_as_summary_json_does(tmp_path):
    e = model_for(tmp_path).evaluate((2, 8))
    d = e.as_dict()
    assert d == {"capture_sizes": [2, 8], "runs_as": list(e.runs_as), "expected_step_ms": e.expected_step_ms,
                 "per_token_ms": e.per_token_ms, "graph_memory_bytes": e.graph_memory_bytes,
                 "vllm_graph_estimate_bytes": e.graph_estimate_bytes,
                 "vllm_graph_estimate_profiled_bytes": e.profiled_estimate_bytes,
                 "drafter_step_ms": e.drafter_step_ms, "drafter_graph_bytes": e.drafter_graph_bytes,
                 "kv_available_bytes": e.kv_available_bytes, "kv_margin_gib": e.kv_margin_gib,
                 "capture_headroom_bytes": e.capture_headroom_bytes, "graphs_captured": 4,
                 "capture_s": pytest.approx(0.04), "feasible": e.feasible, "reason": e.why_infeasible}


@pytest.mark.parametrize("logits", [True, False])
@pytest.mark.parametrize("mode", ["FULL_AND_PIECEWISE", "NONE"])
def test_the_note_on_missing_logits_rows_appears_only_where_graphs_pad(tmp_path, logits, mode):
    wl = handmade_workload(cudagraph_mode=mode)
    path = handmade_profile(tmp_path, wl, [1, 2, 4, 8], logits_ms=(lambda w: 0.01 * w) if logits else None)
    noted = any(n.startswith("no logits rows in hand.csv") for n in CostModel.from_files(path, wl).notes)
    assert noted == (not logits and mode != "NONE")


@pytest.mark.parametrize("mode, column, hint", [("full", "standalone_bytes", " (profiled with --no-standalone?)"),
                                                ("full", "capture_delta_bytes", ""),
                                                ("piecewise", "standalone_bytes", " (profiled with --no-standalone?)"),
                                                ("piecewise", "capture_delta_bytes", "")])
def test_a_graph_mode_without_a_usable_memory_column_is_refused_by_name(tmp_path, mode, column, hint):
    import dataclasses

    from tuner.profile.table import read_profile, write_profile

    wl = handmade_workload()
    p = read_profile(handmade_profile(tmp_path, wl, [1, 2, 4], piecewise_ms=lambda w: 0.8 + 0.01 * w))
    rows = [dataclasses.replace(r, **{column: None}) if r.mode == mode else r for r in p.rows]
    path = write_profile(tmp_path / "x", "x", rows, p.metadata)
    with pytest.raises(ModelError) as err:
        CostModel.from_files(path, wl)
    assert str(err.value) == f"x.csv: no {mode} row has a usable {column}{hint}; the graph-memory model needs it"


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_a_dynamic_schedules_decode_steps_are_costed_at_their_own_query_length(tmp_path, runner):
    # speculative_schedule [[1, 4, 3], [5, 8, 1]]: decode steps of 1..4 requests carry 4 tokens each, of 5..8
    # requests 2. The vectorised expected step (the workload's steps, keyed once) equals the sum of each step costed
    # alone with its own query length and requests, for lists that pad the tiers differently.
    wl = handmade_workload(num_speculative_tokens=3, max_num_seqs=8, max_num_batched_tokens=32,
                           speculative={"method": "ngram"}, speculative_schedule=[[1, 4, 3], [5, 8, 1]],
                           model_runner=runner, traffic={"requests": {"kind": "uniform", "min": 1, "max": 8}})
    path = handmade_profile(tmp_path, wl, list(range(1, 33)), full_ms=lambda w: 0.2 + 0.01 * w,
                            piecewise_ms=lambda w: 0.7 + 0.01 * w)
    m, off = CostModel.from_files(path, wl), CostModel.from_files(path, wl, off_peak_weight=1.0)
    assert sorted({(st.num_reqs, st.query_len) for st in m.off_peak_steps}) == \
        sorted({(st.num_reqs, st.query_len) for st in m.steps})
    assert sorted({(st.num_reqs, st.query_len) for st in m.steps}) == [(n, 4) for n in range(1, 5)] + \
        [(n, 2) for n in range(5, 9)]
    for sizes in ((4, 8, 16), (2, 4, 10, 16), (8, 12, 16), ()):
        runs = tuple(m.runs_as(sizes)) if sizes else ()
        alone = sum(st.probability * m.step_latency_ms(st.num_tokens, st.uniform_decode, runs, query_len=st.query_len,
                                                       num_reqs=st.num_reqs) for st in m.steps)
        assert m.expected_step_ms(sizes) == pytest.approx(alone), sizes
        # Off-peak traffic (decode steps of 1..8 requests, each at its tier's query length) through both paths: the
        # one-step-at-a-time off-peak figure and the vectorised expected step of a search weighing off-peak alone.
        assert off.expected_step_ms(sizes) == pytest.approx(m.off_peak_step_ms(sizes)), sizes


def test_a_profile_read_without_its_path_is_named_profile_in_every_line(tmp_path):
    # A Profile built in memory (a notebook, a refit) has no file: the model's notes and errors call it "profile".
    from tuner.profile.table import Profile, read_profile

    wl = handmade_workload()
    p = read_profile(handmade_profile(tmp_path, wl, [1, 2, 4, 8]))
    m = CostModel(Profile(p.rows, {k: v for k, v in p.metadata.items() if k != "weights_bytes"}, None), wl)
    assert any(n.startswith("no logits rows in profile:") for n in m.notes)
    assert any(n.startswith("weights_bytes missing in profile:") for n in m.notes)
    other = {**p.metadata, "model": {**p.metadata["model"], "dtype": "bfloat16"}}
    with pytest.raises(ModelError, match=r"^profile: measured with model.dtype='bfloat16'"):
        CostModel(Profile(p.rows, other, None), wl)


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_mixed_steps_of_a_one_token_decode_workload_are_no_uniform_decode_steps(tmp_path, runner):
    # q = 1: a decode step's requests carry 1 token each, and a mixed step's prompt chunks more; the vectorised step
    # (keys built once) dispatches each mixed step as the scalar path does, never as a uniform decode step.
    wl = handmade_workload(max_num_seqs=8, max_num_batched_tokens=32, model_runner=runner,
                           traffic={"requests": {"kind": "uniform", "min": 1, "max": 8}, "mixed_share": 0.5,
                                    "mixed_tokens": {"kind": "uniform", "min": 2, "max": 32}})
    m = CostModel.from_files(handmade_profile(tmp_path, wl, list(range(1, 33)), full_ms=lambda w: 0.2 + 0.01 * w,
                                              piecewise_ms=lambda w: 0.9 + 0.01 * w), wl)
    assert any(not st.uniform_decode for st in m.steps)
    for sizes in ((4, 8, 16, 32), (2, 8), (32,)):
        alone = sum(st.probability * m.step_latency_ms(st.num_tokens, st.uniform_decode, sizes, query_len=st.query_len,
                                                       num_reqs=st.num_reqs) for st in m.steps)
        assert m.expected_step_ms(sizes) == pytest.approx(alone), sizes
