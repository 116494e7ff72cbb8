"""`cgtune defaults`: the capture list vLLM 0.33 picks for a serving config, and what it leaves eager."""

from __future__ import annotations

import argparse
import json

from tuner.cli import Command, UsageError
from tuner.commands.common import capability, load_workload_arg, non_negative_int, positive_int, schedule_json
from tuner.vllm.defaults import CUDAGRAPH_MODES, PERFORMANCE_MODES, CaptureDefaults, capture_ceiling
from tuner.vllm.defaults import default_capture_sizes, dense_speculative_schedule, validate_schedule
from tuner.vllm.defaults import widest_decode_batch

_FLAGS = (
    "max_num_seqs", "num_speculative_tokens", "max_num_batched_tokens", "gpu_capability", "performance_mode",
    "cudagraph_mode", "max_cudagraph_capture_size", "cudagraph_capture_sizes", "speculative_schedule",
    "enforce_eager",
)


def _ranges(values: list[int]) -> str:
    """Compress a sorted list: 527..2176 step 17."""
    if len(values) <= 6:
        return " ".join(map(str, values)) or "-"
    steps = {b - a for a, b in zip(values, values[1:])}
    if len(steps) == 1:
        return f"{values[0]}..{values[-1]} step {steps.pop()} ({len(values)} widths)"
    return f"{' '.join(map(str, values[:3]))} ... {' '.join(map(str, values[-3:]))} ({len(values)} widths)"


def _schedule_runs(schedule: list[list[int]], max_num_seqs: int, k: int) -> str:
    """The K each batch size runs at, as vLLM expands the schedule (gaps and the tail carry the previous K, every K
    clamped to num_speculative_tokens): `K=3 for 1..16, K=1 for 17..256`, and which batch sizes were carried."""
    def spans(values: list[int]) -> list[list[int]]:  # consecutive batch sizes with equal keys -> [first, last]
        out: list[list[int]] = []
        for n, key in values:
            if out and out[-1][2] == key and out[-1][1] == n - 1:
                out[-1][1] = n
            else:
                out.append([n, n, key])
        return out

    def span(a: int, b: int) -> str:
        return f"{a}..{b}" if a != b else str(a)

    dense = dense_speculative_schedule(schedule, max_num_seqs, k)
    text = ", ".join(f"K={kk} for {span(a, b)}" for a, b, kk in spans([(n, dense[n]) for n in
                                                                        range(1, max_num_seqs + 1)]))
    covered = {n for lo, hi, _ in validate_schedule(schedule) for n in range(lo, min(hi, max_num_seqs) + 1)}
    carried = spans([(n, 0) for n in range(1, max_num_seqs + 1) if n not in covered])
    if carried:
        text += (f" (batch sizes {', '.join(span(a, b) for a, b, _ in carried)} are in no range: vLLM carries the "
                 f"K of the range before)")
    return text


