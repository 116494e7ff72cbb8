"""cgtune's vLLM rulebook against vLLM 0.33's own code: 2,000 seeded random configurations (both runners, every
cudagraph mode, default and explicit lists, q from 1 to 25, dynamic schedules, prompt chunks, drafters) compared
config by config and step by step, and issue 19's six cases, by tests/vllm/oracle_compare.py in a process of its own
(vLLM's import sets process-wide options). Skipped where vllm==0.33.0 is not installed, unless CGTUNE_REQUIRE_VLLM=1
(`.ci/run` installs it and sets that): then a missing vLLM fails."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vllm034"))  # import-mode=importlib
from hand_cases import FAMILIES  # noqa: E402

SCRIPT = Path(__file__).resolve().parent / "oracle_compare.py"
SEED, CONFIGS, KV_CASES = 19, 2000, 480
REQUIRED = os.environ.get("CGTUNE_REQUIRE_VLLM") == "1"


def _unavailable(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"CGTUNE_REQUIRE_VLLM=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def result() -> dict[str, Any]:
    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        _unavailable("vllm==0.33.0 is not installed (pip install --no-deps vllm==0.33.0 and the extra vllm-oracle, "
                     "as .ci/run does)")
    if version != "0.33.0":
        _unavailable(f"vllm {version} is installed; the oracle runs vLLM 0.33.0's code")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--seed", str(SEED), "--configs", str(CONFIGS),
                           "--kv-cases", str(KV_CASES)], capture_output=True, text=True, timeout=1200,
                          cwd=SCRIPT.parents[2])
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    if data["status"] != "ok":
        _unavailable(data["reason"])
    return data


def test_vllm_and_cgtune_agree_on_every_configuration_and_step(result, capsys):
    shown = "\n".join(json.dumps(d) for d in result["disagreements"])
    assert result["disagreement_count"] == 0, f"{result['disagreement_count']} disagreements, first ones:\n{shown}"
    with capsys.disabled():
        print(f"\nvLLM 0.33 oracle (seed {result['seed']}): {result['configs']} configurations, {result['steps']} "
              f"steps, {sum(result['checks'].values())} checks, 0 disagreements, {result['seconds']} s")


def test_the_comparison_covers_what_it_claims(result):
    assert result["configs"] >= 2000 and result["steps"] >= 60_000
    checks, seen = result["checks"], result["coverage"]
    for area in ("config list", "target graphs", "capture order", "real pool", "estimate"):
        assert checks[area] >= 1900, area  # every configuration vLLM accepts
    assert checks["dispatch"] == checks["uniform rule"] == result["steps"]
    assert checks["drafter dispatch"] >= 10_000 and checks["kv bytes per token"] == KV_CASES
    assert checks["kv start and size"] == 3 * KV_CASES  # one byte under the start need, at it, above it
    for key in ("runner v1", "runner v2", "mode NONE", "mode PIECEWISE", "mode FULL", "mode FULL_DECODE_ONLY",
                "mode FULL_AND_PIECEWISE", "default list", "explicit list", "q 1", "q 25", "method eagle",
                "method dflash", "method draft_model", "method suffix"):
        assert seen.get(key, 0) >= 10, key
    assert seen["dynamic schedule in force"] >= 300 and seen["dynamic schedule dropped (V1)"] >= 30
    assert seen["steps: decode"] >= 30_000 and seen["steps: prompt chunks of one length"] >= 10_000
    assert seen["steps: mixed"] >= 5_000
    # Every compute capability family, with the default list past 512 tokens in each (so that a 1024-token ceiling
    # given to 12.x or 11.x, or 512 to 10.3, disagrees), and max_num_batched_tokens below each bound.
    for family in (f"{major}.{minor}" for major, minor in FAMILIES):
        assert seen[f"capability {family}"] >= 100 and seen[f"capability {family}: the ceiling decides"] >= 15, family
    for key, least in (("max_num_batched_tokens below max_num_seqs x q", 200),
                       ("default list clipped at max_num_batched_tokens", 80),
                       ("explicit list above max_num_batched_tokens", 50),
                       ("explicit max above max_num_batched_tokens", 30)):
        assert seen[key] >= least, key


def test_only_the_10x_family_has_the_1024_token_ceiling(result):
    # vLLM 0.33's own is_device_capability_family(100), at 64 requests x 17 tokens (2176 past both ceilings); the
    # lists themselves are worked by hand in tests/vllm/test_defaults.py.
    families = result["families"]
    assert set(families) == {f"{major}.{minor}" for major, minor in FAMILIES} and len(families) == 9
    for family, answer in families.items():
        assert answer["vllm"] == answer["cgtune"], family
        assert answer["vllm"][0] == (1024 if family.startswith("10.") else 512), family


def test_issue19_cases_have_vllms_answers(result):
    # tests/vllm/test_vllm_cases.py states vLLM's answers; here vLLM's own code gives them, beside cgtune's.
    cases = result["cases"]
    assert len(cases) == 11
    for name, answer in cases.items():
        assert answer["vllm"] == answer["cgtune"], name
    assert cases["case2 dispatch"]["vllm"] == ["PIECEWISE", 4]
    assert cases["case3 dispatch v2"]["vllm"] == ["PIECEWISE", 3] and cases["case3 dispatch v1"]["vllm"] == ["FULL", 3]
    assert cases["case5 estimate MiB"]["vllm"] == 100.0
