"""`cgtune validate RUN_DIR`: capture the run's default and tuned lists on the GPU, replay the workload, compare."""

from __future__ import annotations

import argparse
import math
import shlex
from pathlib import Path

from tuner.cli import Command, UsageError
from tuner.commands.common import positive_float, positive_int

BACKENDS = ("auto", "vllm", "stand-in")

__all__ = ["ValidateCommand"]

GIB = 1 << 30


class ValidateCommand(Command):
    help = "capture the default and tuned lists on the GPU, replay the workload, compare with the cost model"
    description = (
        "For a run directory of `cgtune search` or `cgtune tune`: build the workload's decode model once on\n"
        "this machine's CUDA GPU; for vLLM's default, the tuned list and the exact optimum (when different)\n"
        "capture exactly that list's graphs in one shared pool in vLLM's order, read the pool's memory,\n"
        "replay the same seeded trace of workload steps (padded graph or eager, as vLLM dispatches) timing\n"
        "every step with CUDA events, and release the graphs. Writes validation.json and a section of\n"
        "report.md with a predicted-vs-measured plot. A tuned list whose measured memory leaves too little\n"
        "KV cache is replaced in the vLLM files by the fastest measured list that fits. Needs a CUDA GPU and\n"
        "no optuna: with --workload and --profile it first writes RUN_DIR itself from the exact solver\n"
        "(an optuna-free `cgtune search`), so a fresh profile is validated on the machine that measured it.\n\n"
        "examples:\n"
        "  cgtune validate runs/dflash\n"
        "  cgtune validate runs/dflash-h200 --workload workloads/dflash-llama-3.1-8b.yaml --profile P.csv\n"
        "  cgtune validate runs/suffix --steps 5000 --seed 1"
    )

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("run_dir", type=Path, help="output directory of `cgtune search` or `cgtune tune`")
        p.add_argument("--steps", type=positive_int, default=3000, metavar="N",
                       help="steps in the replayed trace (default 3000)")
        p.add_argument("--seed", type=int, default=0, help="trace seed (default 0)")
        p.add_argument("--workload", metavar="YAML", help="with --profile: write RUN_DIR from the exact solver first")
        p.add_argument("--profile", type=Path, metavar="CSV", help="with --workload: recorded profile (CSV + JSON)")
        p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                       help="cuda (default); cpu only rehearses the run where there is no GPU (graph steps run "
                            "eagerly, the record says these are no validation numbers; with --backend vllm, vLLM's "
                            "CPU build runs each list as it keeps it: no graphs)")
        p.add_argument("--backend", choices=BACKENDS, default="auto",
                       help="the instrument. vllm: for each list, vLLM's own engine is built in this process with "
                            "the list as compilation_config.json gives it; its KV cache, graph-memory estimate and "
                            "pool are read from the engine and the trace is replayed through its runner, each step "
                            "dispatched by vLLM itself. stand-in: cgtune's decode model captures each list's graphs. "
                            "auto (default): vllm where a build of it for --device is installed at a version the "
                            "adapter was written for and the workload is one it runs, else the stand-in, saying why")
        p.add_argument("--rate", type=positive_float, metavar="R",
                       help="with --backend vllm: after the replay, each list's engine serves the workload's load in "
                            "this process: the first --load-requests Poisson arrivals at R requests/s with "
                            "traffic.load's lengths (seeded), timed by the engine loop; validation.json holds TPOT, "
                            "ITL, TTFT and throughput with 95%% intervals against the load model's prediction of the "
                            "same requests (its steps plus the engine's host work, measured by two calibrations)")
        p.add_argument("--load-requests", type=positive_int, default=64, metavar="N",
                       help="with --rate: requests served per list (default 64)")
        p.add_argument("--load-seconds", type=positive_float, default=120.0, metavar="S",
                       help="with --rate: wall seconds each list's load may take (default 120); requests still "
                            "running then are cut and the record says so")
        p.add_argument("--pin-kv", action="store_true",
                       help="with --backend vllm: write the emitted list's KV cache into its vllm-serve.yaml and "
                            "vllm-flags.txt as --kv-cache-memory-bytes, from what vLLM's engine measured for it (0.33: "
                            "its KV budget with the real pool in place of its start-up estimate, less its 150 MiB "
                            "margin; 0.34: the KV cache its extensible cache kept, which the pin then fixes), so the "
                            "deployment's KV size no longer rides on vLLM's start-up estimate; `cgtune check` holds "
                            "a pinned start-up to it")
        p.add_argument("--vllm-any-version", action="store_true",
                       help="let --backend vllm try a vLLM version the adapter was not written for")
        p.add_argument("--no-emit", action="store_true",
                       help="never rewrite the vLLM files, even when the tuned list does not fit")
        p.add_argument("--allow-mismatch", action="store_true",
                       help="the run's profile was measured for another q, context length, compute capability or "
                            "compile setting: use it anyway (RUN_DIR is first re-rendered under that setting, as "
                            "`cgtune report --allow-mismatch` does, unless its search already recorded it)")

    def run(self, args: argparse.Namespace) -> int:
        from tuner.validate.validation import ValidationError, exact_run, refuse_unvalidated, require_cuda, validate_run

        run = args.run_dir
        if (args.workload is None) != (args.profile is None):
            raise UsageError("--workload and --profile go together (they write RUN_DIR from the exact solver)")
        if args.profile is not None:
            from tuner.commands.common import check_out_dir

            check_out_dir(run, "run_dir")  # missing parents are created, as every command's --out
            if not args.profile.is_file():
                raise UsageError(f"--profile: {str(args.profile)!r} is not a file")
            from tuner.commands.common import load_workload_arg

            workload = load_workload_arg(args.workload)  # a bad workload: one line, before anything is written
            try:
                refuse_unvalidated(workload)
                if args.device == "cuda":
                    require_cuda()  # before writing RUN_DIR: a failed command leaves nothing behind
                exact_run(args.workload, args.profile, run, allow_mismatch=args.allow_mismatch, command=shlex.join(
                    ["cgtune", "validate", str(run), "--workload", str(args.workload), "--profile", str(args.profile)]
                    + (["--allow-mismatch"] if args.allow_mismatch else [])))
            except ValidationError as exc:
                raise UsageError(str(exc)) from None
            print(f"validate: wrote {run}/ from the exact solver on {args.profile}")
        if not run.is_dir():
            raise UsageError(f"run_dir: {str(run)!r} is not a directory")
        for name in ("profile.csv", "workload.yaml", "search.json"):
            if not (run / name).is_file():
                raise UsageError(f"run_dir: {str(run)!r} has no {name} (not a cgtune search or tune output directory)")
        try:
            if args.device == "cuda":
                require_cuda()
        except ValidationError as exc:
            raise UsageError(str(exc)) from None
        instrument = choose_instrument(run, args)
        if args.rate is None and (args.load_requests != 64 or args.load_seconds != 120.0):
            raise UsageError("--load-requests, --load-seconds: need --rate (the load to serve)")
        if args.pin_kv and instrument != "vllm":
            raise UsageError(f"--pin-kv: the pin is what vLLM's engine measured for the list (the backend is "
                             f"{instrument}; pass --backend vllm where vLLM is installed)")
        if args.pin_kv and args.no_emit:
            raise UsageError("--pin-kv: rewrites the emitted list's files, which --no-emit keeps as they are")
        if args.rate is not None and instrument != "vllm":
            raise UsageError(f"--rate {args.rate:g}: only vLLM's engine serves a load (the backend is {instrument}; "
                             f"pass --backend vllm where vLLM is installed)")
        if args.allow_mismatch:
            _record_allow_mismatch(run)
        command = shlex.join(["cgtune", "validate", str(run), "--steps", str(args.steps), "--seed", str(args.seed)]
                             + (["--allow-mismatch"] if args.allow_mismatch else [])
                             + (["--device", "cpu"] if args.device == "cpu" else [])
                             + (["--backend", args.backend] if args.backend != "auto" else [])
                             + (["--rate", f"{args.rate:g}", "--load-requests", str(args.load_requests),
                                 "--load-seconds", f"{args.load_seconds:g}"] if args.rate is not None else [])
                             + (["--pin-kv"] if args.pin_kv else []))
        try:
            record = validate_run(run, num_steps=args.steps, seed=args.seed, command=command, emit=not args.no_emit,
                                  progress=lambda msg: print(f"validate: {msg}", flush=True), device=args.device,
                                  instrument=instrument, any_version=args.vllm_any_version, rate=args.rate,
                                  load_requests=args.load_requests, load_limit_s=args.load_seconds,
                                  pin=args.pin_kv)
        except ValidationError as exc:
            raise UsageError(str(exc)) from None
        _print_table(record)
        print(f"wrote {run / 'validation.json'} and the validation section of {run / 'report.md'}")
        return 0


