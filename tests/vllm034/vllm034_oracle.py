"""vLLM 0.34's own CUDA-graph code, run on CPU as an oracle for cgtune's 0.34 rulebook: the config resolution (the
split prefill/decode capture sizes, the deprecated fields, the SM100 wide defaults, the dynamic-schedule query lengths),
the runner's `CudaGraphManager` graph set and dispatch, the drafters' managers, both `profile_cudagraph_memory`
routines over a simulated memory pool (the estimator, and the runner's 0 under the extensible KV cache), and the KV
arithmetic. Everything that decides a number is vLLM 0.34.0's own class or function, imported from a
`pip install --no-deps --target DIR vllm==0.34.0` directory put first on PYTHONPATH; what is stubbed only stands in for
a GPU, torch.distributed or a loaded model, and each stub says so.

This module imports vLLM, so it must only be imported in a process of its own whose PYTHONPATH starts with the 0.34
directory (the main venv holds 0.33 in site-packages, and vLLM's import sets process-wide state):
tests/vllm034/answers.py is that process. `load()` returns an `Oracle`, or raises `Unavailable` with the reason. The
stand-ins are installed on vLLM's module attributes only inside `Oracle.patched()`."""

from __future__ import annotations

import contextlib
import logging
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The GPU stand-ins no version changed (a graph pool handle, the offloader's streams, a CUDA graph), shared with 0.33's
# oracle: it imports nothing of vLLM's at its top, so importing it here loads nothing of 0.33.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vllm"))
from vllm_oracle import _Graph, _Offloader, _PlatformStandIn  # noqa: E402

VLLM_VERSION = "0.34.0"


class Unavailable(RuntimeError):
    """vLLM 0.34.0's code cannot be imported here; the message says why."""


def load() -> Oracle:
    """Import vLLM 0.34.0's modules the oracle runs (CPU only); Unavailable with the reason otherwise."""
    try:
        import vllm
    except ImportError as exc:
        raise Unavailable(f"vllm is not importable ({exc}); put a `pip install --no-deps --target DIR "
                          f"vllm=={VLLM_VERSION}` directory first on PYTHONPATH") from None
    if getattr(vllm, "__version__", None) != VLLM_VERSION:
        raise Unavailable(f"vllm {getattr(vllm, '__version__', '?')} is imported from {vllm.__file__}, the oracle "
                          f"needs {VLLM_VERSION} (is its --target directory first on PYTHONPATH?)")
    try:
        return Oracle()
    except ImportError as exc:  # a dependency of vLLM's modules that is not installed
        raise Unavailable(f"vLLM {VLLM_VERSION}'s modules do not import here: {exc!r} (install the extra "
                          f"`vllm-oracle`)") from None


# --------------------------------------------------------------------------------------------- plain data
@dataclass(frozen=True)
class Config:
    """One serving configuration; the field names are the keyword arguments of cgtune's
    `tuner.engines.vllm.v034.defaults.resolve_capture_sizes`, so a config travels as plain data to that side."""

    max_num_seqs: int
    max_num_batched_tokens: int
    num_speculative_tokens: int = 0
    speculative_method: str | None = None
    """dflash, eagle, eagle3, mtp, draft_model, ngram, suffix (None: no speculation)."""
    speculative_schedule: tuple[tuple[int, int, int], ...] | None = None
    """Dynamic speculative schedule (`num_speculative_tokens_per_batch_size`)."""
    gpu_capability: tuple[int, int] = (9, 0)
    performance_mode: str = "balanced"
    cudagraph_mode: str = "FULL_AND_PIECEWISE"
    enforce_eager: bool = False
    cudagraph_capture_sizes: tuple[int, ...] | None = None
    """Deprecated shared token list."""
    max_cudagraph_capture_size: int | None = None
    """Deprecated shared cap."""
    prefill_token_sizes: tuple[int, ...] | None = None
    """`prefill_cudagraph_capture_token_sizes`."""
    max_prefill_tokens: int | None = None
    """`max_prefill_cudagraph_capture_tokens`."""
    decode_request_sizes: tuple[int, ...] | None = None
    """`decode_cudagraph_capture_request_sizes`."""
    max_decode_requests: int | None = None
    """`max_decode_cudagraph_capture_requests`."""
    max_decode_tokens: int | None = None
    """`max_decode_cudagraph_capture_tokens`."""
    multi_module_mtp: bool = False
    """method mtp with a draft checkpoint of K >= 2 modules (`SpeculativeConfig.use_multi_module_mtp`)."""


@dataclass
class Resolved:
    """vLLM's resolved config: the split sizes, the record, the mode, and the hooks the managers read."""

    cfg: Config
    vllm_config: Any
    prefill_token_sizes: list[int] | None = None
    decode_request_sizes: list[int] | None = None
    record: list[int] = field(default_factory=list)
    max_record: int = 0
    max_decode_tokens: int | None = None
    cudagraph_mode: str = "NONE"
    q: int = 1
    decode_query_lens: dict[int, int] = field(default_factory=dict)
    draft_decode_request_sizes: list[int] = field(default_factory=list)
    split_resolved: bool = False
    """`_split_cudagraph_capture_sizes` ran. It does not with cudagraph_mode NONE or enforce_eager: the split fields
    then keep what the user gave, unfiltered, and nothing is captured."""
    warnings: list[str] = field(default_factory=list)
    error: str | None = None
    """vLLM refused the config (the message, with the exception's type)."""

    def plain(self) -> dict[str, Any]:
        """The resolution as JSON-ready data (query lengths as [q, most requests] pairs)."""
        return {"prefill_token_sizes": self.prefill_token_sizes, "decode_request_sizes": self.decode_request_sizes,
                "record": self.record, "max_record": self.max_record, "max_decode_tokens": self.max_decode_tokens,
                "cudagraph_mode": self.cudagraph_mode, "decode_query_lens": sorted(self.decode_query_lens.items()),
                "draft_decode_request_sizes": self.draft_decode_request_sizes, "split_resolved": self.split_resolved,
                "warnings": self.warnings,
                "error": self.error}


Costs = Any
"""`(owner, mode, width) -> (standalone_bytes, delta_bytes)`."""


@dataclass
class Capture:
    """One runner's capture over the simulated pool: the graphs in the order they entered it (owner, mode, width,
    note: the drafter decode graphs' number of speculative steps), the real pool, the estimator's figure with the
    extensible KV cache off, and the runner's figure with it on."""

    graphs: list[tuple[str, str, int, Any]]
    real_bytes: int
    estimate_bytes: int
    extensible_estimate_bytes: int


# --------------------------------------------------------------------------------------------- the oracle
class Oracle:
    """vLLM 0.34.0's modules and the stand-ins its code runs against on CPU."""

    def __init__(self) -> None:
        import vllm.logger as vllm_logger
        import vllm.platforms as platforms
        import vllm.v1.worker.extensible_kv_cache as extensible
        import vllm.v1.worker.gpu.cudagraph_utils as graphs
        import vllm.v1.worker.gpu.model_runner as runner
        import vllm.v1.worker.gpu.spec_decode.autoregressive.cudagraph_utils as ar_graphs
        import vllm.v1.worker.gpu.spec_decode.dflash.cudagraph as dflash_graphs
        import vllm.v1.worker.gpu.spec_decode.dflash.speculator as dflash
        import vllm.v1.worker.gpu.spec_decode.eagle.speculator as eagle
        import vllm.v1.worker.gpu.spec_decode.mtp.speculator as mtp
        import vllm.v1.worker.gpu.spec_decode.multi_module_mtp.speculator as multi_mtp
        import vllm.v1.worker.gpu.spec_decode.standalone_ar.speculator as standalone
        from vllm.config import CompilationConfig, CUDAGraphMode, VllmConfig
        from vllm.config.compilation import CompilationMode
        from vllm.config.speculative import SpeculativeConfig
        from vllm.platforms.interface import DeviceCapability, UnspecifiedPlatform
        from vllm.v1.attention.backend import AttentionCGSupport
        from vllm.v1.kv_cache_interface import FullAttentionSpec

        self.vllm_logger, self.platforms, self.extensible = vllm_logger, platforms, extensible
        self.graphs, self.runner, self.ar_graphs, self.dflash_graphs = graphs, runner, ar_graphs, dflash_graphs
        # The speculator class each method's `speculator_config.speculator_class` names (v1/worker/gpu/spec_decode/*/
        # config.py); ngram and suffix capture nothing (their init_cudagraph_manager is a no-op).
        self.speculator_classes = {
            "eagle": eagle.EagleSpeculator, "eagle3": eagle.EagleSpeculator, "mtp": mtp.MTPSpeculator,
            "multi_module_mtp": multi_mtp.MultiModuleMTPSpeculator, "draft_model": standalone.StandaloneARSpeculator,
            "dflash": dflash.DFlashSpeculator}
        self.CompilationConfig, self.CompilationMode = CompilationConfig, CompilationMode
        self.CUDAGraphMode, self.VllmConfig, self.SpeculativeConfig = CUDAGraphMode, VllmConfig, SpeculativeConfig
        self.DeviceCapability, self.UnspecifiedPlatform = DeviceCapability, UnspecifiedPlatform
        self.AttentionCGSupport, self.FullAttentionSpec = AttentionCGSupport, FullAttentionSpec
        self.pool = SimulatedPool()

    @contextlib.contextmanager
    def patched(self) -> Iterator[None]:
        """Install the stand-ins on vLLM's module attributes (and torch's CUDA graph entry points), restore them on
        exit. Each replaces something that needs a GPU, torch.distributed or a loaded model; none decides a size, a
        mode, an order or a byte count."""
        import torch

        saved: list[tuple[object, str, object]] = []

        def put(obj: object, name: str, value: object) -> None:
            saved.append((obj, name, getattr(obj, name)))
            setattr(obj, name, value)

        pool, nothing, g = self.pool, contextlib.nullcontext, self.graphs
        # Pipeline-parallel state needs torch.distributed: one rank, first and last; no progress bars.
        rank = types.SimpleNamespace(is_first_rank=True, is_last_rank=True)
        put(g, "get_pp_group", lambda: rank)
        put(g, "is_global_first_rank", lambda: False)
        # The CUDA graph pool handles, the capture stream and graph-capture context (CUDA streams), the offloader's
        # copy stream, the cuMem pool switches: CUDA only.
        put(g, "current_platform", _PlatformStandIn())
        put(g, "current_stream", lambda: None)
        put(g, "graph_capture", lambda device=None, stream=None: nothing(types.SimpleNamespace(stream=stream)))
        put(g, "get_offloader", lambda: _Offloader())
        put(g, "capture_pool", lambda p, cfg: nothing(p))
        put(g, "capture_outside_cumem_pool", nothing)
        # torch.cuda.CUDAGraph / torch.cuda.graph record kernels on a GPU: the simulated pool charges the graph.
        put(torch.cuda, "CUDAGraph", _Graph)
        put(torch.cuda, "graph", pool.capturing)
        # Device memory: free memory is the simulated pool's; synchronising and emptying the cache do nothing.
        put(torch.accelerator, "get_memory_info", pool.memory_info)
        put(torch.accelerator, "synchronize", lambda *a: None)
        put(torch.accelerator, "empty_cache", lambda: None)
        # The profiling KV cache, its teardown, the garbage collection around capture, the config scope, the
        # workspace lanes: they prepare or free device state the stand-in runner does not hold.
        put(g, "_init_minimal_kv_cache_for_profiling", lambda runner: None)
        put(g, "_teardown_profiling_state", lambda runner: None)
        put(g, "set_current_vllm_config", lambda cfg, *a, **k: nothing())
        put(g, "gc", types.SimpleNamespace(collect=lambda: 0))
        put(self.runner, "freeze_gc_for_cudagraph_capture", nothing)
        put(self.runner, "use_workspace_lane", lambda lane: nothing())
        put(self.runner, "lock_workspace", lambda: None)
        # Capture-time input preparation (dummy batches and attention metadata on the device): the stand-in
        # forwards need none.
        put(self.ar_graphs, "prepare_inputs_to_capture", lambda *a, **k: (None, None))
        put(self.dflash_graphs, "_prepare_dflash_inputs_to_capture", lambda *a, **k: (None, None))
        try:
            yield
        finally:
            for obj, name, value in reversed(saved):
                setattr(obj, name, value)

    # -------------------------------------------------------------------------------------------- configuration
    def resolve(self, cfg: Config) -> Resolved:
        """vLLM's own config pipeline for `cfg`, in `VllmConfig.__post_init__`'s order: the breakable-CUDA-graph
        decision (`_maybe_enable_breakable_cudagraph`), `_maybe_disable_dynamic_sd_for_data_parallel`,
        `_normalize_piecewise_cudagraph_mode`, the enforce-eager override, `_set_cudagraph_sizes` (which calls
        `_split_cudagraph_capture_sizes` and `post_init_cudagraph_sizes`); then the runner's
        `CompilationConfig.resolve_cudagraph_mode_and_sizes` (model_runner.py:792; attention supports every graph and
        the model is compiled, so only the config's own rules change the mode). Stand-ins: the VllmConfig instance (a
        namespace that borrows VllmConfig's own methods and properties: building a real one loads a model), the
        SpeculativeConfig (likewise: a real one loads the draft checkpoint), the platform (its device capability),
        the scheduler and model configs (the fields read: a Llama, no sleep mode)."""
        r = Resolved(cfg, None)
        log = _LogRecords()
        self.vllm_logger._print_warning_once.cache_clear()  # each config must show its own once-only warnings
        self.vllm_logger._print_info_once.cache_clear()
        vllm_log = logging.getLogger("vllm")
        saved_level = vllm_log.level
        vllm_log.setLevel(logging.INFO)  # the info that the mode fell to NONE; vLLM's own handler may be off
        vllm_log.addHandler(log)
        saved_platform = self.platforms._current_platform
        self.platforms._current_platform = self._device_class(cfg.gpu_capability)()
        try:
            self._resolve(cfg, r)
        except (ValueError, AssertionError) as exc:  # pydantic's ValidationError is a ValueError
            r.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.platforms._current_platform = saved_platform
            vllm_log.removeHandler(log)
            vllm_log.setLevel(saved_level)
            r.warnings = log.messages
        return r

    def _resolve(self, cfg: Config, r: Resolved) -> None:
        def opt(name: str, value: Any) -> dict[str, Any]:
            return {name: list(value) if isinstance(value, tuple) else value} if value is not None else {}

        c = self.CompilationConfig(
            mode=self.CompilationMode.VLLM_COMPILE, cudagraph_mode=cfg.cudagraph_mode,
            **opt("cudagraph_capture_sizes", cfg.cudagraph_capture_sizes),
            **opt("max_cudagraph_capture_size", cfg.max_cudagraph_capture_size),
            **opt("prefill_cudagraph_capture_token_sizes", cfg.prefill_token_sizes),
            **opt("max_prefill_cudagraph_capture_tokens", cfg.max_prefill_tokens),
            **opt("decode_cudagraph_capture_request_sizes", cfg.decode_request_sizes),
            **opt("max_decode_cudagraph_capture_requests", cfg.max_decode_requests),
            **opt("max_decode_cudagraph_capture_tokens", cfg.max_decode_tokens))
        c.set_splitting_ops_for_v1(all2all_backend="naive")  # VLLM_COMPILE's default split at attention
        spec = None
        if cfg.num_speculative_tokens:
            # A multi-module MTP checkpoint: n_predict modules (`SpeculativeConfig.num_mtp_modules`).
            draft = (types.SimpleNamespace(hf_config=types.SimpleNamespace(
                n_predict=cfg.num_speculative_tokens, model_type="deepseek_mtp", index_share_for_mtp_iteration=False))
                if cfg.multi_module_mtp else None)
            spec = self._spec_class(
                method=cfg.speculative_method, num_speculative_tokens=cfg.num_speculative_tokens,
                num_speculative_tokens_per_batch_size=[list(e) for e in cfg.speculative_schedule]
                if cfg.speculative_schedule else None, enable_adaptive_verification=False,
                draft_model_config=draft, index_share_for_mtp_iteration=None)
        ns = types.SimpleNamespace
        vc = self._config_class(
            model_config=ns(enforce_eager=cfg.enforce_eager, architectures=["LlamaForCausalLM"], hf_text_config=None,
                            sleep_mode_offload_cudagraph=False, enable_sleep_mode=False, max_model_len=8192),
            compilation_config=c, speculative_config=spec, diffusion_config=None, lora_config=None,
            scheduler_config=ns(max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens),
            parallel_config=ns(tensor_parallel_size=1, data_parallel_size=1, use_ubatching=False),
            cache_config=ns(use_kda_recoverssm=False), performance_mode=cfg.performance_mode)
        r.vllm_config, r.q = vc, vc.uniform_decode_query_len
        breakable = vc._maybe_enable_breakable_cudagraph()
        vc._maybe_disable_dynamic_sd_for_data_parallel()
        vc._normalize_piecewise_cudagraph_mode(breakable_cudagraph_enabled=breakable)
        if cfg.enforce_eager:  # VllmConfig.__post_init__ (vllm.py:1916-1921), copied: the method builds everything
            c.cudagraph_mode = self.CUDAGraphMode.NONE
            c.max_cudagraph_capture_size = 0
            c.cudagraph_capture_sizes = []
        split = vc._split_cudagraph_capture_sizes

        def spy(*args: Any) -> None:  # only records that vLLM's own split ran
            r.split_resolved = True
            split(*args)

        vc._split_cudagraph_capture_sizes = spy
        vc._set_cudagraph_sizes()
        mode = c.resolve_cudagraph_mode_and_sizes(self.AttentionCGSupport.ALWAYS, None, r.q)
        r.cudagraph_mode = mode.name
        r.prefill_token_sizes = _list(c.prefill_cudagraph_capture_token_sizes)
        r.decode_request_sizes = _list(c.decode_cudagraph_capture_request_sizes)
        r.record, r.max_record = list(c.cudagraph_capture_sizes), c.max_cudagraph_capture_size
        r.max_decode_tokens = c.max_decode_cudagraph_capture_tokens
        r.decode_query_lens = dict(vc.get_decode_cudagraph_query_lens(r.q))
        r.draft_decode_request_sizes = list(vc.get_draft_decode_cudagraph_request_sizes())

    @property
    def _config_class(self) -> type:
        v = self.VllmConfig

        class VllmConfigStandIn(types.SimpleNamespace):
            """VllmConfig's own properties and methods on the fields set above."""

            uniform_decode_query_len = v.uniform_decode_query_len
            num_speculative_tokens = v.num_speculative_tokens
            use_cumem_cudagraph_pool = v.use_cumem_cudagraph_pool
            get_decode_cudagraph_query_lens = v.get_decode_cudagraph_query_lens
            get_draft_decode_cudagraph_request_sizes = v.get_draft_decode_cudagraph_request_sizes
            get_varlen_decode_cudagraph_token_sizes = v.get_varlen_decode_cudagraph_token_sizes
            _maybe_enable_breakable_cudagraph = v._maybe_enable_breakable_cudagraph
            _uses_breakable_cudagraph_by_default = v._uses_breakable_cudagraph_by_default
            _uses_breakable_cudagraph_for_batch_invariance = v._uses_breakable_cudagraph_for_batch_invariance
            _maybe_disable_dynamic_sd_for_data_parallel = v._maybe_disable_dynamic_sd_for_data_parallel
            _normalize_piecewise_cudagraph_mode = v._normalize_piecewise_cudagraph_mode
            _set_cudagraph_sizes = v._set_cudagraph_sizes
            _split_cudagraph_capture_sizes = v._split_cudagraph_capture_sizes

        return VllmConfigStandIn

    @property
    def _spec_class(self) -> type:
        s = self.SpeculativeConfig

        class SpeculativeConfigStandIn(types.SimpleNamespace):
            """SpeculativeConfig's own predicates on the fields set above."""

            uses_dynamic_speculative_decoding = s.uses_dynamic_speculative_decoding
            use_multi_module_mtp = s.use_multi_module_mtp
            use_gemma4_mtp = s.use_gemma4_mtp
            num_mtp_modules = s.num_mtp_modules

        return SpeculativeConfigStandIn

    def _device_class(self, capability: tuple[int, int]) -> type:
        major, minor = capability
        device = self.DeviceCapability(major, minor)

        class DeviceStandIn(self.UnspecifiedPlatform):  # type: ignore[name-defined,misc]
            """The platform's device capability (9.0: H200, 10.0: B200); `is_device_capability_family` is vLLM's."""

            @classmethod
            def get_device_capability(cls, device_id: int = 0) -> Any:
                return device

        return DeviceStandIn

    # ----------------------------------------------------------------------------------------------- the runner
    def manager(self, r: Resolved, owner: str = "target") -> Any:
        """The runner's `CudaGraphManager` (its `_init_candidates`, `dispatch` and `capture` are vLLM's), built as
        `GPUModelRunner.initialize_kv_cache` builds `ModelCudaGraphManager` (model_runner.py:801-811): the resolved
        mode, `get_decode_cudagraph_query_lens(decode_query_len)`, no LoRA, no adaptive verification, no microbatching.
        Its captures are charged to the simulated pool under `owner`. Stand-in: the model-specific input preparation
        of `ModelCudaGraphManager.capture` (a forward that only charges the pool)."""
        base, pool = self.graphs.CudaGraphManager, self.pool

        class Manager(base):  # type: ignore[misc,valid-type]
            def capture(self, *args: Any, **kwargs: Any) -> None:
                def create(desc: Any, warmup: bool) -> Any:
                    return lambda cg_mode: pool.forward(owner, desc.num_tokens, cg_mode.name, None)
                base.capture(self, create)

        vc = r.vllm_config
        return Manager(vc, None, self.CUDAGraphMode[r.cudagraph_mode],
                       decode_query_lens=vc.get_decode_cudagraph_query_lens(r.q))

    def graphs_of(self, manager: Any) -> list[tuple[str, int, int | None, int | None]]:
        """`(mode, num_tokens, uniform_token_count, num_reqs)` of a manager's graphs in capture order (PIECEWISE, then
        FULL, each as `_init_candidates` sorted it: largest first), as `CudaGraphManager.capture` walks them."""
        return [(d.cg_mode.name, d.num_tokens, d.uniform_token_count, d.num_reqs)
                for mode in ("PIECEWISE", "FULL") for d in manager._capture_descs.get(self.CUDAGraphMode[mode], [])]

    @staticmethod
    def dispatch(manager: Any, num_reqs: int, num_tokens: int,
                 uniform_token_count: int | None) -> tuple[str, int, int | None]:
        """`CudaGraphManager.dispatch` of a captured manager (no LoRA, one microbatch): (runtime mode, padded tokens,
        padded requests: None for PIECEWISE; the batch's own tokens and requests when eager)."""
        manager._graphs_captured = True  # as after capture(); dispatch answers eager before it
        d = manager.dispatch(num_reqs, num_tokens, uniform_token_count, 0)
        return d.cg_mode.name, d.num_tokens, d.num_reqs

    # ------------------------------------------------------------------------------------------------ drafters
    def speculator(self, r: Resolved, fused_decode: bool = True) -> Any:
        """The speculator vLLM builds for the method, with its managers made by its own `init_cudagraph_manager`
        (called with the target's resolved mode, as model_runner.py:826 does), ready for its own `capture`. None for
        methods that capture nothing (ngram, suffix) or without speculation. The instance is the speculator's own
        class made without `__init__` (which loads the draft model and allocates device buffers); what `__init__`
        would set is given: the config fields it copies, the draft attention's CUDA-graph support (FlashAttention's
        UNIFORM_BATCH), whether that attention updates its metadata in place (`fused_decode`), and opaque buffers.
        Its forwards only charge the simulated pool."""
        cfg = r.cfg
        method = "multi_module_mtp" if cfg.multi_module_mtp and cfg.speculative_method == "mtp" \
            else cfg.speculative_method
        if method not in self.speculator_classes or not cfg.num_speculative_tokens:
            return None
        pool, nothing = self.pool, (lambda *a, **k: None)

        def forward(self: Any, num_reqs: int, num_tokens: int, attn: Any, slots: Any, across_dp: Any, cg_mode: Any,
                    *args: Any, **kwargs: Any) -> None:
            pool.forward("drafter", num_tokens, cg_mode.name, kwargs.get("num_speculative_steps"))

        base = self.speculator_classes[method]
        stand_in = type(f"{base.__name__}StandIn", (base,), {
            "_prefill": forward, "_decode": forward, "_fused_multi_step_decode": forward, "_generate_draft": forward,
            "_generate_drafts": forward, "_prepare_graph_forward": nothing})
        s = object.__new__(stand_in)
        buffer = types.SimpleNamespace(zero_=nothing, fill_=nothing)
        vc = r.vllm_config
        k = cfg.num_speculative_tokens
        vars(s).update(
            vllm_config=vc, speculative_config=vc.speculative_config, device=None, max_num_reqs=cfg.max_num_seqs,
            num_speculative_steps=k, num_query_per_req=k + 1,
            enable_adaptive_verification=False, supports_decode_metadata_update=fused_decode and k > 1,
            attn_cg_support=types.SimpleNamespace(min_cg_support=self.AttentionCGSupport.UNIFORM_BATCH,
                                                  min_cg_attn_backend="FLASH_ATTN"),
            model=None, model_state=None, input_buffers=None, target_input_buffers=None, block_tables=None,
            attn_groups=None, target_attn_groups=None, can_reuse_target_attn_metadata=True, kv_cache_config=None,
            expanded_slot_mappings=None, share_mtp_topk_indices=False, _group_causal=False,
            last_token_indices=buffer, idx_mapping=buffer, current_draft_step=buffer, sample_indices=buffer,
            sample_pos=buffer, sample_idx_mapping=buffer, _context_slot_mappings=buffer)
        s.init_cudagraph_manager(self.CUDAGraphMode[r.cudagraph_mode])
        return s

    def speculator_graphs(self, s: Any) -> dict[str, list[tuple[str, int, int | None, int | None]]]:
        """Each of a speculator's managers (by attribute name) with its graphs in capture order."""
        base = self.graphs.CudaGraphManager
        return {name: self.graphs_of(m) for name, m in sorted(vars(s).items()) if isinstance(m, base)}

    # ------------------------------------------------------------------------------------------------- memory
    def runner_for(self, r: Resolved, extensible: bool, fused_decode: bool = True) -> Any:
        """A `GPUModelRunner` stand-in whose `capture_model`, `needs_cudagraph_capture`, `profile_cudagraph_memory`
        and `maybe_setup_dummy_loras` are vLLM's own, holding a fresh target manager and speculator. Stand-ins: the
        runner instance (what it would hold after loading a text-only model: no encoder graphs, no LoRA, no KV
        connector, no adaptive verification), the EPLB controller's suppress scope."""
        cls = self.runner.GPUModelRunner
        ns = types.SimpleNamespace
        runner = ns(
            vllm_config=r.vllm_config, compilation_config=r.vllm_config.compilation_config,
            cache_config=ns(enable_extensible_kv_cache=extensible), eplb=ns(suppress=contextlib.nullcontext),
            cudagraph_manager=self.manager(r), max_num_reqs=r.cfg.max_num_seqs,
            model_state=ns(supports_mm_inputs=False, capture_inner_cudagraphs=lambda *a: None),
            speculator=self.speculator(r, fused_decode), lora_config=None, input_buffers=None, pcp_manager=None,
            model=None, intermediate_tensors=None, block_tables=None, attn_groups=None, kv_cache_config=None,
            use_aux_hidden_state_outputs=False, _draft_workspace_lane=None, adaptive_verification=None,
            kv_connector=ns(reset_capture_state=lambda: None))
        for name in ("capture_model", "needs_cudagraph_capture", "profile_cudagraph_memory",
                     "maybe_setup_dummy_loras"):
            setattr(runner, name, types.MethodType(getattr(cls, name), runner))
        return runner

    def capture(self, r: Resolved, costs: Costs, fused_decode: bool = True) -> Capture:
        """The runner's real capture (`capture_model`) into an empty simulated pool; the estimate
        (`GPUModelRunner.profile_cudagraph_memory`, which runs cudagraph_utils' `profile_cudagraph_memory`) on a fresh
        runner with the extensible KV cache off; and the same method's answer with it on."""
        self.pool.reset(costs)
        real = int(self.runner_for(r, False, fused_decode).capture_model())
        graphs = list(self.pool.log)
        self.pool.reset(costs)
        estimate = int(self.runner_for(r, False, fused_decode).profile_cudagraph_memory())
        self.pool.reset(costs)
        extensible = int(self.runner_for(r, True, fused_decode).profile_cudagraph_memory())
        return Capture(graphs, real, estimate, extensible)

    # ------------------------------------------------------------------------------------------------------- KV
    def kv_bytes_per_token(self, layers: list[tuple[int, int, int, str]], block_size: int = 16) -> int:
        """KV bytes per token on one rank: each `(layers, kv heads on the rank, head_dim, dtype)` group as vLLM's
        `FullAttentionSpec.page_size_bytes` for one block, per token, times its layers."""
        import torch

        total = 0
        for count, heads, head_dim, dtype in layers:
            spec = self.FullAttentionSpec(block_size=block_size, num_kv_heads=heads, head_size=head_dim,
                                          dtype=getattr(torch, dtype))
            assert spec.page_size_bytes % block_size == 0
            total += count * spec.page_size_bytes // block_size
        return total

    def extensible_kv_bytes(self, **measured: int) -> int:
        """`measure_kv_cache_bytes` (extensible_kv_cache.py), vLLM's own pure arithmetic for the bytes the
        extensible KV cache may take after warmup and capture (its margin constants are the module's)."""
        return int(self.extensible.measure_kv_cache_bytes(**measured))

    def extensible_kv_blocks(self, num_bytes: int, bytes_per_block: int, segment_strides: list[int],
                             capacity_blocks: int, granularity: int = 2 << 20) -> int:
        """`ExtensibleKVCache.blocks_within`: the most blocks whose granule-rounded footprint fits `num_bytes`.
        Stand-in: the cache instance (its reserved buffer's granularity, the per-segment block strides, the
        capacity), which needs the CUDA VMM driver API."""
        cls = self.extensible.ExtensibleKVCache
        kv = types.SimpleNamespace(buffer=types.SimpleNamespace(granularity=granularity),
                                   segment_strides=segment_strides, bytes_per_block=bytes_per_block,
                                   capacity_blocks=capacity_blocks)
        kv.physical_bytes_for = types.MethodType(cls.physical_bytes_for, kv)
        return int(cls.blocks_within(kv, num_bytes))

    @property
    def extensible_constants(self) -> dict[str, float]:
        """The extensible cache's margin constants on this (CUDA, not ROCm) platform."""
        e = self.extensible
        return {"margin_floor_bytes": e.KV_CACHE_MARGIN_FLOOR_BYTES, "margin_fraction": e.KV_CACHE_MARGIN_FRACTION,
                "non_torch_reserve_bytes": e.KV_CACHE_NON_TORCH_RESERVE_BYTES}


def _list(x: Any) -> list[int] | None:
    return None if x is None else list(x)


class _LogRecords(logging.Handler):
    """vLLM's warnings (and the info that the mode fell to NONE) while one config resolves, formatted."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if record.levelno >= logging.WARNING or "cudagraph_mode to NONE" in msg:
            self.messages.append(msg)


class SimulatedPool:
    """Device memory as graph captures take it: a graph captured into an empty pool costs its standalone footprint,
    every later one its delta (cgtune's model of the shared pool, fed the same costs on both sides). What the oracle
    shows is therefore which graphs vLLM's code captures, in which order, and how its profiling routine samples and
    extrapolates them."""

    TOTAL_BYTES = 1 << 44

    def __init__(self) -> None:
        self.reset(lambda owner, mode, width: (0, 0))

    def reset(self, costs: Costs) -> None:
        self.costs, self.used, self.log, self.in_full = costs, 0, [], False

    def memory_info(self, device: Any = None) -> tuple[int, int]:
        return self.TOTAL_BYTES - self.used, self.TOTAL_BYTES

    @contextlib.contextmanager
    def capturing(self, graph: Any = None, pool: Any = None, stream: Any = None, **kwargs: Any) -> Iterator[None]:
        """torch.cuda.graph: a forward run inside records a FULL graph."""
        self.in_full = True
        try:
            yield
        finally:
            self.in_full = False

    def forward(self, owner: str, width: int, cg_mode: str, note: Any) -> None:
        """A forward pass during capture: PIECEWISE records piecewise graphs, NONE inside torch.cuda.graph a FULL
        graph, NONE outside it a warm-up (nothing)."""
        if cg_mode == "PIECEWISE":
            mode = "PIECEWISE"
        elif cg_mode == "NONE" and self.in_full:
            mode = "FULL"
        else:
            return
        standalone, delta = self.costs(owner, mode, width)
        self.used += standalone if not self.log else delta
        self.log.append((owner, mode, width, note))
