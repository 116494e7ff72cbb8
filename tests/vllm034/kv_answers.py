"""vLLM 0.34's own KV-cache block arithmetic on random layer layouts, as one JSON object on stdout: its KV cache groups
(`get_kv_cache_groups`), the pool's bytes per block, the capacity's block count (`get_kv_cache_configs`, also the block
count without the extensible KV cache), the extensible cache's segments (`ExtensibleKVCache._segments` over the
planned tensors), the bytes it may take after warm-up and capture (`measure_kv_cache_bytes`), the blocks within them
(`ExtensibleKVCache.blocks_within`, granule-rounded) and the count `finalize_extensible_kv_cache` keeps (no more than
the capacity). Stand-ins only for what needs a GPU or a loaded model: the ExtensibleKVCache instance (its reserved
buffer's granularity; the CUDA VMM driver allocates it), the config sections the planning reads, the layout the
engine core resolves for FlashAttention's layers (LBNHC). tests/vllm034/test_kv_blocks_034.py holds cgtune's
`tuner.engines.vllm.v034` rule to it.

    PYTHONPATH="$CGTUNE_VLLM034_PATH" python tests/vllm034/kv_answers.py < cases.json

Reads `{"cases": [{"layers": [[kind, kv heads, head size, dtype bytes, window, draft], ...], "max_model_len",
"memory": {total, utilization, non_kv, peak, growth, start_free, pool}, "available"}]}`; prints `{"status": "ok",
"answers": [...]}` or `{"status": "unavailable", "reason"}`."""

from __future__ import annotations

import json
import os
import sys
import time
import types
from typing import Any

GRANULE = 2 << 20
"""The allocation granularity of the CUDA VMM driver on H100/H200/B200 (the reserved buffer's `granularity`)."""


def main() -> int:
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    request = json.loads(sys.stdin.read())
    start = time.perf_counter()
    try:
        import torch
        import vllm
        import vllm.v1.worker.extensible_kv_cache as extensible
        from vllm.config import CacheConfig
        from vllm.v1.core import kv_cache_planning as planning
        from vllm.v1.core.kv_cache_config_builder import get_kv_cache_config_builder
        from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec, SlidingWindowSpec
        from vllm.v1.kv_cache_layout import KVCacheLayout
        from vllm.v1.worker.utils import request_memory
    except ImportError as exc:
        print(json.dumps({"status": "unavailable", "reason": f"vLLM 0.34's modules do not import here: {exc!r}"}))
        return 0

    dtypes = {1: torch.float8_e4m3fn, 2: torch.bfloat16, 4: torch.float32}
    ns = types.SimpleNamespace

    def spec(kind: str, heads: int, head_size: int, size: int, window: int | None, draft: bool) -> Any:
        common = dict(block_size=16, num_kv_heads=heads, head_size=head_size, dtype=dtypes[size], is_draft=draft)
        if kind == "sliding":
            return SlidingWindowSpec(**common, sliding_window=window)
        if kind == "mla":
            return MLAAttentionSpec(**common)
        return FullAttentionSpec(**common)

    def config(max_model_len: int) -> Any:
        cache = CacheConfig()
        cache.kv_cache_layout = "LBNHC"  # what the engine core resolves for FlashAttention's layers
        return ns(model_config=ns(max_model_len=max_model_len, original_max_model_len=max_model_len),
                  cache_config=cache, attention_config=ns(hisparse_config=None), speculative_config=None,
                  kv_transfer_config=None, max_in_flight_tokens=max_model_len,
                  parallel_config=ns(tensor_parallel_size=1, decode_context_parallel_size=1,
                                     prefill_context_parallel_size=1, data_parallel_size=1, pipeline_parallel_size=1),
                  scheduler_config=ns(disable_hybrid_kv_cache_manager=False, max_num_seqs=1,
                                      max_num_batched_tokens=max_model_len))

    def kv_cache(plan: Any, layout: Any) -> Any:
        """An ExtensibleKVCache over the plan's tensors: its own `_segments`, `bytes_per_block`,
        `physical_bytes_for` and `blocks_within` (the buffer, which the VMM driver reserves, stands in)."""
        tensors = [t for t in plan.kv_cache_tensors if not t.host_resident]
        kv = object.__new__(extensible.ExtensibleKVCache)
        kv.size = tensors[0].size
        kv.capacity_blocks = plan.num_blocks
        kv._is_block_outermost = layout.is_block_outermost
        kv.segment_offsets, kv.segment_strides = kv._segments(tensors, layout)
        kv.bytes_per_block = sum(kv.segment_strides)
        kv.buffer = ns(granularity=GRANULE)
        return kv

    answers = []
    for case in request["cases"]:
        specs = {f"layer.{i}": spec(*layer) for i, layer in enumerate(case["layers"])}
        cfg = config(case["max_model_len"])
        layout = KVCacheLayout[cfg.cache_config.kv_cache_layout]
        out: dict[str, Any] = {}
        try:
            groups = planning.get_kv_cache_groups(cfg, dict(specs))
            builder = get_kv_cache_config_builder(cfg)
            out["groups"] = [list(g.layer_names) for g in groups]
            out["pool_bytes_per_block"] = planning._pool_bytes_per_block_from_builder(builder, cfg, groups)
            m = case["memory"]
            snapshot = ns(total_memory=m["total"], free_memory=m["start_free"], device_=0)
            requested = request_memory(snapshot, ns(resolved_gpu_memory_utilization=m["utilization"],
                                                    enable_extensible_kv_cache=True))
            capacity = requested - m["non_kv"]  # determine_available_memory, no estimate under the extensible cache
            plan = planning.get_kv_cache_configs(cfg, [specs], [capacity], groups)[0]
            kv = kv_cache(plan, layout)
            out.update(capacity_blocks=plan.num_blocks, segment_strides=list(kv.segment_strides),
                       bytes_per_block=kv.bytes_per_block)
            # after warm-up and capture: the peak released, the pool held, the null block committed
            committed = kv.physical_bytes_for(kv.min_committed_blocks)
            free = m["start_free"] - (m["non_kv"] - m["peak"]) - m["pool"] - committed
            measured = extensible.measure_kv_cache_bytes(
                init_free_memory=m["start_free"], free_memory=free, committed_bytes=committed,
                requested_memory=requested, transient_peak_bytes=m["peak"], torch_reserve_growth_bytes=m["growth"])
            out["measured_bytes"] = measured
            out["blocks"] = min(kv.blocks_within(measured), plan.num_blocks)  # finalize_extensible_kv_cache's min
            out["blocks_within"] = [[n, kv.blocks_within(n)] for n in case["probe_bytes"]]
            # without the extensible cache: the blocks in `available` (0.33's rule, unchanged in 0.34)
            avail_plan = planning.get_kv_cache_configs(cfg, [specs], [case["available"]], groups)[0]
            out["blocks_without_extensible"] = avail_plan.num_blocks
        except (ValueError, AssertionError, NotImplementedError) as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
        answers.append(out)
    print(json.dumps({"status": "ok", "vllm_version": vllm.__version__, "answers": answers,
                      "seconds": round(time.perf_counter() - start, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
