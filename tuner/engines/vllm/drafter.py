"""vLLM 0.33's speculative-decoding drafter rules: the graphs a drafter captures, the passes a step runs and what
the drafter adds to KV cache and weights (read from `reference/vllm-drafter-facts.md`; pure rules, no device)."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tuner.engines.vllm.defaults import CUDAGRAPH_MODES
from tuner.engines.vllm.dispatch import Dispatcher, manager_graphs, mode_parts
from tuner.shapes import DTYPE_BYTES, ModelShape

__all__ = [
    "EAGLE_METHODS",
    "DRAFT_CHECKPOINT_METHODS",
    "MODEL_BASED_METHODS",
    "MODEL_FREE_METHODS",
    "PARALLEL_DRAFTING_METHODS",
    "RUNNERS",
    "SPECULATIVE_METHODS",
    "DrafterGraph",
    "DrafterPass",
    "EagerDrafterPasses",
    "capture_sequence",
    "drafter_graphs",
    "drafter_graphs_apart",
    "drafter_kv_bytes_per_token",
    "drafter_kv_layers",
    "drafter_pass_widths",
    "drafter_passes",
    "drafter_shares",
    "drafter_weight_bytes",
    "eager_drafter_passes",
    "spans",
    "sweep_capture_sequence",
    "v1_only",
]

EAGLE_METHODS = ("eagle", "eagle3", "mtp")
"""Methods drafted autoregressively from the target's hidden states (V2 `TargetDependentARSpeculator`)."""
MODEL_BASED_METHODS = (*EAGLE_METHODS, "dflash", "draft_model")
"""Methods with a draft model of their own: its own forward passes, KV layers and (possibly) graphs (facts §1)."""
DRAFT_CHECKPOINT_METHODS = (*MODEL_BASED_METHODS, "custom_class")
"""Methods whose speculative config names a checkpoint (`SpeculativeConfig.model`; custom_class: its proposer's
module); vLLM defaults it to the target for mtp only."""
PARALLEL_DRAFTING_METHODS = ("eagle", "eagle3", "draft_model", "dflash", "dspark")
"""Methods that may draft all K tokens in one pass (`SpeculativeConfig.parallel_drafting`: "Only compatible with EAGLE
and draft model methods"; DFlash and DSpark always do)."""
MODEL_FREE_METHODS = ("ngram", "ngram_gpu", "suffix", "custom_class")
"""Methods without a draft model: no drafter graphs, passes or KV (facts §1)."""
SPECULATIVE_METHODS = (*MODEL_BASED_METHODS, *MODEL_FREE_METHODS)
"""Every method this module models. Not modelled: dspark (its query length depends on anchor sampling) and
extract_hidden_states (its V1 graph sizes and passes are not in the facts file)."""
RUNNERS = ("v1", "v2")
"""vLLM's model runners: `v2` (Model Runner V2, the default) and `v1` (the fallback)."""

# Methods that force the V1 runner, and those that may draft in parallel on V2 (facts §0, config/vllm.py:3053-3087).
_V1_ONLY_METHODS = ("suffix", "custom_class")
_V2_PARALLEL_METHODS = ("dflash", "dspark")


@dataclass(frozen=True)
class DrafterGraph:
    """One CUDA graph the drafter captures into the shared pool."""

    mode: str
    """`FULL` or `PIECEWISE`."""
    num_tokens: int
    """Width the graph is captured at (tokens)."""
    role: str
    """What replays it: `prefill` (V2 draft step 0), `decode` (V2 draft steps 1..K-1), `query` (DFlash),
    `pass` (every V1 pass of EAGLE/MTP/draft_model; the V2 multi-module MTP graph)."""
    uniform_query_len: int | None = None
    """Tokens per request of a FULL uniform-batch graph (its requests = num_tokens / this); None otherwise."""
    num_draft_steps: int = 1
    """Draft steps one replay runs: K-1 (or k-1 per dynamic tier) for a fused V2 decode graph, K for multi-module
    MTP, else 1."""


@dataclass(frozen=True)
class DrafterPass:
    """One drafter forward pass of an engine step and how vLLM dispatches it."""

    role: str
    """`prefill` (draft step 0), `decode` (steps 1..K-1), `parallel` (P-EAGLE/PARD single pass), `context`
    (DFlash context-KV precompute, eager), `query` (DFlash query pass), `pass` (V2 multi-module MTP)."""
    num_tokens: int
    """Rows the pass processes before the drafter's own padding (tokens)."""
    runtime_mode: str
    """`FULL`, `PIECEWISE` or `NONE` (eager: no graph)."""
    padded_size: int | None
    """Width of the graph replayed; None when eager."""
    repeats: int = 1
    """How many times the pass runs this step (e.g. K-1 decode steps)."""
    fused: bool = False
    """One FULL replay runs all `repeats` steps (V2 fused decode, multi-module MTP) instead of one replay each."""


