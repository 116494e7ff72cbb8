"""The engines a workload may name, each through one small interface over its rulebook (`tuner.vllm`,
`tuner.sglang`, `tuner.trtllm`): the default list, the list really captured, and how graph memory meets the KV cache.
Lists inside cgtune are token widths (what a profile measures); SGLang and TensorRT-LLM count graphs in requests, and
a graph of bs requests holds bs x tokens-per-request tokens."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tuner import sglang, trtllm
from tuner.sglang import emit as sglang_emit
from tuner.trtllm import emit as trtllm_emit
from tuner.vllm import emit as vllm_emit
from tuner.vllm.dispatch import Dispatch

__all__ = [
    "ENGINES",
    "ENGINE_FILES",
    "ENGINE_LABELS",
    "EngineDispatcher",
    "EngineSettings",
    "SglangKvRule",
    "TrtllmKvRule",
    "TRTLLM_NEEDS_SPECULATIVE_MODEL",
    "engine_default_requests",
    "engine_runs_as_requests",
    "render_engine_files",
    "requests_of",
]

ENGINES = ("vllm", "sglang", "trtllm")
"""Engines whose CUDA-graph batch sizes cgtune tunes."""

ENGINE_LABELS = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}
"""How reports and commands name each engine."""

ENGINE_FILES: dict[str, tuple[str, ...]] = {
    "vllm": (vllm_emit.COMPILATION_CONFIG_FILE, vllm_emit.SERVE_YAML_FILE, vllm_emit.FLAGS_FILE),
    "sglang": (sglang_emit.FLAGS_FILE, sglang_emit.CUDA_GRAPH_CONFIG_FILE),
    "trtllm": (trtllm_emit.EXTRA_OPTIONS_FILE,),
}
"""The files a run directory holds for each engine's tuned list (a run writes its engine's and no other's)."""

TRTLLM_NEEDS_SPECULATIVE_MODEL = ("Eagle", "Eagle3", "DraftTarget")
"""TensorRT-LLM decoding types whose config refuses to load without `speculative_model` (llmapi/llm_args.py
`EagleDecodingConfig.validate_speculative_model`: "Draft model must be provided for EAGLE"), a path cgtune does not
know."""

MIB = 1 << 20


@dataclass(frozen=True)
class EngineSettings:
    """The serving settings of SGLang 0.5.23 or TensorRT-LLM (PyTorch backend) that have no vLLM counterpart; the
    shared ones (request cap, token budget, draft tokens, context length) live in ServingConfig under vLLM's names."""

    engine: str
    """`sglang` or `trtllm`."""
    tokens_per_request: int
    """Tokens one request puts in a decode graph: SGLang speculative_num_draft_tokens (1 without speculation),
    TensorRT-LLM 1 + max_draft_len."""
    speculative_algorithm: str | None = None
    """SGLang's speculative algorithm (EAGLE, EAGLE3, NEXTN, DFLASH, NGRAM, ...); None without speculation."""
    mem_fraction_static: float | None = None
    """SGLang --mem-fraction-static; None: SGLang's automatic fraction (which moves with the list's max)."""
    gpu_memory_mib: float | None = None
    """SGLang: the GPU memory its defaults read (nvidia-smi memory.total, MiB); None: the profile's, else unknown."""
    enable_padding: bool = False
    """TensorRT-LLM cuda_graph_config.enable_padding (its default false: only exactly captured sizes replay)."""
    free_gpu_memory_fraction: float = trtllm.DEFAULT_FREE_GPU_MEMORY_FRACTION
    """TensorRT-LLM kv_cache_config.free_gpu_memory_fraction."""
    decoding_type: str | None = None
    """TensorRT-LLM speculative_config.decoding_type (Eagle, Eagle3, MTP, NGram, DraftTarget); None without
    speculation."""


