"""Which widths a sweep keeps when time is short, on a CPU: the priority order (key widths first, the rest spread
evenly), the cost of a width estimated from the widths measured before it, and a whole sweep under `max_seconds`
or stopped midway, with an injected clock (the seconds each action takes are test fixtures, not measurements)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tuner.measure import profile as profile_module
from tuner.measure.profile import StepRunner, SweepOptions, candidate_widths, profile_workload
from tuner.measure.sweep_plan import (
    fit_to_seconds,
    key_widths,
    measure_seconds,
    interpolate,
    priority_order,
    spread_order,
)
from tuner.measure.timing import FakeClock, measure
from tuner.profile.table import read_profile
from tuner.workload.spec import load_workload

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny():
    return load_workload(ROOT / "workloads" / "tiny-cpu.yaml")


def test_key_widths_are_the_ends_the_ceiling_and_the_workloads_decode_widths() -> None:
    dflash = load_workload(ROOT / "workloads" / "dflash-llama-3.1-8b.yaml")
    ends, requests = key_widths(dflash)
    assert ends == [1, 2176, 512]  # smallest step, widest decode batch (128 x 17), the ceiling (= default max)
    assert requests == [17 * n for n in range(32, 129)]  # traffic: 32..128 requests of q = 17


def test_every_prefix_of_the_spread_order_is_spread_evenly() -> None:
    widths = list(range(1, 101))
    order = spread_order(widths)
    assert sorted(order) == widths and order[:3] == [1, 100, 50]
    for n in (5, 9, 17):
        gaps = [b - a for a, b in zip(sorted(order[:n]), sorted(order[:n])[1:])]
        assert max(gaps) <= 2 * min(gaps) + 1  # no end of the range is left bare


def test_priority_order_puts_key_widths_first_then_alternates_decode_and_grid() -> None:
    order = priority_order([1, 2, 4, 8, 16, 17, 34, 51, 68, 512, 2176], ends=[1, 2176, 512, 9999],
                           requests=[17, 34, 51, 68])
    assert order[:3] == [1, 2176, 512]  # ends that are candidates, in their order
    assert order[3:7] == [17, 2, 68, 16]  # decode widths and the others alternately, each from its two ends
    assert sorted(order) == [1, 2, 4, 8, 16, 17, 34, 51, 68, 512, 2176]


def test_measure_seconds_is_what_measure_spends() -> None:
    for step_ms, warmup_ms, rep_ms, min_reps in ((2.0, 25.0, 100.0, 5), (350.0, 25.0, 100.0, 5), (0.5, 0, 0, 3)):
        clock = FakeClock([step_ms] * 1000)
        measure(lambda: None, clock, warmup_ms=warmup_ms, rep_ms=rep_ms, min_reps=min_reps, max_reps=1000)
        spent = measure_seconds(step_ms / 1e3, warmup_ms=warmup_ms, rep_ms=rep_ms, min_reps=min_reps, max_reps=1000)
        assert spent == pytest.approx(clock.calls * step_ms / 1e3)
    # A 2176-token step of ~0.35 s: the 125 ms budgets would say 0.125 s per mode, but 6 calls are made.
    assert measure_seconds(0.35, warmup_ms=25, rep_ms=100, min_reps=5, max_reps=1000) == pytest.approx(6 * 0.35)


def test_fit_takes_widths_in_order_skipping_those_too_expensive() -> None:
    cost = {1: 1.0, 640: 5.0, 512: 2.0, 4: 1.0, 2: 1.0}
    assert fit_to_seconds([1, 640, 512, 4, 2], cost.__getitem__, 4.5) == [1, 512, 4]
    assert interpolate({512: 2.0, 64: 0.5, 1: 0.25}, 288) == pytest.approx(1.25)
    assert interpolate({512: 2.0}, 600) == 2.0 and interpolate({512: 2.0, 64: 0.5}, 8) == 0.5
    assert interpolate({}, 8) is None


class _Time:
    """`time` for the sweep module: perf_counter is a clock the scripted runner advances."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class _Graph:
    def __init__(self, body, num_tokens: int) -> None:
        self.body, self.num_tokens, self.capture_s = body, num_tokens, 0.0

    def replay(self) -> None:
        self.body()


class _TimedGraphs(StepRunner):
    """Pretends to capture graphs on a CPU and advances the injected clock: an eager step (or a graph's replay) of
    w tokens takes w x 1 ms, a PIECEWISE capture 0.2 s, a FULL one 0.05 s (fixtures). `stop_after` raises
    KeyboardInterrupt at the LM-head timing of that many-th width."""

    def __init__(self, model, clock: _Time, stop_after: int | None = None) -> None:
        super().__init__(model, clock=FakeClock([1.0] * 100_000))
        self.graphs_supported, self.unsupported_reason = True, None
        self.time, self.stop_after, self.timed = clock, stop_after, []

    def new_pool(self) -> object:
        return object()

    def eager(self, num_tokens: int) -> None:
        self.time.now += num_tokens * 1e-3

    def split_eager(self, num_tokens: int) -> None:
        self.time.now += num_tokens * 1e-3

    def capture(self, num_tokens: int, pool: object) -> _Graph:
        self.time.now += 0.05
        return _Graph(lambda: self.eager(num_tokens), num_tokens)

    def capture_piecewise(self, num_tokens: int, pool: object) -> _Graph:
        self.time.now += 0.2
        return _Graph(lambda: self.eager(num_tokens), num_tokens)

    def logits(self, num_tokens: int) -> None:
        if num_tokens not in self.timed:
            self.timed.append(num_tokens)
        if self.stop_after is not None and len(self.timed) > self.stop_after:
            raise KeyboardInterrupt


