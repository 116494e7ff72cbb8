"""What each Ray task of a fleet run does on its node: probe the node (the backend and versions a result there would
record), profile a deployment into the store (resuming the widths it has), search it, validate it. Plain functions
of plain data: `tuner.fleet.runner` makes them Ray tasks; nothing here imports ray."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuner.fleet.catalogue import Deployment
from tuner.fleet.store import append_measured, deployment_dir, write_status

__all__ = ["ARTIFACTS_DIR", "KILL_AFTER_ENV", "StageFailed", "TableWatch", "probe", "profile_task", "search_task",
           "upload_artifacts", "validate_task"]

KILL_AFTER_ENV = "CGTUNE_FLEET_TEST_KILL_AFTER_WIDTHS"
"""TEST-ONLY hook (tests/fleet): with this set to K in the driver's environment, a profile task SIGKILLs its own
worker process once the table holds K widths, the first time only (a marker file in the deployment's folder), so the
test sees Ray retry the task and the profile resume. Never set it outside a test."""

_KILLED_MARKER = "test-killed-once"

ARTIFACTS_DIR = "artifacts"
"""The store's folder of the optuna studies' artifacts (`upload_artifacts`)."""


class StageFailed(Exception):
    """A stage of a deployment failed for a reason of its own (bad input, no list fits, a device error): one line,
    already written to its status; Ray does not retry it (only a dead worker or node is retried)."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _fail(store: Path, name: str, stage: str, exc: BaseException) -> StageFailed:
    reason = f"{stage}: {_first_line(exc)}"
    write_status(store, name, "failed", reason=reason)
    return StageFailed(reason)


def probe(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """On a node of the deployments' kind (one probe per kind: one process importing the measuring stage): per
    deployment, the profile's instrument as `cgtune profile --backend` resolves it there (`stand-in`, `vllm
    <version>`, or `unavailable` with why), cgtune's version and the installed vLLM's (None without one)."""
    from tuner import __version__
    from tuner.measure.vllm_engine import BackendError, choose_backend, installed_version
    from tuner.workload.spec import load_workload

    version, _dist = installed_version()
    answers = []
    for spec in specs:
        dep = Deployment.from_dict(spec)
        try:
            backend, why = choose_backend(dep.backend, load_workload(dep.workload_path), dep.device)
        except BackendError as exc:
            backend, why = "unavailable", _first_line(exc)
        answers.append({"backend": backend if backend != "vllm" else f"vllm {version}", "why": why,
                        "cgtune_version": __version__, "vllm_version": version, "host": os.uname().nodename})
    return answers


def _widths(dep: Deployment, workload: Any) -> list[int]:
    """The widths `cgtune profile` would measure with the deployment's --sizes / --max-widths."""
    from tuner.measure.profile import candidate_widths, thin_widths, validate_sizes
    from tuner.measure.sweep_plan import key_widths

    if dep.sizes is not None:
        return validate_sizes(dep.sizes, workload)
    widths = candidate_widths(workload)
    return widths if dep.max_widths is None else thin_widths(widths, dep.max_widths, keep=key_widths(workload)[0])


def profile_task(spec: dict[str, Any], store: str, kill_after_widths: int | None = None) -> dict[str, Any]:
    """Profile the deployment into STORE/deployments/<name>/profile/ on the GPUs Ray gave this task, resuming the
    widths a killed attempt left in the table; the status file follows each width (`profiling N/M widths`)."""
    from tuner.measure.profile import DEVICE_BUDGETS, SweepOptions, profile_workload
    from tuner.workload.spec import load_workload

    dep, store_path = Deployment.from_dict(spec), Path(store)
    folder = deployment_dir(store_path, dep.name)
    profile_dir = folder / "profile"
    try:
        workload = load_workload(dep.workload_path)
        widths = _widths(dep, workload)
        warmup, rep, min_reps = DEVICE_BUDGETS[dep.device]
        options = SweepOptions(warmup_ms=warmup if dep.warmup_ms is None else dep.warmup_ms,
                               rep_ms=rep if dep.rep_ms is None else dep.rep_ms, min_reps=dep.min_reps or min_reps)
    except ValueError as exc:
        raise _fail(store_path, dep.name, "profile", exc) from None
    write_status(store_path, dep.name, "profiling", widths_done=0, widths_total=len(widths), host=os.uname().nodename)

    def on_width(width: int, in_table: int, requested: int) -> None:
        append_measured(profile_dir, width, in_table, requested)
        write_status(store_path, dep.name, "profiling", widths_done=in_table, widths_total=requested)
        if kill_after_widths is not None and in_table >= kill_after_widths and not (folder / _KILLED_MARKER).exists():
            (folder / _KILLED_MARKER).write_text(f"pid {os.getpid()} killed itself after {in_table} widths\n")
            os.kill(os.getpid(), signal.SIGKILL)

    command = shlex.join(["cgtune", "fleet", "run", "(profile)", dep.name, "--device", dep.device])
    try:
        if dep.backend != "stand-in" and _resolved_vllm(dep, workload):
            from tuner.measure.vllm_engine import profile_through_vllm

            def seen(in_table: int) -> None:
                write_status(store_path, dep.name, "profiling", widths_done=in_table, widths_total=len(widths))

            # vLLM's sweep has no per-width callback: its table's metadata (written after every width) is followed.
            with TableWatch(profile_dir / f"{workload.name}.json", seen):
                result = profile_through_vllm(workload, profile_dir, widths=widths, device=dep.device,
                                              options=options, compile=dep.compile, command=command, progress=False,
                                              rounds=3 if dep.device == "cpu" else 1)
        else:
            result = profile_workload(workload, profile_dir, widths=widths, device=dep.device, options=options,
                                      compile=dep.compile, command=command, progress=False, on_width=on_width)
    except (ValueError, RuntimeError, OSError) as exc:
        raise _fail(store_path, dep.name, "profile", exc) from None
    if not result.complete:
        raise _fail(store_path, dep.name, "profile", RuntimeError(
            f"stopped early with {len(result.metadata.get('widths_done') or [])} of {len(widths)} widths"))
    write_status(store_path, dep.name, "profiling", widths_done=len(result.metadata["widths_done"]),
                 widths_total=len(widths), profile_csv=str(result.csv_path),
                 device_name=result.metadata.get("device_name"))
    return {"csv": str(result.csv_path), "measured_now": list(result.measured)}


class TableWatch:
    """Follows a profile's metadata file from a thread while a sweep writes it, calling `seen(widths_done)` each time
    the count of widths in its table changes (every `interval_s` at most): progress for a sweep that reports none."""

    def __init__(self, json_path: Path, seen: Callable[[int], None], interval_s: float = 2.0) -> None:
        self.json_path, self.seen, self.interval_s = json_path, seen, interval_s
        self.last: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="cgtune-table-watch", daemon=True)

    def look(self) -> None:
        try:
            done = len(json.loads(self.json_path.read_text()).get("widths_done") or [])
        except (OSError, ValueError, AttributeError):  # not written yet, or not a mapping
            return
        if done != self.last:
            self.last = done
            self.seen(done)

    def _follow(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.look()

    def __enter__(self) -> TableWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _resolved_vllm(dep: Deployment, workload: Any) -> bool:
    from tuner.measure.vllm_engine import choose_backend

    return choose_backend(dep.backend, workload, dep.device)[0] == "vllm"


def search_task(spec: dict[str, Any], store: str, storage: str | None, profiled: dict[str, Any]) -> dict[str, Any]:
    """Search the deployment's profile (or, on the cpu kind, its `search_profile`) and write its run directory
    STORE/deployments/<name>/run/ (cgtune search's files); `trials` 0 runs the exact solver alone."""
    import tuner
    from tuner.validate.validation import ValidationError, exact_run
    from tuner.workload.spec import load_workload

    dep, store_path = Deployment.from_dict(spec), Path(store)
    csv = dep.search_profile or Path(profiled["csv"])
    write_status(store_path, dep.name, "searching", searched_profile=str(csv))
    run_dir = deployment_dir(store_path, dep.name) / "run"
    shutil.rmtree(run_dir, ignore_errors=True)  # a search is redone whole (seconds); a stale run must not linger
    command = f"cgtune fleet run {dep.name} (search of {csv})"
    try:
        if dep.trials == 0:
            exact_run(dep.workload_path, csv, run_dir, command=command)
        else:
            model = tuner.cost_model(load_workload(dep.workload_path), csv)
            result = tuner.search_capture_lists(model, trials=dep.trials, storage=storage)
            tuner.write_run(run_dir, model, result, command=command)
            if storage is not None:
                files = [csv, csv.with_suffix(".json"), *sorted(f for f in run_dir.iterdir() if f.is_file())]
                ids = upload_artifacts(store_path, storage, result.study_name, files)
                write_status(store_path, dep.name, "searching", study=result.study_name, artifacts=ids)
    except (ValueError, ValidationError) as exc:
        raise _fail(store_path, dep.name, "search", exc) from None
    return {"run_dir": str(run_dir)}


def upload_artifacts(store: Path, storage: str, study_name: str, files: list[Path]) -> dict[str, str]:
    """The files as artifacts of the search's optuna study (`optuna.artifacts`): their bytes under STORE/artifacts/
    (a directory every node can write, like the rest of the store), their metadata (file name, artifact id) in the
    study in `storage`, so whoever reads the study from PostgreSQL finds the profile and run files it was searched
    on and wrote. Returns {file name: artifact id}; a file that is not there (a profile without its .json) is left
    out."""
    import optuna
    from optuna.artifacts import FileSystemArtifactStore, upload_artifact

    root = store / ARTIFACTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    artifact_store = FileSystemArtifactStore(str(root))
    study = optuna.load_study(study_name=study_name, storage=storage)
    return {f.name: upload_artifact(artifact_store=artifact_store, file_path=str(f), study_or_trial=study)
            for f in files if f.is_file()}


def validate_task(spec: dict[str, Any], store: str, searched: dict[str, Any]) -> dict[str, Any]:
    """Validate the run directory on this task's GPUs (`cgtune validate`; on the cpu kind a rehearsal: graph steps
    run eagerly and the record says these are no validation numbers), then mark the deployment done."""
    from tuner.validate.validation import ValidationError, validate_run

    dep, store_path = Deployment.from_dict(spec), Path(store)
    run_dir = Path(searched["run_dir"])
    if dep.validate_steps:
        write_status(store_path, dep.name, "validating")
        try:
            validate_run(run_dir, num_steps=dep.validate_steps, device=dep.device,
                         command=f"cgtune fleet run {dep.name} (validate --steps {dep.validate_steps})")
        except (ValueError, RuntimeError, ValidationError) as exc:
            raise _fail(store_path, dep.name, "validate", exc) from None
    write_status(store_path, dep.name, "done")
    return {"run_dir": str(run_dir)}
