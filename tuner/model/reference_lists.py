"""The lists every search is held to besides its own: the engine's widest capture (vLLM PR 50488's behaviour) and peer
engines' real default lists for the same configuration, evaluated as the engine's lists (`reference_lists`): the
exact solver starts from them and the compact choice weighs them, so no list cgtune ships is beaten by a row of its
own report."""

from __future__ import annotations

from collections.abc import Callable

from tuner.engines import sglang
from tuner.engines.registry import engine_of
from tuner.model.costmodel import CostModel
from tuner.workload.spec import ServingConfig

__all__ = ["PEER_LISTS", "reference_lists", "sglang_default_sizes", "sglang_sizes", "widest_sizes"]

MIB = 1 << 20


def widest_sizes(serving: ServingConfig) -> tuple[int, ...]:
    """The engine's own grid lifted to its widest decode batch, so every decode batch has a graph (vLLM: PR 50488's
    behaviour; SGLang and TensorRT-LLM: their generator run up to the request cap, as the engine filters it)."""
    return engine_of(serving).widest_sizes()


def sglang_sizes(serving: ServingConfig, *, gpu_memory_mib: float | None = None,
                 tensor_parallel_size: int = 1) -> tuple[int, ...]:
    """SGLang 0.5.23's OWN default decode list for the equivalent configuration, in token widths: max_running_requests
    = max_num_seqs, speculative decoding with speculative_num_draft_tokens = q when q > 1 (its speculative grid), max_bs
    from SGLang's GPU-memory table (`gpu_memory_mib`; None: SGLang's unknown-GPU 160) capped at the request cap, then
    its capture filter against the request pool (`tuner.engines.sglang.resolve_decode_graphs`); each batch size times q
    (SGLang captures by batch size), widths above max_num_batched_tokens dropped as vLLM drops them."""
    q = serving.decode_query_len
    # Any speculative algorithm selects the speculative grid; EAGLE's verify graphs hold num_draft_tokens = q tokens.
    graphs = sglang.resolve_decode_graphs(
        gpu_memory_mib=gpu_memory_mib, tp_size=tensor_parallel_size, max_running_requests=serving.max_num_seqs,
        speculative_algorithm="EAGLE" if q > 1 else None, speculative_num_draft_tokens=q if q > 1 else None)
    return tuple(b * q for b in graphs.batch_sizes if b * q <= serving.max_num_batched_tokens)


def sglang_default_sizes(model: CostModel) -> tuple[int, ...]:
    """`sglang_sizes` for a cost model's workload on its profile's device: SGLang reads nvidia-smi's memory.total,
    the profile records torch's total device memory (a few hundred MiB apart, the same row of SGLang's table)."""
    return sglang_sizes(model.serving, gpu_memory_mib=model.budget.total_memory_bytes / MIB,
                        tensor_parallel_size=model.workload.model.tensor_parallel_size)


PEER_LISTS: dict[str, Callable[[CostModel], tuple[int, ...]]] = {"sglang": sglang_default_sizes}
"""Other engines' real default lists for a vLLM workload's configuration, evaluated as vLLM capture lists under the
same model (a comparison of lists: vLLM's dispatch and memory rule, not the other engine's); the key names the row
(its label is the engine's `list_label`), for an engine that names it in its `peer_rows`."""


def reference_lists(model: CostModel) -> dict[str, tuple[int, ...]]:
    """The engine's default, its widest capture and its peer rows for the model's workload, by the report's row names."""
    out = {"default": tuple(model.default_sizes), "widest": tuple(widest_sizes(model.serving))}
    for name in model.engine.peer_rows:
        out[name] = tuple(PEER_LISTS[name](model))
    return out
