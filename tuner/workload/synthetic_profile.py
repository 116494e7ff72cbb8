"""A SYNTHETIC profile for any workload, at any scale and under either vLLM release: made-up latency, graph memory and
capture time from a few stated numbers (`SyntheticModel`), at the token widths the workload's engine would measure.
For planning and trying cgtune on one's own model without a GPU (`cgtune profile --synthetic`), for benchmarks and
test fixtures; never a measurement, and every file it writes says so (`SYNTHETIC_DEVICE`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from tuner.profile.table import ProfileRow, write_profile
from tuner.workload.spec import Workload

__all__ = ["DEVICE_NAME", "EXAMPLE", "SYNTHETIC_DEVICE", "SyntheticModel", "is_synthetic", "synthetic_widths",
           "write_synthetic_profile"]

MIB = 1 << 20
GIB = 1 << 30
SYNTHETIC_DEVICE = "synthetic"
"""The profile metadata's `device`: what every reader (the report, `check`, validation) tells a made-up profile by."""
DEVICE_NAME = "SYNTHETIC profile (made-up numbers, not a measurement)"
"""The profile metadata's `device_name`, which the report and the console print where a GPU's name would stand."""


@dataclass(frozen=True)
class SyntheticModel:
    """The made-up numbers: latency linear in the width, a graph a constant cheaper, graph memory linear in the width,
    a constant capture time per graph."""

    eager_base_ms: float = 7.0
    """An eager step's launch cost (ms): eager latency = eager_base_ms + eager_per_token_ms x width."""
    eager_per_token_ms: float = 0.003
    """An eager step's work per token (ms)."""
    full_saving_ms: float = 1.0
    """A FULL graph's step is this much faster than the eager step at its width (ms)."""
    piecewise_saving_ms: float | None = 0.6
    """A PIECEWISE graph's step is this much faster than the eager step (ms); None: no PIECEWISE rows."""
    ripple_ms: float = 0.0
    """A FULL graph's latency also grows by this much per token of `width % 64` (a padding ripple, ms)."""
    delta_base_bytes: int = 2 * MIB
    """A FULL graph's capture delta in the shared pool (bytes) = delta_base_bytes + delta_per_token_bytes x width."""
    delta_per_token_bytes: int = 1024
    standalone_base_bytes: int = 128 * MIB
    """A FULL graph's footprint captured alone (its activations) = standalone_base_bytes + standalone_per_token_bytes x
    width."""
    standalone_per_token_bytes: int = 200_000
    piecewise_memory_share: float = 1.0
    """A PIECEWISE graph holds this share of the FULL graph's delta and footprint at its width."""
    capture_s: float = 0.05
    """Seconds one graph's capture takes (FULL and PIECEWISE alike)."""
    drafter_divisor: float = 5.0
    """A drafter pass costs the target's latency over this (a draft model's rows only)."""
    total_memory_gib: float = 141.0
    """The device's memory (GiB)."""
    activation_peak_gib: float = 4.0
    """Peak activations beside the weights the KV cache must leave free (GiB)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if not isinstance(value, int | float) or isinstance(value, bool) or not value == value or value < 0 \
                    or value == float("inf"):
                raise ValueError(f"{f.name}={value!r} must be a finite number >= 0")
        if self.drafter_divisor <= 0 or self.total_memory_gib <= 0:
            raise ValueError(f"drafter_divisor={self.drafter_divisor!r} and total_memory_gib={self.total_memory_gib!r} "
                             f"must be > 0")
        if self.eager_base_ms <= max(self.full_saving_ms, self.piecewise_saving_ms or 0.0):
            raise ValueError(f"eager_base_ms={self.eager_base_ms!r} must exceed what a graph saves "
                             f"(full_saving_ms={self.full_saving_ms!r}, piecewise_saving_ms={self.piecewise_saving_ms!r})"
                             f": a step's latency must stay > 0")

    def rows(self, width: int, *, drafter: bool) -> list[ProfileRow]:
        """The eager, FULL (and PIECEWISE) rows at one width, and the drafter's (`drafter`)."""
        w = width
        eager = self.eager_base_ms + self.eager_per_token_ms * w
        # (base - saving) first: the shipped example's numbers are `1.5 + 0.004 w + 0.0004 (w % 64)`, kept bit-exact.
        full = self.eager_base_ms - self.full_saving_ms + self.eager_per_token_ms * w + self.ripple_ms * (w % 64)
        delta, alone = self.delta_base_bytes + self.delta_per_token_bytes * w, \
            self.standalone_base_bytes + self.standalone_per_token_bytes * w
        out = [ProfileRow(w, "eager", "ok", latency_ms=eager, latency_iqr_ms=0.0),
               ProfileRow(w, "full", "ok", latency_ms=full, latency_iqr_ms=0.0, capture_delta_bytes=delta,
                          standalone_bytes=alone, capture_s=self.capture_s)]
        if self.piecewise_saving_ms is not None:
            share = self.piecewise_memory_share
            out.append(ProfileRow(w, "piecewise", "ok", latency_ms=eager - self.piecewise_saving_ms,
                                  latency_iqr_ms=0.0, capture_delta_bytes=int(round(delta * share)),
                                  standalone_bytes=int(round(alone * share)), capture_s=self.capture_s))
        if drafter:
            d = self.drafter_divisor
            out += [ProfileRow(w, "drafter_eager", "ok", latency_ms=eager / d, latency_iqr_ms=0.0),
                    ProfileRow(w, "drafter_full", "ok", latency_ms=full / d, latency_iqr_ms=0.0,
                               capture_delta_bytes=MIB + 1024 * w, standalone_bytes=16 * MIB + 150_000 * w,
                               capture_s=0.01)]
        return out


