"""Render a decision record (`tuner.decision.Decision`) into report.md, PNG plots, summary.json and the engine's
deployment files: the tuned list beside vLLM's default and the other lists compared, under vLLM's memory rule (its
graph-memory estimate, the real pool, the KV cache it sizes), with what the tuned list changes and what it risks.
Nothing here decides: every list, choice and interval comes from the record."""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
from pathlib import Path
from typing import Any

from tuner import __version__
from tuner.engines.engine import Engine
from tuner.decision.compare import kv_tokens, max_concurrency
from tuner.decision.record import Decision
from tuner.decision.run_dir import run_outputs
from tuner.model.costmodel import CostModel, Evaluation, crossover_width
from tuner.profile.host_cost import host_line
from tuner.report import decision
from tuner.report.load import load_lines
from tuner.report.plots import PLOTS, log_axis, profile_provenance, render_plots
from tuner.report.startup import startup_lines, synthetic_lines
from tuner.report.text import sizes_text

__all__ = [
    "PLOTS",
    "SUMMARY_KEYS",
    "log_axis",
    "profile_provenance",
    "render_markdown",
    "render_plots",
    "summary",
    "summary_json",
    "words_of",
    "write_run",
]

log = logging.getLogger(__name__)

MIB = 1 << 20
SUMMARY_KEYS = ("default", "tuned", "compact", "exact", "widest", "ideal")
"""Lists summary.json always holds, each with its latency, vLLM's graph-memory estimate, the real pool, the KV cache
vLLM sizes (bytes, tokens, max concurrency), the capture headroom, the list that runs, and `feasible`."""
VLLM_TYPICAL_KERNELS_PER_LAYER = "10-12"
"""Fused kernels one Llama decoder layer of vLLM launches eagerly (issue 11)."""
_NOISY_NOTE = "flagged noisy: IQR/median of the timing above 5%"


def words_of(engine: Engine) -> Any:
    """The module that words a run's report, summary and console lines for the engine's unit and rules
    (`Engine.report_words`: `tuner.report.vllm_words`, `tuner.report.request_words`), each asking the engine for its own
    words."""
    return importlib.import_module(engine.report_words)


# ---------------------------------------------------------------------------------------------- figures
def _meta(model: CostModel, profile_name: str | None = None) -> dict[str, Any]:
    """The run's provenance; `profile_name`: the profile the run was searched on, where the model now reads a copy
    (a re-render reads the run's own profile.csv)."""
    meta = model.profile.metadata
    return {
        "device_name": meta.get("device_name"),
        "profile": profile_name or (str(model.profile.path) if model.profile.path else None),
        "profile_command": meta.get("command"),
        "profile_created_at": meta.get("created_at"),
        "workload": {"name": model.workload.name, "hash": model.workload.content_hash},
    }


def _noise(model: CostModel) -> dict[str, Any]:
    decision = model.decision_widths()
    flagged = sorted(set(model.noisy_widths) & set(decision))
    return {"count": len(flagged), "decision_widths": len(decision), "share": model.noisy_share,
            "widths": flagged, "flagged_in_profile": len(model.noisy_widths)}


def _figures(model: CostModel, e: Evaluation) -> dict[str, Any]:
    """summary.json's figures of one list: every engine's, then the engine's own (the list in its unit)."""
    return {**_list_figures(model, e), **words_of(model.engine).figures(model, e)}


