"""Many workers on one optuna study in a shared RDB storage (PostgreSQL across hosts, SQLite on one machine): the
study carries what a worker needs, its trials are planned up front, and optuna's heartbeats retry a killed trial."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tuner.search.storage_url import display_url, engine_url, hide_secret
from tuner.search.exact_answer import DEFAULT_WORK
from tuner.search.study import PLACEMENTS

if TYPE_CHECKING:
    from tuner.model.costmodel import CostModel
    from tuner.search.study import SearchResult

__all__ = [
    "FLEET_ATTR",
    "STORAGE_ENV",
    "FleetError",
    "FleetSpec",
    "StudyStatus",
    "create_or_extend",
    "fleet_model",
    "fleet_result",
    "load_spec",
    "plan_trials",
    "resolve_storage",
    "run_local_workers",
    "run_worker",
    "study_status",
]

log = logging.getLogger(__name__)

STORAGE_ENV = "CGTUNE_STORAGE"
"""Environment variable holding the storage URL, so a password stays out of shell history and process lists."""
FLEET_ATTR = "cgtune_fleet"
"""Study user attribute holding the FleetSpec."""
_SPEC_VERSION = 1


class FleetError(ValueError):
    """The fleet cannot run (no storage URL, no such study, storage unreachable); one line, password hidden."""


def resolve_storage(url: str | None) -> str:
    """The storage URL from `--storage` or else $CGTUNE_STORAGE; FleetError when neither is set."""
    url = url or os.environ.get(STORAGE_ENV, "")
    if not url:
        raise FleetError(f"no storage URL: pass --storage URL or set {STORAGE_ENV} "
                         f"(e.g. postgresql+psycopg2://user:password@host/db)")
    return url


# ---------------------------------------------------------------------------------------------- the spec
@dataclass(frozen=True)
class FleetSpec:
    """Everything a worker needs to rebuild the study's objective, stored in the study's user attributes."""

    objective: str
    """`latency` or `pareto` (tuner.search.study.OBJECTIVES)."""
    n_trials: int
    """Trials planned: the study's budget. A worker stops when all of them ran (a retried one counts once)."""
    seed: int
    """Seed of the planned parameters."""
    n_seeds: int
    """Heuristic seed trials in the plan after vLLM's default (fixed when the study is created)."""
    memory_buckets: int
    """Memory resolution of the exact solver used when the result is collected."""
    workload_name: str
    """Workload name (for status)."""
    files: dict[str, str]
    """Relative path -> text: `workload.yaml`, any trace it reads, `profile/<name>.csv` and `.json`."""
    profile_file: str
    """Key in `files` of the profile CSV."""
    heartbeat_interval_s: int = 10
    """Each running trial records a heartbeat this often."""
    grace_period_s: int = 60
    """A running trial whose heartbeat is older than this is failed and retried by another worker."""
    max_retry: int = 3
    """Retries of one planned trial before it stays failed."""
    model_settings: dict[str, Any] = field(default_factory=dict)
    """The cost model's settings besides its files (`CostModel.settings()`), so every worker weighs trials as the
    coordinator does."""
    vllm_version: str | None = None
    """The vLLM release the coordinator's workload runs under (None: not a vLLM workload), so a worker on a machine
    with another vLLM installed weighs trials by the same rules."""

    def to_dict(self) -> dict[str, Any]:
        return {"version": _SPEC_VERSION, **self.__dict__}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FleetSpec:
        if data.get("version") != _SPEC_VERSION:
            raise FleetError(f"fleet spec version {data.get('version')!r} is not {_SPEC_VERSION}: "
                             f"this cgtune cannot run the study's trials")
        fields = {k: v for k, v in data.items() if k != "version"}
        return cls(**fields)


def _spec_files(workload_path: Path, profile_csv: Path) -> tuple[dict[str, str], str]:
    import yaml

    files = {"workload.yaml": workload_path.read_text()}
    traffic = (yaml.safe_load(files["workload.yaml"]) or {}).get("traffic") or {}
    trace = traffic.get("trace") if isinstance(traffic, dict) else None
    if isinstance(trace, str):
        rel = Path(trace)
        if rel.is_absolute() or ".." in rel.parts:
            raise FleetError(f"traffic.trace={trace!r}: a fleet study carries the trace, so it must be a path "
                             f"inside the workload's folder")
        files[rel.as_posix()] = (workload_path.parent / rel).read_text()
    profile_file = f"profile/{profile_csv.name}"
    files[profile_file] = profile_csv.read_text()
    meta = profile_csv.with_suffix(".json")
    if meta.is_file():
        files[f"profile/{meta.name}"] = meta.read_text()
    return files, profile_file


