"""`cgtune defaults`: the capture list an engine picks by default for a serving config (vLLM 0.33; SGLang 0.5.23 and
TensorRT-LLM for their workloads), and what it leaves eager."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from tuner.cli import Command, UsageError
from tuner.commands.common import capability, load_workload_arg, non_negative_int, positive_int, schedule_json
from tuner.eager_share import EagerShare, drafter_eager_passes, eager_share, uniform_decode_steps
from tuner.vllm.defaults import CUDAGRAPH_MODES, PERFORMANCE_MODES, CaptureDefaults, capture_ceiling
from tuner.vllm.defaults import default_capture_sizes, dense_speculative_schedule, validate_schedule
from tuner.vllm.defaults import widest_decode_batch
from tuner.vllm.drafter import EagerDrafterPasses, spans
from tuner.workload import ServingConfig, Workload

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
    def runs(values: list[tuple[int, int]]) -> list[list[int]]:  # consecutive sizes, equal keys -> [first, last, key]
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
    text = ", ".join(f"K={kk} for {span(a, b)}" for a, b, kk in runs([(n, dense[n]) for n in
                                                                       range(1, max_num_seqs + 1)]))
    covered = {n for lo, hi, _ in validate_schedule(schedule) for n in range(lo, min(hi, max_num_seqs) + 1)}
    carried = runs([(n, 0) for n in range(1, max_num_seqs + 1) if n not in covered])
    if carried:
        text += (f" (batch sizes {', '.join(span(a, b) for a, b, _ in carried)} are in no range: vLLM carries the "
                 f"K of the range before)")
    return text


class DefaultsCommand(Command):
    help = "print the capture sizes an engine derives by default for a serving config, and what runs eager"
    description = (
        "Reproduce vLLM 0.33's default cudagraph_capture_sizes (VllmConfig._set_cudagraph_sizes) for a\n"
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
                            "uniform_decode_sizes_without_graph, model_runner, runs_as, eager_step_share, "
                            "eager_token_share, eager_drafter_passes, ...} as JSON (an SGLang or TensorRT-LLM "
                            "workload: engine, batch_sizes, token_widths, captured_batch_sizes, eager_batch_sizes, "
                            "the shares)")

    def run(self, args: argparse.Namespace) -> int:
        given = [f for f in _FLAGS if getattr(args, f) is not None]
        workload = None
        if args.workload is not None:
            if given:
                raise UsageError(f"--{given[0].replace('_', '-')}: give either a workload file or flags, not both")
            workload = load_workload_arg(args.workload)
            serving = workload.serving
            if serving.engine != "vllm":
                return _engine_defaults(workload, as_json=args.json)
            config = dict(
                max_num_seqs=serving.max_num_seqs, num_speculative_tokens=serving.num_speculative_tokens,
                max_num_batched_tokens=serving.max_num_batched_tokens, gpu_capability=serving.gpu_capability,
                performance_mode=serving.performance_mode, cudagraph_mode=serving.cudagraph_mode,
                max_cudagraph_capture_size=serving.max_cudagraph_capture_size,
                cudagraph_capture_sizes=serving.cudagraph_capture_sizes,
                # The schedule vLLM runs: V1 drops it for suffix and custom_class (static K, no tiers).
                speculative_schedule=[list(e) for e in serving.dynamic_schedule or ()] or None,
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
            serving = ServingConfig(**{**config, "cudagraph_capture_sizes": _tuple(config["cudagraph_capture_sizes"]),
                                       "speculative_schedule": _tuple(config["speculative_schedule"])})
        max_num_seqs = config.pop("max_num_seqs")
        result = default_capture_sizes(max_num_seqs, **config)
        report = _VllmReport.of(serving, workload, result)
        if args.json:
            print(json.dumps({
                "cudagraph_capture_sizes": result.sizes,
                "max_cudagraph_capture_size": result.max_size,
                "uniform_decode_sizes_without_graph": result.uniform_decode_sizes_without_graph,
                **report.as_dict(),
            }))
        else:
            print(self._table(max_num_seqs, config, result, report))
        return 0

    @staticmethod
    def _table(max_num_seqs: int, config: dict, result: CaptureDefaults, report: _VllmReport) -> str:
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
        elif report.schedule_dropped:
            rows.insert(0, ("speculative schedule", f"dropped: the V1 runner runs no dynamic schedule for method "
                                                    f"{report.method!r}, every step drafts K={k}"))
        reason = report.runner_reason
        rows.insert(0, ("model runner", reason if reason.startswith(report.runner.upper()) else
                        f"{report.runner.upper()} ({reason})"))
        width = max(len(k) for k, _ in rows)
        lines = [f"{k:<{width}}  {v}" for k, v in rows]
        lines += _size_lines(result.sizes, width)
        if report.refused:
            lines.append(f"{'runs as':<{width}}  nothing: the {report.runner.upper()} runner refuses the list "
                         f"({report.refused})")
        elif report.runs_as is not None and list(report.runs_as) != list(result.sizes):
            lines.append(f"{'runs as':<{width}}  {len(report.runs_as)} graphs: the {report.runner.upper()} runner "
                         f"rewrites the list when speculating (sizes rounded up to multiples of q, those above the "
                         f"max dropped); this is the list that RUNS")
            lines += _size_lines(report.runs_as, width)
        eager = result.uniform_decode_sizes_without_graph
        lines.append(f"{'decode widths eager':<{width}}  {_ranges(eager)}")
        lines.append(f"{'eager share':<{width}}  {report.traffic}: {report.share.describe()}")
        lines += [f"{'drafter eager':<{width}}  {line}" for line in report.drafter_lines()]
        lines += [f"{'warning':<{width}}  {w}" for w in result.warnings]
        return "\n".join(lines)


def _tuple(value: list | None) -> tuple | None:
    """A flag's list as ServingConfig keeps it (tuples, nested for a schedule)."""
    if value is None:
        return None
    return tuple(tuple(v) if isinstance(v, list) else v for v in value)


