"""Progress of a long loop: tqdm's redrawn bar on a terminal, plain lines (no carriage returns) anywhere else."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

__all__ = ["PlainProgress", "progress_bar"]


def progress_bar(total: int | None, desc: str, unit: str, *, enabled: bool = True, file: TextIO | None = None,
                 **tqdm_options: Any) -> Any:
    """A progress bar over `total` steps written to `file` (default: standard error, where tqdm writes).

    On a terminal (or in a notebook) it is tqdm's bar. Otherwise, a log file or a pipe, it is a PlainProgress: tqdm
    would redraw its bar with carriage returns, which a file keeps as one line of every redraw. Either one takes
    `update`, `n` with `refresh`, `set_postfix_str`, `close` and `with`; `tqdm_options` go to tqdm only."""
    from tqdm.autonotebook import tqdm as auto_tqdm
    from tqdm.std import tqdm as std_tqdm

    stream = sys.stderr if file is None else file
    if not enabled:
        return std_tqdm(total=total, disable=True)
    # tqdm.autonotebook is the widget inside a notebook, whose output stream is no terminal but shows a bar well.
    if auto_tqdm is not std_tqdm or _is_terminal(stream):
        return auto_tqdm(total=total, desc=desc, unit=unit, file=file, **tqdm_options)
    return PlainProgress(total, desc, unit, stream)


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class PlainProgress:
    """A line at each tenth of `total` passed (and after `every_s` seconds when the count moved, so a slow loop still
    shows it is alive), and one last line on close saying it finished or where it stopped: at most
    10 + elapsed / every_s + 1 lines, none with a carriage return."""

    STEPS = 10
    """Lines for a loop that runs to its end faster than every_s per tenth."""

    def __init__(self, total: int | None, desc: str, unit: str, stream: TextIO, *, every_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.desc, self.unit, self.stream = total, desc, unit, stream
        self.every_s, self.clock = every_s, clock
        self.n = 0
        self.postfix = ""
        self.started = self._last_time = clock()
        self._last_n = 0
        self._last_step = 0
        self.closed = False

    def update(self, n: int = 1) -> None:
        self.n += n
        self.refresh()

    def refresh(self) -> None:
        """Write a line when the count crossed a tenth of the total, or moved and every_s passed since the last."""
        if self.closed or self.n == self._last_n:
            return
        now = self.clock()
        step = self.n * self.STEPS // self.total if self.total else 0
        if step > self._last_step or now - self._last_time >= self.every_s:
            if self.total and self.n >= self.total:
                return  # the end is close's line, written once
            self._last_step, self._last_n, self._last_time = step, self.n, now
            self._write(self._count(), now)

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = s

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        finished = self.total is not None and self.n >= self.total
        self._write(("done, " if finished else "stopped at ") + self._count(), self.clock(), postfix=not finished)

    def _count(self) -> str:
        if not self.total:
            return f"{self.n} {self.unit}s"
        return f"{self.n}/{self.total} {self.unit}s ({100 * self.n // self.total}%)"

    def _write(self, what: str, now: float, *, postfix: bool = True) -> None:
        tail = f", {self.postfix}" if postfix and self.postfix else ""
        self.stream.write(f"{self.desc}: {what}, {now - self.started:.1f} s{tail}\n")
        self.stream.flush()

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
