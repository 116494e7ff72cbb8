"""vLLM 0.33's own CUDA-graph code, run on CPU as an oracle for cgtune's rulebook: its config (the default and
explicit lists, the dynamic-schedule hooks, the mode resolution and V1 rewrite), both runners' graph sets and
dispatch, their uniform-batch rules, both `profile_cudagraph_memory` routines over a simulated memory pool, and the
KV arithmetic. Everything that decides a number is vLLM's own class or function, imported from the installed
0.33.0 wheel; what is stubbed only stands in for a GPU (or for the model a runner would hold), and each stub says so.

`load()` imports vLLM and returns an `Oracle`, or raises `Unavailable` with the reason (vLLM missing, another
version, an import that fails). The stand-ins are installed on vLLM's module attributes only inside
`Oracle.patched()`; tests/vllm/oracle_compare.py runs all of it in a process of its own."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

VLLM_VERSION = "0.33.0"


class Unavailable(RuntimeError):
    """vLLM 0.33.0's code cannot be imported here; the message says why."""


def load() -> Oracle:
    """Import vLLM 0.33.0's modules the oracle runs (CPU only); Unavailable with the reason otherwise."""
    try:
        import vllm
    except ImportError as exc:
        raise Unavailable(f"vllm is not installed ({exc}); `.ci/run` installs vllm=={VLLM_VERSION} with --no-deps "
                          f"and the extra `vllm-oracle`") from None
    if getattr(vllm, "__version__", None) != VLLM_VERSION:
        raise Unavailable(f"vllm {getattr(vllm, '__version__', '?')} is installed, the oracle needs {VLLM_VERSION}")
    try:
        return Oracle()
    except ImportError as exc:  # a dependency of vLLM's modules that is not installed
        raise Unavailable(f"vLLM {VLLM_VERSION}'s modules do not import here: {exc!r} (install the extra "
                          f"`vllm-oracle`)") from None


