"""How cgtune's stage packages face each other: the layering (which package may import which), written down once and
held by tests/test_layering.py, which reads every import; and the lazy face each package's `__init__.py` builds.

A stage is a package under tuner/. The modules beside them at the top level are FOUNDATIONS: the vocabulary every
stage shares (typed field reading, YAML files, model shapes, the step distribution, progress bars, this file), importing
nothing of cgtune's packages, so any stage may import them. `tuner/__init__.py` is the Python API: it sits above every
stage and imports them only inside its functions, so `import tuner` (and `from tuner import __version__`, which any
module may do) loads no stage.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["FOUNDATIONS", "LAYERS", "PENDING", "face_home", "lazy_face"]

FOUNDATIONS = ("face", "fields", "progress", "shapes", "steps", "yaml_file")
"""Top-level modules every stage may import; they import no stage."""

LAYERS: Mapping[str, tuple[str, ...]] = {
    "profile": (),  # the profile contract between measuring and modelling: CSV + JSON, curves, outliers, calibration
    "engines": ("profile",),  # the Engine interface, the registry, each engine's rulebook
    "workload": ("profile", "engines"),  # workload files, the model's config, candidate widths, traffic
    "measure": ("profile", "engines", "workload"),  # everything that touches a device
    "model": ("profile", "engines", "workload"),  # the cost model: step latency, graph memory, KV cache of a list
    "load": ("profile", "engines", "workload", "model"),  # the scheduler over arrivals under a list, the cliff
    "search": ("profile", "engines", "workload", "model", "load"),  # the study, the exact solver, compact, workers
    "decision": ("profile", "engines", "workload", "model", "load", "search"),  # the decision record, the run directory
    "report": ("profile", "engines", "workload", "model", "load", "decision"),  # renders the record: report.md, plots
    "validate": ("profile", "engines", "workload", "measure", "model", "load", "search", "decision",
                 "report"),  # the choice on the GPU
    "check": ("profile", "engines", "workload", "model", "load", "search", "decision", "report",
              "validate"),  # a run held to vLLM's start-up log
    "fleet": ("profile", "engines", "workload", "measure", "model", "load", "search", "decision", "report",
              "validate"),  # many deployments' profiles, searches and validations as Ray tasks, the results store
    "cli": (),  # the command line: registers each command by module name, imports none of them at the top
    "commands": ("profile", "engines", "workload", "measure", "model", "load", "search", "decision", "report",
                 "validate", "check", "fleet", "cli"),
}
"""Stage -> the stages it may import (besides the foundations and `tuner`'s `__version__`); the order is the layering,
lowest first. A top-level module that is not a foundation (`cli`) is a layer of its own."""

PENDING: Mapping[tuple[str, str], str] = {}
"""Edges LAYERS allows today that the layering is to lose, each with why it is still there; the layering test fails
when one is no longer used, so an edge removed is removed here too."""


def face_home(package: str, module: str) -> str:
    """The module a face entry names: a submodule of `package` (`spec`), or a lower stage's module by its full name
    (`tuner.workload.load`), for a name a stage re-exports because its users reach for it there."""
    return module if "." in module else f"{package}.{module}"


def lazy_face(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A package's `__getattr__` (PEP 562) for its face: `names` maps each public name to the submodule defining it,
    imported on first use, so importing a stage loads none of its heavy parts (torch, optuna, matplotlib) until a
    name is asked for, and a face adds no import cycle."""
    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(face_home(package, module)), name)

    return __getattr__