def _list_figures(model: CostModel, e: Evaluation) -> dict[str, Any]:
    return {
        "capture_sizes": list(e.capture_sizes),
        "runs_as": list(e.runs_as),
        "expected_step_ms": e.expected_step_ms,
        "per_token_ms": e.per_token_ms,
        "num_graphs": len(e.capture_sizes),
        "graphs_captured": e.num_graphs,
        "capture_s": decision.capture_s(model, e),
        "max_capture_size": model.engine.list_max(e.capture_sizes),
        "vllm_graph_estimate_bytes": e.graph_estimate_bytes,
        "vllm_graph_estimate_profiled_bytes": e.profiled_estimate_bytes,
        "graph_memory_bytes": e.graph_memory_bytes,
        "kv_available_bytes": e.kv_available_bytes,
        "kv_tokens": kv_tokens(model, e),
        "max_concurrency": max_concurrency(model, e),
        "kv_margin_bytes": e.kv_margin_bytes,
        "capture_headroom_bytes": e.capture_headroom_bytes,
        "drafter_step_ms": e.drafter_step_ms,
        "drafter_graph_bytes": e.drafter_graph_bytes,
        "starts": e.starts,
        "capture_fits": e.capture_fits,
        "feasible": e.feasible,
        "why_infeasible": e.why_infeasible,
    }


def summary(model: CostModel, dec: Decision, *, command: str = "", profile_name: str | None = None) -> dict[str, Any]:
    """summary.json, the decision record as JSON: each list's figures (`_figures`), vLLM's memory rule, what changed,
    off-peak figures, noise, the model settings, the compact choice and the saving's interval
    (`tuner.report.decision`), plus provenance."""
    b = model.budget
    table = dec.table
    meta = model.profile.metadata
    changed, peak = dec.changed, dec.off_peak
    out: dict[str, Any] = {name: _figures(model, e) for name, e in table.items()}
    out.update({
        "required_kv_bytes": b.required_kv_bytes,
        "capture_sizes": list(dec.tuned.capture_sizes),
        "runs_as": list(dec.tuned.runs_as),
        "source": dec.source,
        "engine": model.serving.engine,
        "model_runner": model.runner,
        "model_runner_requested": model.serving.model_runner,
        "runner_reason": model.engine.runner_reason,
        "cudagraph_mode": model.cudagraph_mode,
        "total_memory_bytes": b.total_memory_bytes,
        "requested_bytes": b.requested_bytes,
        "non_kv_cache_bytes": b.non_kv_cache_bytes,
        "estimate_cudagraph_memory": b.estimate_enabled,
        "kv_bytes_per_token": model.kv_bytes_per_token,
        "max_model_len": model.serving.max_model_len,
        # The engine's own fields: vLLM's estimate, log lines and gpu_memory_utilization; another engine's block.
        **words_of(model.engine).summary_block(model, table, shipped=(dec.ship.name, dec.ship.evaluation)),
        "what_changed": {
            "added": list(changed.added), "removed": list(changed.removed), "default_max": changed.default_max,
            # `key`: the size as the list holds it (vLLM 0.34: -n for n requests); `num_tokens`: its widest graph.
            "above_default_max": [{"key": c.num_tokens, "num_tokens": model.engine.list_max([c.num_tokens]),
                                   "vllm_graph_estimate_bytes": c.estimate_bytes,
                                   "graph_memory_bytes": c.real_bytes, "saved_ms": c.saved_ms}
                                  for c in changed.above_max],
        },
        "off_peak": {"default_step_ms": peak.default_step_ms, "tuned_step_ms": peak.tuned_step_ms,
                     "tuned_slower": peak.tuned_slower, "one_request_width": peak.one_request_width,
                     "default_pads_to": peak.default_pads_to, "tuned_pads_to": peak.tuned_pads_to},
        "noisy_widths": _noise(model),
        "outliers": [vars(o) | {"dropped": not model.allow_outliers} for o in model.outliers],
        "cost_model": model.settings(),
        "eager_step_ms": model.eager_step_ms(),
        "crossover_width": crossover_width(model.profile),
        "profile_measured": profile_provenance(model)[0],
        "compiled": meta.get("compiled"),
        "compile_s": meta.get("compile_s"),
        "eager_kernels_per_layer": meta.get("eager_kernels_per_layer"),
        "study": {"name": dec.study_name, "storage": dec.storage, "objective": dec.objective,
                  **dec.trials, "gap_to_exact": dec.gap},
        "exact_memory_unit_bytes": dec.exact.memory_unit_bytes,
        "exact_memory": dec.exact.exact_memory,
        "exact_resource": dec.exact.resource,
        "exact_lower_bound_ms": dec.exact.lower_bound_ms,
        "exact_gap_bound": dec.exact.gap,
        "exact_stopped_early": dec.exact.stopped_early,
        "exact_unproven": list(dec.exact.unproven),
        "notes": list(dec.notes),
        "timings": dict(dec.timings),
        **({"load": dec.load.as_dict()} if dec.load is not None else {}),
        "cgtune_version": __version__,
        "command": command or None,
        **decision.summary_fields(model, dec),
        **_meta(model, profile_name),
    })
    return out