@dataclass(frozen=True)
class EagerDrafterPasses:
    """Drafter passes of one role that run without a graph over a workload's uniform decode steps."""

    role: str
    """The pass's role (see `DrafterPass.role`)."""
    request_counts: tuple[int, ...]
    """Decode batches (requests N) whose pass of this role runs eager, ascending."""
    widths: tuple[int, ...]
    """The eager passes' widths (tokens), ascending and unique."""

    def describe(self, method: str, runner: str) -> str:
        """One line for `cgtune defaults`, e.g. `v2 eagle decode passes at N = 17..20 (17..20 tokens) run eager`."""
        return (
            f"{runner} {method} {self.role} passes at N = {spans(self.request_counts)} "
            f"({spans(self.widths)} tokens) run eager"
        )


def spans(values: Sequence[int]) -> str:
    """`1..4, 7, 9..10` for [1, 2, 3, 4, 7, 9, 10] (consecutive runs; "" for none)."""
    parts: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        parts.append(str(values[i]) if i == j else f"{values[i]}..{values[j]}")
        i = j + 1
    return ", ".join(parts)


def _check_method(method: str) -> None:
    if method not in SPECULATIVE_METHODS:
        raise ValueError(f"method={method!r} must be one of {', '.join(SPECULATIVE_METHODS)}")


def _check_runner(runner: str) -> None:
    if runner not in RUNNERS:
        raise ValueError(f"runner={runner!r} must be one of {', '.join(RUNNERS)}")


def v1_only(method: str, *, parallel_drafting: bool = False) -> bool:
    """Whether vLLM 0.33 falls back to the V1 runner for this speculative setup: suffix and custom_class, and
    parallel drafting with a method other than dflash/dspark (P-EAGLE, PARD); facts §0, config/vllm.py:3053-3087."""
    _check_method(method)
    return method in _V1_ONLY_METHODS or (parallel_drafting and method not in _V2_PARALLEL_METHODS)


def _check_common(
    method: str, runner: str, capture_sizes: Sequence[int], cudagraph_mode: str, num_speculative_tokens: int,
    max_num_seqs: int, parallel_drafting: bool,
) -> list[int]:
    """Validates what every rule needs; returns the capture sizes ascending and unique."""
    _check_method(method)
    _check_runner(runner)
    if cudagraph_mode not in CUDAGRAPH_MODES:
        raise ValueError(f"cudagraph_mode={cudagraph_mode!r} must be one of {', '.join(CUDAGRAPH_MODES)}")
    if runner == "v2" and v1_only(method, parallel_drafting=parallel_drafting):
        how = " with parallel drafting" if method not in _V1_ONLY_METHODS else ""
        raise ValueError(f"runner='v2' does not run method={method!r}{how}: vLLM 0.33 falls back to v1")
    if num_speculative_tokens < 0:
        raise ValueError(f"num_speculative_tokens={num_speculative_tokens} must be >= 0")
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs={max_num_seqs} must be >= 1")
    bad = [s for s in capture_sizes if s < 1]
    if bad:
        raise ValueError(f"capture_sizes holds {bad[0]}: every size must be >= 1")
    return sorted(set(capture_sizes))


def _pad(sizes: Sequence[int], num_tokens: int) -> int | None:
    """Smallest size >= num_tokens in ascending `sizes`, None above the largest."""
    i = bisect.bisect_left(sizes, num_tokens)
    return sizes[i] if i < len(sizes) else None


def _v2_manager_graphs(
    sizes: list[int], cudagraph_mode: str, decode_query_lens: Sequence[int], max_decode_tokens: int,
    max_num_seqs: int, role: str,
) -> list[DrafterGraph]:
    """The descriptors one V2 speculator `CudaGraphManager` captures, in its capture order (`manager_graphs`)."""
    return [DrafterGraph(mode, width, role, uniform_query_len=ql)
            for mode, width, ql in manager_graphs(sizes, cudagraph_mode, decode_query_lens, max_decode_tokens,
                                                  max_num_seqs)]


def _decode_mode(cudagraph_mode: str) -> str:
    return mode_parts(cudagraph_mode)[0]


def _mixed_mode(cudagraph_mode: str) -> str:
    return mode_parts(cudagraph_mode)[1]


def _tiers(num_speculative_tokens: int, ks: Sequence[int] | None) -> list[int]:
    """The decode query lengths a V2 manager at query length K+1 captures FULL graphs for: K+1, or under a dynamic
    schedule `1 + k` for every k of its dense lookup (cudagraph_utils.py `_init_candidates`)."""
    return [num_speculative_tokens + 1] if ks is None else sorted({k + 1 for k in ks})


