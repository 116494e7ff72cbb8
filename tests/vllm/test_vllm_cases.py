"""The six places where cgtune's rulebook disagreed with vLLM 0.33's own code (issue 19), each as its minimal case with
vLLM's answer. The answers were read by running vLLM's own dispatch, graph-set and profiling code from its 0.33.0
wheel on CPU; tests/vllm/test_vllm_oracle.py re-derives every one of them from vLLM where vLLM is installed."""

from __future__ import annotations

from tuner.vllm.memory import MIB, GraphCost, estimate_v1_bytes


def test_case5_v1_samples_full_on_top_of_the_piecewise_graphs_in_one_profiling_pool():
    # V1, K=0, sizes [1]: PW1 takes 100 MiB alone; FULL1 150 MiB alone but 10 MiB on top of PW1. V1's
    # profile_cudagraph_memory captures PIECEWISE then FULL into one profiling pool it never clears, so FULL's first
    # sample is the 10 MiB increment: max(100, 10) = 100 MiB (cgtune took FULL's standalone 150 MiB).
    graphs = [GraphCost("target", "PIECEWISE", 1, 100 * MIB, 100 * MIB),
              GraphCost("target", "FULL", 1, 150 * MIB, 10 * MIB)]
    assert estimate_v1_bytes(graphs) == 100 * MIB
    # Alone in the pool (FULL mode, no PIECEWISE sample before it) FULL's first sample is its standalone footprint.
    assert estimate_v1_bytes(graphs[1:]) == 150 * MIB