class DefaultsCommand(Command):
    help = "print the capture sizes vLLM 0.33 derives for a serving config"
    description = (
        "Reproduce vLLM 0.33's default cudagraph_capture_sizes (VllmConfig._set_cudagraph_sizes) for a\n"
        "serving config given as flags (named as vLLM names them) or as a workload file, and list the\n"
        "uniform decode widths (requests x (1 + draft tokens)) that get no graph and run eager.\n\n"
        "examples:\n"
        "  cgtune defaults --max-num-seqs 128 --num-speculative-tokens 16\n"
        "  cgtune defaults workloads/dflash-llama-3.1-8b.yaml --json"
    )

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("workload", nargs="?", help="workload YAML; its serving section replaces the flags")
        p.add_argument("--max-num-seqs", type=positive_int, help="most requests per engine step (required without a workload)")
        p.add_argument("--num-speculative-tokens", type=non_negative_int, default=None,
                       help="draft tokens per request; decode query length q = 1 + this (default 0)")
        p.add_argument("--max-num-batched-tokens", type=positive_int, default=None,
                       help="token budget of one step (default 8192)")
        p.add_argument("--gpu-capability", type=capability, default=None, metavar="MAJOR.MINOR",
                       help="compute capability of the GPU: 10.x raises the ceiling to 1024 (default 9.0, H100/H200)")
        p.add_argument("--performance-mode", choices=PERFORMANCE_MODES, default=None,
                       help="vLLM performance_mode; interactivity captures every width up to 32 (default balanced)")
        p.add_argument("--cudagraph-mode", choices=CUDAGRAPH_MODES, default=None,
                       help="vLLM cudagraph_mode (default FULL_AND_PIECEWISE, vLLM's -O2 default)")
        p.add_argument("--max-cudagraph-capture-size", type=positive_int, default=None,
                       help="user-given max capture size (vLLM truncates it, or raises when a list is also given)")
        p.add_argument("--cudagraph-capture-sizes", type=positive_int, nargs="+", default=None, metavar="N",
                       help="explicit capture list: vLLM only deduplicates, drops sizes above the token budget, sorts")
        p.add_argument("--speculative-schedule", type=schedule_json, default=None, metavar="JSON",
                       help="dynamic speculative decoding schedule, e.g. '[[1,16,3],[17,256,1]]' "
                            "(vLLM's num_speculative_tokens_per_batch_size)")
        p.add_argument("--enforce-eager", action="store_true", default=None, help="no CUDA graphs at all")
        p.add_argument("--json", action="store_true",
                       help="print {cudagraph_capture_sizes, max_cudagraph_capture_size, "
                            "uniform_decode_sizes_without_graph} as JSON")

    def run(self, args: argparse.Namespace) -> int:
        given = [f for f in _FLAGS if getattr(args, f) is not None]
        if args.workload is not None:
            if given:
                raise UsageError(f"--{given[0].replace('_', '-')}: give either a workload file or flags, not both")
            serving = load_workload_arg(args.workload).serving
            config = dict(
                max_num_seqs=serving.max_num_seqs, num_speculative_tokens=serving.num_speculative_tokens,
                max_num_batched_tokens=serving.max_num_batched_tokens, gpu_capability=serving.gpu_capability,
                performance_mode=serving.performance_mode, cudagraph_mode=serving.cudagraph_mode,
                max_cudagraph_capture_size=serving.max_cudagraph_capture_size,
                cudagraph_capture_sizes=serving.cudagraph_capture_sizes,
                speculative_schedule=[list(e) for e in serving.speculative_schedule or ()] or None,
                enforce_eager=serving.enforce_eager,
            )
        else:
            if args.max_num_seqs is None:
                raise UsageError("--max-num-seqs: required (or give a workload file)")
            config = dict(
                max_num_seqs=args.max_num_seqs,
                num_speculative_tokens=args.num_speculative_tokens or 0,
                max_num_batched_tokens=args.max_num_batched_tokens or 8192,
                gpu_capability=args.gpu_capability or (9, 0),
                performance_mode=args.performance_mode or "balanced",
                cudagraph_mode=args.cudagraph_mode or "FULL_AND_PIECEWISE",
                max_cudagraph_capture_size=args.max_cudagraph_capture_size,
                cudagraph_capture_sizes=args.cudagraph_capture_sizes,
                speculative_schedule=args.speculative_schedule,
                enforce_eager=bool(args.enforce_eager),
            )
        max_num_seqs = config.pop("max_num_seqs")
        result = default_capture_sizes(max_num_seqs, **config)
        if args.json:
            print(json.dumps({
                "cudagraph_capture_sizes": result.sizes,
                "max_cudagraph_capture_size": result.max_size,
                "uniform_decode_sizes_without_graph": result.uniform_decode_sizes_without_graph,
            }))
        else:
            print(self._table(max_num_seqs, config, result))
        return 0

    @staticmethod
    def _table(max_num_seqs: int, config: dict, result: CaptureDefaults) -> str:
        k, schedule = config["num_speculative_tokens"], config["speculative_schedule"]
        requests, q = widest_decode_batch(max_num_seqs, k, schedule)
        widest = requests * q
        rows = [
            ("max_num_seqs x q", f"{max_num_seqs} x {q} = {widest} tokens (widest uniform decode batch)")
            if schedule is None else
            ("widest decode batch", f"{requests} x {q} = {widest} tokens (K={q - 1} at {requests} requests under the "
                                    f"schedule)"),
            ("ceiling", f"{capture_ceiling(config['gpu_capability'])} tokens "
                        f"(compute capability {config['gpu_capability'][0]}.{config['gpu_capability'][1]})"),
            ("max_cudagraph_capture_size", str(result.max_size)),
            ("capture sizes", f"{len(result.sizes)} graphs"),
        ]
        if schedule is not None:
            rows.insert(0, ("speculative schedule", _schedule_runs(schedule, max_num_seqs, k)))
        width = max(len(k) for k, _ in rows)
        lines = [f"{k:<{width}}  {v}" for k, v in rows]
        per_line = 16
        for i in range(0, len(result.sizes), per_line):
            lines.append(" " * (width + 2) + " ".join(f"{s:>5}" for s in result.sizes[i:i + per_line]))
        eager = result.uniform_decode_sizes_without_graph
        lines.append(f"{'decode widths eager':<{width}}  {_ranges(eager)}")
        lines += [f"{'warning':<{width}}  {w}" for w in result.warnings]
        return "\n".join(lines)
