"""`cgtune search`: search capture lists for a workload on a recorded profile, and write the vLLM files."""

from __future__ import annotations

import argparse
import logging
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.cli import Command, UsageError
from tuner.commands.common import (check_out_dir, load_workload_arg, non_negative_int, positive_float, positive_int,
                                   storage_url)
from tuner.model.costmodel import DEFAULT_MAX_CAPTURE_S, DEFAULT_MAX_GRAPHS
from tuner.search.exact_answer import DEFAULT_WORK

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tuner.model.costmodel import CostModel
    from tuner.decision.record import Decision
    from tuner.search.exact import ExactResult
    from tuner.search.load_aware import LoadIteration, LoadSearch
    from tuner.search.study import SearchInterrupted, SearchResult
    from tuner.workload.spec import Workload

__all__ = ["NOISY_LIMIT", "SearchCommand", "add_search_arguments", "choose_compact", "command_line",
           "model_from_args", "prepare_run_dir", "resume_line", "search_and_write", "seconds", "share"]

log = logging.getLogger(__name__)
NOISY_LIMIT = 0.25
"""`search` and `tune` refuse a profile where more than this share of the decision widths are noisy (--allow-noisy)."""


def add_search_arguments(p: argparse.ArgumentParser) -> None:
    """Flags `search` and `tune` share."""
    p.add_argument("--out", required=True, type=Path, metavar="DIR",
                   help="run directory: vLLM files, search.json, summary.json (and study.db with the default "
                        "storage); rerunning into the same DIR resumes the study")
    p.add_argument("--trials", type=positive_int, default=300, metavar="N",
                   help="trials the optuna study should hold (default 300; a resumed study runs the missing ones)")
    p.add_argument("--storage", metavar="URL", type=storage_url,
                   help="optuna storage URL, e.g. postgresql://host/db (default: sqlite:///DIR/study.db)")
    p.add_argument("--objective", choices=("latency", "pareto"), default="latency",
                   help="latency (default): fastest list within the KV budget; pareto: latency/graph-memory front")
    p.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    p.add_argument("--memory-buckets", type=positive_int, default=2048, metavar="N",
                   help="memory resolution of the exact solver across the graph budget (default 2048)")
    p.add_argument("--exact-work", type=positive_int, default=DEFAULT_WORK, metavar="N",
                   help=f"work budget of the exact solver and of the compact choice, in their steps (default "
                        f"{DEFAULT_WORK:,}): past it, the best list found is used with a proven bound on its gap to "
                        f"the optimum, and the report says so. Work, not seconds: the answer is the same on a loaded "
                        f"machine as on a quiet one")
    p.add_argument("--exact-seconds", type=seconds, default=None, metavar="S",
                   help="a wall-clock limit on the exact solver and the compact choice besides --exact-work (default "
                        "none): with it the answer may depend on the machine's load, and the report says when it ran "
                        "out")
    p.add_argument("--max-capture-seconds", type=non_negative_float, default=DEFAULT_MAX_CAPTURE_S, metavar="S",
                   help=f"the start-up budget: no list searched, compacted or shipped may take more than S seconds of "
                        f"graph capture at each start-up, by the profile's capture times (default "
                        f"{DEFAULT_MAX_CAPTURE_S:g}; a deployment restarts, autoscales and fails over)")
    p.add_argument("--max-graphs", type=non_negative_int, default=DEFAULT_MAX_GRAPHS, metavar="N",
                   help=f"the start-up budget: no list may make the engine capture more than N graphs (every mode, "
                        f"the drafter's included; default {DEFAULT_MAX_GRAPHS})")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--off-peak-weight", type=share, default=0.0, metavar="W",
                   help="mix a share W (0..1, default 0) of off-peak decode traffic (uniform over 1..max_num_seqs "
                        "requests) into the objective, so the list also serves quiet hours well (another study)")
    p.add_argument("--allow-mismatch", action="store_true",
                   help="use a profile measured for another q, context length, compute capability or compile setting "
                        "(a note in the report instead of an error)")
    p.add_argument("--allow-noisy", action="store_true",
                   help="search even when more than a quarter of the widths the decision rests on were flagged noisy "
                        "(IQR/median > 5%%) while profiling")
    p.add_argument("--allow-outliers", action="store_true",
                   help="search with readings more than 10x off their neighbours' median (a latency also under a "
                        "tenth of it; a memory reading also more than 10x every other of its column): by default "
                        "their rows are dropped and their widths offered to no list; either way the report lists them "
                        "by width")
    p.add_argument("--cpu-rehearsal", action="store_true",
                   help="search a profile measured through vLLM's CPU build (profile --backend vllm --device cpu) as "
                        "that build runs it: it keeps no CUDA graphs, so every list runs eager and costs the same; "
                        "for rehearsing `cgtune validate --backend vllm` on a CPU, never a GPU answer")
    p.add_argument("--tolerance", type=share, default=0.01, metavar="T",
                   help="the compact list: the least graph memory (vLLM's estimate; the real pool where the engine's "
                        "rule counts that) whose expected step is within a share T (0..1, default 0.01 = 1%%) of the "
                        "fastest list; the report recommends it when it saves a quarter of the tuned list's")
    p.add_argument("--ship", choices=("auto", "fastest", "compact"), default="auto",
                   help="which list the deployment files carry: auto (default) the compact list when the report "
                        "recommends it (it saves at least a quarter of the fastest list's graph memory within "
                        "--tolerance), else the fastest; the other list's files stand beside them as "
                        "<file>.fastest.<ext> or <file>.compact.<ext>")
    p.add_argument("--rate", type=positive_float, metavar="R",
                   help="tune for the load the deployment will see: R requests/s of Poisson arrivals with the "
                        "workload's traffic.load lengths and acceptance. The list is chosen at the fixed point of the "
                        "step distribution vLLM's scheduler makes of that load under it (simulated) and the exact "
                        "solver's list for that distribution; the report adds TPOT p99 against the rate for the "
                        "default, tuned and compact lists, the cliff marked (two operating points from an empty and a "
                        "saturated start). Without --rate the search weighs the workload's traffic section")
    p.add_argument("--tpot-slo", type=positive_float, metavar="MS",
                   help="with --rate: a TPOT p99 target (ms); the report finds the highest rate each list holds with "
                        "one operating point that keeps up and meets it")
    p.add_argument("--load-duration", type=seconds, default=30.0, metavar="S",
                   help="with --rate: simulated seconds of each load run (default 30; the first 20%% is cut as "
                        "warm-up)")
    p.add_argument("--load-iterations", type=positive_int, default=8, metavar="N",
                   help="with --rate: fixed-point iterations at most after the expected-step answer (default 8)")
    p.add_argument("--force", action="store_true",
                   help="DIR holds the run of another workload or profile: clear it (the files cgtune wrote there and "
                        "its study.db; profile-sweep/ is kept) and write this run instead of refusing")


