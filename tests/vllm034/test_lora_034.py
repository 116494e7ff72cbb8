"""cgtune's vLLM 0.34 rulebook on multi-LoRA graphs and data parallelism, held to vLLM 0.34's own code: the LoRA
capture cases, every graph in capture order with its case, the pool of their capture, the dispatch of batches with
active adapters, and what every rank of a data-parallel joint draw runs after the ranks agree, on seeded random
configurations (tests/vllm034/lora_answers.py runs vLLM in a process of its own, as tests/vllm034/answers.py does).
Skipped where CGTUNE_VLLM034_PATH is not set, unless CGTUNE_REQUIRE_VLLM=1 (`.ci/run`): then a missing vLLM fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tuner.engines.serving import ServingConfig
from tuner.engines.vllm.data_parallel import synced_dispatch
from tuner.engines.vllm.lora import LoraSettings
from tuner.engines.vllm.memory import GraphCost, pool_bytes
from tuner.engines.vllm.v034.dispatch import join_keys
from tuner.engines.vllm.v034.engine import Vllm034Engine

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vllm_code import vllm_034_code  # noqa: E402

SCRIPT = Path(__file__).resolve().parent / "lora_answers.py"
SEED, CONFIGS = 51, 300


@pytest.fixture(scope="module")
def answers() -> dict[str, Any]:
    target = vllm_034_code()
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_USE_BREAKABLE_CUDAGRAPH", "VLLM_BATCH_INVARIANT")}
    env["PYTHONPATH"] = os.pathsep.join([str(target), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["VLLM_CONFIGURE_LOGGING"] = "0"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--seed", str(SEED), "--configs", str(CONFIGS)],
                          capture_output=True, text=True, timeout=900, cwd=SCRIPT.parents[2], env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    assert data["status"] == "ok", data
    assert data["vllm_version"] == "0.34.0", data["vllm_version"]
    return data


def engine_of(answer: dict[str, Any]) -> Vllm034Engine:
    """The answer's configuration as a cgtune 0.34 serving config (LoRA and data parallelism included)."""
    c, lora = answer["config"], answer["lora"]
    return Vllm034Engine(ServingConfig(
        max_num_seqs=c["max_num_seqs"], max_num_batched_tokens=c["max_num_batched_tokens"],
        num_speculative_tokens=c["num_speculative_tokens"], cudagraph_mode=c["cudagraph_mode"],
        speculative_method="ngram" if c["num_speculative_tokens"] else None, vllm_version="0.34",
        lora=LoraSettings(max_loras=lora["max_loras"], specialize_active_lora=lora["specialize_active_lora"],
                          cudagraph_specialize_lora=lora["cudagraph_specialize_lora"]),
        data_parallel_size=answer["data_parallel_size"]))


