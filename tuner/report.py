"""Render a search into report.md, PNG plots and summary.json: the tuned list side by side with vLLM's default,
the exact optimum, the widest capture (PR 50488), an SGLang-style list and the unconstrained ideal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from tuner import __version__
from tuner.model import GIB, CostModel, Evaluation, crossover_width
from tuner.search import SearchResult
from tuner.vllm.defaults import default_capture_sizes, request_count_grid
from tuner.workload import ServingConfig

__all__ = [
    "PLOTS",
    "RUN_FILES",
    "SUMMARY_KEYS",
    "comparison",
    "load_run",
    "render_markdown",
    "render_plots",
    "sglang_sizes",
    "summary",
    "summary_json",
    "widest_sizes",
    "write_run",
]

MIB = 1 << 20
SUMMARY_KEYS = ("default", "tuned", "exact", "widest", "ideal")
"""Lists summary.json always holds, each with expected_step_ms, graph_memory_bytes, kv_available_bytes, feasible."""
PLOTS = ("latency_by_width.png", "graph_memory_by_width.png", "step_widths.png", "pareto.png")
"""Plot files, written under RUN_DIR/plots/."""

_LABELS = {
    "default": "vLLM default",
    "tuned": "tuned",
    "exact": "exact optimum",
    "widest": "widest capture (PR 50488)",
    "sglang": "SGLang-style",
    "ideal": "ideal (every width, memory ignored)",
}


def widest_sizes(serving: ServingConfig) -> tuple[int, ...]:
    """PR 50488's behaviour: the default grid with the ceiling lifted to the widest uniform decode batch
    (max_num_seqs x q), so every decode batch has a graph."""
    q = serving.decode_query_len
    top = min(serving.max_num_seqs * q, serving.max_num_batched_tokens)
    grid = default_capture_sizes(serving.max_num_seqs, serving.num_speculative_tokens,
                                 serving.max_num_batched_tokens, max_cudagraph_capture_size=top).sizes
    decode = {n * q for n in request_count_grid(serving.max_num_seqs, serving.max_num_seqs) if n * q <= top}
    return tuple(sorted(set(grid) | decode | {top}))


def sglang_sizes(serving: ServingConfig) -> tuple[int, ...]:
    """SGLang's default batch-size grid (1, 2, 4, 8, 12, 16..256 step 8, 272..496 step 16, 512.. step 32) up to
    max_num_seqs, plus max_num_seqs, each times q tokens (SGLang captures by batch size)."""
    mns, q = serving.max_num_seqs, serving.decode_query_len
    grid = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 497, 16), *range(512, mns + 1, 32)]
    return tuple(sorted({b * q for b in grid + [mns] if b <= mns and b * q <= serving.max_num_batched_tokens}))


def comparison(model: CostModel, search: SearchResult) -> dict[str, Evaluation]:
    """Every list of the side-by-side table, on the same profile and budget."""
    return {
        "default": search.default,
        "tuned": search.chosen,
        "exact": search.exact.best,
        "widest": model.evaluate(widest_sizes(model.serving)),
        "sglang": model.evaluate(sglang_sizes(model.serving)),
        "ideal": model.ideal(),
    }


def _meta(model: CostModel) -> dict[str, Any]:
    meta = model.profile.metadata
    return {
        "device_name": meta.get("device_name"),
        "profile": str(model.profile.path) if model.profile.path else None,
        "profile_command": meta.get("command"),
        "profile_created_at": meta.get("created_at"),
        "workload": {"name": model.workload.name, "hash": model.workload.content_hash},
    }


def summary(model: CostModel, search: SearchResult, table: dict[str, Evaluation]) -> dict[str, Any]:
    """summary.json: each list's figures, the required KV and the tuned list, plus provenance."""
    def figures(e: Evaluation) -> dict[str, Any]:
        return {
            "expected_step_ms": e.expected_step_ms,
            "graph_memory_bytes": e.graph_memory_bytes,
            "kv_available_bytes": e.kv_available_bytes,
            "feasible": e.feasible,
            "per_token_ms": e.per_token_ms,
            "num_graphs": len(e.capture_sizes),
            "max_capture_size": e.capture_sizes[-1] if e.capture_sizes else 0,
        }

    out: dict[str, Any] = {name: figures(e) for name, e in table.items()}
    out.update({
        "required_kv_bytes": model.budget.required_kv_bytes,
        "capture_sizes": list(search.chosen.capture_sizes),
        "source": search.source,
        "cudagraph_mode": model.cudagraph_mode,
        "eager_step_ms": model.eager_step_ms(),
        "crossover_width": crossover_width(model.profile),
        "study": {"name": search.study_name, "storage": search.storage, "objective": search.objective,
                  **search.trials, "gap_to_exact": search.gap},
        "exact_memory_unit_bytes": search.exact.memory_unit_bytes,
        "notes": list(search.notes),
        "cgtune_version": __version__,
        **_meta(model),
    })
    return out


