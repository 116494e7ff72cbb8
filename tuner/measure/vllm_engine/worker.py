"""The measurement as it runs inside each vLLM worker (`LLM.collective_rpc`): the runner's own step at a width in each
mode, timed; the LM head alone; the KV-cache spec; what the runner is. Module-level functions, so a multi-process
executor sends them by reference."""

from __future__ import annotations

from typing import Any

__all__ = ["captures", "describe", "logits_fn", "step_fn", "is_uniform", "time_width", "warm"]


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


def describe(worker: Any) -> dict[str, Any]:
    """The runner's class and generation, its attention backends, its KV-cache spec and its parameter bytes."""
    runner = _runner(worker)
    backends = set()
    for groups in getattr(runner, "attn_groups", None) or []:
        for g in groups:
            backends.add(getattr(g.backend, "__name__", str(g.backend)))
    model = runner.model if hasattr(runner, "model") else worker.get_model()
    return {
        "runner_class": type(runner).__name__,
        "runner": generation(runner),
        "attention_backends": sorted(backends),
        "kv_cache": kv_cache_summary(runner.get_kv_cache_spec()),
        "weights_bytes": int(sum(p.numel() * p.element_size() for p in model.parameters())),
        "rank": int(getattr(worker, "rank", 0) or 0),
    }


def captures(worker: Any) -> list[dict[str, Any]]:
    """The graphs this worker's process captured, in vLLM's order, with their free-memory drops (hooks.CAPTURES)."""
    from tuner.measure.vllm_engine.hooks import CAPTURES

    return list(CAPTURES)


def step_fn(runner: Any, num_tokens: int, mode: str, *, uniform: bool, context_len: int) -> Any:
    """A callable running vLLM's own step at `num_tokens` in `mode` ("eager", "piecewise", "full"), then the LM head
    over the width's real tokens (the profile's contract: every mode computes logits for its own tokens)."""
    import torch
    from vllm.config import CUDAGraphMode

    cg = {"eager": CUDAGraphMode.NONE, "piecewise": CUDAGraphMode.PIECEWISE, "full": CUDAGraphMode.FULL}[mode]
    if generation(runner) == "v2":
        from tuner.measure.vllm_engine.hooks import forced_dispatch

        def run() -> Any:
            with forced_dispatch(runner.cudagraph_manager, {"eager": "none"}.get(mode, mode)):
                hidden, _ = runner._dummy_run(num_tokens, uniform_decode=uniform, context_len=context_len)
            return hidden
    else:
        # V1's dummy requests attend to their query only unless told otherwise (profile_seq_lens), and it builds
        # attention metadata only under FULL or when forced (without it, eager and PIECEWISE steps skip attention).
        def run() -> Any:
            hidden, _ = runner._dummy_run(num_tokens, cudagraph_runtime_mode=cg, uniform_decode=uniform,
                                          force_attention=True, profile_seq_lens=context_len or None)
            return hidden

    @torch.inference_mode()
    def step() -> None:
        hidden = run()
        runner.model.compute_logits(hidden[:num_tokens])

    return step


def logits_fn(runner: Any, num_tokens: int) -> Any:
    """The LM head alone over `num_tokens` hidden states (what runs after a graph's replay)."""
    import torch

    hidden = torch.zeros(num_tokens, runner.model_config.get_hidden_size(), dtype=runner.dtype, device=runner.device)

    @torch.inference_mode()
    def head() -> None:
        runner.model.compute_logits(hidden)

    return head


def time_width(worker: Any, num_tokens: int, modes: list[str], options: dict[str, Any]) -> dict[str, Any]:
    """Each of `modes` ("eager", "piecewise", "full", "logits") at `num_tokens`, back to back, with the budgets in
    `options` (warmup_ms, rep_ms, min_reps, max_reps, context_len, decode_query_len, max_num_seqs): {mode: summary or
    {"error": text}}. A uniform decode width runs as one (PIECEWISE graphs serve mixed batches, so never)."""
    import torch

    from tuner.measure.profile import error_text
    from tuner.measure.timing import CudaEventClock, WallClock, measure

    runner = _runner(worker)
    device = torch.device(runner.device)
    clock = CudaEventClock(device) if device.type == "cuda" else WallClock()
    out: dict[str, Any] = {}
    for mode in modes:
        try:
            fn = (logits_fn(runner, num_tokens) if mode == "logits" else
                  step_fn(runner, num_tokens, mode, uniform=is_uniform(num_tokens, options) and mode != "piecewise",
                          context_len=options["context_len"]))
            m = measure(fn, clock, warmup_ms=options["warmup_ms"], rep_ms=options["rep_ms"],
                        min_reps=options["min_reps"], max_reps=options["max_reps"])
        except Exception as exc:  # one mode failing must not lose the width's others
            out[mode] = {"error": error_text(exc)}
            continue
        out[mode] = {"median_ms": m.median_ms, "iqr_ms": m.iqr_ms, "noisy": m.noisy, "warmup_reps": m.warmup_reps,
                     "samples_ms": [round(x, 6) for x in m.samples_ms]}
    return out


def warm(worker: Any, widths: list[int], options: dict[str, Any]) -> None:
    """One eager step at each width, widest first, as vLLM warms up before serving: a compiled model whose first step
    after start-up is a single token specializes on it (vLLM's CPU build then fails wider steps)."""
    runner = _runner(worker)
    for w in sorted(widths, reverse=True):
        step_fn(runner, w, "eager", uniform=is_uniform(w, options), context_len=options["context_len"])()


def is_uniform(num_tokens: int, options: dict[str, Any]) -> bool:
    """Whether a step of `num_tokens` is a uniform decode batch (every request q tokens, at most max_num_seqs of them):
    vLLM then runs it as `uniform_decode`, the batch its FULL decode graphs serve."""
    q = options["decode_query_len"]
    return num_tokens % q == 0 and num_tokens // q <= options["max_num_seqs"]
