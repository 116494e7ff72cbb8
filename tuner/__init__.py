"""cgtune: measure and tune an engine's CUDA-graph capture sizes for one GPU, model and workload.

The Python API (docs/api.md): the few entry points a notebook or another tool scripts with, the same calls the
`cgtune` commands make. Each imports its stage when called, so `import tuner` loads none of them (no torch, no
optuna): a planner that only wants the engine's default list pays for no search.

    import tuner
    workload = tuner.load_workload("workloads/dflash-llama-3.1-8b.yaml")
    model = tuner.cost_model(workload, "workloads/profiles/synthetic-dflash-llama-3.1-8b.csv")
    result = tuner.search_capture_lists(model, trials=100)
    tuner.write_run("runs/dflash", model, result)
    print(tuner.check_log("runs/dflash", "vllm-startup.log").as_dict())

Errors are the stages' own, each one line naming the field or file: WorkloadError, ModelError (a profile that does
not fit the workload), SearchError (no list fits), CheckError / LogError (a log of another run).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tuner.check.predictions import CheckResult
    from tuner.decision.record import Decision
    from tuner.model.costmodel import CostModel
    from tuner.profile.table import Profile
    from tuner.search.exact import ExactResult
    from tuner.search.study import SearchResult
    from tuner.workload.spec import Workload

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "check_log",
    "cost_model",
    "decide",
    "default_capture_sizes",
    "load_run",
    "load_workload",
    "read_profile",
    "search_capture_lists",
    "write_run",
]


def load_workload(path: str | Path) -> Workload:
    """The workload file at `path` read and validated (docs/workloads.md): its model, speculative decoding, serving
    settings in its engine's words and traffic. Raises WorkloadError naming the field."""
    from tuner.workload.spec import load_workload as load

    return load(path)


def default_capture_sizes(workload: Workload, *, gpu_memory_mib: float | None = None) -> tuple[int, ...]:
    """The capture list the workload's engine captures when it is given none (`cgtune defaults`), as the engine keeps
    a list (what `CostModel.evaluate` takes): token widths, or under vLLM 0.34 one key per size of its two lists (a
    prefill size in tokens, -n for the decode graphs of n requests). `workload.engine.graph_kinds(sizes)` gives its
    graphs by what they are at their token widths; `workload.engine.in_engine_unit(sizes)` SGLang's and
    TensorRT-LLM's request counts. `gpu_memory_mib`: the GPU's memory where the engine's default depends on it
    (SGLang); None: the workload's own setting."""
    return tuple(workload.engine.defaults(gpu_memory_mib=gpu_memory_mib).sizes)


def read_profile(csv_path: str | Path) -> Profile:
    """A measured profile (docs/profile.md: the CSV and the JSON beside it) read and validated; raises ProfileError
    naming the file, line and column."""
    from tuner.profile.table import read_profile as read

    return read(csv_path)


def cost_model(workload: Workload, profile_csv: str | Path, *, allow_mismatch: bool = False,
               allow_outliers: bool = False, off_peak_weight: float = 0.0, max_capture_s: float | None = 60.0,
               max_graphs: int | None = 1024) -> CostModel:
    """The cost model of the workload on the profile: any list's expected step latency, real graph pool, the
    engine's graph-memory estimate and the KV cache it leaves (`model.evaluate((1, 2, 4, 8))`). The flags are
    `cgtune search`'s --allow-mismatch, --allow-outliers, --off-peak-weight, and the start-up budget
    --max-capture-seconds and --max-graphs (a list over it is infeasible; None: no limit). Raises ModelError when the
    profile was measured for another setting (unless allowed)."""
    from tuner.model.costmodel import CostModel

    return CostModel.from_files(profile_csv, workload, allow_mismatch=allow_mismatch, allow_outliers=allow_outliers,
                                off_peak_weight=off_peak_weight, max_capture_s=max_capture_s, max_graphs=max_graphs)


