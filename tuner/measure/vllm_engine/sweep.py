"""The profile measured through vLLM itself: its engine built in this process for the workload, with the widths as its
capture list; then, in its worker, each width's step as vLLM's own runner runs it (eager, and on CUDA replaying the
PIECEWISE and FULL graphs vLLM captured), the LM head alone, the graph memory of every capture in vLLM's order and pool,
and the KV bytes per token from vLLM's own KV-cache spec. A model-based drafter (EAGLE, EAGLE3, DFlash, a draft model,
MTP) is built by vLLM beside the target from a config.json of its shape: the target's rows are timed without its pass,
and its own rows (`drafter_eager`, and `drafter_piecewise` / `drafter_full` where vLLM captures its graphs) are timed
by vLLM's own drafter pass at the drafter's widths. Writes the same profile table as the stand-in, after every width;
under tensor parallelism every rank runs each step (with its all-reduce) and the slowest rank's figure is kept."""

from __future__ import annotations

import datetime as _dt
import logging
import re
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tuner.measure.drafter import DrafterPlan, drafter_plan
from tuner.measure.memory import device_metadata
from tuner.measure.profile import (
    CAPTURE_ORDER,
    SWEEP_MODES,
    ProfileResult,
    SweepOptions,
    error_text,
    resume_rows,
    validate_sizes,
)
from tuner.measure.vllm_engine import api, engine
from tuner.measure.vllm_engine import worker as _worker
from tuner.engines.vllm.lora import capture_cases
from tuner.profile.table import ProfileRow, lora_mode, mode_order, write_metadata, write_profile
from tuner.workload.spec import Workload

__all__ = ["CPU_GRAPHS", "VLLM_DRAFTER_NOTE", "drafter_rows_for_width", "pool_timings", "profile_through_vllm",
           "rows_for_width", "shutdown_engine"]

log = logging.getLogger(__name__)

CPU_GRAPHS = "vLLM's CPU build captures no CUDA graphs (platforms/cpu.py empties cudagraph_capture_sizes, mode NONE)"
EAGER_GRAPHS = "the engine ran with enforce_eager (serving.enforce_eager or --no-compile): vLLM captures no graphs"
VLLM_DRAFTER_NOTE = (
    "drafter rows: vLLM's own drafter pass over that many tokens (V1: the drafter's dummy_run for one forward pass, "
    "as its dummy step and its graph capture run it; V2: the speculator's _run_model, and for drafter_full a replay "
    "of the FULL graph its step-0 manager captured, logits and sampling of its requests inside), eagerly and "
    "replaying the graphs vLLM captured for it, then the drafter's LM head over the pass's tokens (not after a V2 "
    "FULL replay); like vLLM's dummy pass it builds no attention metadata, so the drafter's attention over its KV "
    "cache is not in the rows. The target's rows are timed with the drafter's pass replaced by a no-op "
    "(drafter_calls_skipped per timing)")
"""What the drafter rows of a profile measured through vLLM are, in one line, for the metadata."""


def rows_for_width(w: int, timings: Sequence[dict[str, Any]], captured: dict[tuple[str, int], int | None],
                   graphs_reason: str | None) -> tuple[list[ProfileRow], dict[str, Any]]:
    """The profile rows of width `w` from every rank's timings (the slowest rank's median in each mode, its IQR with
    it) and the graph memory vLLM's captures read (`captured`: (mode, width) -> free-memory drop); graph modes are
    `unsupported` with `graphs_reason` when no graphs exist, or where vLLM captured no graph of that mode at `w`."""
    return _width_rows(w, timings, captured, graphs_reason, SWEEP_MODES)


def drafter_rows_for_width(w: int, timings: Sequence[dict[str, Any]], captured: dict[tuple[str, int], int | None],
                           graphs_reason: str | None, graph_modes: Sequence[str]) -> tuple[list[ProfileRow],
                                                                                            dict[str, Any]]:
    """The drafter's rows of width `w` from every rank's timings (keyed `eager`, `piecewise`, `full`; the slowest
    rank's median), as `rows_for_width` makes the target's: `drafter_<mode>` for each of `graph_modes` is
    `unsupported` without graphs or where vLLM captured no drafter graph of that mode at `w` (`captured`:
    (row mode, width) -> free-memory drop)."""
    return _width_rows(w, timings, captured, graphs_reason, ("eager", *graph_modes), prefix="drafter_")


