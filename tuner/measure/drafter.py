"""The speculative drafter a profile sweep measures beside the target: its widths and graph modes by vLLM 0.33's
rules (`tuner.engines.vllm.drafter`), its stand-in decoder, and where its graphs enter the one shared pool."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tuner.engines.vllm.drafter import (
    DrafterGraph,
    drafter_graphs_apart,
    drafter_kv_layers,
    drafter_shares,
    sweep_capture_sequence,
)
from tuner.measure.decoder import DecodeModel, build_model
from tuner.shapes import ModelShape
from tuner.workload import candidates as _candidates
from tuner.workload.spec import Workload

__all__ = ["DRAFTER_NOTE", "DrafterPlan", "build_drafter", "drafter_plan", "pool_sequence"]

DRAFTER_NOTE = (
    "drafter rows: one forward pass of a random-weight stand-in of the drafter's shape (its decoder layers over its "
    "own KV cache, final norm, LM-head logits for the pass's tokens) at the target's query structure (requests of q "
    "tokens, as DFlash's query pass and the draft prefill run; an EAGLE decode step's one token per request is not "
    "modelled apart), eagerly and as the graphs the runner captures for the method, captured into the shared pool "
    "in vLLM's order after (V2) or beside (V1) the target's; the target's hidden states an EAGLE/DFlash drafter "
    "also reads are not fed in"
)
"""What drafter rows are, in one line, for the profile metadata."""


@dataclass(frozen=True)
class DrafterPlan:
    """What a sweep measures for the workload's draft model."""

    method: str
    """The speculative method (eagle, eagle3, mtp, dflash, draft_model)."""
    runner: str
    """The model runner the workload resolves to (`v1` or `v2`): it decides the graph modes and the capture order."""
    shape: ModelShape
    """The drafter's shape (the workload's `speculative.drafter`)."""
    widths: tuple[int, ...]
    """Widths the drafter rows are measured at, ascending."""
    request_widths: tuple[int, ...]
    """Those of `widths` the sweep's own widths lack: request counts its N-token passes pad to."""
    graph_modes: tuple[str, ...]
    """Graph modes the runner captures the drafter in (`piecewise`, `full`, in capture order); empty: eager only."""
    shares_embedding: bool
    """The drafter uses the target's embedding tensor."""
    shares_lm_head: bool
    """The drafter uses the target's LM-head tensor."""
    kv_layers: int
    """Draft attention layers vLLM gives KV cache beside the target's."""

    @property
    def graphs_apart(self) -> bool:
        """The runner captures the drafter's graphs in a pass of their own after the target's (V2)."""
        return drafter_graphs_apart(self.runner)

    @property
    def row_modes(self) -> tuple[str, ...]:
        """Profile modes a finished drafter width has: `drafter_eager`, then `drafter_<mode>` per graph mode."""
        return ("drafter_eager",) + tuple(f"drafter_{m}" for m in self.graph_modes)

    def metadata(self, model: DecodeModel | None = None) -> dict[str, Any]:
        """The profile's `drafter` metadata; `weights_bytes` and `kv_cache_bytes` are the stand-in's own (None
        before it is built)."""
        return {
            "method": self.method,
            "shape": self.shape.as_dict(),
            "weights_bytes": None if model is None else model.weight_bytes(),
            "kv_layers": self.kv_layers,
            "kv_cache_bytes": None if model is None else model.kv_cache_bytes(),
            "runner": self.runner,
            "graph_modes": list(self.graph_modes),
            "shares_embedding": self.shares_embedding,
            "shares_lm_head": self.shares_lm_head,
            "widths_requested": list(self.widths),
            "request_widths": list(self.request_widths),
            "note": DRAFTER_NOTE,
        }


