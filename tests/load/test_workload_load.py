"""The workload's `traffic.load` section: read into the Load the simulator runs (rate or a CSV of arrival times,
fixed, uniform or histogram lengths, acceptance, seed), every bad field one line naming it, and histogram lengths
drawn as their weights say."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ helpers (import-mode=importlib)
from handmade_profiles import handmade_spec  # noqa: E402

from tuner.fields import WorkloadError  # noqa: E402
from tuner.load.arrivals import Requests  # noqa: E402
from tuner.workload.load import Lengths, Load  # noqa: E402
from tuner.workload.spec import parse_workload  # noqa: E402


def spec_with(load: dict, **serving: object) -> dict:
    return handmade_spec(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256,
                         traffic={"requests": {"kind": "uniform", "min": 1, "max": 8}, "load": load}, **serving)


def test_a_load_section_is_read_into_the_load_the_simulator_runs() -> None:
    wl = parse_workload(spec_with({"rate_per_s": 12.5, "prompt_tokens": {"min": 16, "max": 48},
                                   "output_tokens": 32, "seed": 7}))
    assert wl.load == Load(Lengths(16, 48), Lengths(32), rate_per_s=12.5, acceptance=1.0, seed=7)
    assert parse_workload(handmade_spec()).load is None


def test_a_speculative_load_needs_its_acceptance_and_keeps_it_within_q() -> None:
    base = {"rate_per_s": 1.0, "prompt_tokens": 8, "output_tokens": 8}
    with pytest.raises(WorkloadError, match=r"^traffic\.load\.acceptance: missing .*1\.\.q=3"):
        parse_workload(spec_with(base, num_speculative_tokens=2))
    assert parse_workload(spec_with({**base, "acceptance": 2.2}, num_speculative_tokens=2)).load.acceptance == 2.2
    with pytest.raises(WorkloadError, match=r"^traffic\.load\.acceptance: 3\.5 must be <= 3"):
        parse_workload(spec_with({**base, "acceptance": 3.5}, num_speculative_tokens=2))


def test_arrival_times_come_from_a_csv_beside_the_workload(tmp_path: Path) -> None:
    (tmp_path / "arrivals.csv").write_text("arrival_s\n0.5\n0.0\n2.25\n")
    wl = parse_workload(spec_with({"arrivals": "arrivals.csv", "prompt_tokens": 8, "output_tokens": 8}),
                        base_dir=tmp_path)
    assert wl.load is not None and wl.load.rate_per_s is None
    assert wl.load.arrival_times_s == (0.0, 0.5, 2.25)  # sorted: the scheduler admits in arrival order


@pytest.mark.parametrize("load,needle", [
    ({"prompt_tokens": 8, "output_tokens": 8}, "traffic.load.rate_per_s: missing"),
    ({"rate_per_s": 0, "prompt_tokens": 8, "output_tokens": 8}, "traffic.load.rate_per_s: 0 must be > 0"),
    ({"rate_per_s": "fast", "prompt_tokens": 8, "output_tokens": 8}, "traffic.load.rate_per_s: 'fast'"),
    ({"rate_per_s": 1, "arrivals": "a.csv", "prompt_tokens": 8, "output_tokens": 8},
     "traffic.load.arrivals: give rate_per_s or arrivals, not both"),
    ({"arrivals": "missing.csv", "prompt_tokens": 8, "output_tokens": 8}, "traffic.load.arrivals: "),
    ({"rate_per_s": 1, "output_tokens": 8}, "traffic.load.prompt_tokens: missing"),
    ({"rate_per_s": 1, "prompt_tokens": 0, "output_tokens": 8}, "traffic.load.prompt_tokens: 0 must be >= 1"),
    ({"rate_per_s": 1, "prompt_tokens": {"min": 9, "max": 4}, "output_tokens": 8},
     "traffic.load.prompt_tokens.max: 4 must be >= min=9"),
    ({"rate_per_s": 1, "prompt_tokens": 8, "output_tokens": {"kind": "histogram", "counts": {}}},
     "traffic.load.output_tokens.counts"),
    ({"rate_per_s": 1, "prompt_tokens": 8, "output_tokens": {"kind": "histogram", "counts": {4: -1}}},
     "traffic.load.output_tokens.counts.4: -1 must be a weight >= 0"),
    ({"rate_per_s": 1, "prompt_tokens": 200, "output_tokens": 100},
     "traffic.load.output_tokens: the longest prompt (200) and output (100) exceed serving.max_model_len=256"),
    ({"rate_per_s": 1, "prompt_tokens": 8, "output_tokens": 8, "burst": 3}, "traffic.load.burst: unknown field"),
    ({"rate_per_s": 1, "prompt_tokens": 8, "output_tokens": 8, "seed": 1.5}, "traffic.load.seed: 1.5"),
])
def test_bad_load_fields_are_one_line_naming_the_field(tmp_path: Path, load: dict, needle: str) -> None:
    (tmp_path / "a.csv").write_text("arrival_s\n0\n")
    with pytest.raises(WorkloadError) as info:
        parse_workload(spec_with(load), base_dir=tmp_path)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_a_histogram_of_lengths_is_drawn_by_its_weights() -> None:
    wl = parse_workload(spec_with({"rate_per_s": 50.0, "prompt_tokens": {"kind": "histogram",
                                                                          "counts": {10: 1, 100: 3, 50: 0}},
                                   "output_tokens": 4}))
    lengths = wl.load.prompt_tokens
    assert (lengths.min, lengths.max, lengths.counts) == (10, 100, ((10, 1.0), (100, 3.0)))  # a 0 weight dropped
    assert lengths.mean == pytest.approx((10 + 300) / 4)
    reqs = Requests(wl.load)
    reqs.arrived_by(200.0)  # ~10000 requests drawn
    drawn = reqs.prompt
    assert set(np.unique(drawn)) == {10, 100}
    share = float((drawn == 100).mean())
    assert abs(share - 0.75) < 4 * np.sqrt(0.75 * 0.25 / len(drawn)), (share, len(drawn))