@contextmanager
def fleet_model(spec: FleetSpec) -> Iterator[CostModel]:
    """The study's cost model, rebuilt from the files the spec carries (in a temporary folder)."""
    from tuner.engines.vllm.versions import recorded_version
    from tuner.model.costmodel import CostModel
    from tuner.workload.spec import load_workload

    with tempfile.TemporaryDirectory(prefix="cgtune-fleet-") as tmp, recorded_version(spec.vllm_version):
        root = Path(tmp)
        for rel, text in spec.files.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        yield CostModel.from_files(root / spec.profile_file, load_workload(root / "workload.yaml"),
                                   **spec.model_settings)


# ---------------------------------------------------------------------------------------------- storage
def _open_storage(url: str, spec: FleetSpec | None = None) -> Any:
    """An RDB storage; with a spec, heartbeats on and a stale trial retried (optuna's RetryFailedTrialCallback)."""
    import optuna

    kwargs: dict[str, Any] = {}
    if spec is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            kwargs = {"heartbeat_interval": spec.heartbeat_interval_s, "grace_period": spec.grace_period_s}
            retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
            if retry is not None:  # optuna >= 4.9
                kwargs["heartbeat_stale_trial_callback"] = retry(max_retry=spec.max_retry)
            else:
                kwargs["failed_trial_callback"] = optuna.storages.RetryFailedTrialCallback(max_retry=spec.max_retry)
    opened = engine_url(url)  # a missing driver: StorageError, one line
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            storage = optuna.storages.RDBStorage(opened, **kwargs)
    except Exception as exc:  # driver errors may quote the URL: never let them print the password
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise FleetError(hide_secret(f"cannot open storage {display_url(url)}: {first}", url)) from None
    if url.startswith("sqlite"):
        from sqlalchemy import event

        # As tuner.search.study does: WAL lets several local workers read while one writes; NORMAL sync keeps the
        # commit-per-field cost down (a crash loses at most the last trials, which the plan reruns).
        def pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

        event.listen(storage.engine, "connect", pragmas)
        storage.engine.dispose()
    return storage


def load_spec(url: str, study_name: str) -> FleetSpec:
    """The fleet spec of a study; FleetError when the study does not exist or was not made by cgtune."""
    storage = _open_storage(url)
    try:
        study_id = storage.get_study_id_from_name(study_name)
    except KeyError:
        raise FleetError(f"no study {study_name!r} in {display_url(url)} (list them: cgtune status)") from None
    data = storage.get_study_user_attrs(study_id).get(FLEET_ATTR)
    if not isinstance(data, dict):
        raise FleetError(f"study {study_name!r} has no {FLEET_ATTR} attribute: it was not created by "
                         f"`cgtune tune --storage URL --workers N`")
    return FleetSpec.from_dict(data)


# ---------------------------------------------------------------------------------------------- the plan
def _random_params(model: CostModel, seed: int, slot: int) -> dict[str, Any]:
    """Parameters of one planned trial, a function of (seed, slot) alone, over the study's distributions."""
    n = len(model.candidates)
    rng = np.random.default_rng([seed, slot])
    count = int(np.clip(np.floor(np.exp(rng.uniform(0.0, np.log(n + 1)))), 1, n))  # log-uniform, as suggest_int
    return {"top": int(rng.integers(0, n)), "count": count, "spacing": float(rng.uniform(0.0, 1.0)),
            "placement": PLACEMENTS[int(rng.integers(0, len(PLACEMENTS)))]}


