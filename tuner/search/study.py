"""Search capture lists under the cost model: an optuna study whose trials are capture lists, with KV
feasibility declared as a constraint, held to the exact solver (`tuner.search.exact`), whose names it re-exports."""

from __future__ import annotations

import hashlib
import json
import logging
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tuner.search.compact import DEFAULT_TOLERANCE, CompactChoice, choose_compact
from tuner.search.exact import (DEFAULT_WORK, ExactResult, SearchError, brute_force, exact_solve, pareto_front,
                                round_up)
from tuner.model.costmodel import GIB, CostModel, Evaluation
from tuner.model.reference_lists import reference_lists
from tuner.search.storage_url import StorageError, display_url, engine_url, hide_secret
from tuner.search.study_buffer import StudyBuffer

if TYPE_CHECKING:  # optuna stays out of the import graph of anything that only needs the exact solver
    import optuna

    from tuner.search.load_aware import LoadSearch, RecordedLoadSearch

__all__ = [
    "OBJECTIVES",
    "PLACEMENTS",
    "ExactResult",
    "SearchConfig",
    "SearchError",
    "SearchInterrupted",
    "SearchResult",
    "brute_force",
    "compact_of",
    "default_storage_url",
    "enqueue_start",
    "exact_solve",
    "finished_trials",
    "list_from_params",
    "make_objective",
    "open_study",
    "profile_hash",
    "run_search",
    "seed_params",
    "study_name_for",
    "summarize_study",
]

log = logging.getLogger(__name__)

OBJECTIVES = ("latency", "pareto")
"""`latency`: minimise expected step latency within the KV budget; `pareto`: latency vs graph memory front."""


# ---------------------------------------------------------------------------------------------- optuna study
class SearchInterrupted(KeyboardInterrupt):
    """Ctrl-C during the study: what it kept, so the command can say so and how to resume."""

    def __init__(self, study_name: str, storage: str, finished: int | None, pruned: int = 0) -> None:
        super().__init__()
        self.study_name = study_name
        """The study (resumed by the same command)."""
        self.storage = storage
        """Its storage URL, password hidden ("in-memory": nothing kept)."""
        self.finished = finished
        """Trials that ran to an end in the study, the interrupted one not counted (None when unreadable)."""
        self.pruned = pruned
        """Trials optuna kept as pruned (the interrupted one, and any from earlier interrupts): they count toward the
        planned trials, so a rerun runs that many fewer."""


@dataclass(frozen=True)
class SearchConfig:
    """How to run the study."""

    n_trials: int = 300
    """Trials the study should hold when done; a resumed study runs only the missing ones."""
    storage: str | None = None
    """Optuna storage URL (any RDB URL); None: `sqlite:///RUN_DIR/study.db`, or in memory without a run dir."""
    objective: str = "latency"
    """One of OBJECTIVES."""
    seed: int = 0
    """Sampler seed."""
    tolerance: float = 0.01
    """The study's best must be within this share of the exact optimum, or the exact answer is used."""
    memory_buckets: int = 2048
    """Memory resolution of the exact solver (units across the graph budget)."""
    exact_work: int | None = DEFAULT_WORK
    """The exact solver's work budget, in its steps (and the compact choice's, shared by its solves): past it, the
    best list it found, with a proven bound on its gap (None: no limit). Work, not seconds: the same answer on a
    loaded machine as on a quiet one."""
    exact_seconds: float | None = None
    """A wall-clock limit besides (None: none); with one, the answer may depend on the machine's load."""
    study_name: str | None = None
    """Override the study name (default: from the workload and profile hashes)."""
    progress: bool = True
    """Show a tqdm progress bar."""
    constant_liar: bool = False
    """TPE's constant liar: count running trials as bad guesses so parallel workers sharing one study spread out;
    worth its extra storage reads only when several workers run at once."""


