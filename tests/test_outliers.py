"""Impossible and wildly-off profile values (issue 29 item 3): bytes below 0 are refused in one line; a reading more
than 10x off its neighbours' median (a latency also under a tenth of it; a memory reading also more than 10x every
other of its column) is flagged by width in the notes, summary.json and the report, and kept out of the search unless
--allow-outliers. Profiles here are hand-made (made-up numbers, fixtures) or the shipped synthetic example with one
cell edited."""

from __future__ import annotations

import csv
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # tests/ helpers (import-mode=importlib)
from cli_runner import run  # noqa: E402

from tuner.profile.outliers import find_outliers, without_outliers  # noqa: E402
from tuner.profile.table import Profile, ProfileRow  # noqa: E402

MIB = 1 << 20
DFLASH = ROOT / "workloads/dflash-llama-3.1-8b.yaml"
EXAMPLE = ROOT / "workloads/profiles/synthetic-dflash-llama-3.1-8b.csv"


def _profile(mode: str, column: str, values: dict[int, float]) -> Profile:
    rows = [ProfileRow(w, mode, "ok", **({column: v} if column != "latency_ms" else {"latency_ms": v}))
            for w, v in values.items()]
    return Profile(rows, {})


def _flagged(profile: Profile) -> list[tuple[int, str, str]]:
    return [(o.num_tokens, o.mode, o.column) for o in find_outliers(profile)]


# --------------------------------------------------------------------------------------------- the rule, by hand
def test_a_latency_over_ten_times_its_neighbours_median_is_flagged_and_nine_times_is_not():
    base = {1: 2.0, 2: 2.0, 4: 2.0, 8: 2.0, 16: 2.0, 32: 2.0, 64: 2.0}
    assert _flagged(_profile("full", "latency_ms", {**base, 8: 20.01})) == [(8, "full", "latency_ms")]
    assert _flagged(_profile("full", "latency_ms", {**base, 8: 19.99})) == []
    # Under a tenth: a graph that looks free is as wrong as one that looks endless.
    assert _flagged(_profile("eager", "latency_ms", {**base, 64: 0.19})) == [(64, "eager", "latency_ms")]
    assert _flagged(_profile("eager", "latency_ms", {**base, 64: 0.21})) == []


@pytest.mark.parametrize(("base", "wild_at", "reference"), [
    ([10, 20, 30, 40, 50, 60, 70], 0, 35),  # the first: the four after it, 20 30 40 50
    ([10, 20, 30, 40, 50, 60, 70], 1, 35),  # the block shifted in: 10 30 40 50
    ([10, 20, 30, 40, 50, 60, 70], 3, 40),  # inside: two on each side, 20 30 50 60
    ([10, 20, 30, 40, 50, 60, 70], 5, 45),  # next to the last: 30 40 50 70
    ([10, 20, 30, 40, 50, 60, 70], 6, 45),  # the last: the four before it, 30 40 50 60
    ([10, 20, 30, 40, 50], 4, 25),  # five widths: the other four
    ([10, 20, 30, 40], 3, 20),  # four widths: the median of the other three
    ([10, 20, 30, 40, 50, 60, 8], 3, 40),  # the fifth-nearest (8, at the far end) is no neighbour
])
@pytest.mark.parametrize("wild", [1e6, 1e-6])  # far above, and far below: the reading itself is never its neighbour
def test_the_reference_is_the_median_of_the_four_nearest_widths(base, wild_at, reference, wild):
    values = {8 * (i + 1): float(v) for i, v in enumerate(base)}
    width = 8 * (wild_at + 1)
    values[width] = wild
    (o,) = find_outliers(_profile("full", "latency_ms", values))
    assert (o.num_tokens, o.value, o.reference) == (width, wild, reference)


def test_exactly_ten_times_is_not_flagged():
    base = {1: 2.0, 2: 2.0, 4: 2.0, 8: 2.0, 16: 2.0}
    assert _flagged(_profile("full", "latency_ms", {**base, 4: 20.0})) == []
    assert _flagged(_profile("full", "latency_ms", {**base, 4: 0.2})) == []
    sizes = {w: float(MIB) for w in (8, 16, 24, 32, 40)}
    assert _flagged(_profile("full", "standalone_bytes", {**sizes, 24: 10.0 * MIB})) == []
    assert _flagged(_profile("full", "standalone_bytes", {**sizes, 24: 10.0 * MIB + 1})) == [
        (24, "full", "standalone_bytes")]


