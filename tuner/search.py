"""Search capture lists under the cost model: an exact dynamic program as the yardstick and an optuna study
whose trials are capture lists, with KV feasibility declared as a constraint."""

from __future__ import annotations

import hashlib
import logging
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tuner.model import GIB, CostModel, Evaluation

if TYPE_CHECKING:  # optuna stays out of the import graph of anything that only needs the exact solver
    import optuna

__all__ = [
    "OBJECTIVES",
    "PLACEMENTS",
    "ExactResult",
    "SearchConfig",
    "SearchError",
    "SearchResult",
    "brute_force",
    "default_storage_url",
    "display_url",
    "exact_solve",
    "finished_trials",
    "list_from_params",
    "make_objective",
    "open_study",
    "profile_hash",
    "run_search",
    "study_name_for",
    "summarize_study",
]

log = logging.getLogger(__name__)

OBJECTIVES = ("latency", "pareto")
"""`latency`: minimise expected step latency within the KV budget; `pareto`: latency vs graph memory front."""

_INF = math.inf


class SearchError(ValueError):
    """The search cannot run (e.g. not even the empty list leaves the required KV cache); one line."""


# ---------------------------------------------------------------------------------------------- exact solver
@dataclass(frozen=True)
class ExactResult:
    """The exact solver's answer under the cost model."""

    best: Evaluation
    """Fastest list whose graph memory (in rounded-up units) fits the budget."""
    front: list[Evaluation]
    """Latency/graph-memory Pareto front within the budget, by increasing memory."""
    memory_unit_bytes: int
    """Memory was counted in units of this many bytes (exact when `exact_memory`, else rounded to the nearest
    unit and the answer re-checked in bytes)."""
    exact_memory: bool
    """True when the unit divides every memory figure, so the optimum is exact, not just feasible."""
    num_candidates: int
    """Candidate widths the program ran over."""