def _width_rows(w: int, timings: Sequence[dict[str, Any]], captured: dict[tuple[str, int], int | None],
                graphs_reason: str | None, modes: Sequence[str], prefix: str = "") -> tuple[list[ProfileRow],
                                                                                        dict[str, Any]]:
    """Rows `prefix + mode` of width `w` for each of `modes` (the timings' keys, and the detail's)."""
    detail: dict[str, Any] = {}
    rows = []
    for base in modes:
        mode, graph = prefix + base, base in ("full", "piecewise")
        if graph and (graphs_reason is not None or (mode, w) not in captured):
            rows.append(ProfileRow(w, mode, "unsupported"))
            detail[f"{base}_unsupported"] = (graphs_reason or f"vLLM captured no {prefix.replace('_', ' ')}"
                                                              f"{base.upper()} graph of {w} tokens")
            continue
        got = [t[base] for t in timings if base in t]
        errors = [g["error"] for g in got if "error" in g]
        delta = captured.get((mode, w)) if graph else None
        if errors or not got:
            rows.append(ProfileRow(w, mode, "error", capture_delta_bytes=delta))
            detail[f"{base}_error"] = errors[0] if errors else "no rank timed it"
            continue
        slowest = max(got, key=lambda g: g["median_ms"])
        detail[base] = slowest if len(got) == 1 else {**slowest, "ranks_median_ms": [g["median_ms"] for g in got]}
        rows.append(ProfileRow(w, mode, "ok", latency_ms=slowest["median_ms"], latency_iqr_ms=slowest["iqr_ms"],
                               capture_delta_bytes=delta))
    return rows, detail


def pool_timings(before: Sequence[dict[str, Any]] | None, now: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every rank's timings of one width over the rounds so far: each mode's samples pooled, its median, IQR and noise
    recomputed over them (`tuner.measure.timing.Measurement`); a mode that failed in any round stays failed."""
    from tuner.measure.timing import Measurement

    if before is None:
        return [dict(t) for t in now]
    out = []
    for old, new in zip(before, now):
        merged = dict(old)
        for mode, got in new.items():
            prev = old.get(mode)
            if prev is None or "error" in prev or "error" in got:
                merged[mode] = prev if prev is not None and "error" in prev else got
                continue
            m = Measurement(tuple(prev["samples_ms"]) + tuple(got["samples_ms"]),
                            warmup_reps=prev["warmup_reps"] + got["warmup_reps"])
            merged[mode] = {"median_ms": m.median_ms, "iqr_ms": m.iqr_ms, "noisy": m.noisy,
                            "warmup_reps": m.warmup_reps, "samples_ms": list(m.samples_ms)}
            if "drafter_calls_skipped" in prev or "drafter_calls_skipped" in got:
                merged[mode]["drafter_calls_skipped"] = (prev.get("drafter_calls_skipped", 0)
                                                         + got.get("drafter_calls_skipped", 0))
        out.append(merged)
    return out


def _captured(captures: Sequence[dict[str, Any]], decode_query_len: int) -> dict[tuple[str, int], int | None]:
    """(mode, width) -> the free-memory drop of vLLM's real capture of it: FULL rows take the uniform-decode graph of
    the width, PIECEWISE the mixed one. vLLM captures a sample of the graphs once before, for its memory estimate
    (both runners' `profile_cudagraph_memory`, into a pool it then frees), so the last capture of each is the real
    one. The drafter's captures are not the target's (`_drafter_captured`)."""
    out: dict[tuple[str, int], int | None] = {}
    for c in captures:
        mode = c["mode"]
        if c.get("owner", "target") != "target" or (mode == "full" and not c["uniform"] and decode_query_len > 1):
            continue
        out[(mode, c["num_tokens"])] = c["free_delta_bytes"]
    return out


def _drafter_captured(captures: Sequence[dict[str, Any]]) -> dict[tuple[str, int], int | None]:
    """(drafter row mode, width) -> the free-memory drop of vLLM's real capture of the drafter's graph at that width:
    V1's PIECEWISE graphs (captured inside the target's of the same width, read apart from it), V2's step-0 (or DFlash
    query-pass) graphs, FULL rows the uniform ones. V2 EAGLE's one-token decode graphs are in the metadata's
    captures, not in rows (the rows keep the target's query structure, as the stand-in's). Last capture wins, as for
    the target's."""
    out: dict[tuple[str, int], int | None] = {}
    for c in captures:
        if c.get("owner") != "drafter" or c.get("role", "prefill") != "prefill":
            continue
        if c["mode"] not in ("piecewise", "full") or (c["mode"] == "full" and not c["uniform"]):
            continue
        out[(f"drafter_{c['mode']}", c["num_tokens"])] = c["free_delta_bytes"]
    return out