def _sweep(tiny, out: Path, monkeypatch, *, max_seconds: float | None = None, stop_after: int | None = None):
    clock = _Time()
    monkeypatch.setattr(profile_module, "time", clock)
    runners = []

    def factory(model):
        runners.append(_TimedGraphs(model, clock, stop_after))
        return runners[-1]

    options = SweepOptions(warmup_ms=0, rep_ms=0, min_reps=1, max_reps=1, max_seconds=max_seconds)
    result = profile_workload(tiny, out, device="cpu", compile=False, options=options, progress=False,
                              runner_factory=factory)
    return result, runners[0]


def test_time_thinning_keeps_the_key_widths_and_spreads_the_rest(tiny, tmp_path, monkeypatch) -> None:
    """162 candidates, each 0.5 to 7 s of scripted work, in 60 s: the widths kept are the key ones and an even spread,
    not the widest ones (which a cut of the largest-first capture order used to keep)."""
    candidates = candidate_widths(tiny)
    result, _ = _sweep(tiny, tmp_path, monkeypatch, max_seconds=60)
    kept = sorted(result.measured)
    meta = result.metadata
    assert not result.complete and 10 <= len(kept) < len(candidates)
    assert {1, 2, 4, 512, 640} <= set(kept)  # both ends, the ceiling, the widest decode batch, the smallest decode
    assert meta["widths_left_for_time"] == sorted(set(candidates) - set(kept))
    thirds = [sum(lo <= w < hi for w in kept) for lo, hi in ((1, 214), (214, 427), (427, 641))]
    assert min(thirds) >= 3  # every third of the range keeps widths
    assert meta["sweep_s"] <= 60  # the plan's estimate was an upper bound: the sweep finished within its time
    table = read_profile(result.csv_path)
    assert table.widths() == kept and {r.status for r in table.rows} == {"ok"}


def test_a_sweep_stopped_midway_keeps_the_key_small_widths(tiny, tmp_path, monkeypatch) -> None:
    with pytest.raises(KeyboardInterrupt):
        _sweep(tiny, tmp_path, monkeypatch, stop_after=5)
    partial = read_profile(tmp_path / "tiny-cpu.csv")
    # Largest first, the five widths kept would have been 640, 636, 632, 628, 624.
    assert partial.widths() == [1, 2, 4, 512, 640] and partial.metadata["complete"] is False
    # Everything captured before the stop is in the metadata too, timed or not.
    assert len(partial.metadata["measurements"]) == len(candidate_widths(tiny))


def test_ctrl_c_after_the_set_up_keeps_the_metadata(tiny, tmp_path, monkeypatch, capsys) -> None:
    from tuner.cli import main

    class Stop(StepRunner):
        def eager(self, num_tokens):
            raise KeyboardInterrupt  # the first timed width: set-up and memory readings are done

    real = profile_module.profile_workload
    monkeypatch.setattr(profile_module, "profile_workload", lambda *a, **k: real(*a, runner_factory=Stop, **k))
    code = main(["profile", str(ROOT / "workloads" / "tiny-cpu.yaml"), "--device", "cpu", "--out", str(tmp_path),
                 "--sizes", "4", "8", "--no-compile", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 130 and len(err.strip().splitlines()) == 1
    assert f"kept the metadata (compile time, memory readings) in {tmp_path / 'tiny-cpu.json'}" in err
    meta = json.loads((tmp_path / "tiny-cpu.json").read_text())
    assert meta["widths_done"] == [] and meta["activation_peaks"]["decode_step_tokens"] == 8
    assert not (tmp_path / "tiny-cpu.csv").exists()


def test_out_of_memory_building_the_model_is_one_line_naming_the_memory(tiny, tmp_path, monkeypatch, capsys) -> None:
    from tuner.cli import main

    def no_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 16.00 GiB (scripted)")

    monkeypatch.setattr(profile_module, "build_model", no_memory)
    code = main(["profile", str(ROOT / "workloads" / "tiny-cpu.yaml"), "--device", "cpu", "--out", str(tmp_path),
                 "--sizes", "64", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    # tiny: 2 layers, hidden 64, vocabulary 512, float32; 64 tokens = 16 requests of 4 at context 64.
    assert err.startswith("cgtune profile: error: tiny-cpu: out of memory building the model on cpu: it asks ")
    assert "GiB of KV cache for 64 tokens at context 64" in err
    assert not list(tmp_path.iterdir())