def test_outliers_are_listed_by_width_then_mode_and_say_their_unit():
    rows = [ProfileRow(w, m, "ok", latency_ms=2.0, standalone_bytes=MIB) for w in (1, 2, 4, 8, 16)
            for m in ("eager", "full")]
    rows[9] = ProfileRow(16, "full", "ok", latency_ms=2.0, standalone_bytes=1e15)
    rows[3] = ProfileRow(2, "full", "ok", latency_ms=1e308, standalone_bytes=MIB)
    rows[2] = ProfileRow(2, "eager", "ok", latency_ms=1e-9)
    found = find_outliers(Profile(rows, {}))
    assert [(o.num_tokens, o.mode, o.column) for o in found] == [
        (2, "eager", "latency_ms"), (2, "full", "latency_ms"), (16, "full", "standalone_bytes")]
    assert found[1].text() == "full latency_ms at 2: 1e+308 ms against 2 at its neighbours"
    assert found[2].text() == "full standalone_bytes at 16: 1e+15 bytes against 1.049e+06 at its neighbours"


def test_one_wild_reading_flags_itself_and_none_of_its_neighbours():
    # 1e308 ms next to readings rising with width: its neighbours' medians hold, so only it is flagged.
    values = {w: 1.5 + 0.004 * w for w in range(16, 16 * 12, 16)}
    values[96] = 1e308
    assert _flagged(_profile("full", "latency_ms", values)) == [(96, "full", "latency_ms")]


def test_memory_in_allocator_blocks_is_not_flagged_but_ten_times_every_other_reading_is():
    # A shared pool's deltas: the widest (captured first) holds the pool; most later captures add nothing, some a
    # segment. Ten times the neighbours' median (0) but below the column's largest: a block, not an outlier.
    deltas = {w: 0.0 for w in range(8, 8 * 11, 8)}
    deltas.update({80: 300 * MIB, 40: 20 * MIB, 16: 2 * MIB})
    assert _flagged(_profile("full", "capture_delta_bytes", deltas)) == []
    # The widest is never judged for its delta, however large: it allocates the pool.
    assert _flagged(_profile("full", "capture_delta_bytes", {**deltas, 80: 1e15})) == []
    # A new segment larger than the pool's first allocation is no outlier; ten times every other reading is.
    assert _flagged(_profile("full", "capture_delta_bytes", {**deltas, 40: 301 * MIB})) == []
    assert _flagged(_profile("full", "capture_delta_bytes", {**deltas, 40: 3001 * MIB})) == [
        (40, "full", "capture_delta_bytes")]
    # The widest not the largest (PIECEWISE graphs were in the pool first): a later segment of 5 MiB is no outlier.
    assert _flagged(_profile("full", "capture_delta_bytes", {**deltas, 80: 0.0, 40: 5 * MIB})) == []
    standalone = {w: 64 * MIB + 600_000 * w for w in range(8, 8 * 11, 8)}
    assert _flagged(_profile("piecewise", "standalone_bytes", standalone)) == []
    assert _flagged(_profile("piecewise", "standalone_bytes", {**standalone, 24: 1e15})) == [
        (24, "piecewise", "standalone_bytes")]


def test_a_column_measured_at_three_widths_is_not_judged():
    # Which of 2, 2 and 200 ms is off? With fewer than three neighbours no majority says.
    assert _flagged(_profile("full", "latency_ms", {1: 2.0, 2: 2.0, 4: 200.0})) == []
    assert _flagged(_profile("full", "latency_ms", {1: 2.0, 2: 2.0, 4: 2.0, 8: 200.0})) == [(8, "full", "latency_ms")]


def test_without_outliers_drops_the_flagged_rows_only():
    rows = [ProfileRow(w, m, "ok", latency_ms=2.0) for w in (1, 2, 4, 8, 16) for m in ("eager", "full")]
    rows[5] = ProfileRow(4, "full", "ok", latency_ms=1e308)
    profile = Profile(rows, {"device": "x"})
    kept = without_outliers(profile, find_outliers(profile))
    assert [(r.num_tokens, r.mode) for r in profile.rows if r not in kept.rows] == [(4, "full")]
    assert kept.metadata == profile.metadata


