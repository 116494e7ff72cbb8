"""How sure the decision is and what it could cost less: the compact alternative to the tuned list, the bootstrap
interval of what the tuned list saves, the list shipped and each list's capture time, as summary.json fields and
the report's lines, read from the decision record (rendered for every engine alike: they ask the cost model, not
the engine's name)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tuner.decision.record import STUDY_TOLERANCE, alternative_name
from tuner.model.capture_time import predicted_capture_s
from tuner.report.text import mem_text

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from tuner.decision.record import Decision
    from tuner.model.costmodel import CostModel, Evaluation

__all__ = ["capture_cell", "capture_s", "compact_proof", "counted_name", "decision_lines", "idle_graph_lines",
           "no_graphs_lines", "ship_reason", "shipped_line", "summary_fields"]


def counted_name(dec: Decision) -> str:
    """What the compact choice and the solver count (`Decision.memory_axis`), in the report's words."""
    return "vLLM estimate" if dec.memory_axis == "estimate" else "real pool"


def compact_proof(model: CostModel, dec: Decision) -> str:
    """What is proven of the compact choice, in a clause ("" when it is what brute force would give)."""
    choice = dec.compact
    if choice.proven:
        return ""
    counted = dec.counted(dec.table["compact"])
    parts = []
    if choice.floor_bytes >= counted:
        parts.append("proven the least memory within the tolerance")
    elif choice.floor_bytes > 0:
        parts.append(f"not proven the least: proven, no list within the tolerance counts less than "
                     f"{mem_text(model, choice.floor_bytes)} ({1 - choice.floor_bytes / counted:.1%} below it)")
    else:
        parts.append("not proven the least: the exact solver proved no floor below it")
    if not choice.fastest_proven:
        parts.append("the fastest list is the best found, not proven optimal (see Search)")
    if choice.stopped_early:
        parts.append(f"its budget ran out ({choice.work:,} steps of `--exact-work` spent, or `--exact-seconds`)")
    return "; ".join(parts)


def capture_s(model: CostModel, e: Evaluation) -> float | None:
    """Seconds the engine takes to capture the list's graphs (`tuner.model.capture_time`; None when the profile records
    no capture time)."""
    return predicted_capture_s(model, e.runs_as)


def capture_cell(model: CostModel, e: Evaluation) -> str:
    """A list's predicted capture time for a table cell ("?" when the profile records none)."""
    s = capture_s(model, e)
    return "?" if s is None else f"{s:.1f}"


def summary_fields(model: CostModel, dec: Decision) -> dict[str, Any]:
    """summary.json: the `tolerance` and the compact choice's facts, the saving's interval `saving_interval_ms` with
    how it was drawn, and the expected step with no graphs at all (the drafter's passes included)."""
    choice, interval = dec.compact, dec.interval
    return {
        "tolerance": choice.tolerance,
        "compact_choice": {"memory_counted": "vllm_graph_estimate_bytes" if dec.memory_axis == "estimate"
                           else "graph_memory_bytes", "fastest_ms": choice.fastest_ms, "limit_ms": choice.limit_ms,
                           "saved_share": choice.saved_share, "recommended": choice.recommended,
                           "proven": choice.proven, "floor_bytes": choice.floor_bytes,
                           "fastest_proven": choice.fastest_proven, "stopped_early": choice.stopped_early,
                           "solves": choice.solves, "work": choice.work},
        "saving_interval_ms": [interval.low_ms, interval.high_ms],
        "saving_interval": interval.as_dict(),
        "no_graphs_step_ms": dec.no_graphs.expected_step_ms,
        "shipped": shipped_fields(model, dec),
    }


def shipped_fields(model: CostModel, dec: Decision) -> dict[str, Any]:
    """summary.json's `shipped`: the list the deployment files carry, why, the policy, and where the other list's
    files are."""
    ship = dec.ship
    files = model.engine.files
    return {"list": ship.name, "capture_sizes": list(ship.evaluation.capture_sizes), "policy": dec.ship_policy,
            "why": ship.why, "files": list(files),
            "other": None if ship.other is None else {
                "list": ship.other[0], "capture_sizes": list(ship.other[1].capture_sizes),
                "files": [alternative_name(f, ship.other[0]) for f in files]}}