def _largest(per_rank: Iterable[dict[tuple[str, int], int | None]]) -> dict[tuple[str, int], int | None]:
    """Each graph's memory on the rank where it took most (under tensor parallelism every rank captures each)."""
    out: dict[tuple[str, int], int | None] = {}
    for captured in per_rank:
        for key, value in captured.items():
            old = out.get(key)
            out[key] = value if old is None else old if value is None else max(old, value)
    return out


def _startup_figures(lines: list[str]) -> dict[str, Any]:
    """What vLLM's own start-up log said: its KV tokens, the graph-memory estimate and the pool it measured, and its
    non-KV memory (requested - available KV - estimate), in its printed units; {} when no start-up line was read."""
    from tuner.engines.vllm.startup_log import GIB, LogError, parse_startup_log

    try:
        log_ = parse_startup_log("\n".join(lines), "vLLM's start-up log")
    except LogError:
        return {}
    w = log_.workers[0] if log_.workers else None
    out: dict[str, Any] = {"kv_tokens": log_.kv_tokens, "max_concurrency": log_.max_concurrency,
                           "capture_sizes": list(log_.capture_sizes), "runner_logged": log_.runner}
    if w is not None:
        out.update(kv_available_gib=w.kv_available_gib, pool_actual_gib=w.pool_actual_gib,
                   pool_estimated_gib=w.pool_estimated_gib, v1_estimate_gib=w.v1_estimate_gib,
                   requested_gib=w.requested_gib, real_capture=w.real_capture)
        estimate = w.pool_estimated_gib if w.pool_estimated_gib is not None else w.v1_estimate_gib
        if w.requested_gib is not None and w.kv_available_gib is not None:
            out["non_kv_cache_bytes"] = int((w.requested_gib - w.kv_available_gib - (estimate or 0.0)) * GIB)
    cpu_space = next((line for line in lines if "GiB for KV cache" in line), None)
    if cpu_space:
        out["cpu_kv_space_line"] = cpu_space
    return out


