"""The six places where cgtune's rulebook disagreed with vLLM 0.33's own code (issue 19), each as its minimal case with
vLLM's answer. The answers were read by running vLLM's own dispatch, graph-set and profiling code from its 0.33.0
wheel on CPU; tests/vllm/test_vllm_oracle.py re-derives every one of them from vLLM where vLLM is installed."""

from __future__ import annotations

from tuner.engines.vllm.defaults import default_capture_sizes
from tuner.engines.vllm.dispatch import Dispatch
from tuner.engines.vllm.drafter import drafter_graphs, drafter_passes
from tuner.engines.vllm.memory import MIB, GraphCost, estimate_v1_bytes, estimate_v2_bytes
from tuner.engines.engine import Engine
from tuner.engines.registry import engine_of
from tuner.workload.spec import ServingConfig


def test_case5_v1_samples_full_on_top_of_the_piecewise_graphs_in_one_profiling_pool():
    # V1, K=0, sizes [1]: PW1 takes 100 MiB alone; FULL1 150 MiB alone but 10 MiB on top of PW1. V1's
    # profile_cudagraph_memory captures PIECEWISE then FULL into one profiling pool it never clears, so FULL's first
    # sample is the 10 MiB increment: max(100, 10) = 100 MiB (cgtune took FULL's standalone 150 MiB).
    graphs = [GraphCost("target", "PIECEWISE", 1, 100 * MIB, 100 * MIB),
              GraphCost("target", "FULL", 1, 150 * MIB, 10 * MIB)]
    assert estimate_v1_bytes(graphs) == 100 * MIB
    # Alone in the pool (FULL mode, no PIECEWISE sample before it) FULL's first sample is its standalone footprint.
    assert estimate_v1_bytes(graphs[1:]) == 150 * MIB


def _engine(**kwargs: object) -> Engine:
    return engine_of(ServingConfig(**{"max_num_batched_tokens": 512, **kwargs}))  # type: ignore[arg-type]


def test_case1_v2_tier_decode_step_replays_its_tiers_full_graph():
    # V2, FULL_AND_PIECEWISE, K=1, max_num_seqs 1, schedule [[1,1,0]], sizes [1,2]: every step drafts k=0, so the
    # FULL decode graphs are at query length 1 (round_up(1, 1) = 1; 2 would hold 2 requests). vLLM captures
    # [PW2, PW1, FULL1] and replays FULL 1 for the one-token decode step (cgtune had FULL2 and PIECEWISE 1).
    s = _engine(max_num_seqs=1, num_speculative_tokens=1, speculative_schedule=((1, 1, 0),))
    d = s.dispatcher([1, 2])
    assert d.graphs() == [("PIECEWISE", 2), ("PIECEWISE", 1), ("FULL", 1)]
    assert s.decode_step(1) == (1, 1)
    assert d.dispatch(1, uniform_decode=True, query_len=1) == Dispatch("FULL", 1)


def test_case2_another_tiers_graph_at_the_smallest_full_width_shadows_the_steps_own():
    # V2, K=2, max_num_seqs 8, schedule [[1,1,2],[2,8,1]], sizes [4,6]: FULL graphs 6 (ql 3), 6 (ql 2), 4 (ql 2). A
    # one-request 3-token decode step meets the smallest FULL width >= 3 first, 4, which holds only a ql-2 graph:
    # vLLM replays PIECEWISE 4 (cgtune said FULL 6); under FULL_DECODE_ONLY it runs eager.
    kwargs = dict(max_num_seqs=8, num_speculative_tokens=2, speculative_schedule=((1, 1, 2), (2, 8, 1)))
    d = _engine(**kwargs).dispatcher([4, 6])
    assert d.decode_graphs == [(6, 3), (6, 2), (4, 2)]
    assert d.dispatch(3, uniform_decode=True, query_len=3) == Dispatch("PIECEWISE", 4)
    assert d.dispatch(6, uniform_decode=True, query_len=3) == Dispatch("FULL", 6)
    fdo = _engine(**kwargs, cudagraph_mode="FULL_DECODE_ONLY").dispatcher([4, 6])
    assert fdo.dispatch(3, uniform_decode=True, query_len=3).eager
    # The EAGLE prefill pass dispatches over the same per-tier descriptors at the target's padded width.
    passes = drafter_passes("eagle", runner="v2", num_requests=1, num_tokens=3, uniform_decode=True,
                            capture_sizes=[4, 6], cudagraph_mode="FULL_AND_PIECEWISE", num_speculative_tokens=2,
                            max_num_seqs=8, dynamic_ks=[1, 2])
    assert (passes[0].role, passes[0].runtime_mode, passes[0].padded_size) == ("prefill", "PIECEWISE", 4)