def choose_instrument(run: Path, args: argparse.Namespace) -> str:
    """`--backend` resolved for the run's workload on --device (`tuner.measure.vllm_engine.choose_backend`), the choice
    and why printed; a backend that cannot run here is a one-line usage error."""
    from tuner.decision.run_dir import load_run_workload
    from tuner.measure.vllm_engine.choose import BackendError, choose_backend
    from tuner.workload.spec import WorkloadError

    try:
        workload = load_run_workload(run)
        instrument, why = choose_backend(args.backend, workload, args.device, any_version=args.vllm_any_version)
    except (BackendError, WorkloadError) as exc:
        raise UsageError(str(exc).splitlines()[0]) from None
    print(f"validate: backend {instrument} ({why})")
    return instrument


def _record_allow_mismatch(run: Path) -> None:
    """Re-render RUN_DIR with allow_mismatch recorded in its summary.json (as `cgtune report --allow-mismatch`), so
    validation, which loads the run as recorded, uses the profile; nothing to do when its search recorded it."""
    from tuner.model.costmodel import ModelError
    from tuner.decision.record import decide
    from tuner.decision.run_dir import load_run, recorded_model_settings
    from tuner.report.run import write_run
    from tuner.workload.spec import WorkloadError

    if recorded_model_settings(run).get("allow_mismatch"):
        return
    try:
        model, search = load_run(run, allow_mismatch=True)
    except (ModelError, WorkloadError) as exc:
        raise UsageError(str(exc).splitlines()[0]) from None
    write_run(run, model, decide(model, search), command=f"cgtune validate {run} --allow-mismatch", copy_inputs=False)