def profile_through_vllm(workload: Workload, out_dir: str | Path, *, widths: Sequence[int], device: str = "cuda",
                         compile: bool | None = None, options: SweepOptions | None = None, name: str | None = None,
                         command: str = "", resume: bool = True, seed: int = 0, progress: bool = True,
                         any_version: bool = False, rounds: int = 1,
                         drafter_widths: Sequence[int] | None = None) -> ProfileResult:
    """Profile `widths` of the workload through the installed vLLM (see the module docstring) and write
    `out_dir/<name>.csv` and `.json` after every width; rerunning resumes from the widths done. `rounds` > 1
    interleaves the widths (each round times all of them with its share of the budget, samples pooled). A model-based
    drafter's rows are measured at `drafter_widths` (default: `tuner.measure.drafter.drafter_plan`'s, the sweep's
    widths and the widths its N-token passes pad to, as the stand-in measures them). ValueError (one line) for a vLLM
    version the adapter was not written for (unless `any_version`) or a workload it cannot measure yet."""
    options = options or SweepOptions()
    out_dir, name = Path(out_dir), name or workload.name
    compile = (not workload.serving.enforce_eager) if compile is None else compile
    version, dist = api.installed_version()
    try:
        api.check_version(version, any_version=any_version)
    except api.VersionError as exc:
        raise ValueError(str(exc)) from None
    reason = engine.unsupported_reason(workload)
    if reason:
        raise ValueError(f"--backend vllm: {reason}")
    requested = validate_sizes(widths, workload)
    plan = drafter_plan(workload, requested,
                        widths=None if drafter_widths is None else validate_sizes(drafter_widths, workload))
    s = workload.serving
    started = time.perf_counter()
    meta: dict[str, Any] = {
        **device_metadata(device),
        "workload": {"name": workload.name, "hash": workload.content_hash,
                     "path": str(workload.path) if workload.path else None},
        "model": {"preset": workload.model.preset, "shape": workload.model.shape.as_dict(),
                  "dtype": workload.model.dtype, "tensor_parallel_size": workload.model.tensor_parallel_size,
                  "config": workload.model.config_path},
        "compiled": compile, "capture_order": CAPTURE_ORDER, "context_len": workload.traffic.mean_context_len,
        "decode_query_len": s.decode_query_len, "command": command,
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    backend: dict[str, Any] = {"name": "vllm", "version": version, "distribution": dist,
                               "version_checked": version in api.ADAPTER_VERSIONS}
    meta["backend"] = backend  # a table another backend or vLLM version measured is not resumed into this one
    done, drafter_done, old_meta = (resume_rows(out_dir, name, meta, ("drafter_eager",) if plan else ()) if resume
                                    else ({}, {}, {}))
    pending = [w for w in sorted(requested, reverse=True) if w not in done]

    with engine.scratch_dir() as scratch:
        model, how = engine.model_source(workload, scratch)
        draft = engine.draft_source(workload, scratch)
        args = engine.engine_args(workload, model, requested, device=device, compile=compile, seed=seed,
                                  draft_model=draft)
        lines = engine.StartupLines()
        log.info("building vLLM %s's engine for %s (%s)", version, workload.name, how)
        t0 = time.perf_counter()
        with engine.environment(engine.engine_environment(workload, device, scratch)):
            from vllm import LLM  # imported first: vLLM configures its loggers at import, dropping other handlers

            with lines.attached():
                try:
                    llm = LLM(**args)
                except Exception as exc:  # vLLM refusing the configuration, a model it cannot build: one line
                    raise ValueError(f"--backend vllm: vLLM {version} could not build the engine for "
                                     f"{workload.name} ({error_text(exc)})") from None
        startup_s = time.perf_counter() - t0
        try:
            return _measure(llm, workload, out_dir, name, meta, backend, old_meta, done, pending, requested, options,
                            device=device, compile=compile, started=started, startup_s=startup_s, how=how, args=args,
                            lines=lines.lines, progress=progress, rounds=rounds, plan=plan,
                            drafter_done=drafter_done)
        finally:
            shutdown_engine(llm, lines.lines)


def _lora_modes(workload: Workload, device: str, runner: str, graphs_reason: str | None) -> list[str]:
    """The LoRA cases' row modes the sweep times (`tuner.profile.table.lora_mode`): each case the runner captures
    graphs for besides 0, eagerly and in each graph mode; none where the engine was built without LoRA."""
    if not engine.measures_lora(workload, device) or runner != "v1":
        return []
    bases = ("eager",) if graphs_reason else ("eager", "piecewise", "full")
    return [lora_mode(c, b) for c in capture_cases(workload.serving.lora, "v1") if c for b in bases]


def _lora_meta(workload: Workload, llm: Any, modes: Sequence[str]) -> dict[str, Any]:
    """The profile's `lora` block: the settings the engine ran, the LoRA weight buffers vLLM allocated (inside its
    non-KV memory), and what the LoRA rows are."""
    lora = workload.serving.lora
    assert lora is not None
    return {"max_loras": lora.max_loras, "max_lora_rank": lora.max_lora_rank,
            "specialize_active_lora": lora.specialize_active_lora,
            "cudagraph_specialize_lora": lora.cudagraph_specialize_lora, "modes": list(modes),
            "weights_bytes": max(llm.collective_rpc(_worker.lora_weights_bytes)),
            "rows": "lora<c>_<mode>: vLLM V1's dummy step with c dummy adapters selected (its LoRA case c), eagerly and "
                    "replaying the graphs vLLM captured for case c, then the LM head; the LoRA graphs' memory is not "
                    "read per case (each costs as its width's graph without LoRA)"}


def _drafter_meta(workload: Workload, plan: DrafterPlan, drafter: dict[str, Any] | None, runner: str,
                  graph_modes: Sequence[str], kv_tokens: int | None) -> dict[str, Any]:
    """The profile's `drafter` block (the stand-in's keys, `tuner.measure.drafter.DrafterPlan.metadata`), with vLLM's
    own figures: the drafter's parameter bytes as vLLM loaded it (what it shares with the target counted once, in the
    target's `weights_bytes`), its KV layers and bytes per token from vLLM's KV-cache spec (already inside the
    profile's `kv_cache.bytes_per_token`, the figure the cost model reads: not to be added again), the runner vLLM
    ran it in and the graph modes it captured it in."""
    kv = (drafter or {}).get("kv_cache") or {}
    out = plan.metadata()
    out.update(
        weights_bytes=(drafter or {}).get("weights_bytes"), kv_layers=kv.get("layers", plan.kv_layers),
        kv_bytes_per_token=kv.get("bytes_per_token"),
        kv_cache_bytes=kv_tokens * kv["bytes_per_token"] if kv_tokens and kv.get("bytes_per_token") else None,
        kv_cache="the drafter's KV layers are in the profile's kv_cache (bytes_per_token, kv_cache_bytes) and share "
                 "its blocks: kv_cache_bytes here is their share, not more",
        runner=runner, runner_workload=plan.runner, graph_modes=list(graph_modes),
        drafter_class=(drafter or {}).get("class"), config=engine.drafter_config(workload),
        model_source="config.json written from speculative.drafter and the target's config (dummy weights)",
        note=VLLM_DRAFTER_NOTE)
    return out


def _measure(llm: Any, workload: Workload, out_dir: Path, name: str, meta: dict[str, Any], backend: dict[str, Any],
             old_meta: dict[str, Any], done: dict[int, list[ProfileRow]], pending: list[int], requested: list[int],
             options: SweepOptions, *, device: str, compile: bool, started: float, startup_s: float, how: str,
             args: dict[str, Any], lines: list[str], progress: bool, rounds: int, plan: DrafterPlan | None = None,
             drafter_done: dict[int, list[ProfileRow]] | None = None) -> ProfileResult:
    s = workload.serving
    ranks = llm.collective_rpc(_worker.describe)
    first = ranks[0]
    by_rank = llm.collective_rpc(_worker.captures)
    captures = by_rank[0]
    graphs_reason = CPU_GRAPHS if device == "cpu" else None if compile else EAGER_GRAPHS
    captured = _largest(_captured(c, s.decode_query_len) for c in by_rank)
    drafter_captured = _largest(_drafter_captured(c) for c in by_rank)
    startup = _startup_figures(lines)
    kv = dict(first["kv_cache"])
    drafter = first.get("drafter")
    if plan is not None and drafter is None:
        raise ValueError(f"--backend vllm: vLLM {backend['version']} built {workload.name} without a model-based "
                         f"drafter for speculative.method {plan.method} (its runner has none)")
    if drafter is not None:
        kv.update(drafter_layers=drafter["kv_cache"]["layers"],
                  drafter_bytes_per_token=drafter["kv_cache"]["bytes_per_token"],
                  target_bytes_per_token=kv["bytes_per_token"] - drafter["kv_cache"]["bytes_per_token"],
                  source=kv["source"] + ", the drafter's layers included (vLLM gives them KV cache in the same blocks)")
    backend.update(runner=first["runner"], runner_class=first["runner_class"],
                   attention_backend=", ".join(first["attention_backends"]) or None, model_source=how,
                   startup_s=round(startup_s, 3), engine_args={k: v for k, v in args.items() if k != "model"},
                   ranks=len(ranks))
    meta.update(
        backend=backend, weights_bytes=first["weights_bytes"], kv_cache=kv,
        kv_cache_bytes=startup["kv_tokens"] * kv["bytes_per_token"] if startup.get("kv_tokens") else None,
        attention_kernel=backend["attention_backend"], compile_s=None,
        graphs=graphs_reason or "vLLM's own capture (its order and pool), the widths as cudagraph_capture_sizes",
        piecewise=graphs_reason or "vLLM's PIECEWISE graphs (compiled, split at its splitting ops)",
        logits="logits rows: the LM head alone over the width's tokens; eager, piecewise and full rows run vLLM's step "
               "and then the LM head over the width's own tokens",
        timing={"clock": "CudaEventClock" if device == "cuda" else "WallClock", "warmup_ms": options.warmup_ms,
                "rep_ms": options.rep_ms, "min_reps": options.min_reps, "max_reps": options.max_reps,
                "rounds": rounds},
        widths_requested=requested, vllm_startup=startup, vllm_captures=captures,
        non_kv_cache_bytes=startup.get("non_kv_cache_bytes"), activation_peak_bytes=None,
        non_kv={"source": "vLLM's start-up log: requested - available KV - graph-memory estimate (0.01 GiB steps)"
                          + (" (the drafter's weights and pass inside, as vLLM loads and profiles it in the same block)"
                             if drafter is not None else "")}
        if startup.get("non_kv_cache_bytes") is not None else None,
        first_created_at=old_meta.get("first_created_at", old_meta.get("created_at", meta["created_at"])),
    )
    if device == "cuda":
        import torch

        meta["free_memory_bytes"] = int(torch.cuda.mem_get_info()[0])
    # The drafter's rows: eager always, and each graph mode the workload's runner captures it in or vLLM captured.
    drafter_modes: tuple[str, ...] = ()
    drafter_rows: dict[int, list[ProfileRow]] = {}
    drafter_pending: list[int] = []
    drafter_measurements: dict[str, Any] = {}
    if plan is not None:
        seen = {m.removeprefix("drafter_") for m, _ in drafter_captured}
        drafter_modes = tuple(m for m in ("piecewise", "full") if m in seen or m in plan.graph_modes)
        row_modes = {"drafter_eager", *(f"drafter_{m}" for m in drafter_modes)}
        drafter_rows = {w: rs for w, rs in (drafter_done or {}).items() if {r.mode for r in rs} >= row_modes}
        drafter_pending = [w for w in sorted(plan.widths, reverse=True) if w not in drafter_rows]
        old_drafter = old_meta.get("drafter") if isinstance(old_meta.get("drafter"), dict) else {}
        drafter_measurements = dict(old_drafter.get("measurements", {}))
        meta["drafter"] = _drafter_meta(workload, plan, drafter, first["runner"],
                                        [] if graphs_reason else drafter_modes, startup.get("kv_tokens"))
    worker_options = {"warmup_ms": options.warmup_ms, "rep_ms": options.rep_ms, "min_reps": options.min_reps,
                      "max_reps": options.max_reps, "context_len": workload.traffic.mean_context_len,
                      "decode_query_len": s.decode_query_len, "max_num_seqs": s.max_num_seqs}
    rows: dict[int, list[ProfileRow]] = dict(done)
    measurements: dict[str, Any] = dict(old_meta.get("measurements", {}))
    csv_path = out_dir / f"{name}.csv"
    previous_s = float(old_meta.get("sweep_s") or 0.0)

    def write(complete: bool) -> Path:
        noisy = {int(w) for w, d in measurements.items()
                 if int(w) in rows and any(isinstance(m, dict) and m.get("noisy") for m in d.values())}
        noisy |= {int(w) for w, d in drafter_measurements.items()
                  if int(w) in drafter_rows and any(isinstance(m, dict) and m.get("noisy") for m in d.values())}
        meta.update(measurements=measurements, widths_done=sorted(rows), complete=complete, noisy_widths=sorted(noisy),
                    sweep_s=previous_s + time.perf_counter() - started, capture_errors=[], widths_left_for_time=[])
        if plan is not None:
            meta["drafter"].update(measurements=drafter_measurements, widths_done=sorted(drafter_rows))
        if not rows and not drafter_rows:
            write_metadata(out_dir, name, meta)
            return csv_path
        return write_profile(out_dir, name, [r for table in (rows, drafter_rows) for rs in table.values() for r in rs],
                             meta)

    write(complete=False)
    llm.collective_rpc(_worker.warm, args=(pending, worker_options))
    if drafter_pending:
        llm.collective_rpc(_worker.warm_drafter, args=(drafter_pending,))
    from tuner.progress import progress_bar

    # Rounds interleave the widths: each round times every pending width (largest first) with 1/rounds of the budget,
    # and a width's samples pool over the rounds, so drift (clocks, a busy host) spreads over all widths instead of
    # landing on the ones timed in one stretch. After the first round every width has its rows.
    rounds = max(1, rounds)
    round_options = {**worker_options, "rep_ms": options.rep_ms / rounds,
                     "min_reps": max(1, -(-options.min_reps // rounds))}
    pooled: dict[int, list[dict[str, Any]]] = {}
    drafter_pooled: dict[int, list[dict[str, Any]]] = {}
    measured: list[int] = []
    drafter_measured: list[int] = []
    complete = True
    modes = [m for m in SWEEP_MODES if graphs_reason is None or m not in ("full", "piecewise")]
    lora_modes = _lora_modes(workload, device, first["runner"], graphs_reason)
    if lora_modes:
        meta["lora"] = _lora_meta(workload, llm, lora_modes)
    timed_drafter = ["drafter_eager"] + [f"drafter_{m}" for m in drafter_modes if graphs_reason is None]
    order = sorted(set(pending) | set(drafter_pending), reverse=True)
    with progress_bar(len(order) * rounds, f"profile {name} (vLLM)", "width", enabled=progress,
                      dynamic_ncols=True) as bar:
        try:
            for r in range(rounds):
                for w in order:
                    if options.max_seconds is not None and time.perf_counter() - started > options.max_seconds:
                        complete = False
                        break
                    bar.set_postfix_str(f"{w} tokens" + (f", round {r + 1}/{rounds}" if rounds > 1 else ""))
                    if w in pending:
                        t0 = time.perf_counter()
                        timed = [m for m in modes if m not in ("full", "piecewise") or (m, w) in captured]
                        timed_lora = [m for m in lora_modes if m.endswith("_eager") or (m.split("_")[1], w) in captured]
                        timings = llm.collective_rpc(_worker.time_width, args=(w, timed + timed_lora, round_options))
                        pooled[w] = pool_timings(pooled.get(w), timings)
                        rows[w], detail = rows_for_width(w, pooled[w], captured, graphs_reason)
                        if timed_lora:  # the LoRA cases' rows: their latency (their graphs' memory is not read)
                            lora_rows, lora_detail = _width_rows(w, pooled[w], {}, None, timed_lora)
                            rows[w] += lora_rows
                            detail.update(lora_detail)
                        seconds = float((measurements.get(str(w)) or {}).get("seconds", 0.0)) if r else 0.0
                        detail.update(seconds=round(seconds + time.perf_counter() - t0, 4), rounds=r + 1)
                        measurements[str(w)] = detail
                        if r == 0:
                            measured.append(w)
                    if w in drafter_pending:
                        t0 = time.perf_counter()
                        timed = [m for m in timed_drafter if m == "drafter_eager" or (m, w) in drafter_captured]
                        timings = llm.collective_rpc(_worker.time_drafter_width, args=(w, timed, round_options))
                        drafter_pooled[w] = pool_timings(drafter_pooled.get(w), timings)
                        drafter_rows[w], detail = drafter_rows_for_width(
                            w, drafter_pooled[w], drafter_captured, graphs_reason, drafter_modes)
                        seconds = float((drafter_measurements.get(str(w)) or {}).get("seconds", 0.0)) if r else 0.0
                        detail.update(seconds=round(seconds + time.perf_counter() - t0, 4), rounds=r + 1)
                        drafter_measurements[str(w)] = detail
                        if r == 0:
                            drafter_measured.append(w)
                    write(complete=False)
                    bar.update(1)
                if not complete:
                    break
        finally:
            complete = (complete and len(measured) == len(pending)
                        and len(drafter_measured) == len(drafter_pending))
            csv_path = write(complete=complete)
    all_rows = sorted((r for table in (rows, drafter_rows) for rs in table.values() for r in rs),
                      key=lambda r: (r.num_tokens, mode_order(r.mode)))
    return ProfileResult(csv_path=csv_path, rows=all_rows, metadata=meta, measured=measured, complete=complete,
                         drafter_measured=drafter_measured)


_INIT_FILE = re.compile(r"distributed_init_method=file://(\S+)")


def shutdown_engine(llm: Any, lines: Sequence[str]) -> None:
    """Release the engine (its worker, KV cache and graphs) before returning, and remove the rendezvous file its
    single-process group left in the temporary directory (named in its log); best effort."""
    try:
        core = getattr(llm.llm_engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
    except Exception as exc:  # shutting down must not turn a written profile into an error
        log.debug("engine shutdown: %s", exc)
    for line in lines:
        if (m := _INIT_FILE.search(line)) and Path(m.group(1)).name.startswith("vllm_dist_"):
            Path(m.group(1)).unlink(missing_ok=True)