def _seconds(s: float | None) -> str:
    return "? s (no capture_s in the profile)" if s is None else f"{s:.1f} s"


def decision_lines(model: CostModel, dec: Decision) -> list[str]:
    """The report's lines after the decision: how sure the saving is, the compact list beside the tuned one, and any
    graph of either that no step replays."""
    return ["", *_interval_lines(model, dec), "", *_compact_lines(model, dec), *idle_graph_lines(model, dec)]


def idle_graph_lines(model: CostModel, dec: Decision) -> list[str]:
    """A paragraph per list compared (tuned, compact) that holds sizes which save nothing on the workload (a lone small
    prefill graph kept at a tie, say): dropping any one of them leaves the expected step as it is (to 1e-12), the
    drafter's passes included; which, and what they cost."""
    lines: list[str] = []
    seen: set[tuple[int, ...]] = set()
    for name in ("tuned", "compact"):
        e = dec.table[name]
        if e.capture_sizes in seen or len(e.capture_sizes) > 512:  # a list that long is nobody's to read
            continue
        seen.add(e.capture_sizes)
        same = e.expected_step_ms + 1e-12 * max(1.0, e.expected_step_ms)
        idle = [k for k in e.capture_sizes
                if model.evaluate(tuple(x for x in e.capture_sizes if x != k)).expected_step_ms <= same]
        if not idle:
            continue
        cost = e.graph_memory_bytes - model.evaluate(tuple(k for k in e.capture_sizes if k not in idle)
                                                     ).graph_memory_bytes
        lines += ["", f"The {name} list holds sizes that save nothing on this workload's traffic: "
                      f"{model.engine.list_text(idle, 12)}. No step (the drafter's passes included) gains from "
                      f"their graphs: dropping any one leaves the expected step as it is. Together they cost "
                      f"{mem_text(model, cost)} of real pool; the search kept them where the lists with and without "
                      f"them tie, and other traffic would replay them."]
    return lines


def _interval_lines(model: CostModel, dec: Decision) -> list[str]:
    iv = dec.interval
    default = model.engine.list_label("default")
    stop = ", stopped once its ends settled to the 0.0001 ms printed here" if iv.settled else ""
    drawn = (f"{iv.replicates} replicates{stop}, seed {iv.seed}, the cost model refitted on the profile with each "
             f"timed reading re-drawn: {iv.from_samples} from their raw samples, {iv.from_iqr} from their IQR (a normal of "
             f"sigma IQR/1.349, median of {iv.iqr_samples}), {iv.fixed} without spread")
    if not iv.replicates:
        drawn = (f"no timed reading of the profile has any spread: its {iv.fixed} readings kept no samples and an IQR "
                 f"of 0, or samples all alike; so the interval is the point")
    line = (f"How sure: the tuned list saves {iv.point_ms:+.4f} ms per step against the {default} list; "
            f"{iv.level:.0%} bootstrap interval **[{iv.low_ms:+.4f}, {iv.high_ms:+.4f}] ms** ({drawn}).")
    if iv.includes_zero:
        line += (" **The interval includes 0: within the profile's timing spread the tuned list may save nothing "
                 "against the default.**")
    return [line]


