"""Report: the comparison lists, summary.json figures, the rendered markdown (checked against the cost model and by
hand) and the files of a run directory."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/handmade_profiles.py (import-mode=importlib)
from handmade_profiles import (  # noqa: E402
    MIB,
    handmade_profile,
    handmade_spec,
    handmade_workload,
    mixed_traffic,
    write_handmade_inputs,
)

from tuner.decision import compare  # noqa: E402
from tuner.decision.compare import sglang_sizes, widest_sizes  # noqa: E402
from tuner.decision.record import decide  # noqa: E402
from tuner.decision.run_dir import load_run  # noqa: E402
from tuner.search.compact import CompactChoice  # noqa: E402
from tuner.search.exact import ExactResult, exact_solve  # noqa: E402
from tuner.model.costmodel import GIB, CostModel  # noqa: E402
from tuner.engines.registry import engine_of  # noqa: E402
from tuner.report.run import PLOTS, SUMMARY_KEYS, summary  # noqa: E402
from tuner.report.run import log_axis, profile_provenance, render_markdown, write_run  # noqa: E402
from tuner.search.study import SearchConfig, SearchResult, run_search  # noqa: E402
from tuner.workload.spec import load_workload, parse_workload  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_widest_list_covers_the_widest_decode_batch_like_pr_50488():
    serving = load_workload(ROOT / "workloads/dflash-llama-3.1-8b.yaml").serving  # 128 seqs x q 17
    sizes = widest_sizes(serving)
    assert sizes[-1] == 2176 and 128 * 17 in sizes
    assert set(engine_of(serving).defaults().sizes) <= set(sizes)


def test_sglang_row_is_sglangs_own_default_for_the_same_config():
    serving = load_workload(ROOT / "workloads/dflash-llama-3.1-8b.yaml").serving  # 128 seqs x q 17
    # SGLang 0.5.23 with --max-running-requests 128 and speculative decoding (17 draft tokens): max_bs 256 on a
    # 143771-MiB GPU, capped at 128, and its SPECULATIVE grid 1..8, 10..32 step 2, 40..64 step 4, 72..128 step 8.
    expected = [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 129, 8)]
    assert sglang_sizes(serving, gpu_memory_mib=143771) == tuple(b * 17 for b in expected)
    # An unknown GPU gives SGLang's max_bs 160, also capped at 128: the same list.
    assert sglang_sizes(serving) == sglang_sizes(serving, gpu_memory_mib=143771)
    # A 24-GiB GPU: max_bs 48 (tp 1), so batches of 49..128 requests get no graph; 48 ends the list.
    small = sglang_sizes(serving, gpu_memory_mib=24 * 1024)
    assert small[-1] == 48 * 17 and len(small) == 8 + 12 + 3  # 1..8, 10..32 step 2, 40, 44, 48
    # Without speculation SGLang's plain grid: 1, 2, 4, 8, 12, 16, 24, ... (q = 1).
    plain = load_workload(ROOT / "workloads/baseline-llama-3.1-8b.yaml").serving
    assert sglang_sizes(plain, gpu_memory_mib=143771)[:7] == (1, 2, 4, 8, 12, 16, 24)
    # They live with the decision (tuner.decision.compare), which the report renders; the row reads the device.
    assert compare.PEER_LISTS["sglang"] is compare.sglang_default_sizes


def test_summary_holds_the_issue_keys_and_files_render(tmp_path):
    wl = handmade_workload(num_speculative_tokens=1, max_num_seqs=12, max_num_batched_tokens=32)
    path = handmade_profile(tmp_path / "p", wl, list(range(1, 33)), standalone_bytes=lambda w: 2 * w * MIB)
    model = CostModel.from_files(path, wl)
    result = run_search(model, SearchConfig(n_trials=8, progress=False), run_dir=tmp_path / "run")
    dec = decide(model, result)
    table = dec.table
    data = summary(model, dec)
    for key in SUMMARY_KEYS:
        e = table[key]
        assert data[key]["expected_step_ms"] == e.expected_step_ms
        assert data[key]["graph_memory_bytes"] == e.graph_memory_bytes
        assert data[key]["vllm_graph_estimate_bytes"] == e.graph_estimate_bytes
        assert data[key]["kv_available_bytes"] == e.kv_available_bytes
        # vLLM's whole blocks: 16 tokens x the tiny float32 model's 512 KV bytes per token; a 64-token request
        # takes 4 of them.
        blocks = max(0, e.kv_available_bytes) // (16 * 2 * 2 * 2 * 16 * 4)
        assert data[key]["max_concurrency"] == blocks / 4
        assert data[key]["kv_tokens"] == int(blocks / 4 * 64)
        assert data[key]["capture_headroom_bytes"] == e.capture_headroom_bytes
        assert data[key]["runs_as"] == list(e.runs_as)
        assert data[key]["feasible"] == e.feasible == (e.starts and e.capture_fits)
    # Hand-made budget: 1000 MiB x 0.9 requested; no non_kv_cache_bytes, so weights 100 + activations 50 MiB.
    assert data["requested_bytes"] == 900 * MIB and data["non_kv_cache_bytes"] == 150 * MIB
    assert data["model_runner"] == "v2" and data["model_runner_requested"] == "auto"
    assert data["noisy_widths"]["count"] == 0 and data["noisy_widths"]["share"] == 0.0
    assert data["cost_model"] == {"allow_mismatch": False, "allow_outliers": False, "off_peak_weight": 0.0,
                                  "piecewise_fallback": "eager", "load_steps": None}
    assert data["outliers"] == []
    assert data["required_kv_bytes"] == model.budget.required_kv_bytes
    assert data["capture_sizes"] == list(result.chosen.capture_sizes)
    assert table["ideal"].expected_step_ms <= table["tuned"].expected_step_ms

    written = write_run(tmp_path / "run", model, dec, command="pytest")
    names = {p.relative_to(tmp_path / "run").as_posix() for p in written}
    assert {"report.md", "summary.json", "compilation_config.json", "vllm-serve.yaml", "vllm-flags.txt"} <= names
    assert {f"plots/{p}" for p in PLOTS} <= names
    assert json.loads((tmp_path / "run/summary.json").read_text())["capture_sizes"] == data["capture_sizes"]
    report = (tmp_path / "run/report.md").read_text()
    assert "handmade test fixture" in report  # the device the figures come from is named

    again_model, again = load_run(tmp_path / "run")
    assert again.chosen == result.chosen and again.exact.best == result.exact.best


# ---------------------------------------------------------------------------------------------- vLLM's memory rule
# Hand-made profiles below are test fixtures, never measurements. Lists marked "hand-picked" are not search results:
# they stand in for a search's answer so the rendered figures can be checked against the cost model and by hand.
CEILING = handmade_spec(name="ceiling", max_num_seqs=32, num_speculative_tokens=16, max_num_batched_tokens=1024,
                        traffic=mixed_traffic(32, 1024, 0.1))
"""q = 17: the widest decode batch (32 x 17 = 544) is above vLLM's 512 ceiling."""
PEAK = handmade_spec(name="peak", max_num_seqs=32, max_num_batched_tokens=32,
                     traffic={"requests": {"kind": "uniform", "min": 28, "max": 32}})