def _check_dynamic_ks(dynamic_ks: Iterable[int] | None, max_k: int | None = None) -> list[int] | None:
    """The dynamic schedule's k values, ascending; each within 0..max_k (the configured K) when given."""
    if dynamic_ks is None:
        return None
    ks = sorted(set(dynamic_ks))
    if not ks or ks[0] < 0 or (max_k is not None and ks[-1] > max_k):
        raise ValueError(f"dynamic_ks={ks} must be non-empty, each k within 0..{max_k if max_k is not None else 'K'}")
    return ks


def _check_multi_module(method: str, multi_module_mtp: bool) -> None:
    if multi_module_mtp and method != "mtp":
        raise ValueError(f"multi_module_mtp=True needs method='mtp', not {method!r}")


def _v1_graph_sizes(
    method: str, sizes: list[int], cudagraph_mode: str, num_speculative_tokens: int, max_num_seqs: int,
    speculative_enforce_eager: bool,
) -> list[int]:
    """V1 drafter PIECEWISE graph widths, largest first (facts §2a). The drafter captures only inside a PIECEWISE
    target capture (gpu_model_runner.py:5794-5837), so none under FULL_DECODE_ONLY (mixed NONE) or pure FULL (no
    piecewise wrappers, facts §2a/§8: inferred), and none with speculative_config.enforce_eager."""
    if speculative_enforce_eager or _mixed_mode(cudagraph_mode) != "PIECEWISE":
        return []
    if method != "dflash":
        return sizes[::-1]
    # DFlash captures at pad(min(s, R*(K+1))) (dflash.py:40-46, 229-234): nothing beyond the widest query.
    cap = max_num_seqs * (num_speculative_tokens + 1)
    return list(dict.fromkeys(_pad(sizes, min(s, cap)) for s in reversed(sizes)))


def drafter_graphs(
    method: str,
    *,
    runner: str,
    capture_sizes: Sequence[int],
    cudagraph_mode: str,
    num_speculative_tokens: int,
    max_num_seqs: int,
    dynamic_ks: Iterable[int] | None = None,
    multi_module_mtp: bool = False,
    speculative_enforce_eager: bool = False,
    fused_decode: bool = True,
) -> list[DrafterGraph]:
    """The graphs the drafter captures, in capture order (facts §2a, §2b, §5).

    `capture_sizes` are the sizes that RUN (the caller applies V1's spec-decode rewrite first) and
    `cudagraph_mode` the resolved mode (V1 forces PIECEWISE under a dynamic schedule; the caller applies that).
    `dynamic_ks`: the k values of a dynamic schedule (vLLM's dense lookup), None without one.
    `fused_decode`: every draft attention backend updates metadata in place (FlashAttention, Triton, FlashInfer),
    so V2 captures one graph for all K-1 decode steps. `speculative_enforce_eager` acts on V1 only (facts §6)."""
    sizes = _check_common(method, runner, capture_sizes, cudagraph_mode, num_speculative_tokens, max_num_seqs, False)
    ks = _check_dynamic_ks(dynamic_ks, num_speculative_tokens)
    _check_multi_module(method, multi_module_mtp)
    k_max = num_speculative_tokens
    if method in MODEL_FREE_METHODS or cudagraph_mode == "NONE" or k_max == 0:
        return []
    if runner == "v1":
        role = "query" if method == "dflash" else "pass"
        widths = _v1_graph_sizes(method, sizes, cudagraph_mode, k_max, max_num_seqs, speculative_enforce_eager)
        return [DrafterGraph("PIECEWISE", s, role) for s in widths]
    if method == "draft_model":  # V2 StandaloneARSpeculator: capture is a no-op (standalone_ar/speculator.py:67-71)
        return []
    q = k_max + 1
    tiers = _tiers(k_max, ks)
    if not manager_graphs(sizes, cudagraph_mode, tiers, max_num_seqs * q, max_num_seqs):
        # The target captures nothing (FULL_DECODE_ONLY with no decode graph left): V2's capture_model returns
        # before the speculator captures (model_runner.py:1086-1100).
        return []
    full_decode = _decode_mode(cudagraph_mode) == "FULL"
    if method == "dflash" or (method == "mtp" and multi_module_mtp):
        # One FULL_DECODE_ONLY manager at query length K+1 (its FULL graphs per dynamic tier, as any manager's), or
        # nothing without a FULL decode mode (dflash/speculator.py:143-188; multi_module_mtp/speculator.py:99-115).
        if not full_decode:
            return []
        role, steps = ("query", 1) if method == "dflash" else ("pass", k_max)
        graphs = _v2_manager_graphs(sizes, "FULL_DECODE_ONLY", tiers, max_num_seqs * q, max_num_seqs, role)
        return [DrafterGraph(g.mode, g.num_tokens, g.role, g.uniform_query_len, steps) for g in graphs]
    # EAGLE/EAGLE3/MTP: the prefill manager is the target's own descriptor set at query length K+1, one FULL
    # set per dynamic tier (cudagraph_utils.py:274-300); the decode manager is FULL_DECODE_ONLY at query
    # length 1, i.e. {s in S: s <= R} (target_dependent_ar/speculator.py:89-107).
    graphs = _v2_manager_graphs(sizes, cudagraph_mode, tiers, max_num_seqs * q, max_num_seqs, "prefill")
    if k_max == 1 or not full_decode:  # K == 1: no decode steps, capture returns before the decode manager
        return graphs
    if fused_decode and ks is not None:
        # Fused graphs are specialised per k in set(schedule) - {0, 1}, largest k first within each width
        # (target_dependent_ar/cudagraph_utils.py:37-75).
        steps_per_graph = [k - 1 for k in sorted(set(ks) - {0, 1}, reverse=True)]
    else:
        steps_per_graph = [k_max - 1 if fused_decode else 1]
    decode = _v2_manager_graphs(sizes, "FULL_DECODE_ONLY", [1], max_num_seqs, max_num_seqs, "decode")
    return graphs + [
        DrafterGraph(g.mode, g.num_tokens, g.role, g.uniform_query_len, steps)
        for g in decode
        for steps in steps_per_graph
    ]


