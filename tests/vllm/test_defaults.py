"""vLLM 0.33's default capture sizes: pinned regression cases, a rules-derived fidelity suite, properties."""

from __future__ import annotations

import itertools
import random
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.engines.registry import engine_of
from tuner.engines.serving import ServingConfig
from tuner.engines.vllm import default_capture_sizes, uniform_decode_tiers
from tuner.engines.vllm.defaults import (
    InvalidScheduleError,
    capture_ceiling,
    dense_speculative_schedule,
    request_count_grid,
    validate_schedule,
    widest_decode_batch,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vllm034"))  # import-mode=importlib
from hand_cases import FAMILIES  # noqa: E402


# ----------------------------------------------------------------------------- pinned from vLLM's tests


@pytest.mark.parametrize(
    ("max_num_seqs", "spec_tokens", "widest_captured"),
    [
        (8, 0, True), (32, 0, True), (64, 7, True), (256, 1, True), (32, 16, False),
        (64, 16, False), (128, 16, False), (256, 24, False), (33, 16, False), (24, 16, True),
    ],
)
def test_vllm_regression_expectations(max_num_seqs, spec_tokens, widest_captured):
    q = 1 + spec_tokens
    result = default_capture_sizes(max_num_seqs, spec_tokens)
    assert (max_num_seqs * q in result.sizes) is widest_captured
    # With these defaults the final max is min(max_num_seqs*q*2, 512) clamped by the token budget.
    assert result.max_size == min(max_num_seqs * q * 2, 512, 8192) == result.sizes[-1]


def test_seed_widths_never_in_a_default_list():
    dflash = default_capture_sizes(128, 16)
    suffix = default_capture_sizes(256, 24)
    assert 2176 not in dflash.sizes and 2176 in dflash.uniform_decode_sizes_without_graph
    assert 6400 not in suffix.sizes and 6400 in suffix.uniform_decode_sizes_without_graph
    assert dflash.max_size == suffix.max_size == 512


def test_ngram_32x17_stops_at_the_ceiling():
    result = default_capture_sizes(32, 16)
    assert 544 not in result.sizes
    assert result.max_size == 512
    assert result.uniform_decode_sizes_without_graph == [527, 544]


def test_mtp1_with_300_requests_adds_nothing_above_512():
    result = default_capture_sizes(300, 1)
    assert max(result.sizes) == 512
    assert all(s <= 512 for s in result.sizes)
    assert result.uniform_decode_sizes_without_graph == list(range(514, 601, 2))


def test_blackwell_ceiling_is_1024():
    result = default_capture_sizes(64, 16, gpu_capability=(10, 0))
    assert result.max_size == 1024
    assert 952 in result.sizes and 1020 not in result.sizes  # 56 requests x 17 on the grid, 60 not
    assert default_capture_sizes(64, 16, gpu_capability=(12, 0)).max_size == 512  # consumer Blackwell


G512 = [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]
G1024 = [1, 2, 4, *range(8, 256, 8), *range(256, 1025, 16)]


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f"{f[0]}.{f[1]}")
def test_only_the_10x_family_has_the_1024_token_ceiling(family):
    # vLLM's is_device_capability_family(100): capability.to_int() // 10 == 10, so 10.0 (B200) and 10.3 (B300), not
    # 11.0 (Thor) or 12.x (RTX PRO 6000, RTX 5090, DGX Spark); tests/vllm/test_vllm_oracle.py runs vLLM's own code.
    # 64 x 17 = 1088: max min(2176, ceiling); the request grid 1, 2, 4, 8, ..., 64 at 17 tokens within it adds
    # 17, 34, 68, 408 (and 680, 952 within 1024); 136, 272, 544 and 816 are on the grid already.
    want = sorted({*G1024, 17, 34, 68, 408, 680, 952}) if family[0] == 10 else sorted({*G512, 17, 34, 68, 408})
    assert capture_ceiling(family) == want[-1]
    result = default_capture_sizes(64, 16, gpu_capability=family)
    assert (result.sizes, result.max_size) == (want, want[-1])
    assert result.uniform_decode_sizes_without_graph == [17 * n for n in range(1, 65) if 17 * n > want[-1]]
    engine = engine_of(ServingConfig(max_num_seqs=64, num_speculative_tokens=16, gpu_capability=family,
                                     vllm_version="0.33"))
    assert engine.defaults().sizes == want


def test_plain_default_grid():
    result = default_capture_sizes(256)
    assert result.sizes == [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]


def test_none_mode_and_enforce_eager_capture_nothing():
    assert default_capture_sizes(128, 16, cudagraph_mode="NONE").sizes == []
    assert default_capture_sizes(128, 16, cudagraph_mode="NONE").max_size == 0
    assert default_capture_sizes(128, enforce_eager=True).max_size == 0


