"""The engines a workload may name: the registry from a workload's `engine:` to its Engine class
(`tuner.engines.engine`), and the Engine object a serving configuration gets. A new engine is a rulebook with an Engine
class plus one `register` call; nothing else in cgtune names it."""

from __future__ import annotations

from functools import lru_cache

from tuner.engines.engine import Engine
from tuner.engines.serving import ServingConfig
from tuner.engines.sglang.engine import SglangEngine
from tuner.engines.trtllm.engine import TrtllmEngine
from tuner.engines.vllm.releases import Vllm

__all__ = ["ENGINES", "ENGINE_FILES", "engine_class", "engine_of", "register"]

ENGINES: dict[str, type[Engine]] = {}
"""Engines whose CUDA-graph batch sizes cgtune tunes, by the workload's `engine:` value."""

ENGINE_FILES: dict[str, tuple[str, ...]] = {}
"""The files a run directory holds for each engine's tuned list (a run writes its engine's and no other's)."""


def engine_of(serving: ServingConfig) -> Engine:
    """The Engine object that answers for a serving configuration (one per configuration: it caches what it
    derives, such as the decode steps by width)."""
    # Keyed by the reason for the release too: ServingConfig leaves it out of equality, yet the engine words it in
    # every file and console line, so a configuration read under another reason must not get the earlier's engine.
    return _engine_of(serving, serving.vllm_version_why)


@lru_cache(maxsize=64)
def _engine_of(serving: ServingConfig, why: str | None) -> Engine:
    return engine_class(serving.engine).bind(serving)


engine_of.cache_clear = _engine_of.cache_clear  # type: ignore[attr-defined]


def engine_class(name: str) -> type[Engine]:
    """The Engine class registered as `name` (ValueError naming the engines there are)."""
    try:
        return ENGINES[name]
    except KeyError:
        raise ValueError(f"engine: {name!r} must be one of {', '.join(ENGINES)}") from None


def register(engine: type[Engine]) -> type[Engine]:
    """Make `engine.name` a value a workload's `engine:` may take (usable as a class decorator)."""
    ENGINES[engine.name] = engine
    ENGINE_FILES[engine.name] = (*engine.files, *engine.note_files)
    _engine_of.cache_clear()
    return engine


for _engine in (Vllm, SglangEngine, TrtllmEngine):
    register(_engine)