def capture_sequence(
    *, runner: str, target_graphs: Sequence[tuple[str, int]], drafter: Sequence[DrafterGraph]
) -> list[tuple[str, str, int]]:
    """`(owner, mode, width)` in the order graphs enter the ONE shared pool (facts §2a, §2b).

    V2: every target graph (PIECEWISE then FULL, largest first), then the speculator's in its own order.
    V1: the drafter captures inside the target's PIECEWISE captures (largest first): right after the target's
    PIECEWISE graph of width s comes the drafter's graph for s, the largest drafter width <= s not yet captured
    (s itself, or DFlash's cap pad(R*(K+1))); during FULL captures the drafter runs eager."""
    _check_runner(runner)
    for mode, width in target_graphs:
        if mode not in ("FULL", "PIECEWISE") or width < 1:
            raise ValueError(f"target graph ({mode!r}, {width}) must be ('FULL' or 'PIECEWISE', width >= 1)")
    target = sorted(target_graphs, key=lambda g: (g[0] != "PIECEWISE", -g[1]))
    if runner == "v2":
        return [("target", m, w) for m, w in target] + [("drafter", g.mode, g.num_tokens) for g in drafter]
    if any(g.mode != "PIECEWISE" for g in drafter):
        raise ValueError("runner='v1': drafter graphs must all be PIECEWISE")
    widths = sorted({g.num_tokens for g in drafter})
    captured: set[int] = set()
    out: list[tuple[str, str, int]] = []
    for mode, width in target:
        out.append(("target", mode, width))
        if mode != "PIECEWISE":
            continue
        i = bisect.bisect_right(widths, width)
        if i and widths[i - 1] not in captured:
            captured.add(widths[i - 1])
            out.append(("drafter", "PIECEWISE", widths[i - 1]))
    missing = sorted(set(widths) - captured)
    if missing:
        raise ValueError(f"runner='v1': drafter graph of width {missing[0]} has no target PIECEWISE capture")
    return out


def sweep_capture_sequence(
    *, runner: str, target_graphs: Sequence[tuple[str, int]], drafter: Sequence[DrafterGraph]
) -> list[tuple[str, str, int]]:
    """`capture_sequence` for a profile sweep, whose drafter may have widths the target has no graph of: on V1 each
    such width gets a place-holder target PIECEWISE capture for the rule to place its graph (where vLLM would put it
    had the target that width), dropped from the result."""
    placeholders: list[tuple[str, int]] = []
    if runner == "v1" and drafter:
        have = {w for m, w in target_graphs if m == "PIECEWISE"}
        placeholders = [("PIECEWISE", w) for w in sorted({g.num_tokens for g in drafter} - have)]
    order = capture_sequence(runner=runner, target_graphs=list(target_graphs) + placeholders, drafter=drafter)
    dropped = {("target",) + p for p in placeholders}
    return [g for g in order if g not in dropped]


def drafter_graphs_apart(runner: str) -> bool:
    """Whether the runner captures the drafter's graphs in a pass of their own after the target's (V2), rather than
    each right after a target PIECEWISE capture (V1)."""
    _check_runner(runner)
    return runner == "v2"