def test_explicit_list_only_dedups_filters_and_sorts():
    result = default_capture_sizes(8, 0, 1000, cudagraph_capture_sizes=[2176, 4, 4, 1, 999, 1001])
    assert result.sizes == [1, 4, 999]
    assert result.max_size == 999


def test_user_max_inconsistent_with_list_raises_vllm_message():
    with pytest.raises(ValueError, match=r"customized max_cudagraph_capture_size\(=600\) should be consistent "
                                         r"with the max value of cudagraph_capture_sizes\(=544\)"):
        default_capture_sizes(32, 16, max_cudagraph_capture_size=600, cudagraph_capture_sizes=[17, 544])


def test_user_max_alone_is_truncated_silently():
    result = default_capture_sizes(64, max_cudagraph_capture_size=100)
    assert result.max_size == 96
    assert result.warnings == ["Truncating max_cudagraph_capture_size to 96"]


def test_user_max_skips_uniform_decode_sizes():
    # A user-given max bypasses the speculative grid (vLLM only builds it when no max is given).
    result = default_capture_sizes(32, 16, max_cudagraph_capture_size=544)
    assert 17 not in result.sizes and 544 in result.sizes


def test_token_budget_is_appended_when_it_clamps():
    result = default_capture_sizes(256, 0, 100)
    assert result.sizes[-1] == 100 and 96 in result.sizes
    assert result.max_size == 100


def test_interactivity_captures_every_width_up_to_32():
    result = default_capture_sizes(256, performance_mode="interactivity")
    assert result.sizes[:32] == list(range(1, 33))
    assert 40 in result.sizes


def test_tiny_budget_below_one_raises():
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        default_capture_sizes(8, max_cudagraph_capture_size=0)


def test_request_count_grid():
    assert request_count_grid(5, 512) == [1, 2, 4, 5]
    assert request_count_grid(300, 512) == [1, 2, 4, *range(8, 256, 8), 256, 272, 288, 300]
    assert request_count_grid(2000, 512)[-1] == 512


def test_dense_schedule_carries_k_across_gaps_and_tail():
    dense = dense_speculative_schedule([[1, 16, 4], [32, 128, 2]], 200, 3)
    assert dense[1:17] == [3] * 16  # K clamped to num_speculative_tokens
    assert dense[17:32] == [3] * 15  # gap carries the previous K
    assert dense[32:129] == [2] * 97
    assert dense[129:] == [2] * 72  # tail carries the last K


def test_schedule_tiers():
    assert uniform_decode_tiers(256, 3, [[1, 16, 3], [17, 256, 1]]) == [(2, 256), (4, 16)]
    assert uniform_decode_tiers(256, 3, None) == [(4, 256)]


# vLLM's validate_and_normalize_dynamic_sd_schedule (vllm/v1/spec_decode/dynamic/utils.py) rejects each of these;
# vLLM runs it at startup (scheduler, CUDA-graph manager), so such a schedule never serves: cgtune refuses it too.
REJECTED_SCHEDULES = [
    ([[2, 16, 3]], "must start at 1"),
    ([[1, 16, 3], [10, 20, 1]], r"\(1, 16\) and \(10, 20\) overlap"),
    ([[1, 16, 3], [1, 16, 2]], r"\(1, 16\) and \(1, 16\) overlap"),  # a repeated range overlaps itself
    ([[17, 64, 1], [1, 20, 3]], r"\(1, 20\) and \(17, 64\) overlap"),  # sorted by start first, as vLLM does
    ([[1, 0, 3]], r"range \(1, 0\) must be positive"),
    ([[3, 2, 1]], "start must be <= end"),
    ([[1, 4, -1]], "K=-1"),
    ([], "non-empty list"),
    ("x", "non-empty list"),
    ([[1, 2]], "must be \\[range_start, range_end, K\\]"),
]


@pytest.mark.parametrize(("schedule", "message"), REJECTED_SCHEDULES)
def test_schedules_vllm_rejects_are_refused(schedule, message):
    with pytest.raises(InvalidScheduleError, match=message):
        validate_schedule(schedule)
    with pytest.raises(InvalidScheduleError, match=message):
        default_capture_sizes(256, 3, speculative_schedule=schedule)
    with pytest.raises(InvalidScheduleError, match=message):  # also without graphs: vLLM checks it at startup
        default_capture_sizes(256, 3, speculative_schedule=schedule, enforce_eager=True)


