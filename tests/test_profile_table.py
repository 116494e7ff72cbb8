"""The profile contract: round trip, validation of bad files, atomic writes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tuner.profile.table import (
    COLUMNS,
    ProfileError,
    ProfileRow,
    atomic_write_text,
    read_profile,
    write_profile,
)

META = {"device_name": "cpu", "workload": {"name": "w", "hash": "abc"}}


def rows():
    return [
        ProfileRow(8, "full", "unsupported"),
        ProfileRow(8, "eager", "ok", latency_ms=1.5, latency_iqr_ms=0.1),
        ProfileRow(4, "eager", "ok", latency_ms=1.0, latency_iqr_ms=0.05, capture_delta_bytes=10,
                   standalone_bytes=20, capture_s=0.5),
        ProfileRow(16, "full", "oom"),
    ]


def test_round_trip_sorted(tmp_path):
    path = write_profile(tmp_path, "p", rows(), META)
    assert path == tmp_path / "p.csv"
    profile = read_profile(path)
    assert [(r.num_tokens, r.mode) for r in profile.rows] == [(4, "eager"), (8, "eager"), (8, "full"), (16, "full")]
    assert profile.rows[0] == rows()[2]
    assert profile.metadata == META
    assert profile.by_mode("eager")[8].latency_ms == 1.5
    assert 16 not in profile.by_mode("full") and 16 in profile.by_mode("full", ok_only=False)
    assert profile.widths() == [4, 8, 16]
    assert (tmp_path / "p.csv").read_text().splitlines()[0] == ",".join(COLUMNS)


def _write(tmp_path: Path, csv_text: str, meta: object = META) -> Path:
    (tmp_path / "p.csv").write_text(csv_text)
    if meta is not None:
        (tmp_path / "p.json").write_text(json.dumps(meta) if not isinstance(meta, str) else meta)
    return tmp_path / "p.csv"


HEADER = ",".join(COLUMNS) + "\n"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("num_tokens,mode\n4,eager\n", "missing column 'latency_ms'"),
        (HEADER + "4,eager,,,ok,,,\n", "line 2: latency_ms: missing value"),
        (HEADER + "4,eager,nan,,ok,,,\n", "line 2: latency_ms: 'nan' is not a finite number"),
        (HEADER + "4,eager,abc,,ok,,,\n", "line 2: latency_ms: 'abc' is not a number"),
        (HEADER + "4,eager,-1,,ok,,,\n", "latency_ms=-1.0 must be > 0"),
        (HEADER + "4,warp,1,,ok,,,\n", "mode='warp' must be one of"),
        (HEADER + "4,eager,1,,great,,,\n", "status='great' must be one of"),
        (HEADER + "0,eager,1,,ok,,,\n", "num_tokens=0 must be >= 1"),
        (HEADER, "no rows"),
        # Two measurements of one width and mode (hand-made rows): which would the cost model use?
        (HEADER + "4,eager,1,,ok,,,\n8,eager,2,,ok,,,\n4,full,0.5,,ok,,,\n4,eager,1.1,,ok,,,\n",
         "p.csv line 5: num_tokens=4 mode=eager is a duplicate of line 2"),
    ],
)
def test_bad_profiles_are_rejected_with_one_line(tmp_path, body, message):
    with pytest.raises(ProfileError) as info:
        read_profile(_write(tmp_path, body))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_metadata_must_exist_and_be_an_object(tmp_path):
    good = HEADER + "4,eager,1,,ok,,,\n"
    with pytest.raises(ProfileError, match="metadata JSON missing"):
        read_profile(_write(tmp_path, good, meta=None))
    with pytest.raises(ProfileError, match="not valid JSON"):
        read_profile(_write(tmp_path, good, meta="{"))
    with pytest.raises(ProfileError, match="JSON object"):
        read_profile(_write(tmp_path, good, meta=[1]))
    with pytest.raises(ProfileError, match="not found"):
        read_profile(tmp_path / "nope.csv")


def test_atomic_write_leaves_old_content_when_interrupted(tmp_path, monkeypatch):
    target = tmp_path / "f.txt"
    atomic_write_text(target, "old")

    def boom(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_text(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]  # no temp file left behind


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_written_files_get_a_normal_files_mode(tmp_path, umask):
    # The profile CSV/JSON (and every other atomically written file) get what open() would give them: 0666 under
    # the umask, so 0644 under the usual 022, not mkstemp's owner-only 0600.
    old = os.umask(umask)
    try:
        csv_path = write_profile(tmp_path / "new" / "dir", "p", rows(), META)
        with open(tmp_path / "plain.txt", "w") as fh:
            fh.write("x")
    finally:
        os.umask(old)
    expected = 0o666 & ~umask
    assert (os.stat(tmp_path / "plain.txt").st_mode & 0o777) == expected
    assert (os.stat(csv_path).st_mode & 0o777) == expected
    assert (os.stat(csv_path.with_suffix(".json")).st_mode & 0o777) == expected

