"""The words of a run's report, summary and console lines for an engine that counts its graphs in requests
(SGLang, TensorRT-LLM, any `tuner.engines.request_engine.RequestEngine`): lists in requests with token widths beside,
the real pool (such an engine makes no estimate), and the engine's own words for its memory rule and files
(`RequestEngine.report_words`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from tuner.report import decision
from tuner.decision.compare import LIST_SAVING_SHARE, feasible_cell, kv_tokens, listed_and_rest, max_concurrency
from tuner.model.eager_share import eager_share
from tuner.engines.vllm.drafter import spans
from tuner.report.startup import exact_row_label
from tuner.report.text import GIB, mem_text, memory_unit, num_text

if TYPE_CHECKING:
    from pathlib import Path

    from tuner.model.costmodel import CostModel, Evaluation
    from tuner.engines.request_engine import RequestEngine
    from tuner.decision.record import Decision
    from tuner.workload.spec import Workload

__all__ = [
    "console_lines",
    "decision_lines",
    "defaults_text",
    "figures",
    "files_line",
    "files_shipped_line",
    "list_lines",
    "memory_rule_lines",
    "provenance_line",
    "side_by_side_lines",
    "summary_block",
    "what_changed_lines",
]

MIB = 1 << 20


def default_name(model: CostModel) -> str:
    """`SGLang's default`, `TensorRT-LLM's default`."""
    return model.engine.default_name


def _requests(model: CostModel, widths: tuple[int, ...] | list[int]) -> list[int]:
    return [w // model.q for w in widths]


def _top(model: CostModel, e: Evaluation) -> int:
    """The list's max in requests as the engine runs it (what SGLang's automatic fraction reserves for)."""
    return -(-e.runs_as[-1] // model.q) if e.runs_as else 0


def _pairs(model: CostModel, widths: tuple[int, ...], limit: int = 24) -> str:
    """`requests 1, 2, 4 (tokens 4, 8, 16)`, cut after `limit` sizes."""
    if not widths:
        return "(none)"
    reqs = _requests(model, widths)
    more = f", ... ({len(widths)} sizes)" if len(widths) > limit else ""
    return (f"requests {', '.join(map(str, reqs[:limit]))}{more} (tokens {', '.join(map(str, widths[:limit]))}"
            f"{more})")


def provenance_line(model: CostModel) -> str:
    """The engine line of the report's header."""
    return f"- engine: {model.engine.engine_line()}"


def memory_rule_lines(model: CostModel, table: dict[str, Evaluation]) -> list[str]:
    """The engine's KV rule in words, with this budget's numbers, and the words the tables use."""
    rule, headroom = model.engine.memory_rule_words(model.budget, _top(model, table["default"]),
                                                    _top(model, table["tuned"]), lambda x: mem_text(model, x))
    unit, name = memory_unit(model)
    return [
        rule,
        f"- words used below: **real pool** = the memory the engine's graphs take (predicted; "
        f"{model.engine.label} makes no estimate before capturing); **KV cache** = what the engine allocates; "
        f"**KV margin** = KV cache minus the required; **capture headroom** = {headroom} (< 0: the capture runs "
        f"out of memory). {name} = 2^{30 if unit == 1 << 30 else 20} bytes.",
    ]