@dataclass
class SearchResult:
    """The outcome of a search."""

    chosen: Evaluation
    """The list to ship."""
    source: str
    """`study` (its best is within tolerance of exact), `exact` (it was not, so the exact answer is used), `default`
    (a guard) or `gpu-validated` (`cgtune tune --validate` measured another candidate faster)."""
    exact: ExactResult
    """The exact solver's answer and front."""
    study_best: Evaluation | None
    """Best feasible trial of the study (None if none was feasible)."""
    default: Evaluation
    """vLLM's default list under the same model."""
    study_name: str
    """Optuna study name (resumable)."""
    storage: str
    """Optuna storage URL, password hidden (it is written into files)."""
    objective: str
    """One of OBJECTIVES."""
    trials: dict[str, int] = field(default_factory=dict)
    """Trial counts: total, complete, feasible, infeasible, failed, run_now."""
    pareto: list[Evaluation] = field(default_factory=list)
    """Latency/graph-memory front of the study's feasible trials (objective pareto), else the exact front."""
    notes: list[str] = field(default_factory=list)
    """What was assumed or decided (printed in the report)."""
    compact: CompactChoice | None = None
    """The compact alternative to `chosen` (`tuner.search.compact`); None until chosen (`compact_of`)."""
    ship: str = "auto"
    """Which list the deployment files carry (`--ship`): `auto` (the compact list when the report recommends it, else
    the fastest), `fastest` or `compact` (`tuner.decision.record.Decision.ship`)."""
    timings: dict[str, float] = field(default_factory=dict)
    """Wall seconds of the search's stages as they ran: `exact_s` (the exact solver), `study_s` (the optuna study,
    its trials run now), `compact_s` (the compact choice's capped solves); search.json keeps them."""
    load_record: dict[str, Any] | None = None
    """The load-aware search's record (`--rate`: `tuner.search.load_aware.LoadSearch.as_dict`, kept in search.json);
    None for a search on the workload's traffic."""
    load_search: LoadSearch | RecordedLoadSearch | None = field(default=None, repr=False)
    """The load-aware search itself, while its process runs (not in search.json): the decision simulates its load."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready record of the lists and counts; `from_dict` re-evaluates the lists under a model."""
        def sizes(e: Evaluation | None) -> list[int] | None:
            return None if e is None else list(e.capture_sizes)

        return {
            "chosen": sizes(self.chosen), "source": self.source, "study_best": sizes(self.study_best),
            "default": sizes(self.default),
            "exact": {"best": sizes(self.exact.best), "front": [sizes(e) for e in self.exact.front],
                      "memory_unit_bytes": self.exact.memory_unit_bytes, "exact_memory": self.exact.exact_memory,
                      "num_candidates": self.exact.num_candidates, "resource": self.exact.resource,
                      "lower_bound_ms": self.exact.lower_bound_ms, "stopped_early": self.exact.stopped_early,
                      "passes": self.exact.passes, "level_solves": self.exact.level_solves,
                      "unproven": list(self.exact.unproven), "work": self.exact.work},
            "study_name": self.study_name, "storage": self.storage, "objective": self.objective,
            "trials": dict(self.trials), "pareto": [sizes(e) for e in self.pareto], "notes": list(self.notes),
            "compact": None if self.compact is None else self.compact.to_dict(), "ship": self.ship,
            "timings": dict(self.timings),
            **({"load": self.load_record} if self.load_record is not None else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], model: CostModel) -> SearchResult:
        def ev(sizes: list[int] | None) -> Evaluation | None:
            return None if sizes is None else model.evaluate(sizes)

        ex = data["exact"]
        # Runs written before the solver had a time budget carry no bound: none is claimed for them.
        exact = ExactResult(model.evaluate(ex["best"]), [model.evaluate(s) for s in ex["front"]],
                            int(ex["memory_unit_bytes"]), bool(ex["exact_memory"]), int(ex["num_candidates"]),
                            str(ex.get("resource", "estimate")), ex.get("lower_bound_ms"),
                            bool(ex.get("stopped_early", False)), passes=int(ex.get("passes", 1)),
                            level_solves=int(ex.get("level_solves", 0)), unproven=tuple(ex.get("unproven", ())),
                            work=int(ex.get("work", 0)))
        return cls(model.evaluate(data["chosen"]), data["source"], exact, ev(data["study_best"]),
                   model.evaluate(data["default"]), data["study_name"], data["storage"], data["objective"],
                   dict(data["trials"]), [model.evaluate(s) for s in data["pareto"]], list(data["notes"]),
                   CompactChoice.from_dict(data["compact"], model) if data.get("compact") else None,
                   # Runs written before --ship shipped the fastest list.
                   str(data.get("ship", "fastest")),
                   {str(k): float(v) for k, v in (data.get("timings") or {}).items()}, data.get("load"))

    @property
    def gap(self) -> float | None:
        """Study best over exact optimum, minus 1."""
        if self.study_best is None:
            return None
        return self.study_best.expected_step_ms / self.exact.best.expected_step_ms - 1.0