# ---------------------------------------------------------------------------------------------- markdown
def _provenance_lines(model: CostModel, profile_name: str | None = None) -> list[str]:
    meta = _meta(model, profile_name)
    measured, origin = profile_provenance(model)
    made = f"made by `{meta['profile_command']}`" if meta["profile_command"] else "command not recorded"
    if meta["profile_created_at"]:
        made += f" at {meta['profile_created_at']}"
    device = (f"**{meta['device_name']}**" if measured else
              f"**none: synthetic/hand-made profile, not a measurement** (device_name: {meta['device_name']!r})")
    md = model.profile.metadata
    compiled = md.get("compiled")
    if compiled is True:
        compile_s = md.get("compile_s")
        step = "compiled with torch.compile, as vLLM runs it" + (
            f" (compiling took {compile_s:.1f} s, once per sweep)" if isinstance(compile_s, int | float) else "")
    elif compiled is False:
        step = "plain eager PyTorch, not compiled (vLLM's -O0 / enforce_eager)"
    else:
        step = "compile setting not recorded"
    kernels = md.get("eager_kernels_per_layer")
    kernels_text = (f"{kernels:g} CUDA kernels per layer in one eager step" if isinstance(kernels, int | float)
                    else "CUDA kernels per layer not recorded")
    s = model.serving
    host = host_line(md)
    return [
        f"- device: {device}; profile `{meta['profile']}` ({made})",
        f"- eager baseline: {step}; {kernels_text} (vLLM's Llama layer: about {VLLM_TYPICAL_KERNELS_PER_LAYER} "
        f"fused kernels)" + (f"; {host}" if host else ""),
        f"- workload: `{model.workload.name}` (hash {model.workload.content_hash}), q = {model.q}, "
        f"{model.engine.field_name('max_num_seqs')} {s.max_num_seqs}, "
        f"{model.engine.field_name('max_model_len')} {s.max_model_len}",
        words_of(model.engine).provenance_line(model),
    ]


def _noise_line(model: CostModel) -> str:
    n = _noise(model)
    if not n["decision_widths"]:
        return "- timing noise: no decision widths"
    line = (f"- timing noise: {n['count']} of the {n['decision_widths']} widths the decision rests on "
            f"({n['share']:.0%}) are {_NOISY_NOTE}")
    if n["count"]:
        line += f" ({sizes_text(n['widths'], 12)})"
    if n["share"] > 0.25:
        line += "; **more than a quarter: treat the choice with care (searched with --allow-noisy)**"
    return line


def _source_lines(dec: Decision) -> list[str]:
    """How the tuned list was found: the study's best within 1% of the exact optimum, or the exact answer, and why."""
    why = decision.ship_reason(dec.source, dec.gap, dec.exact.exact_memory)
    return [why] if why else []


