"""Hand-made profiles for cost-model, search, emit and report tests: real CSV + JSON files written through
`write_profile`, with numbers simple enough to check by hand. Test fixtures, never measurements."""

from __future__ import annotations

import contextlib
import dataclasses
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from tuner.profile.table import ProfileRow, read_profile, write_profile
from tuner.workload.spec import Workload, load_workload, parse_workload

__all__ = ["GIB", "MIB", "gpu_scale_profile", "handmade_profile", "handmade_spec", "handmade_workload", "mixed_traffic",
           "shipped_profile", "tune_quietly", "with_timing", "write_handmade_inputs"]

MIB = 1 << 20
GIB = 1 << 30


def mixed_traffic(max_num_seqs: int, max_num_batched_tokens: int, mixed_share: float = 0.2) -> dict[str, Any]:
    """Decode steps of 1..max_num_seqs requests plus `mixed_share` mixed steps of 1..max_num_batched_tokens."""
    return {"requests": {"kind": "uniform", "min": 1, "max": max_num_seqs}, "mixed_share": mixed_share,
            "mixed_tokens": {"kind": "uniform", "min": 1, "max": max_num_batched_tokens}}


def handmade_spec(
    *,
    name: str = "hand",
    max_num_seqs: int = 8,
    num_speculative_tokens: int = 0,
    max_num_batched_tokens: int = 64,
    traffic: dict[str, Any] | None = None,
    speculative: dict[str, Any] | None = None,
    engine: str | None = None,
    **serving: Any,
) -> dict[str, Any]:
    """A tiny-model workload spec (a mapping, to write as YAML); default traffic: decode steps of 1..max_num_seqs
    requests, uniform; `speculative`: the workload's speculative section (method, drafter); `engine`: sglang or
    trtllm (serving then takes the engine's own names)."""
    spec = {
        "name": name,
        "model": {"preset": "tiny", "dtype": "float32"},
        "serving": {
            "max_num_seqs": max_num_seqs,
            "num_speculative_tokens": num_speculative_tokens,
            "max_num_batched_tokens": max_num_batched_tokens,
            "max_model_len": 64,
            **serving,
        },
        "traffic": traffic or {"requests": {"kind": "uniform", "min": 1, "max": max_num_seqs}},
    }
    if speculative is not None:
        spec["speculative"] = speculative
    if engine is not None:
        spec["engine"] = engine
    return spec


def handmade_workload(**spec: Any) -> Workload:
    """`handmade_spec(**spec)`, parsed."""
    return parse_workload(handmade_spec(**spec))


def handmade_profile(
    out_dir: Path,
    workload: Workload,
    widths: list[int],
    *,
    eager_ms: Callable[[int], float] = lambda w: 1.0 + 0.01 * w,
    full_ms: Callable[[int], float] = lambda w: 0.5 + 0.01 * w,
    piecewise_ms: Callable[[int], float] | None = None,
    logits_ms: Callable[[int], float] | None = None,
    standalone_bytes: Callable[[int], int] = lambda w: w * MIB,
    delta_bytes: Callable[[int], int] = lambda w: 2 * MIB,
    total_memory_bytes: int = 1000 * MIB,
    weights_bytes: int = 100 * MIB,
    activation_peak_bytes: int = 50 * MIB,
    oom: tuple[int, ...] = (),
    piecewise_unsupported: bool = False,
    shape_override: dict[str, Any] | None = None,
    name: str = "hand",
    drafter_eager_ms: Callable[[int], float] = lambda w: 0.3 + 0.002 * w,
    drafter_full_ms: Callable[[int], float] = lambda w: 0.1 + 0.002 * w,
    drafter_piecewise_ms: Callable[[int], float] | None = None,
    drafter_standalone_bytes: Callable[[int], int] = lambda w: w * MIB // 4,
    drafter_delta_bytes: Callable[[int], int] = lambda w: MIB // 2,
) -> Path:
    """Write `<name>.csv/.json` with eager, full (and optionally piecewise and the LM head's logits) rows at `widths`,
    and the drafter's rows when the workload runs a draft model."""
    rows = []
    if workload.drafter is not None:
        for w in widths:
            rows.append(ProfileRow(w, "drafter_eager", "ok", latency_ms=drafter_eager_ms(w), latency_iqr_ms=0.0))
            modes = [("drafter_full", drafter_full_ms)]
            if drafter_piecewise_ms is not None:
                modes.append(("drafter_piecewise", drafter_piecewise_ms))
            for mode, fn in modes:
                rows.append(ProfileRow(w, mode, "ok", latency_ms=fn(w), latency_iqr_ms=0.0,
                                       capture_delta_bytes=drafter_delta_bytes(w),
                                       standalone_bytes=drafter_standalone_bytes(w), capture_s=0.01))
    for w in widths:
        rows.append(ProfileRow(w, "eager", "ok", latency_ms=eager_ms(w), latency_iqr_ms=0.0))
        if logits_ms is not None:
            rows.append(ProfileRow(w, "logits", "ok", latency_ms=logits_ms(w), latency_iqr_ms=0.0))
        graph_modes = [("full", full_ms)] + ([("piecewise", piecewise_ms)] if piecewise_ms else [])
        for mode, fn in graph_modes:
            if w in oom:
                rows.append(ProfileRow(w, mode, "oom"))
            else:
                rows.append(ProfileRow(w, mode, "ok", latency_ms=fn(w), latency_iqr_ms=0.0,
                                       capture_delta_bytes=delta_bytes(w), standalone_bytes=standalone_bytes(w),
                                       capture_s=0.01))
        if piecewise_unsupported:  # as `cgtune profile` writes them: vLLM's split graphs are not built
            rows.append(ProfileRow(w, "piecewise", "unsupported"))
    shape = workload.model.shape.as_dict()
    shape.update(shape_override or {})
    metadata = {
        "device_name": "handmade test fixture (not a measurement)",
        "compute_capability": None,
        "total_memory_bytes": total_memory_bytes,
        "weights_bytes": weights_bytes,
        "kv_cache_bytes": None,
        "activation_peak_bytes": activation_peak_bytes,
        "torch_version": None, "cuda_version": None, "driver_version": None,
        "workload": {"name": workload.name, "hash": workload.content_hash},
        "created_at": "2026-01-01T00:00:00Z",
        "command": "tests/handmade_profiles.py",
        "model": {"preset": workload.model.preset, "shape": shape, "dtype": workload.model.dtype,
                  "tensor_parallel_size": workload.model.tensor_parallel_size},
        # The step a default vLLM deployment runs is compiled; an enforce_eager workload's is not.
        "compiled": not workload.serving.enforce_eager,
        "device": "handmade",
    }
    return write_profile(out_dir, name, rows, metadata)


