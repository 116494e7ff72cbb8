"""Run a local search's trials in memory and write them to its SQLite study in batches: optuna commits each
suggestion, attribute and state change of a trial to an RDB storage one at a time (most of a 300-trial search's time
on SQLite), while a finished trial is written in one insert (`Study.add_trials`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["FLUSH_S", "StudyBuffer"]

FLUSH_S = 2.0
"""Seconds between writes: what `cgtune status` may lag a running search by, and what a crash may lose (the rerun
resumes from what was written)."""


class StudyBuffer:
    """An in-memory twin of a stored study: the same trials, sampler and directions. Run `memory.optimize(...,
    callbacks=[buffer.callback])`, then `buffer.flush(final=True)` (also after an interrupt): every trial it holds is
    then in the stored study, in the order it ran, numbered as it was."""

    def __init__(self, stored: Any, memory: Any, *, every_s: float = FLUSH_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stored, self.memory, self.every_s, self.clock = stored, memory, every_s, clock
        self.written = len(memory.get_trials(deepcopy=False))
        """Trials of `memory` the stored study already holds (the copies, then each batch written)."""
        self.last = clock()

    @classmethod
    def of(cls, stored: Any, **kwargs: Any) -> StudyBuffer | None:
        """The buffer for `stored`, or None where its trials must stay shared: one WAITING (enqueued for whichever
        worker takes it) or RUNNING (a worker's, or a crashed run's that a fleet retries) is another process's."""
        import optuna

        trials = stored.get_trials(deepcopy=False)
        if any(t.state in (optuna.trial.TrialState.WAITING, optuna.trial.TrialState.RUNNING) for t in trials):
            return None
        memory = optuna.create_study(sampler=stored.sampler, directions=stored.directions,
                                     study_name=stored.study_name)
        memory.add_trials(trials)
        return cls(stored, memory, **kwargs)

    def callback(self, study: Any, trial: Any) -> None:
        """optuna's per-trial callback: write what finished once `every_s` has passed since the last write."""
        if self.clock() - self.last >= self.every_s:
            self.flush()

    def flush(self, *, final: bool = False) -> int:
        """Write the finished trials not yet stored, up to the first unfinished one; `final`: every trial left, as it
        stands (an enqueued one not yet run stays WAITING in the stored study, for the rerun to take, as it would
        had it been enqueued there). Returns how many were written."""
        trials = self.memory.get_trials(deepcopy=False)[self.written:]
        done = len(trials) if final else next((i for i, t in enumerate(trials) if not t.state.is_finished()),
                                               len(trials))
        if done:
            self.stored.add_trials(trials[:done])
            self.written += done
        self.last = self.clock()
        return done
