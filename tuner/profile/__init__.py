"""The profile: the contract between measuring and modelling. A profile is a CSV (one row per width and mode:
latency, its spread and samples, graph memory) and a JSON of device and run metadata (`table`); every column is read
over widths through `curve`; readings wildly off their neighbours are flagged (`outliers`); a profile calibrated on
vLLM's start-up log carries its non-KV memory and graph-memory scale (`calibration`); `host_cost` says where the eager
step is host-bound. Imports no stage: measuring writes a profile, modelling reads one."""

from __future__ import annotations

from tuner.face import lazy_face

_FACE = {
    "MODES": "table", "Profile": "table", "ProfileError": "table", "ProfileRow": "table", "read_profile": "table",
    "write_profile": "table", "write_metadata": "table", "atomic_write_text": "table",
    "Curve": "curve", "memory_curve": "curve",
    "Outlier": "outliers", "find_outliers": "outliers", "without_outliers": "outliers",
    "apply_calibration": "calibration", "calibrated_metadata": "calibration", "write_calibrated": "calibration",
    "host_bound_widths": "host_cost",
}
"""Each public name -> the submodule that defines it (imported when the name is first used)."""

__all__ = sorted(_FACE)
__getattr__ = lazy_face(__name__, _FACE)
