"""The words cgtune uses for a vLLM workload (`VllmEngine.report_words`): a run's report, summary and console lines
(lists in token widths, vLLM's memory rule: its graph-memory estimate before the capture, the real pool, the KV cache
it sizes; what the runner rewrites, what vLLM will log, the files `vllm serve` reads) and `cgtune defaults`' table."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tuner.report import decision
from tuner.decision.compare import LIST_SAVING_SHARE, feasible_cell, kv_tokens, listed_and_rest, max_concurrency
from tuner.model.eager_share import EagerShare, drafter_eager_passes, eager_share, uniform_decode_steps
from tuner.report.startup import exact_row_label
from tuner.report.text import GIB, mem_text, memory_unit, mib_text, num_text
from tuner.engines.vllm.defaults import CaptureDefaults, capture_ceiling, dense_speculative_schedule, validate_schedule
from tuner.engines.vllm.defaults import widest_decode_batch
from tuner.engines.vllm.drafter import EagerDrafterPasses, spans
from tuner.engines.vllm.lora import case_text

if TYPE_CHECKING:
    from pathlib import Path

    from tuner.model.costmodel import CostModel, Evaluation
    from tuner.engines.engine import Engine
    from tuner.decision.record import Decision
    from tuner.workload.spec import Workload

__all__ = [
    "console_lines",
    "decision_lines",
    "defaults_text",
    "drafter_lines",
    "figures",
    "files_line",
    "files_shipped_line",
    "keep_default_kv_utilization",
    "list_lines",
    "memory_rule_lines",
    "provenance_line",
    "side_by_side_lines",
    "summary_block",
    "vllm_log_lines",
    "what_changed_lines",
]


def keep_default_kv_utilization(model: CostModel, default: Evaluation, tuned: Evaluation) -> float:
    """The gpu_memory_utilization that gives the tuned list the KV cache the default list gets, rounded UP to
    vLLM's 4 logged decimals so it never gives less."""
    u = model.budget.utilization_for_kv(default.kv_available_bytes, tuned.graph_estimate_bytes,
                                        real_bytes=tuned.graph_memory_bytes)
    return math.ceil(round(u * 10_000, 6)) / 10_000 if math.isfinite(u) else u


def vllm_log_lines(model: CostModel, e: Evaluation) -> list[str]:
    """The memory lines vLLM logs when it starts with the list, through its own format strings
    (`tuner.engines.vllm.log_lines`; the release's, `Engine.memory_log_lines`): V1's estimate, the KV cache, the
    gpu_memory_utilization hint (a warning with the estimate off), the KV size and concurrency, the pool beside the
    estimate after the capture (0.34: the capture line, its seconds the ones the report's tables and `cgtune check`
    predict, 0 where the profile records none)."""
    b = model.budget
    return model.engine.memory_log_lines(
        captures=bool(e.runs_as), profiled_estimate_bytes=e.profiled_estimate_bytes,
        estimate_enabled=b.estimate_enabled, kv_available_bytes=e.kv_available_bytes, kv_tokens=kv_tokens(model, e),
        max_model_len=model.serving.max_model_len, max_concurrency=max_concurrency(model, e),
        total_memory_bytes=b.total_memory_bytes, gpu_memory_utilization=b.gpu_memory_utilization,
        pool_bytes=e.graph_memory_bytes, kv_capacity_bytes=b.requested_bytes - b.non_kv_cache_bytes,
        capture_s=decision.capture_s(model, e) or 0.0)


def _shipped(table: dict[str, Evaluation], shipped: tuple[str, Evaluation] | None) -> tuple[str, Evaluation]:
    """(how the report names it, its evaluation) of the list the deployment files carry (the tuned list when the
    caller does not say)."""
    if shipped is None:
        return "tuned", table["tuned"]
    name, e = shipped
    return ("compact" if name == "compact" else "tuned"), e


def provenance_line(model: CostModel) -> str:
    """The engine line of the report's header: vLLM, its runner and why, its cudagraph mode."""
    return (f"- {model.engine.release_words}, model runner **{model.runner.upper()}** ({model.engine.runner_reason}); "
            f"cudagraph_mode {model.cudagraph_mode}")


