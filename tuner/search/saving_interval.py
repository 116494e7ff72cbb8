"""How sure the saving is: a seeded bootstrap interval of the expected step latency the tuned list saves against
vLLM's default (default - tuned), from the profile's own timing samples.

Each replicate re-draws every timed reading of the profile (each width's eager, graph, LM-head and drafter latency),
refits the cost model on it and takes the difference again; the interval is the replicates' central percentiles. A
reading is re-drawn as the median of a resample, with replacement, of its raw samples (the metadata's
`measurements`), moved by how far that median lies from the sample median, so a replicate without spread is the
reading itself. A reading whose samples were not kept but whose IQR was is re-drawn as the median of n draws from a
normal distribution of that IQR around it (sigma = IQR / 1.349, the normal's IQR), n being the median sample count of
the profile's readings that kept theirs (else its `timing.min_reps`, else 5): the same median's spread, assumed
normal. A reading with neither stays fixed."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tuner.model.costmodel import CostModel
from tuner.profile.table import Profile, ProfileRow
from tuner.workload.spec import Step, Workload

__all__ = ["LEVEL", "REPLICATES", "SEED", "SETTLE_EVERY", "SETTLE_MS", "SavingInterval", "saving_interval"]

LEVEL = 0.95
"""Central share of the replicates the interval spans."""
REPLICATES = 500
"""Bootstrap replicates, each refitting the cost model once (about 8 ms on the DFlash test's GPU-scale synthetic
profile on a 2-core machine, so 4 s); the ends' Monte Carlo error is about 6% of the interval's half-width."""
SEED = 0
"""The replicates' seed: the same profile and lists give the same interval."""
SETTLE_MS = 1e-4
"""The precision the report prints the interval's ends in (4 decimals of a millisecond): a bootstrap whose ends no
longer move at it stops early."""
SETTLE_EVERY = 100
"""Replicates between two looks at the ends; the first look is after twice as many, and the bootstrap stops at the
first look whose ends, rounded to SETTLE_MS, are the previous look's."""
_NORMAL_IQR_SIGMAS = 1.349
"""A normal distribution's IQR in standard deviations (2 x 0.6745)."""
_DEFAULT_REPS = 5
"""`cgtune profile`'s least repetitions per reading, where a profile says nothing of its sample counts."""
_DRAFTER = "drafter_"


@dataclass(frozen=True)
class SavingInterval:
    """The interval of (default - tuned) expected step latency, and what it was drawn from."""

    point_ms: float
    """The saving on the profile as measured."""
    low_ms: float
    """Lower end of the interval."""
    high_ms: float
    """Upper end."""
    level: float
    """Share of the replicates between the ends."""
    replicates: int
    """Replicates drawn (0 when no reading has any spread: every replicate would be the point)."""
    seed: int
    """The replicates' seed."""
    from_samples: int
    """Readings re-drawn from their raw samples."""
    from_iqr: int
    """Readings re-drawn from their IQR (no samples kept)."""
    fixed: int
    """Readings with no spread to draw from (samples all alike, or an IQR of 0 and no samples)."""
    iqr_samples: int
    """n of the normal draws behind an IQR-only reading."""
    settled: bool = False
    """It stopped before its most replicates: its ends, rounded to SETTLE_MS, stood still between two looks."""

    @property
    def includes_zero(self) -> bool:
        """The interval reaches 0: the profile's spread cannot tell the lists apart."""
        return self.low_ms <= 0.0 <= self.high_ms

    def as_dict(self) -> dict[str, Any]:
        return {"point_ms": self.point_ms, "level": self.level, "replicates": self.replicates, "seed": self.seed,
                "includes_zero": self.includes_zero, "readings_from_samples": self.from_samples,
                "readings_from_iqr": self.from_iqr, "readings_fixed": self.fixed,
                "iqr_normal_samples": self.iqr_samples, "settled": self.settled}


class _StepsOnce:
    """The workload with its step distribution computed once: a replicate refits the profile, never the traffic
    (the steps are most of a refit's time)."""

    def __init__(self, workload: Workload) -> None:
        self._workload = workload
        self._steps = workload.steps()

    def steps(self) -> list[Step]:
        return list(self._steps)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._workload, name)


def _samples(metadata: dict[str, Any], row: ProfileRow) -> list[float]:
    """A reading's raw samples (ms) from the profile metadata's `measurements` (the drafter's under `drafter`)."""
    if row.mode.startswith(_DRAFTER):
        metadata = metadata.get("drafter") or {}
    detail = ((metadata.get("measurements") or {}).get(str(row.num_tokens)) or {}).get(row.mode.removeprefix(_DRAFTER))
    raw = detail.get("samples_ms") if isinstance(detail, dict) else None
    if not isinstance(raw, list):
        return []
    return [float(x) for x in raw if isinstance(x, int | float) and not isinstance(x, bool) and np.isfinite(x)]


