"""The workload: a workload file read and validated into its data (`spec`: model, speculative decoding,
serving settings in its engine's words, traffic; `load`: the arrivals a deployment will see), a model given by its config.json (`model_config`), the candidate
capture widths (`candidates`) and traffic from outside cgtune (traffic/: vLLM's Prometheus metrics, step traces).
Imports the profile and engines packages (a workload's `serving:` section is read by the engine it names)."""

from __future__ import annotations

from tuner.face import lazy_face

_FACE = {
    "Workload": "spec", "WorkloadError": "spec", "load_workload": "spec",
    "config_for_shape": "model_config", "read_config": "model_config",
    "Lengths": "load", "Load": "load", "LoadError": "load",
}
"""Each public name -> the submodule that defines it (imported when the name is first used)."""

__all__ = sorted(_FACE)
__getattr__ = lazy_face(__name__, _FACE)
