"""vLLM 0.34's own code against the facts file and against cgtune's 0.34 rulebook. tests/vllm034/answers.py runs
vLLM 0.34.0 from the `pip install --no-deps --target` directory named by CGTUNE_VLLM034_PATH, in a process of its own
with that directory first on PYTHONPATH (the main venv holds 0.33 in site-packages, and vLLM's import sets
process-wide state); its answers come back as plain data. The first tests hold vLLM's answers for the four cases of the
0.34 issue and their variants to values worked by hand from shared/reference/vllm-034-facts.md (§2, §4, §5, §6), so
the facts file is checked against vLLM itself; the last ones compare cgtune's rulebook (tuner/engines/vllm/v034) with
vLLM on 2,000 seeded random configurations, batch by batch. Skipped where CGTUNE_VLLM034_PATH is not set, unless
CGTUNE_REQUIRE_VLLM=1 (`.ci/run` sets both): then a missing vLLM 0.34 fails."""

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
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/vllm034 helpers (import-mode=importlib)
from hand_cases import CASES as HAND_CASES, FAMILIES  # noqa: E402

SCRIPT = Path(__file__).resolve().parent / "answers.py"
SEED, CONFIGS = 34, 2000
REQUIRED = os.environ.get("CGTUNE_REQUIRE_VLLM") == "1"
MIB = 1 << 20
GIB = 1 << 30

# Hand-worked lists of the facts file (§2). G512: the 0.33 default grid at its 512-token ceiling.
G512 = [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]
# prefill_cudagraph_capture_grid(8192), as the facts file lists it for case (a) on SM100.
PREFILL_GRID_8192 = [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512,
                     640, 768, 896, 1024, *range(1280, 7681, 256), 8192]
# decode_cudagraph_capture_grid(256) (case (a) on SM100) and (128) (case (c)).
DECODE_GRID_256 = [1, 2, 3, 4, 5, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32, 36, 40, 44, 48, 56, 64, 72, 80, 88, 96, 104,
                   112, 120, 128, 144, 160, 176, 192, 208, 224, 240, 256]
DECODE_GRID_128 = DECODE_GRID_256[:DECODE_GRID_256.index(128) + 1]


