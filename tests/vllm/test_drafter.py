"""Drafter rules (vLLM 0.33): graph sets per runner and method, per-step passes, pool order, KV layers, weights.

Expected values come from the facts file's worked example (reference/vllm-drafter-facts.md §7) or are computed by
hand in the comments; nothing here is a measurement."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.engines.vllm import Dispatcher
from tuner.engines.vllm.drafter import (
    MODEL_BASED_METHODS,
    MODEL_FREE_METHODS,
    SPECULATIVE_METHODS,
    DrafterGraph,
    DrafterPass,
    EagerDrafterPasses,
    capture_sequence,
    drafter_graphs,
    drafter_kv_bytes_per_token,
    drafter_kv_layers,
    drafter_passes,
    drafter_weight_bytes,
    eager_drafter_passes,
    v1_only,
)
from tuner.shapes import ModelShape

# The facts file's worked example (§7): S, K = 3 (q = 4), max_num_seqs 16, FULL_AND_PIECEWISE.
S = [1, 2, 4, 8, 16, 24, 32, 48, 64]
S_V1 = [4, 8, 16, 24, 32, 48, 64]  # V1's rewrite of S for K = 3 (facts §2a CPU sim); the caller applies it
K, R, MODE = 3, 16, "FULL_AND_PIECEWISE"


def graphs(method, runner, sizes=None, **kw):
    kw.setdefault("cudagraph_mode", MODE)
    kw.setdefault("num_speculative_tokens", K)
    kw.setdefault("max_num_seqs", R)
    return drafter_graphs(method, runner=runner, capture_sizes=S if sizes is None else sizes, **kw)


def passes(method, runner, n, sizes=None, *, t=None, uniform=True, **kw):
    kw.setdefault("cudagraph_mode", MODE)
    kw.setdefault("num_speculative_tokens", K)
    kw.setdefault("max_num_seqs", R)
    t = n * (kw["num_speculative_tokens"] + 1) if t is None else t
    return drafter_passes(
        method, runner=runner, num_requests=n, num_tokens=t, uniform_decode=uniform,
        capture_sizes=(S if runner == "v2" else S_V1) if sizes is None else sizes, **kw,
    )


def shape(gs):
    return [(g.mode, g.num_tokens) for g in gs]


# ----------------------------------------------------------------------------- method sets and the runner


def test_method_sets_split_model_based_from_model_free():
    assert set(MODEL_BASED_METHODS) == {"eagle", "eagle3", "mtp", "dflash", "draft_model"}
    assert set(MODEL_FREE_METHODS) == {"ngram", "ngram_gpu", "suffix", "custom_class"}
    assert set(SPECULATIVE_METHODS) == set(MODEL_BASED_METHODS) | set(MODEL_FREE_METHODS)


def test_v1_only_for_suffix_custom_class_and_parallel_drafting_outside_dflash():
    assert v1_only("suffix") and v1_only("custom_class")
    assert not any(v1_only(m) for m in ("eagle", "eagle3", "mtp", "dflash", "draft_model", "ngram", "ngram_gpu"))
    assert v1_only("eagle", parallel_drafting=True)  # P-EAGLE
    assert v1_only("draft_model", parallel_drafting=True)  # PARD
    assert not v1_only("dflash", parallel_drafting=True)  # DFlash always drafts in parallel, on V2


def test_v2_refuses_what_vllm_runs_on_v1():
    with pytest.raises(ValueError, match="runner='v2' does not run method='suffix'"):
        graphs("suffix", "v2")
    with pytest.raises(ValueError, match="with parallel drafting"):
        passes("eagle", "v2", 5, parallel_drafting=True)
    with pytest.raises(ValueError, match="method='medusa' must be one of"):
        graphs("medusa", "v2")
    with pytest.raises(ValueError, match="runner='v3'"):
        graphs("eagle", "v3")


# ----------------------------------------------------------------------------- worked example: graph sets


def test_worked_example_v1_drafter_captures_one_piecewise_graph_per_rewritten_size():
    for method in ("eagle", "eagle3", "mtp", "draft_model"):
        gs = graphs(method, "v1", S_V1)
        assert shape(gs) == [("PIECEWISE", s) for s in (64, 48, 32, 24, 16, 8, 4)]  # 7 graphs, largest first
    # DFlash captures at pad(min(s, R*(K+1))) = pad(min(s, 64)): the same 7 here.
    assert shape(graphs("dflash", "v1", S_V1)) == [("PIECEWISE", s) for s in (64, 48, 32, 24, 16, 8, 4)]


def test_worked_example_v2_eagle_prefill_is_the_targets_set_and_decode_is_full_up_to_max_num_seqs():
    gs = graphs("eagle", "v2")
    prefill = [g for g in gs if g.role == "prefill"]
    decode = [g for g in gs if g.role == "decode"]
    target = Dispatcher(S, cudagraph_mode=MODE, decode_query_len=K + 1, max_num_seqs=R).graphs()
    assert shape(prefill) == target
    assert len(prefill) == 16  # PW 9 {1..64} + FULL 7 {4..64}
    assert [w for m, w in target if m == "FULL"] == [64, 48, 32, 24, 16, 8, 4]
    assert shape(decode) == [("FULL", s) for s in (16, 8, 4, 2, 1)]
    assert all(g.num_draft_steps == K - 1 and g.uniform_query_len == 1 for g in decode)  # fused: K-1 steps each
    assert gs == prefill + decode  # prefill manager first, then the decode manager


def test_worked_example_v2_dflash_full_only_and_draft_model_none():
    assert shape(graphs("dflash", "v2")) == [("FULL", s) for s in (64, 48, 32, 24, 16, 8, 4)]
    assert all(g.uniform_query_len == K + 1 for g in graphs("dflash", "v2"))
    assert graphs("draft_model", "v2") == []


def test_max_num_seqs_20_gives_the_same_decode_set_so_17_to_20_requests_draft_eager():
    decode = [g.num_tokens for g in graphs("eagle", "v2", max_num_seqs=20) if g.role == "decode"]
    assert decode == [16, 8, 4, 2, 1]
    for n in range(17, 21):
        step = passes("eagle", "v2", n, max_num_seqs=20)
        assert step[-1] == DrafterPass("decode", n, "NONE", None, K - 1)
    eager = eager_drafter_passes(
        "eagle", runner="v2", request_counts=range(1, 21), capture_sizes=S, cudagraph_mode=MODE,
        num_speculative_tokens=K, max_num_seqs=20,
    )
    # N = 17..20: the prefill pass is 68..80 tokens, above the largest size 64, so it runs eager as well.
    assert eager == [
        EagerDrafterPasses("prefill", (17, 18, 19, 20), (68, 72, 76, 80)),
        EagerDrafterPasses("decode", (17, 18, 19, 20), (17, 18, 19, 20)),
    ]
    assert eager[1].describe("eagle", "v2") == "v2 eagle decode passes at N = 17..20 (17..20 tokens) run eager"


def test_model_free_methods_add_no_graphs_no_passes():
    for method in MODEL_FREE_METHODS:
        runners = ("v1",) if v1_only(method) else ("v1", "v2")
        for runner in runners:
            assert graphs(method, runner) == []
            assert passes(method, runner, 5) == []
            assert eager_drafter_passes(
                method, runner=runner, request_counts=[1, 5, 16], capture_sizes=S, cudagraph_mode=MODE,
                num_speculative_tokens=K, max_num_seqs=R,
            ) == []


# ----------------------------------------------------------------------------- worked example: passes for N = 5


def test_worked_example_v1_passes_for_five_requests():
    # Pass 1 over all T = 20 target tokens -> PW 24; passes 2-3 over N = 5 tokens -> PW 8 each.
    assert passes("eagle", "v1", 5) == [
        DrafterPass("prefill", 20, "PIECEWISE", 24),
        DrafterPass("decode", 5, "PIECEWISE", 8, repeats=2),
    ]


def test_worked_example_v2_passes_for_five_requests():
    target = Dispatcher(S, cudagraph_mode=MODE, decode_query_len=4, max_num_seqs=R).dispatch(20, uniform_decode=True)
    assert (target.runtime_mode, target.padded_size) == ("FULL", 24)
    # Target FULL 24 -> EAGLE prefill FULL 24 -> decode FULL 8, one replay for both steps when fused.
    assert passes("eagle", "v2", 5) == [
        DrafterPass("prefill", 24, "FULL", 24),
        DrafterPass("decode", 5, "FULL", 8, repeats=2, fused=True),
    ]
    assert passes("eagle", "v2", 5, fused_decode=False)[1] == DrafterPass("decode", 5, "FULL", 8, repeats=2)
    assert graphs("eagle", "v2", fused_decode=False)[-1].num_draft_steps == 1  # one step per replay


def test_dflash_one_query_pass_per_step():
    # V2: N*(K+1) = 20 -> FULL 24, context included in the graph; V1: eager context over T, then PW 24.
    assert passes("dflash", "v2", 5) == [DrafterPass("query", 20, "FULL", 24)]
    assert passes("dflash", "v1", 5) == [
        DrafterPass("context", 20, "NONE", None), DrafterPass("query", 20, "PIECEWISE", 24),
    ]
    # A V2 step with prefills (T = 100): context rows beyond the graph's 24 are precomputed eagerly.
    assert passes("dflash", "v2", 5, t=100, uniform=False) == [
        DrafterPass("context", 76, "NONE", None), DrafterPass("query", 20, "FULL", 24),
    ]


def test_draft_model_passes():
    # V1: T + N = 25 -> PW 32, then K-1 passes of N -> PW 8; V2: the same widths, all eager.
    assert passes("draft_model", "v1", 5) == [
        DrafterPass("prefill", 25, "PIECEWISE", 32), DrafterPass("decode", 5, "PIECEWISE", 8, repeats=2),
    ]
    assert passes("draft_model", "v2", 5) == [
        DrafterPass("prefill", 25, "NONE", None), DrafterPass("decode", 5, "NONE", None, repeats=2),
    ]


def test_one_pass_with_k_1_or_parallel_drafting():
    one = passes("eagle", "v2", 5, num_speculative_tokens=1)
    # q = 2: FULL widths round_up(s, 2) <= min(64, 32): {2,4,8,16,24,32}; T = 10 -> FULL 16.
    assert one == [DrafterPass("prefill", 16, "FULL", 16)]
    assert not [g for g in graphs("eagle", "v2", num_speculative_tokens=1) if g.role == "decode"]
    assert passes("eagle", "v1", 5, num_speculative_tokens=1) == [DrafterPass("prefill", 10, "PIECEWISE", 16)]
    # P-EAGLE: one pass of T + (K-1)*N = 30 -> PW 32; PARD: T + K*N = 35 -> PW 48.
    assert passes("eagle", "v1", 5, parallel_drafting=True) == [DrafterPass("parallel", 30, "PIECEWISE", 32)]
    assert passes("draft_model", "v1", 5, parallel_drafting=True) == [DrafterPass("parallel", 35, "PIECEWISE", 48)]


def test_v2_prefill_follows_the_targets_dispatch_for_mixed_fallback_and_eager_steps():
    # Mixed step: 5 requests, 30 tokens -> PIECEWISE 32, decode steps still FULL 8.
    assert passes("eagle", "v2", 5, t=30, uniform=False) == [
        DrafterPass("prefill", 32, "PIECEWISE", 32), DrafterPass("decode", 5, "FULL", 8, repeats=2, fused=True),
    ]
    # K = 4, 16 requests: T = 80 > 64 runs eager (target and drafter prefill); 16 requests still have FULL 16.
    assert passes("eagle", "v2", 16, num_speculative_tokens=4) == [
        DrafterPass("prefill", 80, "NONE", None), DrafterPass("decode", 16, "FULL", 16, repeats=3, fused=True),
    ]
    # q = 17, 2 seqs (as in test_dispatch): a 34-token decode step replays the target's PIECEWISE 40; so does the
    # drafter's prefill; the decode manager holds {1, 2}.
    sizes = [1, 2, 4, 8, 16, 17, 40]
    assert passes("eagle", "v2", 2, sizes, num_speculative_tokens=16, max_num_seqs=2) == [
        DrafterPass("prefill", 40, "PIECEWISE", 40), DrafterPass("decode", 2, "FULL", 2, repeats=15, fused=True),
    ]


# ----------------------------------------------------------------------------- modes and knobs


def test_full_decode_only_leaves_the_v1_drafter_eager():
    assert graphs("eagle", "v1", S_V1, cudagraph_mode="FULL_DECODE_ONLY") == []
    assert passes("eagle", "v1", 5, cudagraph_mode="FULL_DECODE_ONLY") == [
        DrafterPass("prefill", 20, "NONE", None), DrafterPass("decode", 5, "NONE", None, repeats=2),
    ]
    # V2 keeps its graphs: the prefill manager's FULL set and the decode manager.
    v2 = graphs("eagle", "v2", cudagraph_mode="FULL_DECODE_ONLY")
    assert {g.mode for g in v2} == {"FULL"} and len(v2) == 7 + 5


def test_speculative_enforce_eager_acts_on_v1_only():
    assert graphs("eagle", "v1", S_V1, speculative_enforce_eager=True) == []
    assert passes("eagle", "v1", 5, speculative_enforce_eager=True)[0].runtime_mode == "NONE"
    assert graphs("eagle", "v2", speculative_enforce_eager=True) == graphs("eagle", "v2")


def test_v1_pure_full_mode_captures_no_drafter_graphs():
    # Target captures are all FULL, and the drafter captures only inside PIECEWISE ones (facts §2a, inferred).
    assert graphs("eagle", "v1", S_V1, cudagraph_mode="FULL") == []
    assert graphs("eagle", "v1", S_V1, cudagraph_mode="PIECEWISE") == graphs("eagle", "v1", S_V1)


def test_piecewise_mode_runs_v2_eagle_decode_steps_and_dflash_eager():
    gs = graphs("eagle", "v2", cudagraph_mode="PIECEWISE")
    assert shape(gs) == [("PIECEWISE", s) for s in reversed(S)] and {g.role for g in gs} == {"prefill"}
    assert passes("eagle", "v2", 5, cudagraph_mode="PIECEWISE") == [
        DrafterPass("prefill", 24, "PIECEWISE", 24), DrafterPass("decode", 5, "NONE", None, repeats=2),
    ]
    assert graphs("dflash", "v2", cudagraph_mode="PIECEWISE") == []
    assert passes("dflash", "v2", 5, cudagraph_mode="PIECEWISE") == [
        DrafterPass("context", 20, "NONE", None), DrafterPass("query", 20, "NONE", None),
    ]


def test_no_graphs_at_all_under_none():
    for runner in ("v1", "v2"):
        assert graphs("eagle", runner, cudagraph_mode="NONE") == []
        assert all(p.runtime_mode == "NONE" for p in passes("eagle", runner, 5, cudagraph_mode="NONE"))


def test_dflash_v1_caps_its_graphs_at_the_widest_query():
    # R = 4, K = 3: the widest query is 16, so every size above 16 captures pad(16) = 16 (once).
    gs = graphs("dflash", "v1", S_V1, max_num_seqs=4)
    assert shape(gs) == [("PIECEWISE", 16), ("PIECEWISE", 8), ("PIECEWISE", 4)]


def test_v1_disable_padded_drafter_batch():
    # Pass 1 runs over sum(accepted + 1) tokens: 5 requests with 7 accepted drafts -> 12 -> PW 16.
    step = passes("eagle", "v1", 5, disable_padded_drafter_batch=True, first_pass_tokens=12)
    assert step[0] == DrafterPass("prefill", 12, "PIECEWISE", 16)
    with pytest.raises(ValueError, match="first_pass_tokens=None"):
        passes("eagle", "v1", 5, disable_padded_drafter_batch=True)
    with pytest.raises(ValueError, match="disable_padded_drafter_batch=True is rejected by vLLM with method='dflash'"):
        passes("dflash", "v1", 5, disable_padded_drafter_batch=True)


def test_multi_module_mtp_runs_k_passes_in_one_full_graph():
    gs = graphs("mtp", "v2", multi_module_mtp=True)
    assert shape(gs) == [("FULL", s) for s in (64, 48, 32, 24, 16, 8, 4)]
    assert all(g.num_draft_steps == K and g.role == "pass" for g in gs)
    assert passes("mtp", "v2", 5, multi_module_mtp=True) == [DrafterPass("pass", 24, "FULL", 24, repeats=3, fused=True)]
    # A mixed step has no graph: K eager passes at the target's padded width (PIECEWISE 32).
    assert passes("mtp", "v2", 5, t=30, uniform=False, multi_module_mtp=True) == [
        DrafterPass("pass", 32, "NONE", None, repeats=3),
    ]
    with pytest.raises(ValueError, match="multi_module_mtp=True needs method='mtp'"):
        graphs("eagle", "v2", multi_module_mtp=True)


# ----------------------------------------------------------------------------- dynamic speculative schedules


def test_dynamic_schedule_duplicates_fused_decode_graphs_per_k_and_prefill_full_graphs_per_tier():
    gs = graphs("eagle", "v2", dynamic_ks={0, 2, 3})
    decode = [(g.num_tokens, g.num_draft_steps) for g in gs if g.role == "decode"]
    # k in {2, 3} (0 and 1 have no decode steps): per width, largest k first.
    assert decode == [(16, 2), (16, 1), (8, 2), (8, 1), (4, 2), (4, 1), (2, 2), (2, 1), (1, 2), (1, 1)]
    full = [(g.num_tokens, g.uniform_query_len) for g in gs if g.role == "prefill" and g.mode == "FULL"]
    # Tiers ql = 1, 3, 4, each round_up(s, ql) <= min(64, 16*ql) (<= 16 requests):
    # ql 1 -> {1,2,4,8,16}; ql 3 -> {3,6,9,18,24,33,48}; ql 4 -> {4,8,16,24,32,48,64}.
    assert sorted(full) == sorted(
        [(s, 1) for s in (1, 2, 4, 8, 16)] + [(s, 3) for s in (3, 6, 9, 18, 24, 33, 48)]
        + [(s, 4) for s in (4, 8, 16, 24, 32, 48, 64)]
    )
    assert [w for w, _ in full] == sorted((w for w, _ in full), reverse=True)
    # Equal widths keep vLLM's insertion order (sizes ascending, then query lengths ascending).
    assert [ql for w, ql in full if w == 24] == [3, 4] and [ql for w, ql in full if w == 16] == [1, 4]
    # Without fusion the decode graph is one step and is not specialised per k.
    assert [g.num_draft_steps for g in graphs("eagle", "v2", dynamic_ks={0, 2, 3}, fused_decode=False)
            if g.role == "decode"] == [1] * 5


def test_dynamic_schedule_passes_use_the_steps_tier():
    # k = 1 for 12 requests: T = 24 -> the ql-2 FULL graph of 24; no decode steps.
    step = passes("eagle", "v2", 12, num_speculative_tokens=1, dynamic_ks={1, 3})
    assert step == [DrafterPass("prefill", 24, "FULL", 24)]
    with pytest.raises(ValueError, match="num_speculative_tokens=2 is not a k of the dynamic schedule"):
        passes("eagle", "v2", 5, num_speculative_tokens=2, dynamic_ks={1, 3})


def test_a_step_without_drafts_still_runs_the_eagle_prefill_pass():
    # k = 0: 5 requests x 1 token; the ql-1 tier's FULL graphs are {1,2,4,8,16} (<= 16 requests) -> FULL 8.
    step = passes("eagle", "v2", 5, num_speculative_tokens=0, dynamic_ks={0, 3})
    assert step == [DrafterPass("prefill", 8, "FULL", 8)]
    assert passes("eagle", "v1", 5, num_speculative_tokens=0) == [DrafterPass("prefill", 5, "PIECEWISE", 8)]
    with pytest.raises(ValueError, match="num_speculative_tokens=0 is not modelled for method='dflash'"):
        passes("dflash", "v2", 5, num_speculative_tokens=0)


def test_eager_passes_under_a_dense_schedule():
    # k = 3 for 1..8 requests, k = 1 for 9..16; sizes up to 16: q = 4 at N <= 8 gives T <= 32, above 16 from N = 5.
    dense = [0] + [3] * 8 + [1] * 8
    eager = eager_drafter_passes(
        "eagle", runner="v2", request_counts=range(1, 17), capture_sizes=[1, 2, 4, 8, 16], cudagraph_mode=MODE,
        num_speculative_tokens=3, max_num_seqs=16, dense_schedule=dense,
    )
    # Prefill eager where T > 16: N = 5..8 (q 4: 20..32) and N = 9..16 (q 2: 18..32); decode only runs at k = 3.
    assert eager == [EagerDrafterPasses("prefill", tuple(range(5, 17)), (18, 20, 22, 24, 26, 28, 30, 32))]


# ----------------------------------------------------------------------------- the shared pool


def test_capture_sequence_v2_target_then_speculator():
    target = Dispatcher(S, cudagraph_mode=MODE, decode_query_len=4, max_num_seqs=R).graphs()
    drafter = graphs("eagle", "v2")
    seq = capture_sequence(runner="v2", target_graphs=list(reversed(target)), drafter=drafter)
    assert seq[:16] == [("target", m, w) for m, w in target]  # re-sorted: PIECEWISE then FULL, largest first
    assert seq[16:] == [("drafter", g.mode, g.num_tokens) for g in drafter]


def test_capture_sequence_v1_interleaves_drafter_after_each_piecewise_target_graph():
    target = Dispatcher(S_V1, cudagraph_mode=MODE, decode_query_len=4, max_num_seqs=R).graphs()
    seq = capture_sequence(runner="v1", target_graphs=target, drafter=graphs("eagle", "v1", S_V1))
    pw = [x for s in (64, 48, 32, 24, 16, 8, 4) for x in (("target", "PIECEWISE", s), ("drafter", "PIECEWISE", s))]
    assert seq == pw + [("target", "FULL", s) for s in (64, 48, 32, 24, 16, 8, 4)]


def test_capture_sequence_v1_dflash_cap_rides_on_the_first_target_capture():
    target = Dispatcher(S_V1, cudagraph_mode=MODE, decode_query_len=4, max_num_seqs=4).graphs()
    seq = capture_sequence(runner="v1", target_graphs=target, drafter=graphs("dflash", "v1", S_V1, max_num_seqs=4))
    drafter_at = [i for i, x in enumerate(seq) if x[0] == "drafter"]
    assert [seq[i][2] for i in drafter_at] == [16, 8, 4]
    assert [seq[i - 1][2] for i in drafter_at] == [64, 8, 4]  # 16 is captured inside the 64-token target capture
    with pytest.raises(ValueError, match="drafter graph of width 100"):
        capture_sequence(
            runner="v1", target_graphs=[("PIECEWISE", 64)], drafter=[DrafterGraph("PIECEWISE", 100, "pass")]
        )


# ----------------------------------------------------------------------------- KV layers and weights


TARGET = ModelShape(64, 2, 4, 2, 16, 128, 256)  # the `tiny` preset's shape
HEAD = ModelShape(64, 1, 4, 2, 16, 128, 256)  # a hand-made one-layer EAGLE head on it


def test_drafter_kv_layers():
    assert drafter_kv_layers("eagle", 1) == 1
    assert drafter_kv_layers("eagle3", 1) == 1
    assert drafter_kv_layers("dflash", 5) == 5
    assert drafter_kv_layers("mtp", 61, num_nextn_predict_layers=1) == 1  # DeepSeek: its predict layers only
    assert drafter_kv_layers("draft_model", 16) == 16
    assert all(drafter_kv_layers(m, 4) == 0 for m in MODEL_FREE_METHODS)


def test_drafter_kv_bytes_per_token_by_hand():
    # Llama-3.1-8B-sized EAGLE head, one layer: 2 x 1 layer x 8 kv heads x 128 x 2 bytes = 4096 B per token.
    head = ModelShape(4096, 1, 32, 8, 128, 14336, 128256)
    assert drafter_kv_bytes_per_token("eagle", head, "bfloat16") == 4096
    assert drafter_kv_bytes_per_token("eagle", head, "bfloat16", 2) == 2048  # 4 kv heads per rank
    assert drafter_kv_bytes_per_token("ngram", head, "bfloat16") == 0


def test_drafter_weight_bytes_by_hand():
    # HEAD, params: layer = qkv 64*(4+2*2)*16 = 8192 + o 4*16*64 = 4096 + mlp 3*64*128 = 24576 + norms 128
    # = 36992; embedding 256*64 = 16384; LM head 16384; final norm 64. Total 69824 params = 139648 B (bf16).
    assert HEAD.weight_bytes("bfloat16") == 139648
    # EAGLE shares the target's embedding and LM head: 69824 - 2*16384 = 37056 params = 74112 B.
    assert drafter_weight_bytes("eagle", HEAD, TARGET, "bfloat16") == 74112
    # An MTP module adds eh_proj (2*64 -> 64: 8192 params) and its two input norms (128): 45376 params = 90752 B.
    assert drafter_weight_bytes("mtp", HEAD, TARGET, "bfloat16") == 90752
    # draft_model never shares: every byte counts.
    assert drafter_weight_bytes("draft_model", HEAD, TARGET, "bfloat16") == 139648
    # Own embedding, shared LM head: 139648 - 32768 = 106880 B.
    assert drafter_weight_bytes("eagle", HEAD, TARGET, "bfloat16", shares_embedding=False) == 106880
    # TP 2: layer 64*(2+2)*16 + 2*16*64 + 3*64*64 + 128 = 18560; vocab 128 rows: 8192 each; shared -> 18624 params.
    assert drafter_weight_bytes("eagle", HEAD, TARGET, "bfloat16", 2) == 37248
    assert all(drafter_weight_bytes(m, HEAD, TARGET, "bfloat16") == 0 for m in MODEL_FREE_METHODS)


def test_shared_embedding_is_not_counted_twice():
    tied = ModelShape(64, 1, 4, 2, 16, 128, 256, tie_word_embeddings=True)
    # Tied: 36992 + 16384 + 64 = 53440 params; sharing removes the one embedding once -> 37056 params.
    assert tied.weight_bytes("bfloat16") == 106880
    assert drafter_weight_bytes("eagle", tied, TARGET, "bfloat16") == 74112
    # Target plus drafter hold exactly one embedding and one LM head between them.
    both = TARGET.weight_bytes("bfloat16") + drafter_weight_bytes("eagle", HEAD, TARGET, "bfloat16")
    assert both == TARGET.weight_bytes("bfloat16") + (HEAD.weight_bytes("bfloat16") - 2 * 16384 * 2)


def test_weight_sharing_needs_matching_shapes():
    other_vocab = ModelShape(64, 1, 4, 2, 16, 128, 512)
    # EAGLE by default shares only what matches the target: here nothing, so the whole drafter counts.
    assert drafter_weight_bytes("eagle3", other_vocab, TARGET, "bfloat16") == other_vocab.weight_bytes("bfloat16")
    with pytest.raises(ValueError, match=r"vocab_size x hidden_size \(512 x 64\)"):
        drafter_weight_bytes("mtp", other_vocab, TARGET, "bfloat16")
    with pytest.raises(ValueError, match="never shares"):
        drafter_weight_bytes("draft_model", HEAD, TARGET, "bfloat16", shares_lm_head=True)


# ----------------------------------------------------------------------------- V2 descriptor set vs dispatch.py


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 300), min_size=1, max_size=12, unique=True),
    k=st.integers(1, 8),
    max_num_seqs=st.integers(1, 64),
    mode=st.sampled_from(["PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"]),
)
def test_v2_prefill_set_without_a_schedule_is_the_target_dispatchers(sizes, k, max_num_seqs, mode):
    prefill = [g for g in graphs("eagle", "v2", sizes, cudagraph_mode=mode, num_speculative_tokens=k,
                                 max_num_seqs=max_num_seqs) if g.role == "prefill"]
    target = Dispatcher(sizes, cudagraph_mode=mode, decode_query_len=k + 1, max_num_seqs=max_num_seqs).graphs()
    assert shape(prefill) == target
