"""Render the parts of a run's report that differ for an SGLang or TensorRT-LLM workload: lists in the engine's unit
(requests, token widths beside), the engine's memory rule in words, its files, and summary.json's engine fields."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tuner import decision
from tuner.compare import (LIST_SAVING_SHARE, feasible_cell, kv_tokens, list_label, listed_and_rest, max_concurrency,
                           what_changed)
from tuner.engines import ENGINE_FILES, ENGINE_LABELS, TRTLLM_NEEDS_SPECULATIVE_MODEL
from tuner.plots import memory_unit

if TYPE_CHECKING:
    from tuner.costmodel import CostModel, Evaluation

__all__ = [
    "decision_lines",
    "default_name",
    "engine_summary",
    "figures",
    "files_line",
    "list_lines",
    "memory_rule_lines",
    "provenance_line",
    "provenance_notes",
    "side_by_side_lines",
    "what_changed_lines",
]

MIB = 1 << 20


def _mem(model: CostModel, x: float) -> str:
    unit, name = memory_unit(model)
    return f"{x / unit:.3f} {name}"


def _num(model: CostModel, x: float) -> str:
    return f"{x / memory_unit(model)[0]:.3f}"


def default_name(model: CostModel) -> str:
    """`vLLM's default`, `SGLang's default` or `TensorRT-LLM's default`."""
    return f"{ENGINE_LABELS[model.serving.engine]}'s default"


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
    s = model.serving
    e = s.engine_settings
    assert e is not None
    if e.engine == "sglang":
        what = (f"SGLang 0.5.23: decode graphs by batch size (requests), each holding bs x {model.q} tokens; mixed "
                f"and prefill steps run without a decode graph")
    else:
        what = (f"TensorRT-LLM (PyTorch backend): batch sizes in requests, each graph holding bs x {model.q} tokens, "
                f"enable_padding {str(e.enable_padding).lower()}"
                + ("" if e.enable_padding else " (only exactly captured sizes replay)")
                + "; steps with context requests run without a graph")
    return f"- engine: {what}"


def memory_rule_lines(model: CostModel, table: dict[str, Evaluation]) -> list[str]:
    """The engine's KV rule in words, with this budget's numbers (the `tuner.engines` KV rules)."""
    b: Any = model.budget
    e = model.serving.engine_settings
    assert e is not None
    if e.engine == "sglang":
        d, t = table["default"], table["tuned"]
        if e.mem_fraction_static is not None:
            fraction = (f"mem_fraction_static {e.mem_fraction_static} (set in the workload: the list never moves the "
                        f"KV cache, bigger lists only eat the slack)")
        else:
            fraction = (f"SGLang's automatic mem_fraction_static: {b.fraction(_top(model, d))} for the default list's "
                        f"max ({_top(model, d)} requests), {b.fraction(_top(model, t))} for the tuned list's "
                        f"({_top(model, t)}); only max(bs) moves it (2 MiB of reserve per request of max(bs), rounded "
                        f"to 0.001, and not while its 10 GiB floor binds), the number of graphs does not")
        rule = (f"- KV cache, as SGLang sizes it: BEFORE capturing, total {_mem(model, b.total_memory_bytes)} x "
                f"mem_fraction_static minus weights {_mem(model, b.weights_bytes)}; the graphs and the activations "
                f"({_mem(model, b.activation_bytes)}) must fit in the slack, total x (1 - mem_fraction_static); "
                f"{fraction}; required KV {_mem(model, b.required_kv_bytes)}")
        headroom = "slack - activations - real pool"
    else:
        f = b.free_gpu_memory_fraction
        rule = (f"- KV cache, as TensorRT-LLM sizes it: its graphs are captured BEFORE the KV cache is sized (an "
                f"estimation run), so KV = free_gpu_memory_fraction {f} x (total {_mem(model, b.total_memory_bytes)} "
                f"- peak without graphs {_mem(model, b.non_kv_cache_bytes)} - real pool): each graph costs {f} x its "
                f"memory in KV; required KV {_mem(model, b.required_kv_bytes)}, so the real pool may be at most "
                f"{_mem(model, max(0, b.real_budget_bytes()))}")
        headroom = "total - peak without graphs - real pool"
    unit, name = memory_unit(model)
    return [
        rule,
        f"- words used below: **real pool** = the memory the engine's graphs take (predicted; "
        f"{ENGINE_LABELS[e.engine]} makes no estimate before capturing); **KV cache** = what the engine allocates; "
        f"**KV margin** = KV cache minus the required; **capture headroom** = {headroom} (< 0: the capture runs "
        f"out of memory). {name} = 2^{30 if unit == 1 << 30 else 20} bytes.",
    ]


def decision_lines(model: CostModel, table: dict[str, Evaluation], source: str) -> list[str]:
    """The decision in the engine's unit, before the lines on how the list was found (`source`: the search's)."""
    d, t = table["default"], table["tuned"]
    name, engine = default_name(model), ENGINE_LABELS[model.serving.engine]
    lines = [f"Tuned list ({source}): {len(t.capture_sizes)} graphs, batch sizes (requests) "
             f"`{_requests(model, t.capture_sizes)}`, token widths `{list(t.capture_sizes)}`", ""]
    if t.runs_as != t.capture_sizes:
        lines += [f"**It runs as a different list**: {engine} captures batch sizes `{_requests(model, t.runs_as)}`; "
                  f"every figure below is for the list that runs.", ""]
    change = t.expected_step_ms / d.expected_step_ms - 1 if d.expected_step_ms > 0 else 0.0
    lines.append(
        f"Expected step latency {t.expected_step_ms:.4f} ms vs {d.expected_step_ms:.4f} ms with {name} "
        f"({len(d.runs_as)} graphs, max {_top(model, d)} requests; {abs(change):.1%} "
        f"{'lower' if change <= 0 else 'higher'}). Real graph pool {_mem(model, t.graph_memory_bytes)} vs "
        f"{_mem(model, d.graph_memory_bytes)}. KV cache {_mem(model, t.kv_available_bytes)} ({kv_tokens(model, t):,} "
        f"tokens, max concurrency {max_concurrency(model, t):.2f}x) vs {_mem(model, d.kv_available_bytes)} "
        f"({kv_tokens(model, d):,} tokens, {max_concurrency(model, d):.2f}x); KV margin "
        f"{_mem(model, t.kv_margin_bytes)}, capture headroom {_mem(model, t.capture_headroom_bytes)}.")
    if not d.feasible:
        lines.append(f"{name} does not fit this budget ({d.why_infeasible}); the tuned list does"
                     + ("." if t.feasible else " not either."))
    return lines


def what_changed_lines(model: CostModel, table: dict[str, Evaluation]) -> list[str]:
    """Batch sizes added and removed against the engine's default (as the engine captures both lists), and what each
    one added above the default's max costs and saves."""
    d, t = table["default"], table["tuned"]
    c = what_changed(model, d, t)
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


