"""The decision: what a search's outcome means for the deployment, made once and kept as one typed record
(`record`: `decide` builds the `Decision`; the lists compared, the shipped and the other list, what changed per
width, off-peak figures, the saving's interval, the compact choice's and the exact solver's facts), the lists a search
is judged against (`compare`), and the run directory the record is saved into and read back from (`run_dir`).
Imports profile, engines, workload, model and search; the report renders the record and imports this stage, never
the search."""

from __future__ import annotations

from tuner.face import lazy_face

_FACE = {
    "Decision": "record", "Shipping": "record", "alternative_name": "record", "decide": "record",
    "comparison": "compare", "kv_tokens": "compare", "max_concurrency": "compare", "sglang_sizes": "compare",
    "widest_sizes": "compare",
    "RUN_FILES": "run_dir", "clear_run": "run_dir", "load_run": "run_dir", "recorded_decision": "run_dir",
    "recorded_model_settings": "run_dir",
    "recorded_origin": "run_dir", "run_conflict": "run_dir", "run_identity": "run_dir",
}
"""Each public name -> the submodule that defines it (imported when the name is first used)."""

__all__ = sorted(_FACE)
__getattr__ = lazy_face(__name__, _FACE)
