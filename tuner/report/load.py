"""Render the decision's load figures (`--rate`): the fixed point's iterations, each list's operating points at the
rate (the cliff named where the two starts settle apart), the highest rate each holds under `--tpot-slo`, and the plot
of TPOT p99 against the rate with the cliff marked. Renders `Decision.load` only; simulates nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tuner.decision.load_facts import LoadFacts
    from tuner.model.costmodel import CostModel

__all__ = ["LOAD_PLOT", "load_console_lines", "load_lines", "plot_load", "shipped_warning"]

LOAD_PLOT = "tpot_by_rate.png"
"""The load plot's file under RUN_DIR/plots/ (written only for a run with `--rate`)."""
_SHOWN = ("default", "tuned", "compact", "expected-step")


def _ms(value: float | None) -> str:
    return "none finished" if value is None else f"{value:.3f} ms"


def _lengths(d: dict[str, Any]) -> str:
    if d.get("kind") == "histogram":
        return f"a histogram of {len(d['counts'])} lengths"
    return str(d["min"]) if d["min"] == d["max"] else f"{d['min']}..{d['max']}"


def _label(model: CostModel, name: str) -> str:
    return "the expected-step answer" if name == "expected-step" else model.engine.list_label(name)


def _state(point: dict[str, Any]) -> str:
    """How the two starts settled at the rate, in a few words ("" for one settled operating point)."""
    if point["cliff"]:
        return "TWO operating points: a cliff"
    if not point.get("settled", True):  # summaries written before the rule knew a start still draining
        return "not settled: the saturated start was still working off its backlog"
    return ""


def shipped_warning(facts: LoadFacts, shipped: str) -> str | None:
    """Why the list the files carry (`shipped`: `tuned` or `compact`) does not serve the load as asked, in one
    sentence, or None when it does: two operating points or none settled at the rate, a start falling behind, its TPOT
    p99 above --tpot-slo, or a held rate below --rate."""
    point = facts.at_rate.get(shipped)
    if point is None:
        return None
    rate = facts.rate_per_s
    problems = []
    if _state(point):
        problems.append(f"at {rate:g} req/s it has {_state(point)}")
    if not (point["empty"]["keeps_up"] and point["saturated"]["keeps_up"]):
        problems.append(f"at {rate:g} req/s a start falls behind (its waiting queue grows)")
    slo = facts.tpot_slo_ms
    if slo is not None and (point["tpot_p99_ms"] is None or point["tpot_p99_ms"] > slo):
        problems.append(f"its TPOT p99 at {rate:g} req/s, {_ms(point['tpot_p99_ms'])}, is above the {slo:g} ms target")
    held = facts.stable.get(shipped)
    if held is not None and (held["rate_per_s"] is None or held["rate_per_s"] < rate):
        problems.append("it holds no rate in the bracket searched" if held["rate_per_s"] is None else
                        f"it holds {held['rate_per_s']:.4g} req/s at most, below the {rate:g} asked")
    if not problems:
        return None
    return f"the shipped ({shipped}) list does not serve the load as asked: " + "; ".join(problems)


def load_lines(model: CostModel, facts: LoadFacts, shipped: str = "tuned") -> list[str]:
    """report.md's load section (`shipped`: the list the files carry, `tuned` or `compact`, warned of in bold where it
    does not serve the load)."""
    s, load = facts.search, facts.load
    rate = facts.rate_per_s
    lines = ["## Under the load", "",
             f"Simulated with vLLM's V1 scheduler (`tuner.load`): Poisson arrivals at **{rate:g} requests/s**, prompts "
             f"of {_lengths(load['prompt_tokens'])} tokens, outputs of {_lengths(load['output_tokens'])}, "
             f"acceptance {load['acceptance']:g} tokens per decode step, seed {load['seed']}; {s['duration_s']:g} "
             f"simulated seconds per start (the first 20% cut as warm-up), started empty and started saturated. "
             f"Step latencies are the cost model's (this profile).", "",
             f"The list was chosen at the fixed point of the step distribution and the exact solver's list: "
             f"{s['why']}. Iteration 0 is the expected-step answer on the workload's traffic section; each later one "
             f"solves for the steps the simulations so far made of the load (averaged), and the iteration whose list "
             f"serves the load best (keeps up, one operating point, lowest TPOT p99) is the one searched for: "
             f"iteration {s['chosen']}.", "",
             "| iteration | graphs | max | added | removed | mean step width | TPOT p99 (worse start) | two points |",
             "|---|---|---|---|---|---|---|---|"]
    for it in s["iterations"]:
        sizes = it["capture_sizes"]
        lines.append(f"| {it['index']}{' (chosen)' if it['index'] == s['chosen'] else ''} | {len(sizes)} | "
                     f"{max(sizes, default=0)} | {len(it['added'])} | {len(it['removed'])} | "
                     f"{it['mean_step_width']:.1f} | {_ms(it['tpot_p99_ms'])} | {'yes' if it['cliff'] else 'no'} |")
    lines += ["", f"At {rate:g} requests/s:", "",
              "| list | graphs | start | mean step width | TPOT p50 | TPOT p99 | TTFT p99 | keeps up |",
              "|---|---|---|---|---|---|---|---|"]
    for name in _SHOWN:
        point = facts.at_rate.get(name)
        if point is None:
            continue
        for start in ("empty", "saturated"):
            r = point[start]
            width = "-" if r["mean_step_width"] is None else f"{r['mean_step_width']:.1f}"
            lines.append(f"| {_label(model, name) if start == 'empty' else ''} | "
                         f"{len(point['capture_sizes']) if start == 'empty' else ''} | {start} | {width} | "
                         f"{_ms(r['tpot_p50_ms'])} | {_ms(r['tpot_p99_ms'])} | {_ms(r['ttft_p99_ms'])} | "
                         f"{'yes' if r['keeps_up'] else 'NO'} |")
    cliffs = [name for name in _SHOWN if name in facts.at_rate and facts.at_rate[name]["cliff"]]
    unsettled = [name for name in _SHOWN if name in facts.at_rate and not facts.at_rate[name].get("settled", True)]
    lines.append("")
    for name in cliffs:
        lines.append(f"- **Cliff**: {_label(model, name)} has {facts.at_rate[name]['why']}.")
    for name in unsettled:
        lines.append(f"- {_label(model, name)}: {facts.at_rate[name]['why']}.")
    if not cliffs:
        lines.append(f"- No list compared has two operating points at {rate:g} requests/s.")
    warning = shipped_warning(facts, shipped)
    if warning:
        lines += ["", f"**Warning: {warning}.**"]
    if facts.stable:
        lines += ["", f"Highest rate each list holds (one operating point, both starts keep up, TPOT p99 <= "
                      f"{facts.tpot_slo_ms:g} ms; bisected to {next(iter(facts.stable.values()))['precision']:.0%}):",
                  ""]
        for name in _SHOWN:
            held = facts.stable.get(name)
            if held is None:
                continue
            low, high = held["bracket"]
            what = ("none in the bracket" if held["rate_per_s"] is None else
                    f"{held['rate_per_s']:.4g} requests/s" + (" or more (the bracket's top held)" if held["capped"]
                                                               else ""))
            lines.append(f"- {_label(model, name)}: {what} (searched {low:.4g}..{high:.4g}, "
                         f"{len(held['probes'])} rates tried)")
    lines += ["", f"![TPOT p99 against the rate](plots/{LOAD_PLOT})", ""]
    return lines