def decision_lines(model: CostModel, table: dict[str, Evaluation], source: str, how_found: list[str], *,
                   shipped: tuple[str, Evaluation] | None = None) -> list[str]:
    """The decision in the engine's unit, then how the list was found (`how_found`); `shipped` as vLLM's words take it
    (this engine predicts no start-up lines for it)."""
    d, t = table["default"], table["tuned"]
    name, engine = default_name(model), model.engine.label
    lines = [f"Tuned list ({source}): {len(t.capture_sizes)} graphs, batch sizes (requests) "
             f"`{_requests(model, t.capture_sizes)}`, token widths `{list(t.capture_sizes)}`", ""]
    if t.runs_as != t.capture_sizes:
        lines += [f"**It runs as a different list**: {engine} captures batch sizes `{_requests(model, t.runs_as)}`; "
                  f"every figure below is for the list that runs.", ""]
    change = t.expected_step_ms / d.expected_step_ms - 1 if d.expected_step_ms > 0 else 0.0
    lines.append(
        f"Expected step latency {t.expected_step_ms:.4f} ms vs {d.expected_step_ms:.4f} ms with {name} "
        f"({len(d.runs_as)} graphs, max {_top(model, d)} requests; {abs(change):.1%} "
        f"{'lower' if change <= 0 else 'higher'}). Real graph pool {mem_text(model, t.graph_memory_bytes)} vs "
        f"{mem_text(model, d.graph_memory_bytes)}. KV cache {mem_text(model, t.kv_available_bytes)} "
        f"({kv_tokens(model, t):,} tokens, max concurrency {max_concurrency(model, t):.2f}x) vs "
        f"{mem_text(model, d.kv_available_bytes)} ({kv_tokens(model, d):,} tokens, {max_concurrency(model, d):.2f}x); "
        f"KV margin "
        f"{mem_text(model, t.kv_margin_bytes)}, capture headroom {mem_text(model, t.capture_headroom_bytes)}.")
    if not d.feasible:
        lines.append(f"{name} does not fit this budget ({d.why_infeasible}); the tuned list does"
                     + ("." if t.feasible else " not either."))
    return lines + how_found + [""]


def what_changed_lines(model: CostModel, dec: Decision) -> list[str]:
    """Batch sizes added and removed against the engine's default (as the engine captures both lists), and what each
    one added above the default's max costs and saves."""
    t, c = dec.tuned, dec.changed
    lines = [f"## What changed against {default_name(model)}", ""]
    if not c.added and not c.removed:
        return lines + [f"Nothing: the tuned list is {default_name(model)} list.", ""]
    lines += [f"- added ({len(c.added)}): {_pairs(model, c.added, 40)}",
              f"- removed ({len(c.removed)}): {_pairs(model, c.removed, 40)}", ""]
    if c.above_max:
        lines += [f"Each batch size added above the default's max ({c.default_max // model.q} requests, "
                  f"{c.default_max} tokens), judged by the tuned list with and without it (the rest kept):", "",
                  "| batch size (requests) | width (tokens) | real pool added (MiB) | expected step saved (ms) | saved "
                  "(% of the tuned step) |", "|---|---|---|---|---|"]
        listed, rest = listed_and_rest(c.above_max, t.expected_step_ms)
        for w in listed:
            share = w.saved_ms / t.expected_step_ms if t.expected_step_ms > 0 else 0.0
            lines.append(f"| {w.num_tokens // model.q} | {w.num_tokens} | {w.real_bytes / MIB:+.2f} | "
                         f"{w.saved_ms:+.4f} | {share:+.2%} |")
        if rest:
            lines.append(f"| {len(rest)} more, each saving less than {LIST_SAVING_SHARE:.1%} "
                         f"({rest[0].num_tokens // model.q}..{rest[-1].num_tokens // model.q}), row by row summed | | "
                         f"{sum(w.real_bytes for w in rest) / MIB:+.2f} | {sum(w.saved_ms for w in rest):+.4f} | |")
        lines.append("")
    else:
        lines += [f"No batch size is added above the default's max ({c.default_max // model.q} requests).", ""]
    return lines