def _off_peak_lines(model: CostModel, dec: Decision) -> list[str]:
    p = dec.off_peak
    change = p.tuned_step_ms / p.default_step_ms - 1 if p.default_step_ms > 0 else 0.0
    lines = [
        "## Off-peak traffic",
        "",
        f"Under off-peak decode traffic alone (uniform over 1..{model.serving.max_num_seqs} requests, "
        f"{model.engine.field_name('max_num_seqs')}), the expected "
        f"step is {p.tuned_step_ms:.4f} ms with the tuned list vs {p.default_step_ms:.4f} ms with "
        f"{model.engine.default_name} "
        f"({change:+.1%}).",
    ]

    def pads(x: int | None) -> str:
        return "runs eager" if x is None else f"replays the {x}-token graph"

    if p.tuned_slower:
        padding = ("" if p.tuned_pads_to == p.default_pads_to else
                   f" A one-request decode step ({p.one_request_width} token{'s' if p.one_request_width > 1 else ''}) "
                   f"{pads(p.tuned_pads_to)} under the tuned "
                   f"list and {pads(p.default_pads_to)} under the default.")
        lines += ["", f"**Warning: the tuned list is slower than {model.engine.default_name} off-peak.**"
                      f"{padding} "
                      f"`cgtune tune --off-peak-weight W` mixes a share W of this traffic into the objective, to buy "
                      f"robustness explicitly."]
    weight = model.off_peak_weight
    lines += ["", f"This search weighed {weight:.0%} off-peak traffic into its objective (`--off-peak-weight "
                  f"{weight:g}`)." if weight else "This search weighed the workload's traffic alone "
                  "(`--off-peak-weight 0`).", ""]
    return lines


def _exact_line(dec: Decision) -> str:
    ex = dec.exact
    axis = "vLLM's graph-memory estimate" if ex.resource == "estimate" else "the real graph pool"
    unit = f"{ex.memory_unit_bytes:,} B" + (f" ({ex.memory_unit_bytes / MIB:.3f} MiB)"
                                            if ex.memory_unit_bytes >= MIB // 16 else "")
    if ex.exact_memory:
        how = "every memory figure is a whole number of units, so its answer is the proven optimum"
    else:
        how = ex.caveat
    return f"- exact solver: {ex.num_candidates} candidate widths; it counted {axis} in units of {unit}: {how}"


def _first_lines(model: CostModel, dec: Decision) -> list[str]:
    """A synthetic profile and the shipped list's start-up cost, before anything else (`tuner.report.startup`)."""
    return [*synthetic_lines(model), *(f"- {line}" for line in startup_lines(model, dec)), ""]


def render_markdown(model: CostModel, dec: Decision, *, command: str = "", plots_dir: str = "plots",
                    profile_name: str | None = None) -> str:
    """report.md text (`profile_name`: as `_meta`)."""
    words = words_of(model.engine)
    table = dec.table
    # How the list was found, how sure its saving is and the compact list beside it: every engine's words alike.
    how_found = _source_lines(dec) + decision.decision_lines(model, dec)
    lines = [f"# cgtune report: {model.workload.name}", "", *_first_lines(model, dec),
             *_provenance_lines(model, profile_name),
             *words.memory_rule_lines(model, table), _noise_line(model),
             f"- made by cgtune {__version__}" + (f" with `{command}`" if command else ""), "", "## Decision", "",
             *words.decision_lines(model, table, dec.source, how_found,
                                   shipped=(dec.ship.name, dec.ship.evaluation)), ""]
    cross = crossover_width(model.profile)
    lines += [
        "Crossover: " + (f"from **{cross} tokens** on, a FULL graph saves less than 2% of the eager step (the GPU "
                         f"work of a step hides its CPU launch cost)." if cross is not None else
                         "a FULL graph saves at least 2% of the eager step at every measured width."),
        "",
        *words.what_changed_lines(model, dec),
        *_off_peak_lines(model, dec),
        *words.side_by_side_lines(model, dec),
        *(load_lines(model, dec.load, _load_name(dec)) if dec.load is not None else []),
        "## Search",
        "",
        (f"- study `{dec.study_name}` in `{dec.storage}` (objective {dec.objective}): "
         + ", ".join(f"{k} {v}" for k, v in dec.trials.items()) if dec.trials else
         "- no optuna study: the exact solver's answer is the tuned list"),
        _exact_line(dec),
        "",
        "## Lists",
        "",
    ]
    lines += words.list_lines(model, table)
    # The exact solver's caveat is stated once, in the Search section; the search's own note says it again.
    notes = [n for n in dec.notes if not n.startswith("the exact solver's answer fits both memory conditions")]
    if notes:
        lines += ["", "## Assumptions and notes", ""] + [f"- {n}" for n in notes]
    _, origin = profile_provenance(model)
    lines += ["", "## Plots", "", f"Profile numbers in every plot: {origin}.", ""]
    captions = ["Eager vs graph latency by width (tuned widths marked)",
                "Graph memory by width (tuned widths marked)",
                "Step widths: decode steps zoomed, mixed steps on their own axis",
                "Latency vs graph memory (Pareto front)"]
    lines += [f"![{c}]({plots_dir}/{p})" for c, p in zip(captions, PLOTS)]
    lines += ["", words.files_line(model), ""]
    return "\n".join(lines)


def _load_name(dec: Decision) -> str:
    """The shipped list's name among the load figures' lists (`tuned` for the fastest)."""
    return "compact" if dec.ship.name == "compact" else "tuned"


def summary_json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, default=str) + "\n"


