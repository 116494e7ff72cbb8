"""A profile calibrated on vLLM's own start-up log: the metadata `cgtune check --calibrate` writes (vLLM's non-KV
memory and a graph-memory scale from the real pool vLLM logged) and how the cost model applies it.

A calibrated profile is an ordinary profile pair (the CSV + JSON contract of `tuner.profile.table`): `OUT.csv`, a
byte-for-byte copy of the run's profile table, beside `OUT.json`, the run's profile metadata with
`non_kv_cache_bytes` replaced by vLLM's figure and a `vllm_calibration` block. `cgtune search --profile OUT.csv` reads
it like any profile; the cost model multiplies every graph-memory reading of the table (capture deltas and
standalone footprints, the target's and the drafter's) by `graph_memory_scale`, so the real pool and vLLM's estimate
of every list are rescaled alike, and takes the non-KV memory as vLLM measured it (drafter weights included)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tuner.profile.table import Profile, ProfileError, atomic_write_text

__all__ = ["CALIBRATION_KEY", "apply_calibration", "calibrated_metadata", "non_kv_from_vllm", "write_calibrated"]

CALIBRATION_KEY = "vllm_calibration"
"""The profile-metadata key that holds the calibration."""


def _block(profile: Profile) -> dict[str, Any] | None:
    block = profile.metadata.get(CALIBRATION_KEY)
    if block is None:
        return None
    name = profile.path.with_suffix(".json").name if profile.path else "profile"
    if not isinstance(block, dict):
        raise ProfileError(f"{name}: {CALIBRATION_KEY} must be a JSON object")
    scale = block.get("graph_memory_scale")
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale) or scale <= 0:
        raise ProfileError(f"{name}: {CALIBRATION_KEY}.graph_memory_scale={scale!r} must be a number > 0")
    return block


def non_kv_from_vllm(profile: Profile) -> bool:
    """The profile's `non_kv_cache_bytes` is vLLM's own (drafter weights already inside)."""
    block = _block(profile)
    return bool(block and block.get("non_kv_cache_bytes_from_log"))


def apply_calibration(profile: Profile) -> tuple[Profile, str | None]:
    """(the profile with every graph-memory reading scaled, the note saying what came from vLLM's log); a profile
    without calibration comes back as it is, with no note."""
    block = _block(profile)
    if block is None:
        return profile, None
    scale = float(block["graph_memory_scale"])

    def scaled(value: int | None) -> int | None:
        return None if value is None else round(value * scale)

    rows = [dataclasses.replace(r, capture_delta_bytes=scaled(r.capture_delta_bytes),
                                standalone_bytes=scaled(r.standalone_bytes)) for r in profile.rows]
    sizes = block.get("capture_sizes") or []
    non_kv = block.get("non_kv_cache_bytes_from_log")
    note = (f"calibrated on vLLM's start-up log {block.get('log', '?')} (vLLM running a list of {len(sizes)} sizes, "
            f"max {max(sizes, default=0)}): from vLLM's log: its real graph pool (every graph-memory reading of the "
            f"profile x {scale:.4f}, the estimate's included)" + (" and its non-KV memory" if non_kv else "")
            + "; from the profile: latencies, capture times, the shape of graph memory over widths"
            + ("" if non_kv else ", non-KV memory"))
    return Profile(rows=rows, metadata=profile.metadata, path=profile.path), note


def calibrated_metadata(metadata: dict[str, Any], *, log: str, capture_sizes: Sequence[int], pool_logged_bytes: float,
                        pool_predicted_bytes: float, non_kv_logged_bytes: float | None, command: str) -> dict[str, Any]:
    """The run's profile metadata calibrated on a log: `graph_memory_scale` = logged / predicted real pool (times the
    scale the profile already carried, since its prediction was made with it), and `non_kv_cache_bytes` = vLLM's
    when the log states it (else the profile's, kept)."""
    old = metadata.get(CALIBRATION_KEY) if isinstance(metadata.get(CALIBRATION_KEY), dict) else {}
    scale = float(old.get("graph_memory_scale", 1.0)) * pool_logged_bytes / pool_predicted_bytes
    out = dict(metadata)
    from_log = ["graph_memory_scale"]
    if non_kv_logged_bytes is not None:
        out["non_kv_cache_bytes"] = round(non_kv_logged_bytes)
        from_log.append("non_kv_cache_bytes")
    out[CALIBRATION_KEY] = {
        "log": log,
        "capture_sizes": list(capture_sizes),
        "graph_memory_scale": scale,
        "graph_pool_bytes": {"logged": round(pool_logged_bytes), "predicted": round(pool_predicted_bytes)},
        "non_kv_cache_bytes_from_log": non_kv_logged_bytes is not None,
        "non_kv_cache_bytes_profile": old.get("non_kv_cache_bytes_profile", metadata.get("non_kv_cache_bytes")),
        "from_vllm_log": from_log,
        "from_profile": ["latency_ms", "capture_s", "graph memory over widths (shape)"]
                        + ([] if non_kv_logged_bytes is not None else ["non_kv_cache_bytes"]),
        "created_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command,
    }
    return out


def write_calibrated(profile_csv: Path, out_json: Path, metadata: dict[str, Any]) -> tuple[Path, Path]:
    """Write the calibrated pair, OUT.json (the metadata) and OUT.csv (the run's table, copied), each atomically; when
    the table cannot be written the metadata is removed again, so no half pair is left."""
    out_csv = out_json.with_suffix(".csv")
    table = profile_csv.read_text()
    atomic_write_text(out_json, json.dumps(metadata, indent=2, sort_keys=True) + "\n")
    try:
        atomic_write_text(out_csv, table)
    except BaseException:
        out_json.unlink(missing_ok=True)
        raise
    return out_json, out_csv
