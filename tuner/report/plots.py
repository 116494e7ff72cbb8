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

__all__ = ["PLOTS", "log_axis", "profile_provenance", "render_plots"]

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
    import matplotlib

    matplotlib.use("Agg")  # files only, no display, and no GUI toolkit needed on a server
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    _, origin = profile_provenance(model)
    title_suffix = f"\n{model.workload.name}: profile {origin}"
    table = dec.table
    tuned, default = table["tuned"].capture_sizes, table["default"].capture_sizes
    paths = [
        _plot_latency(model, tuned, default, origin, title_suffix, out_dir / PLOTS[0], plt),
        _plot_memory(model, tuned, origin, title_suffix, out_dir / PLOTS[1], plt),
        _plot_steps(model, table, title_suffix, out_dir / PLOTS[2], plt),
        _plot_pareto(model, dec, title_suffix, out_dir / PLOTS[3], plt),
    ]
    if dec.load is not None:
        from tuner.report.load import LOAD_PLOT, plot_load

        paths.append(plot_load(model, dec.load, title_suffix, out_dir / LOAD_PLOT, plt))
    return paths


def _plot_latency(model: CostModel, tuned: tuple[int, ...], default: tuple[int, ...], origin: str, title_suffix: str,
                  path: Path, plt: Any) -> Path:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for mode, style in (("eager", "o-"), ("full", "s-"), ("piecewise", "^-")):
        rows = model.profile.by_mode(mode)
        if rows:
            xs = sorted(rows)
            ax.plot(xs, [rows[x].latency_ms for x in xs], style, ms=3, label=f"{mode} ({origin})")
    if model.full_ms is not None and tuned:
        # The chosen widths, on the graph latency the model reads there (interpolated between measured widths).
        ax.plot(tuned, model.full_ms(tuned), "*", color="tab:green", ms=10, label=f"tuned list ({len(tuned)} widths)")
    if default:
        ax.axvline(default[-1], color="tab:red", ls="--", lw=1,
                   label=f"{model.engine.label} default max ({default[-1]})")
    cross = crossover_width(model.profile)
    if cross is not None:
        ax.axvline(cross, color="grey", ls=":", label=f"graph saves < 2% from {cross} tokens")
    ax.set_xlabel("step width (tokens)")
    ax.set_ylabel("step latency (ms)")
    ax.set_title("Eager vs graph latency by width" + title_suffix)
    ax.legend(fontsize=8)
    return _save(fig, path, plt)


def _plot_memory(model: CostModel, tuned: tuple[int, ...], origin: str, title_suffix: str, path: Path,
                 plt: Any) -> Path:
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
    if model.full_standalone is not None and tuned:
        ax.plot(tuned, model.full_standalone(tuned) / MIB, "*", color="tab:green", ms=10,
                label=f"tuned list ({len(tuned)} widths)")
    if log_axis(shown):
        ax.set_yscale("log")
    ax.set_xlabel("graph width (tokens)")
    ax.set_ylabel("graph memory (MiB)" + (", log scale" if log_axis(shown) else ""))
    ax.set_title("Graph memory by width" + title_suffix)
    ax.legend(fontsize=8)
    return _save(fig, path, plt)


def _plot_steps(model: CostModel, table: dict[str, Evaluation], title_suffix: str, path: Path, plt: Any) -> Path:
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
    if has_decode:
        ax = axes.pop(0)
        w, p = widths[uniform], probs[uniform]
        top = int(w.max())
        covers = [table[n].runs_as[-1] for n, _, _ in lists if table[n].runs_as]
        right = max([top] + [c for c in covers if c <= model.decode_limit]) * 1.05 + 1
        ax.bar(w, p, width=max(1.0, top / 200), color="tab:blue", alpha=0.7, label="uniform decode steps")
        # Each list's graphs as a rug of its own height (axes coordinates), so one does not hide the other.
        rug = blended_transform_factory(ax.transData, ax.transAxes)
        for name, color, y in lists:
            sizes = [s for s in table[name].runs_as if s <= right]
            if sizes:
                ax.plot(sizes, [y] * len(sizes), "|", color=color, ms=12, mew=2, transform=rug,
                        label=f"{model.engine.list_label(name)} graphs (as run)")
            if table[name].runs_as and table[name].runs_as[-1] <= right:
                covered = table[name].runs_as[-1]
                ax.axvline(covered, color=color, ls="--", lw=1,
                           label=f"{model.engine.list_label(name)} covers up to {covered}")
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
        # Decode graphs alone (SGLang's, TensorRT-LLM's, vLLM's FULL_DECODE_ONLY) serve no mixed step: no coverage
        # line on this axis.
        for name, color, _ in lists if model.mixed_mode != "NONE" else ():
            if table[name].runs_as:
                covered = table[name].runs_as[-1]
                ax.axvline(covered, color=color, ls="--", lw=1,
                           label=f"{model.engine.list_label(name)} covers up to {covered}")
        ax.set_xlabel("mixed step width (tokens)")
        ax.set_ylabel("probability" + (f" per {step} tokens" if step > 1 else ""))
        if not has_decode:
            ax.set_title("Step widths and what each list covers" + title_suffix)
        ax.legend(fontsize=7)
    return _save(fig, path, plt)


def _plot_pareto(model: CostModel, dec: Decision, title_suffix: str, path: Path, plt: Any) -> Path:
    """Latency against the memory the KV rule charges: vLLM's estimate (the real pool when it is switched off)."""
    b = model.budget
    estimate = b.estimate_enabled
    unit, unit_name = memory_unit(model)

    def charged(e: Evaluation) -> float:
        return dec.counted(e) / unit

    fig, ax = plt.subplots(figsize=(8, 4.5))
    front, table = dec.front, dec.table
    ax.plot([charged(e) for e in front], [e.expected_step_ms for e in front], "o-", ms=3,
            label=f"Pareto front ({'study' if dec.objective == 'pareto' else 'exact solver'})")
    names = [n for n in table if n != "ideal"]
    for name, marker in zip(names, "x*v" + "dph"):
        e = table[name]
        # The tuned list on top: it often sits on the exact optimum's point.
        ax.plot(charged(e), e.expected_step_ms, marker, ms=14 if name == "tuned" else 10,
                zorder=5 if name == "tuned" else 3, alpha=1.0 if name == "tuned" else 0.8,
                label=model.engine.list_label(name))
    runs = table["tuned"].runs_as  # the rule's budget for the tuned list's max (SGLang's moves with it)
    budget_bytes, what = b.graph_budget(-(-runs[-1] // model.q) if runs else 0)
    budget = budget_bytes / unit
    shown = max([charged(e) for e in front] + [charged(table[n]) for n in names])
    if budget <= 2 * shown:
        ax.axvline(budget, color="grey", ls=":", label=f"{what}: {budget:.3f} {unit_name}")
    else:  # a far-away budget line would squash every point against the axis
        ax.plot([], [], " ", label=f"{what}: {budget:.3f} {unit_name} (off the chart)")
    ax.set_xlabel(f"{model.engine.label}'s graph-memory estimate ({unit_name})" if estimate
                  else f"real graph pool ({unit_name})")
    ax.set_ylabel("expected step latency (ms)")
    ax.set_title("Latency vs graph memory" + title_suffix)
    ax.legend(fontsize=8)
    return _save(fig, path, plt)


def _save(fig: Any, path: Path, plt: Any) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