EXAMPLE = SyntheticModel(eager_base_ms=6.0, eager_per_token_ms=0.004, full_saving_ms=4.5, piecewise_saving_ms=None,
                         ripple_ms=0.0004, delta_per_token_bytes=4096, standalone_base_bytes=64 * MIB,
                         standalone_per_token_bytes=600_000, piecewise_memory_share=0.5, capture_s=0.05)
"""The shipped example profile's numbers (workloads/profiles/synthetic-dflash-llama-3.1-8b.*: `cgtune example`)."""


def synthetic_widths(workload: Workload, *, stride: int = 32, dense: bool = False) -> list[int]:
    """The token widths a profile of the workload holds: its engine's default graphs (in tokens, whichever release),
    every uniform decode width, a `stride` grid above the 512 ceiling (`dense`: every width) up to
    max_num_batched_tokens."""
    if stride < 1:
        raise ValueError(f"stride={stride} must be >= 1")
    engine, s = workload.engine, workload.serving
    widths = set(engine.key_widths(engine.defaults().sizes)) | set(engine.decode_widths())
    for q in set(engine.decode_query_lens()[1:]):
        widths |= {n * q for n in range(1, s.max_num_seqs + 1)}
    widths |= set(range(512 + stride, s.max_num_batched_tokens + 1, stride))
    if dense:
        widths |= set(range(1, s.max_num_batched_tokens + 1))
    return sorted(w for w in widths if 1 <= w <= s.max_num_batched_tokens)


def write_synthetic_profile(out_dir: Path, workload: Workload, *, model: SyntheticModel = SyntheticModel(),
                            stride: int = 32, dense: bool = False, name: str = "synthetic",
                            command: str = "cgtune profile --synthetic",
                            device_name: str = DEVICE_NAME, record_numbers: bool = True) -> tuple[Path, int]:
    """Write `<out_dir>/<name>.csv/.json`: `model`'s rows at `synthetic_widths`, the metadata marked synthetic
    (`device: synthetic`; with `record_numbers` its `synthetic` key holds the numbers: the shipped example's files
    predate the key, and a test holds them byte for byte). Returns (csv path, number of widths)."""
    widths = synthetic_widths(workload, stride=stride, dense=dense)
    drafter = workload.drafter is not None
    rows = [row for w in widths for row in model.rows(w, drafter=drafter)]
    metadata = synthetic_metadata(workload, model, command=command, device_name=device_name)
    if record_numbers:
        metadata["synthetic"] = asdict(model)
    return write_profile(out_dir, name, rows, metadata), len(widths)


def synthetic_metadata(workload: Workload, model: SyntheticModel, *, command: str, device_name: str) -> dict[str, Any]:
    """The profile JSON of a synthetic profile: the workload's step (q, context), the model's shape and weights, the
    made-up device."""
    wl = workload
    metadata: dict[str, Any] = {
        "device_name": device_name,
        "total_memory_bytes": int(model.total_memory_gib * GIB), "weights_bytes": wl.model.weight_bytes(),
        "activation_peak_bytes": int(model.activation_peak_gib * GIB), "kv_cache_bytes": None,
        "compute_capability": None, "torch_version": None, "cuda_version": None, "driver_version": None,
        "compiled": True, "device": SYNTHETIC_DEVICE, "decode_query_len": wl.serving.decode_query_len,
        "context_len": wl.traffic.mean_context_len, "workload": {"name": wl.name, "hash": wl.content_hash},
        "created_at": None, "command": command,
        "model": {"preset": wl.model.preset, "shape": wl.model.shape.as_dict(), "dtype": wl.model.dtype,
                  "tensor_parallel_size": wl.model.tensor_parallel_size},
    }
    return metadata


def is_synthetic(metadata: dict[str, Any]) -> bool:
    """Whether a profile's metadata is a synthetic profile's (made up here, or by a benchmark or test fixture)."""
    return metadata.get("device") == SYNTHETIC_DEVICE or "synthetic" in str(metadata.get("device_name") or "").lower()
