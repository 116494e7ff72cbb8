"""The only place that knows TensorRT-LLM's (PyTorch backend) CUDA-graph rules (default list and validator, engine
filter, dispatch, KV rule, YAML to emit), with batch sizes in REQUESTS: a graph holds bs x (draft_len + 1) tokens."""

from tuner.engines.trtllm.capture import (
    CudaGraphs,
    captured_batch_sizes,
    filter_cuda_graph_batch_sizes,
    graph_count,
    graph_draft_len,
    resolve_cuda_graphs,
)
from tuner.engines.trtllm.defaults import (
    DEFAULT_CUDA_GRAPH_MAX_BATCH_SIZE,
    DEFAULT_FREE_GPU_MEMORY_FRACTION,
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_MAX_NUM_TOKENS,
    default_batch_sizes,
    generate_batch_sizes,
    merge_schedule_keys,
    resolve_cuda_graph_config,
)
from tuner.engines.trtllm.dispatch import Dispatch, Dispatcher
from tuner.engines.trtllm.emit import EmitError, extra_llm_api_options, render_files, validate_batch_sizes
from tuner.engines.trtllm.memory import kv_cache_bytes, kv_cache_bytes_with_graphs, kv_cost_of_graph_bytes

__all__ = [
    "DEFAULT_CUDA_GRAPH_MAX_BATCH_SIZE",
    "DEFAULT_FREE_GPU_MEMORY_FRACTION",
    "DEFAULT_MAX_BATCH_SIZE",
    "DEFAULT_MAX_NUM_TOKENS",
    "CudaGraphs",
    "Dispatch",
    "Dispatcher",
    "EmitError",
    "captured_batch_sizes",
    "default_batch_sizes",
    "extra_llm_api_options",
    "filter_cuda_graph_batch_sizes",
    "generate_batch_sizes",
    "graph_count",
    "graph_draft_len",
    "kv_cache_bytes",
    "kv_cache_bytes_with_graphs",
    "kv_cost_of_graph_bytes",
    "merge_schedule_keys",
    "render_files",
    "resolve_cuda_graph_config",
    "resolve_cuda_graphs",
    "validate_batch_sizes",
]
