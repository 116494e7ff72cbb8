"""`cgtune fleet` on a real local Ray cluster (2 CPUs, no GPU): a three-deployment catalogue end to end, a profile
task SIGKILLed mid-sweep retried by Ray and resumed with no width measured twice or lost, a rerun that skips current
results and redoes a stale one, and a GPU kind the cluster lacks reported at once. The deployments target the `cpu`
kind: tiny random-weight models profiled for real on the CPU (eager rows), searched and validated (a rehearsal: graph
steps run eagerly) on hand-made profiles with graph rows (test fixtures, never measurements)."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import sys
import time
from pathlib import Path

import pytest
import ray
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # tests/handmade_profiles.py (import-mode=importlib)
from handmade_profiles import handmade_profile, handmade_spec  # noqa: E402

from tuner.cli import main  # noqa: E402
from tuner.fleet import load_catalogue, read_index, run_catalogue  # noqa: E402
from tuner.fleet.tasks import KILL_AFTER_ENV  # noqa: E402
from tuner.profile.table import read_profile  # noqa: E402
from tuner.workload.spec import load_workload  # noqa: E402

# Every test here runs on a Ray cluster of its own, started once for the module.
pytestmark = pytest.mark.slow

NAMES = ("tiny-a", "tiny-b", "tiny-c")
SIZES = [1, 2, 4, 8, 16, 32]
"""The widths each deployment's profile measures (`sizes`): a handful, so the tests stay fast."""
WIDTHS = len(SIZES)


@pytest.fixture(scope="module")
def cluster():
    # Workers import cgtune from this tree, whatever else is installed.
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    yield
    ray.shutdown()


