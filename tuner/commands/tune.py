"""`cgtune tune`: the main job end to end: profile (on a GPU, unless a profile is given), search, emit, report."""

from __future__ import annotations

import argparse
import importlib.util
import logging
from pathlib import Path

from tuner.cli import Command, UsageError
from tuner.commands.common import load_workload_arg, positive_int
from tuner.commands.search import add_search_arguments, command_line, search_and_write
from tuner.workload import Workload

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
        "      --out runs/dflash                                                        # anywhere"
    )

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("workload", help="workload YAML (model shape, serving config, traffic)")
        p.add_argument("--profile", type=Path, metavar="CSV",
                       help="recorded profile (CSV + JSON); without it the GPU of this machine is profiled first")
        p.add_argument("--max-widths", type=positive_int, metavar="N",
                       help="when profiling: thin the candidate widths to N (as `cgtune profile --max-widths`)")
        add_search_arguments(p)

    def run(self, args: argparse.Namespace) -> int:
        workload = load_workload_arg(args.workload)
        if args.out.exists() and not args.out.is_dir():
            raise UsageError(f"--out: {str(args.out)!r} exists and is not a directory")
        profile = args.profile
        if profile is None:
            ok, why = gpu_available()
            if not ok:
                raise UsageError(f"no --profile given and {why}: pass a recorded profile (--profile CSV from "
                                 f"`cgtune profile` on the target GPU) or run on a machine with a CUDA GPU")
            profile = self._profile(workload, args, device_name=why)
        else:
            print(f"[1/3] profile: using {profile}")
        print("[2/3] search")
        code = search_and_write(args.workload, profile, args, command=command_line("tune", args), report=True)
        print(f"[3/3] report: {args.out / 'report.md'}")
        return code

    @staticmethod
    def _profile(workload: Workload, args: argparse.Namespace, *, device_name: str) -> Path:
        from tqdm.contrib.logging import logging_redirect_tqdm

        from tuner.measure.profile import candidate_widths, profile_workload, thin_widths
        from tuner.vllm.defaults import capture_ceiling

        widths = candidate_widths(workload)
        if args.max_widths is not None:
            s = workload.serving
            keep = {capture_ceiling(s.gpu_capability), s.defaults().max_size,
                    min(s.max_num_batched_tokens, s.decode_query_len * s.max_num_seqs)}
            widths = thin_widths(widths, args.max_widths, keep=keep)
        sweep_dir = args.out / "profile-sweep"
        print(f"[1/3] profile: measuring {workload.name} on {device_name} into {sweep_dir}/ "
              f"(rerun to resume if interrupted)")
        with logging_redirect_tqdm():
            result = profile_workload(workload, sweep_dir, widths=widths, device="cuda",
                                      progress=not args.no_progress,
                                      command=f"cgtune tune {args.workload} --out {args.out}")
        if not result.complete:
            raise UsageError(f"profile sweep stopped early; rerun the same command to resume ({result.csv_path})")
        return result.csv_path
