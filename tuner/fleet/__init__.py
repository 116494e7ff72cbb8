"""The fleet: many deployments' GPU work on Ray. A catalogue (`catalogue`: the results store and, per deployment, a
workload file and the GPU kind it targets) becomes a profile, a search and a validate task per deployment, asking Ray
for `tensor_parallel_size` GPUs of that kind (`runner`); what each task does on its node (`tasks`); the results store
with its status files and the catalogue index (`store`). Imports the stages up to validate (it runs them) and ray
only inside functions (the GPU host's software has none); commands import it."""

from __future__ import annotations

from tuner.face import lazy_face

_FACE = {
    "CPU_KIND": "catalogue", "Catalogue": "catalogue", "CatalogueError": "catalogue", "Deployment": "catalogue",
    "load_catalogue": "catalogue",
    "FleetRunError": "runner", "run_catalogue": "runner", "unplaceable": "runner",
    "build_index": "store", "index_table": "store", "read_index": "store", "read_status": "store",
}
"""Each public name -> the submodule that defines it (imported when the name is first used)."""

__all__ = sorted(_FACE)
__getattr__ = lazy_face(__name__, _FACE)