def _round_up(x: np.ndarray | int, q: int) -> Any:
    return -(-np.asarray(x) // q) * q


class _Prefix:
    """Prefix sums of step probability and probability x eager latency over sorted widths."""

    def __init__(self, widths: np.ndarray, probs: np.ndarray, eager: np.ndarray) -> None:
        order = np.argsort(widths, kind="stable")
        self.w = widths[order]
        self.p = np.concatenate([[0.0], np.cumsum(probs[order])])
        self.pe = np.concatenate([[0.0], np.cumsum((probs * eager)[order])])

    def mass(self, x: Any) -> Any:
        """Probability of steps of width <= x."""
        return self.p[np.searchsorted(self.w, x, side="right")]

    def eager(self, x: Any) -> Any:
        """Sum of p x eager latency of steps of width <= x."""
        return self.pe[np.searchsorted(self.w, x, side="right")]

    @property
    def eager_total(self) -> float:
        return float(self.pe[-1])


def exact_solve(model: CostModel, *, memory_buckets: int = 2048, candidates: Sequence[int] | None = None,
                front_points: int = 40) -> ExactResult:
    """Fastest capture list over `candidates` (default: the model's) whose graph memory fits the KV budget.

    A dynamic program over the sorted candidates: a list's latency splits into per-gap terms between
    consecutive members (steps padded up to the upper one), FULL decode graphs into q-wide windows (a window's
    graph is the rounded width of its lowest member), and the first-captured graph's standalone footprint is a
    term of the largest member alone. The top window is special in vLLM (its rounded graph may exceed the max and
    is then not captured), so states carry a flag for it. Memory is counted in units of `memory_unit_bytes`: exact
    when one unit divides every figure and the budget spans at most `memory_buckets` of them (then the answer is
    the optimum), else rounded to the nearest unit with the answer re-checked in bytes (re-solved under a lower
    budget on an overshoot, a rounded-up pass last), so the answer always fits.
    """
    cands = sorted({int(c) for c in (model.candidates if candidates is None else candidates)})
    budget_bytes = model.budget.graph_budget_bytes
    empty = model.evaluate(())
    if budget_bytes < 0:
        raise SearchError(
            f"no capture list fits, not even the empty one: KV cache {empty.kv_available_bytes / GIB:.2f} GiB without "
            f"graphs < required {model.budget.required_kv_bytes / GIB:.2f} GiB"
        )
    if model.cudagraph_mode == "NONE" or not cands:
        return ExactResult(empty, [empty], 1, True, 0)

    q, decode_limit = model.q, model.decode_limit
    sep = model.separate_decode
    has_mixed = model.mixed_mode != "NONE"
    widths, uniform, probs, eager = model.step_arrays()
    if sep:
        mixed_steps = _Prefix(widths[~uniform], probs[~uniform], eager[~uniform])
        decode_steps = _Prefix(widths[uniform], probs[uniform], eager[uniform])
    else:
        mixed_steps = _Prefix(widths, probs, eager)
        decode_steps = _Prefix(widths[:0], probs[:0], eager[:0])

    c = np.array(cands, dtype=np.int64)
    n = len(c)
    r = _round_up(c, q) if sep else c.copy()
    lat_mix = model.graph_latency_ms(c, model.mixed_mode) if has_mixed else np.zeros(n)
    lat_full_r = model.graph_latency_ms(r, "FULL") if sep else np.zeros(n)
    top_mode = model.mixed_mode if has_mixed else "FULL"
    d_mix = model.graph_bytes(model.mixed_mode, c)[1] if has_mixed else np.zeros(n)
    d_full = model.graph_bytes("FULL", r)[1] if sep else np.zeros(n)
    sa_top, de_top = model.graph_bytes(top_mode, c)
    extra = np.maximum(0.0, sa_top - de_top)

    # Memory in units: when one unit divides every figure (the gcd) and the budget spans few enough of them, the
    # program is exact. Otherwise figures are rounded to the nearest unit (errors cancel instead of adding up) and
    # the answer is checked in exact bytes; if it overshoots, the budget is lowered by the overshoot and re-solved.
    figures = np.concatenate([d_mix, d_full, extra]).astype(np.int64)
    gcd = int(np.gcd.reduce(figures[figures > 0])) if np.any(figures > 0) else 1
    everything = int(d_mix.sum() + d_full.sum() + extra.max())  # no list can need more than this
    span = max(1, min(budget_bytes, everything))
    exact_memory = span // gcd <= memory_buckets
    unit = gcd if exact_memory else -(-span // memory_buckets)

    def to_units(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.int64)
        return x // unit if exact_memory else np.rint(x / unit).astype(np.int64)

    u_mix, u_full, u_extra = to_units(d_mix), to_units(d_full), to_units(extra)
    max_units = int(u_mix.sum() + u_full.sum() + u_extra.max())
    log.debug("exact: unit %d, max_units %d, budget %d", unit, max_units, budget_bytes)

    def solve(B: int, u_mix: np.ndarray, u_full: np.ndarray, u_extra: np.ndarray,
              ) -> tuple[np.ndarray, Callable[[int], tuple[int, ...]]]:
        """Best total latency per memory level 0..B and a backtrack from a level to its list."""
        # Predecessor positions: index 0 is the empty start (width 0), index i+1 is candidate i.
        pos = np.concatenate([[0], c])
        r_pos = np.concatenate([[0], r])
        mass_mix_pos = mixed_steps.mass(pos)
        mass_dec_rpos = decode_steps.mass(r_pos)
        eager_dec_rpos = decode_steps.eager(r_pos)

        # value[s][k] = best latency sum (without the tail above the top) of chains ending at position k in state s
        # (0: ordinary, 1: top window without its FULL decode graph) using at most m memory units, per m.
        value = np.full((2, n + 1, B + 1), _INF)
        value[0, 0, :] = 0.0
        pred = np.full((2, n + 1, B + 1), -1, dtype=np.int32)  # predecessor position * 2 + state

        # One scratch block, reused: a fresh (positions x levels) temporary per relaxation costs page faults.
        scratch = np.empty((n + 1, B + 1))
        levels = np.arange(B + 1)

        def relax(target_state: int, j: int, lo: int, hi: int, from_state: int, cost: np.ndarray, units: int) -> None:
            """Chains ending at positions lo..hi-1 (a contiguous range: positions are sorted) extended by j."""
            if hi <= lo or units > B:
                return
            width = B + 1 - units
            block = scratch[: hi - lo, :width]
            np.add(value[from_state, lo:hi, :width], cost[lo:hi, None], out=block)
            arg = np.argmin(block, axis=0)
            best = block[arg, levels[:width]]
            cur = value[target_state, j, units:]
            better = best < cur
            cur[better] = best[better]
            pred[target_state, j, units:][better] = (lo + arg[better]) * 2 + from_state

        for j in range(n):
            k = j + 1  # position of candidate j
            mixcost = ((mixed_steps.mass(c[j]) - mass_mix_pos[:k]) * lat_mix[j]) if has_mixed else np.zeros(k)
            if not sep:
                relax(0, k, 0, k, 0, mixcost, int(u_mix[j]))
                continue
            # Positions are sorted, so those in j's window are a tail [first_same, k) and those whose window lies
            # beyond max_num_seqs requests a range [first_beyond, first_same).
            first_same = int(np.searchsorted(r_pos[:k], r[j], side="left"))
            first_beyond = min(first_same, int(np.searchsorted(r_pos[:k], decode_limit, side="right")))
            if r[j] <= decode_limit:
                relax(0, k, first_same, k, 0, mixcost, int(u_mix[j]))
                dec_normal = (decode_steps.mass(r[j]) - mass_dec_rpos[:k]) * lat_full_r[j]
                relax(0, k, 0, first_same, 0, mixcost + dec_normal, int(u_mix[j] + u_full[j]))
            below = r[j] - q
            if has_mixed:
                dec_pad = (decode_steps.mass(below) - mass_dec_rpos[:k]) * lat_mix[j]
            else:
                dec_pad = decode_steps.eager(below) - eager_dec_rpos[:k]
            dec_flag = dec_pad + (decode_steps.eager(r[j]) - decode_steps.eager(below))
            relax(1, k, first_same, k, 1, mixcost, int(u_mix[j]))
            relax(1, k, 0, first_same, 0, mixcost + dec_flag, int(u_mix[j]))
            relax(1, k, first_beyond, first_same, 1, mixcost + dec_flag, int(u_mix[j]))

        # Close: add the first-captured graph's extra footprint and the steps above the top (eager).
        if has_mixed:
            mix_eager_above = mixed_steps.eager_total - mixed_steps.eager(c)
        else:  # no mixed graphs (FULL_DECODE_ONLY): every mixed step runs eager
            mix_eager_above = np.full(n, mixed_steps.eager_total)
        totals = np.full(B + 1, empty.expected_step_ms)
        total_from = np.full(B + 1, -1, dtype=np.int64)  # position * 2 + state of the closing member
        for j in range(n):
            k = j + 1
            closes = []
            if not sep:
                closes.append((0, 0.0))
            else:
                if r[j] == c[j] and c[j] <= decode_limit:
                    closes.append((0, decode_steps.eager_total - decode_steps.eager(c[j])))
                if r[j] > c[j] or r[j] > decode_limit:
                    closes.append((1, decode_steps.eager_total - decode_steps.eager(r[j])))
            u = int(u_extra[j])
            if u > B:
                continue
            for state, tail in closes:
                cand = value[state, k, : B + 1 - u] + tail + mix_eager_above[j]
                cur = totals[u:]
                better = cand < cur - 1e-15
                cur[better] = cand[better]
                total_from[u:][better] = k * 2 + state

        def backtrack(m: int) -> tuple[int, ...]:
            code = int(total_from[m])
            if code < 0:
                return ()
            k, state = divmod(code, 2)
            m -= int(u_extra[k - 1])
            members = []
            while k > 0:
                members.append(int(c[k - 1]))
                code = int(pred[state, k, m])
                j = k - 1
                pk, pstate = divmod(code, 2)
                if not sep:
                    m -= int(u_mix[j])
                elif state == 0 and r_pos[pk] != r[j]:
                    m -= int(u_mix[j] + u_full[j])
                else:
                    m -= int(u_mix[j])
                k, state = pk, pstate
            return tuple(sorted(members))

        return totals, backtrack


    budget_limit = budget_bytes
    for attempt in range(5):
        if attempt == 4:
            # Last resort: every figure rounded up, which always fits (at the price of some optimality).
            def ceil_units(x: np.ndarray) -> np.ndarray:
                return -(-x.astype(np.int64) // unit)

            u_mix, u_full, u_extra = ceil_units(d_mix), ceil_units(d_full), ceil_units(extra)
            budget_limit = budget_bytes
        B = int(max(0, min(budget_limit // unit, max_units)))
        totals, backtrack = solve(B, u_mix, u_full, u_extra)
        best = model.evaluate(backtrack(B))
        if best.graph_memory_bytes <= budget_bytes:
            break
        budget_limit -= max(unit, best.graph_memory_bytes - budget_bytes)
    front: list[Evaluation] = []
    if B > 0:
        # The front: memory levels where the best latency drops; thinned to `front_points` evaluations.
        drops = [m for m in range(B + 1) if m == 0 or totals[m] < totals[m - 1] - 1e-12]
        if len(drops) > front_points:
            picks = np.unique(np.linspace(0, len(drops) - 1, front_points).round().astype(int))
            drops = [drops[i] for i in picks]
        seen: set[tuple[int, ...]] = set()
        for m in drops + [B]:
            sizes = backtrack(m)
            if sizes not in seen:
                seen.add(sizes)
                e = model.evaluate(sizes)
                if e.graph_memory_bytes <= budget_bytes:
                    front.append(e)
    front.append(best)
    if best.reason:  # cannot happen: oom widths are no candidates
        best = empty
    return ExactResult(best, _pareto(front), unit, bool(exact_memory), n)


def _pareto(evals: Sequence[Evaluation]) -> list[Evaluation]:
    """Non-dominated (expected_step_ms, graph_memory_bytes) points, by increasing memory."""
    out: list[Evaluation] = []
    for e in sorted(evals, key=lambda e: (e.graph_memory_bytes, e.expected_step_ms)):
        if not out or e.expected_step_ms < out[-1].expected_step_ms - 1e-12:
            out.append(e)
    return out


def brute_force(model: CostModel, candidates: Sequence[int] | None = None) -> Evaluation:
    """Every subset of the candidates (keep to <= 12 of them), for tests: the fastest feasible list."""
    cands = sorted(model.candidates if candidates is None else candidates)
    if len(cands) > 16:
        raise ValueError(f"brute_force over {len(cands)} candidates would take 2^{len(cands)} evaluations")
    best = model.evaluate(())
    if not best.feasible:
        raise SearchError("no capture list fits, not even the empty one")
    for size in range(1, len(cands) + 1):
        for subset in combinations(cands, size):
            e = model.evaluate(subset)
            if e.feasible and e.expected_step_ms < best.expected_step_ms - 1e-12:
                best = e
    return best


# ---------------------------------------------------------------------------------------------- optuna study
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

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready record of the lists and counts; `from_dict` re-evaluates the lists under a model."""
        def sizes(e: Evaluation | None) -> list[int] | None:
            return None if e is None else list(e.capture_sizes)

        return {
            "chosen": sizes(self.chosen), "source": self.source, "study_best": sizes(self.study_best),
            "default": sizes(self.default),
            "exact": {"best": sizes(self.exact.best), "front": [sizes(e) for e in self.exact.front],
                      "memory_unit_bytes": self.exact.memory_unit_bytes, "exact_memory": self.exact.exact_memory,
                      "num_candidates": self.exact.num_candidates},
            "study_name": self.study_name, "storage": self.storage, "objective": self.objective,
            "trials": dict(self.trials), "pareto": [sizes(e) for e in self.pareto], "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], model: CostModel) -> SearchResult:
        def ev(sizes: list[int] | None) -> Evaluation | None:
            return None if sizes is None else model.evaluate(sizes)

        ex = data["exact"]
        exact = ExactResult(model.evaluate(ex["best"]), [model.evaluate(s) for s in ex["front"]],
                            int(ex["memory_unit_bytes"]), bool(ex["exact_memory"]), int(ex["num_candidates"]))
        return cls(model.evaluate(data["chosen"]), data["source"], exact, ev(data["study_best"]),
                   model.evaluate(data["default"]), data["study_name"], data["storage"], data["objective"],
                   dict(data["trials"]), [model.evaluate(s) for s in data["pareto"]], list(data["notes"]))

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
    # v2: the trial parameters changed (placement); an older study's distributions would not load.
    return f"cgtune-{model.workload.name}-{model.workload.content_hash}-{ph}-{objective}-v2"


_SECRET_QUERY_KEYS = ("password", "passwd", "pwd", "sslpassword", "token", "secret")
"""Query parameters of a storage URL that hold secrets (libpq takes `?password=` as well as `user:password@`)."""


def display_url(url: str) -> str:
    """A storage URL fit for files and logs: any password, in the user part or the query, replaced by ***."""
    if not url or ("@" not in url and "?" not in url):
        return url
    try:
        from sqlalchemy.engine import make_url

        u = make_url(url)
        shown = u.render_as_string(hide_password=True)
        if any(k.lower() in _SECRET_QUERY_KEYS for k in u.query):
            base = u.set(query={}).render_as_string(hide_password=True)
            parts = [f"{k}={'***' if k.lower() in _SECRET_QUERY_KEYS else v}" for k, v in u.query.items()]
            shown = base + "?" + "&".join(parts)
        return shown
    except Exception:  # not an SQLAlchemy URL: keep only what follows the credentials, drop any query
        rest = url.rsplit("@", 1)[1] if "@" in url else url.split("://", 1)[-1]
        return "***@" + rest.split("?", 1)[0]


def default_storage_url(run_dir: str | Path) -> str:
    return f"sqlite:///{Path(run_dir).resolve() / 'study.db'}"


PLACEMENTS = ("quantile", "quantile+default", "value", "value+default")
"""How a trial places its members below the top: at quantiles (`spacing` mixes the step-width distribution with
plain width), or at the widths whose own steps gain most from a graph (`value`: histogram-like traffic, where a
few widths carry the mass); `+default` adds vLLM's default sizes at or below the top."""


def _exact_hit_value(model: CostModel, widths: np.ndarray, top_width: int) -> np.ndarray:
    """Per candidate width: probability x latency saving of the steps that would replay its graph unpadded."""
    step_w, uniform, probs, eager = model.step_arrays()
    size = int(max(step_w.max(), widths.max(), _round_up(widths.max(), model.q))) + 1
    decode_p = np.bincount(step_w[uniform], weights=probs[uniform], minlength=size)
    mixed_p = np.bincount(step_w[~uniform], weights=probs[~uniform], minlength=size)
    value = np.zeros(len(widths))
    if model.mixed_mode != "NONE":
        value += mixed_p[widths] * (model.eager_ms(widths) - model.graph_latency_ms(widths, model.mixed_mode))
    if model.separate_decode:
        r = _round_up(widths, model.q)
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
        budget = model.budget.graph_budget_bytes
        first = list_from_params(model, top, count, spacing, placement, candidates=candidates)
        if model.graph_memory_bytes(first) <= budget or count <= 1:
            return first
        lo, hi = 1, int(count) - 1  # largest fitting count in [lo, hi], memory growing with count
        best = None
        while lo <= hi:
            mid = (lo + hi) // 2
            sizes = list_from_params(model, top, mid, spacing, placement, candidates=candidates)
            if model.graph_memory_bytes(sizes) <= budget:
                best, lo = sizes, mid + 1
            else:
                hi = mid - 1
        if best is not None:
            return best
        # Not even the top alone fits: lower the top to the widest one that does, then fit the count again.
        lo, hi, fitting = 0, int(top) - 1, None
        while lo <= hi:
            mid = (lo + hi) // 2
            if model.graph_memory_bytes(list_from_params(model, mid, 1, spacing, placement,
                                                         candidates=candidates)) <= budget:
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
        windows = {int(_round_up(top_width, model.q))} if model.separate_decode else set()
        for x in ranked:
            if len(sizes) >= k:
                break
            window = int(_round_up(x, model.q)) if model.separate_decode else int(x)
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


def _seed_params(model: CostModel) -> list[dict[str, Any]]:
    """Trials to start from: per placement and per count (2, 4, 8, ... all), the widest top at or below the widest
    decode batch whose list still fits the budget. Plain heuristics, not the exact answer: they give the sampler a
    foothold where a tight budget leaves only a narrow band of good tops."""
    cands = model.candidates
    budget = model.budget.graph_budget_bytes
    widest = min(model.decode_limit, model.serving.max_num_batched_tokens)
    top_max = max(0, int(np.searchsorted(cands, widest, side="right")) - 1)
    counts = sorted({c for c in (2, 4, 8, 16, 32, 64, 128) if c < len(cands)} | {len(cands)})
    seeds = []
    for placement in PLACEMENTS:
        for count in counts:
            lo, hi, fitting = 0, top_max, None
            while lo <= hi:
                mid = (lo + hi) // 2
                if model.graph_memory_bytes(list_from_params(model, mid, count, 1.0, placement)) <= budget:
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


def _record(trial: optuna.Trial, e: Evaluation) -> None:
    # One user attribute per trial: each attribute is a storage round trip (a commit on SQLite).
    trial.set_user_attr("evaluation", {
        "capture_sizes": list(e.capture_sizes),
        "expected_step_ms": e.expected_step_ms,
        "graph_memory_bytes": e.graph_memory_bytes,
        "kv_available_bytes": e.kv_available_bytes,
        "infeasible_reason": e.why_infeasible,
    })
    # <= 0 is feasible: the KV shortfall in GiB, or a fixed penalty when a member cannot be captured at all.
    shortfall = -e.kv_margin_gib
    if e.reason:
        shortfall = max(shortfall, 0.0) + 1.0
    trial.set_constraint("kv_shortfall_gib", shortfall)


def _open_storage(url: str) -> Any:
    """An optuna storage for the URL; SQLite gets WAL and synchronous=NORMAL, since a commit per trial field with a
    full fsync each dominates the search time (a crash loses at most the last trials, and the study resumes)."""
    import optuna
    from sqlalchemy import event

    storage = optuna.storages.RDBStorage(url)
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
            _record(trial, e)
        except (ValueError, ArithmeticError) as exc:
            # optuna marks the trial failed and goes on (catch=...); keep the reason with the trial.
            trial.set_user_attr("fail_reason", f"{type(exc).__name__}: {exc}")
            raise
        if objective == "pareto":
            return e.expected_step_ms, e.graph_memory_bytes / GIB
        return e.expected_step_ms

    return latency


def open_study(model: CostModel, config: SearchConfig, *, run_dir: str | Path | None = None) -> tuple[Any, str]:
    """Create or load the study for (workload, profile, objective) in the configured storage, with vLLM's
    default list enqueued as its first trial when it is new; returns (study, storage URL or "" in memory).

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
    if not study.get_trials(deepcopy=False):
        # vLLM's default goes first, so the study's best is never worse than what vLLM does out of the box.
        study.enqueue_trial({}, user_attrs={"capture_sizes": list(model.default_sizes)})
        seeds = _seed_params(model)
        keep = max(4, config.n_trials // 5)  # leave most trials to the sampler
        if len(seeds) > keep:
            seeds = [seeds[i] for i in np.unique(np.linspace(0, len(seeds) - 1, keep).round().astype(int))]
        for params in seeds:
            study.enqueue_trial(params)
    return study, storage


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
        notes.append(f"the exact solver counted memory in {exact.memory_unit_bytes / (1 << 20):.2f} MiB units "
                     f"(rounded to the nearest, its answer re-checked in bytes): it fits, and is optimal up to "
                     f"that rounding")
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    feasible = [t for t in complete if all(v <= 0 for v in t.constraints.values())]
    failed = sum(t.state == optuna.trial.TrialState.FAIL for t in trials)
    pruned = sum(t.state == optuna.trial.TrialState.PRUNED for t in trials)
    trials_info = {"total": len(complete) + failed + pruned, "complete": len(complete), "feasible": len(feasible),
                   "infeasible": len(complete) - len(feasible), "failed": failed, "run_now": run_now,
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
    pareto = _pareto([reevaluate(t) for t in predicted]) if config.objective == "pareto" and predicted \
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
            notes.append(f"the study's best is {gap:.2%} slower than the exact optimum (tolerance "
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
    from tqdm.auto import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    config = config or SearchConfig()
    if config.objective not in OBJECTIVES:
        raise SearchError(f"objective={config.objective!r} must be one of {', '.join(OBJECTIVES)}")
    if config.n_trials < 1:
        raise SearchError(f"n_trials={config.n_trials} must be >= 1")
    if exact is None:  # raises SearchError (no list fits) before any file exists
        exact = exact_solve(model, memory_buckets=config.memory_buckets)
    if not model.candidates:
        default = model.evaluate(model.default_sizes)
        notes = list(model.notes) + [
            "no candidate widths (no graph rows with status ok, or cudagraph_mode NONE): nothing to search"]
        trials_info = {"total": 0, "complete": 0, "feasible": 0, "infeasible": 0, "failed": 0, "run_now": 0}
        return SearchResult(exact.best, "exact", exact, None, default,
                            config.study_name or study_name_for(model, config.objective), "none", config.objective,
                            trials_info, exact.front, notes)

    study, storage = open_study(model, config, run_dir=run_dir)
    done = finished_trials(study)
    remaining = max(0, config.n_trials - done)
    if done:
        log.info("resuming study %s: %d trials finished, %d to run", study.study_name, done, remaining)
    if remaining:
        objective = make_objective(model, config.objective)
        with logging_redirect_tqdm(), tqdm(total=remaining, desc="search", unit="trial",
                                           disable=not config.progress) as bar:
            study.optimize(objective, n_trials=remaining, catch=(ValueError, ArithmeticError),
                           callbacks=[lambda s, t: bar.update(1)])
    return summarize_study(model, study, exact, config, storage=storage, run_now=remaining)