def plan_trials(model: CostModel, n_trials: int, seed: int, n_seeds: int,
                ) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The study's trials as (params, user_attrs), slot by slot: vLLM's default, `n_seeds` heuristic seeds (as the
    single-process study starts), then seeded random parameters. Planned, not sampled adaptively, so the answer
    cannot depend on how many workers ran or in which order; the exact solver still holds the study to the optimum."""
    from tuner.search.study import seed_params

    plan: list[tuple[dict[str, Any], dict[str, Any]]] = [({}, {"capture_sizes": list(model.default_sizes)})]
    seeds = seed_params(model)
    if len(seeds) > n_seeds:
        seeds = [seeds[i] for i in np.unique(np.linspace(0, len(seeds) - 1, n_seeds).round().astype(int))]
    plan += [(p, {}) for p in seeds]
    slot = len(plan)
    while len(plan) < n_trials:
        plan.append((_random_params(model, seed, slot), {}))
        slot += 1
    out = []
    for i, (params, attrs) in enumerate(plan[:n_trials]):
        out.append((params, {**attrs, "slot": i}))
    return out


def create_or_extend(url: str, workload_path: str | Path, profile_csv: str | Path, model: CostModel, *,
                     objective: str = "latency", n_trials: int = 300, seed: int = 0, memory_buckets: int = 2048,
                     study_name: str | None = None, heartbeat_interval_s: int = 10, grace_period_s: int = 60,
                     max_retry: int = 3) -> tuple[str, int]:
    """Create the fleet study for (workload, profile, objective) with its spec and plan, or extend an existing one
    to `n_trials` planned trials; returns (study name, trials enqueued now). Extend a study from one place at a
    time: two coordinators extending at once would both enqueue the same slots."""
    import optuna

    from tuner.search.study import study_name_for

    if not model.candidates:
        raise FleetError("no candidate widths (no graph rows with status ok, or cudagraph_mode NONE): nothing "
                         "for a fleet to search")
    name = study_name or study_name_for(model, objective) + "-fleet"
    files, profile_file = _spec_files(Path(workload_path), Path(profile_csv))
    storage = _open_storage(url)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    kwargs: dict[str, Any] = {"direction": "minimize"} if objective == "latency" else {
        "directions": ["minimize", "minimize"]}
    try:
        study = optuna.create_study(storage=storage, study_name=name, load_if_exists=False, **kwargs)
        spec = FleetSpec(objective, n_trials, seed, max(4, n_trials // 5), memory_buckets, model.workload.name,
                         files, profile_file, heartbeat_interval_s, grace_period_s, max_retry,
                         model.settings(), model.engine.version)
        study.set_user_attr(FLEET_ATTR, spec.to_dict())
        planned = 0
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=name, storage=storage)
        spec = FleetSpec.from_dict(study.user_attrs.get(FLEET_ATTR) or {})
        if spec.files != files:
            raise FleetError(f"study {name!r} holds other workload or profile files than given") from None
        planned = spec.n_trials
        if n_trials > planned:
            spec = FleetSpec(**{**spec.__dict__, "n_trials": n_trials})
            study.set_user_attr(FLEET_ATTR, spec.to_dict())
    plan = plan_trials(model, n_trials, spec.seed, spec.n_seeds)
    for params, attrs in plan[planned:]:
        study.enqueue_trial(params, user_attrs=attrs)
    return name, max(0, len(plan) - planned)


# ---------------------------------------------------------------------------------------------- worker
def _states() -> Any:
    import optuna

    return optuna.trial.TrialState


class _Heartbeat:
    """Records the trial's heartbeat now and every interval until stopped, as optuna's optimize loop does."""

    def __init__(self, storage: Any, trial_id: int, interval_s: float) -> None:
        self._storage, self._trial_id, self._interval = storage, trial_id, interval_s
        self._stop = threading.Event()
        storage.record_heartbeat(trial_id)  # before any work: a trial without a heartbeat is never failed
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self._interval):
            self._storage.record_heartbeat(self._trial_id)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@contextmanager
def _claim_lock(url: str) -> Iterator[None]:
    """On SQLite, a file lock around a claim: SQLite ignores optuna's SELECT ... FOR UPDATE, so two local workers
    could both move one waiting trial to running. Server databases lock the row and need nothing here."""
    if not url.startswith("sqlite"):
        yield
        return
    import fcntl

    from sqlalchemy.engine import make_url

    database = make_url(url).database
    if not database or database == ":memory:":
        yield
        return
    with open(f"{database}.cgtune-claim.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _pop_waiting(study: Any, url: str) -> int | None:
    """Claim one waiting trial (the storage's row lock, or on SQLite a file lock, makes the claim atomic across
    workers); None if none is waiting."""
    from optuna.exceptions import UpdateFinishedTrialError

    TrialState = _states()
    storage = study._storage
    for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        # A heartbeat before the claim: optuna's stale check skips a running trial without any, so a worker
        # dying between claim and first beat would otherwise leave its trial running forever.
        try:
            storage.record_heartbeat(t._trial_id)
        except Exception:  # two workers inserted the first row at once: one row exists, which is all we need
            pass
        try:
            with _claim_lock(url):
                if storage.set_trial_state_values(t._trial_id, state=TrialState.RUNNING):
                    return int(t._trial_id)
        except UpdateFinishedTrialError:  # the list of waiting trials is stale: another worker ran this one
            continue
    return None


def _evaluate(objective: Callable[[Any], Any], trial: Any) -> Any:
    """Run the objective on a claimed trial (a seam tests use to kill a worker mid-trial)."""
    return objective(trial)


def run_worker(url: str, study_name: str, *, device: str | None = None, poll_s: float = 0.5,
               max_trials: int | None = None, progress: bool = True) -> dict[str, int]:
    """Claim and run the study's waiting trials until none is waiting or running; returns counts for this worker.

    Before each claim, trials whose heartbeat went stale are failed and re-enqueued (optuna's fail_stale_trials
    with optuna's retry callback), so a worker killed mid-trial loses nothing: another worker reruns its trial.
    While other workers' trials run, this one waits, since one of them may yet be retried."""
    import optuna
    from tqdm.contrib.logging import logging_redirect_tqdm

    from tuner.progress import progress_bar
    from tuner.search.study import make_objective

    spec = load_spec(url, study_name)
    storage = _open_storage(url, spec)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=study_name, storage=storage, sampler=optuna.samplers.RandomSampler(seed=0))
    TrialState = _states()
    worker = f"{socket.gethostname()}:{os.getpid()}" + (f":{device}" if device else "")
    counts = {"complete": 0, "failed": 0}
    log.info("worker %s joined study %s in %s (%d trials planned)", worker, study_name, display_url(url),
             spec.n_trials)
    with fleet_model(spec) as model, logging_redirect_tqdm(), \
            progress_bar(spec.n_trials, f"worker {study_name[:24]}", "trial", enabled=progress) as bar:
        objective = make_objective(model, spec.objective)
        shown = 0.0
        while max_trials is None or counts["complete"] + counts["failed"] < max_trials:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                optuna.storages.fail_stale_trials(study)
            trial_id = _pop_waiting(study, url)
            if trial_id is None:
                if not study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                    break
                time.sleep(poll_s)
                continue
            beat = _Heartbeat(storage, trial_id, spec.heartbeat_interval_s)
            trial = optuna.Trial(study, trial_id)
            try:
                trial.set_user_attr("worker", worker)
                value = _evaluate(objective, trial)
            except (ValueError, ArithmeticError):
                beat.stop()
                study.tell(trial, state=TrialState.FAIL)  # the objective kept the reason (fail_reason)
                counts["failed"] += 1
            except Exception as exc:
                # A bug, not a bad list: fail the trial with the reason and stop this worker loudly. A retry would
                # only crash the next worker the same way.
                beat.stop()
                trial.set_user_attr("fail_reason", f"{type(exc).__name__}: {exc}")
                study.tell(trial, state=TrialState.FAIL)
                raise
            except BaseException:
                # Ctrl-C or SystemExit: leave the trial RUNNING without heartbeats, so it goes stale and another
                # worker reruns it, instead of counting it as a failed list.
                beat.stop()
                raise
            else:
                beat.stop()
                study.tell(trial, value)
                counts["complete"] += 1
            if progress and time.monotonic() - shown > 1.0:  # reading every trial per trial would cost O(n^2)
                shown = time.monotonic()
                done = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)))
                bar.n = min(spec.n_trials, done)
                bar.refresh()
    return counts


