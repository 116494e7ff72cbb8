"""Report: the comparison lists, summary.json figures and the rendered files of a run directory."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/handmade_profiles.py (import-mode=importlib)
from handmade_profiles import MIB, handmade_profile, handmade_workload  # noqa: E402

from tuner.model import CostModel  # noqa: E402
from tuner.report import PLOTS, SUMMARY_KEYS, comparison, load_run, sglang_sizes, summary, widest_sizes  # noqa: E402
from tuner.report import write_run  # noqa: E402
from tuner.search import SearchConfig, run_search  # noqa: E402
from tuner.workload import load_workload  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_widest_list_covers_the_widest_decode_batch_like_pr_50488():
    serving = load_workload(ROOT / "workloads/dflash-llama-3.1-8b.yaml").serving  # 128 seqs x q 17
    sizes = widest_sizes(serving)
    assert sizes[-1] == 2176 and 128 * 17 in sizes
    assert set(serving.defaults().sizes) <= set(sizes)


def test_sglang_style_list_is_its_batch_grid_times_q():
    serving = load_workload(ROOT / "workloads/dflash-llama-3.1-8b.yaml").serving
    sizes = sglang_sizes(serving)
    assert sizes[:6] == (17, 34, 68, 136, 204, 272)  # batch sizes 1, 2, 4, 8, 12, 16
    assert sizes[-1] == 128 * 17


def test_summary_holds_the_issue_keys_and_files_render(tmp_path):
    wl = handmade_workload(num_speculative_tokens=1, max_num_seqs=12, max_num_batched_tokens=32)
    path = handmade_profile(tmp_path / "p", wl, list(range(1, 33)), standalone_bytes=lambda w: 2 * w * MIB)
    model = CostModel.from_files(path, wl)
    result = run_search(model, SearchConfig(n_trials=8, progress=False), run_dir=tmp_path / "run")
    table = comparison(model, result)
    data = summary(model, result, table)
    for key in SUMMARY_KEYS:
        assert data[key]["expected_step_ms"] == table[key].expected_step_ms
        assert data[key]["graph_memory_bytes"] == table[key].graph_memory_bytes
        assert data[key]["kv_available_bytes"] == table[key].kv_available_bytes
        assert data[key]["feasible"] == table[key].feasible
    assert data["required_kv_bytes"] == model.budget.required_kv_bytes
    assert data["capture_sizes"] == list(result.chosen.capture_sizes)
    assert table["ideal"].expected_step_ms <= table["tuned"].expected_step_ms

    written = write_run(tmp_path / "run", model, result, command="pytest")
    names = {p.relative_to(tmp_path / "run").as_posix() for p in written}
    assert {"report.md", "summary.json", "compilation_config.json", "vllm-serve.yaml", "vllm-flags.txt"} <= names
    assert {f"plots/{p}" for p in PLOTS} <= names
    assert json.loads((tmp_path / "run/summary.json").read_text())["capture_sizes"] == data["capture_sizes"]
    report = (tmp_path / "run/report.md").read_text()
    assert "handmade test fixture" in report  # the device the figures come from is named

    again_model, again = load_run(tmp_path / "run")
    assert again.chosen == result.chosen and again.exact.best == result.exact.best
