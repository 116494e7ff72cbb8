"""One profile, three engines, end to end: `cgtune tune` on the shipped SGLang and TensorRT-LLM workloads writes the
engine's files (and no vLLM files) with the tuned list in requests, renders the report in the engine's unit under its
memory rule, and refuses in one line a list the engine would change or reject. Hand-made profiles: test fixtures,
never measurements."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ helpers (import-mode=importlib)
from handmade_profiles import shipped_profile, tune_quietly  # noqa: E402
from cli_runner import run  # noqa: E402

from tuner.model.costmodel import CostModel  # noqa: E402
from tuner.engines.trtllm import captured_batch_sizes, resolve_cuda_graph_config  # noqa: E402
from tuner.workload.spec import load_workload  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SGLANG = ROOT / "workloads/sglang-eagle-llama-3.1-8b.yaml"
TRTLLM = ROOT / "workloads/trtllm-eagle3-llama-3.1-8b.yaml"
VLLM_FILES = ("compilation_config.json", "vllm-serve.yaml", "vllm-flags.txt")


def profile_for(tmp_path: Path, workload_path: Path) -> Path:
    """A hand-made profile for a shipped Llama-3.1-8B workload: every multiple of q = 4 up to 1024 tokens (each decode
    batch of up to 256 requests) and mixed-step widths up to 8192."""
    return shipped_profile(tmp_path / "profiles", workload_path, sorted(set(range(4, 1025, 4)) | {2048, 4096, 8192}))


def tuned_run(tmp: Path, workload: Path) -> tuple[Path, Path]:
    """`cgtune tune` of a shipped engine workload on its hand-made profile: (run directory, profile)."""
    profile = profile_for(tmp, workload)
    out = tmp / "run"
    assert tune_quietly(workload, profile, out) == 0
    return out, profile


@pytest.fixture(scope="module")
def sglang_run(tmp_path_factory):
    return tuned_run(tmp_path_factory.mktemp("sglang"), SGLANG)


@pytest.fixture(scope="module")
def trtllm_run(tmp_path_factory):
    return tuned_run(tmp_path_factory.mktemp("trtllm"), TRTLLM)


def test_sglang_tune_writes_sglang_files_with_the_tuned_list_in_requests(sglang_run):
    out, profile = sglang_run
    assert not any((out / name).exists() for name in VLLM_FILES)
    summary = json.loads((out / "summary.json").read_text())
    tuned_widths = summary["capture_sizes"]
    assert all(w % 4 == 0 for w in tuned_widths)  # SGLang graphs hold bs x 4 tokens: only multiples of q
    tuned = [w // 4 for w in tuned_widths]
    assert summary["engine"]["batch_sizes"] == tuned == summary["tuned"]["batch_sizes"]
    # The flag line and the JSON parse back to the tuned list, with the request pool pinned (unset, EAGLE would set
    # max_running_requests to 48 and cut the list there) and never the removed --cuda-graph-bs / --cuda-graph-max-bs.
    # (tests/commands/test_engine_files_cli.py parses it with SGLang's own parser.)
    flags = (out / "sglang-flags.txt").read_text()
    line = [ln for ln in flags.splitlines() if ln and not ln.startswith("#")]
    assert len(line) == 1
    argv = dict(zip(*[iter(shlex.split(line[0]))] * 2))
    assert argv["--max-running-requests"] == "128"
    assert json.loads(argv["--cuda-graph-config"]) == {"decode": {"bs": tuned}}
    assert "--cuda-graph-bs " not in flags and "--cuda-graph-max-bs" not in flags
    assert json.loads((out / "sglang-cuda-graph-config.json").read_text()) == {"decode": {"bs": tuned}}
    assert max(tuned) <= 128


def test_sglang_tuned_is_never_worse_than_sglangs_default_under_the_cost_model(sglang_run):
    out, profile = sglang_run
    summary = json.loads((out / "summary.json").read_text())
    model = CostModel.from_files(profile, load_workload(SGLANG))
    tuned, default = model.evaluate(summary["capture_sizes"]), model.evaluate(model.default_sizes)
    assert tuned.feasible and tuned.expected_step_ms <= default.expected_step_ms
    assert summary["tuned"]["expected_step_ms"] == tuned.expected_step_ms
    # SGLang's own default for this workload: the speculative grid up to max_running_requests 128, in requests.
    assert summary["default"]["batch_sizes"] == [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4),
                                                 *range(72, 129, 8)]
    # The automatic mem_fraction_static by hand (SGLang 0.5.23 memory_hook.py): 512 + 1.5 x 8192 (chunked prefill)
    # + 1024 x tp/8 + 2 x 128 (decode max_bs) + 8 x 58 (prefill graph buckets up to 8192) = 13648 MiB reserved on a
    # 143771-MiB device: round(130123 / 143771, 3) = 0.905, the same for both lists (both end at 128 requests).
    assert summary["engine"]["mem_fraction_static_used"] == summary["engine"]["mem_fraction_static_default_list"]
    assert summary["engine"]["mem_fraction_static_used"] == 0.905
    # vLLM's estimate, log lines and gpu_memory_utilization do not exist for SGLang.
    for key in ("vllm_log_lines", "gpu_memory_utilization", "gpu_memory_utilization_to_keep_default_kv",
                "estimate_budget_bytes"):
        assert key not in summary
    assert summary["tuned"]["vllm_graph_estimate_bytes"] is None and summary["engine"]["name"] == "sglang"


def test_sglang_report_is_in_requests_under_sglangs_memory_rule(sglang_run):
    out, _ = sglang_run
    report = (out / "report.md").read_text()
    assert "- engine: SGLang 0.5.23" in report
    assert "KV cache, as SGLang sizes it: BEFORE capturing" in report and "0.905 for the default list's max" in report
    assert "only max(bs) moves it" in report
    assert "## What changed against SGLang's default" in report
    assert "| SGLang default | 35 | 128 | 512 | same |" in report
    assert "- SGLang default: requests 1, 2, 3, 4, 5, 6, 7, 8, 10, 12" in report
    assert "(tokens 4, 8, 12, 16, 20, 24, 28, 32, 40, 48" in report
    for vllm_only in ("vLLM estimate", "Estimated CUDA graph memory", "gpu_memory_utilization", "vllm serve",
                      "compilation_config.json"):
        assert vllm_only not in report
    assert "`sglang-flags.txt`" in report
    assert all((out / "plots" / p).is_file() for p in ("step_widths.png", "pareto.png"))
    # SGLang's own names for its fields, in the header and the off-peak paragraph (issue 29: "max_num_seqs 128")
    assert "max_running_requests 128, context_length" in report and "max_num_seqs" not in report


def test_an_engines_latency_plot_names_its_own_default(sglang_run):
    import matplotlib.pyplot as plt

    from tuner.report.plots import _plot_latency

    out, profile = sglang_run
    model = CostModel.from_files(profile, load_workload(SGLANG))
    fig = _plot_latency(model, (4, 8), (4, 8, 512), "measured", "", plt)
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    plt.close(fig)
    assert "SGLang default max (512)" in labels and not any("vLLM" in label for label in labels)


def test_trtllm_tune_writes_the_extra_options_yaml_that_trtllm_keeps(trtllm_run):
    out, profile = trtllm_run
    assert not any((out / name).exists() for name in VLLM_FILES)
    summary = json.loads((out / "summary.json").read_text())
    tuned = [w // 4 for w in summary["shipped"]["capture_sizes"]]  # the list the files carry
    text = (out / "trtllm-extra-llm-api-options.yaml").read_text()
    # TensorRT-LLM refuses Eagle3 without its drafter: a value it refuses stands there, and a comment says what it is.
    assert "# speculative_config.speculative_model: <Eagle3 DRAFT CHECKPOINT: set speculative.model" in text
    options = yaml.safe_load(text)
    graph = options["cuda_graph_config"]
    assert graph == {"enable_padding": True, "batch_sizes": tuned}  # never a max_batch_size beside the list
    assert options["max_batch_size"] == 256 and options["max_num_tokens"] == 8192
    assert options["max_seq_len"] == 8192 and options["tensor_parallel_size"] == 1
    assert options["speculative_config"] == {
        "decoding_type": "Eagle3", "max_draft_len": 3,
        "speculative_model": "<Eagle3 DRAFT CHECKPOINT: set speculative.model in the workload, or put its Hugging "
                             "Face id or path here>"}
    assert options["kv_cache_config"] == {"free_gpu_memory_fraction": 0.9}
    # TensorRT-LLM's validator and engine filter keep it unchanged.
    assert resolve_cuda_graph_config(tuned, 0, enable_padding=True) == (tuned, max(tuned))
    assert captured_batch_sizes(tuned, max_batch_size=256, max_num_tokens=8192, max_total_draft_tokens=3,
                                enable_padding=True) == tuned


def test_trtllm_tuned_beats_the_128_default_and_pays_kv_at_the_fraction(trtllm_run):
    out, profile = trtllm_run
    summary = json.loads((out / "summary.json").read_text())
    model = CostModel.from_files(profile, load_workload(TRTLLM))
    tuned, default = model.evaluate(summary["capture_sizes"]), model.evaluate(model.default_sizes)
    assert tuned.feasible and tuned.expected_step_ms <= default.expected_step_ms
    # TensorRT-LLM's padded default stops at 128 requests whatever max_batch_size says; this workload's decode steps
    # reach 256, and each graph saves 4 ms, so the tuned list goes past 128.
    assert summary["default"]["batch_sizes"] == [1, 2, 4, *range(8, 129, 8)]
    assert max(summary["engine"]["batch_sizes"]) == 256
    # Graphs are captured before the KV cache is sized: each byte of graph memory costs 0.9 byte of KV cache.
    extra_pool = tuned.graph_memory_bytes - default.graph_memory_bytes
    assert default.kv_available_bytes - tuned.kv_available_bytes == pytest.approx(0.9 * extra_pool, abs=2)
    report = (out / "report.md").read_text()
    assert "its graphs are captured BEFORE the KV cache is sized" in report
    assert "free_gpu_memory_fraction 0.9 x" in report
    assert "## What changed against TensorRT-LLM's default" in report
    assert "| batch size (requests) | width (tokens) |" in report and "| 256 | 1024 |" in report
    assert "vLLM estimate" not in report and "Estimated CUDA graph memory" not in report


def test_report_rerender_removes_other_engines_files_beside_its_own(sglang_run, capsys):
    out, _ = sglang_run
    # As an earlier run of another engine (or an older cgtune) would have left them: they describe no list of this run.
    (out / "vllm-flags.txt").write_text("--compilation-config '{}'\n")
    (out / "trtllm-extra-llm-api-options.yaml").write_text("cuda_graph_config: {batch_sizes: [1]}\n")
    code, printed, err = run(capsys, "report", out)
    assert code == 0, err
    assert not (out / "vllm-flags.txt").exists() and not (out / "trtllm-extra-llm-api-options.yaml").exists()
    assert (out / "sglang-flags.txt").is_file() and (out / "sglang-cuda-graph-config.json").is_file()
    assert "SGLang files" in printed and "max 128 requests" in printed


@pytest.mark.parametrize(
    ("engine", "edit_requests", "needle"),
    [("sglang", 132, "cuda_graph_bs_decode: 132 > request pool 128 (max_running_requests=128 / attn_dp_size=1); "
                     "SGLang would drop it and capture 128"),
     ("trtllm", 300, "cuda_graph_config.batch_sizes: 300 > 256 = min(max_batch_size=256, max_num_tokens=8192 // 4); "
                     "TensorRT-LLM would capture")],
)
def test_a_list_the_engine_would_change_is_refused_in_one_line(request, capsys, engine, edit_requests, needle):
    out, _ = request.getfixturevalue(f"{engine}_run")
    data = json.loads((out / "search.json").read_text())
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != "search.json"}
    data["chosen"] = sorted(set(data["chosen"]) | {edit_requests * 4})  # a hand-edited tuned list
    (out / "search.json").write_text(json.dumps(data))
    code, printed, err = run(capsys, "report", out)
    assert code == 2 and printed == ""
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err
    # Nothing half-written: every other file is as it was.
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != "search.json"} == before
    data["chosen"].remove(edit_requests * 4)
    (out / "search.json").write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("speculative", "serving", "needle"),
    [({"method": "dflash", "drafter": {"num_layers": 5}}, {"max_draft_len": 16},
      "speculative.method: 'dflash' has no TensorRT-LLM decoding_type"),
     (None, {"max_draft_len": 3}, "serving.max_draft_len: 3 needs speculative.method with engine trtllm")],
)
def test_trtllm_workload_without_a_decoding_type_is_one_line(tmp_path, capsys, speculative, serving, needle):
    spec = {"name": "t", "engine": "trtllm", "model": {"preset": "tiny"},
            "serving": {"max_batch_size": 8, "max_num_tokens": 256, **serving},
            "traffic": {"requests": {"kind": "uniform", "min": 1, "max": 8}}}
    if speculative:
        spec["speculative"] = speculative
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(spec))
    code, printed, err = run(capsys, "defaults", path)
    assert code == 2 and printed == "" and err.count("\n") == 1 and needle in err


@pytest.mark.parametrize("which", ["sglang", "trtllm"])
def test_engine_reports_show_the_compact_list_on_the_real_pool_and_the_interval(which, request):
    out, profile = request.getfixturevalue(f"{which}_run")
    summary = json.loads((out / "summary.json").read_text())
    model = CostModel.from_files(profile, load_workload(SGLANG if which == "sglang" else TRTLLM))
    # The engine's rule counts the real pool (it makes no estimate): the compact list is the least real pool within
    # 1% of the fastest, in requests like every list of an engine workload.
    assert summary["compact_choice"]["memory_counted"] == "graph_memory_bytes"
    compact = model.evaluate(summary["compact"]["capture_sizes"])
    assert compact.feasible and compact.expected_step_ms <= summary["compact_choice"]["fastest_ms"] * 1.01 + 1e-12
    assert compact.graph_memory_bytes <= summary["tuned"]["graph_memory_bytes"]
    assert summary["compact"]["batch_sizes"] == [w // 4 for w in summary["compact"]["capture_sizes"]]
    assert summary["saving_interval_ms"] == [summary["saving_interval"]["point_ms"]] * 2  # no spread in the fixture
    report = (out / "report.md").read_text()
    assert "Compact list (the least real pool whose expected step is within 1.0% of the fastest" in report
    assert "How sure: the tuned list saves" in report and "vLLM estimate" not in report