# ---------------------------------------------------------------------------------------------- run directory
def _with_list(model: CostModel, provenance: Any, name: str, why: str, e: Evaluation) -> Any:
    """The files' provenance with which list they carry and why."""
    import dataclasses

    label = "compact list" if name == "compact" else "fastest (tuned) list"
    return dataclasses.replace(provenance, extra={
        "list": f"the {label}, {model.engine.list_shape(e.capture_sizes, short=True)}: {why}",
        **provenance.extra, "expected_step_ms": f"{e.expected_step_ms:.4f} under the cgtune cost model"})


def _relative_inputs(spec: dict[str, Any]) -> list[str]:
    """The files a workload names relative to itself (the traffic trace, the model's config.json, the load's arrivals)
    that a run directory can hold at the same relative path (no `..`)."""
    traffic = spec.get("traffic") or {}
    model = spec.get("model") or {}
    load = traffic.get("load") if isinstance(traffic, dict) else None
    given = [traffic.get("trace") if isinstance(traffic, dict) else None,
             model.get("config") if isinstance(model, dict) else None,
             load.get("arrivals") if isinstance(load, dict) else None]
    return [g for g in given if isinstance(g, str) and not Path(g).is_absolute() and ".." not in Path(g).parts]


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
        for given in _relative_inputs(wl.spec):
            src_file = wl.path.parent / given
            if src_file.is_dir():  # model.config may name the directory of a config.json
                given, src_file = str(Path(given) / "config.json"), src_file / "config.json"
            if src_file.is_file():
                (staging / given).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src_file, staging / given)
    else:
        import yaml

        (staging / "workload.yaml").write_text(yaml.safe_dump(wl.spec, sort_keys=False))


