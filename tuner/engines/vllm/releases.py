"""vLLM as the registry sees it: one engine whose rulebook is the deployment's release's (`serving.vllm_version`,
`tuner.engines.vllm.versions`). Adding a release is one line in RULEBOOKS and its rulebook package."""

from __future__ import annotations

from tuner.engines.serving import ServingConfig
from tuner.engines.vllm.engine import VllmEngine
from tuner.engines.vllm.v034.engine import Vllm034Engine
from tuner.engines.vllm.versions import VERSIONS, resolve_version

__all__ = ["RULEBOOKS", "Vllm"]

RULEBOOKS: dict[str, type[VllmEngine]] = {"0.33": VllmEngine, "0.34": Vllm034Engine}
"""Each release's Engine class; its `bind` picks what varies within the release (0.33: the model runner)."""
assert tuple(RULEBOOKS) == VERSIONS, "every version cgtune speaks has a rulebook"


class Vllm(VllmEngine):
    """The `vllm` engine of a workload: bound to its release's rulebook."""

    @classmethod
    def bind(cls, serving: ServingConfig) -> VllmEngine:
        return RULEBOOKS[serving.vllm_version or resolve_version(None)].bind(serving)
