"""A fleet search with `storage:` set leaves the deployment's profile and run files as artifacts of its optuna study:
the bytes in the store, the metadata in the study, so a reader of the storage alone (PostgreSQL in a fleet; an SQLite
file, and the CI's PostgreSQL server) finds them. The search task runs as a plain function (Ray only schedules it:
tests/fleet/test_fleet_ray.py); the profile is hand-made (a test fixture, never a measurement)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.artifacts import FileSystemArtifactStore, download_artifact, get_all_artifact_meta

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # tests/handmade_profiles.py (import-mode=importlib)
from handmade_profiles import handmade_profile, handmade_spec  # noqa: E402

from tuner.fleet import load_catalogue  # noqa: E402
from tuner.fleet.store import read_status  # noqa: E402
from tuner.fleet.tasks import ARTIFACTS_DIR, search_task  # noqa: E402
from tuner.workload.spec import load_workload  # noqa: E402


def assert_the_files_are_artifacts_of_the_study(tmp_path: Path, storage: str) -> None:
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(handmade_spec(name="tiny", max_num_seqs=8,
                                                                     max_num_batched_tokens=64)))
    csv = handmade_profile(tmp_path / "hand", load_workload(tmp_path / "tiny.yaml"), [1, 2, 4, 8, 16, 32, 64],
                           name="tiny")
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump({
        "store": "results", "storage": storage,
        "deployments": [{"name": "tiny", "workload": "tiny.yaml", "gpu_kind": "cpu", "trials": 6,
                         "search_profile": "hand/tiny.csv"}]}))
    catalogue = load_catalogue(tmp_path / "fleet.yaml")
    (dep,) = catalogue.deployments
    got = search_task(dep.as_dict(), str(catalogue.store), catalogue.storage, {"csv": str(csv)})

    run_dir = Path(got["run_dir"])
    status = read_status(catalogue.store, "tiny")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert status["study"] == summary["study"]["name"]
    # Read back from the storage alone: the study's artifacts are the profile searched and every file of the run.
    study = optuna.load_study(study_name=status["study"], storage=storage)
    metas = {m.filename: m for m in get_all_artifact_meta(study)}
    expected = {"tiny.csv": csv, "tiny.json": csv.with_suffix(".json"),
                **{f.name: f for f in run_dir.iterdir() if f.is_file()}}
    assert set(metas) == set(expected) and {"summary.json", "report.md", "search.json"} <= set(metas)
    assert status["artifacts"] == {name: m.artifact_id for name, m in metas.items()}
    artifact_store = FileSystemArtifactStore(str(catalogue.store / ARTIFACTS_DIR))
    for name, meta in metas.items():
        copy = tmp_path / "down" / name
        copy.parent.mkdir(exist_ok=True)
        download_artifact(artifact_store=artifact_store, artifact_id=meta.artifact_id, file_path=str(copy))
        assert copy.read_bytes() == expected[name].read_bytes(), name


def test_a_searched_deployments_files_are_artifacts_of_its_study_in_an_sqlite_storage(tmp_path: Path) -> None:
    assert_the_files_are_artifacts_of_the_study(tmp_path, f"sqlite:///{tmp_path / 'studies.db'}")


@pytest.mark.postgres
def test_a_searched_deployments_files_are_artifacts_of_its_study_on_postgresql(tmp_path: Path, pg_url: str) -> None:
    assert_the_files_are_artifacts_of_the_study(tmp_path, pg_url)


def test_without_a_storage_nothing_is_uploaded(tmp_path: Path) -> None:
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(handmade_spec(name="tiny", max_num_seqs=8,
                                                                     max_num_batched_tokens=64)))
    csv = handmade_profile(tmp_path / "hand", load_workload(tmp_path / "tiny.yaml"), [1, 2, 4, 8, 16], name="tiny")
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump({
        "store": "results", "deployments": [{"name": "tiny", "workload": "tiny.yaml", "gpu_kind": "cpu", "trials": 4,
                                             "search_profile": "hand/tiny.csv"}]}))
    catalogue = load_catalogue(tmp_path / "fleet.yaml")
    search_task(catalogue.deployments[0].as_dict(), str(catalogue.store), None, {"csv": str(csv)})
    assert "artifacts" not in read_status(catalogue.store, "tiny")
    assert not (catalogue.store / ARTIFACTS_DIR).exists()