def drafter_pass_widths(method: str, *, runner: str, num_speculative_tokens: int, parallel_drafting: bool,
                        max_num_seqs: int, candidates: Sequence[int], runs: Sequence[int]) -> list[int]:
    """Widths the drafter's passes of N tokens (N = 1..max_num_seqs requests) run at, for a sweep to measure: on V2
    the candidates up to max_num_seqs (its decode graphs are the list's sizes <= max_num_seqs; other N run eager at
    N); on V1 the list members (`runs`, the list V1 rewrote) a pass of N <= max_num_seqs pads to. Empty for methods
    without such passes (DFlash, parallel drafting, K < 2)."""
    if not ((method in EAGLE_METHODS or method == "draft_model") and num_speculative_tokens >= 2
            and not parallel_drafting):
        return []
    if runner == "v1":
        top = next((w for w in runs if w >= max_num_seqs), max_num_seqs)
        return [w for w in runs if w <= top]
    return [w for w in candidates if w <= max_num_seqs]


def drafter_passes(
    method: str,
    *,
    runner: str,
    num_requests: int,
    num_tokens: int,
    uniform_decode: bool,
    capture_sizes: Sequence[int],
    cudagraph_mode: str,
    num_speculative_tokens: int,
    max_num_seqs: int,
    target_padded_size: int | None = None,
    parallel_drafting: bool = False,
    fused_decode: bool = True,
    disable_padded_drafter_batch: bool = False,
    first_pass_tokens: int | None = None,
    dynamic_ks: Iterable[int] | None = None,
    multi_module_mtp: bool = False,
    speculative_enforce_eager: bool = False,
) -> list[DrafterPass]:
    """The drafter forward passes one engine step runs and how each is dispatched (facts §3).

    `num_requests` (N) and `num_tokens` (T) describe the target's step; `uniform_decode`: every request has K+1
    tokens. `num_speculative_tokens` is the K this step drafts (a dynamic schedule's k for N; DFlash always
    drafts the schedule's maximum, so pass that). `target_padded_size`: the width the target ran at (V2 drafts
    at it); None computes it from the target's dispatch. `first_pass_tokens`: the V1 pass-1 width under
    `disable_padded_drafter_batch`, sum(accepted + 1) over the requests. Model-free methods run no passes."""
    sizes = _check_common(
        method, runner, capture_sizes, cudagraph_mode, num_speculative_tokens, max_num_seqs, parallel_drafting
    )
    ks = _check_dynamic_ks(dynamic_ks)  # K here is this step's k, so the schedule's maximum is not known
    _check_multi_module(method, multi_module_mtp)
    k, n, t = num_speculative_tokens, num_requests, num_tokens
    if not 1 <= n <= max_num_seqs:
        raise ValueError(f"num_requests={n} must be within 1..max_num_seqs={max_num_seqs}")
    if t < n:
        raise ValueError(f"num_tokens={t} must be >= num_requests={n}")
    if uniform_decode and method != "dflash" and t != n * (k + 1):
        raise ValueError(f"num_tokens={t} must be num_requests x (K+1) = {n * (k + 1)} for a uniform decode step")
    if uniform_decode and t % n:
        raise ValueError(f"num_tokens={t} must be a multiple of num_requests={n} for a uniform decode step")
    if method in MODEL_FREE_METHODS:
        return []
    if k == 0 and (parallel_drafting or not (method in EAGLE_METHODS or (runner == "v1" and method == "draft_model"))):
        # Facts §3 say what K == 0 runs only for these: V1's pass 1 (llm_base_proposer.py:616-626), V2 EAGLE's
        # prefill (target_dependent_ar/speculator.py:293-299).
        raise ValueError(f"num_speculative_tokens=0 is not modelled for method={method!r} on runner={runner!r}")
    if runner == "v1":
        return _v1_passes(
            method, sizes, n, t, k, cudagraph_mode, max_num_seqs, parallel_drafting, disable_padded_drafter_batch,
            first_pass_tokens, speculative_enforce_eager,
        )
    if ks is not None and method in EAGLE_METHODS and k not in ks:
        raise ValueError(f"num_speculative_tokens={k} is not a k of the dynamic schedule (dynamic_ks={ks})")
    return _v2_passes(
        method, sizes, n, t, uniform_decode, k, cudagraph_mode, max_num_seqs, target_padded_size, fused_decode,
        multi_module_mtp, ks,
    )


