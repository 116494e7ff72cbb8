"""Draw a run's PNG plots (latency and graph memory by width with the tuned widths marked, the step widths each
list covers, latency against graph memory; with `--rate`, TPOT p99 against the rate: `tuner.report.load`), each
saying whether its numbers were measured or are hand-made."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tuner.model.costmodel import crossover_width
from tuner.report.text import memory_unit

if TYPE_CHECKING:
    from tuner.model.costmodel import CostModel, Evaluation
    from tuner.decision.record import Decision

__all__ = ["PLOTS", "graph_cover", "log_axis", "pareto_points", "plot_figures", "profile_provenance", "render_plots"]

MIB = 1 << 20
PLOTS = ("latency_by_width.png", "graph_memory_by_width.png", "step_widths.png", "pareto.png")
"""Plot files, written under RUN_DIR/plots/."""


def profile_provenance(model: CostModel) -> tuple[bool, str]:
    """(measured, phrase): whether the profile's numbers were measured on a device (`device` is a torch device,
    as `cgtune profile` writes it), and the phrase legends and titles use: "measured on DEVICE" or
    "synthetic/hand-made, not measured"."""
    meta = model.profile.metadata
    device = meta.get("device")
    name = meta.get("device_name")
    if isinstance(device, str) and device.split(":")[0] in ("cuda", "cpu"):
        return True, f"measured on {name or device}"
    return False, "synthetic/hand-made, not measured"


def log_axis(values: list[float] | np.ndarray) -> bool:
    """Whether a plot of these values wants a log axis: the positive ones span at least two decades."""
    v = np.asarray([x for x in values if x is not None and x > 0], dtype=float)
    return bool(len(v) and v.max() / v.min() >= 100.0)


def render_plots(model: CostModel, dec: Decision, out_dir: Path) -> list[Path]:
    """Write the PNG plots into out_dir; returns their paths. Every title and legend says whether the profile's
    numbers were measured (and on which device) or are synthetic/hand-made."""
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, fig in plot_figures(model, dec).items():
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
        paths.append(out_dir / name)
    return paths


def plot_figures(model: CostModel, dec: Decision) -> dict[str, Any]:
    """file name -> the matplotlib Figure of each plot, drawn and not saved (`render_plots` saves them; a test reads
    the points drawn from their artists). Every list is drawn by its graphs' token widths (`Engine.graph_kinds`)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display, and no GUI toolkit needed on a server
    import matplotlib.pyplot as plt

    _, origin = profile_provenance(model)
    title_suffix = f"\n{model.workload.name}: profile {origin}"
    table = dec.table
    tuned, default = table["tuned"].capture_sizes, table["default"].capture_sizes
    figures = {
        PLOTS[0]: _plot_latency(model, tuned, default, origin, title_suffix, plt),
        PLOTS[1]: _plot_memory(model, tuned, origin, title_suffix, plt),
        PLOTS[2]: _plot_steps(model, table, title_suffix, plt),
        PLOTS[3]: _plot_pareto(model, dec, title_suffix, plt),
    }
    if dec.load is not None:
        from tuner.report.load import LOAD_PLOT, plot_load

        figures[LOAD_PLOT] = plot_load(model, dec.load, title_suffix, plt)
    return figures


def _tuned_label(what: str, widths: list[int]) -> str:
    return f"tuned list: {len(widths)} {what}"


def _plot_latency(model: CostModel, tuned: tuple[int, ...], default: tuple[int, ...], origin: str, title_suffix: str,
                  plt: Any) -> Any:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for mode, style in (("eager", "o-"), ("full", "s-"), ("piecewise", "^-")):
        rows = model.profile.by_mode(mode)
        if rows:
            xs = sorted(rows)
            ax.plot(xs, [rows[x].latency_ms for x in xs], style, ms=3, label=f"{mode} ({origin})")
    # The chosen graphs at their token widths, on the latency the model reads there for their mode (interpolated
    # between measured widths): decode graphs and prefill graphs apart where the engine keeps two lists.
    for (what, mode, widths), marker in zip(model.engine.graph_kinds(tuned), "*D"):
        if mode in ("FULL", "PIECEWISE") and (model.full_ms is not None or mode == "PIECEWISE"):
            ax.plot(widths, model.graph_latency_ms(widths, mode), marker, color="tab:green", ms=10 if marker == "*"
                    else 6, label=_tuned_label(what, widths))
    if default:
        ax.axvline(model.engine.list_max(default), color="tab:red", ls="--", lw=1,
                   label=f"{model.engine.label} default max ({model.engine.tops_text(default)})")
    cross = crossover_width(model.profile)
    if cross is not None:
        ax.axvline(cross, color="grey", ls=":", label=f"graph saves < 2% from {cross} tokens")
    ax.set_xlabel("step width (tokens)")
    ax.set_ylabel("step latency (ms)")
    ax.set_title("Eager vs graph latency by width" + title_suffix)
    ax.legend(fontsize=8)
    return fig


