"""cgtune's hooks inside vLLM's worker (tuner/measure/vllm_engine/hooks.py), run against vLLM 0.33's own classes on CPU
through the oracle's stand-ins (tests/vllm/vllm_oracle.py): the per-capture memory readings around vLLM's real V2
`CudaGraphManager.capture` and V1 `_capture_cudagraphs` over the simulated pool, the forced dispatch over vLLM's real
`CudaGraphManager.dispatch` and `_is_compatible`, and the KV bytes per token from vLLM's real `FullAttentionSpec`.
What a GPU would decide (memory, graphs) is the simulated pool's; what is checked is that the hooks read vLLM's own
capture order, descriptors and dispatch. Run as a script in a process of its own (vLLM's import sets process-wide
options); prints one JSON object: {"status": "ok", ...} or {"status": "unavailable", "reason"}.

    python tests/vllm/engine_hooks_check.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import vllm_oracle as vo  # noqa: E402

from tuner.measure.vllm_engine import hooks  # noqa: E402
from tuner.measure.vllm_engine.worker import kv_cache_summary  # noqa: E402

SIZES = (4, 8, 12, 16, 20, 24, 32)
Q = 4


def costs(owner: str, mode: str, width: int) -> tuple[int, int]:
    """(standalone, delta) bytes of a graph: distinct per mode and width, so a reading assigned to the wrong graph
    shows."""
    code = 7 if mode == "FULL" else 3
    return 1_000_000 + 1000 * width + code, 100 * width + code


def expected(log: list[tuple[str, str, int]]) -> list[list[Any]]:
    """What each capture must read: the first graph into the empty pool its standalone cost, later ones their delta."""
    return [[mode.lower(), width, costs(owner, mode, width)[0 if i == 0 else 1]]
            for i, (owner, mode, width) in enumerate(log)]


def v2_checks(o: vo.Oracle) -> dict[str, Any]:
    cfg = vo.Config(runner="v2", cudagraph_mode="FULL_AND_PIECEWISE", max_num_seqs=8, max_num_batched_tokens=64,
                    num_speculative_tokens=Q - 1, method="ngram", capture_sizes=SIZES)
    r = o.resolve(cfg)
    base = o.v2_graphs.CudaGraphManager
    original = base.capture
    hooks.CAPTURES.clear()
    base.capture = hooks.wrap_v2_capture(original, free_bytes=lambda: o.pool.memory_info()[0])
    try:
        o.pool.reset(costs)
        manager = o.v2_manager(r, r.mode, r.q)
        manager.capture()
    finally:
        base.capture = original
    read = [[c["mode"], c["num_tokens"], c["free_delta_bytes"]] for c in hooks.CAPTURES]
    uniform = [[c["mode"], c["num_tokens"], c["uniform"]] for c in hooks.CAPTURES]
    # Forced dispatch over vLLM's own dispatch and candidates: each mode at each width, in uniform-decode batches.
    manager._graphs_captured = True
    forced: dict[str, dict[str, Any]] = {}
    for width in (*SIZES, 10, 40):
        got: dict[str, Any] = {"vllm": manager.dispatch(width // Q or 1, width, Q if width % Q == 0 else None,
                                                        0).cg_mode.name}
        for mode in ("none", "piecewise", "full"):
            try:
                with hooks.forced_dispatch(manager, mode):
                    d = manager.dispatch(width // Q or 1, width, Q if width % Q == 0 else None, 0)
                got[mode] = [d.cg_mode.name, d.num_tokens]
            except LookupError as exc:
                got[mode] = f"LookupError: {exc}"
        got["restored"] = manager.dispatch(width // Q or 1, width, Q if width % Q == 0 else None,
                                           0).cg_mode.name == got["vllm"]
        forced[str(width)] = got
    return {"sizes": list(r.sizes), "read": read, "expected": expected(o.pool.log), "uniform": uniform,
            "forced": forced, "grid": forced_grid(o, manager)}


def _desc(d: Any) -> list[Any]:
    """Every field of a `BatchExecutionDescriptor`, so a descriptor built with two counts swapped shows."""
    return [d.cg_mode.name, d.num_tokens, d.num_reqs, d.uniform_token_count, d.max_query_len, d.num_active_loras,
            d.num_ubatches]


def forced_grid(o: vo.Oracle, manager: Any) -> dict[str, Any]:
    """The forced dispatch over a grid of batches, called as vLLM's runner calls `dispatch`: positionally
    (num_reqs, num_tokens, uniform_token_count) with the rest by keyword (`dispatch_cg_and_sync_dp`, gpu/dp_utils.py),
    and all by keyword (`attn_utils.py`'s fast-prefill padding). Requests and tokens differ in every batch but one-token
    ones (uniform decode at q tokens a request, and mixed batches of 1..max_num_seqs requests), widths run past the
    largest graph, and one-microbatch graphs meet a two-microbatch batch: an argument passed in another position picks
    another graph or builds another descriptor. Each entry: [num_reqs, num_tokens, uniform, ubatches, way, vLLM's own
    descriptor, {mode: forced descriptor or "LookupError"}]; `captured`: every captured descriptor."""
    rows = []
    batches = [(n, n * Q, Q) for n in range(1, 9)] + [(n, t, None) for t in (1, 3, 10, 17, 31, 40, 100)
                                                       for n in (1, 2, 5, 8) if n <= t]
    calls = {
        "positional": lambda fn, n, t, u, ub: fn(n, t, u, num_active_loras=0, max_query_len=None, num_ubatches=ub),
        "keywords": lambda fn, n, t, u, ub: fn(num_reqs=n, num_tokens=t, uniform_token_count=u, num_active_loras=0,
                                               num_ubatches=ub),
    }
    for n, t, u in batches:
        for ub in (1, 2):
            for way, call in calls.items():
                own = _desc(call(manager.dispatch, n, t, u, ub))
                got: dict[str, Any] = {}
                for mode in ("none", "piecewise", "full"):
                    try:
                        with hooks.forced_dispatch(manager, mode):
                            got[mode] = _desc(call(manager.dispatch, n, t, u, ub))
                    except LookupError:
                        got[mode] = "LookupError"
                rows.append([n, t, u, ub, way, own, got])
    captured = [_desc(d) for descs in manager._capture_descs.values() for d in descs]
    return {"rows": rows, "captured": captured, "max_num_seqs": 8}


def v1_checks(o: vo.Oracle) -> dict[str, Any]:
    cfg = vo.Config(runner="v1", cudagraph_mode="FULL_AND_PIECEWISE", max_num_seqs=8, max_num_batched_tokens=64,
                    capture_sizes=SIZES)
    r = o.resolve(cfg)
    hooks.CAPTURES.clear()

    def wrap(fn: Any) -> Any:
        wrapped = hooks.wrap_v1_capture(lambda self, desc, *a, **k: fn(desc, *a, **k),
                                        free_bytes=lambda: o.pool.memory_info()[0])
        return lambda desc, *a, **k: wrapped(None, desc, *a, **k)

    capture = o.v1_capture(r, None, costs, wrap_warmup=wrap)
    # The oracle runs the real capture first, then vLLM's estimate (which captures a sample again): the hooks read both,
    # the real capture's first.
    real = hooks.CAPTURES[:len(capture.graphs)]
    return {"sizes": list(r.sizes), "read": [[c["mode"], c["num_tokens"], c["free_delta_bytes"]] for c in real],
            "expected": expected(capture.graphs), "uniform": [[c["mode"], c["num_tokens"], c["uniform"]] for c in real],
            "estimate_captures": len(hooks.CAPTURES) - len(real)}


def kv_checks(o: vo.Oracle) -> list[dict[str, Any]]:
    import torch

    out = []
    for layers, heads, head_dim, dtype, block in ((2, 1, 32, "float32", 128), (32, 8, 128, "bfloat16", 16),
                                                  (80, 1, 128, "float16", 16)):
        spec = {f"model.layers.{i}.self_attn.attn": o.FullAttentionSpec(
            block_size=block, num_kv_heads=heads, head_size=head_dim, dtype=getattr(torch, dtype))
            for i in range(layers)}
        out.append({"layers": layers, "heads": heads, "head_dim": head_dim, "dtype": dtype, "block": block,
                    "summary": kv_cache_summary(spec)["bytes_per_token"],
                    "oracle": o.kv_bytes_per_token([(layers, heads, head_dim, dtype)])})
    return out


def main() -> int:
    try:
        o = vo.load()
    except vo.Unavailable as exc:
        print(json.dumps({"status": "unavailable", "reason": str(exc)}))
        return 0
    hooks.uninstall_capture_hooks()  # installed at import (as in a worker); here each check wraps vLLM's capture itself
    with o.patched():
        result = {"status": "ok", "v2": v2_checks(o), "v1": v1_checks(o), "kv": kv_checks(o)}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
