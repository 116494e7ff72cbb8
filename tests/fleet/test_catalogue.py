"""The fleet's parts without Ray: a catalogue's bad fields refused in one line naming the field and value (exit 2,
nothing written), the fit of a deployment on a cluster's nodes, what makes a stored result current, and the index as
JSON and as a table. Hand-made profiles and summaries: test fixtures, never measurements."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # tests/ helpers (import-mode=importlib)
from cli_runner import run  # noqa: E402

from tuner.fleet import CatalogueError, build_index, index_table, load_catalogue, unplaceable  # noqa: E402
from tuner.fleet.store import fingerprint, staleness, write_status  # noqa: E402

TINY = str(ROOT / "workloads" / "tiny-cpu.yaml")
TP2 = str(ROOT / "workloads" / "suffix-llama-3.1-70b-tp2.yaml")


def write(tmp_path: Path, catalogue: dict) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(catalogue, sort_keys=False))
    return path


def base(**deployment: object) -> dict:
    return {"store": "results", "deployments": [{"workload": TINY, "gpu_kind": "cpu", **deployment}]}


def test_a_catalogue_reads_its_deployments_with_defaults_and_the_workloads_own_facts(tmp_path) -> None:
    path = write(tmp_path, {"store": "out/fleet", "max_retries": 1,
                            "defaults": {"gpu_kind": "H200", "trials": 0, "max_widths": 12},
                            "deployments": [{"workload": TINY}, {"workload": TP2, "name": "suffix-70b",
                                                                 "gpu_kind": "H100", "trials": 50}]})
    cat = load_catalogue(path)
    assert cat.store == (tmp_path / "out" / "fleet").resolve() and cat.max_retries == 1 and cat.storage is None
    tiny, suffix = cat.deployments
    assert (tiny.name, tiny.gpu_kind, tiny.trials, tiny.max_widths, tiny.device) == ("tiny-cpu-H200", "H200", 0, 12,
                                                                                    "cuda")
    assert (suffix.name, suffix.gpu_kind, suffix.trials, suffix.tensor_parallel_size, suffix.num_gpus) == \
        ("suffix-70b", "H100", 50, 2, 2)
    assert tiny.workload_hash and tiny.workload_hash != suffix.workload_hash
    assert type(tiny).from_dict(tiny.as_dict()) == tiny  # what a Ray task is handed reads back the same


@pytest.mark.parametrize("catalogue, needle", [
    ({"deployments": [{"workload": TINY, "gpu_kind": "cpu"}]}, "store: missing"),
    ({"store": "r", "deployments": []}, "deployments: [] must be a non-empty list"),
    ({"store": "r", "deploy": [], "deployments": [{"workload": TINY, "gpu_kind": "cpu"}]}, "deploy: unknown field"),
    (base(gpu_kind="H 200"), "deployments[0].gpu_kind: 'H 200' must be a Ray accelerator type"),
    (base(backend="trt"), "deployments[0].backend: 'trt' must be one of auto, vllm, stand-in"),
    (base(trials=-1), "deployments[0].trials: -1 must be >= 0"),
    (base(sizes=[4, 0]), "deployments[0].sizes: [4, 0] must be a non-empty list of integers >= 1"),
    (base(sizes=[4], max_widths=3), "deployments[0].sizes: give sizes or max_widths, not both"),
    (base(maxwidths=3), "deployments[0].maxwidths: unknown field"),
    (base(workload="nowhere.yaml"), "deployments[0].workload: 'nowhere.yaml':"),
    (base(search_profile="nowhere.csv"), "deployments[0].search_profile: 'nowhere.csv' is not a file"),
    ({"store": "r", "deployments": [{"workload": TINY, "gpu_kind": "H200", "search_profile": TINY}]},
     "deployments[0].search_profile: '" + TINY + "': only a cpu deployment takes one"),
    ({"store": "r", "deployments": [{"workload": TINY, "gpu_kind": "cpu"}, {"workload": TINY, "gpu_kind": "cpu"}]},
     "deployments[1].name: 'tiny-cpu-cpu' is deployments[0]'s name too"),
    ({"store": "r", "storage": "runs/study.db", "deployments": [{"workload": TINY, "gpu_kind": "cpu"}]},
     "storage: 'runs/study.db' is not a storage URL"),
])
def test_a_bad_catalogue_field_is_one_line_naming_it_and_nothing_is_written(tmp_path, capsys, catalogue,
                                                                           needle) -> None:
    path = write(tmp_path, catalogue)
    with pytest.raises(CatalogueError) as caught:
        load_catalogue(path)
    assert str(caught.value).startswith(f"{path}: ") and needle in str(caught.value) and "\n" not in str(caught.value)
    code, out, err = run(capsys, "fleet", "run", path)
    assert code == 2 and out == "" and err.count("\n") == 1 and needle in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fleet.yaml"]  # no store made


def test_a_store_that_is_a_file_and_a_status_of_no_store_are_one_line(tmp_path, capsys) -> None:
    (tmp_path / "results").write_text("not a folder")
    code, _, err = run(capsys, "fleet", "run", write(tmp_path, base()))
    assert code == 2 and "store: 'results' exists and is not a directory" in err
    code, out, err = run(capsys, "fleet", "status", tmp_path)
    assert code == 2 and out == "" and "holds no index.json (not a results store of `cgtune fleet run`)" in err


def _node(**resources: float) -> dict:
    return {"Alive": True, "Resources": {"CPU": 16.0, **resources}}


def test_a_deployment_fits_only_a_node_of_its_kind_with_its_gpus_on_one_node(tmp_path) -> None:
    cat = load_catalogue(write(tmp_path, {"store": "r", "deployments": [
        {"workload": TINY, "gpu_kind": "H200"}, {"workload": TP2, "gpu_kind": "H100"},
        {"workload": TINY, "gpu_kind": "cpu"}]}))
    h200, h100_tp2, cpu = cat.deployments
    one_gpu_h100s = [_node(GPU=1, **{"accelerator_type:H100": 1}), _node(GPU=1, **{"accelerator_type:H100": 1})]
    # Two 1-GPU H100 nodes sum to 2 GPUs, but a tensor-parallel deployment runs on one node.
    assert unplaceable(h100_tp2, one_gpu_h100s) == ("gpu_kind H100: 2 GPUs asked (tensor_parallel_size 2), the "
                                                    "largest node of that kind has 1")
    assert unplaceable(h100_tp2, one_gpu_h100s + [_node(GPU=8, **{"accelerator_type:H100": 1})]) is None
    assert unplaceable(h200, one_gpu_h100s) == ("gpu_kind H200: no node of the cluster has it (resource "
                                                "accelerator_type:H200; the cluster has H100)")
    assert unplaceable(cpu, one_gpu_h100s) is None
    assert unplaceable(cpu, [{"Alive": True, "Resources": {"GPU": 1}}]) == "no node of the cluster has a CPU"


def test_a_result_is_current_only_when_done_under_the_same_fingerprint(tmp_path) -> None:
    [dep] = load_catalogue(write(tmp_path, base())).deployments
    node = {"backend": "stand-in", "cgtune_version": "0.1.0", "vllm_version": None}
    now = fingerprint(dep, node)
    assert staleness(None, now) == "no result yet"
    status = write_status(tmp_path, dep.name, "profiling", fingerprint=now, widths_done=2, widths_total=6)
    assert staleness(status, now) == "left 'profiling'"  # unfinished: resumed, not skipped
    status = write_status(tmp_path, dep.name, "done")
    assert staleness(status, now) is None
    assert staleness(status, {**now, "vllm_version": "0.33.0"}) == "vllm_version was None, now '0.33.0'"
    assert staleness(status, {**now, "gpu_kind": "H200"}) == "gpu_kind was 'cpu', now 'H200'"
    assert [m["state"] for m in status["history"]] == ["profiling", "done"]
    assert status["widths_done"] == 2  # kept from the move before


def test_the_index_carries_the_shipped_list_and_its_predicted_saving_as_json_and_as_a_table(tmp_path,
                                                                                          capsys) -> None:
    write_status(tmp_path, "a", "done", fingerprint={"gpu_kind": "H200"}, widths_done=6, widths_total=6)
    run_dir = tmp_path / "deployments" / "a" / "run"
    run_dir.mkdir(parents=True)
    # A hand-made summary.json holding only the keys the index reads: not a run's numbers.
    (run_dir / "summary.json").write_text(json.dumps({
        "shipped": {"list": "compact", "capture_sizes": [1, 2, 4, 8]},
        "tuned": {"expected_step_ms": 7.0}, "compact": {"expected_step_ms": 8.0},
        "default": {"expected_step_ms": 10.0}, "device_name": "fixture"}))
    write_status(tmp_path, "b", "failed", reason="gpu_kind H200: no node of the cluster has it")
    write_status(tmp_path, "c", "profiling", widths_done=3, widths_total=6)
    index = build_index(tmp_path, ["a", "b", "c"], {"a": "H200", "b": "H200", "c": "cpu"})
    (tmp_path / "index.json").write_text(json.dumps(index))
    a, b, _ = index["deployments"]
    assert a["shipped_sizes"] == [1, 2, 4, 8] and a["shipped_list"] == "compact"
    assert a["predicted_saving_share"] == pytest.approx(0.2) and a["predicted_saving_ms"] == pytest.approx(2.0)
    assert b["status"] == "failed" and b["shipped_sizes"] is None
    table = index_table(index).splitlines()
    assert table[1].split() == ["a", "H200", "done", "compact:", "1", "2", "4", "8", "+20.0%", "(10.000", "->",
                                "8.000", "ms)"]
    assert "failed: gpu_kind H200: no node of the cluster has it" in table[2]
    assert "profiling 3/6 widths" in table[3]
    code, out, _ = run(capsys, "fleet", "status", tmp_path, "--json")
    assert code == 0 and [e["status"] for e in json.loads(out)["deployments"]] == ["done", "failed", "profiling"]


def test_a_sweep_without_a_callback_is_followed_through_its_tables_metadata(tmp_path) -> None:
    from tuner.fleet.tasks import TableWatch

    seen: list[int] = []
    meta = tmp_path / "w.json"
    watch = TableWatch(meta, seen.append, interval_s=0.01)
    watch.look()  # no file yet: nothing
    meta.write_text(json.dumps({"widths_done": [1, 2]}))
    watch.look()
    watch.look()  # unchanged: no second call
    meta.write_text("{not json")
    watch.look()
    meta.write_text(json.dumps({"widths_done": [1, 2, 4]}))
    with watch:
        for _ in range(500):
            if seen[-1:] == [3]:
                break
            time.sleep(0.01)
    assert seen == [2, 3]


NODE = {"backend": "stand-in", "cgtune_version": "0.1.0", "vllm_version": None}


def _done_under(tmp_path: Path, catalogue: dict) -> tuple[object, dict]:
    """A deployment read from `catalogue` and its status written done under the fingerprint it has now."""
    [dep] = load_catalogue(write(tmp_path, catalogue)).deployments
    return dep, write_status(tmp_path / "store", dep.name, "done", fingerprint=fingerprint(dep, NODE))


@pytest.mark.parametrize("field, then, now", [
    ("backend", "auto", "stand-in"), ("max_widths", 8, 9), ("sizes", [4, 8], [4, 16]), ("warmup_ms", 5.0, 6.0),
    ("rep_ms", 20.0, 21.0), ("min_reps", 3, 4), ("compile", False, True), ("trials", 10, 0),
    ("validate_steps", 300, 0),
])
def test_a_result_made_under_other_deployment_settings_is_stale(tmp_path, field, then, now) -> None:
    # Issue 44 (4): a settings change the fingerprint ignores would skip the deployment and keep a profile and a list
    # made for the old settings. Each field of a deployment, changed alone, makes its stored result stale.
    dep, status = _done_under(tmp_path, base(**{field: then}))
    assert staleness(status, fingerprint(dep, NODE)) is None
    [changed] = load_catalogue(write(tmp_path, base(**{field: now}))).deployments
    assert getattr(changed, field) != getattr(dep, field)
    assert staleness(status, fingerprint(changed, NODE)).startswith("settings was "), field


def test_a_changed_serving_section_makes_the_result_stale_and_a_moved_identical_file_does_not(tmp_path) -> None:
    spec = yaml.safe_load(Path(TINY).read_text())
    first = tmp_path / "a" / "tiny.yaml"
    first.parent.mkdir()
    first.write_text(yaml.safe_dump(spec))
    dep, status = _done_under(tmp_path, base(workload=str(first)))
    moved = tmp_path / "b" / "tiny.yaml"  # the same workload elsewhere: the result is still its result
    moved.parent.mkdir()
    moved.write_text(first.read_text())
    [same] = load_catalogue(write(tmp_path, base(workload=str(moved)))).deployments
    assert staleness(status, fingerprint(same, NODE)) is None
    for key, value in (("max_num_seqs", 192), ("gpu_memory_utilization", 0.8), ("max_model_len", 256),
                       ("num_speculative_tokens", 1), ("max_num_batched_tokens", 2048)):
        edited = {**spec, "serving": {**spec["serving"], key: value}}
        moved.write_text(yaml.safe_dump(edited))
        [changed] = load_catalogue(write(tmp_path, base(workload=str(moved)))).deployments
        assert staleness(status, fingerprint(changed, NODE)).startswith("workload_hash was "), key


def test_a_search_profile_whose_content_changed_makes_the_result_stale(tmp_path) -> None:
    profile = tmp_path / "search.csv"
    profile.write_text("a fixture: its bytes are hashed, never read as a profile here\n")
    dep, status = _done_under(tmp_path, base(search_profile=str(profile)))
    profile.write_text("another fixture\n")
    [changed] = load_catalogue(write(tmp_path, base(search_profile=str(profile)))).deployments
    assert staleness(status, fingerprint(changed, NODE)).startswith("settings was ")


@pytest.mark.parametrize("key, value", [("backend", "vllm"), ("cgtune_version", "0.2.0"), ("vllm_version", "0.34.0")])
def test_what_a_node_answers_differently_makes_the_result_stale(tmp_path, key, value) -> None:
    dep, status = _done_under(tmp_path, base())
    assert staleness(status, fingerprint(dep, {**NODE, key: value})) == f"{key} was {NODE[key]!r}, now {value!r}"


def test_the_fingerprint_holds_every_key_the_currency_check_reads(tmp_path) -> None:
    from tuner.fleet.store import FINGERPRINT_KEYS

    dep, _ = _done_under(tmp_path, base())
    now = fingerprint(dep, NODE)
    assert set(now) == set(FINGERPRINT_KEYS)
    assert now["settings"] == dep.settings_hash() and now["workload_hash"] == dep.workload_hash
    # Every field of a deployment is either in the settings hash, or named by a fingerprint key of its own, or where it
    # lies (a moved file is the same result), or its name (another name is another deployment).
    from dataclasses import fields

    outside = {"name", "workload_path", "workload_hash", "gpu_kind", "tensor_parallel_size", "search_profile"}
    hashed = {f.name for f in fields(dep)} - outside
    assert hashed == {"backend", "max_widths", "sizes", "warmup_ms", "rep_ms", "min_reps", "compile", "trials",
                      "validate_steps"}