def _plot_memory(model: CostModel, tuned: tuple[int, ...], origin: str, title_suffix: str, plt: Any) -> Any:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    shown: list[float] = []
    for mode in ("full", "piecewise"):
        rows = model.profile.by_mode(mode)
        xs = [x for x in sorted(rows) if rows[x].standalone_bytes is not None]
        if xs:
            ys = [rows[x].standalone_bytes / MIB for x in xs]  # type: ignore[operator]
            ax.plot(xs, ys, "o-", ms=3, label=f"{mode}: alone in a fresh pool ({origin})")
            shown += ys
            deltas = [(x, rows[x].capture_delta_bytes) for x in xs if rows[x].capture_delta_bytes is not None]
            # A negative delta is an invalid reading (the cost model interpolates over it): not drawn.
            deltas = [(x, y) for x, y in deltas if y is not None and y > 0]
            if deltas:
                ax.plot([x for x, _ in deltas], [y / MIB for _, y in deltas], ".--",
                        label=f"{mode}: added to the shared pool ({origin})")
                shown += [y / MIB for _, y in deltas]
    for (what, mode, widths), marker in zip(model.engine.graph_kinds(tuned), "*D"):
        curve = model.full_standalone if mode == "FULL" else model.piecewise_standalone
        if curve is not None:
            ax.plot(widths, curve(widths) / MIB, marker, color="tab:green", ms=10 if marker == "*" else 6,
                    label=_tuned_label(what, widths))
    if log_axis(shown):
        ax.set_yscale("log")
    ax.set_xlabel("graph width (tokens)")
    ax.set_ylabel("graph memory (MiB)" + (", log scale" if log_axis(shown) else ""))
    ax.set_title("Graph memory by width" + title_suffix)
    ax.legend(fontsize=8)
    return fig


def graph_cover(model: CostModel, e: Evaluation) -> tuple[list[int], list[int]]:
    """(token widths of the list's graphs, the ones a mixed step may replay) as the engine runs the list: every graph
    may serve a decode step (above the widest decode graph 0.34 falls to the prefill graphs; `Engine.graph_kinds`),
    only token-keyed ones a mixed step."""
    d = model.engine.dispatcher(e.capture_sizes)
    widths = sorted({w for _, _, ws in model.engine.graph_kinds(e.capture_sizes) for w in ws})
    return widths, list(d.mixed_graph_sizes) if widths else []


