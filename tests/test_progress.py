"""Progress bars (tuner/progress.py): tqdm's bar on a terminal; plain, bounded lines with no carriage return in a file
or a pipe, the last one saying the loop finished or where it stopped; and the profile sweep writing them so."""

from __future__ import annotations

import io
import os
from pathlib import Path

from tqdm.std import tqdm as std_tqdm

from tuner.measure.profile import SweepOptions, profile_workload
from tuner.progress import PlainProgress, progress_bar
from tuner.workload.spec import load_workload

ROOT = Path(__file__).resolve().parents[1]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class _Clock:
    """Seconds that advance only when told to, so the time-based lines are exact."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_file_gets_at_most_eleven_plain_lines_for_a_thousand_updates_the_last_saying_done() -> None:
    out = io.StringIO()
    with progress_bar(1000, "search", "trial", file=out) as bar:
        assert isinstance(bar, PlainProgress)
        for _ in range(1000):
            bar.update(1)
    text = out.getvalue()
    lines = text.splitlines()
    assert "\r" not in text and text.endswith("\n")
    assert len(lines) == 10, lines  # 9 tenths on the way (10/10 is the last line's) and the last line
    assert lines[0].startswith("search: 100/1000 trials (10%), ")
    assert lines[-1].startswith("search: done, 1000/1000 trials (100%), ") and lines[-1].endswith(" s")


def test_a_pipe_reads_back_plain_lines() -> None:
    read_fd, write_fd = os.pipe()
    with os.fdopen(write_fd, "w") as pipe:
        with progress_bar(5, "profile tiny", "width", file=pipe) as bar:
            for w in (4, 8, 16, 32, 64):
                bar.set_postfix_str(f"{w} tokens")
                bar.update(1)
    with os.fdopen(read_fd) as reader:
        text = reader.read()
    assert "\r" not in text
    lines = text.splitlines()
    assert [line.split(", ")[0] for line in lines] == [
        "profile tiny: 1/5 widths (20%)", "profile tiny: 2/5 widths (40%)", "profile tiny: 3/5 widths (60%)",
        "profile tiny: 4/5 widths (80%)", "profile tiny: done"]
    assert lines[1].endswith(", 8 tokens")  # the postfix names what is running ...
    assert "tokens" not in lines[-1]  # ... but not on the line that says it finished


def test_a_slow_loop_writes_a_line_every_interval_the_count_moved_and_a_fast_one_only_at_tenths() -> None:
    out, clock = io.StringIO(), _Clock()
    bar = PlainProgress(100, "search", "trial", out, every_s=30.0, clock=clock)
    bar.update(1)  # 1%: not a tenth, and no time passed
    assert out.getvalue() == ""
    clock.now = 31.0
    bar.refresh()  # the interval passed and the count moved since the last line (none yet)
    assert out.getvalue() == "search: 1/100 trials (1%), 31.0 s\n"
    clock.now = 70.0
    bar.refresh()  # the interval passed again, but the count stood still: nothing new to say
    assert out.getvalue().count("\n") == 1
    bar.update(1)
    assert out.getvalue().endswith("search: 2/100 trials (2%), 70.0 s\n")
    clock.now = 80.0
    bar.update(1)  # 10 s later, still under a tenth
    assert out.getvalue().count("\n") == 2


def test_the_count_set_directly_then_refreshed_is_written_as_tqdm_users_do() -> None:
    out = io.StringIO()
    bar = progress_bar(200, "4 workers", "trial", file=out)
    for done in (0, 30, 30, 90, 200):  # run_local_workers reads the study's count and sets it
        bar.n = done
        bar.refresh()
    bar.close()
    bar.close()  # a second close (a `with` after an explicit close) adds nothing
    lines = out.getvalue().splitlines()
    assert [line.split(", ")[0] for line in lines] == [
        "4 workers: 30/200 trials (15%)", "4 workers: 90/200 trials (45%)", "4 workers: done"], lines


def test_a_loop_that_stops_early_says_where_it_stopped() -> None:
    out = io.StringIO()
    with progress_bar(10, "profile tiny", "width", file=out) as bar:
        bar.update(3)
        bar.set_postfix_str("64 tokens")
    assert out.getvalue().splitlines()[-1].startswith("profile tiny: stopped at 3/10 widths (30%), ")
    assert out.getvalue().splitlines()[-1].endswith(", 64 tokens")


def test_a_terminal_gets_tqdms_bar_and_a_disabled_bar_writes_nothing() -> None:
    term = _Terminal()
    with progress_bar(3, "search", "trial", file=term) as bar:
        assert isinstance(bar, std_tqdm)
        bar.update(3)
    assert "\r" in term.getvalue()  # tqdm redraws in place where a terminal shows it so
    quiet = io.StringIO()
    with progress_bar(3, "search", "trial", enabled=False, file=quiet) as bar:
        bar.update(3)
    assert quiet.getvalue() == ""


def test_the_profile_sweep_writes_plain_lines_to_a_captured_stderr(tmp_path, capsys) -> None:
    tiny = load_workload(ROOT / "workloads" / "tiny-cpu.yaml")
    result = profile_workload(tiny, tmp_path, widths=[4, 8, 64], device="cpu", compile=False, progress=True,
                              options=SweepOptions(0, 0, 2, 2))
    err = capsys.readouterr().err
    assert result.complete and "\r" not in err
    lines = [line for line in err.splitlines() if line.startswith("profile ")]
    assert lines and lines[-1].startswith(f"profile {tiny.name}: done, 3/3 widths (100%), "), err