def _v1_passes(
    method: str, sizes: list[int], n: int, t: int, k: int, cudagraph_mode: str, max_num_seqs: int,
    parallel_drafting: bool, disable_padded: bool, first_pass_tokens: int | None, enforce_eager: bool,
) -> list[DrafterPass]:
    """V1: each pass dispatched on its own to a PIECEWISE graph at pad(width), eager above the largest
    (cudagraph_dispatcher.py:233-322); no drafter graphs means every pass runs eager."""
    graphs = sorted(_v1_graph_sizes(method, sizes, cudagraph_mode, k, max_num_seqs, enforce_eager))

    def run(role: str, width: int, repeats: int = 1) -> DrafterPass:
        padded = _pad(graphs, width)
        return DrafterPass(role, width, "NONE" if padded is None else "PIECEWISE", padded, repeats)

    if disable_padded and (method in ("draft_model", "dflash") or parallel_drafting):
        # llm_base_proposer.py:225-226, 328-334.
        how = "parallel drafting" if parallel_drafting else f"method={method!r}"
        raise ValueError(f"disable_padded_drafter_batch=True is rejected by vLLM with {how}")
    if method == "dflash":
        # Eager context-KV precompute over the T target tokens, then one query pass of N*(K+1) (dflash.py:124-211).
        return [DrafterPass("context", t, "NONE", None), run("query", n * (k + 1))]
    if parallel_drafting:  # PARD: T + K*N; P-EAGLE: T + (K-1)*N, in one pass (facts §3)
        return [run("parallel", t + (k if method == "draft_model" else k - 1) * n)]
    if method == "draft_model":
        first = t + n  # one extra slot per request (llm_base_proposer.py:113-118, 872-874)
    elif disable_padded:
        if first_pass_tokens is None or not n <= first_pass_tokens <= t:
            raise ValueError(
                f"first_pass_tokens={first_pass_tokens} must be within num_requests..num_tokens ({n}..{t}) "
                "with disable_padded_drafter_batch=True"
            )
        first = first_pass_tokens
    else:
        first = t  # padded batch: every target slot, rejected ones included (llm_base_proposer.py:1098-1154)
    passes = [run("prefill", first)]
    if k >= 2:
        passes.append(run("decode", n, k - 1))
    return passes


def _v2_passes(
    method: str, sizes: list[int], n: int, t: int, uniform_decode: bool, k: int, cudagraph_mode: str,
    max_num_seqs: int, target_padded_size: int | None, fused_decode: bool, multi_module_mtp: bool,
    ks: list[int] | None,
) -> list[DrafterPass]:
    """V2 (facts §3): EAGLE's prefill pass shares the target's descriptor set and padded width, its decode steps a
    FULL_DECODE_ONLY set at {s <= R}; DFlash one FULL query pass; draft_model all eager. Every manager at query
    length K+1 holds FULL graphs per dynamic tier, so another tier's graph can shadow the step's own."""
    if method == "draft_model":  # standalone_ar/speculator.py:133-158, 170-353: every forward runs NONE
        passes = [DrafterPass("prefill", t + n, "NONE", None)]
        if k >= 2:
            passes.append(DrafterPass("decode", n, "NONE", None, k - 1))
        return passes
    full_decode = _decode_mode(cudagraph_mode) == "FULL"
    q = k + 1  # this step's query length (a dynamic tier's k + 1; DFlash always drafts the maximum K)
    tiers = _tiers(k, ks)
    if not manager_graphs(sizes, cudagraph_mode, tiers, max_num_seqs * max(q, tiers[-1]), max_num_seqs):
        full_decode = False  # the target captured nothing, so neither did the speculator (see drafter_graphs)

    def manager(mode: str) -> Dispatcher:
        return Dispatcher(sizes, cudagraph_mode=mode, decode_query_len=max(q, tiers[-1]), max_num_seqs=max_num_seqs,
                          decode_query_lens=tiers)

    if method == "dflash":
        # One query pass of N*(K+1), dispatched as uniform even with prefills present (dflash/speculator.py:467,
        # 563-619); context rows beyond the graph's num_reqs*(K+1) are precomputed eagerly before replay (208-237).
        hit = manager("FULL_DECODE_ONLY").dispatch(n * q, uniform_decode=True, query_len=q) if full_decode else None
        if hit is None or hit.eager:
            return [DrafterPass("context", t, "NONE", None), DrafterPass("query", n * q, "NONE", None)]
        padded = hit.padded_size
        assert padded is not None
        extra = [DrafterPass("context", t - padded, "NONE", None)] if t > padded else []
        return extra + [DrafterPass("query", n * q, "FULL", padded)]
    # EAGLE/EAGLE3/MTP: the target's dispatch (its tiers) at this step's query length.
    target = manager(cudagraph_mode)
    if target_padded_size is None:
        target_padded_size = target.dispatch(t, uniform_decode=uniform_decode, query_len=q).padded_size or t
    elif target_padded_size < t:
        raise ValueError(f"target_padded_size={target_padded_size} must be >= num_tokens={t}")
    width = target_padded_size
    if method == "mtp" and multi_module_mtp:
        # K module passes at the target's padded width in one FULL graph (multi_module_mtp/speculator.py:204-247,
        # 426-452); its manager has no PIECEWISE graphs (99-115).
        hit = (manager("FULL_DECODE_ONLY").dispatch(width, uniform_decode=uniform_decode, query_len=q)
               if full_decode else None)
        if hit is None or hit.eager:
            return [DrafterPass("pass", width, "NONE", None, k)]
        return [DrafterPass("pass", width, "FULL", hit.padded_size, k, fused=True)]
    # Draft step 0 dispatches the target's padded width with the real batch's uniform token count
    # (target_dependent_ar/speculator.py:197, 250-268).
    hit = target.dispatch(width, uniform_decode=uniform_decode, query_len=q)
    passes = [DrafterPass("prefill", width, hit.runtime_mode, hit.padded_size)]
    if k <= 1:
        return passes
    # Steps 1..K-1: N tokens padded to s >= N, s <= R, FULL only (speculator.py:325-366); one fused replay
    # for all K-1 steps when fused, else one replay per step; eager without a FULL decode mode or a graph.
    decode_sizes = [s for s in sizes if s <= max_num_seqs] if full_decode else []
    padded = _pad(decode_sizes, n)
    if padded is None:
        passes.append(DrafterPass("decode", n, "NONE", None, k - 1))
    else:
        passes.append(DrafterPass("decode", n, "FULL", padded, k - 1, fused=fused_decode))
    return passes