def run_local_workers(url: str, study_name: str, n: int, *, timeout_s: float | None = None,
                      progress: bool = False, poll_s: float = 0.5) -> list[int]:
    """Start `n` `cgtune worker` processes on this machine and wait for them, with one progress bar over the
    study's finished trials; returns their exit codes. The URL goes to them through $CGTUNE_STORAGE, never on a
    command line another user could read with `ps`."""
    import optuna

    import tuner
    from tuner.progress import progress_bar

    root = str(Path(tuner.__file__).resolve().parents[1])  # the workers import this very cgtune
    env = {**os.environ, STORAGE_ENV: url,
           "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}
    cmd = [sys.executable, "-m", "tuner.cli", "worker", "--study", study_name, "--no-progress"]
    spec = load_spec(url, study_name)
    study = optuna.load_study(study_name=study_name, storage=_open_storage(url))
    TrialState = _states()
    procs = [subprocess.Popen(cmd, env=env) for _ in range(n)]
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        with progress_bar(spec.n_trials, f"{n} workers", "trial", enabled=progress) as bar:
            while any(p.poll() is None for p in procs):
                if deadline is not None and time.monotonic() > deadline:
                    break
                time.sleep(poll_s)
                bar.n = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)))
                bar.refresh()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [p.wait() for p in procs]