def list_lines(model: CostModel, table: dict[str, Evaluation]) -> list[str]:
    """Each list in token widths (and the list the runner runs, where it rewrites it); what a peer row is."""
    out = [f"- {model.engine.list_label(name)}: {model.engine.list_text(e.capture_sizes)}"
           + ("" if e.runs_as == e.capture_sizes else f" (runs as {model.engine.list_text(e.runs_as)})")
           for name, e in table.items() if name != "ideal"]
    if "sglang" in table:
        out.append("- The SGLang row is SGLang 0.5.23's own default for this configuration (max_running_requests = "
                   "max_num_seqs, speculative_num_draft_tokens = q, max_bs from its GPU-memory table for the "
                   "profile's device), each batch size times q tokens and evaluated as a vLLM list under vLLM's "
                   "dispatch and memory rule: a comparison of lists, not of engines.")
    return out


def files_line(model: CostModel) -> str:
    """What the run directory holds for vLLM."""
    return ("Files: `compilation_config.json` (`vllm serve --compilation-config`), `vllm-serve.yaml` "
            "(`vllm serve --config`), `vllm-flags.txt`, `summary.json`.")


def figures(model: CostModel, e: Evaluation) -> dict[str, Any]:
    """summary.json figures of one list beyond every engine's: none (vLLM's unit is the token width)."""
    return {}


def summary_block(model: CostModel, table: dict[str, Evaluation], *,
                  shipped: tuple[str, Evaluation] | None = None) -> dict[str, Any]:
    """summary.json's vLLM fields: gpu_memory_utilization, the estimate budget, the utilization that keeps the
    default's KV cache and the predicted log lines, both for the list shipped (`vllm_log_lines_list` names it)."""
    b, d = model.budget, table["default"]
    name, t = _shipped(table, shipped)
    return {"vllm_version": model.engine.version, "vllm_version_why": model.serving.vllm_version_why,
            "gpu_memory_utilization": b.gpu_memory_utilization,
            "estimate_budget_bytes": b.estimate_budget_bytes,
            "gpu_memory_utilization_to_keep_default_kv": keep_default_kv_utilization(model, d, t),
            "vllm_log_lines": vllm_log_lines(model, t), "vllm_log_lines_list": name}


def memory_rule_lines(model: CostModel, table: dict[str, Evaluation]) -> list[str]:
    """vLLM's KV rule in words, with this budget's numbers, and the words the tables use."""
    b = model.budget
    estimate = ("minus its graph-memory ESTIMATE for the list (made before the real capture)" if b.estimate_enabled
                else "(estimate_cudagraph_memory: false, so no graph memory is subtracted)")
    return [
        f"- KV cache, as vLLM sizes it: requested {mem_text(model, b.requested_bytes)} (ceil of "
        f"{mem_text(model, b.total_memory_bytes)} x gpu_memory_utilization {b.gpu_memory_utilization}) minus non-KV "
        f"memory {mem_text(model, b.non_kv_cache_bytes)}, {estimate}; required "
        f"{mem_text(model, b.required_kv_bytes)}, so the estimate may be at most "
        f"{mem_text(model, b.estimate_budget_bytes)}; the real capture must then fit in the estimate plus the "
        f"{mem_text(model, b.slack_bytes)} vLLM does not request",
        "- words used below: **vLLM estimate** = the graph memory vLLM subtracts before capturing; **real pool** = "
        "the memory the capture really takes (predicted); **KV cache** = what vLLM allocates; **KV margin** = KV cache "
        "minus the required; **capture headroom** = estimate + unrequested memory - real pool (< 0: the capture "
        f"runs out of memory). {memory_unit(model)[1]} = 2^{30 if memory_unit(model)[0] == GIB else 20} bytes.",
    ]


