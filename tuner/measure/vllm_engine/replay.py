"""A validation's trace as it runs inside each vLLM worker (`LLM.collective_rpc`): every step is vLLM's own dummy step
at its width, dispatched by vLLM's own dispatcher for the list the engine was built with (no forced mode), the mode
and padded width it chose recorded beside the step's time; and what the engine itself holds for that list (the capture
list its config kept, its graph-memory estimate, the pool its capture took, its memory figures). Module-level
functions, so a multi-process executor sends them by reference."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from tuner.measure.vllm_engine.worker import drafter_of, generation, kv_cache_summary, without_drafter

__all__ = ["LIST_FIELDS", "dispatch_recorder", "engine_figures", "replay_steps"]

LIST_FIELDS = ("cudagraph_capture_sizes", "prefill_cudagraph_capture_token_sizes",
               "decode_cudagraph_capture_request_sizes")
"""The compilation-config fields that hold a capture list (0.33: the first; 0.34: the other two as well)."""


def _mode_name(mode: Any) -> str:
    return str(getattr(mode, "name", mode)).upper()


@contextlib.contextmanager
def dispatch_recorder(runner: Any, seen: list[tuple[str, int]]) -> Iterator[None]:
    """Within the context, every dispatch vLLM's runner makes appends (runtime mode, padded width) to `seen`: V2's
    `CudaGraphManager.dispatch` (its BatchExecutionDescriptor), V1's `_determine_batch_execution_and_padding` (the
    mode and the descriptor it pads to). Wrapped on the instance, so the class is untouched."""
    if generation(runner) == "v2":
        manager = runner.cudagraph_manager
        original = manager.dispatch

        def dispatch(*args: Any, **kwargs: Any) -> Any:
            desc = original(*args, **kwargs)
            seen.append((_mode_name(desc.cg_mode), int(desc.num_tokens)))
            return desc

        manager.dispatch = dispatch
        try:
            yield
        finally:
            del manager.dispatch
        return
    original = runner._determine_batch_execution_and_padding

    def determine(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        seen.append((_mode_name(out[0]), int(out[1].num_tokens)))
        return out

    runner._determine_batch_execution_and_padding = determine
    try:
        yield
    finally:
        del runner._determine_batch_execution_and_padding


def _step(runner: Any, num_tokens: int, uniform: bool, context_len: int) -> Any:
    """vLLM's dummy step at `num_tokens` as its dispatcher dispatches it, then the LM head over the real tokens."""
    import torch

    @torch.inference_mode()
    def run() -> None:
        if generation(runner) == "v2":
            hidden, _ = runner._dummy_run(num_tokens, uniform_decode=uniform, context_len=context_len)
        else:  # attention metadata and the workload's context, as the profile's V1 rows (worker.step_fn)
            hidden, _ = runner._dummy_run(num_tokens, cudagraph_runtime_mode=None, uniform_decode=uniform,
                                          force_attention=True, profile_seq_lens=context_len or None)
        runner.model.compute_logits(hidden[:num_tokens])

    return run


def replay_steps(worker: Any, steps: list[list[Any]], options: dict[str, Any]) -> dict[str, Any]:
    """Time `steps` ([num_tokens, uniform decode] in trace order) back to back in chunks of `options["chunk_steps"]`
    (the profile's clock: CUDA events on a GPU, the wall clock on a CPU), each distinct step run once untimed first,
    widest first, as the validation's warm-up. Returns {"samples_ms": per step, "dispatched": {"T:u": [mode, padded
    width]}, "drafter_calls_skipped"}, the second what vLLM's dispatcher chose for each distinct step. A model-based
    drafter's pass is left out of every step run (`worker.without_drafter`; its skipped calls counted, the warm-up's
    too; None without a drafter): the trace is the target's steps, as the profile's target rows and the prediction
    are, and vLLM's dummy step would draft K passes at the step's full width, which no served step does."""
    import torch

    from tuner.measure.timing import CudaEventClock, WallClock

    runner = worker.model_runner
    device = torch.device(runner.device)
    clock = CudaEventClock(device) if device.type == "cuda" else WallClock()
    context = int(options["context_len"])
    distinct = sorted({(int(t), bool(u)) for t, u in steps}, key=lambda k: (-k[0], k[1]))
    fns = {k: _step(runner, k[0], k[1], context) for k in distinct}
    dispatched: dict[str, list[Any]] = {}
    order = [fns[(int(t), bool(u))] for t, u in steps]
    chunk = max(1, int(options.get("chunk_steps", 512)))
    samples: list[float] = []
    with without_drafter(runner) as skip:
        for key in distinct:
            seen: list[tuple[str, int]] = []
            with dispatch_recorder(runner, seen):
                fns[key]()
            mode, width = seen[0] if seen else ("NONE", key[0])
            dispatched[f"{key[0]}:{int(key[1])}"] = [mode, width]
        for lo in range(0, len(order), chunk):
            it = iter(order[lo:lo + chunk])
            samples += clock.time_ms(lambda: next(it)(), min(chunk, len(order) - lo))
    return {"samples_ms": [round(x, 6) for x in samples], "dispatched": dispatched,
            "drafter_calls_skipped": skip.skipped if skip.drafter is not None else None}


def engine_figures(worker: Any) -> dict[str, Any]:
    """What this worker's engine holds for the list it was built with: the capture lists and mode its compilation
    config kept (after the platform's rewrite: the CPU build empties them), the KV-cache spec, vLLM's own memory
    figures where its GPU worker made them (the requested memory, the KV budget it sized, its graph-memory estimate,
    the non-KV memory), the pool its capture took (`hooks.CAPTURE_TOTALS`: capture_model's return), and the class of
    the model-based drafter it built beside the target (None without one)."""
    from tuner.measure.vllm_engine.hooks import CAPTURE_TOTALS

    runner = worker.model_runner
    cc = worker.vllm_config.compilation_config
    lists = {f: [int(x) for x in getattr(cc, f)] for f in LIST_FIELDS if getattr(cc, f, None) is not None}
    figures: dict[str, Any] = {
        "runner": generation(runner), "runner_class": type(runner).__name__,
        "cudagraph_mode": _mode_name(cc.cudagraph_mode), "lists": lists,
        "kv_cache": kv_cache_summary(runner.get_kv_cache_spec()),
        "pool_bytes": int(CAPTURE_TOTALS[-1]) if CAPTURE_TOTALS else None,
        "drafter_class": None if (drafter := drafter_of(runner)) is None else type(drafter).__name__,
    }
    for name, key in (("requested_memory", "requested_bytes"), ("available_kv_cache_memory_bytes", "kv_budget_bytes"),
                      ("cudagraph_memory_estimate", "estimate_bytes"), ("total_consumed", "consumed_bytes"),
                      ("peak_activation_memory", "peak_activation_bytes")):
        value = getattr(worker, name, None)
        figures[key] = int(value) if isinstance(value, int | float) else None
    return figures