def side_by_side_lines(model: CostModel, table: dict[str, Evaluation]) -> list[str]:
    """The comparison table in the engine's unit (no estimate column: the engine makes none)."""
    u = memory_unit(model)[1]
    engine = model.serving.engine
    lines = [
        f"## Side by side (same profile, {ENGINE_LABELS[engine]}'s memory rule)",
        "",
        f"| list | graphs | max (requests) | max (tokens) | runs as | expected step (ms) | per token (ms) "
        f"| real pool ({u}) | KV cache ({u}) | KV tokens | max concurrency | KV margin ({u}) | capture headroom ({u}) "
        f"| capture (s) | feasible |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, e in table.items():
        feasible = feasible_cell(name, e)
        top = e.capture_sizes[-1] if e.capture_sizes else 0
        runs = "same" if e.runs_as == e.capture_sizes else (
            f"{len(e.runs_as)} graphs, max {_top(model, e)} requests" if e.runs_as else "nothing")
        lines.append(
            f"| {list_label(name, engine)} | {len(e.capture_sizes)} | {-(-top // model.q)} | {top} | {runs} "
            f"| {e.expected_step_ms:.4f} | {e.per_token_ms:.5f} | {_num(model, e.graph_memory_bytes)} "
            f"| {_num(model, e.kv_available_bytes)} | {kv_tokens(model, e):,} | {max_concurrency(model, e):.2f} "
            f"| {_num(model, e.kv_margin_bytes)} | {_num(model, e.capture_headroom_bytes)} "
            f"| {decision.capture_cell(model, e)} | {feasible} |")
    lines += ["", *decision.no_graphs_lines(model), f"The ideal row captures every token width a step has (not only "
              f"multiples of {model.q}): a bound, not a list {ENGINE_LABELS[engine]} can run. Capture (s): the "
              f"profile's capture seconds summed over the graphs the list creates.", ""]
    return lines


def list_lines(model: CostModel, table: dict[str, Evaluation]) -> list[str]:
    """Each list in requests with its token widths beside."""
    engine = model.serving.engine
    out = []
    for name, e in table.items():
        if name == "ideal":
            continue
        out.append(f"- {list_label(name, engine)}: {_pairs(model, e.capture_sizes)}"
                   + ("" if e.runs_as == e.capture_sizes else f" (captured as {_pairs(model, e.runs_as)})"))
    return out


def files_line(model: CostModel) -> str:
    """What the run directory holds for the engine."""
    e = model.serving.engine_settings
    assert e is not None
    files = ENGINE_FILES[e.engine]
    if e.engine == "sglang":
        return (f"Files: `{files[0]}` (append its last line to `sglang serve --model-path MODEL`: "
                f"`--max-running-requests {model.serving.max_num_seqs} --cuda-graph-bs-decode ...`), `{files[1]}` "
                f"(the same list for `--cuda-graph-config`), `summary.json`.")
    return (f"Files: `{files[0]}` (`trtllm-serve MODEL --extra_llm_api_options {files[0]}`), `summary.json`.")


def provenance_notes(model: CostModel) -> dict[str, str]:
    """Extra comment lines for the engine's files: what the user must still add."""
    e = model.serving.engine_settings
    if e is not None and e.engine == "trtllm" and e.decoding_type in TRTLLM_NEEDS_SPECULATIVE_MODEL:
        return {"note": f"add speculative_config.speculative_model (the {e.decoding_type} draft checkpoint): "
                        f"TensorRT-LLM refuses {e.decoding_type} without it, and cgtune does not know it"}
    return {}


def figures(model: CostModel, e: Evaluation) -> dict[str, Any]:
    """summary.json figures of one list that only an engine workload has: the list in requests."""
    return {"batch_sizes": _requests(model, e.capture_sizes), "runs_as_batch_sizes": _requests(model, e.runs_as),
            "vllm_graph_estimate_bytes": None, "vllm_graph_estimate_profiled_bytes": None}


def engine_summary(model: CostModel, table: dict[str, Evaluation]) -> dict[str, Any]:
    """summary.json's engine block and its memory rule (in place of vLLM's estimate, log lines and
    gpu_memory_utilization)."""
    b: Any = model.budget
    e = model.serving.engine_settings
    assert e is not None
    block: dict[str, Any] = {
        "name": e.engine, "unit": "requests", "tokens_per_request": model.q,
        "files": list(ENGINE_FILES[e.engine]),
        "batch_sizes": _requests(model, table["tuned"].capture_sizes),
    }
    if e.engine == "sglang":
        block.update({"mem_fraction_static": e.mem_fraction_static,
                      "mem_fraction_static_used": b.fraction(_top(model, table["tuned"])),
                      "mem_fraction_static_default_list": b.fraction(_top(model, table["default"])),
                      "weights_bytes": b.weights_bytes, "activation_bytes": b.activation_bytes})
    else:
        block.update({"enable_padding": e.enable_padding, "free_gpu_memory_fraction": e.free_gpu_memory_fraction,
                      "decoding_type": e.decoding_type, "real_pool_budget_bytes": b.real_budget_bytes()})
    return {"engine": block, "model_runner": None, "runner_reason": f"{ENGINE_LABELS[e.engine]} has no runner choice"}
