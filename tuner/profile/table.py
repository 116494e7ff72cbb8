"""The profile table: the contract between measurement (writes it) and search/report (read it).

`DIR/<name>.csv` holds one row per (width, mode); `DIR/<name>.json` holds the device and run metadata.
Writes are atomic (temp file + rename), so an interrupted run never leaves a half-written table.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "COLUMNS",
    "LORA_BASES",
    "MODES",
    "STATUSES",
    "Profile",
    "ProfileError",
    "ProfileRow",
    "atomic_write_text",
    "lora_mode",
    "mode_order",
    "read_profile",
    "write_metadata",
    "write_profile",
]

COLUMNS = (
    "num_tokens", "mode", "latency_ms", "latency_iqr_ms", "status", "capture_delta_bytes", "standalone_bytes",
    "capture_s",
)
"""CSV columns, in order."""
MODES = ("eager", "full", "piecewise", "logits", "drafter_eager", "drafter_full", "drafter_piecewise")
"""`eager`: plain (or compiled) forward, body + logits; `full`: whole body as one CUDA graph, replay + logits;
`piecewise`: graphs between attention calls, attention eager, replay + logits; `logits`: the LM head alone, eagerly.
Every mode computes logits for the width's own tokens, so a step of T tokens padded to a graph of P costs
graph(P) - logits(P) + logits(T). `drafter_eager`, `drafter_full`, `drafter_piecewise`: one forward pass of the
speculative drafter over that many tokens (with its own logits), eagerly and as its graphs, captured into the same
pool after the target's (a model-based drafter only; see tuner.engines.vllm.drafter_cost)."""
LORA_BASES = ("eager", "full", "piecewise")
"""The modes a LoRA deployment's step is measured in once per LoRA capture case c (`lora_mode`): `lora<c>_eager`,
`lora<c>_full`, `lora<c>_piecewise`, the step with c adapters active as vLLM's runner runs it (c as vLLM counts its
cases: max_loras + 1 for every LoRA graph unless `specialize_active_lora`)."""
_LORA_MODE = re.compile(r"lora([1-9][0-9]*)_(eager|full|piecewise)")
STATUSES = ("ok", "oom", "unsupported", "error")
"""Row status: measured, ran out of memory, not measurable here (e.g. graphs on a CPU), or failed with another error
(its message is in the metadata's `capture_errors`)."""

METADATA_KEYS = (
    "device_name", "compute_capability", "total_memory_bytes", "weights_bytes", "kv_cache_bytes",
    "torch_version", "cuda_version", "driver_version", "workload", "created_at", "command",
    "model", "activation_peak_bytes", "compiled", "device",
)
"""Metadata keys every profile JSON carries (values may be null where the device has none, e.g. CPU).
`workload`: {name, hash}; `model`: {preset, shape (ModelShape fields), dtype, tensor_parallel_size};
`activation_peak_bytes`: peak non-KV, non-weight memory the KV budget must leave free: the larger of vLLM's
own profiling step (max_num_batched_tokens over max_num_seqs requests, what vLLM subtracts) and the widest
decode step (both kept under `activation_peaks`); `compiled`: measured through torch.compile; `device`: "cuda:0" or "cpu".
Profiles from `cgtune profile` since the PIECEWISE rows also carry (older ones lack them): `capture_order`
("piecewise-then-full": FULL deltas were read with every PIECEWISE graph in the pool; absent: FULL graphs only),
`non_kv_cache_bytes` (vLLM's non-KV memory, breakdown in `non_kv`), `pre_load_free_bytes` (free device memory with
CUDA up, before the weights load: where SGLang's KV budget starts, and vLLM 0.34's headroom), `torch_reserve_growth_bytes`
(how far vLLM's profiling step grows torch's reservation from an emptied cache beyond what it keeps: vLLM 0.34 keeps the
larger of it and the transient peak free), `compile_s`, `eager_kernels_per_layer`
and `noisy_widths`; with a draft model also `drafter` ({method, shape, weights_bytes, kv_layers, runner,
graph_modes, ...}: its weights are then inside `non_kv_cache_bytes`). A profile measured through vLLM 0.34 with its
extensible KV cache records what that cache sized the KV cache from under `kv_cache.extensible` (segment strides, pool
bytes per block, granule, transient peak, reserve growth, free memory at start:
`tuner.measure.vllm_engine.worker.extensible_kv_figures`). A profile calibrated on vLLM's start-up log
(`cgtune check --calibrate`) also carries `vllm_calibration` (`tuner.profile.calibration`: a graph-memory scale, and
whether `non_kv_cache_bytes` is vLLM's)."""


