"""The draft model `cgtune profile --backend vllm` writes for each model-based method, read by vLLM 0.33's own config
code on CPU (tests/vllm/drafter_config_check.py in a process of its own): vLLM keeps the method, renames nothing,
resolves the architecture to the model class it builds for the method (EAGLE, EAGLE3 and DFlash heads, the target's
own class for a draft model) at the drafter's shape, and drafts DFlash in parallel; the name another EAGLE convention
uses (`LlamaForCausalLMEagle`) is refused, which is why cgtune writes vLLM's. Skipped where vllm==0.33.0 is not
installed, unless CGTUNE_REQUIRE_VLLM=1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vllm_code import require_vllm_033

HERE = Path(__file__).resolve().parent
CLASSES = {"eagle": "EagleLlamaForCausalLM", "eagle3": "Eagle3LlamaForCausalLM", "dflash": "DFlashQwen3ForCausalLM",
           "draft_model": "LlamaForCausalLM"}
"""The model class vLLM's registry builds for each method's drafter (model_executor/models/registry.py)."""
LAYERS = {"eagle": 1, "eagle3": 1, "dflash": 2, "draft_model": 1}
"""The drafter's layers in drafter_config_check.py's workloads."""


def run_check(path: str | None = None) -> dict[str, Any]:
    """drafter_config_check.py's answer, under the vLLM whose code is `path` (first on PYTHONPATH) or installed."""
    env = dict(os.environ)
    if path:
        env["PYTHONPATH"] = os.pathsep.join([path, str(HERE.parents[1])])
    proc = subprocess.run([sys.executable, str(HERE / "drafter_config_check.py")], capture_output=True, text=True,
                          timeout=600, cwd=HERE.parents[1], env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_vllm_builds_each_drafter(answer: dict[str, Any], *, dflash_parallel: bool) -> None:
    """Every method's drafter as vLLM read it; `dflash_parallel`: vLLM's config marks DFlash as drafting in parallel
    (0.33 sets `parallel_drafting`; 0.34 deprecated the field, DFlash drafting in parallel whatever it says)."""
    for method, cls in CLASSES.items():
        got = answer["methods"][method]
        assert "error" not in got, (method, got)
        assert got["method"] == method and got["class"] == cls, (method, got)
        assert got["architectures"] == [got["resolved"]]  # vLLM's EAGLEConfig kept the name cgtune wrote
        assert (got["num_hidden_layers"], got["hidden_size"], got["num_speculative_tokens"]) == (LAYERS[method], 64, 3)
        assert got["parallel_drafting"] is (method == "dflash" and dflash_parallel)
        assert got["speculative_config"] == {"method": method, "model": "<draft>", "num_speculative_tokens": 3}
    refused = answer["refused"]["LlamaForCausalLMEagle"]
    assert refused and "are not supported for now" in refused


@pytest.mark.slow  # vLLM builds every drafter in a subprocess (~40 s): CI's slow run holds it
def test_vllm_033_builds_the_drafter_cgtune_writes_for_each_method():
    require_vllm_033()
    answer = run_check()
    assert answer["version"] == "0.33.0"
    assert_vllm_builds_each_drafter(answer, dflash_parallel=True)
