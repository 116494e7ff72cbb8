"""The decision's load figures (`--rate`): each list compared (the engine's default, the tuned, the compact, and the
expected-step answer the fixed point started from) simulated at the rate from both starts, TPOT p99 against the rate
for each (the cliff marked where two operating points appear), and with `--tpot-slo` the highest rate each holds; all
as plain JSON data, so summary.json carries them and the report re-renders from it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from tuner.load.cliff import OperatingPoints, max_stable_rate, operating_points
from tuner.load.steady_state import LoadResult
from tuner.search.load_aware import LoadSearch, RecordedLoadSearch, serves

if TYPE_CHECKING:
    from tuner.model.costmodel import CostModel

__all__ = ["LoadFacts", "SWEEP_STEPS", "load_facts", "sweep_rates"]

SWEEP_STEPS = tuple(j / 2 for j in range(-4, 4))
"""The rate sweep: the rate times 2 to each of these powers (a quarter of it to 2.8 times it)."""
STABLE_PRECISION = 0.05
"""Relative precision of each list's highest held rate (`tuner.load.cliff.max_stable_rate`)."""


def sweep_rates(rate_per_s: float) -> list[float]:
    return [rate_per_s * 2 ** p for p in SWEEP_STEPS]


def _start(r: LoadResult) -> dict[str, Any]:
    return {"mean_step_width": r.mean_step_width, "tpot_p50_ms": r.tpot_p50_ms, "tpot_p99_ms": r.tpot_p99_ms,
            "ttft_p99_ms": r.ttft_p99_ms, "throughput_tok_s": r.throughput_tok_s, "mean_queue_len": r.mean_queue_len,
            "keeps_up": r.keeps_up, "uniform_share": r.uniform_share}


def _point(sizes: Sequence[int], points: OperatingPoints) -> dict[str, Any]:
    worst = serves(points)[1]
    return {"capture_sizes": list(sizes), "cliff": points.cliff, "settled": points.settled, "why": points.why,
            "tpot_p99_ms": None if worst == float("inf") else worst,
            "empty": _start(points.empty), "saturated": _start(points.saturated)}


@dataclass(frozen=True)
class LoadFacts:
    """What the lists do under the load, as summary.json records it (JSON-native values only)."""

    search: dict[str, Any]
    """The fixed point (`LoadSearch.as_dict`): rate, simulated seconds, iterations, how it ended, the chosen one."""
    load: dict[str, Any]
    """The load at the rate (`Load.as_dict`)."""
    tpot_slo_ms: float | None
    """`--tpot-slo`: the TPOT p99 target (None: not given)."""
    at_rate: dict[str, Any]
    """List name -> its operating points at the rate (both starts' figures, the cliff, the worse TPOT p99)."""
    sweep: dict[str, Any]
    """List name -> [{rate_per_s, tpot_p99_ms, cliff, keeps_up}] over `sweep_rates`."""
    stable: dict[str, Any]
    """List name -> its highest held rate under `--tpot-slo` (`StableRate.as_dict` less the probes' points); {} when
    no target was given."""

    @property
    def rate_per_s(self) -> float:
        return float(self.search["rate_per_s"])

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoadFacts:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


def load_facts(model: CostModel, search: LoadSearch | RecordedLoadSearch, lists: dict[str, Sequence[int]]) -> LoadFacts:
    """Each of `lists` (name -> capture sizes) at the search's rate and over the sweep, and its highest held rate
    when the search has a TPOT target; a list the fixed point already simulated at the rate is not simulated again."""
    load, duration, tpot_slo_ms = search.load, search.duration_s, search.tpot_slo_ms
    known = {it.capture_sizes: it.points for it in search.iterations}
    at_rate: dict[str, Any] = {}
    sweep: dict[str, Any] = {}
    stable: dict[str, Any] = {}
    done: dict[tuple[int, ...], str] = {}  # lists already swept (the compact list is often the tuned one)
    for name, sizes in lists.items():
        key = tuple(sizes)
        points = known.get(key) or operating_points(model, key, load, duration_s=duration)
        known[key] = points
        at_rate[name] = _point(key, points)
        if key in done:
            sweep[name] = sweep[done[key]]
            if tpot_slo_ms is not None:
                stable[name] = stable[done[key]]
            continue
        done[key] = name
        rows = []
        for rate in sweep_rates(search.rate_per_s):
            p = operating_points(model, key, load.at_rate(rate), duration_s=duration)
            worst = serves(p)[1]
            rows.append({"rate_per_s": rate, "tpot_p99_ms": None if worst == float("inf") else worst,
                         "cliff": p.cliff, "settled": p.settled,
                         "keeps_up": p.empty.keeps_up and p.saturated.keeps_up})
        sweep[name] = rows
        if tpot_slo_ms is not None:
            found = max_stable_rate(model, key, tpot_slo_ms, load, precision=STABLE_PRECISION, duration_s=duration)
            stable[name] = {"rate_per_s": found.rate_per_s, "capped": found.capped, "bracket": list(found.bracket),
                            "precision": found.precision, "probes": [p.as_dict() for p in found.probes]}
    facts = {"search": search.as_dict(), "load": load.as_dict(), "tpot_slo_ms": tpot_slo_ms, "at_rate": at_rate,
             "sweep": sweep, "stable": stable}
    # Through JSON once: the record in memory is then exactly what summary.json reads back (lists, string keys).
    return LoadFacts.from_dict(json.loads(json.dumps(facts)))
