"""How SGLang 0.5.23's decode graphs meet the KV cache: the automatic mem_fraction_static and the KV budget, both
fixed BEFORE the graphs are captured, so graphs must fit in the slack the fraction leaves."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tuner.engines.sglang.defaults import (
    DEFAULT_MAX_PREFILL_TOKENS,
    default_chunked_prefill_size,
    default_prefill_batch_sizes,
    default_prefill_max_tokens,
)

__all__ = [
    "GRAPH_RESERVE_MIB_PER_BS",
    "SglangKvRule",
    "auto_mem_fraction_static",
    "auto_reserved_mib",
    "graph_slack_bytes",
    "kv_budget_bytes",
    "kv_budget_change_bytes",
    "reserve_for_graph_mib",
]

GRAPH_RESERVE_MIB_PER_BS = 2
"""MiB the auto fraction reserves per unit of decode max_bs (`reserve_for_graph_mb`)."""

_UNKNOWN_GPU_MEM_FRACTION = 0.95
_LARGE_GPU_MIB = 60 * 1024
_LARGE_GPU_FLOOR_MIB = 10 * 1024
_POST_CAPTURE_FLOOR_MIB = 1536
_BACKENDS = ("full", "breakable", "disabled")


def _check_backend(name: str, value: str) -> None:
    if value not in _BACKENDS:
        raise ValueError(f"{name}={value!r} must be one of {', '.join(_BACKENDS)}")


def reserve_for_graph_mib(decode_max_bs: int, *, decode_backend: str = "full", prefill_backend: str = "breakable",
                          prefill_graph_count: int = 0, use_mla: bool = False, dp_attention: bool = False,
                          attn_dp_size: int = 1, disaggregation_mode: str | None = None,
                          moe_a2a_deepep: bool = False) -> float:
    """`reserve_for_graph_mb` (arg_groups/memory_hook.py:357-399): MiB set aside for graphs in the auto fraction.

    2 x decode max_bs (decode graphs on), + 3 x max_bs x attn_dp (+1.5 x more above 300) under DP attention,
    + 8 per prefill bucket (1536 flat with MLA) when prefill graphs are on, + 1024 for breakable prefill with DeepEP.
    Only max_bs enters from the decode list: the number of decode graphs does not.
    """
    _check_backend("decode_backend", decode_backend)
    _check_backend("prefill_backend", prefill_backend)
    reserved = 0.0
    if disaggregation_mode != "prefill" and decode_backend != "disabled":
        reserved += decode_max_bs * GRAPH_RESERVE_MIB_PER_BS
    if dp_attention and disaggregation_mode != "prefill":
        reserved += decode_max_bs * attn_dp_size * 3
        if decode_max_bs > 300:
            reserved += decode_max_bs * attn_dp_size * 1.5
    if disaggregation_mode != "decode" and prefill_backend != "disabled":
        reserved += prefill_graph_count * 8 if not use_mla else 1.5 * 1024
        if prefill_backend == "breakable" and moe_a2a_deepep:
            reserved += 1 * 1024
    return reserved


def auto_reserved_mib(
    gpu_memory_mib: float,
    *,
    decode_max_bs: int,
    chunked_prefill_size: int | None = None,
    tp_size: int = 1,
    pp_size: int = 1,
    decode_backend: str = "full",
    prefill_backend: str = "breakable",
    prefill_graph_count: int | None = None,
    use_mla: bool = False,
    dp_attention: bool = False,
    attn_dp_size: int = 1,
    disaggregation_mode: str | None = None,
    max_running_requests: int | None = None,
    speculative_num_draft_tokens: int | None = None,
    max_prefill_tokens: int = DEFAULT_MAX_PREFILL_TOKENS,
    moe_a2a_deepep: bool = False,
    is_xpu: bool = False,
    post_capture_kv_sizing: bool = False,
) -> float:
    """`reserved_mem` of `handle_gpu_memory_settings` (memory_hook.py:281-343), in MiB.

    512 + 1.5 x activation tokens + tp x pp / 8 x 1024 + `reserve_for_graph_mib`, floored at 10 GiB on GPUs above
    60 GiB, + 2048 for DeepEP all-to-all with decode graphs, + 2048 on XPU. With post-capture KV sizing (env
    SGLANG_ENABLE_POST_CAPTURE_KV_SIZING, off by default) only 1536 + the parallel slack. `chunked_prefill_size`
    None takes the GPU default; `prefill_graph_count` None takes the length of SGLang's default prefill list.
    """
    if post_capture_kv_sizing:
        return _POST_CAPTURE_FLOOR_MIB + tp_size * pp_size / 8 * 1024
    if chunked_prefill_size is None:
        chunked_prefill_size = default_chunked_prefill_size(gpu_memory_mib)
    if prefill_graph_count is None:
        prefill_graph_count = len(default_prefill_batch_sizes(default_prefill_max_tokens(
            chunked_prefill_size, use_mla=use_mla, pp_size=pp_size, prefill_backend=prefill_backend)))
    if disaggregation_mode == "decode":
        running_requests = max_running_requests or decode_max_bs or 1
        activation_tokens = max(running_requests * (speculative_num_draft_tokens or 1), 2048)
    elif chunked_prefill_size > 0:
        activation_tokens = max(chunked_prefill_size, 2048)
    else:
        activation_tokens = max(max_prefill_tokens, 2048)
    reserved = 512 + activation_tokens * 1.5 + tp_size * pp_size / 8 * 1024
    reserved += reserve_for_graph_mib(decode_max_bs, decode_backend=decode_backend, prefill_backend=prefill_backend,
                                      prefill_graph_count=prefill_graph_count, use_mla=use_mla,
                                      dp_attention=dp_attention, attn_dp_size=attn_dp_size,
                                      disaggregation_mode=disaggregation_mode, moe_a2a_deepep=moe_a2a_deepep)
    if gpu_memory_mib > _LARGE_GPU_MIB:
        reserved = max(reserved, _LARGE_GPU_FLOOR_MIB)
    if disaggregation_mode != "prefill" and decode_backend != "disabled" and moe_a2a_deepep:
        reserved += 2 * 1024
    if is_xpu:
        reserved += 2 * 1024
    return reserved


def auto_mem_fraction_static(gpu_memory_mib: float | None, *, decode_max_bs: int, **reserve_options: object) -> float:
    """The automatic `--mem-fraction-static`: round((gpu_mem - reserved) / gpu_mem, 3), 0.95 for an unknown GPU.

    `reserve_options` are `auto_reserved_mib`'s keywords. The VLM adjustment (`adjust_mem_fraction_for_vlm`) is not
    modelled: for a multimodal model SGLang scales this value further.
    """
    if gpu_memory_mib is None:
        return _UNKNOWN_GPU_MEM_FRACTION
    if gpu_memory_mib <= 0:
        raise ValueError(f"gpu_memory_mib={gpu_memory_mib} must be > 0")
    reserved = auto_reserved_mib(gpu_memory_mib, decode_max_bs=decode_max_bs,
                                 **reserve_options)  # type: ignore[arg-type]
    return round((gpu_memory_mib - reserved) / gpu_memory_mib, 3)


def graph_slack_bytes(pre_model_load_available_bytes: float, mem_fraction_static: float) -> float:
    """Memory left outside weights + KV: pre_load_available x (1 - mem_fraction_static). Decode and prefill graphs
    and activations must fit in it, since KV is sized before capture (managers/scheduler.py:1137, 1146)."""
    return pre_model_load_available_bytes * (1 - mem_fraction_static)


def kv_budget_bytes(available_after_weights_bytes: float, pre_model_load_available_bytes: float,
                    mem_fraction_static: float) -> float:
    """KV pool budget (`_profile_available_bytes`, mem_cache/kv_cache_configurator.py:2990-3038): free memory after
    the weights minus the slack; the decode list does not enter except through an automatic fraction."""
    if not 0 < mem_fraction_static <= 1:
        raise ValueError(f"mem_fraction_static={mem_fraction_static} must be in (0, 1]")
    return available_after_weights_bytes - graph_slack_bytes(pre_model_load_available_bytes, mem_fraction_static)


def kv_budget_change_bytes(old_batch_sizes: Sequence[int], new_batch_sizes: Sequence[int], *,
                           gpu_memory_mib: float | None, pre_model_load_available_bytes: float,
                           mem_fraction_static: float | None = None, **reserve_options: object) -> float:
    """How the KV budget moves when the decode list changes from `old_batch_sizes` to `new_batch_sizes`.

    Only max(bs) moves it (2 MiB of reserve per unit), only when mem_fraction_static is automatic (None here), and
    only in steps of the fraction's 0.001 rounding; it is 0 while the 10 GiB floor binds. The number of graphs never
    matters. Positive: more KV.
    """
    if not old_batch_sizes or not new_batch_sizes:
        raise ValueError(f"old_batch_sizes={list(old_batch_sizes)}, new_batch_sizes={list(new_batch_sizes)}: "
                         f"both must be non-empty")
    if mem_fraction_static is not None:
        return 0.0
    old = auto_mem_fraction_static(gpu_memory_mib, decode_max_bs=max(old_batch_sizes), **reserve_options)
    new = auto_mem_fraction_static(gpu_memory_mib, decode_max_bs=max(new_batch_sizes), **reserve_options)
    # KV = available - pre_load x (1 - mfs), so dKV = pre_load x dmfs.
    return pre_model_load_available_bytes * (new - old)


@dataclass(frozen=True)
class SglangKvRule:
    """SGLang sizes the KV cache BEFORE capture from mem_fraction_static: KV = free-before-load x mfs - weights, and
    graphs and activations must fit in the rest, free-before-load x (1 - mfs) (`kv_budget_bytes`). With the automatic
    fraction only the list's max moves it (2 MiB of reserve per request of max_bs, in 0.001 steps, not while the
    10 GiB floor binds)."""

    total_memory_bytes: int
    """Device memory."""
    weights_bytes: int
    """Weights and persistent buffers on one rank (inside the static fraction with the KV cache)."""
    activation_bytes: int
    """Activation peak and non-torch memory: must fit in the slack beside the graphs."""
    required_kv_bytes: int
    """KV bytes the deployment needs."""
    mem_fraction_static: float | None
    """User-set fraction; None: automatic."""
    gpu_memory_mib: float
    """What SGLang's automatic fraction reads."""
    tensor_parallel_size: int = 1
    """Ranks (the automatic reserve grows with tp)."""
    chunked_prefill_size: int | None = None
    """SGLang's chunked prefill size (the activation reserve of the automatic fraction)."""
    tokens_per_request: int = 1
    """Tokens per request of a decode graph."""
    pre_load_free_bytes: int | None = None
    """Free device memory before the weights load, where SGLang's budget starts (the profile's); None: unknown, total
    memory stands in."""

    estimate_enabled: bool = False
    """SGLang makes no graph-memory estimate: the real pool is what counts."""

    def fraction(self, top_requests: int) -> float:
        """mem_fraction_static for a list whose max is `top_requests` (the user's, or SGLang's automatic one)."""
        if self.mem_fraction_static is not None:
            return self.mem_fraction_static
        return auto_mem_fraction_static(self.gpu_memory_mib, decode_max_bs=max(1, top_requests),
                                               tp_size=self.tensor_parallel_size,
                                               chunked_prefill_size=self.chunked_prefill_size)

    @property
    def pre_load_bytes(self) -> int:
        """The memory the fraction applies to: free before the weights load, else (unknown) total memory."""
        return self.pre_load_free_bytes if self.pre_load_free_bytes is not None else self.total_memory_bytes

    @property
    def requested_bytes(self) -> int:
        return self.total_memory_bytes

    @property
    def non_kv_cache_bytes(self) -> int:
        return self.weights_bytes + self.activation_bytes

    def kv_available_bytes(self, estimate_bytes: float = 0.0, *, real_bytes: float = 0.0, top: int = 0) -> int:
        # kv_budget_bytes with free-after-weights = free-before - weights: free-before x fraction - weights
        return int(self.pre_load_bytes * self.fraction(top)) - self.weights_bytes

    def capture_headroom_bytes(self, estimate_bytes: float, real_pool_bytes: float, *, top: int = 0) -> int:
        slack = graph_slack_bytes(self.pre_load_bytes, self.fraction(top))
        return int(slack - self.activation_bytes - round(real_pool_bytes))

    def applied_estimate(self, profiled_bytes: int) -> int:
        """SGLang makes no estimate: the figure charged is the real pool."""
        return profiled_bytes

    def graph_budget(self, top: int = 0) -> tuple[int, str]:
        """(the most real graph memory a list topped at `top` requests may take, what that is in words)."""
        return max(0, self.real_budget_bytes(top)), "most graph memory the engine's KV rule allows"

    def real_budget_bytes(self, top: int) -> int:
        """Most real graph memory a list topped at `top` requests may take (< 0: none), or -1 when its KV cache is
        short whatever the graphs take."""
        if self.kv_available_bytes(top=top) < self.required_kv_bytes:
            return -1
        return self.capture_headroom_bytes(0.0, 0.0, top=top)