def profile_hash(profile_csv: str | Path) -> str:
    """12 hex digits over the profile CSV and its metadata JSON."""
    p = Path(profile_csv)
    h = hashlib.sha256(p.read_bytes())
    meta = p.with_suffix(".json")
    if meta.is_file():
        h.update(meta.read_bytes())
    return h.hexdigest()[:12]


def study_name_for(model: CostModel, objective: str) -> str:
    """Same workload, same profile, same objective -> same study, so a re-run resumes it."""
    profile = model.profile
    ph = profile_hash(profile.path) if profile.path else "unsaved"
    # v3: trials are scored under vLLM's memory rule (estimate and real capture); an off-peak mix is another objective.
    mix = f"-offpeak{model.off_peak_weight:g}" if model.off_peak_weight else ""
    if model.load_steps is not None:  # the load's simulated steps are another objective
        rows = json.dumps([list(r) for r in model.load_steps]).encode()
        mix += f"-load{hashlib.sha256(rows).hexdigest()[:8]}"
    return f"cgtune-{model.workload.name}-{model.workload.content_hash}-{ph}-{objective}{mix}-v3"


def default_storage_url(run_dir: str | Path) -> str:
    return f"sqlite:///{Path(run_dir).resolve() / 'study.db'}"


PLACEMENTS = ("quantile", "quantile+default", "value", "value+default")
"""How a trial places its members below the top: at quantiles (`spacing` mixes the step-width distribution with
plain width), or at the widths whose own steps gain most from a graph (`value`: histogram-like traffic, where a
few widths carry the mass); `+default` adds vLLM's default sizes at or below the top."""


def _exact_hit_value(model: CostModel, widths: np.ndarray, top_width: int) -> np.ndarray:
    """Per candidate width: probability x latency saving of the steps that would replay its graph unpadded."""
    step_w, uniform, probs, eager = model.step_arrays()
    size = int(max(step_w.max(), widths.max(), round_up(widths.max(), model.q))) + 1
    decode_p = np.bincount(step_w[uniform], weights=probs[uniform], minlength=size)
    mixed_p = np.bincount(step_w[~uniform], weights=probs[~uniform], minlength=size)
    value = np.zeros(len(widths))
    if model.mixed_mode != "NONE":
        value += mixed_p[widths] * (model.eager_ms(widths) - model.graph_latency_ms(widths, model.mixed_mode))
    if model.separate_decode:
        r = round_up(widths, model.q)
        ok = r <= min(top_width, model.decode_limit)
        gain = decode_p[r] * (model.eager_ms(r) - model.graph_latency_ms(r, "FULL"))
        value += np.where(ok, gain, 0.0)
    elif model.decode_mode != "NONE":
        value += decode_p[widths] * (model.eager_ms(widths) - model.graph_latency_ms(widths, model.decode_mode))
    return value