class Oracle:
    """vLLM 0.33.0's modules and the stand-ins its code runs against on CPU."""

    def __init__(self) -> None:
        import vllm.platforms as platforms
        import vllm.v1.cudagraph_dispatcher as v1_dispatch
        import vllm.v1.worker.gpu.cudagraph_utils as v2_graphs
        import vllm.v1.worker.gpu.model_runner as v2_runner
        import vllm.v1.worker.gpu.spec_decode.dflash.cudagraph as v2_dflash_graphs
        import vllm.v1.worker.gpu.spec_decode.dflash.speculator as v2_dflash
        import vllm.v1.worker.gpu.spec_decode.target_dependent_ar.cudagraph_utils as v2_spec_graphs
        import vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator as v2_eagle
        import vllm.v1.worker.gpu_model_runner as v1_runner
        from vllm.config import CompilationConfig, CUDAGraphMode, VllmConfig
        from vllm.config.compilation import CompilationMode
        from vllm.config.speculative import SpeculativeConfig
        from vllm.platforms.interface import DeviceCapability, UnspecifiedPlatform
        from vllm.v1.attention.backend import AttentionCGSupport
        from vllm.v1.kv_cache_interface import FullAttentionSpec
        from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
        from vllm.v1.worker.lora_model_runner_mixin import LoRAModelRunnerMixin
        from vllm.v1.worker.utils import request_memory

        self.platforms, self.v1_dispatcher_module, self.v2_graphs = platforms, v1_dispatch, v2_graphs
        self.v2_runner = v2_runner
        self.v2_dflash, self.v2_dflash_graphs = v2_dflash, v2_dflash_graphs
        self.v2_spec_graphs, self.v2_eagle, self.v1_runner = v2_spec_graphs, v2_eagle, v1_runner
        self.CompilationConfig, self.CompilationMode = CompilationConfig, CompilationMode
        self.CUDAGraphMode, self.VllmConfig = CUDAGraphMode, VllmConfig
        self.SpeculativeConfig, self.AttentionCGSupport = SpeculativeConfig, AttentionCGSupport
        self.DeviceCapability, self.UnspecifiedPlatform = DeviceCapability, UnspecifiedPlatform
        self.FullAttentionSpec, self.request_memory = FullAttentionSpec, request_memory
        self.SpecDecodeBaseProposer, self.LoRAModelRunnerMixin = SpecDecodeBaseProposer, LoRAModelRunnerMixin
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

        pool, nothing = self.pool, contextlib.nullcontext
        # Pipeline-parallel state needs torch.distributed: one rank, first and last.
        rank = types.SimpleNamespace(is_first_rank=True, is_last_rank=True)
        put(self.v2_graphs, "get_pp_group", lambda: rank)
        put(self.v2_graphs, "is_global_first_rank", lambda: False)  # no progress bars
        # The CUDA graph pool handle, the capture stream, the graph-capture context (CUDA streams), the offloader's
        # copy stream, the cuMem pool switch: CUDA only.
        platform = _PlatformStandIn()
        put(self.v2_graphs, "current_platform", platform)
        put(self.v1_runner, "current_platform", platform)
        put(self.v2_graphs, "current_stream", lambda: None)
        put(self.v2_graphs, "graph_capture", lambda device=None: nothing())
        put(self.v1_runner, "graph_capture", lambda device=None: nothing())
        put(self.v1_runner, "is_global_first_rank", lambda: False)
        put(self.v2_graphs, "get_offloader", lambda: _Offloader())
        put(self.v2_graphs, "capture_pool", lambda p, cfg: nothing(p))
        # torch.cuda.CUDAGraph / torch.cuda.graph record kernels on a GPU: the simulated pool charges the graph.
        put(torch.cuda, "CUDAGraph", _Graph)
        put(torch.cuda, "graph", pool.capturing)
        # Device memory: free memory is the simulated pool's; synchronising and emptying the cache do nothing.
        put(torch.accelerator, "get_memory_info", pool.memory_info)
        put(torch.accelerator, "synchronize", lambda *a: None)
        put(torch.accelerator, "empty_cache", lambda: None)
        # The profiling KV cache, its teardown, the garbage collection around capture and the config scope: they
        # prepare or free device state the stand-in runner does not hold.
        put(self.v2_graphs, "_init_minimal_kv_cache_for_profiling", lambda runner: None)
        put(self.v2_graphs, "_teardown_profiling_state", lambda runner: None)
        put(self.v2_graphs, "set_current_vllm_config", lambda cfg, *a, **k: nothing())
        put(self.v2_graphs, "gc", types.SimpleNamespace(collect=lambda: 0))
        put(self.v2_runner, "freeze_gc_for_cudagraph_capture", nothing)
        put(self.v2_runner, "use_workspace_lane", lambda lane: nothing())
        put(self.v2_runner, "lock_workspace", lambda: None)
        put(self.v1_runner, "set_current_vllm_config", lambda cfg, *a, **k: nothing())
        # Capture-time input preparation (attention metadata on the device): the captured forward needs none.
        put(self.v2_spec_graphs, "prepare_inputs_to_capture", lambda *a, **k: (None, None))
        put(self.v2_dflash_graphs, "_prepare_dflash_inputs_to_capture", lambda *a, **k: (None, None))
        try:
            yield
        finally:
            for obj, name, value in reversed(saved):
                setattr(obj, name, value)

    # -------------------------------------------------------------------------------------------- configuration
    def resolve(self, cfg: Config) -> Resolved:
        """vLLM's own config pipeline for `cfg`: `VllmConfig._maybe_disable_dynamic_sd_for_v1`,
        `_maybe_override_dynamic_sd_cudagraph_mode` and `_set_cudagraph_sizes` (in `__post_init__`'s order), then
        the runner's `CompilationConfig.resolve_cudagraph_mode_and_sizes` (attention supports every graph, so only
        the speculative rules change the mode; V1 rewrites the list). Stand-ins: the VllmConfig instance (a namespace
        that borrows VllmConfig's own methods and properties: building a real one loads a model), the platform
        (its device capability), the scheduler and model configs (the fields read)."""
        c = self.CompilationConfig(**{"mode": self.CompilationMode.VLLM_COMPILE, "cudagraph_mode": cfg.cudagraph_mode,
                                      **({"cudagraph_capture_sizes": list(cfg.capture_sizes)}
                                         if cfg.capture_sizes is not None else {}),
                                      **({"max_cudagraph_capture_size": cfg.max_capture_size}
                                         if cfg.max_capture_size is not None else {})})
        c.set_splitting_ops_for_v1(all2all_backend="naive")  # VLLM_COMPILE's default split at attention
        spec = None
        if cfg.num_speculative_tokens:
            spec = self._spec_class(method=cfg.method, num_speculative_tokens=cfg.num_speculative_tokens,
                                    num_speculative_tokens_per_batch_size=[list(e) for e in cfg.schedule]
                                    if cfg.schedule else None, enforce_eager=None)
        vc = self._config_class(
            model_config=types.SimpleNamespace(enforce_eager=False),
            compilation_config=c, speculative_config=spec, diffusion_config=None, lora_config=None,
            scheduler_config=types.SimpleNamespace(max_num_seqs=cfg.max_num_seqs,
                                                   max_num_batched_tokens=cfg.max_num_batched_tokens),
            parallel_config=types.SimpleNamespace(tensor_parallel_size=1, data_parallel_size=1, use_ubatching=False),
            cache_config=types.SimpleNamespace(use_kda_recoverssm=False), performance_mode=cfg.performance_mode,
            use_v2_model_runner=cfg.runner == "v2")
        platform = self._device_class(cfg.gpu_capability)()
        saved = self.platforms._current_platform
        self.platforms._current_platform = platform
        try:
            vc._maybe_disable_dynamic_sd_for_v1()
            vc._maybe_override_dynamic_sd_cudagraph_mode()
            vc._set_cudagraph_sizes()
            mode = c.resolve_cudagraph_mode_and_sizes(self.AttentionCGSupport.ALWAYS, None, vc.uniform_decode_query_len,
                                                      use_v2_model_runner=cfg.runner == "v2")
        except (ValueError, AssertionError) as exc:
            return Resolved(cfg, vc, "", [], 0, None, vc.uniform_decode_query_len, error=str(exc) or type(exc).__name__)
        finally:
            self.platforms._current_platform = saved
        schedule = spec.num_speculative_tokens_per_batch_size if spec is not None else None
        sizes = list(c.cudagraph_capture_sizes or []) if mode != self.CUDAGraphMode.NONE else []
        return Resolved(cfg, vc, mode.name, sizes, sizes[-1] if sizes else 0, schedule, vc.uniform_decode_query_len)

    @property
    def _config_class(self) -> type:
        v = self.VllmConfig

        class VllmConfigStandIn(types.SimpleNamespace):
            uniform_decode_query_len = v.uniform_decode_query_len
            num_speculative_tokens = v.num_speculative_tokens
            _maybe_disable_dynamic_sd_for_v1 = v._maybe_disable_dynamic_sd_for_v1
            _maybe_override_dynamic_sd_cudagraph_mode = v._maybe_override_dynamic_sd_cudagraph_mode
            _set_cudagraph_sizes = v._set_cudagraph_sizes
            use_cumem_cudagraph_pool = False  # sleep mode off

        return VllmConfigStandIn

    @property
    def _spec_class(self) -> type:
        s = self.SpeculativeConfig

        class SpeculativeConfigStandIn(types.SimpleNamespace):
            uses_dynamic_speculative_decoding = s.uses_dynamic_speculative_decoding

        return SpeculativeConfigStandIn

    def _device_class(self, capability: tuple[int, int]) -> type:
        major, minor = capability
        device = self.DeviceCapability(major, minor)

        class DeviceStandIn(self.UnspecifiedPlatform):  # type: ignore[name-defined,misc]
            @classmethod
            def get_device_capability(cls, device_id: int = 0) -> Any:
                return device

        return DeviceStandIn

    # ----------------------------------------------------------------------------------------------- V2 runner
    def v2_manager(self, r: Resolved, cudagraph_mode: str, decode_query_len: int, owner: str = "target") -> Any:
        """A V2 `CudaGraphManager` (its `_init_candidates`, `dispatch` and `capture` are vLLM's); its captures are
        charged to the simulated pool under `owner`. Stand-in: the model-specific input preparation of
        `ModelCudaGraphManager.capture` (a forward that only charges the pool)."""
        base, pool = self.v2_graphs.CudaGraphManager, self.pool

        class Manager(base):  # type: ignore[misc,valid-type]
            def capture(self, *args: Any, **kwargs: Any) -> None:
                def create(desc: Any, warmup: bool) -> Any:
                    return lambda cg_mode: pool.forward(owner, desc.num_tokens, cg_mode.name, desc.uniform_token_count)
                base.capture(self, create)

        return Manager(r.vllm_config, None, self.CUDAGraphMode[cudagraph_mode], decode_query_len)

    def graphs_of(self, manager: Any) -> list[tuple[str, int, int | None]]:
        """`(mode, width, uniform token count)` of a V2 manager's graphs in capture order (PIECEWISE, then FULL, as
        `CudaGraphManager.capture` walks `_capture_descs`)."""
        return [(d.cg_mode.name, d.num_tokens, d.uniform_token_count) for mode in ("PIECEWISE", "FULL")
                for d in manager._capture_descs.get(self.CUDAGraphMode[mode], [])]

    def v2_uniform_token_count(self, q: int, requests: Sequence[Request]) -> int | None:
        """V2's uniform token count for a batch: `GPUModelRunner.gather_batch_req_state` (model_runner.py) on the
        requests' scheduled tokens, drafts and prefill progress. Stand-ins: the runner's request state (its arrays)
        and the scheduler output (its fields)."""
        import numpy as np

        ids = [f"r{i}" for i in range(len(requests))]
        state = types.SimpleNamespace(
            prefill_len=types.SimpleNamespace(np=np.array([x.prefill_len for x in requests])),
            num_computed_prefill_tokens=np.array([x.computed_prefill for x in requests]),
            req_id_to_index={rid: i for i, rid in enumerate(ids)})
        runner = types.SimpleNamespace(req_states=state, use_pp=False, adaptive_verification=None, pcp_manager=None,
                                       decode_query_len=q)
        out = types.SimpleNamespace(num_scheduled_tokens={rid: x.tokens for rid, x in zip(ids, requests)},
                                    total_num_scheduled_tokens=sum(x.tokens for x in requests),
                                    scheduled_spec_decode_tokens={rid: [0] * x.drafts for rid, x in zip(ids, requests)
                                                                  if x.drafts})
        return self.v2_runner.GPUModelRunner.gather_batch_req_state(runner, out, False)[1]

    @staticmethod
    def v2_dispatch(manager: Any, num_reqs: int, num_tokens: int,
                    uniform_token_count: int | None) -> tuple[str, int | None]:
        """`CudaGraphManager.dispatch` of a captured manager: (runtime mode, padded width or None when eager)."""
        manager._graphs_captured = True
        desc = manager.dispatch(num_reqs, num_tokens, uniform_token_count, 0)
        mode = desc.cg_mode.name
        return mode, desc.num_tokens if mode != "NONE" else None

    def v2_speculator(self, r: Resolved, method: str, fused: bool) -> Any:
        """The V2 speculator's managers, made and captured by vLLM's own `init_cudagraph_manager` and `capture`
        (`TargetDependentARSpeculator` for EAGLE/EAGLE3/MTP, `DFlashSpeculator` for DFlash); None for methods that
        capture nothing (draft_model's StandaloneARSpeculator, model-free methods). Stand-ins: the speculator
        instance (its buffers and model), and its forwards, which only charge the simulated pool."""
        mode = self.CUDAGraphMode[r.mode]
        k = r.cfg.num_speculative_tokens
        pool, nothing = self.pool, (lambda *a, **kw: None)

        def forward(num_reqs: int, num_tokens: int, attn: Any, slots: Any, across_dp: Any, cg_mode: Any,
                    **kwargs: Any) -> None:
            pool.forward("drafter", num_tokens, cg_mode.name, kwargs.get("num_speculative_steps"))

        buffer = types.SimpleNamespace(zero_=nothing, fill_=nothing)
        common = dict(vllm_config=r.vllm_config, device=None, model=None, model_state=None, input_buffers=None,
                      target_input_buffers=None, block_tables=None, attn_groups=None, target_attn_groups=None,
                      kv_cache_config=None, max_num_reqs=r.cfg.max_num_seqs, max_model_len=8192,
                      speculative_config=r.vllm_config.speculative_config)
        if method in ("eagle", "eagle3", "mtp"):
            cls = self.v2_eagle.TargetDependentARSpeculator
            s = types.SimpleNamespace(**common, num_speculative_steps=k, last_token_indices=buffer, idx_mapping=buffer,
                                      supports_decode_metadata_update=fused and k > 1, on_prefill_begin=nothing,
                                      on_prefill_end=nothing, on_multi_step_decode_begin=nothing,
                                      on_multi_step_decode_end=nothing, _prefill=forward,
                                      _generate_fused_drafts=forward, _generate_draft=forward)
        elif method == "dflash":
            cls = self.v2_dflash.DFlashSpeculator
            s = types.SimpleNamespace(**common, num_speculative_steps=k, num_query_per_req=k + 1,
                                      _speculator_name="DFlash", sample_indices=buffer, sample_pos=buffer,
                                      sample_idx_mapping=buffer, _context_slot_mappings=buffer, _group_causal=False,
                                      _prepare_graph_forward=nothing, _generate_draft=forward,
                                      attn_cg_support=types.SimpleNamespace(
                                          min_cg_support=self.AttentionCGSupport.UNIFORM_BATCH,
                                          min_cg_attn_backend=None))
        else:
            return None
        cls.init_cudagraph_manager(s, mode)
        s.capture = types.MethodType(cls.capture, s)
        return s

    def v2_runner_for(self, r: Resolved, method: str | None, fused: bool) -> Any:
        """A V2 `GPUModelRunner` stand-in whose `capture_model`, `needs_cudagraph_capture` and
        `maybe_setup_dummy_loras` are vLLM's own, holding a fresh target manager and speculator."""
        cls = self.v2_runner.GPUModelRunner
        runner = types.SimpleNamespace(
            vllm_config=r.vllm_config, compilation_config=r.vllm_config.compilation_config,
            cudagraph_manager=self.v2_manager(r, r.mode, r.q),
            model_state=types.SimpleNamespace(supports_mm_inputs=False, capture_inner_cudagraphs=lambda *a: None),
            speculator=self.v2_speculator(r, method, fused) if method else None, lora_config=None,
            input_buffers=None, pcp_manager=None, model=None, intermediate_tensors=None, block_tables=None,
            attn_groups=None, kv_cache_config=None, use_aux_hidden_state_outputs=False, _draft_workspace_lane=None,
            adaptive_verification=None, kv_connector=types.SimpleNamespace(reset_capture_state=lambda: None))
        for name in ("capture_model", "needs_cudagraph_capture"):
            setattr(runner, name, types.MethodType(getattr(cls, name), runner))
        runner.maybe_setup_dummy_loras = types.MethodType(self.LoRAModelRunnerMixin.maybe_setup_dummy_loras, runner)
        return runner

    def v2_capture(self, r: Resolved, method: str | None, fused: bool, costs: Costs) -> tuple[Capture, Any]:
        """V2's real capture (`capture_model`) into an empty simulated pool, and its estimate
        (`profile_cudagraph_memory`, cudagraph_utils.py) on a fresh runner; with the runner of the real capture (its
        managers hold the captured graphs the speculator's dispatch checks)."""
        self.pool.reset(costs)
        runner = self.v2_runner_for(r, method, fused)
        real = int(runner.capture_model())
        graphs = list(self.pool.log)
        self.pool.reset(costs)
        estimate = int(self.v2_graphs.profile_cudagraph_memory(self.v2_runner_for(r, method, fused)))
        return Capture(graphs, real, estimate), runner

    # ----------------------------------------------------------------------------------------------- V1 runner
    def v1_dispatcher(self, r: Resolved) -> Any:
        """V1's `CudagraphDispatcher` with its keys initialised for the resolved mode (as
        `_check_and_update_cudagraph_mode` does)."""
        d = self.v1_dispatcher_module.CudagraphDispatcher(r.vllm_config)
        d.initialize_cudagraph_keys(self.CUDAGraphMode[r.mode], r.q)
        return d

    def v1_drafter_dispatcher(self, r: Resolved) -> Any:
        """The V1 drafter's own `CudagraphDispatcher`, its keys set by `SpecDecodeBaseProposer.
        initialize_cudagraph_keys`. Stand-in: the proposer instance (the two fields read)."""
        dispatcher = self.v1_dispatcher_module.CudagraphDispatcher(r.vllm_config)
        proposer = types.SimpleNamespace(speculative_config=r.vllm_config.speculative_config,
                                         cudagraph_dispatcher=dispatcher)
        self.SpecDecodeBaseProposer.initialize_cudagraph_keys(proposer, self.CUDAGraphMode[r.mode])
        return proposer.cudagraph_dispatcher

    @staticmethod
    def v1_graphs(dispatcher: Any) -> list[tuple[str, int, bool]]:
        """`(mode, width, uniform)` of V1's graphs in capture order (`get_capture_descs`)."""
        return [(mode.name, d.num_tokens, d.uniform) for mode, descs in dispatcher.get_capture_descs() for d in descs]

    def v1_uniform(self, q: int, requests: Sequence[Request]) -> bool:
        """V1's `GPUModelRunner._is_uniform_decode` (gpu_model_runner.py) for a batch."""
        tokens = [x.tokens for x in requests]
        return bool(self.v1_runner.GPUModelRunner._is_uniform_decode(max(tokens), q, sum(tokens), len(tokens)))

    @staticmethod
    def v1_dispatch(dispatcher: Any, num_tokens: int, uniform: bool) -> tuple[str, int | None]:
        """`CudagraphDispatcher.dispatch`: (runtime mode, padded width or None when eager)."""
        mode, desc = dispatcher.dispatch(num_tokens, uniform_decode=uniform)
        return mode.name, desc.num_tokens if mode.name != "NONE" else None

    def v1_capture(self, r: Resolved, method: str | None, costs: Costs,
                   wrap_warmup: Any = None) -> Capture:
        """V1's real capture and its estimate (`GPUModelRunner.profile_cudagraph_memory`, gpu_model_runner.py) over the
        simulated pool. The capture loop is `capture_model`'s (gpu_model_runner.py:6479-6488, copied: the rest of
        capture_model sets up a profiler and the model) calling vLLM's `_capture_cudagraphs`. Stand-ins: the runner
        instance, and `_warmup_and_capture`, which charges the target's graph and, inside a PIECEWISE capture, the
        drafter's: the drafter's `dummy_run` dispatches the width through its own CudagraphDispatcher (vLLM's; DFlash
        first caps it at max_num_seqs x (K+1), dflash.py:229), and a key is captured once per pool
        (CUDAGraphWrapper's cache). `wrap_warmup` wraps the stand-in `_warmup_and_capture` (as cgtune's capture hook
        wraps vLLM's: tests/vllm/engine_hooks_check.py)."""
        cls = self.v1_runner.GPUModelRunner
        drafter = (self.v1_drafter_dispatcher(r) if method in ("eagle", "eagle3", "mtp", "dflash", "draft_model")
                   else None)
        cap = r.cfg.max_num_seqs * (r.cfg.num_speculative_tokens + 1) if method == "dflash" else None

        def runner() -> Any:
            captured: set[Any] = set()

            def warmup_and_capture(desc: Any, cudagraph_runtime_mode: Any, **kwargs: Any) -> None:
                self.pool.forward("target", desc.num_tokens, "CAPTURE_" + cudagraph_runtime_mode.name, desc.uniform)
                if drafter is not None and cudagraph_runtime_mode.name == "PIECEWISE":
                    width = min(desc.num_tokens, cap) if cap else desc.num_tokens
                    mode, key = drafter.dispatch(width)
                    if mode.name == "PIECEWISE" and key not in captured:
                        captured.add(key)
                        self.pool.forward("drafter", key.num_tokens, "CAPTURE_PIECEWISE", None)

            nothing = contextlib.nullcontext
            s = types.SimpleNamespace(
                vllm_config=r.vllm_config, cudagraph_dispatcher=self.v1_dispatcher(r), device=None,
                max_model_len=8192, max_num_tokens=r.cfg.max_num_batched_tokens, lora_config=None,
                parallel_config=r.vllm_config.parallel_config,
                _warmup_and_capture=wrap_warmup(warmup_and_capture) if wrap_warmup else warmup_and_capture,
                _init_minimal_kv_cache_for_profiling=lambda: None, _cleanup_profiling_kv_cache=lambda: None,
                _create_encoder_cudagraph_manager=lambda: None, _freeze_gc=nothing,
                maybe_remove_all_loras=lambda cfg: None)
            s._capture_cudagraphs = types.MethodType(cls._capture_cudagraphs, s)
            return s

        self.pool.reset(costs)
        s = runner()
        start = self.pool.memory_info()[0]
        for mode, descs in s.cudagraph_dispatcher.get_capture_descs():
            s._capture_cudagraphs(batch_descriptors=descs, cudagraph_runtime_mode=mode)
        real = start - self.pool.memory_info()[0]
        graphs = list(self.pool.log)
        self.pool.reset(costs)
        estimate = int(cls.profile_cudagraph_memory(runner()))
        return Capture(graphs, real, estimate)

    # ------------------------------------------------------------------------------------------------------- KV
    def kv_bytes_per_token(self, layers: Sequence[tuple[int, int, int, str]]) -> int:
        """KV bytes per token on one rank: each `(layers, kv heads on the rank, head_dim, dtype)` group as vLLM's
        `FullAttentionSpec.page_size_bytes` for a 16-token block, per token, times its layers."""
        import torch

        total = 0
        for count, heads, head_dim, dtype in layers:
            spec = self.FullAttentionSpec(block_size=16, num_kv_heads=heads, head_size=head_dim,
                                          dtype=getattr(torch, dtype))
            assert spec.page_size_bytes % 16 == 0
            total += count * spec.page_size_bytes // 16
        return total

    def kv_plan(self, layers: Sequence[tuple[int, int, int, str]], max_model_len: int,
                available_bytes: int) -> tuple[bool, int, float]:
        """(vLLM starts, "GPU KV cache size" tokens, "Maximum concurrency") for `available_bytes` of KV memory on one
        rank: vLLM's own `check_enough_kv_cache_memory`, `get_kv_cache_configs` and `get_kv_cache_capacity`
        (v1/core/kv_cache_planning.py, kv_cache_utils.py). Stand-ins: the config sections they read (the model's
        max_model_len, one rank, no hybrid manager, no sparse host pool) and the layout the engine core would resolve
        (`LBNHC`, FlashAttention's NHD); the cache config is vLLM's own."""
        import torch
        from vllm.config import CacheConfig
        from vllm.v1.core import kv_cache_planning, kv_cache_utils

        specs = {f"layer.{g}.{i}": self.FullAttentionSpec(block_size=16, num_kv_heads=heads, head_size=head_dim,
                                                          dtype=getattr(torch, dtype))
                 for g, (count, heads, head_dim, dtype) in enumerate(layers) for i in range(count)}
        cache = CacheConfig()
        cache.kv_cache_layout = "LBNHC"
        ns = types.SimpleNamespace
        config = ns(model_config=ns(max_model_len=max_model_len, original_max_model_len=max_model_len),
                    cache_config=cache, attention_config=ns(hisparse_config=None), speculative_config=None,
                    kv_transfer_config=None,
                    parallel_config=ns(tensor_parallel_size=1, decode_context_parallel_size=1,
                                       prefill_context_parallel_size=1, data_parallel_size=1, pipeline_parallel_size=1),
                    scheduler_config=ns(disable_hybrid_kv_cache_manager=False, max_num_seqs=1,
                                        max_num_batched_tokens=max_model_len))
        try:
            kv_cache_planning.check_enough_kv_cache_memory(config, specs, available_bytes)
        except ValueError:
            return False, 0, 0.0
        groups = kv_cache_planning.get_kv_cache_groups(config, dict(specs))
        plan = kv_cache_planning.get_kv_cache_configs(config, [specs], [available_bytes], groups)[0]
        tokens, concurrency = kv_cache_utils.get_kv_cache_capacity(config, plan)
        return True, tokens, concurrency

    def kv_available_bytes(self, total_memory: int, utilization: float, non_kv: int, estimate: int,
                           estimate_enabled: bool) -> int:
        """What vLLM logs as "Available KV cache memory": `request_memory` (v1/worker/utils.py, vLLM's own), minus the
        non-KV memory and the applied estimate as `Worker.determine_available_memory` subtracts them
        (gpu_worker.py:720-757, copied: the method runs the profiling itself). Stand-ins: the memory snapshot (all of
        the device free) and the cache config (its utilization)."""
        snapshot = types.SimpleNamespace(total_memory=total_memory, free_memory=total_memory, device_=0)
        requested = self.request_memory(snapshot, types.SimpleNamespace(gpu_memory_utilization=utilization))
        applied = estimate if estimate_enabled else 0
        return requested - non_kv - applied


