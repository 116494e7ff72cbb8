"""Benchmark (not a test): aten ops per decoder layer that one eager decode step dispatches on the CPU, plain
and through torch.compile, so changes to the decoder's op count show as a number.

    PYTHONPATH=. python3 benchmarks/bench_ops.py            # Llama-like layer (GQA), then Qwen3-like (qk-norm)
    PYTHONPATH=. python3 benchmarks/bench_ops.py --by-name  # also the count per op name

What counts (tuner.measure.kernels.count_cpu_ops): each outermost aten op that does work, once (`linear` is
one op; views and bare allocations are none), and each Inductor-generated kernel, once. Per layer is the
difference between a 2-layer and a 1-layer model of the same shape, so embedding, final norm and output copy
drop out. On the CPU, SDPA takes its math path with a materialized mask (`ones` + `tril`): two ops a GPU's
flash kernel does not have. On a GPU, `cgtune profile` records the CUDA kernels per layer themselves
(`eager_kernels_per_layer` in the profile JSON).

Measured with this script on a CPU (torch 2.13, q = 4, one request), Llama-like / Qwen3-like layer:
- before the lean decoder (commit 9ad3c7c): plain 29 / 31 ops per layer, of which rotary 14 (mul x8, sub x2,
  add x2, cat x2); compiled 13 / 13;
- after (rotary as multiply, concatenate, multiply-add over q and k together; residual adds inside addmm):
  plain 16 / 21, rotary 3 / 6; compiled 13 / 13 (Inductor had fused all of it already).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from tuner.measure.decoder import DecodeModel, ShardShape  # noqa: E402
from tuner.measure.kernels import count_cpu_ops  # noqa: E402
from tuner.shapes import ModelShape  # noqa: E402

__all__ = ["main", "ops_per_layer"]

# Small shapes: the op count does not depend on the widths, only on the layer's structure.
SHAPES = {
    "llama-like (GQA)": dict(hidden_size=64, num_attention_heads=4, num_kv_heads=2, head_dim=16,
                             intermediate_size=128, vocab_size=256),
    "qwen3-like (GQA, qk-norm)": dict(hidden_size=64, num_attention_heads=4, num_kv_heads=2, head_dim=16,
                                      intermediate_size=128, vocab_size=256, qk_norm=True),
}


def _step_ops(shape: dict, num_layers: int, *, compiled: bool, decode_query_len: int) -> Counter:
    from torch.profiler import ProfilerActivity, profile

    model_shape = ModelShape(num_layers=num_layers, **shape)
    model = DecodeModel(ShardShape.for_rank(model_shape), max_num_tokens=2 * decode_query_len,
                        decode_query_len=decode_query_len, context_len=16, dtype=torch.float32)
    width = decode_query_len  # one request: attention runs as one group, as in a uniform decode step
    if compiled:
        import torch._inductor.config as inductor_config

        with inductor_config.patch({"cpp.enable_kernel_profile": True}):  # Inductor kernels show in the profile
            model.compile()
            model.forward_hidden(width)
    model.forward_hidden(width)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        model.forward_hidden(width)
    names: Counter = Counter()
    count_cpu_ops(prof.events(), by_name=names)
    return names


def ops_per_layer(shape: dict, *, compiled: bool, decode_query_len: int = 4) -> tuple[int, Counter]:
    """Ops per layer (2-layer step minus 1-layer step) and the per-name difference."""
    if compiled:
        torch._dynamo.reset()
    one = _step_ops(shape, 1, compiled=compiled, decode_query_len=decode_query_len)
    if compiled:
        torch._dynamo.reset()
    two = _step_ops(shape, 2, compiled=compiled, decode_query_len=decode_query_len)
    diff = Counter(two)
    diff.subtract(one)
    return sum(two.values()) - sum(one.values()), Counter({k: v for k, v in diff.items() if v})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--by-name", action="store_true", help="print the per-layer count of each op name")
    p.add_argument("--q", type=int, default=4, help="decode query length (tokens per request, default 4)")
    args = p.parse_args(argv)
    print(f"torch {torch.__version__}, CPU, float32, one request of q={args.q} tokens; aten ops per decoder layer")
    for label, shape in SHAPES.items():
        for compiled in (False, True):
            count, names = ops_per_layer(shape, compiled=compiled, decode_query_len=args.q)
            print(f"{label:28} {'compiled' if compiled else 'plain':9} {count:3d} per layer")
            if args.by_name:
                for name, n in sorted(names.items(), key=lambda kv: (-kv[1], kv[0])):
                    print(f"    {n:3d}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
