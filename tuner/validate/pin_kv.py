"""`--pin-kv`: the KV cache a deployment pins (vLLM's own `--kv-cache-memory-bytes`) from what vLLM's engine measured
for the shipped list in validation, so its size no longer rides on vLLM's start-up estimate (public start-up logs
show that estimate off by 0.45x to 1.43x). What the figure is depends on how the release sizes the KV cache:

- from a graph-memory estimate made before capture (vLLM 0.33; 0.34 without its extensible KV cache): the KV budget
  vLLM sized with the estimate it subtracted put back and the real pool its capture then took subtracted instead,
  less vLLM's own 150 MiB margin (the figure its "to fit into requested memory" hint is made of, without counting
  the estimate twice): what the engine would have sized had its estimate been exact;
- after capture, by measurement (0.34's extensible KV cache, the default), or from a fixed space (vLLM's CPU build):
  the KV cache the engine kept for the list; pinned, 0.34 turns its extensible cache off and keeps that size.

Never below the KV the deployment needs: a list whose measured KV is short is not pinned (it is not shipped either)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from tuner.model.costmodel import CostModel

__all__ = ["REDUNDANCY_BYTES", "Validated", "pin_kv"]

REDUNDANCY_BYTES = 150 << 20
"""vLLM's margin in its own `--kv-cache-memory` hint (gpu_worker.py compile_or_warm_up_model: "memory profiling may
slightly underestimate the memory consumption. So leave a small buffer (=150MiB) to avoid OOM")."""


class Validated(Protocol):
    """What the pin reads of a list's validation (`tuner.validate.validation.ListValidation`, which imports this
    module: named by its fields, not imported back)."""

    name: str
    capture_sizes: Sequence[int]
    engine: dict[str, Any] | None
    measured_kv_bytes: int | None
    required_kv_bytes: int


def pin_kv(model: CostModel, result: Validated) -> tuple[dict[str, Any] | None, str]:
    """(the pin for the list {"bytes", "capture_sizes", "how", "measured_kv_bytes"}, or None; why, in words)."""
    e = result.engine or {}
    if not e.get("started") or result.measured_kv_bytes is None:
        return None, f"{result.name}: vLLM's engine did not run the list, so nothing was measured to pin"
    kept = int(result.measured_kv_bytes)
    budget, pool, estimate = e.get("kv_budget_bytes"), e.get("pool_bytes"), e.get("estimate_bytes")
    if model.engine.makes_estimate and budget is not None and pool is not None:
        applied = int(estimate or 0) if model.budget.estimate_enabled else 0
        value = int(budget) + applied - int(pool) - REDUNDANCY_BYTES
        how = (f"vLLM's KV budget {int(budget)} B with its estimate ({applied} B) put back and its real pool "
               f"({int(pool)} B) taken instead, less vLLM's 150 MiB margin")
    else:
        value = kept
        how = "the KV cache vLLM's engine kept for the list"
    need = result.required_kv_bytes
    if value < need:
        return None, (f"{result.name}: the KV cache the measurement allows, {value / (1 << 30):.3f} GiB, is below the "
                      f"{need / (1 << 30):.3f} GiB the deployment needs: not pinned")
    pin = {"bytes": value, "capture_sizes": list(result.capture_sizes), "how": how, "measured_kv_bytes": kept,
           "list": result.name}
    return pin, f"{result.name}: KV cache pinned at {value} B ({value / (1 << 30):.3f} GiB per rank): {how}"