def write_handmade_inputs(tmp_path: Path, spec: dict[str, Any], widths: list[int], **profile: Any
                          ) -> tuple[Path, Path, Workload]:
    """The files a command reads: the spec as `<name>.yaml` and its hand-made profile under `profiles/`."""
    wl_path = tmp_path / f"{spec['name']}.yaml"
    wl_path.write_text(yaml.safe_dump(spec))
    workload = load_workload(wl_path)
    return wl_path, handmade_profile(tmp_path / "profiles", workload, widths, **profile), workload


def shipped_profile(out_dir: Path, workload_path: Path, widths: list[int]) -> Path:
    """A hand-made profile for a shipped Llama-3.1-8B workload at `widths`: an H200-sized device, 15 GiB weights,
    2 GiB activations; a graph saves 4 ms of launch cost at every width and costs 2 MiB in the shared pool."""
    wl = load_workload(workload_path)
    return handmade_profile(out_dir, wl, widths, name=wl.name, total_memory_bytes=143771 * MIB,
                            weights_bytes=15 * GIB, activation_peak_bytes=2 * GIB,
                            eager_ms=lambda w: 6.0 + 0.01 * w, full_ms=lambda w: 2.0 + 0.01 * w)


def tune_quietly(workload_path: Path, profile: Path, out: Path, *extra: str) -> int:
    """`cgtune tune` with its progress lines sent nowhere (a test reads only its own command's output)."""
    from tuner.cli import main

    with contextlib.redirect_stdout(io.StringIO()):
        return main(["tune", str(workload_path), "--profile", str(profile), "--out", str(out), "--trials", "12",
                     "--no-progress", *extra])


def with_timing(csv_path: Path, *, samples: dict[tuple[str, int], list[float]] | None = None,
                iqr: dict[tuple[str, int], float] | None = None) -> Path:
    """Rewrite a profile pair with timing spread, as `cgtune profile` records it: `samples` {(mode, width): [ms, ...]}
    become the reading's raw samples in the metadata's `measurements` (the drafter's under `drafter`), its latency
    their median and its IQR theirs (linear quantiles, as tuner.measure.timing); `iqr` {(mode, width): ms} sets a
    reading's IQR alone, no samples kept."""
    profile = read_profile(csv_path)
    md = dict(profile.metadata)
    rows = []
    for r in profile.rows:
        key = (r.mode, r.num_tokens)
        if samples and key in samples:
            s = np.array(samples[key], dtype=float)
            r = dataclasses.replace(r, latency_ms=float(np.median(s)),
                                    latency_iqr_ms=float(np.percentile(s, 75) - np.percentile(s, 25)))
            drafter = r.mode.startswith("drafter_")
            holder = md.setdefault("drafter", {}) if drafter else md
            holder.setdefault("measurements", {}).setdefault(str(r.num_tokens), {})[
                r.mode.removeprefix("drafter_")] = {"median_ms": r.latency_ms, "iqr_ms": r.latency_iqr_ms,
                                                    "samples_ms": [float(x) for x in s]}
        elif iqr and key in iqr:
            r = dataclasses.replace(r, latency_iqr_ms=iqr[key])
        rows.append(r)
    return write_profile(csv_path.parent, csv_path.stem, rows, md)


def gpu_scale_profile(out_dir: Path, workload: Path) -> Path:
    """A made-up profile at H200 scale over vLLM's default grid, every decode width and a 32-token grid above the
    ceiling, written by the synthetic-profile generator (`cgtune profile --synthetic`, the shape
    benchmarks/bench_search.py uses): a graph saves 4.5 ms of launch cost at every width; a fixture, never a
    measurement."""
    from tuner.workload.synthetic_profile import EXAMPLE, write_synthetic_profile

    model = dataclasses.replace(EXAMPLE, ripple_ms=0.0, capture_s=0.01)
    return write_synthetic_profile(out_dir, load_workload(workload), model=model, name="synthetic",
                                   command="tests/handmade_profiles.py")[0]