def drafter_plan(workload: Workload, sweep_widths: Sequence[int], *, widths: Sequence[int] | None = None
                 ) -> DrafterPlan | None:
    """The drafter's widths and graph modes for a sweep of `sweep_widths` (None without a draft model).

    Default widths: every sweep width (the draft prefill and DFlash's query pass run at the target's padded widths)
    plus, for methods whose later passes run N tokens (EAGLE/EAGLE3/MTP and draft_model with K >= 2, not drafting
    in parallel), the candidate widths those pad to (V2: <= max_num_seqs; V1: the rewritten list's members up to
    the one max_num_seqs pads to).
    `widths` replaces them. Graph modes: those `tuner.engines.vllm.drafter.drafter_graphs` gives over the candidate list
    for the workload's runner and cudagraph mode (V2 DFlash FULL, V2 EAGLE PIECEWISE and FULL, V1 PIECEWISE, V2
    draft_model none)."""
    spec = workload.speculative
    if spec is None or spec.drafter is None or spec.method is None:
        return None
    sweep = sorted(set(sweep_widths))
    rules = workload.engine.drafter_sweep(spec.method, _candidates.candidate_widths(workload.serving))
    if widths is None:
        chosen = sorted(set(sweep) | set(rules.pass_widths))
    else:
        chosen = sorted(set(widths))
        if not chosen or chosen[0] < 1:
            raise ValueError(f"drafter widths {chosen[:3]} must be non-empty, each >= 1")
    embedding, lm_head = drafter_shares(spec.method, spec.drafter, workload.model.shape,
                                        shares_embedding=spec.shares_embedding, shares_lm_head=spec.shares_lm_head)
    return DrafterPlan(
        method=spec.method,
        runner=rules.runner,
        shape=spec.drafter,
        widths=tuple(chosen),
        request_widths=tuple(w for w in chosen if w not in set(sweep)),
        graph_modes=rules.graph_modes,
        shares_embedding=embedding,
        shares_lm_head=lm_head,
        kv_layers=drafter_kv_layers(spec.method, spec.drafter.num_layers,
                                    num_nextn_predict_layers=spec.num_nextn_predict_layers),
    )


def build_drafter(workload: Workload, plan: DrafterPlan, target: DecodeModel, max_num_tokens: int, *, seed: int = 1,
                  allocate_kv_cache: bool = True) -> DecodeModel:
    """The drafter's stand-in for one rank, on the target's device: random weights of its shape, its own static KV
    cache (same requests, context length and q as the target's), and the target's embedding and LM-head tensors
    where the plan says it shares them (held once, as vLLM deletes the drafter's duplicate after loading)."""
    return build_model(workload, max_num_tokens, target.device, shape=plan.shape, seed=seed,
                       allocate_kv_cache=allocate_kv_cache,
                       shared_embed=target.embed if plan.shares_embedding else None,
                       shared_lm_head=target.lm_head if plan.shares_lm_head else None)


def pool_sequence(runner: str, target_widths: Sequence[int], target_modes: Sequence[str],
                  drafter_widths: Sequence[int] = (), drafter_modes: Sequence[str] = ()) -> list[tuple[str, str, int]]:
    """`(owner, mode, width)` (modes lower-case, owner `target` or `drafter`) in the order a sweep captures them
    into its one shared pool: `tuner.engines.vllm.drafter.capture_sequence` for the runner. V2: every target graph
    (PIECEWISE then FULL, largest first), then the drafter's in its modes' order, largest first. V1: each drafter
    graph right after the target's PIECEWISE graph of its width; a width only the drafter has gets a place-holder
    target capture there for the rule to place it, dropped from the result (its graph lands where vLLM would put it
    had the target that width)."""
    target = [(m.upper(), w) for m in target_modes for w in sorted(set(target_widths), reverse=True)]
    drafter = [DrafterGraph(m.upper(), w, "sweep") for m in drafter_modes
               for w in sorted(set(drafter_widths), reverse=True)]
    order = sweep_capture_sequence(runner=runner, target_graphs=target, drafter=drafter)
    return [(owner, mode.lower(), w) for owner, mode, w in order]
