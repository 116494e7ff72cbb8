"""vLLM's own start-up checks on the serving fields cgtune reads (SchedulerConfig, VllmConfig's speculative slots), as
0.33 makes them: the one line vLLM refuses a configuration with, so that cgtune refuses the same configurations at
workload load, `cgtune defaults` and search instead of costing an engine that never starts."""

from __future__ import annotations

__all__ = ["lookahead_tokens", "scheduler_refusal", "slots_refusal"]


def scheduler_refusal(max_num_seqs: int, max_num_batched_tokens: int) -> str | None:
    """`SchedulerConfig.verify_max_model_len` (config/scheduler.py, 0.33 and 0.34): a step never holds more requests
    than tokens."""
    if max_num_batched_tokens < max_num_seqs:
        return (f"max_num_batched_tokens ({max_num_batched_tokens}) must be greater than or equal to max_num_seqs "
                f"({max_num_seqs}).")
    return None


def lookahead_tokens(method: str | None, num_speculative_tokens: int) -> int:
    """`VllmConfig.num_lookahead_tokens`: DFlash's fill-in drafting a bonus query plus one per draft token, the other
    drafters that write KV past the target (EAGLE, EAGLE3, MTP, DSpark's anchor sampling, a draft model) one per draft
    token, the model-free methods none. 0.33 decides it by method (config/vllm.py:626-652), 0.34 asks each method's
    `SpeculatorConfig.num_lookahead_tokens` (v1/worker/gpu/spec_decode/*/config.py): the same counts."""
    if num_speculative_tokens <= 0 or method is None:
        return 0
    if method == "dflash":
        return num_speculative_tokens + 1
    if method in ("eagle", "eagle3", "mtp", "dspark", "draft_model"):
        return num_speculative_tokens
    return 0


def slots_refusal(max_num_batched_tokens: int, lookahead_tokens: int) -> str | None:
    """`VllmConfig._set_max_num_scheduled_tokens` (0.33 and 0.34): the token budget must leave a scheduled token beside
    the drafter's lookahead slots."""
    if lookahead_tokens and max_num_batched_tokens <= lookahead_tokens:
        return ("VllmConfig does not have enough slots to schedule a token and support the speculative decoding "
                f"settings. Got max_num_batched_tokens={max_num_batched_tokens} and "
                f"num_lookahead_tokens={lookahead_tokens}.")
    return None