def test_a_gapped_schedule_is_valid_and_normalized_by_start():
    # vLLM accepts gaps (the dense lookup fills them); entries come back sorted by start, K kept as written.
    assert validate_schedule([[32, 128, 2], [1, 16, 4]]) == [(1, 16, 4), (32, 128, 2)]
    assert default_capture_sizes(128, 3, speculative_schedule=[[1, 16, 4], [32, 128, 2]]).max_size == 512


def test_a_schedule_needs_speculation():
    # vLLM's lookup: "vllm_num_speculative_tokens must be > 0" (a schedule lives in a speculative config).
    with pytest.raises(InvalidScheduleError, match="num_speculative_tokens >= 1"):
        default_capture_sizes(64, 0, speculative_schedule=[[1, 64, 1]])


def test_widest_decode_batch_follows_the_schedule():
    assert widest_decode_batch(128, 16) == (128, 17)
    # K=3 (q=4) up to 16 requests: 64 tokens; K=1 (q=2) up to 256: 512 tokens, the widest.
    assert widest_decode_batch(256, 3, [[1, 16, 3], [17, 256, 1]]) == (256, 2)
    # K=16 up to 64 requests (64 x 17 = 1088) beats K=0 up to 128 (128 x 1).
    assert widest_decode_batch(128, 16, [[1, 64, 16], [65, 128, 0]]) == (64, 17)
    # A gap carries the previous K: 17..31 requests still draft K=3, so 31 x 4 = 124 > 64 x 1.
    assert widest_decode_batch(64, 3, [[1, 16, 3], [32, 64, 0]]) == (31, 4)


def test_dynamic_schedule_adds_each_tiers_widths():
    result = default_capture_sizes(256, 3, speculative_schedule=[[1, 16, 3], [17, 256, 1]])
    # K=3 tier up to 16 requests (q=4): 4..64; K=1 tier up to 256 requests (q=2): 2..512.
    assert {4 * n for n in (1, 2, 4, 8, 16)} <= set(result.sizes)
    assert {2 * n for n in (1, 2, 4, 8, 16, 24, 256)} <= set(result.sizes)
    assert result.max_size == 512


# ----------------------------------------------------------------------------- rules-derived fidelity suite
def _oracle(max_num_seqs, k, mnbt, cap=(9, 0), mode="balanced", user_max=None, sizes=None, schedule=None):
    """The rules of the facts file, written as literally as possible (sets, no shared helpers)."""
    q = 1 + k
    tiers = [(q, max_num_seqs)]
    if schedule is not None and k > 0:
        ok = isinstance(schedule, list) and len(schedule) > 0 and all(
            isinstance(e, list) and len(e) == 3 and e[0] > 0 and e[1] > 0 and e[0] <= e[1] and e[2] >= 0
            for e in schedule)
        if ok:
            rs = sorted((e[0], e[1]) for e in schedule)
            ok = rs[0][0] == 1 and all(b[0] > a[1] for a, b in zip(rs, rs[1:]))
        if not ok:
            return None  # vLLM refuses to start
        if ok:
            kk = {}
            entries = sorted(schedule)
            for bs in range(1, max_num_seqs + 1):
                cur = None
                for lo, hi, kv in entries:
                    if lo <= bs:
                        cur = kv  # last range starting at or before bs: inside it, or carried forward
                kk[bs] = min(k, cur)
            widest = {}
            for bs in range(1, max_num_seqs + 1):
                widest[kk[bs] + 1] = bs
            tiers = sorted(widest.items())
    ud = set()
    if user_max is None:
        d = 1024 if cap[0] == 10 else 512
        m = min(max_num_seqs * q * 2, d)
        if q > 1:
            for ql, tmax in tiers:
                r = min(tmax, d)
                grid = {x for x in (1, 2, 4) if x <= r} | set(range(8, min(r + 1, 256), 8)) | set(
                    range(256, r + 1, 16)) | {r}
                ud |= {n * ql for n in grid if n * ql <= m}
        elif max_num_seqs <= m:
            ud = {max_num_seqs}
    else:
        m = user_max
    m = min(mnbt, m)
    if sizes is not None:
        out = sorted({s for s in sizes if s <= mnbt})
    else:
        out = set(range(1, min(m, 32) + 1)) if mode == "interactivity" else {x for x in (1, 2, 4) if x <= m}
        if m >= 8:
            out |= set(range(8, min(m + 1, 256), 8))
        if m >= 256:
            out |= set(range(256, m + 1, 16))
        if mnbt <= m:
            out.add(mnbt)
        out |= {s for s in ud if s <= mnbt}
        out = sorted(out)
    return out, (out[-1] if out else 0)