def list_from_params(model: CostModel, top: int, count: int, spacing: float, placement: str | bool = "quantile",
                     *, candidates: Sequence[int] | None = None, fit_budget: bool = False) -> tuple[int, ...]:
    """A capture list from the study's parameters.

    `top` indexes the candidates (the largest member); `count` members are placed as `placement` says (one of
    PLACEMENTS; True/False mean quantile with/without the default): at quantiles of a mix of the workload's
    step-width distribution (weight `spacing`) and of plain width (weight 1 - spacing), each snapped up to a
    candidate, or at the `count` candidates whose own steps gain most. With `fit_budget`, `count` is an upper
    bound: the largest count whose list fits the graph budget is used (the optimum usually sits on the budget's
    edge, which a sampler rarely hits by chance); a list that cannot fit even with one member is returned as is,
    and its trial is recorded infeasible.
    """
    if isinstance(placement, bool):
        placement = "quantile+default" if placement else "quantile"
    if placement not in PLACEMENTS:
        raise ValueError(f"placement={placement!r} must be one of {', '.join(PLACEMENTS)}")
    if fit_budget:
        fits = model.fits
        first = list_from_params(model, top, count, spacing, placement, candidates=candidates)
        if fits(first) or count <= 1:
            return first
        lo, hi = 1, int(count) - 1  # largest fitting count in [lo, hi], memory growing with count
        best = None
        while lo <= hi:
            mid = (lo + hi) // 2
            sizes = list_from_params(model, top, mid, spacing, placement, candidates=candidates)
            if fits(sizes):
                best, lo = sizes, mid + 1
            else:
                hi = mid - 1
        if best is not None:
            return best
        # Not even the top alone fits: lower the top to the widest one that does, then fit the count again.
        lo, hi, fitting = 0, int(top) - 1, None
        while lo <= hi:
            mid = (lo + hi) // 2
            if fits(list_from_params(model, mid, 1, spacing, placement, candidates=candidates)):
                fitting, lo = mid, mid + 1
            else:
                hi = mid - 1
        if fitting is None:
            return list_from_params(model, top, 1, spacing, placement, candidates=candidates)
        return list_from_params(model, fitting, count, spacing, placement, candidates=candidates, fit_budget=True)
    cands = np.array(sorted(model.candidates if candidates is None else candidates), dtype=np.int64)
    top_width = int(cands[min(max(top, 0), len(cands) - 1)])
    below = cands[cands <= top_width]
    k = max(1, min(int(count), len(below)))
    if placement.startswith("value"):
        value = _exact_hit_value(model, below, top_width)
        ranked = below[np.lexsort((below, -value))]  # most valuable first, smaller width on ties
        sizes = {top_width}
        # Widths rounding to one FULL decode graph share its value: keep the first (smallest) of each window.
        windows = {int(round_up(top_width, model.q))} if model.separate_decode else set()
        for x in ranked:
            if len(sizes) >= k:
                break
            window = int(round_up(x, model.q)) if model.separate_decode else int(x)
            if window not in windows:
                windows.add(window)
                sizes.add(int(x))
    else:
        sizes = _quantile_sizes(model, below, top_width, k, spacing)
    if placement.endswith("+default"):
        sizes |= {s for s in model.default_sizes if s <= top_width}
    return tuple(sorted(sizes))


def _quantile_sizes(model: CostModel, below: np.ndarray, top_width: int, k: int, spacing: float) -> set[int]:
    widths, _, probs, _ = model.step_arrays()
    order = np.argsort(widths, kind="stable")
    cum = np.concatenate([[0.0], np.cumsum(probs[order])])
    mass_at = cum[np.searchsorted(widths[order], below, side="right")]
    total = mass_at[-1] if mass_at[-1] > 0 else 1.0
    cdf = spacing * (mass_at / total) + (1.0 - spacing) * (below / top_width)
    targets = np.arange(1, k + 1) / k
    idx = np.minimum(np.searchsorted(cdf, targets - 1e-12, side="left"), len(below) - 1)
    return {int(x) for x in below[idx]} | {top_width}