# --------------------------------------------------------------------------------------------- plain data
@dataclass(frozen=True)
class Config:
    """One serving configuration, in the terms both vLLM and cgtune take."""

    runner: str
    """`v1` or `v2`."""
    cudagraph_mode: str
    """The mode the user asks for."""
    max_num_seqs: int
    max_num_batched_tokens: int
    num_speculative_tokens: int = 0
    method: str | None = None
    """Speculative method (None: no speculation)."""
    schedule: tuple[tuple[int, int, int], ...] | None = None
    """Dynamic speculative schedule (`num_speculative_tokens_per_batch_size`)."""
    capture_sizes: tuple[int, ...] | None = None
    """Explicit `cudagraph_capture_sizes` (None: vLLM's default)."""
    max_capture_size: int | None = None
    """Explicit `max_cudagraph_capture_size`."""
    gpu_capability: tuple[int, int] = (9, 0)
    performance_mode: str = "balanced"
    fused_decode: bool = True
    """V2 EAGLE: the draft attention updates its metadata in place (one fused decode graph)."""


@dataclass(frozen=True)
class Request:
    """One request of a batch, as vLLM's runner sees it."""

    tokens: int
    """Tokens scheduled for it this step."""
    drafts: int = 0
    """Draft tokens among them (a decode request verifying K drafts has 1 + K tokens)."""
    prefill_len: int = 64
    """Its prompt length."""
    computed_prefill: int = 64
    """Prompt tokens already computed (< prefill_len: it is prefilling)."""


