"""The exact solver: the fastest capture list within the KV budget under the cost model, by dynamic programming
over the sorted candidate widths; the yardstick every optuna study is held to."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import numpy as np

from tuner.model import GIB, CostModel, Evaluation

__all__ = ["ExactResult", "SearchError", "brute_force", "exact_solve", "pareto_front", "round_up"]

log = logging.getLogger(__name__)

_INF = math.inf


class SearchError(ValueError):
    """The search cannot run (e.g. not even the empty list leaves the required KV cache); one line."""


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


def round_up(x: np.ndarray | int, q: int) -> Any:
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
    r = round_up(c, q) if sep else c.copy()
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
    return ExactResult(best, pareto_front(front), unit, bool(exact_memory), n)


def pareto_front(evals: Sequence[Evaluation]) -> list[Evaluation]:
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
