"""Timing statistics and budgets, driven by a fake clock."""

from __future__ import annotations

import statistics

import pytest

from tuner.measure.timing import FakeClock, Measurement, WallClock, measure, quantile


def test_quantile_interpolates_like_numpy() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert quantile(values, 0.5) == 3.0
    assert quantile(values, 0.25) == 2.0
    assert quantile(values, 0.75) == 4.0
    assert quantile([1.0, 2.0], 0.5) == 1.5
    assert statistics.quantiles([1.0, 2.0, 3.0, 4.0, 10.0], n=4, method="inclusive") == [2.0, 3.0, 4.0]


def test_median_iqr_and_noise_flag() -> None:
    steady = Measurement((10.0, 10.1, 9.9, 10.0, 10.2))
    assert steady.median_ms == 10.0
    assert steady.iqr_ms == pytest.approx(0.1)
    assert not steady.noisy
    noisy = Measurement((10.0, 12.0, 8.0, 10.0, 14.0))
    assert noisy.iqr_ms == pytest.approx(2.0)
    assert noisy.relative_iqr == pytest.approx(0.2)
    assert noisy.noisy


def test_budgets_decide_warmup_and_repetitions() -> None:
    # Estimate 2 ms -> warm-up 10 ms is 4 more calls; their median 2 ms -> 20 ms budget is 10 reps.
    clock = FakeClock([2.0] + [2.0] * 4 + [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0])
    calls = []
    m = measure(lambda: calls.append(1), clock, warmup_ms=10, rep_ms=20, min_reps=3)
    assert m.warmup_reps == 5
    assert m.samples_ms == (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0)
    assert len(calls) == clock.calls == 15
    assert m.median_ms == 5.5


def test_slow_step_still_gets_min_reps_and_max_reps_caps() -> None:
    slow = measure(lambda: None, FakeClock([50.0] * 3), warmup_ms=10, rep_ms=20, min_reps=2)
    assert slow.warmup_reps == 1 and len(slow.samples_ms) == 2
    fast = measure(lambda: None, FakeClock([0.001] * 20), warmup_ms=0, rep_ms=100, min_reps=1, max_reps=19)
    assert len(fast.samples_ms) == 19


def test_bad_budgets_rejected() -> None:
    with pytest.raises(ValueError):
        measure(lambda: None, FakeClock([1.0]), min_reps=0)
    with pytest.raises(ValueError):
        measure(lambda: None, FakeClock([1.0]), warmup_ms=-1)


def test_wall_clock_times_each_call() -> None:
    samples = WallClock().time_ms(lambda: sum(range(1000)), 3)
    assert len(samples) == 3 and all(s > 0 for s in samples)
