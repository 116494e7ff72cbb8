"""Suggested buckets resolve every candidate capture size: buckets printed -> histogram parsed -> widths resolved."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from tuner.engines.registry import engine_of
from tuner.workload.spec import Workload, load_workload, parse_workload
from tuner.workload.traffic import (
    TokenHistogram,
    TrafficError,
    buckets_json,
    candidate_widths,
    combine,
    decode_widths,
    derived_spec,
    parse_exposition,
    spread_histogram,
)

WORKLOADS = Path(__file__).resolve().parents[2] / "workloads"


def _serving(**fields: object) -> Workload:
    return parse_workload({
        "name": "t", "model": {"preset": "tiny", "dtype": "float32"},
        "serving": {"max_num_seqs": 64, "max_num_batched_tokens": 2048, **fields},
        "traffic": {"requests": {"kind": "uniform", "min": 1, "max": 8}},
    })


def test_candidates_hold_the_default_grid_every_decode_width_and_a_stride_grid_above_the_ceiling() -> None:
    serving = load_workload(WORKLOADS / "dflash-llama-3.1-8b.yaml").serving  # q = 17, 128 seqs
    candidates = candidate_widths(serving)
    assert set(engine_of(serving).defaults().sizes) <= set(candidates)
    assert set(range(17, 128 * 17 + 1, 17)) <= set(candidates)
    above = [w for w in candidates if w > 512]
    assert set(range(528, 2176 + 1, 16)) <= set(above)  # vLLM's 16-token stride, continued past 512
    assert max(candidates) == 2176
    bounds = json.loads(buckets_json(serving))["iteration_tokens"]
    assert bounds == sorted(set(candidates) | {8192})


def test_dynamic_speculation_tiers_add_their_decode_widths() -> None:
    workload = _serving(num_speculative_tokens=3, speculative_schedule=[[1, 16, 3], [17, 64, 1]])
    widths = decode_widths(workload.serving)
    assert 16 * 4 in widths and 64 * 2 in widths and 20 * 2 in widths
    assert set(widths) <= set(candidate_widths(workload.serving))


def _observe(bounds: list[int], widths: list[int]) -> str:
    registry = CollectorRegistry()
    hist = Histogram("vllm:iteration_tokens_total", "tokens per step", ["model_name", "engine"], buckets=bounds,
                     registry=registry)
    for i, width in enumerate(widths):
        hist.labels("m", str(i % 2)).observe(width)
    return generate_latest(registry).decode()


def _dispatch_mix(workload: Workload, capture: list[int], steps: list[tuple[int, bool, float]]) -> dict:
    dispatcher = workload.engine.dispatcher(capture)
    mix: Counter = Counter()
    for width, uniform, p in steps:
        d = dispatcher.dispatch(width, uniform_decode=uniform)
        mix[(d.runtime_mode, d.padded_size)] += p
    return {k: v for k, v in mix.items() if v > 1e-6}


@pytest.mark.parametrize("spec", ["tiny-cpu.yaml", "dflash-llama-3.1-8b.yaml", "baseline-llama-3.1-8b.yaml"])
def test_round_trip_buckets_printed_histogram_parsed_widths_resolved(spec: str) -> None:
    base = load_workload(WORKLOADS / spec)
    serving = base.serving
    decode = decode_widths(serving)
    bounds = json.loads(buckets_json(serving))["iteration_tokens"]
    rng = random.Random(7)
    # True steps the way the spread assumes them: decode steps at n x q, mixed steps at any width that is not a
    # decode width (candidate sizes between multiples of q, and anything above the widest decode batch).
    mixed_pool = [w for w in candidate_widths(serving) if w not in set(decode)]
    mixed_pool += list(range(decode[-1] + 1, serving.max_num_batched_tokens + 1))
    true = [rng.choice(decode) for _ in range(400)] + [rng.choice(mixed_pool) for _ in range(100)]

    hist = combine(parse_exposition(_observe(bounds, true)))
    spread = spread_histogram(hist, serving)
    assert spread.unresolved == [] and spread.steps == len(true)
    assert abs(sum(spread.counts.values()) - len(true)) < 1e-6
    # Every decode width comes back exactly, with exactly its count.
    true_counts = Counter(true)
    for width in decode:
        assert spread.counts.get(width, 0.0) == pytest.approx(true_counts[width])

    derived = parse_workload(derived_spec(base, {"widths": spread.counts}, name="rt", description=""))
    from_hist = [(s.num_tokens, s.uniform_decode, s.probability) for s in derived.steps()]
    from_true = [(w, w in set(decode), c / len(true)) for w, c in true_counts.items()]
    candidates = candidate_widths(serving)
    captures = [engine_of(serving).defaults().sizes, candidates]
    captures += [sorted(rng.sample(candidates, k=min(len(candidates), rng.randint(3, 40)))) for _ in range(20)]
    for capture in captures:
        # For any capture list drawn from the candidates, each step replays the same graph (or runs eager)
        # whether it is taken from the histogram or from the true steps.
        # (The written weights keep six significant digits, hence approx.)
        expected = _dispatch_mix(derived, capture, from_true)
        assert _dispatch_mix(derived, capture, from_hist) == pytest.approx(expected, abs=1e-5), capture


def test_coarse_default_buckets_are_reported_unresolved_and_spread_at_multiples_of_q(vllm_metrics: str) -> None:
    serving = load_workload(WORKLOADS / "dflash-llama-3.1-8b.yaml").serving  # q = 17, widest decode 2176
    spread = spread_histogram(combine(parse_exposition(vllm_metrics)), serving)
    assert spread.unresolved and 17 in spread.unresolved
    assert abs(sum(spread.counts.values()) - 1700) < 1e-6
    # Decode range: steps only at multiples of 17 (bucket (32, 64] -> 34, 51); above 2176 every width.
    assert {w for w in spread.counts if 32 < w <= 64} == {34, 51}
    assert all(w % 17 == 0 for w in spread.counts if 16 < w <= 2176)
    assert 2177 in spread.counts and 5000 in spread.counts
    # A bucket with no multiple of q (8, 16] falls back to every width in it.
    assert {w for w in spread.counts if 8 < w <= 16} == set(range(9, 17))
    assert "multiples of q=17" in spread.assumptions[0]


def test_straddling_bucket_splits_by_width_count_and_inf_bucket_stops_at_the_budget() -> None:
    workload = _serving(num_speculative_tokens=3)  # q = 4, widest decode 256, budget 2048
    hist = TokenHistogram(bounds=(240.0, 300.0), cumulative=(0.0, 60.0), count=70.0)
    spread = spread_histogram(hist, workload.serving)
    # (240, 300]: 16 widths up to 256 (decode at 244..256 step 4) and 44 mixed widths, so 16/60 of 60 steps.
    assert sum(c for w, c in spread.counts.items() if w <= 256) == pytest.approx(16.0)
    assert sorted(w for w in spread.counts if w <= 256) == [244, 248, 252, 256]
    assert spread.counts[257] == pytest.approx(1.0)
    # +Inf: 10 steps spread over 301..2048.
    assert sum(c for w, c in spread.counts.items() if w > 300) == pytest.approx(10.0)
    assert max(spread.counts) == 2048
    assert any("+Inf" in a or "largest bucket bound" in a for a in spread.assumptions)


@pytest.mark.parametrize("hist, match", [
    (TokenHistogram((8.0,), (0.0,), 0.0), "zero steps"),
    (TokenHistogram((4096.0,), (0.0,), 5.0), "above max_num_batched_tokens=2048"),
    (TokenHistogram((1.2, 1.8), (0.0, 3.0), 3.0), "no whole token count"),
])
def test_unusable_histograms(hist: TokenHistogram, match: str) -> None:
    with pytest.raises(TrafficError, match=match):
        spread_histogram(hist, _serving().serving)