"""q = 1, traffic only 28..32-request decode steps: small widths matter only off-peak."""
TINY_KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 16 * 4
"""K and V x 2 layers x 2 KV heads x head_dim 16 x 4 bytes (float32): the `tiny` preset."""


def _model(folder: Path, spec: dict, widths: list[int], **profile) -> CostModel:
    folder.mkdir(parents=True, exist_ok=True)
    _, path, workload = write_handmade_inputs(folder, spec, widths, **profile)
    return CostModel.from_files(path, workload)


@pytest.fixture()
def ceiling(tmp_path):
    widths = sorted(set(parse_workload(CEILING).engine.defaults().sizes) | {527, 544, 768, 1024})
    return _model(tmp_path, CEILING, widths, total_memory_bytes=1000 * MIB,
                  standalone_bytes=lambda w: w * MIB // 8, delta_bytes=lambda w: MIB + w * MIB // 64)


@pytest.fixture()
def peak(tmp_path):
    return _model(tmp_path, PEAK, list(range(1, 33)), total_memory_bytes=181 * MIB,
                  standalone_bytes=lambda w: 2 * MIB, delta_bytes=lambda w: 2 * MIB)


def hand_picked(model: CostModel, sizes) -> SearchResult:
    """A SearchResult around a hand-picked tuned list (no search ran)."""
    chosen, default = model.evaluate(sizes), model.evaluate(model.default_sizes)
    exact = ExactResult(chosen, [default, chosen], MIB, True, len(model.candidates))
    return SearchResult(chosen, "exact", exact, None, default, "none", "none", "latency", {}, [], list(model.notes))


def render(model: CostModel, search: SearchResult) -> tuple[str, dict]:
    dec = decide(model, search)
    return render_markdown(model, dec), summary(model, dec)


def test_what_changed_rows_are_each_added_width_with_and_without_it(ceiling):
    model = ceiling
    default = model.default_sizes
    assert default[-1] == 512 and 2 in default
    tuned = sorted((set(default) - {2}) | {527, 544})  # hand-picked
    md, data = render(model, hand_picked(model, tuned))
    t = model.evaluate(tuned)
    assert data["what_changed"]["added"] == [527, 544] and data["what_changed"]["removed"] == [2]
    assert "- added (2): 527, 544" in md and "- removed (1): 2" in md
    rows = {r["num_tokens"]: r for r in data["what_changed"]["above_default_max"]}
    for w in (527, 544):
        without = model.evaluate(set(tuned) - {w})
        est = t.graph_estimate_bytes - without.graph_estimate_bytes
        real = t.graph_memory_bytes - without.graph_memory_bytes
        saved = without.expected_step_ms - t.expected_step_ms
        assert rows[w] == {"key": w, "num_tokens": w, "vllm_graph_estimate_bytes": est, "graph_memory_bytes": real,
                           "saved_ms": saved}
        share = saved / t.expected_step_ms
        row = f"| {w} | {est / MIB:+.2f} | {real / MIB:+.2f} | {saved:+.4f} | {share:+.2%} |"
        # A row each for the widths that save at least 0.1% of the step (544: 0.39%); 527 (0.01%) is summed below.
        assert (row in md) == (share >= 0.001) == (w == 544)
    r = rows[527]
    assert (f"| 1 more, each saving less than 0.1% (527), row by row summed "
            f"| {r['vllm_graph_estimate_bytes'] / MIB:+.2f} | {r['graph_memory_bytes'] / MIB:+.2f} "
            f"| {r['saved_ms']:+.4f} | |") in md
    # By hand (eager 1 + 0.01 w, FULL 0.5 + 0.01 w ms; no piecewise rows, so a mixed step under a graph costs the
    # eager step at the padded width). 512 already rounds up to the 527-token FULL decode graph (31 x 17), so 527
    # adds only a PIECEWISE graph: mixed steps of 513..527 tokens (0.1 / 1024 each) pad to 527, not 544 (0.17 ms).
    assert rows[527]["saved_ms"] == pytest.approx(0.1 / 1024 * 15 * 0.17)
    # 544: without it a 32-request decode step runs eager (0.5 ms more); mixed steps of 528..544 tokens run eager at
    # their own width instead of padded to 544 (0.01 x (544 - w) less each).
    assert rows[544]["saved_ms"] == pytest.approx(0.9 / 32 * 0.5 - 0.1 / 1024 * 0.01 * sum(range(17)))
    assert rows[544]["vllm_graph_estimate_bytes"] > rows[544]["graph_memory_bytes"] > 0  # V2 extrapolates FULL graphs


def test_predicted_vllm_log_lines_kv_tokens_and_utilization(ceiling):
    model = ceiling
    tuned = sorted(set(model.default_sizes) | {544})  # hand-picked
    search = hand_picked(model, tuned)
    search.ship = "fastest"  # the log lines are the shipped list's: here the hand-picked one
    md, data = render(model, search)
    t, d = model.evaluate(tuned), model.evaluate(model.default_sizes)
    assert data["vllm_log_lines_list"] == "tuned" and data["shipped"]["list"] == "fastest"
    assert model.kv_bytes_per_token == TINY_KV_BYTES_PER_TOKEN
    b = model.budget
    assert b.requested_bytes == 900 * MIB and b.non_kv_cache_bytes == 150 * MIB  # 0.9 x 1000; weights + activations
    assert t.kv_available_bytes == 750 * MIB - t.graph_estimate_bytes
    blocks = t.kv_available_bytes // (16 * TINY_KV_BYTES_PER_TOKEN)  # vLLM's whole blocks; 4 per 64-token request
    tokens = int(blocks / 4 * 64)
    assert data["tuned"]["kv_tokens"] == tokens and data["tuned"]["max_concurrency"] == blocks / 4
    # vLLM 0.33's lines for V2 through its own format strings (tuner.engines.vllm.log_lines, held to the wheel by
    # tests/vllm/test_startup_log.py), the numbers by hand: format_gib is str(round(GiB, 2)); V2 logs its estimate only
    # in the hint (util - estimate / total, 4 decimals) and in the pool line after the capture; the KV size and the
    # concurrency are one line.
    est, pool = t.profiled_estimate_bytes, t.graph_memory_bytes
    assert est == t.graph_estimate_bytes > pool > 0
    delta = est / (1000 * MIB)
    log = "\n".join([
        "```",
        f"Available KV cache memory: {round(t.kv_available_bytes / GIB, 2)} GiB",
        f"CUDA graph memory profiling is enabled (default since v0.21.0). The current --gpu-memory-utilization=0.9000 "
        f"is equivalent to --gpu-memory-utilization={0.9 - delta:.4f} without CUDA graph memory profiling. To maintain "
        f"the same effective KV cache size as before, increase --gpu-memory-utilization to {min(0.9 + delta, 1):.4f}. "
        f"To disable, set VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0.",
        f"GPU KV cache size: {tokens:,} tokens, Maximum concurrency for 64 tokens per request: {tokens / 64:.2f}x",
        f"CUDA graph pool memory: {round(pool / GIB, 2)} GiB (actual), {round(est / GIB, 2)} GiB (estimated), "
        f"difference: {round((est - pool) / GIB, 2)} GiB ({100 * (est - pool) / pool:.1f}%).",
        "```",
    ])
    assert log in md and data["vllm_log_lines"] == log.splitlines()[1:-1]
    assert "Estimated CUDA graph memory" not in md  # V1's line: V2 logs it at DEBUG
    # The utilization that gives the tuned list the default's KV cache: (KV + non-KV + estimate) / total, rounded up.
    u = math.ceil((d.kv_available_bytes + 150 * MIB + t.graph_estimate_bytes) / (1000 * MIB) * 10_000) / 10_000
    assert u > 0.9 and data["gpu_memory_utilization_to_keep_default_kv"] == u
    assert f"gpu_memory_utilization **{u:.4f}** (now 0.9)" in md
    # Side by side: estimate and real pool next to each other, KV in MiB (a 1000 MiB fixture), tokens, concurrency.
    row = (f"| tuned | {len(tuned)} | 544 | same | {t.expected_step_ms:.4f} | {t.per_token_ms:.5f} "
           f"| {t.graph_estimate_bytes / MIB:.3f} | {t.graph_memory_bytes / MIB:.3f} "
           f"| {t.kv_available_bytes / MIB:.3f} "
           f"| {tokens:,} | {tokens / 64:.2f} | {t.kv_margin_bytes / MIB:.3f} | {t.capture_headroom_bytes / MIB:.3f} "
           f"| {0.01 * len(model.graphs(tuned)):.1f} | yes |")  # capture: the fixture's 0.01 s per graph
    assert row in md


def test_off_peak_figures_and_the_warning_when_the_tuned_list_is_slower(peak):
    model = peak
    assert model.default_sizes == (1, 2, 4, 8, 16, 24, 32)
    md, data = render(model, hand_picked(model, (28, 30, 32)))
    # Off-peak: 1..32 requests of one token each, uniform. Tuned: 1..28 pad to 28, 29-30 to 30, 31-32 to 32, FULL
    # graphs at 0.5 + 0.01 w ms. Default: 1, 2, 3-4 -> 4, 5-8 -> 8, 9-16 -> 16, 17-24 -> 24, 25-32 -> 32.
    tuned = (28 * 0.78 + 2 * 0.80 + 2 * 0.82) / 32
    default = (0.51 + 0.52 + 2 * 0.54 + 4 * 0.58 + 8 * 0.66 + 8 * 0.74 + 8 * 0.82) / 32
    assert data["off_peak"]["tuned_step_ms"] == pytest.approx(tuned)
    assert data["off_peak"]["default_step_ms"] == pytest.approx(default)
    assert data["off_peak"]["tuned_slower"] is True
    assert (f"the expected step is {tuned:.4f} ms with the tuned list vs {default:.4f} ms with vLLM's default "
            f"({tuned / default - 1:+.1%})") in md
    assert ("**Warning: the tuned list is slower than vLLM's default off-peak.** A one-request decode step (1 token) "
            "replays the 28-token graph under the tuned list and replays the 1-token graph under the default.") in md

    md, data = render(model, hand_picked(model, (1, 2, 4, 8, 16, 24, 32)))  # the default itself: no warning
    assert data["off_peak"]["tuned_slower"] is False and "Warning" not in md


def test_off_peak_weight_changes_the_optimum_where_small_widths_matter_off_peak(peak):
    path = peak.profile.path
    # The estimate budget leaves room for three sizes (4 MiB each: a PIECEWISE and a FULL graph of 2 MiB).
    quiet = exact_solve(peak).best
    mixed = exact_solve(CostModel.from_files(path, peak.workload, off_peak_weight=0.5)).best
    assert quiet.capture_sizes == (28, 30, 32)
    assert mixed.capture_sizes != quiet.capture_sizes and mixed.capture_sizes[0] < 28
    assert peak.off_peak_step_ms(mixed.capture_sizes) < peak.off_peak_step_ms(quiet.capture_sizes)


def test_a_list_the_v1_runner_rewrites_is_shown_beside_the_list_that_runs(tmp_path):
    spec = handmade_spec(name="suffix-hand", max_num_seqs=16, num_speculative_tokens=2, max_num_batched_tokens=64)
    spec["speculative"] = {"method": "suffix"}  # vLLM 0.33 runs suffix decoding on the V1 runner
    model = _model(tmp_path, spec, list(range(1, 65)), total_memory_bytes=1000 * MIB)
    assert model.runner == "v1"
    tuned = (1, 2, 4, 8, 16, 24)  # hand-picked; V1 rounds every size up to a multiple of q = 3, above 24 dropped
    md, data = render(model, hand_picked(model, tuned))
    runs = model.evaluate(tuned).runs_as
    assert runs == (3, 6, 9, 18, 24)
    assert "**It runs as a different list**: the V1 runner rewrites" in md and f"vLLM captures `{list(runs)}`" in md
    assert data["tuned"]["runs_as"] == list(runs) and data["runs_as"] == list(runs)
    assert data["model_runner"] == "v1" and data["model_runner_requested"] == "auto"
    assert "model runner **V1** (V1: vLLM 0.33 has no V2 support for speculative method 'suffix')" in md
    assert "| tuned | 6 | 24 | 5 graphs, max 24 |" in md
    # What changed compares the lists that run: V1 rewrites the default too (its 14 sizes up to 64 run as 10).
    assert model.evaluate(model.default_sizes).runs_as == (3, 6, 9, 12, 18, 24, 33, 42, 48, 57)
    assert data["what_changed"]["added"] == [] and data["what_changed"]["removed"] == [12, 33, 42, 48, 57]
    assert "Compared as the V1 runner captures the lists" in md
    assert "- tuned: 1, 2, 4, 8, 16, 24 (runs as 3, 6, 9, 18, 24)" in md


def test_v1_logs_its_estimate_on_its_own_line_and_the_estimate_off_logs_a_warning(tmp_path):
    # vLLM 0.33: the V1 runner logs "Estimated CUDA graph memory: X GiB total" (%.2f) before the KV line; with
    # VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0 it subtracts nothing and warns (util + estimate / total, 4 decimals).
    spec = handmade_spec(name="v1-hand", max_num_seqs=16, num_speculative_tokens=2, max_num_batched_tokens=64)
    spec["speculative"] = {"method": "suffix"}
    model = _model(tmp_path / "v1", spec, list(range(1, 65)), total_memory_bytes=1000 * MIB)
    t = model.evaluate((3, 6, 9, 18, 24))
    lines = render(model, hand_picked(model, t.capture_sizes))[1]["vllm_log_lines"]
    assert model.runner == "v1" and t.profiled_estimate_bytes > 0
    assert lines[0] == f"Estimated CUDA graph memory: {t.profiled_estimate_bytes / GIB:.2f} GiB total"
    assert lines[1] == f"Available KV cache memory: {round(t.kv_available_bytes / GIB, 2)} GiB"
    off = dict(spec, name="off-hand", serving={**spec["serving"], "estimate_cudagraph_memory": False})
    model = _model(tmp_path / "off", off, list(range(1, 65)), total_memory_bytes=1000 * MIB)
    t = model.evaluate((3, 6, 9, 18, 24))
    lines = render(model, hand_picked(model, t.capture_sizes))[1]["vllm_log_lines"]
    assert t.graph_estimate_bytes == 0 < t.profiled_estimate_bytes  # measured, not subtracted
    assert lines[1] == f"Available KV cache memory: {round(t.kv_available_bytes / GIB, 2)} GiB"
    assert lines[2].startswith("CUDA graph memory profiling is disabled (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0).")
    assert lines[2].endswith(f"from 0.9000 to {0.9 + t.profiled_estimate_bytes / (1000 * MIB):.4f}.")
    assert not any("is enabled" in line for line in lines)


def test_the_compact_paragraph_recommends_only_a_quarter_saved(ceiling):
    model = ceiling
    tuned = sorted(set(model.default_sizes) | {527, 544})  # hand-picked
    search = hand_picked(model, tuned)
    t = search.chosen
    # Itself: nothing within the tolerance counts less.
    search.compact = CompactChoice(t, 0.01, t.expected_step_ms, True, t.graph_estimate_bytes, True)
    md, data = render(model, search)
    assert "Compact list (the least vLLM estimate whose expected step is within 1.0% of the fastest list's " in md
    assert ": the tuned list itself; no list within the tolerance counts less vLLM estimate." in md
    assert data["compact"] == data["tuned"] and data["compact_choice"]["saved_share"] == 0.0
    # A hand-picked list standing in for the compact one: 544 dropped saves less than a quarter of the estimate.
    c = model.evaluate(set(tuned) - {544})
    floor = c.graph_estimate_bytes - 3 * MIB  # what a solve that rounds memory may prove
    search.compact = CompactChoice(c, 0.01, t.expected_step_ms, False, floor, True)
    md, data = render(model, search)
    share = 1 - c.graph_estimate_bytes / t.graph_estimate_bytes
    assert 0 < share < 0.25 and data["compact_choice"]["recommended"] is False
    assert (f"It saves {share:.0%} of the tuned list's vLLM estimate, less than 25%: the tuned list stays the "
            f"recommendation.") in md and "Recommended" not in md
    assert (f"(not proven the least: proven, no list within the tolerance counts less than "
            f"{floor / MIB:.3f} MiB ({3 * MIB / c.graph_estimate_bytes:.1%} below it))") in md
    assert data["compact_choice"]["proven"] is False and data["compact_choice"]["floor_bytes"] == floor
    # Nothing proven at all, the fastest list not proven either, and the work budget spent: each said, with the work.
    search.compact = CompactChoice(c, 0.01, t.expected_step_ms, False, 0, False, True, solves=3, work=12_345)
    md, _ = render(model, search)
    assert ("(not proven the least: the exact solver proved no floor below it; the fastest list is the best found, "
            "not proven optimal (see Search); its budget ran out (12,345 steps of `--exact-work` spent, or "
            "`--exact-seconds`))") in md


def _edit_metadata(path: Path, **changes) -> None:
    meta_path = path.with_suffix(".json")
    meta = json.loads(meta_path.read_text())
    for key, value in changes.items():
        if value is None:
            meta.pop(key, None)
        else:
            meta[key] = value
    meta_path.write_text(json.dumps(meta))


def test_provenance_says_measured_only_for_a_measured_profile(tmp_path):
    spec = handmade_spec(name="prov", max_num_seqs=8, max_num_batched_tokens=64)
    hand = _model(tmp_path / "hand", spec, list(range(1, 65)))
    assert profile_provenance(hand) == (False, "synthetic/hand-made, not measured")
    md, data = render(hand, hand_picked(hand, hand.default_sizes))
    assert "measured on" not in md and "synthetic/hand-made profile, not a measurement" in md
    assert "CUDA kernels per layer not recorded (vLLM's Llama layer: about 10-12 fused kernels)" in md
    assert data["profile_measured"] is False and data["eager_kernels_per_layer"] is None

    (tmp_path / "gpu").mkdir()
    _, path, workload = write_handmade_inputs(tmp_path / "gpu", spec, list(range(1, 65)))
    # The metadata a GPU sweep writes (values are fixtures), without a date.
    _edit_metadata(path, device="cuda:0", device_name="NVIDIA H200", eager_kernels_per_layer=11.5, compile_s=42.0,
                   created_at=None)
    gpu = CostModel.from_files(path, workload)
    assert profile_provenance(gpu) == (True, "measured on NVIDIA H200")
    md, data = render(gpu, hand_picked(gpu, gpu.default_sizes))
    assert "- device: **NVIDIA H200**" in md and "Profile numbers in every plot: measured on NVIDIA H200." in md
    assert "11.5 CUDA kernels per layer in one eager step (vLLM's Llama layer: about 10-12" in md
    assert "compiled with torch.compile, as vLLM runs it (compiling took 42.0 s, once per sweep)" in md
    assert "(made by `tests/handmade_profiles.py`)" in md and " at ?" not in md and "`?`" not in md
    assert data["eager_kernels_per_layer"] == 11.5 and data["compile_s"] == 42.0 and data["compiled"] is True


def test_noisy_widths_are_counted_over_the_decision_widths(tmp_path):
    spec = handmade_spec(name="noise", max_num_seqs=8, max_num_batched_tokens=16)
    _, path, workload = write_handmade_inputs(tmp_path, spec, list(range(1, 17)))
    _edit_metadata(path, noisy_widths=[3, 5, 7])  # fixture flags, as `cgtune profile` records them
    model = CostModel.from_files(path, workload)
    assert model.decision_widths() == list(range(1, 17))
    md, data = render(model, hand_picked(model, model.default_sizes))
    assert data["noisy_widths"] == {"count": 3, "decision_widths": 16, "share": 3 / 16, "widths": [3, 5, 7],
                                    "flagged_in_profile": 3}
    assert ("- timing noise: 3 of the 16 widths the decision rests on (19%) are flagged noisy: IQR/median of the "
            "timing above 5% (3, 5, 7)") in md


def test_memory_rounding_is_stated_once(ceiling):
    model = ceiling
    search = hand_picked(model, model.default_sizes)
    # The compact choice held to the hand-picked "exact" answer (a choice made here would weigh the report's rows,
    # which beat it, and say its fastest list is not proven): this test is about the exact row's words.
    t = search.chosen
    search.compact = CompactChoice(t, 0.01, t.expected_step_ms, True, t.graph_estimate_bytes, True)
    rounded = dataclasses.replace(search.exact, exact_memory=False, unproven=("memory figures rounded to units",),
                                  lower_bound_ms=search.exact.best.expected_step_ms / 1.01)
    search.notes.append(rounded.caveat())
    md, _ = render(model, search)
    assert "not proven optimal" not in md and md.count("in units of") == 1
    assert ("in units of 1,048,576 B (1.000 MiB): every memory figure is a whole number of units, so its answer is "
            "the proven optimum") in md
    search.exact = rounded
    md, data = render(model, search)
    assert md.count("not proven optimal (memory figures rounded to units): it is within 1.00% of the optimum") == 1
    assert data["exact_gap_bound"] == pytest.approx(0.01) and data["exact_unproven"] == ["memory figures rounded to units"]


def test_log_axis_when_values_span_two_decades():
    assert not log_axis([1.0, 50.0]) and log_axis([1.0, 100.0]) and log_axis([0.0, 5.0, 600.0])
    assert not log_axis([]) and not log_axis([0.0])


def test_sizes_no_step_gains_from_are_named_with_what_they_cost(peak):
    # Traffic of 28..32-request decode steps (q = 1): a 4-token graph serves no step (each pads to 28 or above), so a
    # list holding it is told so, with its 4 MiB (a PIECEWISE and a FULL graph at 4 tokens, the fixture's 2 MiB
    # capture delta each); the list without it is not.
    md, _ = render(peak, hand_picked(peak, (4, 28, 30, 32)))
    assert ("The tuned list holds sizes that save nothing on this workload's traffic: 4. No step (the drafter's passes "
            "included) gains from their graphs: dropping any one leaves the expected step as it is. Together they cost "
            "4.000 MiB of real pool") in md
    md, _ = render(peak, hand_picked(peak, (28, 30, 32)))
    assert "save nothing" not in md