# ---------------------------------------------------------------------------------------------- results
def fleet_result(url: str, study_name: str, model: CostModel, *, tolerance: float = 0.01,
                 exact_seconds: float | None = None, exact_work: int | None = DEFAULT_WORK) -> SearchResult:
    """Pick the list to ship from a finished fleet study, exactly as a single-process search does
    (tuner.search.study.summarize_study against the exact solver, within `exact_work` steps and `exact_seconds`)."""
    import optuna

    from tuner.search.study import SearchConfig, exact_solve, summarize_study

    spec = load_spec(url, study_name)
    study = optuna.load_study(study_name=study_name, storage=_open_storage(url))
    exact = exact_solve(model, memory_buckets=spec.memory_buckets, work=exact_work, seconds=exact_seconds)
    config = SearchConfig(n_trials=spec.n_trials, storage=url, objective=spec.objective, seed=spec.seed,
                          memory_buckets=spec.memory_buckets, exact_work=exact_work, exact_seconds=exact_seconds,
                          tolerance=tolerance,
                          study_name=study_name, progress=False)
    return summarize_study(model, study, exact, config, storage=url, run_now=0)


@dataclass(frozen=True)
class StudyStatus:
    """One study as `cgtune status` shows it."""

    name: str
    """Study name."""
    fleet: bool
    """Created by `cgtune tune --storage URL --workers N` (has a fleet spec)."""
    planned: int | None
    """Trials planned (fleet studies)."""
    counts: dict[str, int]
    """Trials per state: complete, running, waiting, failed, pruned; retried (reruns of stale trials); and
    gpu_validated (measurements `cgtune tune --validate` added, counted in no state)."""
    best_value: float | None
    """Best feasible value so far (first objective), None before any."""
    best_sizes: list[int] | None
    """Capture list of that trial."""
    best_shape: str | None = None
    """That list in its engine's words (`Engine.list_shape`, recorded with the trial; None: an older study)."""
    workload: str | None = None
    """Workload name (fleet studies)."""

    @property
    def done(self) -> bool:
        return self.counts.get("waiting", 0) == 0 and self.counts.get("running", 0) == 0


def study_status(url: str, study_name: str | None = None) -> list[StudyStatus]:
    """Trial counts and best so far of every study in the storage (or one)."""
    import optuna

    storage = _open_storage(url)
    try:
        names = [study_name] if study_name else sorted(optuna.get_all_study_names(storage))
    except Exception as exc:
        raise FleetError(hide_secret(f"cannot read studies from {display_url(url)}: "
                                     f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r}", url)
                         ) from None
    TrialState = _states()
    out = []
    for name in names:
        try:
            study_id = storage.get_study_id_from_name(name)
        except KeyError:
            raise FleetError(f"no study {name!r} in {display_url(url)}") from None
        attrs = storage.get_study_user_attrs(study_id)
        spec = attrs.get(FLEET_ATTR) if isinstance(attrs.get(FLEET_ATTR), dict) else None
        trials = storage.get_all_trials(study_id, deepcopy=False)
        counts = {"complete": 0, "running": 0, "waiting": 0, "failed": 0, "pruned": 0, "retried": 0,
                  "gpu_validated": 0}
        key = {TrialState.COMPLETE: "complete", TrialState.RUNNING: "running", TrialState.WAITING: "waiting",
               TrialState.FAIL: "failed", TrialState.PRUNED: "pruned"}
        best = None
        for t in trials:
            if t.user_attrs.get("source") == "gpu-validation":  # a measurement by tune --validate, not a trial
                counts["gpu_validated"] += 1
                continue
            counts[key[t.state]] += 1
            counts["retried"] += "failed_trial" in t.system_attrs
            if t.state == TrialState.COMPLETE and t.values and all(v <= 0 for v in t.constraints.values()):
                if best is None or t.values[0] < best.values[0]:
                    best = t
        evaluation = (best.user_attrs.get("evaluation") or {}) if best is not None else {}
        out.append(StudyStatus(name, spec is not None, spec.get("n_trials") if spec else None, counts,
                               best.values[0] if best is not None else None, evaluation.get("capture_sizes"),
                               evaluation.get("shape"), spec.get("workload_name") if spec else None))
    return out