def side_by_side_lines(model: CostModel, dec: Decision) -> list[str]:
    """The comparison table in the engine's unit (no estimate column: the engine makes none)."""
    u, engine = memory_unit(model)[1], model.engine.label
    lines = [
        f"## Side by side (same profile, {engine}'s memory rule)",
        "",
        f"| list | graphs | max (requests) | max (tokens) | runs as | expected step (ms) | per token (ms) "
        f"| real pool ({u}) | KV cache ({u}) | KV tokens | max concurrency | KV margin ({u}) | capture headroom ({u}) "
        f"| capture (s) | feasible |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, e in dec.table.items():
        feasible = feasible_cell(name, e)
        label = exact_row_label(dec) if name == "exact" else model.engine.list_label(name)
        top = e.capture_sizes[-1] if e.capture_sizes else 0
        runs = "same" if e.runs_as == e.capture_sizes else (
            f"{len(e.runs_as)} graphs, max {_top(model, e)} requests" if e.runs_as else "nothing")
        lines.append(
            f"| {label} | {len(e.capture_sizes)} | {-(-top // model.q)} | {top} | {runs} "
            f"| {e.expected_step_ms:.4f} | {e.per_token_ms:.5f} | {num_text(model, e.graph_memory_bytes)} "
            f"| {num_text(model, e.kv_available_bytes)} | {kv_tokens(model, e):,} | {max_concurrency(model, e):.2f} "
            f"| {num_text(model, e.kv_margin_bytes)} | {num_text(model, e.capture_headroom_bytes)} "
            f"| {decision.capture_cell(model, e)} | {feasible} |")
    lines += ["", *decision.no_graphs_lines(dec), f"The ideal row captures every token width a step has (not only "
              f"multiples of {model.q}): a bound, not a list {engine} can run. Capture (s): the profile's capture "
              f"seconds summed over the graphs the list creates.", ""]
    return lines


def list_lines(model: CostModel, table: dict[str, Evaluation]) -> list[str]:
    """Each list in requests with its token widths beside."""
    out = []
    for name, e in table.items():
        if name == "ideal":
            continue
        out.append(f"- {model.engine.list_label(name)}: {_pairs(model, e.capture_sizes)}"
                   + ("" if e.runs_as == e.capture_sizes else f" (captured as {_pairs(model, e.runs_as)})"))
    return out


def files_line(model: CostModel) -> str:
    """What the run directory holds for the engine."""
    return model.engine.files_line()


def figures(model: CostModel, e: Evaluation) -> dict[str, Any]:
    """summary.json figures of one list that only an engine workload has: the list in requests."""
    return {"batch_sizes": _requests(model, e.capture_sizes), "runs_as_batch_sizes": _requests(model, e.runs_as),
            "vllm_graph_estimate_bytes": None, "vllm_graph_estimate_profiled_bytes": None}


def summary_block(model: CostModel, table: dict[str, Evaluation], *,
                  shipped: tuple[str, Evaluation] | None = None) -> dict[str, Any]:
    """summary.json's engine block and its memory rule (in place of vLLM's estimate, log lines and
    gpu_memory_utilization; `shipped` as vLLM's words take it)."""
    e = model.engine
    block: dict[str, Any] = {
        "name": e.name, "unit": e.unit, "tokens_per_request": model.q, "files": list(e.files),
        "batch_sizes": _requests(model, table["tuned"].capture_sizes),
        **e.summary_fields(model.budget, _top(model, table["default"]), _top(model, table["tuned"])),
    }
    return {"engine": block, "model_runner": None, "runner_reason": e.runner_reason}


def console_lines(model: CostModel, dec: Decision, how: str) -> list[str]:
    """What a search chose, for the console: the list in requests (token widths beside), the real pool (the engine
    makes no estimate) and the KV cache under the engine's rule."""
    t, d = dec.tuned, dec.default
    change = t.expected_step_ms / d.expected_step_ms - 1 if d.expected_step_ms else 0.0
    reqs = model.engine.in_engine_unit(t.capture_sizes)
    return [
        f"tuned list ({how}): {len(reqs)} graphs, batch sizes (requests) {reqs[0] if reqs else 0}.."
        f"{reqs[-1] if reqs else 0} (token widths {t.capture_sizes[0] if reqs else 0}.."
        f"{t.capture_sizes[-1] if reqs else 0}, {model.q} per request)",
        f"expected step {t.expected_step_ms:.4f} ms vs {model.engine.list_label('default')} {d.expected_step_ms:.4f} "
        f"ms ({change:+.1%})",
        f"graph memory: real pool {t.graph_memory_bytes / GIB:.3f} GiB (default {d.graph_memory_bytes / GIB:.3f})",
        f"KV cache {t.kv_available_bytes / GIB:.3f} GiB = {kv_tokens(model, t):,} tokens, max concurrency "
        f"{max_concurrency(model, t):.2f}x (default {d.kv_available_bytes / GIB:.3f} GiB); KV margin "
        f"{t.kv_margin_bytes / GIB:.3f} GiB"
        + ("" if d.feasible else f" (the default does not fit: {d.why_infeasible})"),
    ]


def files_shipped_line(model: CostModel, dec: Decision, run_dir: Path) -> str:
    """The shipped list in one line, in requests, and the files that hold it and the other list."""
    def count(sizes: tuple[int, ...]) -> str:
        reqs = model.engine.in_engine_unit(sizes)
        return f"{len(reqs)} graphs, max {reqs[-1] if reqs else 0} requests, {sizes[-1] if sizes else 0} tokens"

    return decision.shipped_line(model, dec, run_dir, count)


# ---------------------------------------------------------------------------------------------- cgtune defaults
def defaults_text(engine: RequestEngine, workload: Workload, *, as_json: bool) -> str:
    """`cgtune defaults` for an engine counting in requests: its default decode list in requests with token widths
    beside, what the engine really captures, the decode batches without a graph and the eager share of the workload's
    traffic."""
    s, q = engine.serving, engine.decode_query_len
    defaults = engine.defaults()
    written = [w // q for w in defaults.sizes]
    runs = [w // q for w in engine.runs_as(defaults.sizes)]
    eager = [w // q for w in defaults.uniform_decode_sizes_without_graph]
    share = eager_share(s, workload.steps(), defaults.sizes)
    rows, extra, cap, cap_name = engine.defaults_rows(workload.model.tensor_parallel_size)
    rows.append(("default list", f"{len(written)} graphs, max {max(written) if written else 0} requests "
                                 f"({defaults.max_size} tokens)"))
    if as_json:
        return json.dumps({
            "engine": engine.name, "unit": "requests", "tokens_per_request": q, "batch_sizes": written,
            "token_widths": list(defaults.sizes), "captured_batch_sizes": runs, "request_cap": cap,
            "eager_batch_sizes": eager,
            "uniform_decode_sizes_without_graph": defaults.uniform_decode_sizes_without_graph,
            "widest_decode_batch": {"requests": s.max_num_seqs, "tokens_per_request": q, "tokens": s.max_num_seqs * q},
            **extra, **share.as_dict(), "eager_share_traffic": "workload traffic",
        })
    rows.append(("", written))
    if runs != written:
        rows.append(("captured", f"{len(runs)} graphs: what {engine.label} really captures (its filter against the "
                                 f"{cap_name})"))
        rows.append(("", runs))
    if not eager:
        rows.append(("eager decode batches", f"none: every decode batch up to {s.max_num_seqs} requests replays a "
                                             f"graph"))
    else:
        why = engine.eager_reason(runs, cap, cap_name)
        rows.append(("eager decode batches", f"{spans(eager) or '-'} requests ({why}) run eager"))
    rows.append(("widest decode batch", f"{s.max_num_seqs} x {q} = {s.max_num_seqs * q} tokens"))
    rows.append(("eager share", f"workload traffic: {share.describe()}"))
    width = max(len(k) for k, _ in rows)
    lines: list[str] = []
    for key, value in rows:
        lines += _pair_lines(value, q, width) if isinstance(value, list) else [f"{key:<{width}}  {value}"]
    return "\n".join(lines)


def _pair_lines(batch_sizes: list[int], q: int, width: int, per_line: int = 14) -> list[str]:
    """Batch sizes (requests) with their token widths under them, in aligned rows."""
    out = []
    for i in range(0, len(batch_sizes), per_line):
        chunk = batch_sizes[i:i + per_line]
        out.append(f"{'  requests':<{width}}  " + " ".join(f"{b:>6}" for b in chunk))
        out.append(f"{'  tokens':<{width}}  " + " ".join(f"{b * q:>6}" for b in chunk))
    return out