def _configs():
    rng = random.Random(54418)
    seqs = [1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 63, 64, 100, 128, 129, 255, 256, 257, 300, 512, 1024]
    cases = []
    for max_num_seqs, k in itertools.product(seqs, [0, 1, 2, 3, 7, 16, 24]):
        cases.append(dict(max_num_seqs=max_num_seqs, k=k, mnbt=8192))
    for _ in range(150):  # tiny and off-stride token budgets, Blackwell, interactivity
        cases.append(dict(
            max_num_seqs=rng.choice(seqs), k=rng.choice([0, 1, 3, 5, 16]),
            mnbt=rng.choice([1, 3, 7, 8, 9, 50, 100, 255, 256, 257, 500, 513, 1000, 2048]),
            cap=rng.choice([(8, 0), (9, 0), (10, 0), (12, 0)]),
            mode=rng.choice(["balanced", "interactivity", "throughput"]),
        ))
    for _ in range(60):  # dynamic schedules, valid and invalid
        n = rng.randint(1, 4)
        bounds = sorted(rng.sample(range(1, 300), n * 2))
        sched = [[bounds[2 * i], bounds[2 * i + 1], rng.randint(0, 6)] for i in range(n)]
        if rng.random() < 0.7:
            sched[0][0] = 1
        cases.append(dict(max_num_seqs=rng.choice([16, 64, 128, 256]), k=rng.choice([1, 3, 5]), mnbt=8192,
                          schedule=sched))
    for _ in range(40):  # user max, alone or with a list that agrees
        sizes = sorted(rng.sample(range(1, 3000), rng.randint(1, 8)))
        mnbt = rng.choice([512, 2048, 8192])
        kept = [s for s in sizes if s <= mnbt]
        with_list = rng.random() < 0.5 and kept
        cases.append(dict(max_num_seqs=rng.choice([8, 64, 256]), k=rng.choice([0, 3]), mnbt=mnbt,
                          user_max=kept[-1] if with_list else rng.randint(1, 3000),
                          sizes=sizes if with_list else None))
    for _ in range(30):  # explicit lists alone
        cases.append(dict(max_num_seqs=rng.choice([8, 64, 256]), k=rng.choice([0, 16]),
                          mnbt=rng.choice([100, 8192]), sizes=rng.sample(range(1, 9000), rng.randint(1, 20))))
    return cases


@pytest.mark.parametrize("case", _configs(), ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items())[:90])
def test_fidelity_against_rules(case):
    expected = _oracle(**case)
    args = dict(
        gpu_capability=case.get("cap", (9, 0)), performance_mode=case.get("mode", "balanced"),
        max_cudagraph_capture_size=case.get("user_max"), cudagraph_capture_sizes=case.get("sizes"),
        speculative_schedule=case.get("schedule"),
    )
    if expected is None:
        with pytest.raises(InvalidScheduleError):
            default_capture_sizes(case["max_num_seqs"], case["k"], case["mnbt"], **args)
        return
    expected_sizes, expected_max = expected
    result = default_capture_sizes(case["max_num_seqs"], case["k"], case["mnbt"], **args)
    assert result.sizes == expected_sizes
    assert result.max_size == expected_max


def test_fidelity_suite_is_broad():
    assert len(_configs()) >= 400


# ----------------------------------------------------------------------------- properties
@settings(max_examples=300, deadline=None)
@given(
    max_num_seqs=st.integers(1, 2048),
    k=st.integers(0, 32),
    mnbt=st.integers(1, 32768),
    cap=st.sampled_from([(8, 0), (8, 9), (9, 0), (10, 0), (12, 0)]),
    mode=st.sampled_from(["balanced", "interactivity", "throughput"]),
)
def test_default_list_properties(max_num_seqs, k, mnbt, cap, mode):
    result = default_capture_sizes(max_num_seqs, k, mnbt, gpu_capability=cap, performance_mode=mode)
    ceiling = 1024 if cap[0] == 10 else 512
    assert result.sizes == sorted(set(result.sizes))
    assert all(1 <= s <= mnbt for s in result.sizes)
    assert all(s <= ceiling for s in result.sizes)
    assert result.max_size == result.sizes[-1]
    widest = max_num_seqs * (1 + k)
    assert (widest in result.uniform_decode_sizes_without_graph) == (result.max_size < widest <= mnbt)


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(1, 20000), min_size=1, max_size=40), mnbt=st.integers(1, 16384))
def test_explicit_list_properties(sizes, mnbt):
    result = default_capture_sizes(64, 3, mnbt, cudagraph_capture_sizes=sizes)
    assert result.sizes == sorted({s for s in sizes if s <= mnbt})
    assert result.max_size == (result.sizes[-1] if result.sizes else 0)