def _fmt(x: object, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def _print_table(record: dict) -> None:
    print(f"device {record.get('device_name')}, {record['trace']['steps']} steps (seed {record['trace']['seed']})")
    print(f"{'list':<10} {'pred GiB':>9} {'meas GiB':>9} {'err':>7} {'pred ms':>9} {'meas ms':>9} {'err':>7} "
          f"{'p99 ms':>9} {'fits':>5}")
    for name in record["lists"]:
        r = record[name]
        mem = r["measured_graph_bytes"]
        print(f"{name:<10} {r['predicted_graph_bytes'] / GIB:>9.3f} {_fmt(mem and mem / GIB, '.3f'):>9} "
              f"{_fmt(r['memory_error'], '+.1%'):>7} {_fmt(r['predicted_trace_step_ms'], '.4f'):>9} "
              f"{_fmt(r['measured_step_ms'], '.4f'):>9} {_fmt(r['latency_error'], '+.1%'):>7} "
              f"{_fmt(r['p99_step_ms'], '.4f'):>9} {'yes' if r['fits'] else 'NO':>5}")
        e = r.get("engine")
        if e and e.get("started"):
            d = e.get("dispatch") or {}
            planned = d.get("steps_as_planned", 0)
            print(f"{'':<10} vLLM kept {e['lists_kept']}; KV cache {e['kv_cache_bytes'] / GIB:.3f} GiB "
                  f"({e['kv_tokens']:,} tokens; predicted {_fmt(r['predicted_kv_bytes'] / GIB, '.3f')} GiB, "
                  f"{_fmt(r['kv_error'], '+.1%')}); {planned} of {planned + d.get('steps_otherwise', 0)} steps "
                  f"dispatched as planned")
        elif e:
            print(f"{'':<10} vLLM did not start: {e.get('oom')}")
        load = r.get("load")
        if load:
            m, p = load["measured"], load["predicted"]
            ci = m.get("tpot_mean_ci_ms")
            print(f"{'':<10} load {load['served']['rate_per_s']:g} req/s x {load['served']['requests']}: TPOT mean "
                  f"{_fmt(m['tpot_mean_ms'], '.3f')} ms"
                  + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")
                  + f" (predicted {_fmt(p['tpot_mean_ms'], '.3f')}, {_fmt(load['errors']['tpot_mean_ms'], '+.1%')}); "
                  f"p99 {_fmt(m['tpot_p99_ms'], '.3f')} (predicted {_fmt(p['tpot_p99_ms'], '.3f')}); throughput "
                  f"{_fmt(m['throughput_tok_s'], '.0f')} tok/s (predicted {_fmt(p['throughput_tok_s'], '.0f')})"
                  + ("; CUT BY THE TIME LIMIT" if m["cut_by_limit"] else ""))
    if record.get("measured_speedup_tuned_over_default") is not None:
        print(f"measured speedup tuned over default: {record['measured_speedup_tuned_over_default']:.3f}x "
              f"(predicted {record['predicted_speedup_tuned_over_default']:.3f}x); emitted: {record.get('emitted')}")
    if record.get("kv_pin"):
        p = record["kv_pin"]
        print(f"pinned: --kv-cache-memory-bytes {p['bytes']} ({p['bytes'] / GIB:.3f} GiB) for '{p['list']}' in "
              f"vllm-serve.yaml and vllm-flags.txt ({p['how']})")
    for w in record.get("warnings", []):
        print(f"WARNING: {w}")
