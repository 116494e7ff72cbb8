"""Bad load input is one line naming the field and its value (LoadError, a ValueError), never a traceback from
inside the simulator."""

from __future__ import annotations

import pytest

from tuner.load import Lengths, Load, LoadError, max_stable_rate, operating_points, simulate
from tuner.model.costmodel import CostModel


@pytest.mark.parametrize("make,field", [
    (lambda: Load(Lengths(4), Lengths(4), rate_per_s=0.0), "rate_per_s=0.0"),
    (lambda: Load(Lengths(4), Lengths(4), rate_per_s=-3), "rate_per_s=-3"),
    (lambda: Load(Lengths(4), Lengths(4), rate_per_s=float("inf")), "rate_per_s=inf"),
    (lambda: Load(Lengths(4), Lengths(4)), "rate_per_s=None"),
    (lambda: Load(Lengths(4), Lengths(4), rate_per_s=1.0, arrival_times_s=(0.0,)), "rate_per_s=1.0"),
    (lambda: Load(Lengths(4), Lengths(4), arrival_times_s=(0.0, -1.0)), "arrival_times_s holds -1.0"),
    (lambda: Load(Lengths(4), Lengths(4), arrival_times_s=()), "arrival_times_s=()"),
    (lambda: Load(Lengths(4), Lengths(4), rate_per_s=1.0, acceptance=0.5), "acceptance=0.5"),
    (lambda: Lengths(0), "Lengths.min=0"),
    (lambda: Lengths(8, 4), "Lengths.max=4"),
    (lambda: Lengths(2.5), "Lengths.min=2.5"),  # type: ignore[arg-type]
])
def test_bad_load_fields_name_the_field_and_value(make: object, field: str) -> None:
    with pytest.raises(LoadError) as info:
        make()  # type: ignore[operator]
    msg = str(info.value)
    assert field in msg and "\n" not in msg
    assert isinstance(info.value, ValueError)


def test_acceptance_above_q_is_refused_when_the_workload_is_known(hand_model: CostModel) -> None:
    load = Load(Lengths(4), Lengths(4), rate_per_s=1.0, acceptance=1.5)  # the hand workload has q = 1
    with pytest.raises(LoadError, match=r"acceptance=1\.5 must be <= q=1"):
        simulate(hand_model, [], load)


@pytest.mark.parametrize("kwargs,field", [
    ({"duration_s": 0.0}, "duration_s=0.0"), ({"max_steps": 0}, "max_steps=0"),
    ({"initial_waiting": -1}, "initial_waiting=-1"), ({"warmup_share": 1.0}, "warmup_share=1.0"),
])
def test_bad_simulation_settings_name_the_setting(hand_model: CostModel, kwargs: dict, field: str) -> None:
    with pytest.raises(LoadError, match=field):
        simulate(hand_model, [], Load(Lengths(4), Lengths(4), rate_per_s=1.0), **kwargs)


def test_bad_cliff_settings_name_the_setting(hand_model: CostModel) -> None:
    load = Load(Lengths(4), Lengths(4), rate_per_s=1.0)
    with pytest.raises(LoadError, match="tpot_slo_ms=0"):
        max_stable_rate(hand_model, [], 0, load)
    with pytest.raises(LoadError, match=r"bracket=\(5.0, 1.0\)"):
        max_stable_rate(hand_model, [], 1.0, load, bracket=(5.0, 1.0))
    with pytest.raises(LoadError, match="precision=0"):
        max_stable_rate(hand_model, [], 1.0, load, precision=0)
    with pytest.raises(LoadError, match="initial_waiting=0"):
        operating_points(hand_model, [], load, initial_waiting=0)