def eager_drafter_passes(
    method: str,
    *,
    runner: str,
    request_counts: Iterable[int],
    capture_sizes: Sequence[int],
    cudagraph_mode: str,
    num_speculative_tokens: int,
    max_num_seqs: int,
    dense_schedule: Sequence[int] | None = None,
    parallel_drafting: bool = False,
    fused_decode: bool = True,
    multi_module_mtp: bool = False,
    speculative_enforce_eager: bool = False,
) -> list[EagerDrafterPasses]:
    """For a workload's uniform decode steps (N requests, q = K+1; `dense_schedule[N]` = k under a dynamic
    schedule, index 0 unused), the drafter passes that run without a graph, one entry per role in pass order.
    Example: V2 EAGLE decode steps at N above the largest capture size <= max_num_seqs run eager."""
    if dense_schedule is not None and len(dense_schedule) <= max_num_seqs:
        raise ValueError(f"dense_schedule has {len(dense_schedule)} entries; it needs {max_num_seqs + 1}")
    found: dict[str, tuple[set[int], set[int]]] = {}
    ks = sorted(set(dense_schedule[1:])) if dense_schedule is not None else None
    for n in sorted(set(request_counts)):
        k_step = dense_schedule[n] if dense_schedule is not None else num_speculative_tokens
        # DFlash always drafts the maximum K and truncates afterwards (model_runner.py:2324-2325).
        k = num_speculative_tokens if method == "dflash" else k_step
        if k == 0 and method == "draft_model" and runner == "v2":
            continue  # no drafting this step; facts §3 do not say what V2's standalone drafter runs then
        passes = drafter_passes(
            method, runner=runner, num_requests=n, num_tokens=n * (k_step + 1), uniform_decode=True,
            capture_sizes=capture_sizes, cudagraph_mode=cudagraph_mode, num_speculative_tokens=k,
            max_num_seqs=max_num_seqs, parallel_drafting=parallel_drafting, fused_decode=fused_decode,
            dynamic_ks=ks, multi_module_mtp=multi_module_mtp, speculative_enforce_eager=speculative_enforce_eager,
        )
        for p in passes:
            if p.runtime_mode == "NONE":
                counts, widths = found.setdefault(p.role, (set(), set()))
                counts.add(n)
                widths.add(p.num_tokens)
    return [EagerDrafterPasses(role, tuple(sorted(c)), tuple(sorted(w))) for role, (c, w) in found.items()]


def drafter_kv_layers(method: str, drafter_num_layers: int, *, num_nextn_predict_layers: int | None = None) -> int:
    """Draft attention layers that get KV cache beside the target's (facts §4): EAGLE/EAGLE3/DFlash the draft's
    layers, MTP its predict layers (`num_nextn_predict_layers`, default the drafter's layer count), draft_model
    all its layers, model-free methods none."""
    _check_method(method)
    if method in MODEL_FREE_METHODS:
        return 0
    if drafter_num_layers < 1:
        raise ValueError(f"drafter_num_layers={drafter_num_layers} must be >= 1 for method={method!r}")
    if method == "mtp" and num_nextn_predict_layers is not None:
        if num_nextn_predict_layers < 1:
            raise ValueError(f"num_nextn_predict_layers={num_nextn_predict_layers} must be >= 1")
        return num_nextn_predict_layers
    return drafter_num_layers