def share(text: str) -> float:
    """argparse type: a share in 0..1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"{value:g} must be in 0..1")
    return value


def non_negative_float(text: str) -> float:
    """argparse type: a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value < float("inf"):  # also refuses nan
        raise argparse.ArgumentTypeError(f"{value:g} must be a finite number >= 0")
    return value


def seconds(text: str) -> float:
    """argparse type: a time in seconds, > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0.0 or value == float("inf"):  # also refuses nan
        raise argparse.ArgumentTypeError(f"{value:g} must be a number of seconds > 0")
    return value


def model_from_args(profile_csv: Path, workload: Workload, args: argparse.Namespace) -> CostModel:
    """The cost model `search` and `tune` search with: the profile and workload under --allow-mismatch,
    --allow-outliers and --off-peak-weight; a profile whose decision widths are too often noisy is refused (one line)
    unless --allow-noisy.
    Raises ModelError (or UsageError) before anything is written."""
    from tuner.model.costmodel import CostModel

    model = CostModel.from_files(profile_csv, workload, allow_mismatch=getattr(args, "allow_mismatch", False),
                                 allow_outliers=getattr(args, "allow_outliers", False),
                                 off_peak_weight=getattr(args, "off_peak_weight", 0.0),
                                 cpu_rehearsal=getattr(args, "cpu_rehearsal", False),
                                 max_capture_s=getattr(args, "max_capture_seconds", DEFAULT_MAX_CAPTURE_S),
                                 max_graphs=getattr(args, "max_graphs", DEFAULT_MAX_GRAPHS))
    if model.noisy_share > NOISY_LIMIT and not getattr(args, "allow_noisy", False):
        noisy = len(set(model.noisy_widths) & set(model.decision_widths()))
        raise UsageError(f"{profile_csv}: {noisy} of the {len(model.decision_widths())} widths the decision rests on "
                         f"({model.noisy_share:.0%}, more than {NOISY_LIMIT:.0%}) were flagged noisy "
                         f"(IQR/median > 5%); re-profile on a quiet GPU or pass --allow-noisy")
    return model


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
    if getattr(args, "off_peak_weight", 0.0):
        parts += ["--off-peak-weight", f"{args.off_peak_weight:g}"]
    if getattr(args, "tolerance", 0.01) != 0.01:
        parts += ["--tolerance", f"{args.tolerance:g}"]
    if getattr(args, "ship", "auto") != "auto":
        parts += ["--ship", args.ship]
    if getattr(args, "max_capture_seconds", DEFAULT_MAX_CAPTURE_S) != DEFAULT_MAX_CAPTURE_S:
        parts += ["--max-capture-seconds", f"{args.max_capture_seconds:g}"]
    if getattr(args, "max_graphs", DEFAULT_MAX_GRAPHS) != DEFAULT_MAX_GRAPHS:
        parts += ["--max-graphs", str(args.max_graphs)]
    if getattr(args, "rate", None) is not None:
        parts += ["--rate", f"{args.rate:g}"]
        if args.tpot_slo is not None:
            parts += ["--tpot-slo", f"{args.tpot_slo:g}"]
        if args.load_duration != 30.0:
            parts += ["--load-duration", f"{args.load_duration:g}"]
        if args.load_iterations != 8:
            parts += ["--load-iterations", str(args.load_iterations)]
    parts += [flag for flag, on in (("--allow-mismatch", getattr(args, "allow_mismatch", False)),
                                    ("--allow-noisy", getattr(args, "allow_noisy", False)),
                                    ("--allow-outliers", getattr(args, "allow_outliers", False)),
                                    ("--cpu-rehearsal", getattr(args, "cpu_rehearsal", False))) if on]
    return shlex.join(parts)


def resume_line(name: str, args: argparse.Namespace, storage: str | None) -> str:
    """The command that resumes an interrupted run: the same flags, the storage as shown (password hidden), and
    never --force, which would clear what was kept."""
    line = command_line(name, args)
    if args.storage and storage:
        line = line.replace(shlex.join(["--storage", "<url>"]), shlex.join(["--storage", storage]))
    extra: list[str] = []
    if getattr(args, "max_widths", None) is not None:
        extra += ["--max-widths", str(args.max_widths)]
    if args.memory_buckets != 2048:
        extra += ["--memory-buckets", str(args.memory_buckets)]
    if getattr(args, "exact_work", DEFAULT_WORK) != DEFAULT_WORK:
        extra += ["--exact-work", str(args.exact_work)]
    if getattr(args, "exact_seconds", None) is not None:
        extra += ["--exact-seconds", f"{args.exact_seconds:g}"]
    if getattr(args, "validate", None) is not None:
        extra += ["--validate", str(args.validate), "--validate-steps", str(args.validate_steps)]
    return line + (" " + shlex.join(extra) if extra else "")


def _check_out(out: Path) -> None:
    check_out_dir(out)


def prepare_run_dir(out: Path, workload: Workload, profile_csv: Path | None, *, force: bool,
                    clear: bool = True) -> None:
    """Refuse (one line) a DIR that holds another workload's or profile's run, or with --force clear it (unless
    `clear` is False: a check ahead of work that must come first)."""
    from tuner.decision.run_dir import clear_run, run_conflict

    conflict = run_conflict(out, workload, profile_csv)
    if conflict is None:
        return
    if not force:
        raise UsageError(f"--out: {conflict}; pass --force to clear it, or choose another --out")
    if not clear:
        return
    inputs = (workload.path, profile_csv, profile_csv.with_suffix(".json")) if profile_csv else (workload.path,)
    removed = clear_run(out, keep=tuple(p for p in inputs if p is not None))
    print(f"--force: cleared {len(removed)} files and folders of the earlier run from {out}/")


def _interrupted(exc: SearchInterrupted, name: str, args: argparse.Namespace) -> KeyboardInterrupt:
    done = "an unknown number of" if exc.finished is None else str(exc.finished)
    pruned = (f", {exc.pruned} interrupted, kept as pruned: {'it counts' if exc.pruned == 1 else 'they count'} "
              f"toward the {args.trials}" if exc.pruned else "")
    return KeyboardInterrupt(
        f"interrupted: kept study {exc.study_name} in {exc.storage} ({done} of {args.trials} trials finished{pruned}); "
        f"resume with: {resume_line(name, args, exc.storage)}")


def search_and_write(workload_path: str, profile_csv: Path, args: argparse.Namespace, *, command: str,
                     report: bool, own_profile: bool = False) -> int:
    """Fit, search, write the run directory and print a short summary; bad input raises before anything is
    written. `own_profile`: the profile is DIR's own sweep (`tune` without --profile), so a run in DIR on another
    profile of the same workload is this workload's earlier run, not a conflict."""
    import tuner
    from tuner.decision.run_dir import earlier_answer
    from tuner.model.costmodel import ModelError
    from tuner.search.study import SearchError, SearchInterrupted, exact_solve

    workload = load_workload_arg(workload_path)
    _check_out(args.out)
    check_load_args(workload, args)
    seeds = earlier_answer(args.out, workload)  # a rerun in DIR answers no worse than the run it replaces
    try:
        model = model_from_args(profile_csv, workload, args)
        # A budget nothing meets fails before --out.
        exact = exact_solve(model, memory_buckets=args.memory_buckets, work=args.exact_work,
                            seconds=args.exact_seconds, incumbents=seeds)
    except (ModelError, SearchError) as exc:
        raise UsageError(str(exc)) from None
    fixed_point = None
    if getattr(args, "rate", None) is not None:
        fixed_point, load_s = _load_aware(model, workload, args, exact)
        model, exact = fixed_point.model, fixed_point.exact
    prepare_run_dir(args.out, workload, None if own_profile else profile_csv, force=getattr(args, "force", False))
    log.info("searching %d candidate widths for %s (%s)", len(model.candidates), workload.name, profile_csv)
    print(f"start-up budget: every list at most {model.max_capture_s:g} s of graph capture and {model.max_graphs} "
          f"graphs (--max-capture-seconds, --max-graphs)", flush=True)
    name = "tune" if command.startswith("cgtune tune") else "search"
    try:
        result = tuner.search_capture_lists(
            model, trials=args.trials, seed=args.seed, objective=args.objective, storage=args.storage,
            run_dir=args.out, tolerance=getattr(args, "tolerance", None), memory_buckets=args.memory_buckets,
            exact_work=args.exact_work, exact_seconds=args.exact_seconds, progress=not args.no_progress, exact=exact,
            seeds=seeds)
    except SearchInterrupted as exc:
        raise _interrupted(exc, name, args) from None
    result.ship = args.ship
    if fixed_point is not None:
        result.load_search, result.load_record = fixed_point, fixed_point.as_dict()
        result.timings["load_search_s"] = load_s
    try:
        decision = tuner.decide(model, result)
        written = tuner.write_run(args.out, model, decision, command=command, report=report)
    except KeyboardInterrupt:
        raise KeyboardInterrupt(
            f"interrupted while writing {args.out}/: study {result.study_name} in {result.storage} is complete "
            f"({result.trials.get('total', 0)} trials); rerun to write the files: "
            f"{resume_line(name, args, result.storage)}") from None
    _print_summary(decision, written, args.out, model, report=report)
    return 0