def decision_lines(model: CostModel, table: dict[str, Evaluation], source: str, how_found: list[str], *,
                   shipped: tuple[str, Evaluation] | None = None) -> list[str]:
    """The decision against vLLM's default, the drafter's share, how the list was found (`how_found`), then for the
    list shipped (`shipped`: its name and evaluation; the tuned list by default) the lines vLLM will log and the
    gpu_memory_utilization that keeps the default's KV cache."""
    d, t = table["default"], table["tuned"]
    lines = [f"Tuned list ({source}): `{model.engine.list_text(t.capture_sizes, None)}`", ""]
    if t.runs_as != t.capture_sizes:
        lines += [f"**It runs as a different list**: the {model.runner.upper()} runner rewrites an explicit list when "
                  f"speculating (every size rounded up to a multiple of q = {model.q}, sizes above the old max "
                  f"dropped), so vLLM captures `{list(t.runs_as)}`; every figure below is for the list that runs.", ""]
    change = t.expected_step_ms / d.expected_step_ms - 1 if d.expected_step_ms > 0 else 0.0
    lines.append(
        f"Expected step latency {t.expected_step_ms:.4f} ms vs {d.expected_step_ms:.4f} ms with vLLM's default "
        f"({abs(change):.1%} {'lower' if change <= 0 else 'higher'}). Graph memory: vLLM estimate "
        f"{mem_text(model, t.graph_estimate_bytes)} vs {mem_text(model, d.graph_estimate_bytes)}, real pool "
        f"{mem_text(model, t.graph_memory_bytes)} vs {mem_text(model, d.graph_memory_bytes)}. KV cache "
        f"{mem_text(model, t.kv_available_bytes)} ({kv_tokens(model, t):,} tokens, max concurrency "
        f"{max_concurrency(model, t):.2f}x) vs {mem_text(model, d.kv_available_bytes)} ({kv_tokens(model, d):,} "
        f"tokens, {max_concurrency(model, d):.2f}x); KV margin {mem_text(model, t.kv_margin_bytes)}, capture headroom "
        f"{mem_text(model, t.capture_headroom_bytes)}.")
    if not d.feasible:
        lines.append(f"vLLM's default does not fit this budget ({d.why_infeasible}); the tuned list does"
                     + ("." if t.feasible else " not either."))
    lines += drafter_lines(model, d, t)
    lines += how_found
    name, sh = _shipped(table, shipped)
    u = keep_default_kv_utilization(model, d, sh)
    now = model.budget.gpu_memory_utilization
    lines += ["", f"What vLLM {model.engine.version} will log when it starts with the {name} list, the one shipped "
              f"(predicted, in vLLM's own format strings; {model.engine.estimate_line_note}; vLLM counts whole KV "
              f"blocks, so the KV size and concurrency can come out slightly lower):", "", "```",
              *vllm_log_lines(model, sh), "```", ""]
    if not d.starts:
        lines.append("vLLM's default list would not start here, so there is no default KV cache size to keep.")
    elif u > 1.0:
        lines.append(f"No gpu_memory_utilization keeps the default list's KV cache "
                     f"({mem_text(model, d.kv_available_bytes)}) with the {name} list: it would take {u:.4f} (> 1).")
    elif sh.kv_available_bytes >= d.kv_available_bytes or u == now:
        lines.append(f"At gpu_memory_utilization {now} the {name} list already leaves the KV cache the default list "
                     f"does.")
    else:
        lines.append(f"gpu_memory_utilization **{u:.4f}** (now {now}) gives the {name} list the KV cache the default "
                     f"list gets ({mem_text(model, d.kv_available_bytes)}).")
    return lines


def drafter_lines(model: CostModel, d: Evaluation, t: Evaluation) -> list[str]:
    """The drafter's share of latency and memory, and the widths its graphs cost (issue: the tuner must see both
    sides of the trade a width above the ceiling makes: the drafter captures graphs for it too)."""
    dr = model.drafter
    if dr is None:
        return []
    lines = ["", f"Drafter ({dr.method}, {dr.runner.upper()} runner): its passes take {t.drafter_step_ms:.4f} ms of "
             f"the tuned step ({t.expected_step_ms - t.drafter_step_ms:.4f} ms target) vs {d.drafter_step_ms:.4f} ms "
             f"of the default's; its graphs take {mem_text(model, t.drafter_graph_bytes)} of the tuned list's real "
             f"pool ({mem_text(model, t.graph_memory_bytes - t.drafter_graph_bytes)} target) vs "
             f"{mem_text(model, d.drafter_graph_bytes)} of the default's."]
    dropped = model.dropped_for_drafter(t)
    if dropped:
        lines.append(f"**The drafter's graphs cost these widths**: adding {', '.join(map(str, dropped[:8]))}"
                     f"{' ...' if len(dropped) > 8 else ''} would make the tuned list faster and would fit without the "
                     f"drafter's graphs, but not with them (vLLM captures the drafter's graphs from the same list, "
                     f"into the same pool).")
    return lines