def lora_mode(case: int, base: str) -> str:
    """The mode of a step measured with LoRA case `case` active (`lora2_full`)."""
    return f"lora{case}_{base}"


def mode_order(mode: str) -> tuple[int, int, int]:
    """Where a mode's row sorts among one width's rows: MODES in order, then the LoRA cases' rows."""
    if mode in MODES:
        return 0, MODES.index(mode), 0
    m = _LORA_MODE.fullmatch(mode)
    if m is None:
        raise ValueError(f"mode={mode!r} must be one of {', '.join(MODES)} or lora<case>_<{'|'.join(LORA_BASES)}>")
    return 1, int(m.group(1)), LORA_BASES.index(m.group(2))


class ProfileError(ValueError):
    """A profile that cannot be used; the message names the file and the offending field."""


@dataclass(frozen=True)
class ProfileRow:
    """One measurement of one width in one mode."""

    num_tokens: int
    """Step width in tokens."""
    mode: str
    """One of MODES."""
    status: str
    """One of STATUSES."""
    latency_ms: float | None = None
    """Median step latency (None unless status is ok)."""
    latency_iqr_ms: float | None = None
    """Interquartile range of the step latency."""
    capture_delta_bytes: int | None = None
    """Device memory this width's capture added to the shared pool (captured largest first)."""
    standalone_bytes: int | None = None
    """Footprint of this width's graph captured alone in a fresh pool."""
    capture_s: float | None = None
    """Seconds the capture took."""

    def as_csv(self) -> list[str]:
        def fmt(v: object) -> str:
            if v is None:
                return ""
            if isinstance(v, float):
                return repr(v)
            return str(v)

        return [fmt(getattr(self, c)) for c in COLUMNS]


@dataclass
class Profile:
    """A profile table with its metadata."""

    rows: list[ProfileRow]
    """Measurements, sorted by (num_tokens, mode)."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Device and run metadata (see METADATA_KEYS)."""
    path: Path | None = None
    """CSV it was read from."""

    def by_mode(self, mode: str, *, ok_only: bool = True) -> dict[int, ProfileRow]:
        """`num_tokens -> row` for one mode (only measured rows by default)."""
        return {r.num_tokens: r for r in self.rows if r.mode == mode and (r.status == "ok" or not ok_only)}

    def widths(self) -> list[int]:
        return sorted({r.num_tokens for r in self.rows})

    @property
    def name(self) -> str:
        return self.path.stem if self.path else "profile"


def _new_file_mode() -> int:
    """The mode `open()` gives a new file: 0666 under the process umask (0644 under the usual 022)."""
    with _UMASK_LOCK:  # reading the umask means setting it: keep other threads of this process out meanwhile
        mask = os.umask(0o022)
        os.umask(mask)
    return 0o666 & ~mask


_UMASK_LOCK = threading.Lock()