def write_catalogue(folder: Path, names: tuple[str, ...] = NAMES, *, extra: list[dict] | None = None,
                    **defaults: object) -> Path:
    """Tiny workloads (2 layers, hidden 64, q = 2) as NAME.yaml, a hand-made profile with graph rows for each under
    hand/ (the CPU's own profile has none to search), and fleet.yaml naming them all on the cpu kind."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):
        seqs = 8 * (i + 1)
        spec = handmade_spec(name=name, max_num_seqs=seqs, num_speculative_tokens=1, max_num_batched_tokens=64)
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(spec))
        handmade_profile(folder / "hand", load_workload(folder / f"{name}.yaml"), [1, 2, 4, 8, 16, 32, 64], name=name)
    catalogue = {
        "store": "results",
        "defaults": {"gpu_kind": "cpu", "sizes": SIZES, "compile": False, "warmup_ms": 1, "rep_ms": 2,
                     "min_reps": 2, "trials": 8, "validate_steps": 20, **defaults},
        "deployments": [{"name": n, "workload": f"{n}.yaml", "search_profile": f"hand/{n}.csv"} for n in names]
        + (extra or []),
    }
    (folder / "fleet.yaml").write_text(yaml.safe_dump(catalogue, sort_keys=False))
    return folder / "fleet.yaml"


def run_quietly(catalogue: Path) -> tuple[dict, list[str], float]:
    """run_catalogue with its progress lines collected: (index, lines, seconds)."""
    lines: list[str] = []
    t0 = time.monotonic()
    index = run_catalogue(load_catalogue(catalogue), progress=lines.append, poll_s=0.2)
    return index, lines, time.monotonic() - t0


def cli(*argv: object) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main([str(a) for a in argv])
    return code, out.getvalue()


def profile_widths(store: Path, name: str) -> list[int]:
    return sorted({r.num_tokens for r in read_profile(store / "deployments" / name / "profile" / f"{name}.csv").rows})


def measured_log(store: Path, name: str) -> list[dict]:
    path = store / "deployments" / name / "profile" / "measured.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def first_run(cluster, tmp_path_factory) -> tuple[Path, dict, list[str], str]:
    """The three-deployment catalogue run once through `cgtune fleet run`: (catalogue, index, its lines, stdout)."""
    catalogue = write_catalogue(tmp_path_factory.mktemp("fleet"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["fleet", "run", str(catalogue), "--poll", "0.2"])
    assert code == 0, out.getvalue()
    store = catalogue.parent / "results"
    return catalogue, json.loads((store / "index.json").read_text()), out.getvalue().splitlines(), out.getvalue()


def test_a_three_deployment_catalogue_runs_end_to_end(first_run) -> None:
    catalogue, index, lines, stdout = first_run
    store = catalogue.parent / "results"
    assert [e["deployment"] for e in index["deployments"]] == list(NAMES)
    for entry in index["deployments"]:
        name = entry["deployment"]
        assert entry["status"] == "done" and entry["gpu_kind"] == "cpu", entry
        # The profile was measured here, on the CPU, with the device metadata every profile records.
        profile = read_profile(store / "deployments" / name / "profile" / f"{name}.csv")
        assert profile.widths() == SIZES and profile.metadata["device"] == "cpu"
        assert profile.metadata["device_name"] and profile.metadata["torch_version"]
        assert {r.mode: r.status for r in profile.rows}["eager"] == "ok"
        run = store / "deployments" / name / "run"
        summary = json.loads((run / "summary.json").read_text())
        assert entry["shipped_sizes"] == summary["shipped"]["capture_sizes"] and entry["shipped_sizes"]
        assert entry["expected_step_ms"] == pytest.approx(
            summary["compact" if summary["shipped"]["list"] == "compact" else "tuned"]["expected_step_ms"])
        assert entry["predicted_saving_share"] == pytest.approx(
            1 - entry["expected_step_ms"] / summary["default"]["expected_step_ms"])
        assert entry["searched_profile"].endswith(f"hand/{name}.csv")
        validation = json.loads((run / "validation.json").read_text())
        assert validation["trace"]["steps"] == 20 and "no validation numbers" in " ".join(validation["warnings"])
        assert (run / "compilation_config.json").is_file() and (run / "report.md").is_file()
        # One line per move, in order.
        mine = [line.split(": ", 2)[2] for line in lines if line.startswith(f"fleet: {name} (cpu): ")]
        moves = [m.split(" ")[0] for m in mine]
        assert moves[0] == "queued" and moves[-1] == "done", mine
        assert [m for i, m in enumerate(moves) if i == 0 or m != moves[i - 1]] == \
            ["queued", "profiling", "searching", "validating", "done"], mine
        assert entry["widths_done"] == entry["widths_total"] == WIDTHS
    # The index reads back as JSON and as a table, from the store alone.
    code, table = cli("fleet", "status", store)
    assert code == 0 and table.splitlines()[0].split() == ["deployment", "gpu", "kind", "status", "shipped", "list",
                                                           "predicted", "saving"]
    assert all(any(line.startswith(n) and " done " in line for line in table.splitlines()) for n in NAMES), table
    code, text = cli("fleet", "status", store, "--json")
    assert code == 0 and [e["status"] for e in json.loads(text)["deployments"]] == ["done"] * 3
    assert (store / "index.md").read_text().startswith("| deployment | gpu kind | status |")
    assert table.strip() in stdout  # the run printed the same table at its end


def test_a_profile_killed_mid_sweep_is_retried_and_resumes_without_losing_or_repeating_a_width(
        cluster, tmp_path, monkeypatch) -> None:
    catalogue = write_catalogue(tmp_path, ("tiny-a",), trials=0, validate_steps=0)
    monkeypatch.setenv(KILL_AFTER_ENV, "2")  # the profile task SIGKILLs its worker once the table holds 2 widths
    index, lines, _ = run_quietly(catalogue)
    store = tmp_path / "results"
    assert [e["status"] for e in index["deployments"]] == ["done"], lines
    assert (store / "deployments" / "tiny-a" / "test-killed-once").is_file()
    log = measured_log(store, "tiny-a")
    pids = list(dict.fromkeys(e["pid"] for e in log))
    assert len(pids) == 2, log  # two attempts: the killed worker and Ray's retry in another process
    first = [e["width"] for e in log if e["pid"] == pids[0]]
    second = [e["width"] for e in log if e["pid"] == pids[1]]
    assert len(first) == 2 and len(second) == WIDTHS - 2
    requested = json.loads((store / "deployments" / "tiny-a" / "profile" / "tiny-a.json").read_text())
    assert sorted(first + second) == sorted(requested["widths_requested"]) == profile_widths(store, "tiny-a")
    rows = read_profile(store / "deployments" / "tiny-a" / "profile" / "tiny-a.csv").rows
    assert len(rows) == len({(r.num_tokens, r.mode) for r in rows})  # no width written twice
    assert second[0] == log[2]["width"] and log[2]["in_table"] == 3  # the retry began from the 2 widths kept


def test_a_rerun_skips_current_results_and_redoes_a_stale_one(first_run, tmp_path) -> None:
    catalogue, _, _, _ = first_run
    folder = tmp_path / "again"
    shutil.copytree(catalogue.parent, folder)
    store = folder / "results"
    # Copied to another folder, the store's files still record the first run's paths: only tiny-b's content changes.
    spec = yaml.safe_load((folder / "tiny-b.yaml").read_text())
    spec["description"] = "tiny-b, edited after the first run"
    (folder / "tiny-b.yaml").write_text(yaml.safe_dump(spec))
    before = {n: (store / "deployments" / n / "profile" / f"{n}.csv").stat().st_mtime_ns for n in NAMES}
    index, lines, _ = run_quietly(folder / "fleet.yaml")
    assert [e["status"] for e in index["deployments"]] == ["done"] * 3, lines
    for name in ("tiny-a", "tiny-c"):
        assert f"fleet: {name} (cpu): done (current: same workload hash, GPU kind, backend and versions; skipped)" \
            in lines
        assert (store / "deployments" / name / "profile" / f"{name}.csv").stat().st_mtime_ns == before[name]
        assert len(measured_log(store, name)) == WIDTHS  # nothing measured again
    assert any(line.startswith("fleet: tiny-b (cpu): stale (workload_hash was ") for line in lines), lines
    assert len(measured_log(store, "tiny-b")) == WIDTHS  # redone from scratch: one fresh sweep, not resumed
    new_hash = load_workload(folder / "tiny-b.yaml").content_hash
    assert index["deployments"][1]["fingerprint"]["workload_hash"] == new_hash
    assert read_profile(store / "deployments" / "tiny-b" / "profile" / "tiny-b.csv").metadata["workload"]["hash"] \
        == new_hash


def test_a_gpu_kind_the_cluster_lacks_is_reported_at_once_not_left_pending(cluster, tmp_path) -> None:
    catalogue = write_catalogue(tmp_path, (), extra=[
        {"name": "on-h200", "workload": str(ROOT / "workloads" / "tiny-cpu.yaml"), "gpu_kind": "H200"},
        {"name": "tp2-on-a100", "workload": str(ROOT / "workloads" / "suffix-llama-3.1-70b-tp2.yaml"),
         "gpu_kind": "A100"},
        # It runs, but a CPU profile has no graph rows and no search_profile stands in: its search fails.
        {"name": "no-graphs", "workload": str(ROOT / "workloads" / "tiny-cpu.yaml"), "gpu_kind": "cpu",
         "sizes": [1, 4]}])
    index, lines, seconds = run_quietly(catalogue)
    assert seconds < 30, lines
    h200, a100, no_graphs = index["deployments"]
    assert h200["status"] == a100["status"] == no_graphs["status"] == "failed"
    assert no_graphs["reason"].startswith("search: tiny-cpu.csv: measured with compiled=False") and \
        no_graphs["widths_done"] == 2 and no_graphs["run_dir"] is None
    assert f"fleet: no-graphs (cpu): failed: {no_graphs['reason']}" in lines
    assert h200["reason"] == ("gpu_kind H200: no node of the cluster has it (resource accelerator_type:H200; the "
                              "cluster has no GPU kind)")
    assert "accelerator_type:A100" in a100["reason"]
    assert "fleet: on-h200 (H200): failed: gpu_kind H200: no node of the cluster has it" in lines[0]
    code, table = cli("fleet", "status", tmp_path / "results")
    assert code == 0 and "failed: gpu_kind H200: no node" in table
    assert read_index(tmp_path / "results")["deployments"][0]["status"] == "failed"