def seed_params(model: CostModel) -> list[dict[str, Any]]:
    """Trials to start from: per placement and per count (2, 4, 8, ... all), the widest top at or below the widest
    decode batch whose list still fits the budget. Plain heuristics, not the exact answer: they give the sampler a
    foothold where a tight budget leaves only a narrow band of good tops."""
    cands = model.candidates
    widest = min(model.decode_limit, model.serving.max_num_batched_tokens)
    top_max = max(0, int(np.searchsorted(cands, widest, side="right")) - 1)
    counts = sorted({c for c in (2, 4, 8, 16, 32, 64, 128) if c < len(cands)} | {len(cands)})
    seeds = []
    for placement in PLACEMENTS:
        for count in counts:
            lo, hi, fitting = 0, top_max, None
            while lo <= hi:
                mid = (lo + hi) // 2
                if model.fits(list_from_params(model, mid, count, 1.0, placement)):
                    fitting, lo = mid, mid + 1
                else:
                    hi = mid - 1
            if fitting is not None:
                seeds.append({"top": fitting, "count": count, "spacing": 1.0, "placement": placement})
    return seeds


def _trial_list(trial: optuna.Trial, model: CostModel) -> tuple[int, ...]:
    fixed = trial.user_attrs.get("capture_sizes")
    if fixed is not None:
        return tuple(int(s) for s in fixed)
    n = len(model.candidates)
    top = trial.suggest_int("top", 0, n - 1)
    count = trial.suggest_int("count", 1, n, log=True)
    spacing = trial.suggest_float("spacing", 0.0, 1.0)
    placement = trial.suggest_categorical("placement", list(PLACEMENTS))
    return list_from_params(model, top, count, spacing, placement, fit_budget=True)


def _record(trial: optuna.Trial, e: Evaluation, shape: str) -> None:
    # One user attribute per trial: each attribute is a storage round trip (a commit on SQLite).
    trial.set_user_attr("evaluation", {
        "capture_sizes": list(e.capture_sizes),
        "shape": shape,  # the list in the engine's words (`cgtune status` reads no workload)
        "runs_as": list(e.runs_as),
        "expected_step_ms": e.expected_step_ms,
        "graph_memory_bytes": e.graph_memory_bytes,
        "vllm_graph_estimate_bytes": e.graph_estimate_bytes,
        "kv_available_bytes": e.kv_available_bytes,
        "capture_headroom_bytes": e.capture_headroom_bytes,
        "infeasible_reason": e.why_infeasible,
    })
    # <= 0 is feasible: the larger of vLLM's KV shortfall (its estimate leaves too little KV cache) and the real
    # capture's overrun, in GiB, or a fixed penalty when a member cannot be captured at all.
    shortfall = max(-e.kv_margin_gib, -e.capture_headroom_bytes / GIB)
    if e.reason:
        shortfall = max(shortfall, 0.0) + 1.0
    trial.set_constraint("kv_shortfall_gib", shortfall)
    if e.over_startup:  # a list over the start-up budget is infeasible whatever its memory (recorded only then)
        trial.set_constraint("over_startup_budget", 1.0)


def _open_storage(url: str) -> Any:
    """An optuna storage for the URL; SQLite gets WAL and synchronous=NORMAL, since a commit per trial field with a
    full fsync each dominates the search time (a crash loses at most the last trials, and the study resumes)."""
    import optuna
    from sqlalchemy import event

    opened = engine_url(url)  # a missing driver: StorageError, one line
    try:
        storage = optuna.storages.RDBStorage(opened)
    except Exception as exc:  # a server that refuses, a bad URL: one line, and a driver's error may quote the URL
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StorageError(hide_secret(f"cannot open storage {display_url(url)}: {first}", url)) from None
    if url.startswith("sqlite"):
        def pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

        event.listen(storage.engine, "connect", pragmas)
        storage.engine.dispose()
    return storage


def make_objective(model: CostModel, objective: str) -> Callable[[optuna.Trial], Any]:
    """The study's objective: a capture list from the trial's parameters (or its fixed `capture_sizes`), its
    evaluation recorded on the trial, the KV shortfall declared as a constraint; returns the latency (and the
    graph memory in GiB for `pareto`). ValueError/ArithmeticError are recorded as `fail_reason` and re-raised."""
    def latency(trial: optuna.Trial) -> Any:
        try:
            e = model.evaluate(_trial_list(trial, model))
            _record(trial, e, model.engine.list_shape(e.capture_sizes))
        except (ValueError, ArithmeticError) as exc:
            # optuna marks the trial failed and goes on (catch=...); keep the reason with the trial.
            trial.set_user_attr("fail_reason", f"{type(exc).__name__}: {exc}")
            raise
        if objective == "pareto":
            return e.expected_step_ms, e.graph_memory_bytes / GIB
        return e.expected_step_ms

    return latency


