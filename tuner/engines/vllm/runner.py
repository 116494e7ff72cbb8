"""vLLM 0.33's two model runners: which one runs a deployment, and the capture list it really captures (V1
rewrites an explicit list when speculating; V2 keeps it)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "MODEL_RUNNERS",
    "SPECULATIVE_METHODS",
    "V1_ONLY_METHODS",
    "V1_SCHEDULE_METHODS",
    "effective_cudagraph_mode",
    "keeps_dynamic_schedule",
    "resolve_model_runner",
    "runner_reason",
    "runs_as",
    "v1_rewrite_applies",
    "v1_rewritten_sizes",
    "v2_lacks",
]

MODEL_RUNNERS = ("auto", "v1", "v2")
"""`serving.model_runner` values: `auto` is vLLM's own choice; `v1` mirrors `VLLM_USE_V2_MODEL_RUNNER=0`."""

SPECULATIVE_METHODS = (
    "eagle", "eagle3", "mtp", "dflash", "dspark", "draft_model", "extract_hidden_states",
    "ngram", "ngram_gpu", "suffix", "custom_class",
)
"""vLLM 0.33's `SpeculativeMethod` values (`config/speculative.py`; the many `*_mtp` names normalise to `mtp`)."""

V1_ONLY_METHODS = ("suffix", "custom_class")
"""Speculative methods V2 lacks, so vLLM falls back to the V1 runner (`VllmConfig.use_v2_model_runner`)."""

V1_SCHEDULE_METHODS = ("ngram", "eagle", "eagle3", "mtp", "draft_model", "dflash")
"""The methods whose V1 proposers run a dynamic speculative schedule (`VllmConfig._maybe_disable_dynamic_sd_for_v1`);
V1 drops the schedule for any other and runs static K."""

_PARALLEL_ON_V2 = ("dflash", "dspark")
"""The only methods whose parallel drafting V2 supports; P-EAGLE, PARD and other parallel drafters force V1."""

_FULL_DECODE_MODES = ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
"""cudagraph modes whose decode_mode() is FULL."""


def v2_lacks(method: str | None, *, parallel_drafting: bool = False) -> str | None:
    """What vLLM 0.33's V2 runner lacks to run this speculative setup (`VllmConfig.
    _get_v2_model_runner_unsupported_features`: suffix and custom_class, parallel drafting outside DFlash/DSpark),
    None where V2 runs it."""
    if method in V1_ONLY_METHODS:
        return f"speculative method {method!r}"
    if parallel_drafting and method not in _PARALLEL_ON_V2:
        return f"parallel drafting with method {method!r} (P-EAGLE/PARD)"
    return None


def runner_reason(requested: str, method: str | None, *, parallel_drafting: bool = False) -> str:
    """Why `resolve_model_runner` picks what it picks, in a few words (shown in reports)."""
    if requested != "auto":
        return f"model_runner: {requested} (set in the workload)"
    lacks = v2_lacks(method, parallel_drafting=parallel_drafting)
    if lacks is not None:
        return f"V1: vLLM 0.33 has no V2 support for {lacks}"
    return "V2: vLLM 0.33's default model runner"


def resolve_model_runner(requested: str, method: str | None, *, parallel_drafting: bool = False) -> str:
    """`v1` or `v2`: the runner vLLM 0.33 uses (`auto`), or the one the workload pins. ValueError for V2 pinned where
    it lacks the setup: with `VLLM_USE_V2_MODEL_RUNNER=1` set vLLM does not fall back to V1."""
    if requested not in MODEL_RUNNERS:
        raise ValueError(f"model_runner={requested!r} must be one of {', '.join(MODEL_RUNNERS)}")
    lacks = v2_lacks(method, parallel_drafting=parallel_drafting)
    if requested == "v2" and lacks is not None:
        raise ValueError(f"model_runner='v2': vLLM 0.33 has no V2 support for {lacks}; use auto or v1")
    if requested != "auto":
        return requested
    return "v1" if lacks is not None else "v2"


def keeps_dynamic_schedule(runner: str, method: str | None) -> bool:
    """Whether a dynamic speculative schedule survives vLLM's config: V2 keeps it; V1 drops it for a method outside
    `V1_SCHEDULE_METHODS` (`_maybe_disable_dynamic_sd_for_v1`, config/vllm.py), so suffix or custom_class run static K
    with FULL graphs, the V1 rewrite and a default list without tiers. A method not named is taken to keep it."""
    return runner != "v1" or method is None or method in V1_SCHEDULE_METHODS


def effective_cudagraph_mode(cudagraph_mode: str, runner: str, *, dynamic_schedule: bool) -> str:
    """The cudagraph mode the runner really uses: V1 forces full graphs down to PIECEWISE under a dynamic
    speculative schedule it keeps (`_maybe_override_dynamic_sd_cudagraph_mode`, config/vllm.py), so its decode steps
    replay no FULL graph. `dynamic_schedule`: a schedule is in force (see `keeps_dynamic_schedule`)."""
    if runner == "v1" and dynamic_schedule and cudagraph_mode in _FULL_DECODE_MODES:
        return "PIECEWISE"
    return cudagraph_mode


def v1_rewrite_applies(runner: str, cudagraph_mode: str, decode_query_len: int) -> bool:
    """V1 rewrites the list (`adjust_cudagraph_sizes_for_spec_decode`) when its decode mode is FULL and a decode
    step carries more than one token per request."""
    return runner == "v1" and cudagraph_mode in _FULL_DECODE_MODES and decode_query_len > 1


def v1_rewritten_sizes(capture_sizes: Sequence[int], decode_query_len: int) -> list[int]:
    """vLLM's `CompilationConfig.adjust_cudagraph_sizes_for_spec_decode`: every size rounded up to a multiple of
    q, sizes whose rounded value exceeds the old max dropped, the max reset; `[q]` when nothing is left but q fits
    the old max; ValueError when not even that (the max is below q)."""
    if not capture_sizes or decode_query_len <= 1:
        return sorted(set(capture_sizes))
    q = decode_query_len
    top = max(capture_sizes)
    rounded = sorted({r for s in capture_sizes if (r := -(-s // q) * q) <= top})
    if not rounded and q <= top:
        rounded = [q]
    if not rounded:
        raise ValueError(f"cudagraph_capture_sizes: no valid size after rounding to a multiple of q={q} "
                         f"(max_cudagraph_capture_size={top} < q); vLLM's V1 runner refuses to start")
    return rounded


def runs_as(capture_sizes: Sequence[int], *, runner: str, cudagraph_mode: str, decode_query_len: int) -> list[int]:
    """The capture list the runner captures for `capture_sizes` (already deduplicated and within the token
    budget, as vLLM's config leaves it)."""
    sizes = sorted(set(capture_sizes))
    if cudagraph_mode == "NONE" or not sizes:
        return sizes
    if v1_rewrite_applies(runner, cudagraph_mode, decode_query_len):
        return v1_rewritten_sizes(sizes, decode_query_len)
    return sizes