def search_capture_lists(model: CostModel, *, trials: int = 300, seed: int = 0, objective: str = "latency",
                         storage: str | None = None, run_dir: str | Path | None = None,
                         tolerance: float | None = None, memory_buckets: int = 2048,
                         exact_work: int | None = 5_000_000, exact_seconds: float | None = None,
                         progress: bool = False, exact: ExactResult | None = None,
                         seeds: Sequence[Sequence[int]] = ()) -> SearchResult:
    """Search capture lists as `cgtune search` does: the exact solver first (the yardstick; SearchError when no
    list fits), then the optuna study of `trials` trials (in memory, or in `storage` / `run_dir`'s study.db, resumed
    when it exists), then the compact list within `tolerance` (None: 1%) of the fastest. `result.chosen` is the
    fastest list found, `result.compact` the compact choice. `exact_work`: the exact solver's budget in its steps
    (and the compact choice's), so the answer is the same on any machine; `exact_seconds`: a wall-clock limit besides
    (None: none). `exact`: the exact solver's answer when already solved (`cgtune search` solves first, so a budget no
    list meets fails before it writes anything). The model's start-up budget (`cost_model`'s max_capture_s and
    max_graphs) holds every list searched. `seeds`: lists the answer must be no worse than besides the report's rows
    (an earlier run's answer in the same directory: `tuner.decision.run_dir.earlier_answer`)."""
    from tuner.search.study import SearchConfig, compact_of, exact_solve, run_search

    if exact is None:
        exact = exact_solve(model, memory_buckets=memory_buckets, work=exact_work, seconds=exact_seconds,
                            incumbents=seeds)
    config = SearchConfig(n_trials=trials, storage=storage, objective=objective, seed=seed,
                          memory_buckets=memory_buckets, exact_work=exact_work, exact_seconds=exact_seconds,
                          progress=progress)
    result = run_search(model, config, run_dir=run_dir, exact=exact)
    compact_of(model, result, tolerance, memory_buckets=memory_buckets, work=exact_work, seconds=exact_seconds,
               seeds=seeds)
    return result


def decide(model: CostModel, result: SearchResult) -> Decision:
    """The decision record of a search (`tuner.decision.Decision`): every list compared under the model, the list
    shipped (`result.ship`) and why, what the tuned list changes per width against the default, off-peak figures,
    the bootstrap interval of the saving, the compact choice's and the exact solver's facts. `write_run` renders
    it; `cgtune search` prints from the same record."""
    from tuner.decision.record import decide as make

    return make(model, result)


def write_run(run_dir: str | Path, model: CostModel, outcome: SearchResult | Decision, *, command: str = "",
              report: bool = True) -> list[Path]:
    """Write the run directory (docs/commands.md): summary.json, search.json, the engine's deployment files,
    copies of the workload and profile, and (with `report`) report.md and plots/*.png; staged and moved in, so a
    failure leaves nothing half-written. `outcome`: a search (decided here, `decide`) or its decision record;
    `command`: the command line the report names. Returns the files written."""
    from tuner.decision.record import Decision, decide as make
    from tuner.report.run import write_run as write

    dec = outcome if isinstance(outcome, Decision) else make(model, outcome)
    return write(run_dir, model, dec, command=command, plots=report, report=report)


def load_run(run_dir: str | Path) -> tuple[CostModel, SearchResult]:
    """A run directory read back (`cgtune report` does this): the cost model rebuilt from its own copies of the
    workload and profile, and the search it recorded. Raises ModelError or WorkloadError naming the file."""
    from tuner.decision.run_dir import load_run as load

    return load(run_dir)


def check_log(run_dir: str | Path, log_path: str | Path, *, data: bytes | None = None) -> CheckResult:
    """Hold a run's predictions to vLLM's own start-up log (`cgtune check`): every figure vLLM logs about the list
    (its graph-memory estimate, KV cache, real pool, capture time) beside cgtune's, with the error and whether the
    stated tolerance covers it (`result.rows`, `result.as_dict()`). Raises CheckError or LogError (one line) when
    the log is of another list or configuration. `data`: the log's bytes when it is no file (`log_path` then only
    names it, as `cgtune check --vllm-log -` reads stdin)."""
    from tuner.check.predictions import check_run
    from tuner.engines.vllm.startup_log import parse_startup_log, read_log

    source, text = read_log(str(log_path), data)
    return check_run(Path(run_dir), parse_startup_log(text, source))