def open_study(model: CostModel, config: SearchConfig, *, run_dir: str | Path | None = None,
               enqueue: bool = True) -> tuple[Any, str]:
    """Create or load the study for (workload, profile, objective) in the configured storage, with vLLM's
    default list enqueued as its first trial when it is new (`enqueue_start`; not with `enqueue=False`); returns
    (study, storage URL or "" in memory).

    A worker sharing a study (e.g. over PostgreSQL) calls this with the same config and then
    `study.optimize(make_objective(model, config.objective), ...)`."""
    import optuna

    storage = config.storage or (default_storage_url(run_dir) if run_dir is not None else "")
    if not config.storage and run_dir is not None:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
    name = config.study_name or study_name_for(model, config.objective)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # group=True: the enqueued default trial has no parameters, which would otherwise leave multivariate TPE
    # with an empty joint search space.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sampler = optuna.samplers.TPESampler(seed=config.seed, n_startup_trials=20, multivariate=True, group=True,
                                             constant_liar=config.constant_liar)
    kwargs: dict[str, Any] = {"direction": "minimize"} if config.objective == "latency" else {
        "directions": ["minimize", "minimize"]}
    study = optuna.create_study(storage=_open_storage(storage) if storage else None, study_name=name,
                                sampler=sampler, load_if_exists=True, **kwargs)
    if enqueue:
        enqueue_start(study, model, config)
    return study, storage


def enqueue_start(study: Any, model: CostModel, config: SearchConfig) -> None:
    """A new study's first trials: vLLM's default, so the study's best is never worse than what vLLM does out of the
    box, then seed lists (`seed_params`), a fifth of the trials at most; nothing for a study that has trials."""
    if study.get_trials(deepcopy=False):
        return
    study.enqueue_trial({}, user_attrs={"capture_sizes": list(model.default_sizes)})
    seeds = seed_params(model)
    keep = max(4, config.n_trials // 5)  # leave most trials to the sampler
    if len(seeds) > keep:
        seeds = [seeds[i] for i in np.unique(np.linspace(0, len(seeds) - 1, keep).round().astype(int))]
    for params in seeds:
        study.enqueue_trial(params)


def finished_trials(study: Any) -> int:
    """Trials that ran to an end (complete, failed or pruned): what `n_trials` counts toward."""
    import optuna

    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL, optuna.trial.TrialState.PRUNED)
    return sum(t.state in states for t in study.get_trials(deepcopy=False))