def requests_of(sizes: Sequence[int], tokens_per_request: int) -> list[int]:
    """Token widths as batch sizes (a width between two multiples belongs to the next batch size up)."""
    return sorted({-(-int(s) // tokens_per_request) for s in sizes if s >= 1})


def engine_default_requests(settings: EngineSettings, *, max_num_seqs: int, max_num_batched_tokens: int,
                            tensor_parallel_size: int = 1, gpu_memory_mib: float | None = None) -> list[int]:
    """The engine's default decode list as written (requests): SGLang's generated list for its defaulted max_bs,
    TensorRT-LLM's generated list (max 128 by default)."""
    if settings.engine == "sglang":
        mib = settings.gpu_memory_mib if settings.gpu_memory_mib is not None else gpu_memory_mib
        return sglang.resolve_decode_graphs(
            gpu_memory_mib=mib, tp_size=tensor_parallel_size, max_running_requests=max_num_seqs,
            speculative_algorithm=settings.speculative_algorithm,
            speculative_num_draft_tokens=settings.tokens_per_request if settings.speculative_algorithm else None,
        ).requested_batch_sizes
    return trtllm.default_batch_sizes(None, enable_padding=settings.enable_padding)


def engine_runs_as_requests(settings: EngineSettings, batch_sizes: Sequence[int], *, max_num_seqs: int,
                            max_num_batched_tokens: int) -> list[int]:
    """What the engine really captures for a written list (requests): SGLang's capture filter against its request
    pool (the pool appended when the list goes above it); TensorRT-LLM's engine filter (sizes above
    min(max_batch_size, max_num_tokens // tokens per request) dropped, the cap appended with padding)."""
    if not batch_sizes:
        return []
    if settings.engine == "sglang":
        pool = sglang.request_pool_size(max_running_requests=_sglang_mrr(settings, max_num_seqs))
        return sglang.captured_batch_sizes(batch_sizes, pool, captured_req_width=settings.tokens_per_request)
    return trtllm.filter_cuda_graph_batch_sizes(sorted(set(batch_sizes)), max_num_seqs, max_num_batched_tokens,
                                                settings.tokens_per_request, settings.enable_padding)


def render_engine_files(settings: EngineSettings, batch_sizes: Sequence[int], *, max_num_seqs: int,
                        max_num_batched_tokens: int,
                        provenance: vllm_emit.Provenance | None = None) -> dict[str, str]:
    """File name -> text of the engine's files for a list of batch sizes (requests), each checked by the engine's
    emitter first (an EmitError ValueError, one line, for a list the engine would change or reject): SGLang's flag
    file and `--cuda-graph-config` JSON with `--max-running-requests` pinned to the workload's (unset, speculative
    decoding would set 48); TensorRT-LLM's extra_llm_api_options YAML with padding as the workload says."""
    if settings.engine == "sglang":
        return sglang.render_files(batch_sizes, max_running_requests=max_num_seqs,
                                   tokens_per_request=settings.tokens_per_request, provenance=provenance)
    draft = settings.tokens_per_request - 1
    speculative = None
    if draft > 0:
        if settings.decoding_type is None:
            raise trtllm.EmitError(f"speculative_config.decoding_type: None with max_draft_len={draft} (name "
                                   f"speculative.method)")
        speculative = {"decoding_type": settings.decoding_type, "max_draft_len": draft}
    return trtllm.render_files(batch_sizes, max_batch_size=max_num_seqs, max_num_tokens=max_num_batched_tokens,
                               enable_padding=settings.enable_padding,
                               free_gpu_memory_fraction=settings.free_gpu_memory_fraction,
                               speculative_config=speculative, provenance=provenance)


def _sglang_mrr(settings: EngineSettings, max_num_seqs: int) -> int:
    """max_running_requests after SGLang's speculative resolution; cgtune always sets it (max_num_seqs)."""
    return sglang.effective_max_running_requests(settings.speculative_algorithm, max_num_seqs) or max_num_seqs


@dataclass(frozen=True)
class SglangKvRule:
    """SGLang sizes the KV cache BEFORE capture from mem_fraction_static: KV = total x mfs - weights, and graphs
    and activations must fit in the rest, total x (1 - mfs). With the automatic fraction only the list's max moves it
    (2 MiB of reserve per request of max_bs, in 0.001 steps, not while the 10 GiB floor binds)."""

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

    estimate_enabled: bool = False
    """SGLang makes no graph-memory estimate: the real pool is what counts."""

    def fraction(self, top_requests: int) -> float:
        """mem_fraction_static for a list whose max is `top_requests` (the user's, or SGLang's automatic one)."""
        if self.mem_fraction_static is not None:
            return self.mem_fraction_static
        return sglang.auto_mem_fraction_static(self.gpu_memory_mib, decode_max_bs=max(1, top_requests),
                                               tp_size=self.tensor_parallel_size,
                                               chunked_prefill_size=self.chunked_prefill_size)

    @property
    def requested_bytes(self) -> int:
        return self.total_memory_bytes

    @property
    def non_kv_cache_bytes(self) -> int:
        return self.weights_bytes + self.activation_bytes

    def kv_available_bytes(self, estimate_bytes: float = 0.0, *, real_bytes: float = 0.0, top: int = 0) -> int:
        return int(self.total_memory_bytes * self.fraction(top)) - self.weights_bytes

    def capture_headroom_bytes(self, estimate_bytes: float, real_pool_bytes: float, *, top: int = 0) -> int:
        slack = sglang.graph_slack_bytes(self.total_memory_bytes, self.fraction(top))
        return int(slack - self.activation_bytes - round(real_pool_bytes))

    def real_budget_bytes(self, top: int) -> int:
        """Most real graph memory a list topped at `top` requests may take (< 0: none), or -1 when its KV cache is
        short whatever the graphs take."""
        if self.kv_available_bytes(top=top) < self.required_kv_bytes:
            return -1
        return self.capture_headroom_bytes(0.0, 0.0, top=top)


@dataclass(frozen=True)
class TrtllmKvRule:
    """TensorRT-LLM captures every graph before it sizes the KV cache: KV = fraction x (total - peak), the peak
    holding the graphs, so each graph costs fraction x its memory in KV."""

    total_memory_bytes: int
    """Device memory."""
    non_kv_cache_bytes: int
    """The estimation run's peak without graphs (torch peak + non-torch)."""
    required_kv_bytes: int
    """KV bytes the deployment needs."""
    free_gpu_memory_fraction: float = trtllm.DEFAULT_FREE_GPU_MEMORY_FRACTION
    """kv_cache_config.free_gpu_memory_fraction."""

    estimate_enabled: bool = False
    """TensorRT-LLM measures its graphs before sizing the KV cache: the real pool is what counts."""

    @property
    def requested_bytes(self) -> int:
        return self.total_memory_bytes

    def kv_available_bytes(self, estimate_bytes: float = 0.0, *, real_bytes: float = 0.0, top: int = 0) -> int:
        return trtllm.kv_cache_bytes_with_graphs(
            total_gpu_memory_bytes=self.total_memory_bytes, peak_without_graphs_bytes=self.non_kv_cache_bytes,
            graph_memory_bytes=int(round(real_bytes)), free_gpu_memory_fraction=self.free_gpu_memory_fraction)

    def capture_headroom_bytes(self, estimate_bytes: float, real_pool_bytes: float, *, top: int = 0) -> int:
        return int(self.total_memory_bytes - self.non_kv_cache_bytes - round(real_pool_bytes))

    def real_budget_bytes(self, top: int = 0) -> int:
        """Most real graph memory any list may take while the KV cache keeps what is required."""
        return int(math.floor(self.total_memory_bytes - self.non_kv_cache_bytes
                              - self.required_kv_bytes / self.free_gpu_memory_fraction))


class EngineDispatcher:
    """SGLang's and TensorRT-LLM's decode-graph dispatch (their rulebooks' `Dispatcher`, in requests) in token widths,
    shaped like tuner.vllm.dispatch.Dispatcher (FULL decode graphs only; mixed and prefill steps run without them): a
    uniform decode step of T tokens is a batch of ceil(T / tokens per request) requests, and replays the graph the
    engine picks for that batch, or runs eager."""

    cudagraph_mode = "FULL_DECODE_ONLY"
    decode_mode = "FULL"
    mixed_mode = "NONE"
    separate_decode = True

    def __init__(self, settings: EngineSettings, batch_sizes: Sequence[int], *, max_num_seqs: int) -> None:
        q = settings.tokens_per_request
        self.q = q
        self.rule: sglang.Dispatcher | trtllm.Dispatcher
        if settings.engine == "sglang":
            self.rule = sglang.Dispatcher(batch_sizes, tokens_per_request=q)
        else:
            self.rule = trtllm.Dispatcher(batch_sizes, draft_len=q - 1, enable_padding=settings.enable_padding,
                                          max_batch_size=max_num_seqs)
        self.exact = settings.engine == "trtllm" and not settings.enable_padding
        """Only an exactly captured width replays (TensorRT-LLM without padding); the cost model's vectorised
        dispatch reads it."""
        self.capture_sizes = self.rule.graph_widths()
        self.decode_graph_sizes = list(self.capture_sizes)
        self.mixed_graph_sizes: list[int] = []

    @property
    def max_size(self) -> int:
        return self.capture_sizes[-1] if self.capture_sizes else 0

    @property
    def decode_graphs(self) -> list[tuple[int, int]]:
        """`(width, tokens per request)` of every decode graph, largest first (one query length: no dynamic tiers)."""
        return [(s, self.q) for s in reversed(self.capture_sizes)]

    def graphs(self) -> list[tuple[str, int]]:
        """Every graph the engine captures, largest first (one shared pool)."""
        return [("FULL", s) for s in reversed(self.capture_sizes)]

    def dispatch(self, num_tokens: int, *, uniform_decode: bool = False, query_len: int | None = None) -> Dispatch:
        if num_tokens < 1:
            raise ValueError(f"num_tokens={num_tokens} must be >= 1")
        if uniform_decode:
            d = self.rule.dispatch(-(-num_tokens // self.q))
            if not d.eager:
                return Dispatch("FULL", d.num_tokens)
        return Dispatch("NONE", None)
