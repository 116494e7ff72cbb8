"""`cgtune defaults`: the capture list an engine picks by default for a serving config (vLLM 0.33, or 0.34's two lists;
SGLang 0.5.23 and TensorRT-LLM for their workloads), and what it leaves eager."""

from __future__ import annotations

import argparse

from tuner.cli import Command, UsageError
from tuner.commands.common import (capability, load_workload_arg, non_negative_int, positive_int, request_count,
                                   schedule_json)
from tuner.engines.registry import engine_of
from tuner.engines.serving import ServingConfig
from tuner.engines.vllm.defaults import CUDAGRAPH_MODES, PERFORMANCE_MODES, dense_speculative_schedule
from tuner.engines.vllm.versions import resolve_version

_FLAGS = (
    "max_num_seqs", "num_speculative_tokens", "max_num_batched_tokens", "gpu_capability", "performance_mode",
    "cudagraph_mode", "max_cudagraph_capture_size", "cudagraph_capture_sizes", "speculative_schedule",
    "enforce_eager",
)


class DefaultsCommand(Command):
    help = "print the capture sizes an engine derives by default for a serving config, and what runs eager"
    description = (
        "Reproduce vLLM's default capture sizes (VllmConfig._set_cudagraph_sizes; under vLLM 0.34 both\n"
        "lists: decode_cudagraph_capture_request_sizes and prefill_cudagraph_capture_token_sizes) for a\n"
        "serving config given as flags (named as vLLM names them) or as a workload file, and list the\n"
        "uniform decode widths (requests x (1 + draft tokens)) that get no graph and run eager; the model\n"
        "runner and the list it runs (V1 rewrites it when speculating); the share of the traffic's decode\n"
        "steps and tokens without a graph (a workload's traffic, else 1..max_num_seqs requests alike); and\n"
        "the drafter passes without a graph. For an SGLang or TensorRT-LLM workload, that engine's default\n"
        "list in requests with token widths beside, what it captures and which decode batches run eager.\n\n"
        "examples:\n"
        "  cgtune defaults --max-num-seqs 128 --num-speculative-tokens 16\n"
        "  cgtune defaults workloads/dflash-llama-3.1-8b.yaml --json\n"
        "  cgtune defaults workloads/trtllm-eagle3-llama-3.1-8b.yaml"
    )

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("workload", nargs="?", help="workload YAML; its serving section replaces the flags")
        p.add_argument("--max-num-seqs", type=request_count,
                       help="most requests per engine step (required without a workload; at most 65536)")
        p.add_argument("--num-speculative-tokens", type=non_negative_int, default=None,
                       help="draft tokens per request; decode query length q = 1 + this (default 0)")
        p.add_argument("--max-num-batched-tokens", type=positive_int, default=None,
                       help="token budget of one step (default 8192)")
        p.add_argument("--gpu-capability", type=capability, default=None, metavar="MAJOR.MINOR",
                       help="compute capability of the GPU: the 10.x family (B200, B300; not 11.x or 12.x) raises "
                            "0.33's ceiling to 1024 and takes 0.34's wide defaults (default 9.0, H100/H200)")
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
                            "uniform_decode_sizes_without_graph, model_runner, runs_as, eager_step_share, "
                            "eager_token_share, eager_drafter_passes, ...} as JSON (an SGLang or TensorRT-LLM "
                            "workload: engine, batch_sizes, token_widths, captured_batch_sizes, eager_batch_sizes, "
                            "the shares)")

    def run(self, args: argparse.Namespace) -> int:
        from tuner.report.run import words_of

        given = [f for f in _FLAGS if getattr(args, f) is not None]
        workload = None
        if args.workload is not None:
            if given:
                raise UsageError(f"--{given[0].replace('_', '-')}: give either a workload file or flags, not both")
            workload = load_workload_arg(args.workload)
            serving = workload.serving
        else:
            if args.max_num_seqs is None:
                raise UsageError("--max-num-seqs: required (or give a workload file)")
            k = args.num_speculative_tokens or 0
            if args.speculative_schedule is not None:
                # vLLM refuses a schedule it cannot expand (overlapping ranges, no draft tokens to schedule); the
                # engine only keeps a schedule that runs.
                dense_speculative_schedule(args.speculative_schedule, args.max_num_seqs, k)
            serving = ServingConfig(
                max_num_seqs=args.max_num_seqs,
                num_speculative_tokens=k,
                max_num_batched_tokens=args.max_num_batched_tokens or 8192,
                gpu_capability=args.gpu_capability or (9, 0),
                performance_mode=args.performance_mode or "balanced",
                cudagraph_mode=args.cudagraph_mode or "FULL_AND_PIECEWISE",
                max_cudagraph_capture_size=args.max_cudagraph_capture_size,
                cudagraph_capture_sizes=_tuple(args.cudagraph_capture_sizes),
                speculative_schedule=_tuple(args.speculative_schedule),
                enforce_eager=bool(args.enforce_eager),
                vllm_version=resolve_version(None),  # the release --vllm-version names (engine_of caches by config)
            )
        engine = engine_of(serving)
        refusal = engine.config_refusal(as_flags=workload is None)  # vLLM's own start-up checks
        if refusal is not None:
            raise UsageError(refusal)
        print(words_of(engine).defaults_text(engine, workload, as_json=args.json))
        return 0


def _tuple(value: list | None) -> tuple | None:
    """A flag's list as ServingConfig keeps it (tuples, nested for a schedule)."""
    if value is None:
        return None
    return tuple(tuple(v) if isinstance(v, list) else v for v in value)
