"""Measuring through vLLM itself: its engine built in this process, its own runner timing each width's step in each
mode, its own capture order, pool and KV-cache spec (`sweep`); the private vLLM names that relies on, held to the
versions it was written for (`api`); what cgtune adds inside vLLM's worker (`hooks`, `worker`). May import
tuner.measure, tuner.workload.spec and tuner.engines.vllm's log reader; vLLM itself only inside functions (it is
optional)."""

from tuner.measure.vllm_engine.api import (
    ADAPTER_VERSIONS,
    PRIVATE_API,
    PrivateName,
    VersionError,
    check_api,
    check_version,
    installed_version,
)
from tuner.measure.vllm_engine.choose import BACKENDS, BackendError, choose_backend
from tuner.measure.vllm_engine.engine import engine_args, model_source, unsupported_reason

_LAZY = ("profile_through_vllm", "rows_for_width")  # tuner.measure.vllm_engine.sweep imports torch: choosing does not


def __getattr__(name: str) -> object:
    if name in _LAZY:
        from tuner.measure.vllm_engine import sweep

        return getattr(sweep, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "ADAPTER_VERSIONS",
    "BACKENDS",
    "BackendError",
    "PRIVATE_API",
    "PrivateName",
    "VersionError",
    "check_api",
    "check_version",
    "choose_backend",
    "engine_args",
    "installed_version",
    "model_source",
    "profile_through_vllm",
    "rows_for_width",
    "unsupported_reason",
]