def costs(mode: str, width: int) -> tuple[int, int]:
    """lora_answers.py's seeded (standalone, delta) bytes of a graph."""
    import random

    rnd = random.Random(f"{mode}/{width}")
    mib = 1 << 20
    return rnd.randint(4, 400) * mib, rnd.choice((mib // 4, mib, rnd.randint(1, 60) * mib))


@pytest.fixture(scope="module")
def comparison(answers) -> dict[str, Any]:
    out: list[dict[str, Any]] = []
    checks: Counter[str] = Counter()

    def check(area: str, vllm: Any, cgtune: Any, **where: Any) -> None:
        checks[area] += 1
        if vllm != cgtune:
            out.append({"area": area, **where, "vllm": vllm, "cgtune": cgtune})

    for i, a in enumerate(answers["configs"]):
        engine = engine_of(a)
        keys = join_keys(a["config"]["prefill_token_sizes"] or [], a["config"]["decode_request_sizes"] or [])
        d = engine.dispatcher(keys)
        cases = list(engine.lora_cases())
        check("cases", a["cases"], cases, config=i)
        check("mode", a["resolved_mode"], d.cudagraph_mode, config=i)
        graphs = [[m, t, utc, n, case] for m, t, utc, n in d.manager_graphs() for case in cases]
        check("graphs", a["graphs"], graphs, config=i)
        check("graph count", len(a["graphs"]), len(engine.graphs(keys)), config=i)
        pool = pool_bytes([GraphCost("target", m, w, *costs(m, w)) for m, w in engine.graphs(keys)])
        check("pool", a["pool_bytes"], int(pool), config=i)
        for n, t, utc, active, got in a["batches"]:
            case = int(engine.lora_dispatch(np.array([active]))[0])
            mode, tokens, reqs = d.dispatch_desc(n, t, utc)
            ours = ["NONE", t, n, case] if case < 0 else [mode, tokens, reqs, case]
            check("dispatch", got, ours, config=i, batch=[n, t, utc, active])
        for draw, got in a["draws"]:
            steps = [(t, utc or 0) for _, t, utc, _ in draw]
            for rank, (mode, tokens, *_) in enumerate(got):
                check("dp dispatch", [mode, tokens], list(synced_dispatch(d, steps, rank)), config=i, draw=draw,
                      rank=rank)
    return {"disagreements": out, "checks": checks}


def test_graphs_pool_and_dispatch_equal_vllm_034s_own(comparison, answers, capsys):
    out = comparison["disagreements"]
    shown = "\n".join(json.dumps(d, default=str) for d in out[:10])
    assert not out, f"{len(out)} disagreements, first ones:\n{shown}"
    with capsys.disabled():
        checks = comparison["checks"]
        print(f"\nvLLM 0.34 LoRA/DP oracle (seed {answers['seed']}): {len(answers['configs'])} configurations, "
              f"{checks['dispatch']} batches, {checks['dp dispatch']} rank dispatches of data-parallel draws, "
              f"0 disagreements; vLLM's side took {answers['seconds']} s")


def test_the_comparison_covers_what_it_claims(answers, comparison):
    # "0 disagreements" means something only if every kind of case is met often: several LoRA cases per graph, every
    # mode, adapters above and below each captured case, data-parallel draws whose ranks run eager, graphs of their
    # own, or the agreed width eagerly.
    configs, checks = answers["configs"], comparison["checks"]
    assert len(configs) == CONFIGS and checks["dispatch"] == 30 * CONFIGS and checks["dp dispatch"] >= 3000
    seen: Counter[str] = Counter()
    for a in configs:
        seen[f"mode {a['resolved_mode']}"] += 1
        seen[f"{len(a['cases'])} cases"] += 1
        seen["specialize active"] += a["lora"]["specialize_active_lora"]
        seen["no LoRA specialization"] += not a["lora"]["cudagraph_specialize_lora"]
        for *_, (mode, _, _, case) in a["batches"]:
            seen[f"dispatched {mode}"] += 1
            seen["LoRA case replayed" if case and mode != "NONE" else "other"] += 1
        for draw, got in a["draws"]:
            seen["draw all eager" if {g[0] for g in got} == {"NONE"} else "draw with graphs"] += 1
            top = max(t for _, t, _, _ in draw)
            for (_, t, _, _), (mode, tokens, *_) in zip(draw, got):
                if t < top:  # a narrower rank: eager at its own width, eager padded to the agreed one, or a graph
                    seen["eager at the agreed width" if mode == "NONE" and tokens == top else
                         "eager at its own width" if mode == "NONE" else "graph at the agreed width"] += 1
    for mode in ("PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"):
        assert seen[f"mode {mode}"] >= 25, mode
    assert seen["2 cases"] >= 50 and sum(seen[f"{k} cases"] for k in range(3, 7)) >= 50
    assert seen["specialize active"] >= 50 and seen["no LoRA specialization"] >= 50
    assert seen["dispatched NONE"] >= 500 and seen["LoRA case replayed"] >= 1000
    assert seen["draw all eager"] >= 200 and seen["draw with graphs"] >= 200
    assert seen["eager at its own width"] >= 500 and seen["graph at the agreed width"] >= 500
    assert seen["eager at the agreed width"] >= 50


def test_data_parallelism_drops_a_dynamic_schedule_as_vllm_does(answers):
    # `_maybe_disable_dynamic_sd_for_data_parallel` keeps the schedule on one rank and drops it on several; cgtune's
    # engine runs static K exactly there.
    schedule = ((1, 8, 4), (9, 64, 2))
    for dp_size, kept in answers["schedule_rule"]:
        engine = Vllm034Engine(ServingConfig(max_num_seqs=64, num_speculative_tokens=4, speculative_method="ngram",
                                             speculative_schedule=schedule, vllm_version="0.34",
                                             data_parallel_size=dp_size))
        assert (engine.dynamic_schedule is not None) == (kept is not None), dp_size
    assert [kept is None for _, kept in answers["schedule_rule"]] == [False, True, True]