# ---------------------------------------------------------------------------------------------- plots
def render_plots(model: CostModel, search: SearchResult, table: dict[str, Evaluation], out_dir: Path) -> list[Path]:
    """Write the PNG plots into out_dir; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display, and no GUI toolkit needed on a server
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    device = model.profile.metadata.get("device_name") or "unknown device"
    title_suffix = f"\n{model.workload.name} on {device}"

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for mode, style in (("eager", "o-"), ("full", "s-"), ("piecewise", "^-")):
        rows = model.profile.by_mode(mode)
        if rows:
            xs = sorted(rows)
            ax.plot(xs, [rows[x].latency_ms for x in xs], style, ms=3, label=f"{mode} (measured)")
    cross = crossover_width(model.profile)
    if cross is not None:
        ax.axvline(cross, color="grey", ls=":", label=f"graph saves < 2% from {cross} tokens")
    ax.set_xlabel("step width (tokens)")
    ax.set_ylabel("step latency (ms)")
    ax.set_title("Eager vs graph latency by width" + title_suffix)
    ax.legend()
    paths.append(_save(fig, out_dir / PLOTS[0], plt))

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for mode in ("full", "piecewise"):
        rows = model.profile.by_mode(mode)
        xs = [x for x in sorted(rows) if rows[x].standalone_bytes is not None]
        if xs:
            ax.plot(xs, [rows[x].standalone_bytes / MIB for x in xs], "o-", ms=3, label=f"{mode}: standalone")
            ys = [(x, rows[x].capture_delta_bytes) for x in xs if rows[x].capture_delta_bytes is not None]
            if ys:
                ax.plot([x for x, _ in ys], [y / MIB for _, y in ys], ".--",
                        label=f"{mode}: capture delta (shared pool)")
    ax.set_xlabel("graph width (tokens)")
    ax.set_ylabel("graph memory (MiB)")
    ax.set_title("Graph memory by width" + title_suffix)
    ax.legend()
    paths.append(_save(fig, out_dir / PLOTS[1], plt))

    fig, ax = plt.subplots(figsize=(8, 4.5))
    widths, uniform, probs, _ = model.step_arrays()
    for flag, label in ((True, "uniform decode steps"), (False, "mixed steps")):
        sel = uniform == flag
        if np.any(sel):
            ax.bar(widths[sel], probs[sel], width=max(1.0, float(widths.max()) / 400), label=label, alpha=0.7)
    for name, color in (("default", "tab:red"), ("tuned", "tab:green")):
        sizes = table[name].capture_sizes
        if sizes:
            ax.axvspan(0, sizes[-1], color=color, alpha=0.08)
            ax.axvline(sizes[-1], color=color, ls="--", label=f"{_LABELS[name]} covers up to {sizes[-1]}")
            ax.plot(sizes, np.zeros(len(sizes)), "|", color=color, ms=12, clip_on=False)
    ax.set_xlabel("step width (tokens)")
    ax.set_ylabel("probability")
    ax.set_title("Step widths and what each list covers" + title_suffix)
    ax.legend()
    paths.append(_save(fig, out_dir / PLOTS[2], plt))

    fig, ax = plt.subplots(figsize=(8, 4.5))
    front = search.pareto or search.exact.front
    ax.plot([e.graph_memory_bytes / GIB for e in front], [e.expected_step_ms for e in front], "o-", ms=3,
            label=f"Pareto front ({'study' if search.objective == 'pareto' else 'exact solver'})")
    for name, marker in (("default", "x"), ("tuned", "*"), ("widest", "v"), ("sglang", "d")):
        e = table[name]
        ax.plot(e.graph_memory_bytes / GIB, e.expected_step_ms, marker, ms=10, label=_LABELS[name])
    budget = model.budget.graph_budget_bytes / GIB
    shown = max([e.graph_memory_bytes / GIB for e in front] + [table[n].graph_memory_bytes / GIB
                                                               for n in ("default", "tuned", "widest", "sglang")])
    if budget <= 2 * shown:
        ax.axvline(budget, color="grey", ls=":", label=f"graph budget {budget:.2f} GiB")
    else:  # a far-away budget line would squash every point against the axis
        ax.plot([], [], " ", label=f"graph budget {budget:.2f} GiB (off the chart)")
    ax.set_xlabel("graph memory (GiB)")
    ax.set_ylabel("expected step latency (ms)")
    ax.set_title("Latency vs graph memory" + title_suffix)
    ax.legend(fontsize=8)
    paths.append(_save(fig, out_dir / PLOTS[3], plt))
    return paths


def _save(fig: Any, path: Path, plt: Any) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------- markdown
def _fmt_sizes(sizes: tuple[int, ...], limit: int = 24) -> str:
    if not sizes:
        return "(none)"
    text = ", ".join(map(str, sizes[:limit]))
    return text + (f", ... ({len(sizes)} sizes)" if len(sizes) > limit else "")


def render_markdown(model: CostModel, search: SearchResult, table: dict[str, Evaluation], *,
                    command: str = "", plots_dir: str = "plots") -> str:
    """report.md text."""
    meta = _meta(model)
    b = model.budget
    lines = [
        f"# cgtune report: {model.workload.name}",
        "",
        f"- device: **{meta['device_name']}** (profile `{meta['profile']}`, made by "
        f"`{meta['profile_command'] or '?'}` at {meta['profile_created_at'] or '?'})",
        f"- workload: `{model.workload.name}` (hash {model.workload.content_hash}), cudagraph_mode "
        f"{model.cudagraph_mode}, q = {model.q}, max_num_seqs {model.serving.max_num_seqs}",
        f"- KV budget: {b.total_memory_bytes / GIB:.2f} GiB x {b.gpu_memory_utilization} - weights "
        f"{b.weights_bytes / GIB:.2f} GiB ({b.weights_source}) - activations {b.activation_peak_bytes / GIB:.2f} GiB "
        f"- graphs; required KV {b.required_kv_bytes / GIB:.2f} GiB, so graphs may take at most "
        f"{b.graph_budget_bytes / GIB:.2f} GiB",
        f"- made by cgtune {__version__}" + (f" with `{command}`" if command else ""),
        "",
        "## Decision",
        "",
        f"Tuned list ({search.source}): `{list(search.chosen.capture_sizes)}`",
        "",
    ]
    d, t = table["default"], table["tuned"]
    change = t.expected_step_ms / d.expected_step_ms - 1 if d.expected_step_ms > 0 else 0.0
    lines.append(f"Expected step latency {t.expected_step_ms:.4f} ms vs {d.expected_step_ms:.4f} ms with vLLM's "
                 f"default ({abs(change):.1%} {'lower' if change <= 0 else 'higher'}), graph memory "
                 f"{t.graph_memory_bytes / GIB:.3f} GiB vs {d.graph_memory_bytes / GIB:.3f} GiB, KV margin "
                 f"{t.kv_margin_gib:.2f} GiB.")
    if not d.feasible:
        lines.append(f"vLLM's default does not fit this budget ({d.why_infeasible}); the tuned list does"
                     + ("." if t.feasible else " not either."))
    gap = search.gap
    if search.source == "study":
        lines.append(f"The optuna study's best is within {gap:.2%} of the exact optimum." if gap is not None else "")
    elif search.source == "exact":
        if gap is None:
            why = "no study trial was feasible."
        elif gap > 0.01:
            why = f"the study's best was not within 1% of it ({gap:.2%} slower)."
        else:
            why = (f"it is at least as fast as the study's best ({gap:.2%} apart) with no more graph memory.")
        lines.append("**The exact solver's answer is used**: " + why)
    cross = crossover_width(model.profile)
    lines += [
        "",
        "Crossover: " + (f"from **{cross} tokens** on, a FULL graph saves less than 2% of the eager step (the GPU "
                         f"work of a step hides its CPU launch cost)." if cross is not None else
                         "a FULL graph saves at least 2% of the eager step at every measured width."),
        "",
        "## Side by side (same profile, same budget)",
        "",
        "| list | graphs | max | expected step (ms) | per token (ms) | graph memory (GiB) | KV left (GiB) | feasible |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, e in table.items():
        feasible = "yes" if e.feasible else f"no: {e.why_infeasible}"
        if name == "ideal":
            feasible = "memory ignored" + ("" if e.feasible else " (it would not fit)")
        lines.append(f"| {_LABELS[name]} | {len(e.capture_sizes)} | {e.capture_sizes[-1] if e.capture_sizes else 0} "
                     f"| {e.expected_step_ms:.4f} | {e.per_token_ms:.5f} | {e.graph_memory_bytes / GIB:.3f} "
                     f"| {e.kv_available_bytes / GIB:.2f} | {feasible} |")
    lines += [
        "",
        f"No graphs at all: {model.eager_step_ms():.4f} ms per step.",
        "",
        "## Search",
        "",
        f"- study `{search.study_name}` in `{search.storage}` (objective {search.objective}): "
        + ", ".join(f"{k} {v}" for k, v in search.trials.items()),
        f"- exact solver: {search.exact.num_candidates} candidate widths, memory counted in "
        f"{search.exact.memory_unit_bytes} B units ({'exact' if search.exact.exact_memory else 'rounded up'})",
        "",
        "## Lists",
        "",
    ]
    for name, e in table.items():
        if name != "ideal":
            lines.append(f"- {_LABELS[name]}: {_fmt_sizes(e.capture_sizes)}")
    if search.notes:
        lines += ["", "## Assumptions and notes", ""] + [f"- {n}" for n in search.notes]
    lines += ["", "## Plots", ""]
    captions = ["Eager vs graph latency by width", "Graph memory by width",
                "Step-width distribution and coverage", "Latency vs graph memory (Pareto front)"]
    lines += [f"![{c}]({plots_dir}/{p})" for c, p in zip(captions, PLOTS)]
    lines += ["", "Files: `compilation_config.json` (`vllm serve --compilation-config`), `vllm-serve.yaml` "
              "(`vllm serve --config`), `vllm-flags.txt`, `summary.json`.", ""]
    return "\n".join(lines)


def summary_json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, default=str) + "\n"


# ---------------------------------------------------------------------------------------------- run directory
RUN_FILES = ("profile.csv", "profile.json", "workload.yaml", "search.json", "summary.json", "report.md")
"""Files a run directory holds besides the vLLM files and plots/ (and study.db with the default storage)."""


def _copy_inputs(staging: Path, model: CostModel) -> None:
    """Copy the profile and workload in, so `cgtune report RUN_DIR` re-renders without the originals."""
    import shutil

    src = model.profile.path
    assert src is not None
    if src.resolve() == (staging.parent / "profile.csv").resolve():
        return  # re-rendering a run directory from its own copies
    shutil.copyfile(src, staging / "profile.csv")
    shutil.copyfile(src.with_suffix(".json"), staging / "profile.json")
    wl = model.workload
    if wl.path is not None and wl.path.is_file():
        shutil.copyfile(wl.path, staging / "workload.yaml")
        trace = (wl.spec.get("traffic") or {}).get("trace")
        if isinstance(trace, str) and not Path(trace).is_absolute() and ".." not in Path(trace).parts:
            (staging / trace).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(wl.path.parent / trace, staging / trace)
    else:
        import yaml

        (staging / "workload.yaml").write_text(yaml.safe_dump(wl.spec, sort_keys=False))


def write_run(run_dir: str | Path, model: CostModel, search: SearchResult, *, command: str = "",
              plots: bool = True, report: bool = True, copy_inputs: bool = True) -> list[Path]:
    """Write every output file of a run: rendered in a staging folder inside run_dir, then moved into place,
    so an error or interruption never leaves a half-written report beside a finished one."""
    import datetime
    import os
    import shutil
    import tempfile

    from tuner.vllm.emit import Provenance, render_files

    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".cgtune-staging-", dir=run))
    try:
        if copy_inputs:
            _copy_inputs(staging, model)
        table = comparison(model, search)
        data = summary(model, search, table)
        s = model.serving
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        provenance = Provenance(
            __version__, data["profile"] or "?", str(data["device_name"]),
            f"{model.workload.name} ({model.workload.content_hash})", now,
            {"source": search.source, "expected_step_ms": f"{search.chosen.expected_step_ms:.4f} "
             f"(vLLM default {search.default.expected_step_ms:.4f}) under the cgtune cost model"},
        )
        files = render_files(
            search.chosen.capture_sizes, model=model.workload.model.label, cudagraph_mode=model.cudagraph_mode,
            max_num_seqs=s.max_num_seqs, num_speculative_tokens=s.num_speculative_tokens,
            max_num_batched_tokens=s.max_num_batched_tokens, max_model_len=s.max_model_len,
            gpu_memory_utilization=s.gpu_memory_utilization,
            tensor_parallel_size=model.workload.model.tensor_parallel_size, provenance=provenance,
        )
        files["search.json"] = json.dumps(search.to_dict(), indent=2) + "\n"
        files["summary.json"] = summary_json(data)
        if report:
            files["report.md"] = render_markdown(model, search, table, command=command)
            from tuner.validate_report import section_for_run  # keeps `cgtune validate`'s section on re-render

            if section := section_for_run(run, search.chosen.capture_sizes):
                files["report.md"] += "\n" + section
        for name, text in files.items():
            (staging / name).write_text(text)
        if plots:
            render_plots(model, search, table, staging / "plots")
        written = []
        for path in sorted(staging.rglob("*")):
            if path.is_file():
                target = run / path.relative_to(staging)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(path, target)
                written.append(target)
        return written
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def load_run(run_dir: str | Path) -> tuple[CostModel, SearchResult]:
    """The cost model and search of a run directory (from its copied profile and workload)."""
    from tuner.model import ModelError
    from tuner.workload import load_workload

    run = Path(run_dir)
    for name in ("profile.csv", "workload.yaml", "search.json"):
        if not (run / name).is_file():
            raise ModelError(f"{run}: no {name} (not a cgtune search or tune output directory)")
    workload = load_workload(run / "workload.yaml")
    model = CostModel.from_files(run / "profile.csv", workload)
    try:
        data = json.loads((run / "search.json").read_text())
        search = SearchResult.from_dict(data, model)
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ModelError(f"{run / 'search.json'}: unreadable ({type(exc).__name__}: {exc})") from None
    return model, search