class _Readings:
    """The profile's timed readings and what each is re-drawn from (its raw samples, or its IQR), read once: the
    bootstrap draws its replicates block by block from them."""

    def __init__(self, profile: Profile) -> None:
        md = profile.metadata
        timed = [(i, r) for i, r in enumerate(profile.rows) if r.status == "ok" and r.latency_ms is not None]
        samples = {i: _samples(md, r) for i, r in timed}
        counts = [len(s) for s in samples.values() if s]
        reps = (md.get("timing") or {}).get("min_reps")
        self.n_iqr = int(statistics.median(counts)) if counts else int(reps) if isinstance(reps, int) and reps > 0 \
            else _DEFAULT_REPS
        # (row index, latency, samples with spread or None, normal sigma of an IQR-only reading or None), row order:
        # the order the draws take from the generator.
        self.spread: list[tuple[int, float, np.ndarray | None, float | None]] = []
        for i, r in timed:
            x = np.array(samples[i])
            if len(x) and np.ptp(x) > 0:
                self.spread.append((i, float(r.latency_ms), x, None))
            elif not len(x) and r.latency_iqr_ms:
                self.spread.append((i, float(r.latency_ms), None, r.latency_iqr_ms / _NORMAL_IQR_SIGMAS))
        self.from_samples = sum(1 for *_, sigma in self.spread if sigma is None)
        self.from_iqr = len(self.spread) - self.from_samples
        self.fixed = len(timed) - len(self.spread)

    def draw(self, replicates: int, rng: np.random.Generator) -> dict[int, np.ndarray]:
        """Row index -> `replicates` re-drawn latencies of each reading with spread."""
        out: dict[int, np.ndarray] = {}
        for i, latency, x, sigma in self.spread:
            if x is not None:
                medians = np.median(x[rng.integers(0, len(x), size=(replicates, len(x)))], axis=1)
                out[i] = latency + medians - np.median(x)
            else:
                out[i] = latency + np.median(rng.normal(0.0, sigma, size=(replicates, self.n_iqr)), axis=1)
        return out


def saving_interval(model: CostModel, default_sizes: Sequence[int], tuned_sizes: Sequence[int], *,
                    replicates: int = REPLICATES, seed: int = SEED, level: float = LEVEL,
                    settle_ms: float | None = SETTLE_MS) -> SavingInterval:
    """The seeded bootstrap interval of (default - tuned) expected step latency (see the module docstring), of at
    most `replicates`; with `settle_ms` it stops at the first look (every SETTLE_EVERY replicates, from twice that)
    whose ends, rounded to `settle_ms`, are the previous look's. The replicates are drawn SETTLE_EVERY at a time, so
    a bootstrap stopped at N replicates is the one of `replicates=N` (without settling), to the bit."""
    point = model.expected_step_ms(default_sizes) - model.expected_step_ms(tuned_sizes)
    rng = np.random.default_rng(seed)
    readings = _Readings(model.profile)
    from_samples, from_iqr, fixed, n_iqr = readings.from_samples, readings.from_iqr, readings.fixed, readings.n_iqr
    redrawn = readings.draw(min(replicates, SETTLE_EVERY), rng)
    if not redrawn:
        return SavingInterval(point, point, point, level, 0, seed, from_samples, from_iqr, fixed, n_iqr)
    workload = _StepsOnce(model.workload)
    settings = model.settings()
    # The refit needs no raw samples: without them it does not scan every width's readings again for noise flags.
    metadata = {k: v for k, v in model.profile.metadata.items() if k != "measurements"}
    if isinstance(metadata.get("drafter"), dict):
        metadata["drafter"] = {k: v for k, v in metadata["drafter"].items() if k != "measurements"}
    rows = list(model.profile.rows)
    # Each re-drawn row rebuilt from its fields, the latency put in (dataclasses.replace costs 4x as much per row).
    parts = [(i, (r.num_tokens, r.mode, r.status), (r.latency_iqr_ms, r.capture_delta_bytes, r.standalone_bytes,
                                                    r.capture_s))
             for i, r in enumerate(model.profile.rows) if i in redrawn]
    tail = (1 - level) / 2 * 100
    savings: list[float] = []
    settled, last = False, None
    while len(savings) < replicates and not settled:
        if savings:  # the next block's draws, from where the last block's left the generator
            redrawn = readings.draw(min(replicates - len(savings), SETTLE_EVERY), rng)
        block = {i: v.tolist() for i, v in redrawn.items()}  # floats, read one by one below
        for k in range(len(next(iter(block.values())))):
            for i, head, tail_fields in parts:
                # No latency is below 0, though a wide IQR's normal draw can be.
                rows[i] = ProfileRow(*head, max(block[i][k], 1e-9), *tail_fields)
            refit = CostModel(Profile(list(rows), metadata, model.profile.path), workload,  # type: ignore[arg-type]
                              **settings)  # type: ignore[arg-type]
            savings.append(refit.expected_step_ms(default_sizes) - refit.expected_step_ms(tuned_sizes))
        if settle_ms is not None and len(savings) < replicates and len(savings) % SETTLE_EVERY == 0:
            ends = tuple(round(float(x) / settle_ms) for x in np.percentile(savings, [tail, 100 - tail]))
            settled = len(savings) >= 2 * SETTLE_EVERY and ends == last
            last = ends
    low, high = np.percentile(savings, [tail, 100 - tail])
    return SavingInterval(point, float(low), float(high), level, len(savings), seed, from_samples, from_iqr, fixed,
                          n_iqr, settled)
