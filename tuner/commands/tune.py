"""`cgtune tune`: the main job end to end: profile (on a GPU, unless a profile is given), search, emit, report."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
from pathlib import Path

from tuner.cli import Command, UsageError
from tuner.commands.common import check_out_dir, load_workload_arg, non_negative_int, positive_int
from tuner.commands.search import add_search_arguments, command_line, prepare_run_dir, resume_line, search_and_write
from tuner.workload.spec import Workload

__all__ = ["TuneCommand", "gpu_available"]

log = logging.getLogger(__name__)


def gpu_available() -> tuple[bool, str]:
    """Whether this machine can measure a profile: `tuner.measure` importable (torch installed) and CUDA visible."""
    if importlib.util.find_spec("torch") is None:
        return False, "PyTorch is not installed"
    try:
        import tuner.measure  # noqa: F401  (imports torch)
        import torch
    except ImportError as exc:
        return False, f"the measurement stage cannot be imported ({exc})"
    if not torch.cuda.is_available():
        return False, "no CUDA device is visible"
    return True, torch.cuda.get_device_name(0)


class TuneCommand(Command):
    help = "profile (on a GPU) or take a profile, search, write the vLLM files and the report"
    description = (
        "The whole job for one workload: without --profile, measure it on this machine's GPU first\n"
        "(`cgtune profile`, written to DIR/profile-sweep/ and resumable); then search capture lists within\n"
        "the KV budget (`cgtune search`), write compilation_config.json, vllm-serve.yaml and vllm-flags.txt,\n"
        "and render report.md with plots and summary.json (`cgtune report`). Without a GPU, pass a recorded\n"
        "profile with --profile.\n\n"
        "examples:\n"
        "  cgtune tune workloads/dflash-llama-3.1-8b.yaml --out runs/dflash            # on a GPU machine\n"
        "  cgtune tune workloads/dflash-llama-3.1-8b.yaml --profile reports/h200/dflash-llama-3.1-8b.csv \\\n"
        "      --out runs/dflash                                                        # anywhere\n"
        "  cgtune tune W.yaml --out runs/w --validate 3           # on a GPU: measure 3 candidates, ship the fastest\n"
        "  CGTUNE_STORAGE=postgresql+psycopg2://u:PW@db/cgtune cgtune tune W.yaml --profile P.csv --out runs/w \\\n"
        "      --workers 0                         # plan a fleet study; `cgtune worker` runs it (docs/fleet.md)"
    )

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("workload", help="workload YAML (model shape, serving config, traffic)")
        p.add_argument("--profile", type=Path, metavar="CSV",
                       help="recorded profile (CSV + JSON); without it the GPU of this machine is profiled first")
        p.add_argument("--max-widths", type=positive_int, metavar="N",
                       help="when profiling: thin the candidate widths to N (as `cgtune profile --max-widths`)")
        add_search_arguments(p)
        p.add_argument("--validate", type=positive_int, metavar="K",
                       help="after the search, capture and replay vLLM's default and the K best distinct candidate "
                            "lists on this machine's GPU (as `cgtune validate`) and ship the fastest by measured step "
                            "latency whose measured graph memory fits the KV budget; needs CUDA (checked first). "
                            "Measurements are recorded as trials (source gpu-validation) in the study")
        p.add_argument("--validate-steps", type=positive_int, default=3000, metavar="N",
                       help="with --validate: steps in the seeded replay trace of the workload (default 3000)")
        p.add_argument("--backend", choices=("auto", "vllm", "stand-in"), default="auto",
                       help="the instrument of the profile step and of --validate: vllm builds vLLM's own engine "
                            "(per list, with the list as its compilation config, when validating), stand-in cgtune's "
                            "decode model; auto (default) vllm where a CUDA build of it is installed at a version the "
                            "adapter was written for and the workload is one it runs, else the stand-in, saying why")
        p.add_argument("--pin-kv", action="store_true",
                       help="with --validate and the vllm backend: the shipped list's files pin its KV cache "
                            "(--kv-cache-memory-bytes) at what vLLM's engine measured for it (as `cgtune validate "
                            "--pin-kv`)")
        p.add_argument("--workers", type=non_negative_int, metavar="N",
                       help="run the search as a fleet study in --storage (or $CGTUNE_STORAGE): plan its trials, "
                            "start N local `cgtune worker` processes (0: none; workers on other hosts join with "
                            "`cgtune worker --study NAME`) and write DIR once every planned trial has run; rerun "
                            "to collect a study that others ran")
        p.add_argument("--heartbeat-interval", type=positive_int, default=10, metavar="S",
                       help="fleet study: seconds between a running trial's heartbeats (default 10; set when the "
                            "study is created)")
        p.add_argument("--grace-period", type=positive_int, default=60, metavar="S",
                       help="fleet study: a trial whose heartbeat is older than S seconds is failed and retried by "
                            "another worker (default 60; set when the study is created)")

    def run(self, args: argparse.Namespace) -> int:
        workload = load_workload_arg(args.workload)
        check_out_dir(args.out)
        if args.pin_kv and args.validate is None:
            raise UsageError("--pin-kv: needs --validate K (the pin is what vLLM's engine measured for the shipped list)")
        if args.validate is not None:
            from tuner.validate.validation import ValidationError, refuse_unvalidated, require_cuda

            try:
                refuse_unvalidated(workload)
                device = require_cuda()  # before any search work: a failed command leaves nothing behind
            except ValidationError as exc:
                raise UsageError(f"--validate: {exc}") from None
            self._instrument(args, workload, device)  # before any work, as the device
        fleet_url = None
        if args.workers is not None:
            from tuner.search.workers import FleetError, resolve_storage

            try:
                fleet_url = resolve_storage(args.storage)
            except FleetError as exc:
                raise UsageError(f"--workers: {exc}") from None
        profile = args.profile
        if profile is None:
            ok, why = gpu_available()
            if not ok:
                raise UsageError(f"no --profile given and {why}: pass a recorded profile (--profile CSV from "
                                 f"`cgtune profile` on the target GPU) or run on a machine with a CUDA GPU")
            self._instrument(args, workload, "cuda")
            # The profile will be DIR's own sweep (resumed on a rerun): only the workload must match. Checked before
            # any measurement; --force clears DIR only once the search has its inputs (it keeps profile-sweep/).
            prepare_run_dir(args.out, workload, None, force=args.force, clear=False)
            profile = self._profile(workload, args, device_name=why)
        else:
            print(f"[1/3] profile: using {profile}")
        print("[2/3] search")
        if fleet_url is not None:
            state = self._fleet(args, profile, fleet_url)
            if state != "done":
                return 0 if state == "pending" else 1
        else:
            search_and_write(args.workload, profile, args, command=command_line("tune", args), report=True,
                             own_profile=args.profile is None)
        print(f"[3/3] report: {args.out / 'report.md'}")
        if args.validate is not None:
            return self._validate(args, fleet_url)
        return 0

    @staticmethod
    def _instrument(args: argparse.Namespace, workload: Workload, device: str) -> None:
        """--backend resolved once for the profile step and --validate on this machine's GPU (`args.instrument`), the
        choice printed; a backend that cannot run here, or --pin-kv without vLLM, is a one-line usage error."""
        if getattr(args, "instrument", None) is not None:
            return
        from tuner.measure.vllm_engine.choose import BackendError, choose_backend

        try:
            args.instrument, why = choose_backend(args.backend, workload, device)
        except BackendError as exc:
            raise UsageError(str(exc)) from None
        print(f"backend: {args.instrument} ({why})")
        if args.pin_kv and args.instrument != "vllm":
            raise UsageError(f"--pin-kv: the pin is what vLLM's engine measured (the backend is {args.instrument}; "
                             f"pass --backend vllm where vLLM is installed)")

    @staticmethod
    def _validate(args: argparse.Namespace, fleet_url: str | None) -> int:
        """Measure the K best candidates on the GPU and re-emit the run directory for the measured winner."""
        from tuner.decision.record import decide
        from tuner.decision.run_dir import load_run
        from tuner.report.run import write_run
        from tuner.search.storage_url import engine_url
        from tuner.validate.validation import validate_candidates

        command = command_line("tune", args) + f" --validate {args.validate}"
        model, search = load_run(args.out)
        chosen, record = validate_candidates(
            args.out, model, search, args.validate, num_steps=args.validate_steps, seed=args.seed,
            storage=engine_url(fleet_url or args.storage) if (fleet_url or args.storage) else None, command=command,
            progress=lambda m: print(f"validate: {m}", flush=True),
            instrument=getattr(args, "instrument", None) or "stand-in",
            pin=args.pin_kv)
        if chosen is None:
            device = record.get("device_name") or "the GPU"
            print(f"cgtune tune: error: no validated list fits by measured graph memory on {device}; the vLLM files "
                  f"in {args.out} were removed (see validation.json)", file=sys.stderr)
            return 1
        if chosen is not search or record.get("kv_pin"):
            write_run(args.out, model, decide(model, chosen), command=command, copy_inputs=False,
                      kv_pin=record.get("kv_pin"))
        print(f"validate: shipped '{record.get('emitted')}' {list(chosen.chosen.capture_sizes)} "
              f"(validation.json, report.md)")
        return 0

    @staticmethod
    def _fleet(args: argparse.Namespace, profile: Path, url: str) -> str:
        """Plan (or extend) the fleet study, run --workers local workers, and write DIR when every planned trial has
        run: `done`; `pending` when workers elsewhere still have to run it; `failed` when a local worker failed
        and left it unfinished."""
        from tuner.commands.search import (_check_out, _load_aware, _print_summary, check_load_args, choose_compact,
                                           model_from_args)
        from tuner.search.workers import FleetError, create_or_extend, fleet_result, run_local_workers, study_status
        from tuner.model.costmodel import ModelError
        from tuner.decision.record import decide
        from tuner.decision.run_dir import earlier_answer
        from tuner.report.run import write_run
        from tuner.search.study import SearchError, exact_solve
        from tuner.search.storage_url import display_url

        workload = load_workload_arg(args.workload)
        _check_out(args.out)
        check_load_args(workload, args)
        fixed_point = None
        seeds = earlier_answer(args.out, workload)  # a rerun in DIR answers no worse than the run it replaces
        try:
            model = model_from_args(profile, workload, args)
            # A budget nothing meets fails before any write.
            exact = exact_solve(model, memory_buckets=args.memory_buckets, work=args.exact_work,
                                seconds=args.exact_seconds, incumbents=seeds)
            if args.rate is not None:
                # The fixed point first, here (deterministic: a rerun that writes DIR finds it again): its model,
                # load steps included, is what the study's spec carries, so every worker weighs trials on it, and
                # its own study name keeps it apart from a study of the workload's traffic.
                fixed_point, load_s = _load_aware(model, workload, args, exact)
                model = fixed_point.model
            name, enqueued = create_or_extend(
                url, args.workload, profile, model, objective=args.objective, n_trials=args.trials, seed=args.seed,
                memory_buckets=args.memory_buckets, heartbeat_interval_s=args.heartbeat_interval,
                grace_period_s=args.grace_period)
        except (ModelError, SearchError, FleetError) as exc:
            raise UsageError(str(exc)) from None
        print(f"fleet study {name} in {display_url(url)}: {enqueued} trials enqueued now")
        codes: list[int] = []
        if args.workers:
            try:
                codes = run_local_workers(url, name, args.workers, progress=not args.no_progress)
            except KeyboardInterrupt:
                raise KeyboardInterrupt(
                    f"interrupted: kept fleet study {name} in {display_url(url)} (its finished trials stay, a trial "
                    f"left running is retried after --grace-period); resume with: "
                    f"{resume_line('tune', args, display_url(url))}") from None
            if any(codes):
                log.warning("local workers exited with %s", codes)
        [status] = study_status(url, name)
        if not status.done and any(codes):
            print(f"cgtune tune: error: local workers exited with {codes} and study {name} is unfinished (see their "
                  f"errors above); rerun to resume it", file=sys.stderr)
            return "failed"
        if not status.done:
            c = status.counts
            print(f"study not done yet ({c['complete']} complete, {c['running']} running, {c['waiting']} waiting): "
                  f"start workers with `cgtune worker --study {name}` (storage from --storage or $CGTUNE_STORAGE), "
                  f"watch `cgtune status --study {name}`, then rerun this command to write {args.out}/")
            return "pending"
        try:
            result = fleet_result(url, name, model, exact_seconds=args.exact_seconds, exact_work=args.exact_work)
        except FleetError as exc:
            raise UsageError(str(exc)) from None
        choose_compact(model, result, args, seeds)
        result.ship = args.ship
        if fixed_point is not None:
            result.load_search, result.load_record = fixed_point, fixed_point.as_dict()
            result.timings["load_search_s"] = load_s
        decision = decide(model, result)
        written = write_run(args.out, model, decision, command=command_line("tune", args), plots=True, report=True)
        _print_summary(decision, written, args.out, model)
        return "done"

    @staticmethod
    def _profile(workload: Workload, args: argparse.Namespace, *, device_name: str) -> Path:
        from tqdm.contrib.logging import logging_redirect_tqdm

        from tuner.measure.profile import candidate_widths, profile_workload, thin_widths
        from tuner.engines.vllm.defaults import capture_ceiling

        widths = candidate_widths(workload)
        if args.max_widths is not None:
            s = workload.serving
            keep = {capture_ceiling(s.gpu_capability), workload.engine.defaults().max_size,
                    min(s.max_num_batched_tokens, s.decode_query_len * s.max_num_seqs)}
            widths = thin_widths(widths, args.max_widths, keep=keep)
        sweep_dir = args.out / "profile-sweep"
        print(f"[1/3] profile: measuring {workload.name} on {device_name} into {sweep_dir}/ "
              f"(rerun to resume if interrupted)")
        try:
            with logging_redirect_tqdm():
                if getattr(args, "instrument", None) == "vllm":
                    from tuner.measure.vllm_engine import profile_through_vllm

                    result = profile_through_vllm(workload, sweep_dir, widths=widths, device="cuda",
                                                  progress=not args.no_progress,
                                                  command=f"cgtune tune {args.workload} --out {args.out}")
                else:
                    result = profile_workload(workload, sweep_dir, widths=widths, device="cuda",
                                              progress=not args.no_progress,
                                              command=f"cgtune tune {args.workload} --out {args.out}")
        except KeyboardInterrupt:
            raise KeyboardInterrupt(
                f"interrupted while profiling: {_measured(sweep_dir / f'{workload.name}.csv')} kept in "
                f"{sweep_dir}/; resume with: {resume_line('tune', args, args.storage)}") from None
        if not result.complete:
            raise UsageError(f"profile sweep stopped early; rerun the same command to resume ({result.csv_path})")
        return result.csv_path


def _measured(csv_path: Path) -> str:
    """How much of an interrupted sweep its table kept (it is written after every width)."""
    from tuner.profile.table import ProfileError, read_profile

    try:
        widths = {r.num_tokens for r in read_profile(csv_path).rows if r.status != "unsupported"}
    except (ProfileError, OSError):
        return "no measured width"
    return f"{len(widths)} measured widths"