def _plot_steps(model: CostModel, table: dict[str, Evaluation], title_suffix: str, plt: Any) -> Any:
    """Decode steps zoomed to the decode widths; mixed steps (spread thin over up to max_num_batched_tokens) on an
    axis of their own, binned, so both are visible."""
    from matplotlib.transforms import blended_transform_factory

    widths, uniform, probs, _ = model.step_arrays()
    has_mixed = bool(np.any(~uniform))
    has_decode = bool(np.any(uniform))
    panels = int(has_decode) + int(has_mixed)
    fig, axes = plt.subplots(panels, 1, figsize=(8, 3.2 * panels + 0.6), squeeze=False)
    axes = list(axes[:, 0])
    lists = (("default", "tab:red", 0.03), ("tuned", "tab:green", 0.10))
    cover = {name: graph_cover(model, table[name]) for name, _, _ in lists}
    if has_decode:
        ax = axes.pop(0)
        w, p = widths[uniform], probs[uniform]
        top = int(w.max())
        covers = [cover[n][0][-1] for n, _, _ in lists if cover[n][0]]
        right = max([top] + [c for c in covers if c <= model.decode_limit]) * 1.05 + 1
        ax.bar(w, p, width=max(1.0, top / 200), color="tab:blue", alpha=0.7, label="uniform decode steps")
        # Each list's graphs as a rug of its own height (axes coordinates), so one does not hide the other.
        rug = blended_transform_factory(ax.transData, ax.transAxes)
        for name, color, y in lists:
            sizes = [s for s in cover[name][0] if s <= right]
            if sizes:
                ax.plot(sizes, [y] * len(sizes), "|", color=color, ms=12, mew=2, transform=rug,
                        label=f"{model.engine.list_label(name)} graphs (as run)")
            if cover[name][0] and cover[name][0][-1] <= right:
                covered = cover[name][0][-1]
                ax.axvline(covered, color=color, ls="--", lw=1,
                           label=f"{model.engine.list_label(name)} covers decode steps up to {covered} tokens")
        ax.set_xlim(0, right)
        ax.set_xlabel("decode step width (tokens)")
        ax.set_ylabel("probability")
        ax.set_title("Step widths and what each list covers" + title_suffix)
        ax.legend(fontsize=7)
    if has_mixed:
        ax = axes.pop(0)
        w, p = widths[~uniform], probs[~uniform]
        lo, hi = int(w.min()), int(w.max())
        step = max(1, -(-(hi - lo + 1) // 50))  # whole tokens per bin: no bin holds more widths than another
        ax.hist(w, bins=np.arange(lo, hi + step + 1, step) - 0.5, weights=p, color="tab:orange", alpha=0.7,
                label=f"mixed steps ({p.sum():.1%} of steps)")
        # Decode graphs alone (SGLang's, TensorRT-LLM's, vLLM's FULL_DECODE_ONLY, a 0.34 list without prefill sizes)
        # serve no mixed step: no coverage line on this axis for them.
        for name, color, _ in lists:
            if cover[name][1]:
                covered = cover[name][1][-1]
                ax.axvline(covered, color=color, ls="--", lw=1,
                           label=f"{model.engine.list_label(name)} covers mixed steps up to {covered} tokens")
            elif cover[name][0]:  # graphs, none of which a mixed step replays: say so rather than draw nothing
                ax.plot([], [], " ", label=f"{model.engine.list_label(name)}: no graph serves a mixed step (eager)")
        ax.set_xlabel("mixed step width (tokens)")
        ax.set_ylabel("probability" + (f" per {step} tokens" if step > 1 else ""))
        if not has_decode:
            ax.set_title("Step widths and what each list covers" + title_suffix)
        ax.legend(fontsize=7)
    return fig


def pareto_points(dec: Decision) -> list[Evaluation]:
    """The front a plot draws: the non-dominated fitting lists among the solver's (or study's) front and every list
    the decision compared (the ideal row aside), by the memory the KV rule counts, then latency; so no list compared
    sits below it."""
    pool = [*dec.front, *(e for name, e in dec.table.items() if name != "ideal" and e.feasible)]
    out: list[Evaluation] = []
    for e in sorted(pool, key=lambda e: (dec.counted(e), e.expected_step_ms)):
        if not out or e.expected_step_ms < out[-1].expected_step_ms - 1e-12:
            out.append(e)
    return out


def _plot_pareto(model: CostModel, dec: Decision, title_suffix: str, plt: Any) -> Any:
    """Latency against the memory the KV rule charges: vLLM's estimate (the real pool when it makes none), the front
    drawn as the staircase it is (at any memory, the fastest list counting no more)."""
    b = model.budget
    unit, unit_name = memory_unit(model)

    def charged(e: Evaluation) -> float:
        return dec.counted(e) / unit

    fig, ax = plt.subplots(figsize=(8, 4.5))
    front, table = pareto_points(dec), dec.table
    ax.plot([charged(e) for e in front], [e.expected_step_ms for e in front], "o-", ms=3, drawstyle="steps-post",
            label=f"Pareto front of the lists found ({'study' if dec.objective == 'pareto' else 'exact solver'} "
                  f"and the lists compared): the fastest at each memory")
    names = [n for n in table if n != "ideal"]
    for name, marker in zip(names, "x*v" + "dph"):
        e = table[name]
        # The tuned list on top: it often sits on the exact optimum's point.
        ax.plot(charged(e), e.expected_step_ms, marker, ms=14 if name == "tuned" else 10,
                zorder=5 if name == "tuned" else 3, alpha=1.0 if name == "tuned" else 0.8,
                label=model.engine.list_label(name))
    # The rule's budget for the tuned list's widest graph (SGLang's moves with it), in requests of q tokens.
    widest = model.engine.list_max(table["tuned"].runs_as)
    budget_bytes, what = b.graph_budget(-(-widest // model.q) if widest else 0)
    budget = budget_bytes / unit
    shown = max([charged(e) for e in front] + [charged(table[n]) for n in names])
    if budget <= 2 * shown:
        ax.axvline(budget, color="grey", ls=":", label=f"{what}: {budget:.3f} {unit_name}")
    else:  # a far-away budget line would squash every point against the axis
        ax.plot([], [], " ", label=f"{what}: {budget:.3f} {unit_name} (off the chart)")
    ax.set_xlabel(f"{model.engine.label}'s graph-memory estimate ({unit_name})" if dec.memory_axis == "estimate"
                  else f"real graph pool ({unit_name})")
    ax.set_ylabel("expected step latency (ms)")
    ax.set_title("Latency vs graph memory" + title_suffix)
    ax.legend(fontsize=8)
    return fig
