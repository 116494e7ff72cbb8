"""The search: the optuna study over capture lists (`study`), the exact solver that is its yardstick (`exact`
with its program, Lagrangian bounds and memory-level dynamic program), the compact choice (`compact`), the bootstrap
interval of the saving (`saving_interval`), and the workers sharing one optuna study on its storage (`workers`,
`storage_url`; the Ray fleet of many deployments is `tuner.fleet`). Imports profile, engines, workload and model;
never the report."""

from __future__ import annotations

from tuner.face import lazy_face

_FACE = {
    "SearchConfig": "study", "SearchError": "study", "SearchInterrupted": "study", "SearchResult": "study",
    "compact_of": "study", "exact_solve": "study", "run_search": "study", "profile_hash": "study",
    "ExactResult": "exact",
    "CompactChoice": "compact", "DEFAULT_TOLERANCE": "compact", "RECOMMEND_SAVING": "compact",
    "choose_compact": "compact", "counted_bytes": "compact",
    "SavingInterval": "saving_interval",
    "FleetError": "workers", "run_worker": "workers", "study_status": "workers",
}
"""Each public name -> the submodule that defines it (imported when the name is first used)."""

__all__ = sorted(_FACE)
__getattr__ = lazy_face(__name__, _FACE)