def atomic_write_text(path: Path, text: str) -> None:
    """Write a file so that readers see the old content or the new one, never a part; it gets the mode a plain
    `open()` would give it (mkstemp's temp file is owner-only, which a table or report meant to be shared is not)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, _new_file_mode())
        with os.fdopen(fd, "w", newline="") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _metadata_text(metadata: dict[str, Any]) -> str:
    return json.dumps(metadata, indent=2, sort_keys=True) + "\n"


def write_metadata(out_dir: Path, name: str, metadata: dict[str, Any]) -> Path:
    """Write `<name>.json` alone, atomically, and remove a `<name>.csv` beside it (rows of an earlier measurement
    must not pass for this one's): what a sweep has measured before its first width. Returns the JSON path."""
    path = out_dir / f"{name}.json"
    atomic_write_text(path, _metadata_text(metadata))
    (out_dir / f"{name}.csv").unlink(missing_ok=True)
    return path


def write_profile(out_dir: Path, name: str, rows: Iterable[ProfileRow], metadata: dict[str, Any]) -> Path:
    """Write `<name>.csv` and `<name>.json` atomically; returns the CSV path."""
    ordered = sorted(rows, key=lambda r: (r.num_tokens, mode_order(r.mode)))
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(COLUMNS)
    writer.writerows(r.as_csv() for r in ordered)
    csv_path = out_dir / f"{name}.csv"
    atomic_write_text(out_dir / f"{name}.json", _metadata_text(metadata))
    atomic_write_text(csv_path, buf.getvalue())
    return csv_path


def _number(text: str, cast: type, where: str, *, required: bool) -> Any:
    if text is None or text.strip() == "":
        if required:
            raise ProfileError(f"{where}: missing value")
        return None
    try:
        value = float(text)
    except ValueError:
        raise ProfileError(f"{where}: {text!r} is not a number") from None
    if not math.isfinite(value):
        raise ProfileError(f"{where}: {text!r} is not a finite number")
    if cast is int:
        if not value.is_integer():  # 64.5 tokens or bytes is no measurement: never truncate it to 64
            raise ProfileError(f"{where}: {text!r} must be a whole number")
        return int(value)
    return value


def read_profile(csv_path: str | Path) -> Profile:
    """Read and validate a profile CSV and the JSON beside it."""
    path = Path(csv_path)
    if not path.is_file():
        raise ProfileError(f"{path}: profile CSV not found")
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ProfileError(f"{path.name}: missing column {missing[0]!r}")
        rows = []
        first_line: dict[tuple[int, str], int] = {}
        for line, raw in enumerate(reader, start=2):
            where = f"{path.name} line {line}"
            mode, status = raw["mode"], raw["status"]
            if mode not in MODES and _LORA_MODE.fullmatch(mode) is None:
                raise ProfileError(f"{where}: mode={mode!r} must be one of {', '.join(MODES)} (or lora<case>_eager, "
                                   f"_full, _piecewise)")
            if status not in STATUSES:
                raise ProfileError(f"{where}: status={status!r} must be one of {', '.join(STATUSES)}")
            ok = status == "ok"
            num_tokens = _number(raw["num_tokens"], int, f"{where}: num_tokens", required=True)
            if num_tokens < 1:
                raise ProfileError(f"{where}: num_tokens={num_tokens} must be >= 1")
            row = ProfileRow(
                num_tokens=num_tokens,
                mode=mode,
                status=status,
                latency_ms=_number(raw["latency_ms"], float, f"{where}: latency_ms", required=ok),
                latency_iqr_ms=_number(raw["latency_iqr_ms"], float, f"{where}: latency_iqr_ms", required=False),
                capture_delta_bytes=_number(raw["capture_delta_bytes"], int, f"{where}: capture_delta_bytes",
                                            required=False),
                standalone_bytes=_number(raw["standalone_bytes"], int, f"{where}: standalone_bytes", required=False),
                capture_s=_number(raw["capture_s"], float, f"{where}: capture_s", required=False),
            )
            if ok and row.latency_ms is not None and row.latency_ms <= 0:
                raise ProfileError(f"{where}: latency_ms={row.latency_ms} must be > 0")
            for column in ("latency_iqr_ms", "capture_delta_bytes", "standalone_bytes", "capture_s"):
                # None is below 0: a graph never frees memory (a negative free-memory drop is an invalid reading,
                # written as no value), and a spread or a duration is never negative.
                if (value := getattr(row, column)) is not None and value < 0:
                    raise ProfileError(f"{where}: {column}={value} must be >= 0 (leave the cell empty where the "
                                       f"reading is invalid)")
            # Two measurements of one (width, mode) leave no single number to cost it by: which one is meant?
            first = first_line.setdefault((num_tokens, mode), line)
            if first != line:
                raise ProfileError(f"{where}: num_tokens={num_tokens} mode={mode} is a duplicate of line {first}")
            rows.append(row)
    if not rows:
        raise ProfileError(f"{path.name}: no rows")
    meta_path = path.with_suffix(".json")
    metadata: dict[str, Any] = {}
    if meta_path.is_file():
        try:
            metadata = json.loads(meta_path.read_text())
        except json.JSONDecodeError:
            raise ProfileError(f"{meta_path.name}: not valid JSON") from None
        if not isinstance(metadata, dict):
            raise ProfileError(f"{meta_path.name}: must hold a JSON object")
    else:
        raise ProfileError(f"{meta_path.name}: metadata JSON missing beside {path.name}")
    rows.sort(key=lambda r: (r.num_tokens, mode_order(r.mode)))
    return Profile(rows=rows, metadata=metadata, path=path)
