"""A run directory as the decision leaves it: which files a run writes (`RUN_FILES`, `run_outputs`), which run a
directory holds (`run_identity`, `run_conflict`), clearing one (`clear_run`), and reading one back (`load_run`:
the cost model from its own copies, the search from search.json, under the model settings summary.json records)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.decision.record import alternative_name
from tuner.engines.registry import ENGINE_FILES
from tuner.model.costmodel import MODEL_SETTINGS, CostModel

if TYPE_CHECKING:
    from tuner.decision.record import Decision
    from tuner.search.study import SearchResult  # noqa: F811 (imported again where load_run needs it)
    from tuner.workload.spec import Workload

__all__ = ["RUN_FILES", "RunIdentity", "clear_run", "load_run", "load_run_workload", "recorded_decision",
           "recorded_model_settings", "recorded_origin", "recorded_summary", "run_conflict", "run_identity",
           "run_outputs"]


RUN_FILES = ("profile.csv", "profile.json", "workload.yaml", "search.json", "summary.json", "report.md")
"""Files a run directory holds besides the vLLM files and plots/ (and study.db with the default storage)."""


def run_outputs() -> tuple[str, ...]:
    """Files every write_run renders again (report.md only with report=True; only its own engine's list files, of
    every engine registered, and the other list's beside them): one left from an earlier run is stale."""
    lists = [name for files in ENGINE_FILES.values() for name in files]
    others = [alternative_name(name, which) for name in lists for which in ("fastest", "compact")]
    return (*lists, *others, "search.json", "summary.json", "report.md")


def recorded_summary(run_dir: str | Path) -> dict[str, Any]:
    """A run directory's summary.json as it stands ({} when there is none, or it is unreadable or no mapping)."""
    try:
        data = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def earlier_answer(run_dir: str | Path, workload: Workload) -> list[tuple[int, ...]]:
    """The lists an earlier run of this workload in run_dir shipped, tuned and compacted (summary.json), as the
    engine's keys, to seed a new search there: its answer is then no worse than the earlier one on the same profile.
    [] where the directory holds no run of this workload (its content hash) under the same release."""
    data = recorded_summary(run_dir)
    try:
        # vLLM's releases key their lists differently (0.34: decode graphs by request count, below 0); another
        # engine records no release
        release = workload.engine.version if workload.engine.release_words else None
        same = data["workload"]["hash"] == workload.content_hash and data.get("vllm_version") == release
    except (KeyError, TypeError):
        return []
    if not same:
        return []
    lists = [data.get(name, {}).get("capture_sizes") for name in ("tuned", "compact")]
    shipped = data.get("shipped")
    if isinstance(shipped, dict):
        lists += [shipped.get("capture_sizes"), (shipped.get("other") or {}).get("capture_sizes")]
    return list(dict.fromkeys(tuple(int(w) for w in sizes) for sizes in lists
                              if isinstance(sizes, list) and all(isinstance(w, int) for w in sizes)))


def recorded_model_settings(run_dir: str | Path) -> dict[str, Any]:
    """The CostModel settings a run directory's summary.json records (`cost_model`; {} when it records none)."""
    recorded = recorded_summary(run_dir).get("cost_model")
    return {k: recorded[k] for k in MODEL_SETTINGS if isinstance(recorded, dict) and k in recorded}


def recorded_origin(run_dir: str | Path) -> tuple[str | None, str | None]:
    """(the command that made the run, the profile it was searched on) as its summary.json records them; None where
    it records none (a run older than the field, or no summary)."""
    data = recorded_summary(run_dir)
    command, profile = data.get("command"), data.get("profile")
    return (command if isinstance(command, str) else None), (profile if isinstance(profile, str) else None)


@dataclass(frozen=True)
class RunIdentity:
    """Which workload and profile the files of a run directory describe."""

    workload: str
    """Workload name."""
    workload_hash: str | None
    """Its content hash (None when the directory does not say)."""
    profile: str
    """The profile the run was searched on: its original path, or the copy's name."""
    profile_hash: str | None
    """`tuner.search.study.profile_hash` of the profile CSV + JSON (None when unknown, or not measured yet)."""

    def describe(self) -> str:
        return (f"workload {self.workload} (hash {self.workload_hash or '?'}) on profile {self.profile}"
                + (f" (hash {self.profile_hash})" if self.profile_hash else ""))


def run_identity(run_dir: str | Path) -> RunIdentity | None:
    """The run a directory holds (from its summary.json, workload and profile copies), None when it holds none; a
    `study.db` or `profile-sweep/` alone is no run."""
    from tuner.search.study import profile_hash

    run = Path(run_dir)
    if not run.is_dir() or not any((run / n).is_file() for n in (*RUN_FILES, *run_outputs())):
        return None
    name: str = "?"
    whash: str | None = None
    profile = "profile.csv"
    data = recorded_summary(run)
    try:
        name, whash = str(data["workload"]["name"]), str(data["workload"]["hash"])
        profile = str(data.get("profile") or profile)
    except (KeyError, TypeError):
        try:
            wl = load_run_workload(run)
            name, whash = wl.name, wl.content_hash
        except ValueError:  # no readable workload copy either: an unknown run, which no new run matches
            pass
    phash = profile_hash(run / "profile.csv") if (run / "profile.csv").is_file() else None
    return RunIdentity(name, whash, profile, phash)


def run_conflict(run_dir: str | Path, workload: Workload, profile_csv: str | Path | None) -> str | None:
    """None when run_dir is empty or holds this workload's run on this profile (profile_csv None: not measured
    yet, so only the workload is compared); else one line naming what it holds and what this run is."""
    from tuner.search.study import profile_hash

    held = run_identity(run_dir)
    if held is None:
        return None
    phash = profile_hash(profile_csv) if profile_csv is not None and Path(profile_csv).is_file() else None
    same_workload = held.workload_hash is not None and held.workload_hash == workload.content_hash
    same_profile = phash is None or (held.profile_hash is not None and held.profile_hash == phash)
    if same_workload and same_profile:
        return None
    new = RunIdentity(workload.name, workload.content_hash, str(profile_csv) if profile_csv else "(to be measured)",
                      phash)
    return f"{run_dir} holds the run of {held.describe()}, not of {new.describe()}"


def clear_run(run_dir: str | Path, *, keep: tuple[str | Path, ...] = ()) -> list[Path]:
    """Remove what cgtune wrote into a run directory (outputs, input copies with the trace a workload copy names,
    validation.json, plots/, the default study.db), keeping profile-sweep/ (measurements, named by workload), any
    file cgtune does not write and the files in `keep` (the new run's own inputs, when they sit there); returns
    what was removed."""
    import shutil

    run = Path(run_dir)
    kept = {Path(k).resolve() for k in keep}
    names = [*run_outputs(), *RUN_FILES, "validation.json", "study.db", "study.db-wal", "study.db-shm",
             "study.db.cgtune-claim.lock"]
    try:
        import yaml

        trace = ((yaml.safe_load((run / "workload.yaml").read_text()) or {}).get("traffic") or {}).get("trace")
        if isinstance(trace, str) and not Path(trace).is_absolute() and ".." not in Path(trace).parts:
            names.append(trace)  # as _copy_inputs copies it
    except (OSError, ValueError, AttributeError):
        pass
    removed = []
    for name in dict.fromkeys(names):
        path = run / name
        if (path.is_file() or path.is_symlink()) and path.resolve() not in kept:
            path.unlink()
            removed.append(path)
    for path in [run / "plots", *run.glob(".cgtune-staging-*")]:
        if path.is_dir():
            shutil.rmtree(path)
            removed.append(path)
    return removed


def load_run_workload(run_dir: str | Path) -> Workload:
    """A run directory's copied workload, under the vLLM release the run recorded (summary.json's `vllm_version`),
    where the workload leaves it auto (`tuner.engines.vllm.versions.recorded_version`)."""
    from tuner.engines.vllm.versions import recorded_version
    from tuner.workload.spec import load_workload

    recorded = recorded_summary(Path(run_dir))
    version, why = recorded.get("vllm_version"), recorded.get("vllm_version_why")
    with recorded_version(version if isinstance(version, str) else None, why if isinstance(why, str) else None):
        return load_workload(Path(run_dir) / "workload.yaml")


def load_run(run_dir: str | Path, *, allow_mismatch: bool | None = None) -> tuple[CostModel, SearchResult]:
    """The cost model and search of a run directory (from its copied profile and workload), under the model
    settings its summary.json records (`recorded_model_settings`); `allow_mismatch` overrides the recorded one."""
    from tuner.model.costmodel import ModelError
    from tuner.search.study import SearchResult
    
    run = Path(run_dir)
    for name in ("profile.csv", "workload.yaml", "search.json"):
        if not (run / name).is_file():
            raise ModelError(f"{run}: no {name} (not a cgtune search or tune output directory)")
    workload = load_run_workload(run)
    settings = recorded_model_settings(run)
    if allow_mismatch is not None:
        settings["allow_mismatch"] = allow_mismatch
    model = CostModel.from_files(run / "profile.csv", workload, **settings)
    try:
        data = json.loads((run / "search.json").read_text())
        search = SearchResult.from_dict(data, model)
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ModelError(f"{run / 'search.json'}: unreadable ({type(exc).__name__}: {exc})") from None
    return model, search


def recorded_decision(run_dir: str | Path, model: CostModel, search: SearchResult) -> Decision | None:
    """The decision record a run directory's summary.json holds, read back without deciding again: the interval,
    what changed, off-peak figures, the compact choice's facts and the list shipped as recorded, each list compared
    evaluated from its recorded capture sizes (its figures under the model, not a choice). None, so the caller
    decides anew, when summary.json is missing or older than a field, or records another tuned list or other model
    settings than `model`'s (the figures would no longer be the record's)."""
    from tuner.decision.compare import OffPeak, WhatChanged, WidthChange
    from tuner.decision.load_facts import LoadFacts
    from tuner.decision.record import CompactFacts, Decision, Shipping, search_facts
    from tuner.search.compact import RECOMMEND_SAVING
    from tuner.search.saving_interval import SavingInterval

    data = recorded_summary(run_dir)
    try:
        if (data["capture_sizes"] != list(search.chosen.capture_sizes) or data["cost_model"] != model.settings()
                or data["shipped"]["policy"] != search.ship or ("load" in data) != (search.load_record is not None)):
            return None
        known = {"default": search.default, "tuned": search.chosen, "exact": search.exact.best,
                 "compact": search.compact.evaluation if search.compact is not None else None}
        names = ["default", "tuned", "compact", "exact", "widest", *model.engine.peer_rows, "ideal"]
        table = {name: known.get(name) or (model.ideal() if name == "ideal" else
                                           model.evaluate(data[name]["capture_sizes"])) for name in names}
        if any(list(table[n].capture_sizes) != data[n]["capture_sizes"] for n in names if n != "ideal"):
            return None
        changed = data["what_changed"]
        peak = data["off_peak"]
        iv, (low, high) = data["saving_interval"], data["saving_interval_ms"]
        choice = data["compact_choice"]
        shipped = data["shipped"]
        lists = {"fastest": table["tuned"], "compact": table["compact"]}
        other = shipped["other"]
        return Decision(
            table=table,
            changed=WhatChanged(tuple(changed["added"]), tuple(changed["removed"]), int(changed["default_max"]),
                                tuple(WidthChange(int(r.get("key", r["num_tokens"])), int(r["graph_memory_bytes"]),
                                                  int(r["vllm_graph_estimate_bytes"]), float(r["saved_ms"]))
                                      for r in changed["above_default_max"])),
            off_peak=OffPeak(float(peak["default_step_ms"]), float(peak["tuned_step_ms"]),
                             int(peak["one_request_width"]), peak["default_pads_to"], peak["tuned_pads_to"]),
            interval=SavingInterval(float(iv["point_ms"]), float(low), float(high), float(iv["level"]),
                                    int(iv["replicates"]), int(iv["seed"]), int(iv["readings_from_samples"]),
                                    int(iv["readings_from_iqr"]), int(iv["readings_fixed"]),
                                    int(iv["iqr_normal_samples"]), bool(iv["settled"])),
            no_graphs=model.evaluate(()),
            memory_axis="estimate" if choice["memory_counted"] == "vllm_graph_estimate_bytes" else "real",
            compact=CompactFacts(
                tolerance=float(data["tolerance"]), fastest_ms=float(choice["fastest_ms"]),
                limit_ms=float(choice["limit_ms"]), saved_share=float(choice["saved_share"]),
                recommended=bool(choice["recommended"]), recommend_saving=RECOMMEND_SAVING,
                proven=bool(choice["proven"]), floor_bytes=int(choice["floor_bytes"]),
                fastest_proven=bool(choice["fastest_proven"]), stopped_early=bool(choice["stopped_early"]),
                solves=int(choice["solves"]), work=int(choice.get("work", 0))),
            ship=Shipping(shipped["list"], lists[shipped["list"]], str(shipped["why"]),
                          None if other is None else (other["list"], lists[other["list"]])),
            **search_facts(search), timings={str(k): float(v) for k, v in data["timings"].items()},
            load=LoadFacts.from_dict(data["load"]) if "load" in data else None)
    except (KeyError, TypeError, ValueError):  # a summary older than a field, or hand-edited: decide anew
        return None