def load_console_lines(model: CostModel, facts: LoadFacts, shipped: str = "tuned") -> list[str]:
    """The console's load lines: each list's TPOT p99 at the rate (and its held rate), then a WARNING where the list
    shipped (`tuned` or `compact`) does not serve the load as asked."""
    out = []
    for name in _SHOWN:
        point = facts.at_rate.get(name)
        if point is None:
            continue
        held = facts.stable.get(name)
        extra = ""
        if held is not None:
            extra = (f"; holds {held['rate_per_s']:.4g} req/s at TPOT p99 <= {facts.tpot_slo_ms:g} ms"
                     if held["rate_per_s"] is not None else "; holds no rate in its bracket")
        state = _state(point)
        out.append(f"under the load at {facts.rate_per_s:g} req/s: {_label(model, name)} TPOT p99 "
                   f"{_ms(point['tpot_p99_ms'])}" + (f" ({state})" if state else "") + extra)
    warning = shipped_warning(facts, shipped)
    return out + ([f"WARNING: {warning} (see report.md, Under the load)"] if warning else [])


def plot_load(model: CostModel, facts: LoadFacts, title_suffix: str, plt: Any) -> Any:
    """TPOT p99 (the worse start) against the rate for each list; a rate where the two starts settle apart is
    marked x, one where the queue grows is drawn hollow; the target and each list's held rate as lines."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, color in zip(_SHOWN, ("C0", "C1", "C2", "C3")):
        rows = facts.sweep.get(name)
        if not rows:
            continue
        rates = [r["rate_per_s"] for r in rows if r["tpot_p99_ms"] is not None]
        p99 = [r["tpot_p99_ms"] for r in rows if r["tpot_p99_ms"] is not None]
        ax.plot(rates, p99, "-", color=color, label=_label(model, name))
        for r in rows:
            if r["tpot_p99_ms"] is None:
                continue
            marker = "x" if r["cliff"] else "o" if r.get("settled", True) else "d"
            ax.plot(r["rate_per_s"], r["tpot_p99_ms"], marker, color=color, ms=4 if marker == "o" else 9,
                    mfc=color if r["keeps_up"] else "none")
        held = facts.stable.get(name)
        if held is not None and held["rate_per_s"] is not None:
            ax.axvline(held["rate_per_s"], color=color, ls=":", lw=1)
    ax.plot([], [], "kx", ms=9, label="two operating points (cliff)")
    ax.plot([], [], "kd", ms=9, label="not settled (a backlog still worked off)")
    ax.plot([], [], "ko", mfc="none", ms=4, label="queue grows")
    if facts.tpot_slo_ms is not None:
        ax.axhline(facts.tpot_slo_ms, color="grey", ls="--", label=f"TPOT target {facts.tpot_slo_ms:g} ms")
    ax.axvline(facts.rate_per_s, color="black", lw=0.8, alpha=0.5, label=f"--rate {facts.rate_per_s:g}")
    ax.set_xscale("log")
    ax.set_xlabel("arrival rate (requests/s, Poisson)")
    ax.set_ylabel("TPOT p99, worse of empty and saturated start (ms)")
    ax.set_title("TPOT p99 against the rate (simulated scheduler, cost-model steps)" + title_suffix)
    ax.legend(fontsize=8)
    return fig
