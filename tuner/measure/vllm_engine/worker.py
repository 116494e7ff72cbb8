"""The measurement as it runs inside each vLLM worker (`LLM.collective_rpc`): the runner's own step at a width in each
mode, timed (the drafter's pass left out of it); the drafter's own pass at a width, eagerly and replaying its graphs;
the LM head alone; the KV-cache spec; what the runner and its drafter are. Module-level functions, so a multi-process
executor sends them by reference."""

from __future__ import annotations

import contextlib
from typing import Any

__all__ = ["captures", "describe", "drafter_of", "drafter_step_fn", "extensible_kv_figures", "is_uniform", "lm_head",
           "logits_fn", "lora_case", "lora_weights_bytes", "parameter_bytes", "step_fn", "time_drafter_width",
           "time_width", "warm", "warm_drafter", "without_drafter"]


def _runner(worker: Any) -> Any:
    return worker.model_runner


def generation(runner: Any) -> str:
    """"v2" for the V2 model runner (vllm/v1/worker/gpu/model_runner.py), "v1" for V1's and its subclasses (the CPU
    build's CPUModelRunner)."""
    return "v2" if any(c.__module__ == "vllm.v1.worker.gpu.model_runner" for c in type(runner).__mro__) else "v1"


def kv_cache_summary(spec: dict[str, Any]) -> dict[str, Any]:
    """Bytes per token over every attention layer (page_size_bytes / block_size of each layer's spec), and the layers
    grouped by spec type."""
    per_token = 0
    groups: dict[str, dict[str, Any]] = {}
    for name, layer in spec.items():
        page, block = int(layer.page_size_bytes), int(layer.block_size)
        per_token += -(-page // block)
        g = groups.setdefault(type(layer).__name__, {"layers": 0, "block_size": block, "page_size_bytes": page})
        g["layers"] += 1
    return {"bytes_per_token": per_token, "layers": len(spec), "groups": groups,
            "source": "vLLM's get_kv_cache_spec(): page_size_bytes / block_size summed over the layers"}


def extensible_kv_figures(worker: Any) -> dict[str, Any] | None:
    """What vLLM 0.34's extensible KV cache sized the KV cache from, read off the worker after start-up (None without
    one: 0.33, or the cache turned off): its segments' block strides, the pool's bytes per block (the planned tensor's
    size over its blocks), the granule the segments are rounded to, the transient peak and torch's reserve growth the
    sizing steps measured, the free memory at start, and the blocks reserved and kept. The cost model sizes the KV
    cache from these to the block (`tuner.engines.vllm.v034.memory.ExtensibleKvRule`)."""
    runner = _runner(worker)
    kv = getattr(runner, "extensible_kv_cache", None)
    if kv is None:
        return None
    config = getattr(runner, "kv_cache_config", None)
    tensors = [t for t in getattr(config, "kv_cache_tensors", None) or [] if not getattr(t, "host_resident", False)]
    blocks = int(getattr(config, "num_blocks", 0) or 0)
    snapshot = getattr(worker, "init_snapshot", None)
    return {
        "segment_strides": [int(x) for x in kv.segment_strides],
        "pool_bytes_per_block": int(tensors[0].size) // blocks if tensors and blocks else None,
        "granule_bytes": int(kv.buffer.granularity),
        "transient_peak_bytes": int(kv.reserved_headroom_bytes),
        "torch_reserve_growth_bytes": int(kv.torch_reserve_growth_bytes),
        "init_free_memory_bytes": int(snapshot.free_memory) if snapshot is not None else None,
        "capacity_blocks": int(kv.capacity_blocks),
        "num_blocks": int(kv.num_committed_blocks),
        "source": "vLLM 0.34's ExtensibleKVCache and the worker's init snapshot, after start-up",
    }


def drafter_of(runner: Any) -> Any | None:
    """The runner's model-based drafter, V1's `drafter` (EagleProposer, DFlashProposer, DraftModelProposer) or V2's
    `speculator`, None without one (no speculation, or a model-free method such as ngram)."""
    import torch

    drafter = getattr(runner, "speculator" if generation(runner) == "v2" else "drafter", None)
    return drafter if isinstance(getattr(drafter, "model", None), torch.nn.Module) else None


def parameter_bytes(module: Any, exclude: set[int] = frozenset()) -> tuple[int, set[int]]:  # type: ignore[assignment]
    """(bytes of `module`'s parameters, the storages counted): each tensor once, none in `exclude` (a drafter's shared
    embedding and LM head are the target's). vLLM's CPU build packs each linear layer's weight for its GEMM and leaves
    the parameter empty (model_executor/layers/utils.py `dispatch_cpu_unquantized_gemm`): such a weight counts at its
    layer's shape."""
    seen, total = set(exclude), 0
    for layer in module.modules():
        for name, p in layer.named_parameters(recurse=False):
            if p.numel() == 0:
                rows = getattr(layer, "output_size_per_partition", getattr(layer, "output_size", None))
                cols = getattr(layer, "input_size_per_partition", getattr(layer, "input_size", None))
                if name == "weight" and isinstance(rows, int) and isinstance(cols, int):
                    total += rows * cols * p.element_size()
                continue
            if p.data_ptr() in seen:
                continue
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total, seen


def _draft_layer_names(drafter: Any) -> set[str]:
    """The attention layers vLLM added for the drafter (V1 `_draft_attn_layer_names`, V2 `draft_attn_layer_names`)."""
    names = getattr(drafter, "draft_attn_layer_names", None)
    if names is None:
        names = getattr(drafter, "_draft_attn_layer_names", None)
    return set(names or ())


def describe(worker: Any) -> dict[str, Any]:
    """The runner's class and generation, its attention backends, its KV-cache spec (every layer vLLM gives KV cache,
    the drafter's included) and its parameter bytes; with a model-based drafter, its class, its own parameter bytes
    (what it shares with the target not counted again) and its share of the KV spec."""
    runner = _runner(worker)
    backends = set()
    for groups in getattr(runner, "attn_groups", None) or []:
        for g in groups:
            backends.add(getattr(g.backend, "__name__", str(g.backend)))
    model = runner.model if hasattr(runner, "model") else worker.get_model()
    spec = runner.get_kv_cache_spec()
    weights, storages = parameter_bytes(model)
    out = {
        "runner_class": type(runner).__name__,
        "runner": generation(runner),
        "attention_backends": sorted(backends),
        "kv_cache": {**kv_cache_summary(spec), **({"extensible": figures}
                                                   if (figures := extensible_kv_figures(worker)) else {})},
        "weights_bytes": weights,
        "rank": int(getattr(worker, "rank", 0) or 0),
        "drafter": None,
    }
    drafter = drafter_of(runner)
    if drafter is not None:
        names = _draft_layer_names(drafter) & set(spec)
        out["drafter"] = {
            "class": type(drafter).__name__,
            "weights_bytes": parameter_bytes(drafter.model, storages)[0],
            "kv_cache": {**kv_cache_summary({n: spec[n] for n in sorted(names)}), "layer_names": sorted(names)},
        }
    return out


def captures(worker: Any) -> list[dict[str, Any]]:
    """The graphs this worker's process captured, in vLLM's order, with their free-memory drops (hooks.CAPTURES); a V2
    drafter graph says which of its speculator's managers captured it (`role`: `prefill` for draft step 0 and
    DFlash's query pass, `decode` for EAGLE's one-token draft steps)."""
    from tuner.measure.vllm_engine.hooks import CAPTURES

    drafter = drafter_of(_runner(worker))
    roles = {}
    if drafter is not None:
        for attr, role in (("prefill_cudagraph_manager", "prefill"), ("query_cudagraph_manager", "prefill"),
                           ("decode_cudagraph_manager", "decode")):
            manager = getattr(drafter, attr, None)
            if manager is not None:
                roles[id(manager)] = role
    out = []
    for c in CAPTURES:
        c = dict(c)
        manager = c.pop("manager_id", None)
        if c.get("owner") == "drafter":
            c["role"] = roles.get(manager, "prefill" if manager is None else "other")
        out.append(c)
    return out


class without_drafter:
    """While inside, the runner's target step runs without the drafter's pass: V1's `_dummy_run` calls
    `drafter.dummy_run` and V2's calls `speculator.propose` after the target's forward (vLLM's own dummy step drafts
    too), and the profile's target rows are the target's alone. The instance's method is replaced by a no-op that
    counts its calls (`skipped`), the class's again afterwards."""

    def __init__(self, runner: Any) -> None:
        self.drafter = drafter_of(runner)
        self.name = "propose" if generation(runner) == "v2" else "dummy_run"
        self.skipped = 0

    def _skip(self, *args: Any, **kwargs: Any) -> None:
        self.skipped += 1

    def __enter__(self) -> without_drafter:
        if self.drafter is not None:
            setattr(self.drafter, self.name, self._skip)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.drafter is not None:
            delattr(self.drafter, self.name)


def step_fn(runner: Any, num_tokens: int, mode: str, *, uniform: bool, context_len: int, loras: int = 0) -> Any:
    """A callable running vLLM's own step at `num_tokens` in `mode` ("eager", "piecewise", "full"), then the LM head
    over the width's real tokens (the profile's contract: every mode computes logits for its own tokens). `loras`: the
    LoRA case the step runs with (V1's dummy step selects that many dummy adapters, and dispatches to its graphs)."""
    import torch
    from vllm.config import CUDAGraphMode

    cg = {"eager": CUDAGraphMode.NONE, "piecewise": CUDAGraphMode.PIECEWISE, "full": CUDAGraphMode.FULL}[mode]
    if generation(runner) == "v2":
        from tuner.measure.vllm_engine.hooks import forced_dispatch

        if loras:
            raise LookupError("V2's dummy step runs max_loras adapters whatever the case: LoRA cases are not timed")

        def run() -> Any:
            with forced_dispatch(runner.cudagraph_manager, {"eager": "none"}.get(mode, mode)):
                hidden, _ = runner._dummy_run(num_tokens, uniform_decode=uniform, context_len=context_len)
            return hidden
    else:
        # V1's dummy requests attend to their query only unless told otherwise (profile_seq_lens), and it builds
        # attention metadata only under FULL or when forced (without it, eager and PIECEWISE steps skip attention).
        def run() -> Any:
            hidden, _ = runner._dummy_run(num_tokens, cudagraph_runtime_mode=cg, uniform_decode=uniform,
                                          force_attention=True, profile_seq_lens=context_len or None,
                                          **({"num_active_loras": loras} if loras else {}))
            return hidden

    @torch.inference_mode()
    def step() -> None:
        hidden = run()
        lm_head(runner, hidden[:num_tokens])

    return step


def lm_head(runner: Any, hidden: Any) -> Any:
    """The target's LM head over `hidden` (`compute_logits`). Under LoRA vLLM wraps the logits processor, whose adapters
    are mapped for a step's sampled tokens only: the head over every token runs the wrapped processor's own base layer
    (the LM head without its adapters)."""
    model = runner.model
    base = getattr(getattr(model, "logits_processor", None), "base_layer", None)
    if base is not None and hasattr(model, "lm_head"):
        return base(model.lm_head, hidden)
    return model.compute_logits(hidden)


def logits_fn(runner: Any, num_tokens: int) -> Any:
    """The LM head alone over `num_tokens` hidden states (what runs after a graph's replay)."""
    import torch

    hidden = torch.zeros(num_tokens, runner.model_config.get_hidden_size(), dtype=runner.dtype, device=runner.device)

    @torch.inference_mode()
    def head() -> None:
        lm_head(runner, hidden)

    return head


def lora_case(mode: str) -> tuple[int, str]:
    """(LoRA case, base mode) of a row mode: `lora4_full` -> (4, "full"), `eager` -> (0, "eager")."""
    if mode.startswith("lora"):
        case, base = mode.removeprefix("lora").split("_", 1)
        return int(case), base
    return 0, mode


def lora_weights_bytes(worker: Any) -> int:
    """Bytes of the LoRA weight buffers vLLM allocated in the model (every LoRA layer's `lora_a_stacked` and
    `lora_b_stacked`, each tensor once)."""
    import torch

    seen, total = set(), 0
    for module in _runner(worker).model.modules():
        for attr in ("lora_a_stacked", "lora_b_stacked"):
            value = getattr(module, attr, None)
            for t in value if isinstance(value, tuple | list) else (value,):
                if isinstance(t, torch.Tensor) and t.data_ptr() not in seen:
                    seen.add(t.data_ptr())
                    total += t.numel() * t.element_size()
    return total


def _summary(m: Any) -> dict[str, Any]:
    return {"median_ms": m.median_ms, "iqr_ms": m.iqr_ms, "noisy": m.noisy, "warmup_reps": m.warmup_reps,
            "samples_ms": [round(x, 6) for x in m.samples_ms]}


def _clock(runner: Any) -> Any:
    import torch

    from tuner.measure.timing import CudaEventClock, WallClock

    device = torch.device(runner.device)
    return CudaEventClock(device) if device.type == "cuda" else WallClock()


def time_width(worker: Any, num_tokens: int, modes: list[str], options: dict[str, Any]) -> dict[str, Any]:
    """Each of `modes` ("eager", "piecewise", "full", "logits") at `num_tokens`, back to back, with the budgets in
    `options` (warmup_ms, rep_ms, min_reps, max_reps, context_len, decode_query_len, max_num_seqs): {mode: summary or
    {"error": text}}. A uniform decode width runs as one (PIECEWISE graphs serve mixed batches, so never). With a
    model-based drafter its pass is left out of every step (`without_drafter`); a step's summary says how many
    drafter passes were skipped (`drafter_calls_skipped`: one per call of the step)."""
    runner = _runner(worker)

    def fn(mode: str) -> Any:
        if mode == "logits":
            return logits_fn(runner, num_tokens)
        loras, base = lora_case(mode)
        return step_fn(runner, num_tokens, base, uniform=is_uniform(num_tokens, options) and base != "piecewise",
                       context_len=options["context_len"], loras=loras)

    return _time_modes(runner, modes, options, fn, drafter_left_out=True)


def _time_modes(runner: Any, modes: list[str], options: dict[str, Any], fn: Any, *, drafter_left_out: bool = False,
                prefix: str = "") -> dict[str, Any]:
    """Each of `modes` timed back to back (`fn(mode)` the callable; the budgets in `options`): {mode without
    `prefix`: summary or {"error": text}}; `drafter_left_out`: each runs `without_drafter`, its step's summary
    saying how many drafter passes it skipped."""
    from tuner.measure.profile import error_text
    from tuner.measure.timing import measure

    clock = _clock(runner)
    out: dict[str, Any] = {}
    for mode in modes:
        key = mode.removeprefix(prefix)
        skip = without_drafter(runner) if drafter_left_out else None
        try:
            with skip if skip is not None else contextlib.nullcontext():
                m = measure(fn(mode), clock, warmup_ms=options["warmup_ms"], rep_ms=options["rep_ms"],
                            min_reps=options["min_reps"], max_reps=options["max_reps"])
        except Exception as exc:  # one mode failing must not lose the width's others
            out[key] = {"error": error_text(exc)}
            continue
        out[key] = _summary(m)
        if skip is not None and skip.drafter is not None and mode != "logits":
            out[key]["drafter_calls_skipped"] = skip.skipped
    return out


DRAFTER_ROW_MODES = ("drafter_eager", "drafter_piecewise", "drafter_full")


def _v2_graph_manager(drafter: Any) -> Any:
    """The V2 speculator's manager of its width-keyed graphs: draft step 0's (EAGLE, EAGLE3, MTP, a 0.34 draft model)
    or DFlash's query pass's."""
    manager = getattr(drafter, "prefill_cudagraph_manager", None)
    return manager if manager is not None else getattr(drafter, "query_cudagraph_manager", None)


def _full_descriptor(manager: Any, num_tokens: int, query_len: int) -> Any:
    """The FULL graph `manager` captured at `num_tokens` (no LoRA), the one at `query_len` tokens a request first;
    LookupError when it captured none."""
    found = [d for d in getattr(manager, "graphs", {}) if d.num_tokens == num_tokens and not d.num_active_loras
             and str(getattr(d.cg_mode, "name", d.cg_mode)).lower() == "full"]
    if not found:
        raise LookupError(f"no FULL drafter graph captured for {num_tokens} tokens")
    return min(found, key=lambda d: d.uniform_token_count != query_len)


def drafter_step_fn(runner: Any, num_tokens: int, mode: str, *, query_len: int = 1) -> Any:
    """A callable running vLLM's own drafter pass over `num_tokens` tokens in `mode` (one of DRAFTER_ROW_MODES), then
    the drafter's LM head over them (as the target's rows compute logits for their own tokens).

    V1 (the CPU build's runner too): `drafter.dummy_run`, the pass vLLM's dummy step and its graph capture run, for
    one forward pass (`is_graph_capturing`: vLLM runs K of them otherwise, one per draft), its PIECEWISE graph replayed
    with `use_cudagraphs`; like vLLM's own it builds no attention metadata. V2: the speculator's `_run_model`, eagerly
    or through its PIECEWISE graphs (no attention metadata either), and for `drafter_full` a replay of the FULL graph
    its manager captured at that width (model, logits and sampling of its requests, as vLLM records it: no LM head
    after it)."""
    import torch
    from vllm.config import CUDAGraphMode

    drafter = drafter_of(runner)
    if drafter is None:
        raise LookupError("the runner has no model-based drafter")
    hidden = torch.zeros(num_tokens, _drafter_hidden_size(runner, drafter), dtype=runner.dtype, device=runner.device)
    if generation(runner) == "v1":
        graphs = mode == "drafter_piecewise"
        if mode == "drafter_full":
            raise LookupError("V1 captures the drafter in PIECEWISE graphs only")

        def run() -> None:
            drafter.dummy_run(num_tokens, use_cudagraphs=graphs, is_graph_capturing=True)
    elif mode == "drafter_full":
        manager = _v2_graph_manager(drafter)
        desc = _full_descriptor(manager, num_tokens, query_len)

        @torch.inference_mode()
        def replay() -> None:
            manager.run_fullgraph(desc)

        return replay
    else:
        cg = CUDAGraphMode.PIECEWISE if mode == "drafter_piecewise" else CUDAGraphMode.NONE
        standalone = any(c.__name__ == "StandaloneARSpeculator" for c in type(drafter).__mro__)
        if standalone and cg != CUDAGraphMode.NONE:
            raise LookupError("a V2 draft model's PIECEWISE graphs are not timed by cgtune yet")

        def run() -> None:
            if standalone:  # its pass takes its own token ids and positions
                buffers = drafter.input_buffers
                drafter._run_model(buffers.input_ids[:num_tokens], buffers.positions[:num_tokens], None, None, None)
            else:
                drafter._run_model(num_tokens, None, None, None, cudagraph_runtime_mode=cg)

    @torch.inference_mode()
    def step() -> None:
        run()
        drafter.model.compute_logits(hidden)

    return step


def _drafter_hidden_size(runner: Any, drafter: Any) -> int:
    """The width of the hidden states the drafter's LM head reads (V1 keeps it as `hidden_size`)."""
    size = getattr(drafter, "hidden_size", None)
    if isinstance(size, int):
        return size
    config = getattr(getattr(drafter, "draft_model_config", None), "get_hidden_size", None)
    return int(config()) if config is not None else int(runner.model_config.get_hidden_size())


def time_drafter_width(worker: Any, num_tokens: int, modes: list[str], options: dict[str, Any]) -> dict[str, Any]:
    """Each of `modes` (DRAFTER_ROW_MODES) at `num_tokens`, back to back, as `time_width` times the target's:
    {mode without its `drafter_` prefix: summary or {"error": text}}."""
    runner = _runner(worker)
    return _time_modes(runner, modes, options, lambda mode: drafter_step_fn(
        runner, num_tokens, mode, query_len=options["decode_query_len"]), prefix="drafter_")


def warm(worker: Any, widths: list[int], options: dict[str, Any]) -> None:
    """One eager step at each width, widest first, as vLLM warms up before serving: a compiled model whose first step
    after start-up is a single token specializes on it (vLLM's CPU build then fails wider steps)."""
    runner = _runner(worker)
    for w in sorted(widths, reverse=True):
        step_fn(runner, w, "eager", uniform=is_uniform(w, options), context_len=options["context_len"])()


def warm_drafter(worker: Any, widths: list[int]) -> None:
    """One eager drafter pass at each width, widest first (as `warm` does for the target's steps)."""
    runner = _runner(worker)
    for w in sorted(widths, reverse=True):
        drafter_step_fn(runner, w, "drafter_eager")()


def is_uniform(num_tokens: int, options: dict[str, Any]) -> bool:
    """Whether a step of `num_tokens` is a uniform decode batch (every request q tokens, at most max_num_seqs of them):
    vLLM then runs it as `uniform_decode`, the batch its FULL decode graphs serve."""
    q = options["decode_query_len"]
    return num_tokens % q == 0 and num_tokens // q <= options["max_num_seqs"]
