"""The bootstrap interval of (default - tuned) expected step, held to hand derivations on hand-made profiles whose
timing samples make the answer derivable: every step is an 8-request decode step, default = no graphs, tuned = the
8-token graph, so the saving is eager(8) - full(8) (no logits rows) and only those two readings can move it. The laws
are steep (0.1 ms per token) so that no re-drawn reading at 8 falls below the one at 4: the cost model reads latency
as a running max over widths (a wider step never costs less), which would otherwise cut the low tail."""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/handmade_profiles.py (import-mode=importlib)
from handmade_profiles import handmade_profile, handmade_workload, with_timing  # noqa: E402

from tuner.model.costmodel import CostModel  # noqa: E402
from tuner.search.saving_interval import REPLICATES, SETTLE_EVERY, SETTLE_MS, saving_interval  # noqa: E402

WIDTHS = [1, 2, 4, 8, 16]
EAGER_8, FULL_8 = 1.8, 1.3  # the laws below at width 8; at width 4: 1.4 and 0.9


def model_with(tmp_path: Path, **timing) -> CostModel:
    wl = handmade_workload(max_num_seqs=8, max_num_batched_tokens=16,
                           traffic={"widths": {"kind": "histogram", "counts": {8: 1}}})
    path = with_timing(handmade_profile(tmp_path, wl, WIDTHS, eager_ms=lambda w: 1.0 + 0.1 * w,
                                        full_ms=lambda w: 0.5 + 0.1 * w), **timing)
    return CostModel.from_files(path, wl)


def interval(m: CostModel, **kwargs):
    return saving_interval(m, (), (8,), **kwargs)


def test_the_saving_is_eager_minus_full_at_the_one_width(tmp_path):
    m = model_with(tmp_path)
    assert [(st.num_tokens, st.uniform_decode) for st in m.steps] == [(8, True)]
    iv = interval(m)
    assert iv.point_ms == pytest.approx(EAGER_8 - FULL_8)


def test_no_spread_is_a_zero_width_interval_at_the_point(tmp_path):
    # No samples kept and IQRs of 0: nothing to draw, so no replicate is drawn.
    iv = interval(model_with(tmp_path / "none"))
    assert iv.low_ms == iv.high_ms == iv.point_ms and iv.replicates == 0 and iv.from_samples == iv.from_iqr == 0
    assert (iv.seed, iv.fixed, iv.iqr_samples) == (0, 2 * len(WIDTHS), 5)  # every reading fixed; 5 draws by default
    # Samples all alike at the width that decides, spread only where no step reaches (width 16, above every step):
    # every replicate refits the model and gets the point again, so the ends stand still from the first look and
    # the bootstrap stops at the second; without settling it draws them all.
    m = model_with(tmp_path / "flat", samples={("eager", 8): [EAGER_8] * 7, ("full", 8): [FULL_8] * 7,
                                               ("eager", 16): [2.4, 2.5, 2.6, 2.9, 3.0]})
    iv = interval(m)
    assert iv.replicates == 2 * SETTLE_EVERY and iv.settled
    assert interval(m, settle_ms=None).replicates == REPLICATES
    assert iv.from_samples == 1 and iv.fixed == 2 * len(WIDTHS) - 1
    assert iv.low_ms == pytest.approx(iv.point_ms, abs=1e-12) and iv.high_ms == pytest.approx(iv.point_ms, abs=1e-12)
    assert iv.point_ms == pytest.approx(EAGER_8 - FULL_8)


def test_two_point_samples_give_their_two_values_as_the_ends(tmp_path):
    # Eager samples a, a, b, b, b: a resample's median is a with probability P(Bin(5, 2/5) >= 3) = 0.317 and b
    # otherwise, so both 2.5% tails hold a value each: the ends are a - full and b - full exactly; the point is
    # median b - full.
    a, b = 1.6, 2.0
    m = model_with(tmp_path, samples={("eager", 8): [a, a, b, b, b]})
    iv = interval(m)
    assert iv.point_ms == pytest.approx(b - FULL_8)
    assert iv.low_ms == pytest.approx(a - FULL_8) and iv.high_ms == pytest.approx(b - FULL_8)
    assert not iv.includes_zero and iv.from_samples == 1