def check_load_args(workload: Workload, args: argparse.Namespace) -> None:
    """--rate needs the workload's traffic.load (lengths, acceptance); --tpot-slo and the load flags need --rate."""
    rate = getattr(args, "rate", None)
    if rate is None:
        if getattr(args, "tpot_slo", None) is not None:
            raise UsageError("--tpot-slo: needs --rate (the load the target is to hold)")
        return
    if workload.load is None:
        raise UsageError(f"--rate: workload {workload.name} has no traffic.load section (prompt_tokens, output_tokens, "
                         f"acceptance when speculating, rate_per_s): the load's lengths are needed to simulate it")


def _load_aware(model: CostModel, workload: Workload, args: argparse.Namespace,
                first: ExactResult) -> tuple[LoadSearch, float]:
    """The fixed point at --rate (`tuner.search.load_aware`) from the exact answer on the workload's traffic, one line
    per iteration; and its wall seconds."""
    import time

    from tuner.search.load_aware import load_aware_search

    assert workload.load is not None
    started = time.perf_counter()

    def said(it: LoadIteration) -> None:
        p99 = f"{it.tpot_p99_ms:.3f} ms" if it.tpot_p99_ms != float("inf") else "none finished"
        change = f"+{len(it.added)} -{len(it.removed)} widths" if it.index else "the expected-step answer"
        shape = model.engine.list_shape(it.capture_sizes, short=True)
        print(f"load {args.rate:g} req/s, iteration {it.index}: {shape} "
              f"(max {model.engine.tops_text(it.capture_sizes)}; "
              f"{change}), TPOT p99 {p99}"
              + (" (two operating points)" if it.points.cliff else ""), flush=True)

    found = load_aware_search(model, workload.load, rate_per_s=args.rate, max_iterations=args.load_iterations,
                              duration_s=args.load_duration, memory_buckets=args.memory_buckets,
                              exact_seconds=args.exact_seconds, tpot_slo_ms=args.tpot_slo, first=first,
                              progress=said)
    print(f"load: {found.why}; the list of iteration {found.chosen} is searched for", flush=True)
    return found, time.perf_counter() - started