def write_run(run_dir: str | Path, model: CostModel, dec: Decision, *, command: str = "",
              plots: bool = True, report: bool = True, copy_inputs: bool = True,
              profile_name: str | None = None, kv_pin: dict[str, Any] | None = None) -> list[Path]:
    """Write every output file of a run from its decision record (`tuner.decision.decide`): rendered in a staging
    folder inside run_dir, then moved into place,
    so an error or interruption never leaves a half-written report beside a finished one. `command`: the command
    that made the run; `profile_name`: the profile it was searched on, where the model reads a copy (`cgtune
    report` passes both as the run's summary.json records them, so a re-render says what the run said). `kv_pin`:
    the KV cache the shipped files pin (`cgtune validate --pin-kv`: {"bytes", "capture_sizes", "how"}); by default
    the one the run recorded, while it is of the list shipped."""
    import datetime
    import os
    import shutil
    import tempfile

    from tuner.engines.vllm.emit import Provenance

    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".cgtune-staging-", dir=run))
    try:
        if copy_inputs:
            _copy_inputs(staging, model)
        data = summary(model, dec, command=command, profile_name=profile_name)
        pin = _kv_pin(run, dec.ship.evaluation.capture_sizes, kv_pin)
        data["kv_pin"] = pin
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        provenance = Provenance(
            __version__, data["profile"] or "?", str(data["device_name"]),
            f"{model.workload.name} ({model.workload.content_hash})", now,
            {"source": dec.source, "expected_step_ms": f"{dec.tuned.expected_step_ms:.4f} "
             f"({model.engine.list_label('default')} {dec.default.expected_step_ms:.4f}) under the cgtune cost "
             f"model"},
            release=model.engine.release_words,
        )
        # The engine's own files, its list in its own unit (EmitError: one line): the shipped list's under the engine's
        # names, the other list's beside them under names that say which it is.
        ship = dec.ship
        deployment = model.workload.deployment
        if pin is not None:  # the shipped list's files only: the KV cache was measured for that list
            deployment = dataclasses.replace(deployment, kv_cache_memory_bytes=int(pin["bytes"]))
        files = model.engine.render_files(ship.evaluation.capture_sizes, deployment,
                                          cudagraph_mode=model.cudagraph_mode,
                                          provenance=_with_list(model, provenance, ship.name, ship.why,
                                                                ship.evaluation))
        if ship.other is not None:
            other_name, other = ship.other
            alt = model.engine.render_files(other.capture_sizes, model.workload.deployment,
                                            cudagraph_mode=model.cudagraph_mode,
                                            provenance=_with_list(model, provenance, other_name,
                                                                  f"not shipped; the {ship.name} list is ({ship.why})",
                                                                  other))
            renamed = {name: decision.alternative_name(name, other_name) for name in alt}
            for name, text in alt.items():
                # The files name each other (`usage: vllm serve --config vllm-serve.yaml`): point them at their own set.
                for standard, own in renamed.items():
                    text = text.replace(standard, own)
                files[renamed[name]] = text
        files["search.json"] = json.dumps(dec.search_record, indent=2) + "\n"
        files["summary.json"] = summary_json(data)
        validation: dict[str, Any] | None = None
        if report:
            files["report.md"] = render_markdown(model, dec, command=command, profile_name=profile_name)
            from tuner.report.validation import section_for_run  # keeps `cgtune validate`'s section on re-render

            if section := section_for_run(run, dec.tuned.capture_sizes):
                files["report.md"] += "\n" + section
                validation = json.loads((run / "validation.json").read_text())
        for name, text in files.items():
            (staging / name).write_text(text)
        if plots:
            render_plots(model, dec, staging / "plots")
        if validation is not None:  # the kept section shows this plot: render it with the rest, not left over
            from tuner.report.validation import PLOT, render_plot

            (staging / "plots").mkdir(exist_ok=True)
            render_plot(validation, staging / "plots" / PLOT)
        written = []
        for path in sorted(staging.rglob("*")):
            if path.is_file():
                target = run / path.relative_to(staging)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(path, target)
                written.append(target)
        _remove_stale(run, written)
        return written
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _kv_pin(run: Path, sizes: tuple[int, ...], given: dict[str, Any] | None) -> dict[str, Any] | None:
    """The KV pin of the shipped list: `given`, else the one the run's summary.json records; None when it is of
    another list (a pin is what the engine measured for one list)."""
    from tuner.decision.run_dir import recorded_summary

    pin = given if given is not None else recorded_summary(run).get("kv_pin")
    return pin if isinstance(pin, dict) and list(pin.get("capture_sizes", ())) == list(sizes) else None


def _remove_stale(run: Path, written: list[Path]) -> list[Path]:
    """Remove the outputs an earlier run left that this one did not write (report.md after a `search`, a plot this
    run does not draw), so every output in the directory describes the same run."""
    keep = set(written)
    stale = [run / name for name in run_outputs() if (run / name).is_file() and run / name not in keep]
    plots = run / "plots"
    if plots.is_dir():
        stale += [p for p in sorted(plots.glob("*.png")) if p not in keep]
    for path in stale:
        path.unlink(missing_ok=True)
    if stale:
        log.info("removed outputs of an earlier run: %s", ", ".join(str(p.relative_to(run)) for p in stale))
    if plots.is_dir() and not any(plots.iterdir()):
        plots.rmdir()
    return stale
