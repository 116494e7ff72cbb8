"""The KV cache vLLM 0.34 keeps, to the block, held to vLLM 0.34's own functions (tests/vllm034/kv_answers.py, in a
process of its own) on seeded random layer layouts: full attention (with an EAGLE or draft layer of the same or other
heads), MLA (alone, or beside a full-attention drafter), sliding window, hybrids of both (the n:1 patterns of Gemma and
Llama 4, gpt-oss's 12 + 12 with an EAGLE layer), and pages that differ (scaled or padded). For each: the groups, the
pool's bytes per block, the extensible cache's segments, the capacity's blocks, the bytes measured after warm-up and
capture (the larger of the transient peak and torch's reserve growth kept free, clamped at 0), the granule-rounded
blocks within them and the count kept, and the blocks without the extensible cache. cgtune's side is
`tuner.engines.vllm.v034.kv_layout` and `ExtensibleKvRule`. Skipped where CGTUNE_VLLM034_PATH is not set, unless
CGTUNE_REQUIRE_VLLM=1."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from vllm_code import vllm_034_code

from tuner.engines.vllm.v034.kv_layout import KvLayer, KvLayout, LayoutError
from tuner.engines.vllm.v034.memory import ExtensibleKvRule

HERE = Path(__file__).resolve().parent
SEED, CASES = 48, 600
GIB, MIB = 1 << 30, 1 << 20


def random_layers(rnd: random.Random) -> tuple[str, list[list[Any]]]:
    """`(family, [[kind, kv heads, head size, dtype bytes, window, draft], ...])`."""
    heads, head = rnd.choice((1, 2, 4, 8, 16)), rnd.choice((64, 80, 96, 128, 256))
    size = rnd.choice((2, 2, 2, 4, 1))
    roll = rnd.random()
    if roll < 0.3:
        family = "full attention"
        layers = [["full", heads, head, size, None, False]] * rnd.randint(1, 80)
        if rnd.random() < 0.6:  # an EAGLE / draft model's layers, as the target's or with heads of their own
            family += " + drafter"
            draft_heads = heads if rnd.random() < 0.5 else rnd.choice((1, 2, 4, 8, 32))
            layers += [["full", draft_heads, head, size, None, True]] * rnd.randint(1, 3)
    elif roll < 0.45:
        family = "MLA"
        latent = rnd.choice((576, 576, 512, 320))
        layers = [["mla", 1, latent, size, None, False]] * rnd.randint(1, 61)
        if rnd.random() < 0.5:
            family += " + drafter"
            layers += ([["mla", 1, latent, size, None, True]] if rnd.random() < 0.5
                       else [["full", rnd.choice((1, 8)), rnd.choice((64, 128)), size, None, True]])
    elif roll < 0.8:
        family = "hybrid"
        window = rnd.choice((128, 512, 1024, 4096))
        full, sliding = ["full", heads, head, size, None, False], ["sliding", heads, head, size, window, False]
        n = rnd.choice((1, 2, 3, 5))
        pattern = [sliding] * n + [full]
        layers = [dict(enumerate(pattern))[i % len(pattern)] for i in range(len(pattern) * rnd.randint(1, 12))]
        if rnd.random() < 0.3:
            family = "hybrid, another page"  # sliding layers of other heads: pages scaled or padded to the largest
            other = rnd.choice([h for h in (1, 2, 3, 4, 8, 16) if h != heads])
            layers = [["sliding", other, head, size, window, False] if lay[0] == "sliding" else lay for lay in layers]
        if rnd.random() < 0.3:
            family += " + EAGLE"
            layers.append(["full", heads, head, size, None, True])
    else:
        family = "sliding window"
        window = rnd.choice((128, 1024))
        layers = [["sliding", heads, head, size, window, False]] * rnd.randint(1, 40)
        if rnd.random() < 0.4:
            family = "two windows"
            layers += [["sliding", heads, head, size, window * 2, False]] * rnd.randint(1, 40)
    return family, layers


def random_memory(rnd: random.Random, layout: KvLayout) -> dict[str, int | float]:
    total = rnd.randint(24, 192) * GIB + rnd.randint(0, GIB)
    peak = rnd.choice((0, rnd.randint(0, 8 * GIB)))
    growth = rnd.choice((0, rnd.randint(0, 10 * GIB), peak + rnd.randint(0, GIB)))
    non_kv = peak + rnd.randint(1, total // (3 * GIB)) * GIB // 2 + rnd.randint(0, GIB)
    start_free = total - rnd.choice((0, rnd.randint(0, 2 * GIB)))
    util = rnd.choice((1.0, 1.0, 0.9, 0.95, round(rnd.uniform(0.8, 1.0), 4)))
    room = min(int(total * util) - non_kv, start_free - non_kv - GIB) + peak
    # a pool that leaves most of the room, a little, exactly nothing, or less than nothing (the clamp at 0)
    pool = rnd.choices((rnd.randint(0, 6 * GIB), max(0, room - rnd.randint(0, 3 * layout.pool_bytes_per_block)),
                        max(0, room + rnd.randint(0, GIB))), weights=(6, 2, 2))[0]
    return {"total": total, "utilization": util, "non_kv": non_kv, "peak": peak, "growth": growth,
            "start_free": start_free, "pool": pool}


def cgtune(case: dict[str, Any]) -> dict[str, Any]:
    layout = KvLayout(tuple(KvLayer(kind, heads, head, size, window) for kind, heads, head, size, window, _ in
                            case["layers"]))
    g = layout.geometry
    m = case["memory"]
    rule = ExtensibleKvRule(m["total"], m["utilization"], m["non_kv"], 0, g, peak_bytes=m["peak"],
                            torch_reserve_growth_bytes=m["growth"], start_free_bytes=m["start_free"])
    return {"groups": [[f"layer.{i}" for i, _ in grp] for grp in layout.groups],
            "pool_bytes_per_block": g.pool_bytes_per_block, "capacity_blocks": rule.capacity_blocks,
            "segment_strides": list(g.segment_strides), "bytes_per_block": g.bytes_per_block,
            "measured_bytes": rule.measured_bytes(m["pool"]), "blocks": rule.kv_blocks(m["pool"]),
            "blocks_within": [[n, g.blocks_within(n, rule.capacity_blocks)] for n in case["probe_bytes"]],
            "blocks_without_extensible": g.blocks_for(case["available"])}


@pytest.fixture(scope="module")
def run() -> dict[str, Any]:
    rnd = random.Random(SEED)
    cases, families = [], []
    while len(cases) < CASES:
        family, layers = random_layers(rnd)
        try:
            layout = KvLayout(tuple(KvLayer(*layer[:5]) for layer in layers))
            layout.geometry
        except LayoutError:
            continue
        memory = random_memory(rnd, layout)
        bpb = layout.pool_bytes_per_block
        probes = [rnd.randint(0, 200 * GIB), rnd.randint(0, 64 * bpb), rnd.randint(1, 40) * 2 * MIB]  # whole granules too
        cases.append({"layers": layers, "max_model_len": rnd.choice((16, 64, 256)), "memory": memory,
                      "probe_bytes": probes, "available": rnd.randint(64 * bpb, max(64 * bpb, 100 * GIB))})
        families.append(family)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(vllm_034_code()), *filter(None, [os.environ.get(
        "PYTHONPATH")])]), "VLLM_CONFIGURE_LOGGING": "0"}
    proc = subprocess.run([sys.executable, str(HERE / "kv_answers.py")], input=json.dumps({"cases": cases}),
                          capture_output=True, text=True, timeout=600, cwd=HERE.parents[1], env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    assert data["status"] == "ok", data
    assert data["vllm_version"] == "0.34.0"
    return {"cases": cases, "families": families, "vllm": data}



def test_kv_blocks_equal_vllm_034s_on_every_random_layout(run, capsys):
    out: list[dict[str, Any]] = []
    checks: Counter[str] = Counter()
    for case, family, theirs in zip(run["cases"], run["families"], run["vllm"]["answers"], strict=True):
        assert "error" not in theirs, (family, case, theirs["error"])
        ours = cgtune(case)
        for key, value in theirs.items():
            checks[key] += 1
            if ours[key] != value:
                out.append({"family": family, "area": key, "vllm": value, "cgtune": ours[key], "case": case})
    shown = "\n".join(json.dumps(d)[:1500] for d in out[:8])
    assert not out, f"{len(out)} disagreements, first ones:\n{shown}"
    families = Counter(run["families"])
    zero = sum(a["blocks"] == 0 for a in run["vllm"]["answers"])
    rounded = sum(a["blocks"] < a["measured_bytes"] // a["bytes_per_block"] for a in run["vllm"]["answers"]
                  if a["bytes_per_block"])
    with capsys.disabled():
        print(f"\nvLLM 0.34 KV blocks (seed {SEED}): {len(run['cases'])} layouts "
              f"({', '.join(f'{k} {v}' for k, v in sorted(families.items()))}), {sum(checks.values())} checks "
              f"({rounded} where granule rounding cost blocks, {zero} with nothing left): 0 disagreements")
    assert all(families[f] >= 30 for f in ("full attention", "full attention + drafter", "MLA", "hybrid",
                                           "sliding window")), families
    assert zero >= 20 and rounded >= 100