def choose_compact(model: CostModel, result: SearchResult, args: argparse.Namespace,
                   seeds: Sequence[Sequence[int]] = ()) -> None:
    """Choose the search's compact list at --tolerance within --exact-work (kept on the result, recorded in
    search.json); `seeds`: an earlier run's answer, in the running."""
    from tuner.search.study import compact_of

    compact_of(model, result, getattr(args, "tolerance", None), memory_buckets=args.memory_buckets,
               work=getattr(args, "exact_work", DEFAULT_WORK), seconds=getattr(args, "exact_seconds", None),
               seeds=seeds)


def _decision_summary(dec: Decision, out: Path, model: CostModel, *, report: bool) -> None:
    """The compact list beside the tuned one, how sure the saving is (summary.json's interval, as written), and where
    the report is."""
    import json

    from tuner.report.decision import compact_proof, counted_name
    from tuner.report.text import GIB

    choice = dec.compact
    c, t = dec.table["compact"], dec.tuned
    what = counted_name(dec)
    proof = compact_proof(model, dec)
    head = f"compact list (least {what} within {choice.tolerance:.1%} of the fastest" + (f"; {proof}" if proof else "")
    if c.capture_sizes == t.capture_sizes:
        print(f"{head}): the tuned list itself")
    else:
        print(f"{head}): {model.engine.list_shape(c.capture_sizes)}, {what} "
              f"{dec.counted(c) / GIB:.3f} GiB vs {dec.counted(t) / GIB:.3f} "
              f"({choice.saved_share:.0%} less), expected step {c.expected_step_ms:.4f} ms "
              f"({c.expected_step_ms / t.expected_step_ms - 1:+.2%})"
              + ("; RECOMMENDED (see report.md)" if choice.recommended else ""))

    try:
        data = json.loads((out / "summary.json").read_text())
        lo, hi = data["saving_interval_ms"]
        level, point = data["saving_interval"]["level"], data["saving_interval"]["point_ms"]
    except (OSError, ValueError, KeyError, TypeError):
        lo = hi = None
    if lo is not None:
        print(f"saving vs the default: {point:+.4f} ms per step, "
              f"{level:.0%} bootstrap interval [{lo:+.4f}, {hi:+.4f}] ms"
              + (" (INCLUDES 0: the profile's timing spread cannot tell them apart)" if lo <= 0 <= hi else ""))
    if not report:
        print(f"report.md and plots: cgtune report {shlex.quote(str(out))}")