def test_normal_samples_give_the_medians_normal_interval(tmp_path):
    # 401 samples at the quantiles of N(mu, sigma) (sample i at (i - 1/2) / n: a normal sample with no sampling luck)
    # for eager(8) and for full(8). A resample's median moves by about sqrt(n) / 2 sample spacings of
    # sigma / (n phi(0)) at the middle: the median's standard error sqrt(pi / 2) sigma / sqrt(n) = 1.2533 sigma /
    # sqrt(n); the difference's is sqrt(2) times that, and the 95% interval the point +- 1.96 x that; within 15% (the
    # 1000 replicates' own sampling and the median's discreteness).
    sigma, n = 0.05, 401
    z = [statistics.NormalDist().inv_cdf((i - 0.5) / n) for i in range(1, n + 1)]
    m = model_with(tmp_path, samples={("eager", 8): [EAGER_8 + sigma * x for x in z],
                                      ("full", 8): [FULL_8 + sigma * x for x in z]})
    iv = interval(m)
    half = 1.96 * math.sqrt(math.pi / 2) * sigma / math.sqrt(n) * math.sqrt(2)
    assert iv.point_ms == pytest.approx(EAGER_8 - FULL_8)
    assert iv.high_ms - iv.point_ms == pytest.approx(half, rel=0.15)
    assert iv.point_ms - iv.low_ms == pytest.approx(half, rel=0.15)
    assert iv.from_samples == 2


def _median_of_5_quantile(p: float) -> float:
    """The p-quantile of the median of 5 standard normal draws: the 3rd order statistic, whose CDF is
    sum over k = 3..5 of C(5, k) F^k (1 - F)^(5 - k) with F the normal CDF; solved by bisection."""
    def cdf(x: float) -> float:
        f = 0.5 * (1 + math.erf(x / math.sqrt(2)))
        return sum(math.comb(5, k) * f ** k * (1 - f) ** (5 - k) for k in range(3, 6))

    lo, hi = -10.0, 10.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return lo


def test_an_iqr_without_samples_is_drawn_as_a_normal_median(tmp_path):
    # No samples and no timing metadata: a reading with an IQR is the median of 5 (cgtune profile's least repetitions)
    # draws from a normal of sigma = IQR / 1.349 around it; the ends are the point -+ sigma x the 97.5% quantile of a
    # median of 5 standard normals (1.05, where a single draw's is 1.96); within 10%.
    iqr = 0.0674
    m = model_with(tmp_path, iqr={("eager", 8): iqr})
    iv = interval(m)
    assert iv.from_iqr == 1 and iv.from_samples == 0 and iv.iqr_samples == 5
    half = iqr / 1.349 * _median_of_5_quantile(0.975)
    assert _median_of_5_quantile(0.975) == pytest.approx(1.05, abs=0.01)
    assert iv.high_ms - iv.point_ms == pytest.approx(half, rel=0.1)
    assert iv.point_ms - iv.low_ms == pytest.approx(half, rel=0.1)


def test_an_iqr_reading_takes_the_sample_count_of_the_readings_that_kept_theirs(tmp_path):
    m = model_with(tmp_path, samples={("full", 4): list(np.linspace(0.5, 0.6, 9)), ("full", 16): [0.7] * 11},
                   iqr={("eager", 8): 0.01})
    iv = interval(m)
    assert iv.iqr_samples == 10 and iv.from_iqr == 1 and iv.from_samples == 1  # median of 9 and 11; 16's are flat


def test_seeded_so_the_same_profile_gives_the_same_interval(tmp_path):
    m = model_with(tmp_path, iqr={("eager", 8): 0.05, ("full", 8): 0.05})
    first, again, other = interval(m), interval(m), interval(m, seed=1)
    assert (first.low_ms, first.high_ms) == (again.low_ms, again.high_ms)
    assert (first.low_ms, first.high_ms) != (other.low_ms, other.high_ms)
    assert first.as_dict()["seed"] == 0 and other.seed == 1


