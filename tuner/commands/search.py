"""`cgtune search`: search capture lists for a workload on a recorded profile, and write the vLLM files."""

from __future__ import annotations

import argparse
import logging
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.cli import Command, UsageError
from tuner.commands.common import load_workload_arg, positive_int

if TYPE_CHECKING:
    from tuner.search import SearchResult

__all__ = ["SearchCommand", "add_search_arguments", "command_line", "search_and_write"]

log = logging.getLogger(__name__)
GIB = 1 << 30


def add_search_arguments(p: argparse.ArgumentParser) -> None:
    """Flags `search` and `tune` share."""
    p.add_argument("--out", required=True, type=Path, metavar="DIR",
                   help="run directory: vLLM files, search.json, summary.json (and study.db with the default "
                        "storage); rerunning into the same DIR resumes the study")
    p.add_argument("--trials", type=positive_int, default=300, metavar="N",
                   help="trials the optuna study should hold (default 300; a resumed study runs the missing ones)")
    p.add_argument("--storage", metavar="URL",
                   help="optuna storage URL, e.g. postgresql://host/db (default: sqlite:///DIR/study.db)")
    p.add_argument("--objective", choices=("latency", "pareto"), default="latency",
                   help="latency (default): fastest list within the KV budget; pareto: latency/graph-memory front")
    p.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    p.add_argument("--memory-buckets", type=positive_int, default=2048, metavar="N",
                   help="memory resolution of the exact solver across the graph budget (default 2048)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def command_line(name: str, args: argparse.Namespace) -> str:
    """The command, rebuilt from parsed flags (for provenance)."""
    parts = ["cgtune", name, str(args.workload)]
    if getattr(args, "profile", None):
        parts += ["--profile", str(args.profile)]
    parts += ["--out", str(args.out), "--trials", str(args.trials)]
    if args.storage:
        parts += ["--storage", "<url>"]  # a URL may carry a password; keep it out of files
    if args.objective != "latency":
        parts += ["--objective", args.objective]
    if args.seed:
        parts += ["--seed", str(args.seed)]
    if getattr(args, "workers", None) is not None:
        parts += ["--workers", str(args.workers)]
    return shlex.join(parts)


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out: {str(out)!r} exists and is not a directory")


def search_and_write(workload_path: str, profile_csv: Path, args: argparse.Namespace, *, command: str,
                     report: bool) -> int:
    """Fit, search, write the run directory and print a short summary; bad input raises before anything is
    written."""
    from tuner.model import CostModel, ModelError
    from tuner.report import write_run
    from tuner.search import SearchConfig, SearchError, exact_solve, run_search

    workload = load_workload_arg(workload_path)
    _check_out(args.out)
    try:
        model = CostModel.from_files(profile_csv, workload)
        exact = exact_solve(model, memory_buckets=args.memory_buckets)  # a budget nothing meets fails before --out
    except (ModelError, SearchError) as exc:
        raise UsageError(str(exc)) from None
    config = SearchConfig(n_trials=args.trials, storage=args.storage, objective=args.objective, seed=args.seed,
                          memory_buckets=args.memory_buckets, progress=not args.no_progress)
    log.info("searching %d candidate widths for %s (%s)", len(model.candidates), workload.name, profile_csv)
    result = run_search(model, config, run_dir=args.out, exact=exact)
    written = write_run(args.out, model, result, command=command, plots=report, report=report)
    _print_summary(result, written, args.out)
    return 0


def _print_summary(result: SearchResult, written: list[Path], out: Path) -> None:
    t, d = result.chosen, result.default
    change = t.expected_step_ms / d.expected_step_ms - 1 if d.expected_step_ms else 0.0
    gap = result.gap
    how = {"study": f"optuna study, {gap:.2%} from the exact optimum" if gap is not None else "optuna study",
           "exact": "exact solver; see the notes in summary.json", "default": "vLLM default",
           "gpu-validated": "fastest measured on the GPU by --validate"}[result.source]
    top = t.capture_sizes[-1] if t.capture_sizes else 0
    print(f"tuned list ({how}): {len(t.capture_sizes)} graphs, max {top}")
    print(f"expected step {t.expected_step_ms:.4f} ms vs vLLM default {d.expected_step_ms:.4f} ms ({change:+.1%}); "
          f"graph memory {t.graph_memory_bytes / GIB:.3f} GiB vs {d.graph_memory_bytes / GIB:.3f} GiB; "
          f"KV margin {t.kv_margin_gib:.2f} GiB" + ("" if d.feasible else " (the default does not fit the KV budget)"))
    n = result.trials
    print(f"study {result.study_name}: {n.get('total', 0)} trials ({n.get('feasible', 0)} feasible, "
          f"{n.get('infeasible', 0)} infeasible, {n.get('failed', 0)} failed, {n.get('run_now', 0)} run now)")
    names = sorted(str(p.relative_to(out)) for p in written if p.parent == out)
    print(f"wrote {out}/: {', '.join(names)}" + (" and plots/" if any(p.parent != out for p in written) else ""))
    flags = out / "vllm-flags.txt"
    if flags.is_file():
        line = [ln for ln in flags.read_text().splitlines() if ln and not ln.startswith("#")]
        if line:
            print(f"vllm serve MODEL {line[0]}")


class SearchCommand(Command):
    help = "search capture lists on a recorded profile; write compilation_config.json and vllm-serve.yaml"
    description = (
        "Fit the cost model from a profile (CSV + JSON from `cgtune profile`) and the workload's step-width\n"
        "distribution, then search explicit cudagraph_capture_sizes (above the 512/1024 ceiling too) that\n"
        "lower the expected step latency while the KV cache keeps what the workload requires. An optuna study\n"
        "(vLLM's default list is its first trial; KV feasibility is a constraint) runs next to an exact\n"
        "dynamic program; the study's best ships when within 1% of the exact optimum, else the exact answer.\n"
        "Needs no GPU. The study is named from the workload and profile hashes, so a rerun resumes it.\n\n"
        "examples:\n"
        "  cgtune search workloads/dflash-llama-3.1-8b.yaml --profile reports/h200/dflash-llama-3.1-8b.csv \\\n"
        "      --out runs/dflash\n"
        "  cgtune search W.yaml --profile P.csv --out runs/x --objective pareto --storage postgresql://h/db"
    )

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("workload", help="workload YAML (model shape, serving config, traffic)")
        p.add_argument("--profile", required=True, type=Path, metavar="CSV",
                       help="profile table from `cgtune profile` (its .json must sit beside it)")
        add_search_arguments(p)

    def run(self, args: argparse.Namespace) -> int:
        return search_and_write(args.workload, args.profile, args, command=command_line("search", args),
                                report=False)