def _unavailable(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"CGTUNE_REQUIRE_VLLM=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def answers() -> dict[str, Any]:
    target = os.environ.get("CGTUNE_VLLM034_PATH")
    if not target:
        _unavailable("CGTUNE_VLLM034_PATH is not set: it names a `pip install --no-deps --target DIR vllm==0.34.0` "
                     "directory (with the extra vllm-oracle in this venv), as .ci/run makes")
    if not (Path(target) / "vllm").is_dir():
        _unavailable(f"CGTUNE_VLLM034_PATH={target} holds no vllm package")
    env = {k: v for k, v in os.environ.items()
           # vLLM reads these to decide the breakable-CUDA-graph mode; the answers are for their defaults
           if k not in ("VLLM_USE_BREAKABLE_CUDAGRAPH", "VLLM_BATCH_INVARIANT")}
    # 0.34 first, so it shadows the 0.33 in site-packages in that process only
    env["PYTHONPATH"] = os.pathsep.join([target, *filter(None, [os.environ.get("PYTHONPATH")])])
    env["VLLM_CONFIGURE_LOGGING"] = "0"  # vLLM's own log handler writes to stdout, where the answers go
    proc = subprocess.run([sys.executable, str(SCRIPT), "--seed", str(SEED), "--configs", str(CONFIGS)],
                          capture_output=True, text=True, timeout=900, cwd=SCRIPT.parents[2], env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    if data["status"] != "ok":
        _unavailable(data["reason"])
    # the 0.34 under CGTUNE_VLLM034_PATH answered, not the 0.33 in site-packages
    assert data["vllm_version"] == "0.34.0", data["vllm_version"]
    assert Path(data["vllm_file"]).resolve().is_relative_to(Path(target).resolve()), data["vllm_file"]
    return data


def _graphs(answer: dict[str, Any], mode: str) -> list[list[Any]]:
    return [g for g in answer["graphs"] if g[0] == mode]


def _check_capture_order(answer: dict[str, Any], prefill: list[int], decode_tokens: list[tuple[int, int]]) -> None:
    """Facts §4: PIECEWISE then FULL, each largest first; PIECEWISE graphs pad no requests, decode graphs hold n
    requests of q tokens."""
    assert answer["graphs"] == ([["PIECEWISE", t, None, None] for t in sorted(prefill, reverse=True)]
                                + [["FULL", n * q, q, n] for n, q in sorted(decode_tokens, key=lambda s: -s[0] * s[1])])


# ------------------------------------------------------------------------------------------------ the facts file
def test_case_a_h200_without_speculation_keeps_033s_graphs(answers):
    # Facts §2 (a): prefill = G512 (51); decode requests [1, 2, 4] + 8..256 step 8 (35); record G512, max 512;
    # FULL 35 (n requests = n tokens) and PIECEWISE 51.
    a = answers["cases"]["a"]
    decode = [1, 2, 4, *range(8, 257, 8)]
    assert (a["error"], a["cudagraph_mode"]) == (None, "FULL_AND_PIECEWISE")
    assert a["prefill_token_sizes"] == G512 and len(G512) == 51
    assert a["decode_request_sizes"] == decode and len(decode) == 35
    assert (a["record"], a["max_record"], a["max_decode_tokens"]) == (G512, 512, None)
    assert a["decode_query_lens"] == [[1, 256]] and a["draft_decode_request_sizes"] == []
    _check_capture_order(a, G512, [(n, 1) for n in decode])
    assert Counter(g[0] for g in a["graphs"]) == {"PIECEWISE": 51, "FULL": 35}


def test_case_b_h200_dflash_k16_keeps_033s_graphs_and_runs_wide_decodes_eagerly(answers):
    # Facts §2 (b): prefill = G512 ∪ {17, 34, 68, 408} (55), decode requests 1..30, record = prefill ∪ {17n} (79),
    # max 512; FULL 30 (17..510), PIECEWISE 55. §4: 31 decode requests = 527 tokens run eager.
    b = answers["cases"]["b"]
    prefill = sorted({*G512, 17, 34, 68, 408})
    record = sorted({*prefill, *(17 * n for n in range(1, 31))})
    assert (b["error"], b["cudagraph_mode"]) == (None, "FULL_AND_PIECEWISE")
    assert b["prefill_token_sizes"] == prefill and len(prefill) == 55
    assert b["decode_request_sizes"] == list(range(1, 31))
    assert (b["record"], len(record), b["max_record"]) == (record, 79, 512)
    assert b["decode_query_lens"] == [[17, 128]] and b["max_decode_tokens"] is None
    _check_capture_order(b, prefill, [(n, 17) for n in range(1, 31)])
    assert [g[1] for g in _graphs(b, "FULL")][::-1] == list(range(17, 511, 17))
    assert b["dispatch"] == [[31, 527, 17, ["NONE", 527, 31]], [30, 510, 17, ["FULL", 510, 30]]]
    # §6: DFlash's query graphs, FULL_DECODE_ONLY at q = 17 over the target's decode sizes: 30 (17..510).
    assert b["drafter_graphs"] == {"query_cudagraph_manager": [["FULL", 17 * n, 17, n] for n in range(30, 0, -1)]}


def test_case_c_sm100_dflash_k16_takes_the_wide_defaults(answers):
    # Facts §2 (c): prefill grid(8192) (54); decode [1..6, 8, ..., 128] (29); max_decode_cudagraph_capture_tokens
    # 8192; record 83 entries, max 8192; FULL 29 (17..2176), PIECEWISE 54; every decode batch up to 128 requests
    # has a graph; a 600-token mixed batch takes PIECEWISE 640 (§4).
    c = answers["cases"]["c"]
    record = sorted({*PREFILL_GRID_8192, *(17 * n for n in DECODE_GRID_128)})
    assert (c["error"], c["cudagraph_mode"]) == (None, "FULL_AND_PIECEWISE")
    assert c["prefill_token_sizes"] == PREFILL_GRID_8192 and len(PREFILL_GRID_8192) == 54
    assert c["decode_request_sizes"] == DECODE_GRID_128 and len(DECODE_GRID_128) == 29
    assert c["max_decode_tokens"] == 8192
    assert (c["record"], len(record), c["max_record"]) == (record, 83, 8192)
    _check_capture_order(c, PREFILL_GRID_8192, [(n, 17) for n in DECODE_GRID_128])
    assert (_graphs(c, "FULL")[0][1], _graphs(c, "FULL")[-1][1]) == (2176, 17)
    assert c["dispatch"] == [[128, 2176, 17, ["FULL", 2176, 128]], [5, 600, None, ["PIECEWISE", 640, None]]]
    # §6: DFlash in (c): 29 graphs (17..2176).
    assert c["drafter_graphs"] == {"query_cudagraph_manager": [["FULL", 17 * n, 17, n]
                                                               for n in reversed(DECODE_GRID_128)]}


def test_case_d_h200_ngram_k24_keeps_033s_graphs(answers):
    # Facts §2 (d): prefill = G512 ∪ {25, 50, 100} (54); decode 1..20 (20); record 69, max 512; FULL 20 (25..500),
    # PIECEWISE 54; ngram captures no graphs of its own (§6).
    d = answers["cases"]["d"]
    prefill = sorted({*G512, 25, 50, 100})
    record = sorted({*prefill, *(25 * n for n in range(1, 21))})
    assert (d["error"], d["cudagraph_mode"], d["config"]["speculative_method"]) == (None, "FULL_AND_PIECEWISE", "ngram")
    assert d["prefill_token_sizes"] == prefill and len(prefill) == 54
    assert d["decode_request_sizes"] == list(range(1, 21))
    assert (d["record"], len(record), d["max_record"]) == (record, 69, 512)
    _check_capture_order(d, prefill, [(n, 25) for n in range(1, 21)])
    assert d["drafter_graphs"] == {}


def test_variants_of_the_facts_file(answers):
    v = answers["variants"]
    # §2 (a) on SM100: prefill grid(8192), decode grid(256) (37), record 72, max 8192.
    a = v["a on SM100"]
    assert (a["prefill_token_sizes"], a["decode_request_sizes"]) == (PREFILL_GRID_8192, DECODE_GRID_256)
    assert a["record"] == sorted({*PREFILL_GRID_8192, *DECODE_GRID_256}) and (len(a["record"]), a["max_record"]) == \
        (72, 8192)
    # §2 (d) on SM100: decode grid(256) (37, up to 6400 tokens), prefill grid(8192), record 90.
    d = v["d on SM100"]
    assert (d["prefill_token_sizes"], d["decode_request_sizes"]) == (PREFILL_GRID_8192, DECODE_GRID_256)
    assert _graphs(d, "FULL")[0] == ["FULL", 6400, 25, 256] and len(d["record"]) == 90
    # §2 variants / §6: EAGLE in (b) adds the one-token draft grid(128) to the record (89 entries); its decode
    # manager is FULL_DECODE_ONLY over grid(128) at q = 1 (29 graphs), its prefill manager takes the target's shapes.
    e = v["b with EAGLE"]
    assert e["draft_decode_request_sizes"] == DECODE_GRID_128
    assert e["record"] == sorted({*answers["cases"]["b"]["record"], *DECODE_GRID_128}) and len(e["record"]) == 89
    assert e["drafter_graphs"]["decode_cudagraph_manager"] == [["FULL", n, 1, n] for n in reversed(DECODE_GRID_128)]
    assert e["drafter_graphs"]["prefill_cudagraph_manager"] == e["graphs"]
    # §6: (d) with EAGLE: 37 draft decode graphs (grid(256)).
    assert v["d with EAGLE"]["drafter_graphs"]["decode_cudagraph_manager"] == [["FULL", n, 1, n]
                                                                              for n in reversed(DECODE_GRID_256)]
    # §6: a draft model's prefill manager (StandaloneARSpeculator) takes the target's shapes at K + 2 = 18.
    dm = v["b with a draft model"]["drafter_graphs"]
    assert {g[2] for g in dm["prefill_cudagraph_manager"] if g[0] == "FULL"} == {18}
    assert [g for g in dm["prefill_cudagraph_manager"] if g[0] == "PIECEWISE"] == _graphs(v["b with a draft model"],
                                                                                         "PIECEWISE")
    # §6: multi-module MTP takes the target's query lengths and drops PIECEWISE (not breakable): FULL_DECODE_ONLY,
    # the target's 30 decode graphs; and no one-token draft decode graphs (§6, get_draft_decode_...).
    mm = v["b with multi-module MTP"]
    assert mm["drafter_graphs"] == {"cudagraph_manager": _graphs(mm, "FULL")} and len(_graphs(mm, "FULL")) == 30
    assert mm["draft_decode_request_sizes"] == []
    # §6: under dynamic speculative decoding with fused decode, each draft decode graph is captured once per K of
    # the schedule but 0 and 1: [(1,32,4), (33,64,2), (65,128,1)] captures every one-token graph at K = 4 and 2.
    de = v["dynamic EAGLE"]
    decode = [g for g in de["capture"] if g[0] == "drafter" and g[3] is not None]
    assert decode == [["drafter", "FULL", n, k] for n in reversed(DECODE_GRID_128) for k in (4, 2)]
    assert de["decode_query_lens"] == [[2, 128], [3, 64], [5, 32]]
    # §2 variants: interactivity in (b): the prefill list (79) gains 1..32.
    i = v["b interactivity"]
    assert i["prefill_token_sizes"] == sorted({*answers["cases"]["b"]["prefill_token_sizes"], *range(1, 33)})
    assert len(i["prefill_token_sizes"]) == 79
    # §2 step B: FULL_DECODE_ONLY records the decode graphs only (max 510), and captures no prefill graph.
    f = v["b FULL_DECODE_ONLY"]
    assert (f["record"], f["max_record"]) == ([17 * n for n in range(1, 31)], 510)
    assert _graphs(f, "PIECEWISE") == [] and len(_graphs(f, "FULL")) == 30
    # §2 record: a 256-token decode budget at q = 17 keeps 1..14 and clamps the next size to 15 (255 tokens).
    assert [g[3] for g in _graphs(v["b decode budget 256"], "FULL")] == list(range(15, 0, -1))
    # §2 dynamic speculative decoding, K=16, schedule [(1,32,16),(33,128,8),(129,256,4)]: 70 decode request sizes
    # applied to every tier; q=9 graphs reach 101 requests (909 tokens), q=17 graphs 32 (544); record max 909.
    dyn = v["dynamic"]
    assert dyn["decode_query_lens"] == [[5, 256], [9, 128], [17, 32]]
    assert len(dyn["decode_request_sizes"]) == 70 and dyn["max_record"] == 909
    top = {q: max(g[3] for g in _graphs(dyn, "FULL") if g[2] == q) for q in (5, 9, 17)}
    assert (top[9], top[17]) == (101, 32)
    # §6: DFlash does not expand the tiers: q = 17 alone, for up to max_num_seqs requests within the recorded max
    # (909 // 17 = 53 requests; the first size at or above 53 is clamped to it).
    sizes, limit = dyn["decode_request_sizes"], min(256, 909 // 17)
    reachable = [min(n, limit) for n in sizes[:next(i for i, n in enumerate(sizes) if n >= limit) + 1]]
    assert dyn["drafter_graphs"] == {"query_cudagraph_manager": [["FULL", 17 * n, 17, n] for n in reversed(reachable)]}


def test_validation_of_the_facts_file(answers):
    v = answers["variants"]
    # §1: the deprecated and the new fields together are refused (unless the config is being resolved again).
    assert v["deprecated and new"]["error"] == (
        "ValueError: The deprecated cudagraph_capture_sizes and max_cudagraph_capture_size cannot be combined with the "
        "prefill and decode CUDA graph capture sizes; set only the latter.")
    # §1: re-resolving an already resolved config is accepted and changes nothing.
    again, b = v["b resolved again"], answers["cases"]["b"]
    assert again["error"] is None
    assert all(again[k] == b[k] for k in ("prefill_token_sizes", "decode_request_sizes", "record", "graphs"))
    # §1: a deprecated cudagraph_capture_sizes=[] still trips an AssertionError.
    assert v["deprecated empty"]["error"].startswith("AssertionError: cudagraph_capture_sizes should contain")
    # §1: values outside [1, max_num_batched_tokens] are dropped with a warning, then a list above its cap raises
    # "{name} holds {x}, above {cap_name}={cap}."
    above = v["prefill above its cap"]
    assert above["error"] == ("ValueError: prefill_cudagraph_capture_token_sizes holds 64, above "
                              "max_prefill_cudagraph_capture_tokens=32.")
    assert any("Dropping [9000] from prefill_cudagraph_capture_token_sizes" in w for w in above["warnings"])
    # §1: with every list empty, the mode falls to NONE with the info line the facts quote.
    empty = v["all empty"]
    assert (empty["cudagraph_mode"], empty["record"], empty["max_record"]) == ("NONE", [], 0)
    assert "No CUDA graph capture sizes are left; setting cudagraph_mode to NONE." in empty["warnings"]
    # §1, deprecated fields only: the deprecation warning; decode sizes {min(cdiv(s, q), max_num_seqs)} over the
    # shared list where cdiv(s, q)·q <= its max: (3, 10) at q = 4 gives 1 request (cdiv(10, 4)·4 = 12 > 10).
    alone = v["deprecated alone, speculating"]
    assert any("are deprecated" in w for w in alone["warnings"])
    assert (alone["prefill_token_sizes"], alone["decode_request_sizes"]) == ([3, 10], [1])


def test_where_vllm_contradicts_the_facts_file(answers):
    v = answers["variants"]
    # Facts §1: "the record keeps the shared list" when only the deprecated fields are set. vLLM's record is the
    # shared list plus the decode graphs' tokens (4 = one request of q = 4, not in [3, 10]) ...
    alone = v["deprecated alone, speculating"]
    assert (alone["record"], alone["max_record"]) == ([3, 4, 10], 10)
    # ... and plus the one-token draft grid of EAGLE (grid(256) within the 8192-token budget), so the record's max
    # (256) passes the shared list's (4) and the drafter captures 37 decode graphs from a 3-size deprecated list.
    eagle = v["deprecated alone, EAGLE"]
    assert eagle["prefill_token_sizes"] == [1, 2, 4] and eagle["draft_decode_request_sizes"] == DECODE_GRID_256
    assert eagle["record"] == sorted({1, 2, 3, 4, *DECODE_GRID_256}) and eagle["max_record"] == 256
    # Facts §1: the deprecated and new fields together match "only when re-resolving an already resolved config".
    # They also match when the deprecated list equals the decode tokens vLLM derives from it: [1, 2, 4] at q = 1 with
    # only a prefill list. The record stays [1, 2, 4] (max 4) while a PIECEWISE graph of 8 tokens is captured.
    quirk = v["deprecated equal to its decode tokens, and a prefill list"]
    assert quirk["error"] is None and (quirk["record"], quirk["max_record"]) == ([1, 2, 4], 4)
    assert quirk["graphs"] == [["PIECEWISE", 8, None, None], ["FULL", 4, 1, 4], ["FULL", 2, 1, 2], ["FULL", 1, 1, 1]]


def test_memory_estimate_and_the_extensible_cache(answers):
    # Facts §5: under the extensible KV cache the runner's profile_cudagraph_memory() returns 0; without it the
    # estimate is measured − Σsamples + first + (N_full − 1)·max(second, 1 MiB), sampling the 2 largest FULL target
    # graphs and measuring PIECEWISE and drafter graphs in full.
    m = answers["memory"]
    costs = {tuple(k): v for k, v in m["costs"]}

    def pool_bytes(log: list[list[Any]]) -> tuple[int, list[int]]:
        charged = [costs[tuple(g[:3])][0 if i == 0 else 1] for i, g in enumerate(log)]
        return sum(charged), charged

    real, _ = pool_bytes(m["graphs"])
    assert m["real_bytes"] == real
    full = [g for g in m["graphs"] if g[:2] == ["target", "FULL"]]
    sampled = [g for g in m["profile_graphs"] if g[:2] == ["target", "FULL"]]
    assert sampled == full[:2] and len(full) == 30  # the two largest of (b)'s 30 FULL decode graphs
    assert [g for g in m["profile_graphs"] if g[:2] != ["target", "FULL"]] == \
        [g for g in m["graphs"] if g[:2] != ["target", "FULL"]]  # everything else in full
    measured, charged = pool_bytes(m["profile_graphs"])
    samples = [c for g, c in zip(m["profile_graphs"], charged) if g[:2] == ["target", "FULL"]]
    assert m["estimate_bytes"] == m["estimate_again_bytes"] == \
        measured - sum(samples) + samples[0] + (len(full) - 1) * max(samples[1], MIB)
    assert m["extensible_estimate_bytes"] == 0
    # §6: EAGLE's drafter graphs are captured after the target's: its prefill manager's, then its decode manager's.
    owners = [g[0] for g in m["graphs"]]
    assert owners == ["target"] * owners.count("target") + ["drafter"] * owners.count("drafter")


def test_kv_arithmetic(answers):
    kv = answers["kv"]
    # 32 layers × (K and V) × 8 heads × 128 × 2 bytes.
    assert kv["llama8b_bytes_per_token"] == 32 * 2 * 8 * 128 * 2
    # Facts §5 step 4: non_kv = init_free − free − committed, headroom = free + committed, margin = max(1 GiB,
    # 0.75·peak), available = min(requested − non_kv, headroom − margin) − max(peak, torch growth).
    assert kv["constants"] == {"margin_floor_bytes": GIB, "margin_fraction": 0.75, "non_torch_reserve_bytes": GIB // 2}
    for m, got in kv["measured"]:
        non_kv = m["init_free_memory"] - m["free_memory"] - m["committed_bytes"]
        headroom = m["free_memory"] + m["committed_bytes"]
        margin = max(GIB, int(0.75 * m["transient_peak_bytes"]))
        want = min(m["requested_memory"] - non_kv, headroom - margin) - max(m["transient_peak_bytes"],
                                                                            m["torch_reserve_growth_bytes"])
        assert got == want
    # Granule rounding: 90 GiB over 32 segments of 64 KiB a block holds 46,080 blocks (1,440 granules of 2 MiB each).
    blocks, got = kv["blocks_within"]
    assert blocks["num_bytes"] == 90 * GIB and got == 46_080


def test_vllm_gives_the_hand_worked_answers_on_every_family_and_bound(answers):
    # tests/vllm034/hand_cases.py, worked from the facts file: the wide defaults on 10.0 and 10.3 only (not 8.x, 9.0,
    # 11.0 or 12.x), and the decode graphs within max_num_batched_tokens, the decode token budget and max_num_seqs,
    # the prefill graphs within max_num_batched_tokens, whichever bound is the lowest (test_families_and_bounds_034.py
    # holds cgtune to the same answers without vLLM).
    assert set(answers["hand"]) == set(HAND_CASES)
    for name, case in HAND_CASES.items():
        a = answers["hand"][name]
        assert (a["error"], a["cudagraph_mode"]) == (None, "FULL_AND_PIECEWISE"), name
        got = {"prefill": a["prefill_token_sizes"], "decode": a["decode_request_sizes"],
               "budget": a["max_decode_tokens"], "decode_graphs": sorted([g[3], g[2]] for g in a["graphs"] if g[2] is not None),
               "max_record": a["max_record"], "record": a["record"], "draft": a["draft_decode_request_sizes"],
               "warnings": [w for w in a["warnings"] if w in case.get("warnings", [])]}
        assert {k: got[k] for k in case if k != "config"} == {k: v for k, v in case.items() if k != "config"}, name
    wide = {name for name, a in answers["hand"].items() if name.startswith("a on ") and a["max_decode_tokens"] == 8192}
    assert wide == {"a on 10.0", "a on 10.3"} and len(FAMILIES) == 9


# ------------------------------------------------------------------------------------------------ cgtune's rulebook
def _rulebook() -> Any:
    import importlib.util

    if importlib.util.find_spec("tuner.engines.vllm.v034") is None:  # only its absence skips; a broken one fails
        pytest.skip("cgtune's 0.34 rulebook is not there (tuner/engines/vllm/v034)")
    from tuner.engines.vllm.v034 import defaults, dispatch

    return defaults, dispatch


def _cgtune(defaults: Any, dispatch: Any, answer: dict[str, Any]) -> dict[str, Any]:
    """cgtune's answers for one of vLLM's: the same config through `resolve_capture_sizes`, its `Dispatcher034`'s
    graphs, and its dispatch of the same batches."""
    # Lists stay lists, as vLLM receives them (its schedule must be a list); the capability is a (major, minor) pair.
    cfg = {k: tuple(v) if k == "gpu_capability" else v for k, v in answer["config"].items()}
    try:
        split = defaults.resolve_capture_sizes(**cfg)
    except ValueError as exc:
        return {"error": str(exc)}
    d = dispatch.Dispatcher034.from_split(split, max_num_seqs=cfg["max_num_seqs"],
                                          uniform_decode_query_len=1 + cfg.get("num_speculative_tokens", 0))
    batches = answer.get("batches", [])
    # the cost model's vectorised dispatch of the same batches: (mode, padded tokens; eager: the batch's own)
    modes, padded, _ = d.dispatch_steps(np.array([t for _, t, *_ in batches], dtype=np.int64),
                                        np.array([utc or 0 for _, _, utc, *_ in batches], dtype=np.int64))
    # and the one-step dispatch (the eager share, the decision table and the validation trace ask it)
    ones = [d.dispatch(t, uniform_decode=utc is not None, query_len=utc) for _, t, utc, *_ in batches]
    return {"error": None, "split": split, "graphs": [list(g) for g in d.manager_graphs()],
            "dispatch": [list(d.dispatch_desc(n, t, utc)) for n, t, utc, *_ in batches],
            "steps": [[m, int(w) if m != "NONE" else b[1]] for m, w, b in zip(modes, padded, batches)],
            "one": [[g.runtime_mode, g.padded_size or b[1]] for g, b in zip(ones, batches)],
            "drafter": _drafter_graphs(split, d, cfg)}


def _drafter_graphs(split: Any, d: Any, cfg: dict[str, Any]) -> list[list[Any]] | None:
    """The drafter's graphs `(mode, tokens)` by cgtune's 0.34 drafter rules, sorted (None: no model-based drafter)."""
    from tuner.engines.vllm.v034.drafter_cost import Drafter034

    method = cfg.get("speculative_method")
    if method not in ("dflash", "eagle", "eagle3", "mtp", "draft_model") or not cfg.get("num_speculative_tokens"):
        return None
    dr = Drafter034.rules(method, dispatcher=lambda keys: d, num_speculative_tokens=cfg["num_speculative_tokens"],
                          max_num_seqs=cfg["max_num_seqs"], decode_mode=d.decode_mode,
                          multi_module_mtp=bool(cfg.get("multi_module_mtp")))
    return sorted([m, w] for m, w in dr.graphs(split.record or [0]))


def _compare(defaults: Any, dispatch: Any, name: str, answer: dict[str, Any], out: list[dict[str, Any]],
             checks: Counter[str]) -> None:
    ours = _cgtune(defaults, dispatch, answer)

    def check(area: str, vllm: Any, cgtune: Any, **where: Any) -> bool:
        checks[area] += 1
        if vllm != cgtune:
            out.append({"case": name, "area": area, "config": answer["config"], **where, "vllm": vllm,
                        "cgtune": cgtune})
            return False
        return True

    if not check("refused", answer["error"] is not None, ours["error"] is not None, vllm_error=answer["error"],
                 cgtune_error=ours["error"]) or answer["error"] is not None:
        return
    s = ours["split"]
    if answer["split_resolved"]:
        check("prefill sizes", answer["prefill_token_sizes"], list(s.prefill_token_sizes))
        check("decode sizes", answer["decode_request_sizes"], list(s.decode_request_sizes))
        check("draft decode sizes", answer["draft_decode_request_sizes"], list(s.draft_decode_request_sizes))
    else:
        # With cudagraph_mode NONE or enforce_eager vLLM skips the split: its fields keep the user's lists unfiltered
        # (and the draft grid follows them) while nothing is captured; cgtune's lists are empty then.
        checks["split skipped"] += 1
        check("nothing captured", [], [*s.prefill_token_sizes, *s.decode_request_sizes, *s.draft_decode_request_sizes])
    check("record", [answer["record"], answer["max_record"]], [list(s.record), s.max_record])
    check("mode", answer["cudagraph_mode"], s.cudagraph_mode)
    check("decode token budget", answer["max_decode_tokens"], s.max_decode_tokens)
    # vLLM's warnings, word for word (cgtune prints them); the info line on the mode falling to NONE is not one
    check("warnings", [w for w in answer["warnings"] if not w.startswith("No CUDA graph capture sizes are left")],
          s.warnings)
    check("decode query lens", dict(map(tuple, answer["decode_query_lens"])), dict(s.decode_query_lens))
    if check("graphs", answer["graphs"], ours["graphs"]):
        for batch, got, step, one in zip(answer.get("batches", []), ours["dispatch"], ours["steps"], ours["one"]):
            check("dispatch", batch[4], got, batch=batch[:4])
            if batch[0] <= answer["config"]["max_num_seqs"]:  # a step the scheduler can make (the vectorised
                # dispatch and one step's, like the cost model's steps, never have more requests than max_num_seqs)
                check("dispatch of steps", batch[4][:2], step, batch=batch[:4])
                check("dispatch of one step", batch[4][:2], one, batch=batch[:4])
    if ours["drafter"] is not None and "drafter_graphs" in answer:
        graphs = answer["drafter_graphs"]  # a case's by manager, a random configuration's in one list
        flat = [g for gs in graphs.values() for g in gs] if isinstance(graphs, dict) else graphs
        # The runner captures the drafter's managers only after the target's graphs (GPUModelRunner.capture_model):
        # where the target has none, the drafter's stay uncaptured, and cgtune's drafter graphs are those captured.
        check("drafter graphs", sorted(g[:2] for g in flat) if answer["graphs"] else [], ours["drafter"])


@pytest.fixture(scope="module")
def comparison(answers) -> dict[str, Any]:
    defaults, dispatch = _rulebook()
    out: list[dict[str, Any]] = []
    checks: Counter[str] = Counter()
    for name, answer in {**answers["cases"], **answers["variants"], **answers["hand"]}.items():
        _compare(defaults, dispatch, name, answer, out, checks)
    for limit, dense, grid in answers["varlen"]:  # adaptive verification's grid (cgtune does not resolve it yet)
        checks["varlen grid"] += 1
        if defaults.varlen_grid(limit, dense) != grid:
            out.append({"case": "varlen grid", "limit": limit, "dense_head": dense, "vllm": grid,
                        "cgtune": defaults.varlen_grid(limit, dense)})
    cases = len(out)
    for i, answer in enumerate(answers["configs"]):
        _compare(defaults, dispatch, f"random {i}", answer, out, checks)
    return {"disagreements": out, "case_disagreements": cases, "checks": checks}


def test_cgtune_agrees_with_vllm_on_the_cases_and_every_random_configuration_and_batch(comparison, answers, capsys):
    # One test for both: the comparison is a module fixture, which reaches the rulebook inside the first test that
    # asks for it, and mutation testing (scripts/mutation.sh) runs only the tests that reached a mutant.
    out, cases = comparison["disagreements"], comparison["case_disagreements"]
    shown = "\n".join(json.dumps(d, default=str) for d in out[:cases])
    assert cases == 0, f"{cases} disagreements on the cases:\n{shown}"
    shown = "\n".join(json.dumps(d, default=str) for d in out[:15])
    assert not out, f"{len(out)} disagreements on random configurations, first ones:\n{shown}"
    with capsys.disabled():
        print(f"\nvLLM 0.34 oracle (seed {answers['seed']}): {len(answers['configs'])} configurations, "
              f"{comparison['checks']['dispatch']} batches, {sum(comparison['checks'].values())} checks, "
              f"0 disagreements; vLLM's side took {answers['seconds']} s")


def _bounds(a: dict[str, Any]) -> list[str]:
    """The orderings of the token bounds one accepted configuration has, and where vLLM's own answer shows a bound
    decide its graphs (a looser bound would have captured other ones): max_num_batched_tokens against max_num_seqs x
    q, the decode token budget (SM100's 8192 or a set one) and the prefill cap (SM100's 8192 or a set one), and
    explicit lists past each bound."""
    c = a["config"]
    mnbt, seqs, budget = c["max_num_batched_tokens"], c["max_num_seqs"], a["max_decode_tokens"]
    query_lens = {q: min(n, seqs) for q, n in a["decode_query_lens"]}
    legacy = "cudagraph_capture_sizes" in c or "max_cudagraph_capture_size" in c
    cap = c.get("max_prefill_tokens", 8192 if not legacy and c.get("gpu_capability", [9, 0])[0] == 10 else None)
    grid_prefill = "prefill_token_sizes" not in c and cap is not None and mnbt < cap
    decode_list = [n for n in c.get("decode_request_sizes", ()) if 1 <= n <= seqs]
    out = [name for name, holds in (
        ("max_num_batched_tokens below max_num_seqs x q", mnbt < max(q * n for q, n in query_lens.items())),
        ("max_num_batched_tokens below the decode token budget", budget is not None and mnbt < budget),
        ("decode token budget below max_num_batched_tokens", budget is not None and budget < mnbt),
        ("max_num_batched_tokens below the prefill cap", grid_prefill),
        ("prefill list above max_num_batched_tokens", any(t > mnbt for t in c.get("prefill_token_sizes", ()))),
        ("decode list above max_num_seqs", any(n > seqs for n in c.get("decode_request_sizes", ()))),
        ("decode list above max_num_batched_tokens / q", any(n * q > mnbt for n in decode_list for q in query_lens)),
        ("decode list above the decode token budget / q",
         budget is not None and any(n * q > budget for n in decode_list for q in query_lens))) if holds]
    if not (a["split_resolved"] and a["graphs"]):
        return out
    tight = min(mnbt, budget or mnbt)
    per_q = [(q, most, a["decode_request_sizes"]) for q, most in query_lens.items()]
    per_q.append((1, seqs, a["draft_decode_request_sizes"]))

    def decides(looser: float) -> bool:
        return any(min(most, looser // q) > min(most, tight // q) and any(n > tight // q for n in sizes)
                   for q, most, sizes in per_q)

    out += [name for name, holds in (
        ("decode graphs clipped at max_num_batched_tokens, no decode token budget", budget is None and decides(1e9)),
        ("decode graphs clipped at max_num_batched_tokens below the decode token budget",
         budget is not None and mnbt < budget and decides(budget)),
        ("decode graphs clipped at the decode token budget below max_num_batched_tokens",
         budget is not None and budget < mnbt and decides(mnbt)),
        ("prefill grid clipped at max_num_batched_tokens", grid_prefill and any(g[2] is None for g in a["graphs"]))
    ) if holds]
    return out


def test_the_comparison_covers_what_it_claims(answers, comparison):
    # So that "0 disagreements" means something: every mode, query length, method, GPU family and size knob is met
    # often, vLLM refuses a share of them, and the batches reach past the decode graphs and past every prefill graph.
    configs = answers["configs"]
    checks = comparison["checks"]
    accepted = [a for a in configs if a["error"] is None]
    assert len(configs) == CONFIGS and len(accepted) >= 1700
    assert checks["refused"] >= CONFIGS and checks["graphs"] == checks["record"] >= len(accepted)
    assert checks["dispatch"] >= 40 * len(accepted)
    assert checks["dispatch of steps"] == checks["dispatch of one step"] >= 35 * len(accepted)
    # The drafters' graphs: every model-based method's, over every kind of list and mode the targets meet.
    # the varlen grid: 21 limits (0 among them: vLLM captures none), each with and without the dense head
    assert checks["drafter graphs"] >= 800 and checks["varlen grid"] == 42
    drafted = Counter(a["config"].get("speculative_method") for a in accepted if a.get("drafter_graphs"))
    assert all(drafted[m] >= 50 for m in ("dflash", "eagle", "eagle3", "mtp", "draft_model")), drafted
    seen: Counter[str] = Counter()
    for a in accepted:
        c = a["config"]
        q = 1 + c.get("num_speculative_tokens", 0)
        seen.update([f"mode {c.get('cudagraph_mode', 'FULL_AND_PIECEWISE')}", f"resolved {a['cudagraph_mode']}",
                     f"q {q}", f"method {c.get('speculative_method')}",
                     f"performance {c.get('performance_mode', 'balanced')}", *a["kinds"]])
        if c.get("speculative_schedule"):
            seen["dynamic schedule"] += 1
        if len(a["decode_query_lens"]) > 1:
            seen["several decode query lengths"] += 1
        if a["max_decode_tokens"] == 8192 and c.get("gpu_capability") == [10, 0]:
            seen["SM100 wide defaults"] += 1
        if c.get("multi_module_mtp"):
            seen["multi-module MTP"] += 1
        major, minor = c.get("gpu_capability", [9, 0])
        seen[f"capability {major}.{minor}"] += 1
        legacy = "cudagraph_capture_sizes" in c or "max_cudagraph_capture_size" in c
        if not legacy and a["split_resolved"] and "max_decode_tokens" not in c:
            # SM100's wide defaults decide this config's budget (and its unset lists): vLLM gives them to 10.x only
            seen[f"capability {major}.{minor}: the wide defaults decide"] += 1
            assert (a["max_decode_tokens"] == 8192) is (major == 10), c
        seen.update(_bounds(a))
        widest = max([g[1] for g in a["graphs"] if g[2] is None], default=0)
        for n, t, utc, kind, (mode, *_) in a["batches"]:
            seen[f"batch {kind}"] += 1
            seen[f"dispatched {mode}"] += 1
            if utc is None and 0 < widest < t:
                seen["mixed batch past every prefill graph"] += 1
    for mode in ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"):
        assert seen[f"mode {mode}"] >= 200 and seen[f"resolved {mode}"] >= 200, mode
    assert seen["mode FULL_AND_PIECEWISE"] >= 600
    for key in ("q 1", "q 2", "q 17", "q 25", "performance interactivity", "performance throughput",
                "method dflash", "method eagle", "method eagle3", "method mtp", "method draft_model", "method ngram",
                "method suffix", "multi-module MTP", "SM100 wide defaults", "dynamic schedule",
                "several decode query lengths"):
        assert seen[key] >= 15, key
    for kind in ("default", "deprecated list", "deprecated cap", "deprecated list and its cap", "prefill list",
                 "prefill cap", "prefill list and its cap", "prefill empty list", "decode list", "decode cap",
                 "decode list and its cap", "decode empty list", "decode token budget", "out-of-range values",
                 "resolved config resolved again", "deprecated and new combined"):
        assert seen[kind] >= 10, kind
    refused = [a for a in configs if a["error"] is not None]
    assert sum("deprecated and new combined" in a["kinds"] for a in refused) >= 20
    assert sum(a["error"].startswith("AssertionError") for a in refused) >= 10  # a deprecated []
    assert sum("above max_" in a["error"] for a in refused) >= 20  # a list above its cap
    assert seen["batch decode above the largest decode graph"] >= 5000 and seen["batch decode"] >= 10_000
    assert seen["batch mixed"] >= 20_000 and seen["batch uniform at another query length"] >= 3000
    assert seen["mixed batch past every prefill graph"] >= 3000
    for mode in ("NONE", "PIECEWISE", "FULL"):
        assert seen[f"dispatched {mode}"] >= 5000, mode
    # Every family a deployment runs, the wide defaults deciding in each (so that 12.x or 11.x given them, or 10.3
    # denied them, disagrees), and every ordering of the token bounds, each deciding some configurations' graphs.
    for major, minor in FAMILIES:
        assert seen[f"capability {major}.{minor}"] >= 100 and \
            seen[f"capability {major}.{minor}: the wide defaults decide"] >= 40, (major, minor)
    for key, least in (("max_num_batched_tokens below max_num_seqs x q", 200),
                       ("max_num_batched_tokens below the decode token budget", 150),
                       ("decode token budget below max_num_batched_tokens", 150),
                       ("max_num_batched_tokens below the prefill cap", 80),
                       ("prefill list above max_num_batched_tokens", 50), ("decode list above max_num_seqs", 80),
                       ("decode list above max_num_batched_tokens / q", 20),
                       ("decode list above the decode token budget / q", 20),
                       ("decode graphs clipped at max_num_batched_tokens, no decode token budget", 20),
                       ("decode graphs clipped at max_num_batched_tokens below the decode token budget", 20),
                       ("decode graphs clipped at the decode token budget below max_num_batched_tokens", 60),
                       ("prefill grid clipped at max_num_batched_tokens", 50)):
        assert seen[key] >= least, (key, seen[key])


# --------------------------------------------------------------------------------- `cgtune defaults` against vLLM 0.34
def _case_workload(tmp_path: Path, name: str, config: dict[str, Any]) -> Path:
    """The case as a workload pinned to vLLM 0.34 (a model-based method gets a drafter shape)."""
    method = config.get("speculative_method")
    spec: dict[str, Any] = {
        "name": f"case-{name}", "model": {"preset": "llama-3.1-8b", "dtype": "bfloat16"},
        "serving": {"max_num_seqs": config["max_num_seqs"], "max_num_batched_tokens": config["max_num_batched_tokens"],
                    "num_speculative_tokens": config.get("num_speculative_tokens", 0), "vllm_version": "0.34",
                    "gpu_capability": ".".join(map(str, config.get("gpu_capability", (9, 0)))),
                    "cudagraph_mode": config.get("cudagraph_mode", "FULL_AND_PIECEWISE"),
                    "performance_mode": config.get("performance_mode", "balanced")},
        "traffic": {"requests": {"kind": "uniform", "min": 1, "max": config["max_num_seqs"]}},
    }
    if method is not None:
        spec["speculative"] = {"method": method, **({"drafter": {"num_layers": 1}} if method != "ngram" else {})}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize("case", ["a", "b", "c", "d"])
def test_cgtune_defaults_prints_vllm_034s_own_resolution_of_the_four_cases(answers, tmp_path, case):
    # Issue 42's must-show: `cgtune defaults` for a 0.34 workload is 0.34's own resolution, every list and field.
    vllm = answers["cases"][case]
    proc = subprocess.run([sys.executable, "-m", "tuner.cli", "defaults", str(_case_workload(tmp_path, case,
                                                                                             vllm["config"])),
                           "--json"], capture_output=True, text=True, timeout=300, cwd=SCRIPT.parents[2])
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["vllm_version"] == "0.34"
    assert got["decode_cudagraph_capture_request_sizes"] == vllm["decode_request_sizes"]
    assert got["prefill_cudagraph_capture_token_sizes"] == vllm["prefill_token_sizes"]
    assert got["cudagraph_capture_sizes"] == vllm["record"] and got["max_cudagraph_capture_size"] == vllm["max_record"]
    assert got["max_decode_cudagraph_capture_tokens"] == vllm["max_decode_tokens"]
    assert got["draft_decode_request_sizes"] == vllm["draft_decode_request_sizes"]
    assert got["cudagraph_mode"] == vllm["cudagraph_mode"]
