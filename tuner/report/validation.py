"""The validation section of report.md and its predicted-vs-measured plot, rendered from validation.json."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

__all__ = ["BEGIN", "END", "PLOT", "render_plot", "render_section", "section_for_run", "update_report"]

GIB = 1 << 30
BEGIN = "<!-- cgtune validate: begin -->"
END = "<!-- cgtune validate: end -->"
PLOT = "validation.png"
"""Plot file, written under RUN_DIR/plots/."""


def _pct(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:+.1%}"


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)


def _gib(x: int | None) -> str:
    return "-" if x is None else f"{x / GIB:.3f}"


def render_section(record: dict[str, Any], *, plots_dir: str = "plots") -> str:
    """Markdown for the section: provenance, a predicted-vs-measured table per list, goals, warnings, the plot."""
    goals = record.get("goals", {})
    mem_goal, lat_goal = goals.get("memory", 0.05), goals.get("latency", 0.03)
    trace = record.get("trace", {})
    profile = record.get("profile", {})
    clock = (record.get("device") or {}).get("clock")
    lines = [
        BEGIN,
        "## Validation on the device",
        "",
        f"- device: **{record.get('device_name')}**; profile `{profile.get('path')}` (measured on "
        f"{profile.get('device_name')}); workload `{record.get('workload', {}).get('name')}` "
        f"(hash {record.get('workload', {}).get('hash')})",
        f"- made by `{record.get('command') or 'cgtune validate'}` at {record.get('created_at')}",
        f"- trace: {trace.get('steps')} steps drawn from the workload's step distribution (seed {trace.get('seed')}, "
        f"mean {_num(trace.get('mean_tokens'), '.1f')} tokens, {_num(trace.get('uniform_decode_share'), '.1%')} "
        f"uniform decode); every list replays the same steps, each timed with "
        f"{'CUDA events' if clock == 'CudaEventClock' else clock or 'the backend'}"
        + (f"; {trace['excluded']} of {trace['sampled']} sampled steps were wider than the {trace['max_num_tokens']} "
           f"tokens the decode model was built for and are left out of every list" if trace.get("excluded") else ""),
        f"- goals: graph memory within {mem_goal:.0%}, mean step latency within {lat_goal:.0%} (model vs measured, "
        f"same steps); error = predicted / measured - 1",
        "",
        "| list | graphs | graph memory predicted (GiB) | measured (GiB) | error | step predicted (ms) | measured mean "
        "(ms) | error | p50 (ms) | p99 (ms) | tokens/s | steps FULL / PIECEWISE / eager | fits |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in record.get("lists", []):
        r = record.get(name)
        if not isinstance(r, dict):
            continue
        mem_err, lat_err = r.get("memory_error"), r.get("latency_error")
        mem_flag = "" if mem_err is None or abs(mem_err) <= mem_goal else " **(!)**"
        lat_flag = "" if lat_err is None or abs(lat_err) <= lat_goal else " **(!)**"
        d = r.get("dispatch", {})
        fits = "yes" if r.get("fits") else ("no: out of memory" if r.get("oom") else "no")
        lines.append(
            f"| {name} | {r.get('num_graphs')} | {_gib(r.get('predicted_graph_bytes'))} | "
            f"{_gib(r.get('measured_graph_bytes'))} | {_pct(mem_err)}{mem_flag} | "
            f"{_num(r.get('predicted_trace_step_ms'), '.4f')} | {_num(r.get('measured_step_ms'), '.4f')} | "
            f"{_pct(lat_err)}{lat_flag} | {_num(r.get('p50_step_ms'), '.4f')} | {_num(r.get('p99_step_ms'), '.4f')} | "
            f"{_num(r.get('tokens_per_s'), ',.0f')} | "
            f"{d.get('FULL', 0)} / {d.get('PIECEWISE', 0)} / {d.get('NONE', 0)} "
            f"| {fits} |")
    lines.append("")
    speedup = record.get("measured_speedup_tuned_over_default")
    if speedup is not None:
        lines.append(f"Measured speedup of tuned over default (mean step latency, same steps): **{speedup:.3f}x** "
                     f"(the model predicted {record.get('predicted_speedup_tuned_over_default', math.nan):.3f}x).")
    emitted = record.get("emitted")
    lines.append(f"Emitted list: **{emitted}**." if emitted
                 else "**No list is emitted by this validation** (see the notes and warnings below).")
    lines += ["", "Step predicted above is the model's mean over the replayed steps; its expectation over the whole "
              "distribution is in validation.json (`predicted_step_ms`). PIECEWISE steps replay the step split at "
              "every attention call (each piece a graph, attention eager between them), as the profile's piecewise "
              "rows were measured; FULL steps replay the whole body; both then compute logits for the real tokens. "
              "Only the target is replayed: a drafter's passes are in the model's prediction of a step, not in this "
              "table, and its predicted graph memory is added to the measured pool for the fit check."]
    warnings = record.get("warnings") or []
    if warnings:
        lines += ["", "**Warnings**", ""] + [f"- **{w}**" for w in warnings]
    if record.get("notes"):
        lines += ["", "**Notes**", ""] + [f"- {n}" for n in record["notes"]]
    lines += ["", f"![Predicted vs measured]({plots_dir}/{PLOT})", END]
    return "\n".join(lines) + "\n"


def render_plot(record: dict[str, Any], path: Path) -> Path:
    """Two panels: graph memory predicted vs measured per list, and per distinct step (mode, width) the predicted
    vs measured mean latency against the y = x line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in record.get("lists", []) if isinstance(record.get(n), dict)]
    fig, (ax_mem, ax_lat) = plt.subplots(1, 2, figsize=(11, 4.5))
    xs = range(len(names))
    pred = [(record[n].get("predicted_graph_bytes") or 0) / GIB for n in names]
    meas = [(record[n].get("measured_graph_bytes") or 0) / GIB for n in names]
    ax_mem.bar([x - 0.2 for x in xs], pred, width=0.4, label="predicted")
    ax_mem.bar([x + 0.2 for x in xs], meas, width=0.4, label="measured (free-memory delta)")
    ax_mem.set_xticks(list(xs), names)
    ax_mem.set_ylabel("graph memory (GiB)")
    ax_mem.set_title("Graph memory per list")
    ax_mem.legend(fontsize=8)
    lo, hi = math.inf, 0.0
    for n, marker in zip(names, "ox^sdv*"):
        groups = record[n].get("by_graph") or []
        px = [g["predicted_ms"] for g in groups]
        my = [g["measured_ms"] for g in groups]
        if px:
            ax_lat.scatter(px, my, s=[8 + 2 * math.sqrt(g["steps"]) for g in groups], marker=marker, alpha=0.6,
                           label=f"{n} (mean {_num(record[n].get('measured_step_ms'), '.3f')} ms)")
            lo, hi = min(lo, *px, *my), max(hi, *px, *my)
    if hi > 0:
        ax_lat.plot([lo, hi], [lo, hi], color="grey", ls=":", label="measured = predicted")
    ax_lat.set_xlabel("predicted step latency (ms)")
    ax_lat.set_ylabel("measured mean step latency (ms)")
    ax_lat.set_title("Per step kind (mode, width run)")
    if ax_lat.get_legend_handles_labels()[0]:
        ax_lat.legend(fontsize=8)
    fig.suptitle(f"{record.get('workload', {}).get('name')} on {record.get('device_name')}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def update_report(run_dir: str | Path, record: dict[str, Any]) -> Path:
    """Put the section into RUN_DIR/report.md, replacing an earlier one (a report without it gets it appended),
    and write the plot; both atomically."""
    from tuner.profile.table import atomic_write_text

    run = Path(run_dir)
    render_plot(record, run / "plots" / PLOT)
    report = run / "report.md"
    text = report.read_text() if report.is_file() else f"# cgtune report: {record.get('workload', {}).get('name')}\n"
    section = render_section(record)
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END) + r"\n?", re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    atomic_write_text(report, text)
    return report


def section_for_run(run_dir: str | Path, capture_sizes: tuple[int, ...] | list[int]) -> str:
    """The section for a re-rendered report.md: from RUN_DIR/validation.json when it validated this very list
    (as tuned or as the list emitted instead), else "" (no validation, or one of an earlier list)."""
    import json

    path = Path(run_dir) / "validation.json"
    if not path.is_file():
        return ""
    try:
        record = json.loads(path.read_text())
        validated = [record[n]["capture_sizes"] for n in ("tuned", record.get("emitted")) if n in record]
    except (ValueError, KeyError, TypeError):
        return ""
    return render_section(record) if list(capture_sizes) in validated else ""