def _size_lines(sizes: list[int] | tuple[int, ...], width: int, per_line: int = 16) -> list[str]:
    return [" " * (width + 2) + " ".join(f"{s:>5}" for s in sizes[i:i + per_line])
            for i in range(0, len(sizes), per_line)]


def _spans(values: list[int] | tuple[int, ...]) -> str:
    """`1..4, 7, 9..10` for [1, 2, 3, 4, 7, 9, 10] (consecutive runs), `-` for none."""
    return spans(values) or "-"


def _widths(values: tuple[int, ...]) -> str:
    """`544..2176 tokens, step 17` for an evenly spaced run, else the widths or their ends and count."""
    if len(values) <= 6:
        return ", ".join(map(str, values)) + " tokens"
    steps = {b - a for a, b in zip(values, values[1:])}
    if len(steps) == 1:
        return f"{values[0]}..{values[-1]} tokens, step {steps.pop()}"
    return f"{values[0]}..{values[-1]} tokens, {len(values)} widths"


@dataclass(frozen=True)
class _VllmReport:
    """What runs under vLLM's default list beside the list itself: the runner, the list it runs, the eager share of
    the traffic (the workload's, or decode steps uniform over 1..max_num_seqs requests without one) and the drafter
    passes without a graph."""

    runner: str
    """`v1` or `v2`."""
    runner_reason: str
    """Why that runner."""
    runs_as: tuple[int, ...] | None
    """The list the runner captures (None when it refuses the list)."""
    refused: str
    """Why the runner refuses the list ("" when it does not)."""
    traffic: str
    """Which traffic the share counts."""
    share: EagerShare
    """Decode steps and tokens without a graph."""
    drafter: tuple[EagerDrafterPasses, ...]
    """Drafter passes without a graph (model-based drafters)."""
    method: str | None
    """The speculative method."""
    schedule_dropped: bool = False
    """The workload's speculative_schedule is one vLLM drops (V1 with suffix or custom_class)."""

    @classmethod
    def of(cls, serving: ServingConfig, workload: Workload | None, result: CaptureDefaults) -> _VllmReport:
        try:
            runs: tuple[int, ...] | None = serving.runs_as(result.sizes)
            refused = ""
        except ValueError as exc:
            runs, refused = None, str(exc)
        if workload is not None:
            steps, traffic = workload.steps(), "workload traffic"
        else:
            steps = uniform_decode_steps(serving)
            traffic = "no workload, uniform decode traffic"
        drafter = tuple(drafter_eager_passes(workload, result.sizes)) if workload is not None else ()
        return cls(serving.runner, serving.runner_reason, runs, refused, traffic,
                   eager_share(serving, steps, result.sizes), drafter, serving.speculative_method,
                   bool(serving.speculative_schedule) and serving.dynamic_schedule is None)

    def drafter_lines(self) -> list[str]:
        return [f"{self.runner} {self.method} {p.role} passes at N = {_spans(p.request_counts)} "
                f"({_widths(p.widths)}) run eager" for p in self.drafter]

    def as_dict(self) -> dict[str, object]:
        return {
            "model_runner": self.runner, "runner_reason": self.runner_reason,
            "runs_as": list(self.runs_as) if self.runs_as is not None else None,
            **self.share.as_dict(), "eager_share_traffic": self.traffic,
            "eager_drafter_passes": [{"role": p.role, "request_counts": list(p.request_counts),
                                      "widths": list(p.widths)} for p in self.drafter],
        }