def test_a_spread_wider_than_the_saving_includes_zero(tmp_path):
    # The saving is 0.5 ms; samples of full(8) from 0.95 to 2.1 ms put a resample's median anywhere between, above
    # eager(8) too.
    m = model_with(tmp_path, samples={("full", 8): [0.95, 1.0, 1.1, 1.3, 1.9, 2.0, 2.1]})
    iv = interval(m)
    assert iv.low_ms < 0 < iv.high_ms and iv.includes_zero and iv.as_dict()["includes_zero"]


def test_drafter_readings_are_read_from_the_drafters_measurements(tmp_path):
    # DFlash (V2): with no graphs the drafter's passes run eager; with the 8-token list its FULL graph replays. Spread
    # only on the drafter's readings moves the saving (its low tail cut by the running max over widths).
    wl = handmade_workload(num_speculative_tokens=3, max_num_seqs=8, max_num_batched_tokens=32,
                           speculative={"method": "dflash", "drafter": {"num_layers": 1}},
                           traffic={"widths": {"kind": "histogram", "counts": {8: 1}}})
    path = handmade_profile(tmp_path, wl, list(range(1, 33)))
    samples = {(mode, w): list(np.linspace(0.8, 1.2, 9) * (0.3 + 0.002 * w)) for w in range(1, 33)
               for mode in ("drafter_eager",)}
    m = CostModel.from_files(with_timing(path, samples=samples), wl)
    assert m.drafter is not None
    # All 500 replicates (no early stop): the cut low tail leaves the 2.5th percentile at the point only with them.
    iv = saving_interval(m, (), (8,), settle_ms=None)
    assert iv.from_samples == 32 and iv.low_ms <= iv.point_ms < iv.high_ms


def test_an_iqr_reading_takes_the_profiles_least_repetitions_where_no_reading_kept_samples(tmp_path):
    # cgtune profile records its timing settings; with no samples kept anywhere, min_reps is the draws' count.
    m = model_with(tmp_path, iqr={("eager", 8): 0.01})
    csv = m.profile.path
    meta = json.loads(csv.with_suffix(".json").read_text())
    csv.with_suffix(".json").write_text(json.dumps({**meta, "timing": {"min_reps": 9}}))
    iv = interval(CostModel.from_files(csv, m.workload))
    assert iv.iqr_samples == 9 and iv.from_iqr == 1 and iv.fixed == 2 * len(WIDTHS) - 1


def test_the_record_names_every_count_it_was_drawn_from(tmp_path):
    m = model_with(tmp_path, samples={("eager", 8): [1.7, 1.8, 1.9], ("full", 8): [1.3, 1.3, 1.3]},
                   iqr={("full", 4): 0.02})
    iv = interval(m, replicates=40, seed=3, level=0.9)
    assert iv.as_dict() == {"point_ms": iv.point_ms, "level": 0.9, "replicates": 40, "seed": 3,
                            "includes_zero": False, "readings_from_samples": 1, "readings_from_iqr": 1,
                            "readings_fixed": 2 * len(WIDTHS) - 2, "iqr_normal_samples": 3, "settled": False}
    # The 90% interval's ends are the 5th and 95th percentiles of the replicates' savings, inside the samples' range.
    assert EAGER_8 - 0.1 - FULL_8 <= iv.low_ms < iv.point_ms < iv.high_ms <= EAGER_8 + 0.1 - FULL_8


def test_non_numbers_and_non_finite_samples_are_not_drawn_from(tmp_path):
    # A sample list as JSON may carry them (a hand-edited file, an older writer): NaN, inf and booleans are no
    # readings. The samples left at full(8) lie in 1.2..1.4 ms, so every resample's saving lies in eager(8) minus
    # that range: finite, and no `true` read as a 1.0 ms sample widens it.
    m = model_with(tmp_path, samples={("full", 8): [1.2, 1.25, 1.3, 1.35, 1.4]})
    meta_path = m.profile.path.with_suffix(".json")
    meta = json.loads(meta_path.read_text())
    meta["measurements"]["8"]["full"]["samples_ms"] += [float("nan"), float("inf"), True, True, True]
    meta_path.write_text(json.dumps(meta))
    iv = interval(CostModel.from_files(m.profile.path, m.workload))
    assert iv.from_samples == 1
    assert EAGER_8 - 1.4 - 1e-9 <= iv.low_ms < iv.high_ms <= EAGER_8 - 1.2 + 1e-9