def _compact_lines(model: CostModel, dec: Decision) -> list[str]:
    choice = dec.compact
    c, t = dec.table["compact"], dec.table["tuned"]
    what = counted_name(dec)
    head = (f"Compact list (the least {what} whose expected step is within {choice.tolerance:.1%} of the fastest "
            f"list's {choice.fastest_ms:.4f} ms, `--tolerance {choice.tolerance:g}`)")
    proof = compact_proof(model, dec)
    if proof:
        head += f" ({proof})"
    if c.capture_sizes == t.capture_sizes:
        return [f"{head}: the tuned list itself; no list within the tolerance "
                f"{'was found that counts' if proof else 'counts'} less {what}."]
    share = choice.saved_share
    slower = c.expected_step_ms / t.expected_step_ms - 1 if t.expected_step_ms > 0 else 0.0
    lines = [
        f"{head}: {model.engine.list_shape(c.capture_sizes)}: `{model.engine.list_text(c.capture_sizes, None)}`",
        "",
    ]
    # The memory counted is its own column only where it is not the real pool (vLLM's estimate).
    counted = what != "real pool"
    lines += [f"| | graphs | expected step (ms) |{f' {what} |' if counted else ''} real pool | KV cache | capture |",
              "|---|---|---|" + ("---|" if counted else "") + "---|---|---|"]
    for name, e in (("tuned", t), ("compact", c)):
        lines.append(f"| {name} | {len(e.capture_sizes)} | {e.expected_step_ms:.4f} "
                     + (f"| {mem_text(model, dec.counted(e))} " if counted else "")
                     + f"| {mem_text(model, e.graph_memory_bytes)} "
                     f"| {mem_text(model, e.kv_available_bytes)} | {_seconds(capture_s(model, e))} |")
    lines.append("")
    if choice.recommended:
        lines.append(f"**Recommended: the compact list.** It saves {share:.0%} of the tuned list's {what} (at least "
                     f"{choice.recommend_saving:.0%}) for {slower:+.2%} of expected step.")
    else:
        lines.append(f"It saves {share:.0%} of the tuned list's {what}, less than {choice.recommend_saving:.0%}: the "
                     f"tuned list stays the recommendation.")
    ship = dec.ship
    files = model.engine.files
    lines.append(f"**Shipped: the {'compact' if ship.name == 'compact' else 'tuned (fastest)'} list** "
                 f"({ship.why}), in {', '.join(f'`{f}`' for f in files)}"
                 + (f"; the {ship.other[0]} list's files stand beside them: "
                    f"{', '.join(f'`{alternative_name(f, ship.other[0])}`' for f in files)}" if ship.other else "")
                 + " (`--ship fastest|compact|auto`).")
    return lines


def no_graphs_lines(dec: Decision) -> list[str]:
    """The expected step with no graphs at all, the drafter's passes included (the empty list under the model)."""
    e = dec.no_graphs
    drafter = (f" ({e.expected_step_ms - e.drafter_step_ms:.4f} ms target + {e.drafter_step_ms:.4f} ms drafter)"
               if e.drafter_step_ms else "")
    return [f"No graphs at all: {e.expected_step_ms:.4f} ms per step{drafter}."]


def shipped_line(model: CostModel, dec: Decision, run_dir: Path, count: Callable[[tuple[int, ...]], str]) -> str:
    """The list the run's files carry and the other list's files, in one line; `count` words a list in the engine's
    unit ("147 graphs, max 2176")."""
    ship = dec.ship
    first = model.engine.files[0]
    fastest = f"fastest ({dec.source})"
    line = (f"shipped: the {fastest if ship.name == 'fastest' else ship.name} list "
            f"({count(ship.evaluation.capture_sizes)}) in {run_dir / first}")
    if ship.other is not None:
        name, other = ship.other
        line += (f"; the {fastest if name == 'fastest' else name} list ({count(other.capture_sizes)}) in "
                 f"{run_dir / alternative_name(first, name)}")
    return line


def ship_reason(source: str, gap: float | None, exact_proven: bool) -> str | None:
    """Why the tuned list is the study's best or the exact solver's list (`SearchResult.source`, the study's best
    over the exact solver's list minus 1, and whether that list is the proven optimum); None for the other
    sources."""
    if source == "study" and gap is not None:
        if gap < 0:  # only where the exact solver's answer is not proven optimal (its time budget ran out)
            return (f"The optuna study's best is {-gap:.2%} faster than the exact solver's list, which is not proven "
                    f"optimal (see Search).")
        what = "the exact optimum" if exact_proven else "the exact solver's list"
        return f"The optuna study's best is within {gap:.2%} of {what}."
    if source != "exact":
        return None
    if gap is None:
        why = "no study trial was feasible."
    elif gap > STUDY_TOLERANCE:
        why = f"the study's best was not within {STUDY_TOLERANCE:.0%} of it ({gap:.2%} slower)."
    else:
        why = f"it is at least as fast as the study's best ({gap:.2%} apart) with no more graph memory."
    return "**The exact solver's answer is used**: " + why