@dataclass
class Resolved:
    """vLLM's resolved config: the runner's mode, the list it runs, the schedule in force."""

    cfg: Config
    vllm_config: Any
    mode: str
    sizes: list[int]
    max_size: int
    schedule: list[list[int]] | None
    q: int
    error: str | None = None
    """vLLM refused the config (the message)."""


Costs = Any
"""`(owner, mode, width) -> (standalone_bytes, delta_bytes)`."""


@dataclass
class Capture:
    """One runner's capture: the graphs in the order they entered the pool, the real pool and the estimate."""

    graphs: list[tuple[str, str, int]]
    real_bytes: int
    estimate_bytes: int


class SimulatedPool:
    """Device memory as graph captures take it: a graph captured into an empty pool costs its standalone footprint,
    every later one its delta (cgtune's model of the shared pool, tuner/engines/vllm/memory.py, fed the same costs on
    both sides). What the oracle compares is therefore which graphs vLLM's code captures, in which order, and how its
    profiling routines sample and extrapolate them."""

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
        graph, NONE outside a warm-up (nothing). `CAPTURE_<mode>` charges a graph of that mode (V1's stand-in)."""
        if cg_mode.startswith("CAPTURE_"):
            mode = cg_mode.removeprefix("CAPTURE_")
        elif cg_mode == "PIECEWISE":
            mode = "PIECEWISE"
        elif cg_mode == "NONE" and self.in_full:
            mode = "FULL"
        else:
            return
        standalone, delta = self.costs(owner, mode, width)
        self.used += standalone if not self.log else delta
        self.log.append((owner, mode, width))


class _PlatformStandIn:
    """The CUDA platform's graph-pool handles (opaque tokens here)."""

    _global_graph_pool: Any = None

    def graph_pool_handle(self) -> object:
        return object()

    def get_global_graph_pool(self) -> object:
        if type(self)._global_graph_pool is None:
            type(self)._global_graph_pool = object()
        return type(self)._global_graph_pool


class _Offloader:
    """The weight offloader's copy-stream joins (CUDA streams)."""

    def sync_prev_onload(self) -> None: ...

    def join_after_forward(self) -> None: ...


class _Graph:
    """torch.cuda.CUDAGraph: nothing is recorded on CPU."""
