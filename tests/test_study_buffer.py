"""A local SQLite search runs its trials in memory and writes them to the file in batches
(tuner/search/study_buffer.py): the file ends up holding the very trials an unbuffered study writes, batches come on the
clock, and a study another process may be running is left unbuffered (tests/test_search.py: an interrupt loses no
finished trial)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/test_search.py's model (import-mode=importlib)
from handmade_profiles import MIB  # noqa: E402
from test_search import study_model  # noqa: E402

from tuner.search.study import (  # noqa: E402
    SearchConfig,
    enqueue_start,
    make_objective,
    open_study,
    run_search,
    study_name_for,
)
from tuner.search.study_buffer import StudyBuffer  # noqa: E402

optuna = pytest.importorskip("optuna")


def _trials(storage: str, name: str) -> list[tuple]:
    """Each stored trial as (number, state, params, value, the list it evaluated, its constraint)."""
    study = optuna.load_study(study_name=name, storage=storage)
    return [(t.number, t.state.name, t.params, t.value, (t.user_attrs.get("evaluation") or {}).get("capture_sizes"),
             t.system_attrs.get("constraints")) for t in study.trials]


def test_the_file_holds_the_trials_an_unbuffered_study_writes(tmp_path):
    m = study_model(tmp_path, total_memory_bytes=400 * MIB)
    config = SearchConfig(n_trials=40, progress=False, seed=3)
    buffered = run_search(m, config, run_dir=tmp_path / "buffered")
    # Its connections are closed on return: SQLite has folded its write-ahead log into the one file.
    assert sorted(p.name for p in (tmp_path / "buffered").iterdir()) == ["study.db"]
    name = study_name_for(m, "latency")
    # The same study run straight on SQLite, every suggestion and attribute committed as it happens (the old way).
    plain_dir = tmp_path / "plain"
    study, storage = open_study(m, config, run_dir=plain_dir)
    study.optimize(make_objective(m, "latency"), n_trials=40, catch=(ValueError, ArithmeticError))
    got = _trials(f"sqlite:///{tmp_path / 'buffered' / 'study.db'}", name)
    assert len(got) == 40 and all(state == "COMPLETE" for _, state, *_ in got)
    assert got == _trials(storage, name)
    assert buffered.study_best is not None and buffered.trials["complete"] == 40


def test_batches_are_written_on_the_clock_and_the_rest_at_the_end(tmp_path):
    m = study_model(tmp_path)
    config = SearchConfig(n_trials=100, progress=False)  # up to 20 seed lists enqueued: more than the 7 trials run
    stored, storage = open_study(m, config, run_dir=tmp_path, enqueue=False)
    now = [0.0]
    buffer = StudyBuffer.of(stored, every_s=2.0, clock=lambda: now[0])
    assert buffer is not None
    enqueue_start(buffer.memory, m, config)
    objective = make_objective(m, "latency")
    written = []

    def tick(study, trial):
        now[0] += 0.75  # each trial takes 0.75 s on this clock: a batch every third trial
        buffer.callback(study, trial)
        written.append(len(stored.get_trials(deepcopy=False)))

    buffer.memory.optimize(objective, n_trials=7, callbacks=[tick])
    assert written == [0, 0, 3, 3, 3, 6, 6]
    waiting = len(buffer.memory.get_trials(deepcopy=False)) - 7  # seed lists enqueued but not yet run
    assert waiting > 0
    assert buffer.flush(final=True) == 1 + waiting
    stored_trials = stored.get_trials(deepcopy=False)
    assert [t.number for t in stored_trials] == list(range(7 + waiting))
    assert [t.state.name for t in stored_trials] == ["COMPLETE"] * 7 + ["WAITING"] * waiting
    # A study holding WAITING trials is left to run unbuffered: those may be another worker's to take.
    assert StudyBuffer.of(stored) is None