# --------------------------------------------------------------------------------------------- through the CLI
def _edited(tmp: Path, width: int, mode: str, column: str, value: str) -> Path:
    """The shipped synthetic example profile with one cell edited."""
    out = tmp / "profile"
    out.mkdir()
    shutil.copyfile(EXAMPLE.with_suffix(".json"), out / "example.json")
    with EXAMPLE.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    hit = [r for r in rows if r["num_tokens"] == str(width) and r["mode"] == mode]
    assert len(hit) == 1
    hit[0][column] = value
    with (out / "example.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return out / "example.csv"


@pytest.mark.parametrize("column", ["capture_delta_bytes", "standalone_bytes"])
def test_bytes_below_zero_are_one_line_and_exit_2_with_nothing_written(tmp_path, capsys, column):
    csv_path = _edited(tmp_path, 1024, "full", column, "-999999999")
    line = next(i for i, r in enumerate(csv_path.read_text().splitlines(), start=1) if r.startswith("1024,full,"))
    code, stdout, err = run(capsys, "search", DFLASH, "--profile", csv_path, "--out", tmp_path / "run",
                            "--trials", 4, "--no-progress")
    assert code == 2 and stdout == ""
    assert err.strip() == (f"cgtune search: error: example.csv line {line}: {column}=-999999999 must be >= 0 (leave "
                           f"the cell empty where the reading is invalid)")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_wild_latency_is_kept_out_of_the_search_and_flagged_and_allowed_on_request(tmp_path, capsys):
    width = 1088  # a decode width above vLLM's ceiling that the lists of this profile hold
    csv_path = _edited(tmp_path, width, "full", "latency_ms", "1e308")
    out = tmp_path / "run"
    code, _, err = run(capsys, "search", DFLASH, "--profile", csv_path, "--out", out, "--trials", 4, "--no-progress")
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["outliers"] == [{"num_tokens": width, "mode": "full", "column": "latency_ms", "value": 1e308,
                                    "reference": pytest.approx(summary["outliers"][0]["reference"]), "dropped": True}]
    assert 1.5 < summary["outliers"][0]["reference"] < 10  # its neighbours' median, in ms
    assert summary["cost_model"]["allow_outliers"] is False
    note = next(n for n in summary["notes"] if "more than 10x off their neighbours" in n)
    assert f"full latency_ms at {width}: 1e+308 ms" in note and "kept out of the search" in note
    for key in ("tuned", "compact", "exact"):
        assert width not in summary[key]["capture_sizes"], key
    assert len(summary["tuned"]["capture_sizes"]) > 10  # not the one-graph list a kept 1e308 ms makes
    code, _, err = run(capsys, "report", out)
    assert code == 0, err
    assert f"full latency_ms at {width}: 1e+308 ms" in (out / "report.md").read_text()

    allowed = tmp_path / "allowed"
    code, _, err = run(capsys, "search", DFLASH, "--profile", csv_path, "--out", allowed, "--trials", 4,
                       "--no-progress", "--allow-outliers")
    assert code == 0, err
    kept = json.loads((allowed / "summary.json").read_text())
    assert [o["dropped"] for o in kept["outliers"]] == [False] and kept["cost_model"]["allow_outliers"] is True
    assert any("searched as measured (--allow-outliers)" in n for n in kept["notes"])
    # Searched as measured, every graph at or above the width costs 1e308 ms: none of them is worth it.
    assert max(kept["tuned"]["capture_sizes"]) < width
    # The choice is part of the run: a re-render keeps it.
    code, _, err = run(capsys, "report", allowed)
    assert code == 0, err
    assert json.loads((allowed / "summary.json").read_text())["cost_model"]["allow_outliers"] is True


def test_the_shipped_example_profile_has_no_outliers():
    from tuner.profile.table import read_profile

    assert find_outliers(read_profile(EXAMPLE)) == []


@pytest.mark.slow
def test_the_per_width_csv_flags_the_outlier_and_holds_the_profile_as_read(tmp_path, capsys):
    import pandas as pd

    width = 1088
    csv_path = _edited(tmp_path, width, "full", "latency_ms", "1e308")
    out = tmp_path / "run"
    assert run(capsys, "search", DFLASH, "--profile", csv_path, "--out", out, "--trials", 4, "--no-progress")[0] == 0
    code, _, err = run(capsys, "report", out, "--csv", tmp_path / "widths.csv")
    assert code == 0, err
    frame = pd.read_csv(tmp_path / "widths.csv", keep_default_na=False)
    row = frame.set_index("num_tokens").loc[width]
    assert row["outlier"] == "full latency_ms" and row["full_ms"] == 1e308  # as measured, flagged
    assert not row["in_tuned"] and not row["in_shipped"]
    assert (frame["outlier"] != "").sum() == 1


def test_a_dropped_graph_reading_keeps_its_width_out_of_the_lists_and_an_eager_one_does_not(tmp_path):
    # Six wild readings (five FULL, one eager) in a hand-made profile: the note lists the first five and says there
    # are more; the FULL ones' widths are offered to no list, the eager one's width stays a candidate (its row is
    # interpolated over, and its graph was measured sanely).
    sys.path.insert(0, str(ROOT / "tests"))
    from handmade_profiles import handmade_profile, handmade_workload

    from tuner.model.costmodel import CostModel

    wild_full, wild_eager = {4, 12, 20, 28, 36}, 16
    wl = handmade_workload(max_num_seqs=40, max_num_batched_tokens=48)
    path = handmade_profile(tmp_path, wl, list(range(1, 41)),
                            full_ms=lambda w: 1e6 if w in wild_full else 0.5 + 0.01 * w,
                            eager_ms=lambda w: 1e6 if w == wild_eager else 1.0 + 0.01 * w)
    m = CostModel.from_files(path, wl)
    assert len(m.outliers) == 6 and m.outlier_widths == sorted(wild_full)
    assert not set(m.candidates) & wild_full and wild_eager in m.candidates
    note = next(n for n in m.notes if "more than 10x off their neighbours" in n)
    assert note.startswith("6 readings in hand.csv are more than 10x off their neighbours, kept out of the search")
    assert note.count(" at its neighbours") == 5 and note.endswith("; ...")
