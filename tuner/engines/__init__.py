"""The engines: the `Engine` interface every stage asks (`engine`: serving settings, default list, the list that
runs, dispatcher and graphs, KV rule and estimate, speculative resolution, drafter, files, words), the registry
(`registry`: `engine:` -> Engine class), what engines that count graphs in requests share (`request_engine`), a
workload's serving settings as its engine read them (`serving`), and each engine's rulebook read from its source:
vllm/, sglang/, trtllm/. Imports the profile package only (the drafter's costs read profile rows); nothing above."""

from __future__ import annotations

from tuner.face import lazy_face

_FACE = {
    "Deployment": "engine", "Engine": "engine", "GraphDispatcher": "engine", "KvRule": "engine",
    "Speculation": "engine",
    "ENGINES": "registry", "ENGINE_FILES": "registry", "engine_class": "registry", "engine_of": "registry",
    "RequestEngine": "request_engine",
    "ServingConfig": "serving", "parse_capability": "serving",
}
"""Each public name -> the submodule that defines it (imported when the name is first used)."""

__all__ = sorted(_FACE)
__getattr__ = lazy_face(__name__, _FACE)
