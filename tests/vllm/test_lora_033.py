"""cgtune's vLLM 0.33 rulebook on multi-LoRA graphs and data parallelism, both runners, held to vLLM 0.33's own code on
seeded random configurations (tests/vllm/lora_compare.py, in a process of its own): the graphs each runner captures
with their LoRA cases in capture order, and what every rank of a joint draw runs (one rank: the LoRA dispatch alone).
Skipped where vllm==0.33.0 is not installed, unless CGTUNE_REQUIRE_VLLM=1 (`.ci/run`): then a missing vLLM fails."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vllm_code import require_vllm_033  # noqa: E402

SCRIPT = Path(__file__).resolve().parent / "lora_compare.py"
SEED, CONFIGS = 51, 200


@pytest.fixture(scope="module")
def result() -> dict[str, Any]:
    require_vllm_033()
    proc = subprocess.run([sys.executable, str(SCRIPT), "--seed", str(SEED), "--configs", str(CONFIGS)],
                          capture_output=True, text=True, timeout=900, cwd=SCRIPT.parents[2])
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    assert data["status"] == "ok", data
    return data


def test_both_runners_graphs_and_rank_dispatch_equal_vllm_033s_own(result, capsys):
    shown = "\n".join(json.dumps(d) for d in result["disagreements"])
    assert result["disagreement_count"] == 0, f"{result['disagreement_count']} disagreements, first ones:\n{shown}"
    with capsys.disabled():
        checks = result["checks"]
        print(f"\nvLLM 0.33 LoRA/DP oracle (seed {result['seed']}): {result['configs']} configurations, "
              f"{checks['dispatch']} one-rank and {checks['dp dispatch']} data-parallel rank dispatches, 0 "
              f"disagreements, {result['seconds']} s")


def test_the_comparison_covers_what_it_claims(result):
    checks, seen = result["checks"], result["coverage"]
    assert checks["graphs"] == CONFIGS and checks["cases"] == seen["runner v2"]
    assert seen["runner v1"] >= 70 and seen["runner v2"] >= 70
    assert seen["1 cases"] >= 20 and seen["2 cases"] >= 50 and seen["4 cases"] + seen["5 cases"] >= 20
    assert checks["dispatch"] >= 800 and checks["dp dispatch"] >= 3000
    assert seen["no graph for the no-LoRA case"] >= 100 and seen["LoRA graph replayed"] >= 1000
    assert seen["narrower rank eager"] >= 500 and seen["narrower rank padded to a graph"] >= 500
    for mode in ("NONE", "PIECEWISE", "FULL"):
        assert seen[f"dispatched {mode}"] >= 500, mode


def test_data_parallelism_drops_a_dynamic_schedule_as_vllm_does(result):
    # 0.33's `_maybe_disable_dynamic_sd_for_data_parallel` keeps the schedule on one rank, drops it on several; cgtune's
    # engine (both runners) runs static K exactly there.
    assert [[dp, kept, ours] for dp, kept, ours in result["schedule_rule"]] == [
        [1, True, [True, True]], [2, False, [False, False]], [4, False, [False, False]]]