def _print_summary(dec: Decision, written: list[Path], out: Path, model: CostModel, *,
                   report: bool = True) -> None:
    """What a search chose, in a few lines, in the engine's words (`tuner.report.run.words_of`): the list, its latency
    and memory against the engine's default, the study, the files written, the engine's command line, the compact
    list, the saving's interval and (`report` False) the command that writes report.md."""
    from tuner.report.run import words_of
    from tuner.report.startup import startup_lines, synthetic_lines

    for line in [*synthetic_lines(model), *startup_lines(model, dec)]:  # first: a made-up profile, the start-up cost
        print(line)
    gap = dec.gap
    exact = "the exact optimum" if dec.exact.exact_memory else "the exact solver's list, not proven optimal"
    how = {"study": f"optuna study, {gap:+.2%} vs {exact}" if gap is not None else "optuna study",
           "exact": "exact solver; see the notes in summary.json", "default": model.engine.list_label("default"),
           "gpu-validated": "fastest measured on the GPU by --validate"}[dec.source]
    if model.engine.release_words:
        print(f"searched under the rules of {model.engine.release_words}; the files are for that release")
    for line in words_of(model.engine).console_lines(model, dec, how):
        print(line)
    n = dec.trials
    pruned = f", {n['pruned']} pruned (interrupted)" if n.get("pruned") else ""
    print(f"study {dec.study_name}: {n.get('total', 0)} trials ({n.get('feasible', 0)} feasible, "
          f"{n.get('infeasible', 0)} infeasible, {n.get('failed', 0)} failed{pruned}, {n.get('run_now', 0)} run now)")
    # Files in folders below DIR by their path (a workload's model config.json, say); plots/ by name only when drawn.
    names = sorted(str(p.relative_to(out)) for p in written if p.parent != out / "plots")
    print(f"wrote {out}/: {', '.join(names)}" + (" and plots/" if any(p.parent == out / "plots" for p in written)
                                                  else ""))
    from tuner.decision.record import alternative_name

    ship = dec.ship
    files = model.engine.files
    print(f"shipped: the {ship.name} list ({model.engine.list_shape(ship.evaluation.capture_sizes, short=True)}) in "
          f"{', '.join(files)}: "
          f"{ship.why}" + (f"; the {ship.other[0]} list's files: "
                           f"{', '.join(alternative_name(f, ship.other[0]) for f in files)}" if ship.other else ""))
    serve = model.engine.serve_line(out, model.workload.model.checkpoint)
    if serve:
        print(serve)
    if dec.load is not None:
        from tuner.report.load import load_console_lines

        for line in load_console_lines(model, dec.load, "compact" if dec.ship.name == "compact" else "tuned"):
            print(line)
    _decision_summary(dec, out, model, report=report)


class SearchCommand(Command):
    help = "search capture lists on a recorded profile; write compilation_config.json and vllm-serve.yaml"
    description = (
        "Fit the cost model from a profile (CSV + JSON from `cgtune profile`) and the workload's step-width\n"
        "distribution, then search explicit cudagraph_capture_sizes (above the 512/1024 ceiling too) that\n"
        "lower the expected step latency while the KV cache keeps what the workload requires. An optuna study\n"
        "(vLLM's default list is its first trial; KV feasibility is a constraint) runs next to an exact\n"
        "dynamic program; the study's best ships when within 1% of the exact optimum, else the exact answer.\n"
        "Beside it, the compact list: the least graph memory within --tolerance of the fastest.\n"
        "Needs no GPU. The study is named from the workload and profile hashes, so a rerun resumes it.\n"
        "Writes no report.md: `cgtune report DIR` renders it (and the plots) from DIR.\n\n"
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