def _engine_defaults(workload: Workload, *, as_json: bool) -> int:
    """SGLang's or TensorRT-LLM's default decode list for a workload, in requests with token widths beside, what the
    engine really captures, the decode batches without a graph and the eager share of the workload's traffic."""
    from tuner import sglang
    from tuner.engines import ENGINE_LABELS, engine_runs_as_requests

    s = workload.serving
    e = s.engine_settings
    assert e is not None
    q = s.decode_query_len
    defaults = s.defaults()
    written = [w // q for w in defaults.sizes]
    runs = engine_runs_as_requests(e, written, max_num_seqs=s.max_num_seqs,
                                   max_num_batched_tokens=s.max_num_batched_tokens)
    eager = [w // q for w in defaults.uniform_decode_sizes_without_graph]
    share = eager_share(s, workload.steps(), defaults.sizes)
    name = ENGINE_LABELS[e.engine]
    if e.engine == "sglang":
        graphs = sglang.resolve_decode_graphs(
            gpu_memory_mib=e.gpu_memory_mib, tp_size=workload.model.tensor_parallel_size,
            max_running_requests=s.max_num_seqs, speculative_algorithm=e.speculative_algorithm,
            speculative_num_draft_tokens=q if e.speculative_algorithm else None)
        cap, cap_name = graphs.pool_size, "request pool"
        per_request = "speculative_num_draft_tokens" if e.speculative_algorithm else "normal decode"
        memory = (f"{e.gpu_memory_mib:g} MiB" if e.gpu_memory_mib is not None else
                  "unknown (serving.gpu_memory_mib unset: SGLang's unknown-GPU row; set it to nvidia-smi's "
                  "memory.total)")
        rows = [("engine", f"{name} 0.5.23: decode graphs counted in requests, each holding bs x {q} token"
                           f"{'s' if q > 1 else ''} ({per_request})"),
                ("GPU memory", memory),
                ("max_bs", f"{graphs.max_bs} (SGLang's GPU-memory table for tp {workload.model.tensor_parallel_size}, "
                           f"capped at max_running_requests {s.max_num_seqs})"),
                (cap_name, f"{cap} (max_running_requests)")]
        extra = {"max_bs": graphs.max_bs, "gpu_memory_mib": e.gpu_memory_mib}
    else:
        cap = min(s.max_num_seqs, s.max_num_batched_tokens // q)
        cap_name = "request cap"
        rows = [("engine", f"{name} (PyTorch backend): batch sizes counted in requests, each graph holding bs x {q} "
                           f"token{'s' if q > 1 else ''} (1 + max_draft_len)"),
                ("cuda_graph_config", f"unset: TensorRT-LLM's default list, max 128 whatever max_batch_size says; "
                                      f"enable_padding {str(e.enable_padding).lower()}"
                                      + ("" if e.enable_padding else " (its default: only exactly captured sizes "
                                                                     "replay)")),
                (cap_name, f"{cap} = min(max_batch_size {s.max_num_seqs}, max_num_tokens "
                           f"{s.max_num_batched_tokens} // {q})")]
        extra = {"enable_padding": e.enable_padding}
    rows.append(("default list", f"{len(written)} graphs, max {max(written) if written else 0} requests "
                                 f"({defaults.max_size} tokens)"))
    if as_json:
        print(json.dumps({
            "engine": e.engine, "unit": "requests", "tokens_per_request": q, "batch_sizes": written,
            "token_widths": list(defaults.sizes), "captured_batch_sizes": runs, "request_cap": cap,
            "eager_batch_sizes": eager,
            "uniform_decode_sizes_without_graph": defaults.uniform_decode_sizes_without_graph,
            "widest_decode_batch": {"requests": s.max_num_seqs, "tokens_per_request": q, "tokens": s.max_num_seqs * q},
            **extra, **share.as_dict(), "eager_share_traffic": "workload traffic",
        }))
        return 0
    rows.append(("", written))
    if runs != written:
        rows.append(("captured", f"{len(runs)} graphs: what {name} really captures (its filter against the "
                                 f"{cap_name})"))
        rows.append(("", runs))
    if not eager:
        rows.append(("eager decode batches", f"none: every decode batch up to {s.max_num_seqs} requests replays a "
                                             f"graph"))
    else:
        why = (f"between the list's max {runs[-1] if runs else 0} and the {cap_name} {cap}" if e.engine == "sglang"
               else "no graph of their own size (padding off)" if not e.enable_padding
               else f"above the list's max {runs[-1] if runs else 0}")
        rows.append(("eager decode batches", f"{_spans(eager)} requests ({why}) run eager"))
    rows.append(("widest decode batch", f"{s.max_num_seqs} x {q} = {s.max_num_seqs * q} tokens"))
    rows.append(("eager share", f"workload traffic: {share.describe()}"))
    width = max(len(k) for k, _ in rows)
    lines: list[str] = []
    for key, value in rows:
        lines += _pair_lines(value, q, width) if isinstance(value, list) else [f"{key:<{width}}  {value}"]
    print("\n".join(lines))
    return 0


def _pair_lines(batch_sizes: list[int], q: int, width: int, per_line: int = 14) -> list[str]:
    """Batch sizes (requests) with their token widths under them, in aligned rows."""
    out = []
    for i in range(0, len(batch_sizes), per_line):
        chunk = batch_sizes[i:i + per_line]
        out.append(f"{'  requests':<{width}}  " + " ".join(f"{b:>6}" for b in chunk))
        out.append(f"{'  tokens':<{width}}  " + " ".join(f"{b * q:>6}" for b in chunk))
    return out
