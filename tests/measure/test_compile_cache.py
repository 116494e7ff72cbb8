"""A second process compiling the same model finds the first one's compiled step in Inductor's on-disk cache: nothing
process-specific (such as id() of the model) is baked into the graph, so the GPU run's second workload and a rerun
skip most of the compilation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# One compiled step of the tiny model in a fresh interpreter; prints Inductor's FX-graph cache counters. Only the
# whole step is compiled: it is the graph that holds the attention op's model key (the pieces call attention outside).
_PROBE = """
import json
from torch._dynamo.utils import counters
from tuner.measure.decoder import build_model
from tuner.workload.spec import load_workload

model = build_model(load_workload("workloads/tiny-cpu.yaml"), 16, "cpu")
model.compile()
model.step(8)
print(json.dumps({k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")}))
"""


def _compile_in_a_new_process(cache_dir: Path) -> dict[str, int]:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache_dir), TORCHINDUCTOR_FX_GRAPH_CACHE="1",
               PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_second_process_hits_the_compile_cache(tmp_path) -> None:
    first = _compile_in_a_new_process(tmp_path)
    assert first.get("fxgraph_cache_miss", 0) >= 1  # an empty cache: compiled for real
    second = _compile_in_a_new_process(tmp_path)
    assert second.get("fxgraph_cache_hit", 0) >= 1 and second.get("fxgraph_cache_miss", 0) == 0, second