def what_changed_lines(model: CostModel, dec: Decision) -> list[str]:
    """Widths added and removed against vLLM's default (as the runner captures both lists), and what each one added
    above the default's max costs (estimate and real pool) and saves."""
    d, t, c = dec.default, dec.tuned, dec.changed
    lines = ["## What changed against vLLM's default", ""]
    if d.runs_as != d.capture_sizes or t.runs_as != t.capture_sizes:
        lines += [f"Compared as the {model.runner.upper()} runner captures the lists (it rewrites them; see Lists).",
                  ""]
    if not c.added and not c.removed:
        return lines + ["Nothing: the tuned list is vLLM's default list.", ""]
    lines += [f"- added ({len(c.added)}): {model.engine.list_text(c.added, 40)}",
              f"- removed ({len(c.removed)}): {model.engine.list_text(c.removed, 40)}", ""]
    if c.above_max:
        lines += [
            f"Each width added above the default max ({model.engine.tops_text(d.runs_as)}), judged by the tuned "
            f"list with and without "
            f"it (the rest kept):",
            "",
            "| width | vLLM estimate added (MiB) | real pool added (MiB) | expected step saved (ms) | saved (% of the "
            "tuned step) |",
            "|---|---|---|---|---|",
        ]
        listed, rest = listed_and_rest(c.above_max, t.expected_step_ms)
        for w in listed:
            share = w.saved_ms / t.expected_step_ms if t.expected_step_ms > 0 else 0.0
            lines.append(f"| {model.engine.key_text(w.num_tokens)} | {mib_text(w.estimate_bytes)} "
                         f"| {mib_text(w.real_bytes)} | {w.saved_ms:+.4f} | {share:+.2%} |")
        if rest:
            lines.append(f"| {len(rest)} more, each saving less than {LIST_SAVING_SHARE:.1%} "
                         f"({model.engine.list_text(tuple(w.num_tokens for w in rest), 8)}), row by row summed | "
                         f"{mib_text(sum(w.estimate_bytes for w in rest))} "
                         f"| {mib_text(sum(w.real_bytes for w in rest))} | {sum(w.saved_ms for w in rest):+.4f} | |")
        lines.append("")
    else:
        lines += [f"No width is added above the default max ({model.engine.tops_text(d.runs_as)}).", ""]
    return lines