def drafter_kv_bytes_per_token(
    method: str, drafter: ModelShape, dtype: str, tensor_parallel_size: int = 1, *,
    num_nextn_predict_layers: int | None = None,
) -> int:
    """KV bytes the drafter adds per token on one rank: its KV layers x what one layer of its shape caches per token
    (K and V of its KV heads, or an MLA module's one latent)."""
    layers = drafter_kv_layers(method, drafter.num_layers, num_nextn_predict_layers=num_nextn_predict_layers)
    return layers * drafter.kv_bytes_per_layer_token(dtype, tensor_parallel_size) if layers else 0


def _embedding_bytes(shape: ModelShape, dtype: str, tensor_parallel_size: int) -> int:
    """One rank's embedding matrix, sharded over the vocabulary as `ModelShape.weight_bytes` counts it."""
    return shape.vocab_per_rank(tensor_parallel_size) * shape.hidden_size * DTYPE_BYTES[dtype]


def _mtp_input_bytes(drafter: ModelShape, dtype: str) -> int:
    """What an MTP module holds besides its decoder layer and final norm: the norms of the token's embedding and of the
    target's hidden state, and eh_proj joining the two (a plain, replicated `nn.Linear` 2 x hidden -> hidden in the
    model dtype, never quantized; `deepseek_mtp.py` DeepSeekMultiTokenPredictorLayer)."""
    h = drafter.hidden_size
    return (2 * h * h + 2 * h) * DTYPE_BYTES[dtype]


def drafter_shares(
    method: str, drafter: ModelShape, target: ModelShape, *, shares_embedding: bool | None = None,
    shares_lm_head: bool | None = None,
) -> tuple[bool, bool]:
    """Whether the drafter uses the target's (embedding, LM head), vLLM's default where None (see
    `drafter_weight_bytes`); ValueError for a sharing vLLM does not do."""
    _check_method(method)
    if method in MODEL_FREE_METHODS:
        return False, False
    same_shape = (drafter.vocab_size, drafter.hidden_size) == (target.vocab_size, target.hidden_size)
    if method == "draft_model":
        if shares_embedding or shares_lm_head:
            raise ValueError("method='draft_model' never shares the target's embedding or LM head")
        shares_embedding = shares_lm_head = False
    default = True if method == "mtp" else same_shape
    shares_embedding = default if shares_embedding is None else shares_embedding
    shares_lm_head = default if shares_lm_head is None else shares_lm_head
    if (shares_embedding or shares_lm_head) and not same_shape:
        raise ValueError(
            f"sharing the target's embedding/LM head needs the drafter's vocab_size x hidden_size "
            f"({drafter.vocab_size} x {drafter.hidden_size}) to equal the target's ({target.vocab_size} x "
            f"{target.hidden_size})"
        )
    return shares_embedding, shares_lm_head


def drafter_weight_bytes(
    method: str,
    drafter: ModelShape,
    target: ModelShape,
    dtype: str,
    tensor_parallel_size: int = 1,
    *,
    shares_embedding: bool | None = None,
    shares_lm_head: bool | None = None,
) -> int:
    """Parameter bytes the drafter adds on one rank, with what it shares with the target not counted twice.

    EAGLE/EAGLE3/MTP (facts §4) and DFlash (V2 `load_dflash_model` applies the same `_should_share` rule) take the
    target's embedding and LM head when the draft has none or an identical copy; the default (None) assumes so
    when the shapes match (same vocab_size and hidden_size) and not otherwise; MTP always shares. draft_model
    never shares. An MTP module adds its input norms and eh_proj (`_mtp_input_bytes`). Model-free methods add
    nothing."""
    _check_method(method)
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype={dtype!r} must be one of {', '.join(DTYPE_BYTES)}")
    if tensor_parallel_size < 1:
        raise ValueError(f"tensor_parallel_size={tensor_parallel_size} must be >= 1")
    if method in MODEL_FREE_METHODS:
        return 0
    shares_embedding, shares_lm_head = drafter_shares(method, drafter, target, shares_embedding=shares_embedding,
                                                      shares_lm_head=shares_lm_head)
    total = drafter.weight_bytes(dtype, tensor_parallel_size)
    embedding = _embedding_bytes(drafter, dtype, tensor_parallel_size)
    if shares_embedding:
        total -= embedding
    if shares_lm_head and not drafter.tie_word_embeddings:  # a tied head is the embedding, not counted apart
        total -= embedding
    return total + (_mtp_input_bytes(drafter, dtype) if method == "mtp" else 0)
