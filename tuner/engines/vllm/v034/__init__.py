"""vLLM 0.34's rulebook: its split capture lists (decode graphs in requests, prefill graphs in tokens), their
defaults and dispatch, its KV cache sized after capture, and its files. Imports the 0.33 rulebook's modules for what
0.34 left unchanged (the shared list's resolution, the speculative schedule, the drafter's weights and KV)."""

from tuner.engines.vllm.v034.defaults import SplitSizes, decode_grid, prefill_grid, resolve_capture_sizes
from tuner.engines.vllm.v034.dispatch import Dispatcher034, join_keys, split_keys

__all__ = ["Dispatcher034", "SplitSizes", "decode_grid", "join_keys", "prefill_grid", "resolve_capture_sizes",
           "split_keys"]