def side_by_side_lines(model: CostModel, dec: Decision) -> list[str]:
    """The comparison table, vLLM's estimate beside the real pool."""
    u = memory_unit(model)[1]
    lines = [
        "## Side by side (same profile, same memory rule)",
        "",
        f"| list | graphs | max | runs as | expected step (ms) | per token (ms) | vLLM estimate ({u}) "
        f"| real pool ({u}) | KV cache ({u}) | KV tokens | max concurrency | KV margin ({u}) "
        f"| capture headroom ({u}) | capture (s) | feasible |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, e in dec.table.items():
        feasible = feasible_cell(name, e)
        label = exact_row_label(dec) if name == "exact" else model.engine.list_label(name)
        runs = "same" if e.runs_as == e.capture_sizes else (
            model.engine.list_shape(e.runs_as) if e.runs_as else "nothing (refused)")
        lines.append(
            f"| {label} | {len(e.capture_sizes)} "
            f"| {model.engine.list_max(e.capture_sizes)} "
            f"| {runs} | {e.expected_step_ms:.4f} | {e.per_token_ms:.5f} "
            f"| {num_text(model, e.graph_estimate_bytes)} | {num_text(model, e.graph_memory_bytes)} "
            f"| {num_text(model, e.kv_available_bytes)} | {kv_tokens(model, e):,} | {max_concurrency(model, e):.2f} "
            f"| {num_text(model, e.kv_margin_bytes)} | {num_text(model, e.capture_headroom_bytes)} "
            f"| {decision.capture_cell(model, e)} | {feasible} |")
    lines += ["", *decision.no_graphs_lines(dec), "Capture (s): the profile's capture seconds summed over the graphs "
              "the list creates, the drafter's included (vLLM adds its warm-up runs).", ""]
    return lines


def console_lines(model: CostModel, dec: Decision, how: str) -> list[str]:
    """What a search chose, for the console: the list (and what the runner rewrites it to), latency, vLLM's estimate
    beside the real pool, the KV cache vLLM sizes (GiB, tokens, max concurrency), the off-peak check, noisy timings."""
    t, d = dec.tuned, dec.default
    change = t.expected_step_ms / d.expected_step_ms - 1 if d.expected_step_ms else 0.0
    lines = [f"tuned list ({how}): {model.engine.list_shape(t.capture_sizes)}"]
    if t.runs_as != t.capture_sizes:
        lines.append(f"it runs as another list: the {model.runner.upper()} runner rewrites it to {len(t.runs_as)} "
                     f"graphs (multiples of q = {model.q}): {list(t.runs_as)}")
    lines.append(f"expected step {t.expected_step_ms:.4f} ms vs {model.engine.list_label('default')} "
                 f"{d.expected_step_ms:.4f} ms ({change:+.1%})")
    lines.append(f"graph memory: vLLM estimate {t.graph_estimate_bytes / GIB:.3f} GiB (default "
                 f"{d.graph_estimate_bytes / GIB:.3f}), real pool {t.graph_memory_bytes / GIB:.3f} GiB (default "
                 f"{d.graph_memory_bytes / GIB:.3f})")
    lines.append(f"KV cache {t.kv_available_bytes / GIB:.3f} GiB = {kv_tokens(model, t):,} tokens, max concurrency "
                 f"{max_concurrency(model, t):.2f}x (default {d.kv_available_bytes / GIB:.3f} GiB = "
                 f"{kv_tokens(model, d):,} tokens); KV margin {t.kv_margin_bytes / GIB:.3f} GiB"
                 + ("" if d.feasible else f" (the default does not fit: {d.why_infeasible})"))
    peak = dec.off_peak
    if peak.tuned_slower:
        lines.append(f"WARNING: off-peak (1..{model.serving.max_num_seqs} requests, uniform) the tuned list is slower: "
                     f"{peak.tuned_step_ms:.4f} ms vs {peak.default_step_ms:.4f} ms per step; see report.md, or weigh "
                     f"it in with --off-peak-weight")
    noisy = len(set(model.noisy_widths) & set(model.decision_widths()))
    if noisy:
        lines.append(f"noisy timings: {noisy} of the {len(model.decision_widths())} decision widths "
                     f"({model.noisy_share:.0%}) were flagged (IQR/median > 5%)")
    return lines


def files_shipped_line(model: CostModel, dec: Decision, run_dir: Path) -> str:
    """The shipped list in one line, and the files that hold it and the other list."""
    return decision.shipped_line(model, dec, run_dir,
                                 model.engine.list_shape)


# ---------------------------------------------------------------------------------------------- cgtune defaults
def defaults_text(engine: Engine, workload: Workload | None, *, as_json: bool) -> str:
    """`cgtune defaults` for a vLLM serving config (a workload's, or the flags'): vLLM 0.33's default list, the
    runner and the list it runs, the decode widths and drafter passes without a graph, the eager share."""
    s = engine.serving
    result = engine.defaults()
    report = _VllmReport.of(engine, workload, result)
    if as_json:
        return json.dumps({
            "cudagraph_capture_sizes": result.sizes,
            "max_cudagraph_capture_size": result.max_size,
            "uniform_decode_sizes_without_graph": result.uniform_decode_sizes_without_graph,
            **report.as_dict(),
        })
    schedule = [list(e) for e in engine.dynamic_schedule] if engine.dynamic_schedule else None
    return _table(s.max_num_seqs, s.num_speculative_tokens, schedule, s.gpu_capability, result, report)


def _ranges(values: list[int]) -> str:
    """Compress a sorted list: 527..2176 step 17."""
    if len(values) <= 6:
        return " ".join(map(str, values)) or "-"
    steps = {b - a for a, b in zip(values, values[1:])}
    if len(steps) == 1:
        return f"{values[0]}..{values[-1]} step {steps.pop()} ({len(values)} widths)"
    return f"{' '.join(map(str, values[:3]))} ... {' '.join(map(str, values[-3:]))} ({len(values)} widths)"


def _schedule_runs(schedule: list[list[int]], max_num_seqs: int, k: int) -> str:
    """The K each batch size runs at, as vLLM expands the schedule (gaps and the tail carry the previous K, every K
    clamped to num_speculative_tokens): `K=3 for 1..16, K=1 for 17..256`, and which batch sizes were carried."""
    def runs(values: list[tuple[int, int]]) -> list[list[int]]:  # consecutive sizes, equal keys -> [first, last, key]
        out: list[list[int]] = []
        for n, key in values:
            if out and out[-1][2] == key and out[-1][1] == n - 1:
                out[-1][1] = n
            else:
                out.append([n, n, key])
        return out

    def span(a: int, b: int) -> str:
        return f"{a}..{b}" if a != b else str(a)

    dense = dense_speculative_schedule(schedule, max_num_seqs, k)
    text = ", ".join(f"K={kk} for {span(a, b)}" for a, b, kk in runs([(n, dense[n]) for n in
                                                                       range(1, max_num_seqs + 1)]))
    covered = {n for lo, hi, _ in validate_schedule(schedule) for n in range(lo, min(hi, max_num_seqs) + 1)}
    carried = runs([(n, 0) for n in range(1, max_num_seqs + 1) if n not in covered])
    if carried:
        text += (f" (batch sizes {', '.join(span(a, b) for a, b, _ in carried)} are in no range: vLLM carries the "
                 f"K of the range before)")
    return text


def _table(max_num_seqs: int, k: int, schedule: list[list[int]] | None, capability: tuple[int, int],
           result: CaptureDefaults, report: _VllmReport) -> str:
    requests, q = widest_decode_batch(max_num_seqs, k, schedule)
    widest = requests * q
    rows = [
        ("max_num_seqs x q", f"{max_num_seqs} x {q} = {widest} tokens (widest uniform decode batch)")
        if schedule is None else
        ("widest decode batch", f"{requests} x {q} = {widest} tokens (K={q - 1} at {requests} requests under the "
                                f"schedule)"),
        ("ceiling", f"{capture_ceiling(capability)} tokens "
                    f"(compute capability {capability[0]}.{capability[1]})"),
        ("max_cudagraph_capture_size", str(result.max_size)),
        ("capture sizes", f"{len(result.sizes)} graphs"),
    ]
    if schedule is not None:
        rows.insert(0, ("speculative schedule", _schedule_runs(schedule, max_num_seqs, k)))
    elif report.schedule_dropped:
        why = (f"vLLM runs no dynamic schedule under data_parallel_size {report.data_parallel_size}"
               if report.data_parallel_size > 1 else
               f"the V1 runner runs no dynamic schedule for method {report.method!r}")
        rows.insert(0, ("speculative schedule", f"dropped: {why}, every step drafts K={k}"))
    reason = report.runner_reason
    rows.insert(0, ("model runner", reason if reason.startswith(report.runner.upper()) else
                    f"{report.runner.upper()} ({reason})"))
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    lines += _size_lines(result.sizes, width)
    if report.refused:
        lines.append(f"{'runs as':<{width}}  nothing: the {report.runner.upper()} runner refuses the list "
                     f"({report.refused})")
    elif report.runs_as is not None and list(report.runs_as) != list(result.sizes):
        lines.append(f"{'runs as':<{width}}  {len(report.runs_as)} graphs: the {report.runner.upper()} runner "
                     f"rewrites the list when speculating (sizes rounded up to multiples of q, those above the "
                     f"max dropped); this is the list that RUNS")
        lines += _size_lines(report.runs_as, width)
    lines += report.deployment_lines(width)
    eager = result.uniform_decode_sizes_without_graph
    lines.append(f"{'decode widths eager':<{width}}  {_ranges(eager)}")
    lines.append(f"{'eager share':<{width}}  {report.traffic}: {report.share.describe()}")
    lines += [f"{'drafter eager':<{width}}  {line}" for line in report.drafter_lines()]
    lines += [f"{'warning':<{width}}  {w}" for w in result.warnings]
    return "\n".join(lines)




def _size_lines(sizes: list[int] | tuple[int, ...], width: int, per_line: int = 16) -> list[str]:
    return [" " * (width + 2) + " ".join(f"{s:>5}" for s in sizes[i:i + per_line])
            for i in range(0, len(sizes), per_line)]


def _spans(values: list[int] | tuple[int, ...]) -> str:
    """`1..4, 7, 9..10` for [1, 2, 3, 4, 7, 9, 10] (consecutive runs), `-` for none."""
    return spans(values) or "-"


def _widths(values: tuple[int, ...]) -> str:
    """`544..2176 tokens, step 17` for an evenly spaced run, else the widths or their ends and count."""
    if len(values) <= 6:
        return ", ".join(map(str, values)) + " tokens"
    steps = {b - a for a, b in zip(values, values[1:])}
    if len(steps) == 1:
        return f"{values[0]}..{values[-1]} tokens, step {steps.pop()}"
    return f"{values[0]}..{values[-1]} tokens, {len(values)} widths"


@dataclass(frozen=True)
class _VllmReport:
    """What runs under vLLM's default list beside the list itself: the runner, the list it runs, the eager share of
    the traffic (the workload's, or decode steps uniform over 1..max_num_seqs requests without one) and the drafter
    passes without a graph."""

    runner: str
    """`v1` or `v2`."""
    runner_reason: str
    """Why that runner."""
    runs_as: tuple[int, ...] | None
    """The list the runner captures (None when it refuses the list)."""
    refused: str
    """Why the runner refuses the list ("" when it does not)."""
    traffic: str
    """Which traffic the share counts."""
    share: EagerShare
    """Decode steps and tokens without a graph."""
    drafter: tuple[EagerDrafterPasses, ...]
    """Drafter passes without a graph (model-based drafters)."""
    method: str | None
    """The speculative method."""
    schedule_dropped: bool = False
    """The workload's speculative_schedule is one vLLM drops (V1 with suffix or custom_class, or DP)."""
    lora_cases: tuple[int, ...] = (0,)
    """The LoRA cases every graph is captured for ((0,): no LoRA)."""
    max_loras: int = 0
    """`max_loras` (0: no LoRA)."""
    data_parallel_size: int = 1
    """DP ranks that agree on every step."""

    def deployment_lines(self, width: int) -> list[str]:
        """LoRA's and data parallelism's lines of `cgtune defaults` (none without either)."""
        lines = []
        if self.max_loras:
            lines.append(f"{'LoRA cases':<{width}}  {case_text(self.lora_cases, self.max_loras)}: every graph "
                         f"captured {len(self.lora_cases)} time{'s' if len(self.lora_cases) > 1 else ''}")
        if self.data_parallel_size > 1:
            lines.append(f"{'data parallel':<{width}}  {self.data_parallel_size} ranks: a step runs at the widest "
                         f"rank's width (decode only where every rank decodes), all eager where any rank is")
        return lines

    @classmethod
    def of(cls, engine: Engine, workload: Workload | None, result: CaptureDefaults) -> _VllmReport:
        serving = engine.serving
        try:
            runs: tuple[int, ...] | None = engine.runs_as(result.sizes)
            refused = ""
        except ValueError as exc:
            runs, refused = None, str(exc)
        if workload is not None:
            steps, traffic = workload.steps(), "workload traffic"
        else:
            steps = uniform_decode_steps(serving)
            traffic = "no workload, uniform decode traffic"
        drafter = tuple(drafter_eager_passes(workload, result.sizes)) if workload is not None else ()
        return cls(engine.runner, engine.runner_reason, runs, refused, traffic,
                   eager_share(serving, steps, result.sizes), drafter, serving.speculative_method,
                   bool(serving.speculative_schedule) and engine.dynamic_schedule is None, engine.lora_cases(),
                   serving.lora.max_loras if serving.lora is not None else 0, serving.data_parallel_size)

    def drafter_lines(self) -> list[str]:
        return [f"{self.runner} {self.method} {p.role} passes at N = {_spans(p.request_counts)} "
                f"({_widths(p.widths)}) run eager" for p in self.drafter]

    def as_dict(self) -> dict[str, object]:
        return {
            "model_runner": self.runner, "runner_reason": self.runner_reason,
            "runs_as": list(self.runs_as) if self.runs_as is not None else None,
            **self.share.as_dict(), "eager_share_traffic": self.traffic,
            "eager_drafter_passes": [{"role": p.role, "request_counts": list(p.request_counts),
                                      "widths": list(p.widths)} for p in self.drafter],
            "lora_cases": list(self.lora_cases), "data_parallel_size": self.data_parallel_size,
        }
