"""The words cgtune uses for a vLLM 0.34 workload (`Vllm034Engine.report_words`): 0.33's (`tuner.report.vllm_words`,
which ask the engine for its lists' words and log lines) but for what 0.34 changed: two lists in `cgtune defaults`,
the KV cache sized after capture in the memory rule, and the release in the header."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from tuner.engines.vllm.v034.defaults import WIDE_PREFILL_TOKENS, SplitSizes, decode_shapes
from tuner.engines.vllm.v034.dispatch import split_keys
from tuner.report import vllm_words
from tuner.report.text import GIB, mem_text, memory_unit
from tuner.report.vllm_words import (  # noqa: F401 - the words 0.34 shares with 0.33, re-exported
    console_lines,
    decision_lines,
    drafter_lines,
    files_line,
    files_shipped_line,
    keep_default_kv_utilization,
    list_lines,
    side_by_side_lines,
    vllm_log_lines,
    what_changed_lines,
)

if TYPE_CHECKING:
    from tuner.engines.engine import Engine
    from tuner.model.costmodel import CostModel, Evaluation
    from tuner.workload.spec import Workload

__all__ = [*vllm_words.__all__]


def figures(model: CostModel, e: Evaluation) -> dict[str, Any]:
    """summary.json figures of one list beyond every engine's: its two lists under 0.34's names (its keys, in
    `capture_sizes`, hold the decode request counts negated)."""
    prefill, decode = split_keys(e.capture_sizes)
    return {"decode_cudagraph_capture_request_sizes": decode, "prefill_cudagraph_capture_token_sizes": prefill}


def provenance_line(model: CostModel) -> str:
    return (f"- {model.engine.release_words}, model runner **V2** ({model.engine.runner_reason}); cudagraph_mode "
            f"{model.cudagraph_mode}; two lists: decode graphs by request count, prefill graphs by token count")


def summary_block(model: CostModel, table: dict[str, Evaluation], *,
                  shipped: tuple[str, Evaluation] | None = None) -> dict[str, Any]:
    """summary.json's vLLM fields: the release, the KV rule's figures, the predicted log lines of the list shipped."""
    b, d = model.budget, table["default"]
    name, t = vllm_words._shipped(table, shipped)
    keep = keep_default_kv_utilization(model, d, t)
    out: dict[str, Any] = {"vllm_version": model.engine.version, "vllm_version_why": model.serving.vllm_version_why,
                           "gpu_memory_utilization": b.gpu_memory_utilization,
                           # None: no utilization keeps it (the device's margin would have to go)
                           "gpu_memory_utilization_to_keep_default_kv": keep if math.isfinite(keep) else None,
                           "vllm_log_lines": vllm_log_lines(model, t), "vllm_log_lines_list": name}
    if model.engine.extensible:
        out["kv_sized_after_capture"] = True
        out["real_budget_bytes"] = b.real_budget_bytes()
    else:
        out["estimate_budget_bytes"] = b.estimate_budget_bytes
    return out


def memory_rule_lines(model: CostModel, table: dict[str, Evaluation]) -> list[str]:
    """0.34's KV rule in words, with this budget's numbers."""
    if not model.engine.extensible:
        return vllm_words.memory_rule_lines(model, table)
    b = model.budget
    return [
        f"- KV cache, as vLLM 0.34 sizes it after capturing the graphs (extensible KV cache): the least of requested "
        f"{mem_text(model, b.requested_bytes)} (gpu_memory_utilization {b.gpu_memory_utilization} of "
        f"{mem_text(model, b.total_memory_bytes)}) and the device less its {mem_text(model, b.margin_bytes)} margin, "
        f"minus non-KV memory {mem_text(model, b.non_kv_cache_bytes)}, minus the REAL graph pool (no estimate is "
        f"made); required {mem_text(model, b.required_kv_bytes)}, so the real pool may be at most "
        f"{mem_text(model, b.real_budget_bytes())}",
        "- words used below: **vLLM estimate** = 0 (0.34 measures the graphs instead); **real pool** = the memory the "
        "capture really takes (predicted), which the KV cache loses; **KV margin** = KV cache minus the required. "
        f"{memory_unit(model)[1]} = 2^{30 if memory_unit(model)[0] == GIB else 20} bytes.",
    ]


def _decode_sizes_text(engine: Engine, split: SplitSizes) -> str:
    """The decode request sizes and the graphs they make at q: up to the first size at or above max_num_batched_tokens
    (or the decode token budget) / q, that one captured at the limit, none above it."""
    q, sizes = engine.decode_query_len, split.decode_request_sizes
    top = max(sizes, default=0)
    budget = min(engine.serving.max_num_batched_tokens, split.max_decode_tokens or engine.serving.max_num_batched_tokens)
    graphs = [n for n, ql in decode_shapes(sizes, {q: engine.serving.max_num_seqs}, budget) if ql == q]
    if max(graphs, default=0) == top:
        return f"{len(sizes)} graphs per query length, max {top} requests ({top * q} tokens at q = {q})"
    bound = (f"max_num_batched_tokens {engine.serving.max_num_batched_tokens}"
             if budget == engine.serving.max_num_batched_tokens else f"max_decode_cudagraph_capture_tokens {budget}")
    return (f"{len(sizes)} sizes, max {top} requests; {len(graphs)} graphs at q = {q}, up to {max(graphs, default=0)} "
            f"requests ({max(graphs, default=0) * q} tokens: {bound}), none above")


def defaults_text(engine: Engine, workload: Workload | None, *, as_json: bool) -> str:
    """`cgtune defaults` for a vLLM 0.34 serving config: both lists as 0.34 resolves them, the record, the decode
    widths without a graph, the eager share."""
    result = engine.defaults()
    split = result.split
    report = vllm_words._VllmReport.of(engine, workload, result)
    if as_json:
        return json.dumps({
            "vllm_version": engine.version,
            "decode_cudagraph_capture_request_sizes": split.decode_request_sizes,
            "max_decode_cudagraph_capture_requests": max(split.decode_request_sizes, default=0),
            "prefill_cudagraph_capture_token_sizes": split.prefill_token_sizes,
            "max_prefill_cudagraph_capture_tokens": max(split.prefill_token_sizes, default=0),
            "max_decode_cudagraph_capture_tokens": split.max_decode_tokens,
            "cudagraph_capture_sizes": split.record, "max_cudagraph_capture_size": split.max_record,
            "cudagraph_mode": split.cudagraph_mode, "wide_defaults": split.wide_defaults,
            "draft_decode_request_sizes": split.draft_decode_request_sizes,
            "uniform_decode_sizes_without_graph": result.uniform_decode_sizes_without_graph,
            **report.as_dict(),
        })
    s, q = engine.serving, engine.decode_query_len
    mnbt = s.max_num_batched_tokens
    rows = [
        ("vLLM", f"0.34 (model runner V2); cudagraph_mode {split.cudagraph_mode}"),
        ("max_num_seqs x q", f"{s.max_num_seqs} x {q} = {s.max_num_seqs * q} tokens (widest uniform decode batch)"
         if s.max_num_seqs * q <= mnbt else
         f"{s.max_num_seqs} x {q} = {s.max_num_seqs * q} tokens, above max_num_batched_tokens {mnbt}: the widest "
         f"uniform decode batch is {mnbt // q} x {q} = {mnbt // q * q} tokens"),
        ("defaults", f"SM100 wide defaults (compute capability 10.x): prefill to {min(WIDE_PREFILL_TOKENS, mnbt)} "
                     f"tokens, decode to max_num_seqs within {min(split.max_decode_tokens or mnbt, mnbt)} tokens"
         if split.wide_defaults else ("from the deprecated cudagraph_capture_sizes / max_cudagraph_capture_size"
                                      if split.legacy else "0.33's grid, split (off SM100)")),
        ("decode request sizes", _decode_sizes_text(engine, split)),
    ]
    width = max(len(k) for k, _ in rows + [("prefill token sizes", "")])
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    lines += vllm_words._size_lines(split.decode_request_sizes, width)
    lines.append(f"{'prefill token sizes':<{width}}  {len(split.prefill_token_sizes)} graphs, max "
                 f"{max(split.prefill_token_sizes, default=0)} tokens")
    lines += vllm_words._size_lines(split.prefill_token_sizes, width)
    if split.draft_decode_request_sizes:
        lines.append(f"{'drafter decode sizes':<{width}}  {len(split.draft_decode_request_sizes)} one-token graphs "
                     f"(request counts up to {max(split.draft_decode_request_sizes)})")
    lines.append(f"{'record':<{width}}  cudagraph_capture_sizes as 0.34 records them: {len(split.record)} token "
                 f"counts, max {split.max_record}")
    lines += report.deployment_lines(width)
    lines.append(f"{'decode widths eager':<{width}}  {vllm_words._ranges(result.uniform_decode_sizes_without_graph)}")
    lines.append(f"{'eager share':<{width}}  {report.traffic}: {report.share.describe()}")
    lines += [f"{'warning':<{width}}  {w}" for w in result.warnings]
    return "\n".join(lines)