def test_case3_a_q_token_prompt_chunk_is_uniform_on_v1_only():
    # K=2, sizes [3,6], one request with a fresh 3-token prompt: V2 counts no batch with a prefill as uniform
    # (PIECEWISE 3); V1 counts any batch of q tokens per request (FULL 3).
    for runner, expected in (("v2", Dispatch("PIECEWISE", 3)), ("v1", Dispatch("FULL", 3))):
        d = _engine(max_num_seqs=2, num_speculative_tokens=2, model_runner=runner).dispatcher([3, 6])
        assert d.dispatch(3, uniform_decode=False, query_len=3) == expected, runner


def test_case4_v1_drops_the_schedule_for_suffix_and_runs_static_k_with_full_graphs():
    # V1 with suffix decoding: _maybe_disable_dynamic_sd_for_v1 drops the schedule, so K=2 is static, the FULL
    # graphs stay and the V1 rewrite applies. K=2, max_num_seqs 2, schedule [[1,2,1]], sizes [3,6]; two requests of
    # 3 tokens: vLLM FULL 6 (cgtune forced PIECEWISE).
    kwargs = dict(max_num_seqs=2, num_speculative_tokens=2, speculative_schedule=((1, 2, 1),))
    suffix = _engine(**kwargs, speculative_method="suffix")
    assert suffix.runner == "v1" and suffix.dynamic_schedule is None
    assert suffix.effective_cudagraph_mode == "FULL_AND_PIECEWISE"
    assert suffix.decode_query_lens()[1:] == [3, 3]
    assert suffix.dispatcher([3, 6]).dispatch(6, uniform_decode=True) == Dispatch("FULL", 6)
    assert suffix.defaults().sizes == default_capture_sizes(2, 2, 512).sizes  # the default list without tiers
    # A method V1 drafts dynamically keeps the schedule, and V1 then runs it PIECEWISE.
    eagle = _engine(**kwargs, speculative_method="eagle", model_runner="v1")
    assert eagle.dynamic_schedule is not None and eagle.effective_cudagraph_mode == "PIECEWISE"


def test_case6_v2_captures_no_drafter_graph_when_the_target_captures_none():
    # V2, FULL_DECODE_ONLY, K=3, max_num_seqs 8, sizes [3]: round_up(3, 4) = 4 exceeds the max size, so the target
    # has no graph; capture_model returns before the speculator captures and the estimate is 0 (cgtune still listed
    # an EAGLE decode FULL graph at 3).
    s = _engine(max_num_seqs=8, num_speculative_tokens=3, cudagraph_mode="FULL_DECODE_ONLY")
    assert s.dispatcher([3]).graphs() == []
    assert drafter_graphs("eagle", runner="v2", capture_sizes=[3], cudagraph_mode="FULL_DECODE_ONLY",
                          num_speculative_tokens=3, max_num_seqs=8) == []
    assert estimate_v2_bytes([]) == 0
    decode = drafter_passes("eagle", runner="v2", num_requests=1, num_tokens=4, uniform_decode=True,
                            capture_sizes=[3], cudagraph_mode="FULL_DECODE_ONLY", num_speculative_tokens=3,
                            max_num_seqs=8)[-1]
    assert (decode.role, decode.runtime_mode) == ("decode", "NONE")
