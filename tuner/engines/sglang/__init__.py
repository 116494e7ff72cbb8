"""The only place that knows SGLang 0.5.23's decode CUDA-graph rules (default list, capture filter, dispatch, memory
rule, files to emit), with batch sizes in REQUESTS: a graph holds bs x tokens-per-request tokens."""

from tuner.engines.sglang.capture import (
    DecodeGraphs,
    batch_size_alignment,
    captured_batch_sizes,
    request_pool_size,
    resolve_decode_graphs,
)
from tuner.engines.sglang.defaults import (
    default_chunked_prefill_size,
    default_decode_batch_sizes,
    default_decode_max_bs,
    default_prefill_batch_sizes,
    default_prefill_max_tokens,
)
from tuner.engines.sglang.dispatch import Dispatch, Dispatcher, decode_tokens_per_request
from tuner.engines.sglang.emit import EmitError, cuda_graph_config, flag_line, render_files, validate_decode_batch_sizes
from tuner.engines.sglang.memory import (
    auto_mem_fraction_static,
    auto_reserved_mib,
    graph_slack_bytes,
    kv_budget_bytes,
    kv_budget_change_bytes,
    reserve_for_graph_mib,
)
from tuner.engines.sglang.speculative import effective_max_running_requests, resolve_eagle_params

__all__ = [
    "DecodeGraphs",
    "Dispatch",
    "Dispatcher",
    "EmitError",
    "auto_mem_fraction_static",
    "auto_reserved_mib",
    "batch_size_alignment",
    "captured_batch_sizes",
    "cuda_graph_config",
    "decode_tokens_per_request",
    "default_chunked_prefill_size",
    "default_decode_batch_sizes",
    "default_decode_max_bs",
    "default_prefill_batch_sizes",
    "default_prefill_max_tokens",
    "effective_max_running_requests",
    "flag_line",
    "graph_slack_bytes",
    "kv_budget_bytes",
    "kv_budget_change_bytes",
    "render_files",
    "request_pool_size",
    "reserve_for_graph_mib",
    "resolve_decode_graphs",
    "resolve_eagle_params",
    "validate_decode_batch_sizes",
]