def test_every_iqr_reading_is_counted_and_one_repetition_is_one_draw(tmp_path):
    # Three readings with an IQR and no samples, a profile that timed each reading once: three drawn from the IQR,
    # each as a single normal draw (min_reps 1), none fixed among them.
    m = model_with(tmp_path, iqr={("eager", 8): 0.01, ("full", 8): 0.01, ("full", 4): 0.01})
    meta_path = m.profile.path.with_suffix(".json")
    meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), "timing": {"min_reps": 1}}))
    iv = interval(CostModel.from_files(m.profile.path, m.workload))
    assert (iv.from_iqr, iv.iqr_samples, iv.fixed) == (3, 1, 2 * len(WIDTHS) - 3)


def test_a_profile_whose_every_reading_spreads_refits_with_its_memory_and_settings(tmp_path):
    # Every row re-drawn: each refit keeps the rows' memory (the model needs it) and the search's settings. With an
    # off-peak weight of 1 the saving is the off-peak one (decode steps of 1..8 requests, a list of (8,)): the
    # interval brackets that point, not the workload's.
    wl = handmade_workload(max_num_seqs=8, max_num_batched_tokens=16,
                           traffic={"widths": {"kind": "histogram", "counts": {8: 1}}})
    path = with_timing(handmade_profile(tmp_path, wl, WIDTHS, eager_ms=lambda w: 1.0 + 0.1 * w,
                                        full_ms=lambda w: 0.5 + 0.1 * w),
                       iqr={(mode, w): 0.002 for w in WIDTHS for mode in ("eager", "full")})
    m = CostModel.from_files(path, wl, off_peak_weight=1.0)
    iv = saving_interval(m, (), (8,), replicates=60)
    assert iv.from_iqr == 2 * len(WIDTHS) and iv.fixed == 0
    workload_point = EAGER_8 - FULL_8
    assert abs(iv.point_ms - workload_point) > 0.05  # the settings matter here
    assert iv.low_ms <= iv.point_ms <= iv.high_ms and iv.high_ms - iv.low_ms < 0.02


def test_a_profile_with_no_spread_records_its_level(tmp_path):
    iv = interval(model_with(tmp_path), level=0.8)
    assert iv.replicates == 0 and iv.level == 0.8 and iv.as_dict()["level"] == 0.8


def test_a_bootstrap_stops_once_its_printed_ends_stand_still_and_is_the_full_ones_first_replicates(tmp_path):
    # Normal samples with spread at both readings: the ends keep moving in the 4th decimal at first. The rule, from
    # its definition: the ends rounded to SETTLE_MS (0.0001 ms, the report's precision) are looked at every
    # SETTLE_EVERY replicates from twice that; it stops at the first look that repeats the previous one. So the
    # stopped interval is the unstopped bootstrap of as many replicates, its rounded ends are those of 100 fewer,
    # and no earlier pair of looks agreed.
    z = [statistics.NormalDist().inv_cdf((i - 0.5) / 41) for i in range(1, 42)]
    m = model_with(tmp_path, samples={("eager", 8): [EAGER_8 + 0.03 * x for x in z],
                                      ("full", 8): [FULL_8 + 0.03 * x for x in z]})
    iv = interval(m, replicates=2000)
    assert iv.settled and iv.replicates % SETTLE_EVERY == 0 and 2 * SETTLE_EVERY <= iv.replicates < 2000

    def ends(n: int) -> tuple[int, int]:
        full = interval(m, replicates=n, settle_ms=None)
        return round(full.low_ms / SETTLE_MS), round(full.high_ms / SETTLE_MS)

    same = interval(m, replicates=iv.replicates, settle_ms=None)
    assert (same.low_ms, same.high_ms) == (iv.low_ms, iv.high_ms) and not same.settled
    looks = [ends(n) for n in range(SETTLE_EVERY, iv.replicates + 1, SETTLE_EVERY)]
    assert looks[-1] == looks[-2]
    assert all(a != b for a, b in zip(looks[:-2], looks[1:-1]))
