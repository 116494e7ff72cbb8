"""Step timing: repetitions bounded by time budgets, CUDA events on a GPU, an injectable clock elsewhere,
and statistics (median, IQR, raw samples, a noise flag) in the manner of torch.utils.benchmark."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "NOISE_THRESHOLD",
    "Clock",
    "CudaEventClock",
    "FakeClock",
    "HostClock",
    "Measurement",
    "WallClock",
    "measure",
    "quantile",
]

NOISE_THRESHOLD = 0.05
"""A measurement is flagged noisy when IQR / median exceeds this."""


class Clock(Protocol):
    """Runs `fn` `reps` times and returns each repetition's duration in milliseconds."""

    def time_ms(self, fn: Callable[[], object], reps: int) -> list[float]: ...


class WallClock:
    """perf_counter around each call; for CPU runs, where a call returns when its work is done."""

    def time_ms(self, fn: Callable[[], object], reps: int) -> list[float]:
        out = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
        return out


class CudaEventClock:
    """A pair of CUDA events around each repetition, read after one synchronize at the end, so the host
    enqueues ahead as in serving and the reading is device time between the events (launch gaps included)."""

    def __init__(self, device: object = None) -> None:
        import torch

        self._torch = torch
        self.device = device

    def time_ms(self, fn: Callable[[], object], reps: int) -> list[float]:
        torch = self._torch
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        torch.cuda.synchronize(self.device)
        for start, end in zip(starts, ends):
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(self.device)
        return [s.elapsed_time(e) for s, e in zip(starts, ends)]


class HostClock:
    """Host time to issue each call: perf_counter around it with the device drained before (unmeasured) and after,
    so the reading is Python, dispatch and launches alone; a device clock cannot tell those from the GPU's work while
    the host runs ahead."""

    def __init__(self, synchronize: Callable[[], object]) -> None:
        self.synchronize = synchronize

    def time_ms(self, fn: Callable[[], object], reps: int) -> list[float]:
        out = []
        for _ in range(reps):
            self.synchronize()
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
            self.synchronize()
        return out


class FakeClock:
    """Test clock: calls `fn` as asked and hands out scripted durations in order."""

    def __init__(self, samples_ms: Sequence[float]) -> None:
        self._samples = list(samples_ms)
        self.calls = 0

    def time_ms(self, fn: Callable[[], object], reps: int) -> list[float]:
        out = []
        for _ in range(reps):
            fn()
            self.calls += 1
            if not self._samples:
                raise RuntimeError("FakeClock ran out of scripted samples")
            out.append(self._samples.pop(0))
        return out


def quantile(sorted_values: Sequence[float], p: float) -> float:
    """Linear-interpolation quantile (numpy's default) of already sorted values."""
    if not sorted_values:
        raise ValueError("quantile of no values")
    pos = (len(sorted_values) - 1) * p
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


@dataclass(frozen=True)
class Measurement:
    """Repetition times of one step, with the statistics the profile reports."""

    samples_ms: tuple[float, ...]
    """Every timed repetition, in order (warm-up excluded)."""
    warmup_reps: int = 0
    """Untimed-for-statistics calls made first (including the one that estimated the step)."""

    def _sorted(self) -> list[float]:
        if not self.samples_ms:
            raise ValueError("measurement has no samples")
        return sorted(self.samples_ms)

    @property
    def median_ms(self) -> float:
        return quantile(self._sorted(), 0.5)

    @property
    def iqr_ms(self) -> float:
        s = self._sorted()
        return quantile(s, 0.75) - quantile(s, 0.25)

    @property
    def relative_iqr(self) -> float:
        median = self.median_ms
        return self.iqr_ms / median if median > 0 else math.inf

    @property
    def noisy(self) -> bool:
        """IQR / median above NOISE_THRESHOLD: the median is less trustworthy than its digits suggest."""
        return self.relative_iqr > NOISE_THRESHOLD


def measure(
    fn: Callable[[], object],
    clock: Clock,
    *,
    warmup_ms: float = 25.0,
    rep_ms: float = 100.0,
    min_reps: int = 5,
    max_reps: int = 1000,
) -> Measurement:
    """Time `fn` do_bench-style: one call estimates its duration, warm-up repeats it for `warmup_ms`, then
    as many repetitions as fit `rep_ms` (between `min_reps` and `max_reps`) are timed one by one."""
    if min_reps < 1 or max_reps < min_reps:
        raise ValueError(f"{min_reps=} must be >= 1 and <= {max_reps=}")
    if warmup_ms < 0 or rep_ms < 0:
        raise ValueError(f"{warmup_ms=} and {rep_ms=} must be >= 0")
    # No cache flush between repetitions: a decode step streams every weight (gigabytes for real models),
    # far more than the L2 holds, so one repetition does not warm the cache for the next.
    estimate_ms = max(clock.time_ms(fn, 1)[0], 1e-6)
    warmup = min(max_reps, max(0, math.ceil(warmup_ms / estimate_ms) - 1))
    if warmup:
        # The first call pays one-time costs (allocator growth, autotuning); the warm-up median does not.
        estimate_ms = max(quantile(sorted(clock.time_ms(fn, warmup)), 0.5), 1e-6)
    reps = min(max_reps, max(min_reps, math.ceil(rep_ms / estimate_ms)))
    return Measurement(tuple(clock.time_ms(fn, reps)), warmup_reps=1 + warmup)