def summarize_study(model: CostModel, study: Any, exact: ExactResult, config: SearchConfig, *,
                    storage: str = "", run_now: int = 0) -> SearchResult:
    """Pick the list to ship from a study's trials and the exact answer (see SearchResult.source)."""
    import optuna

    default = model.evaluate(model.default_sizes)
    notes = list(model.notes)
    if not exact.exact_memory:
        notes.append(exact.caveat())
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    feasible = [t for t in complete if all(v <= 0 for v in t.constraints.values())]
    failed = sum(t.state == optuna.trial.TrialState.FAIL for t in trials)
    pruned = sum(t.state == optuna.trial.TrialState.PRUNED for t in trials)
    trials_info = {"total": len(complete) + failed + pruned, "complete": len(complete), "feasible": len(feasible),
                   "infeasible": len(complete) - len(feasible), "failed": failed, "pruned": pruned, "run_now": run_now,
                   "waiting": sum(t.state == optuna.trial.TrialState.WAITING for t in trials)}

    def reevaluate(t: Any) -> Evaluation:
        return model.evaluate(t.user_attrs["evaluation"]["capture_sizes"])

    # A `cgtune tune --validate` trial's value is a measured latency, not the model's prediction: it cannot be
    # ranked against the model's trials, so it never becomes the study's best (validate_candidates chooses by it).
    predicted = [t for t in feasible if t.user_attrs.get("source") != "gpu-validation"]
    study_best = None
    if predicted:
        key = (lambda t: t.value) if config.objective == "latency" else (lambda t: t.values[0])
        study_best = reevaluate(min(predicted, key=key))
    pareto = pareto_front([reevaluate(t) for t in predicted]) if config.objective == "pareto" and predicted \
        else exact.front

    ex = exact.best
    dominated = study_best is not None and (
        ex.expected_step_ms <= study_best.expected_step_ms and ex.graph_memory_bytes <= study_best.graph_memory_bytes
        and (ex.expected_step_ms, ex.graph_memory_bytes)
        != (study_best.expected_step_ms, study_best.graph_memory_bytes))
    if study_best is not None and dominated:
        chosen, source = ex, "exact"
        notes.append("the exact solver's list is at least as fast with no more graph memory than the study's best: "
                     "the exact solver's answer is used")
    elif study_best is not None and study_best.expected_step_ms <= ex.expected_step_ms * (1 + config.tolerance):
        chosen, source = study_best, "study"
    else:
        chosen, source = ex, "exact"
        if study_best is None:
            notes.append("no study trial was feasible: the exact solver's answer is used")
        else:
            gap = study_best.expected_step_ms / ex.expected_step_ms - 1
            what = "the exact optimum" if exact.exact_memory else "the exact solver's list"
            notes.append(f"the study's best is {gap:.2%} slower than {what} (tolerance "
                         f"{config.tolerance:.0%}): the exact solver's answer is used")
    if default.feasible and chosen.expected_step_ms > default.expected_step_ms:
        # Cannot happen when the default trial ran; kept as a guard for studies resumed under an older model.
        chosen, source = default, "default"
    return SearchResult(chosen, source, exact, study_best, default, study.study_name,
                        display_url(storage) or "in-memory", config.objective, trials_info, pareto, notes)


def run_search(model: CostModel, config: SearchConfig | None = None, *,
               run_dir: str | Path | None = None, exact: ExactResult | None = None) -> SearchResult:
    """Solve exactly (unless `exact` is given), run (or resume) the study up to `config.n_trials` finished
    trials, and pick the list."""
    config = config or SearchConfig()
    if config.objective not in OBJECTIVES:
        raise SearchError(f"objective={config.objective!r} must be one of {', '.join(OBJECTIVES)}")
    if config.n_trials < 1:
        raise SearchError(f"n_trials={config.n_trials} must be >= 1")
    if exact is None:  # raises SearchError (no list fits) before any file exists
        exact = exact_solve(model, memory_buckets=config.memory_buckets, work=config.exact_work,
                            seconds=config.exact_seconds)
    started = time.perf_counter()
    if not model.candidates:
        default = model.evaluate(model.default_sizes)
        notes = list(model.notes) + [
            "no candidate widths (no graph rows with status ok, or cudagraph_mode NONE): nothing to search"]
        trials_info = {"total": 0, "complete": 0, "feasible": 0, "infeasible": 0, "failed": 0, "run_now": 0}
        return SearchResult(exact.best, "exact", exact, None, default,
                            config.study_name or study_name_for(model, config.objective), "none", config.objective,
                            trials_info, exact.front, notes, timings={"exact_s": exact.seconds, "study_s": 0.0})

    study, storage = open_study(model, config, run_dir=run_dir, enqueue=False)
    # On SQLite (a local file, this process its writer) the trials run in memory and reach the file in batches.
    buffer = StudyBuffer.of(study) if storage.startswith("sqlite") else None
    runs = buffer.memory if buffer is not None else study
    enqueue_start(runs, model, config)
    done = finished_trials(study)
    remaining = max(0, config.n_trials - done)
    if done:
        log.info("resuming study %s: %d trials finished, %d to run", study.study_name, done, remaining)
    try:
        if remaining and _optimize(runs, buffer, model, config, remaining):
            raise SearchInterrupted(study.study_name, display_url(storage) or "in-memory", *_count_finished(study))
        result = summarize_study(model, study, exact, config, storage=storage, run_now=remaining)
        result.timings.update(exact_s=exact.seconds, study_s=time.perf_counter() - started)
        return result
    finally:
        _release(study)


def _optimize(runs: Any, buffer: StudyBuffer | None, model: CostModel, config: SearchConfig, remaining: int) -> bool:
    """Run `remaining` trials of `runs` (the stored study, or the buffer's in-memory twin, whose trials all reach the
    file before this returns); True when Ctrl-C ended it."""
    from tqdm.contrib.logging import logging_redirect_tqdm

    from tuner.progress import progress_bar

    objective = make_objective(model, config.objective)
    interrupted = False

    def quiet_on_interrupt(trial: optuna.Trial) -> Any:
        # optuna fails a trial whose objective raises KeyboardInterrupt and logs it with a traceback; pruning
        # it and stopping the study ends optimize quietly, and the interruption is re-raised by the caller.
        nonlocal interrupted
        try:
            return objective(trial)
        except KeyboardInterrupt:
            import optuna

            interrupted = True
            trial.study.stop()
            raise optuna.TrialPruned("interrupted") from None

    try:
        with logging_redirect_tqdm(), progress_bar(remaining, "search", "trial", enabled=config.progress) as bar:
            runs.optimize(quiet_on_interrupt, n_trials=remaining, catch=(ValueError, ArithmeticError),
                          callbacks=[lambda s, t: bar.update(1), *([buffer.callback] if buffer else [])])
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if buffer is not None:
            buffer.flush(final=True)
    return interrupted


def _release(study: Any) -> None:
    """Close the study's database connections now: SQLite then folds its write-ahead log into study.db and removes
    study.db-wal and -shm, at a known moment rather than whenever the garbage collector reaches the engine (a
    command that follows, or a test comparing the run directory before and after, sees a settled file)."""
    storage = getattr(study, "_storage", None)
    engine = getattr(getattr(storage, "_backend", storage), "engine", None)
    if engine is not None:
        engine.dispose()


def _count_finished(study: Any) -> tuple[int | None, int]:
    """(trials that ran to an end before the interrupt: complete or failed, trials kept as pruned: the interrupted one
    and any earlier interrupt's)."""
    import optuna

    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL)
    try:
        trials = study.get_trials(deepcopy=False)
    except Exception:  # the storage may be mid-transaction after an interrupt: say less rather than fail
        return None, 0
    return (sum(t.state in states for t in trials),
            sum(t.state == optuna.trial.TrialState.PRUNED for t in trials))


def compact_of(model: CostModel, search: SearchResult, tolerance: float | None = None, *,
               memory_buckets: int = 2048, work: int | None = DEFAULT_WORK,
               seconds: float | None = None, seeds: Sequence[Sequence[int]] = ()) -> CompactChoice:
    """The search's compact choice at `tolerance` (None: the one it holds, else DEFAULT_TOLERANCE): the one it holds
    when chosen at that tolerance, else chosen now against the search's own fitting lists (and `seeds`: an earlier
    run's answer, `tuner.decision.run_dir.earlier_answer`) within `work` steps (and `seconds`, where given) and kept
    on it (search.json records it, so a re-render does not solve again)."""
    held = search.compact
    if held is None or (tolerance is not None and held.tolerance != tolerance):
        # The report's own rows are in the running: no row of it can beat the compact list on both counts.
        allowed = set(model.candidates)  # an earlier run's list, on another profile, may name widths this one lacks
        known = [e for e in (search.chosen, search.study_best, search.exact.best) if e is not None] + [
            model.evaluate(sizes) for sizes in [*reference_lists(model).values(),
                                                *(tuple(w for w in s if w in allowed) for s in seeds)]]
        started = time.perf_counter()
        search.compact = choose_compact(model, DEFAULT_TOLERANCE if tolerance is None else tolerance, known=known,
                                        memory_buckets=memory_buckets, work=work, seconds=seconds,
                                        fastest=search.exact)
        search.timings["compact_s"] = time.perf_counter() - started
    return search.compact
