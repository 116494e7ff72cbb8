"""SGLang's capture-time filter, request pool and speculative resolution: what is really captured."""

from __future__ import annotations

import pytest

from tuner.engines.sglang import (
    batch_size_alignment,
    captured_batch_sizes,
    default_decode_batch_sizes,
    effective_max_running_requests,
    request_pool_size,
    resolve_decode_graphs,
    resolve_eagle_params,
)

H100_MIB = 81559  # hand-entered nvidia-smi value, as in test_defaults.py


@pytest.mark.parametrize(
    ("sizes", "pool", "kwargs", "expected"),
    [
        (default_decode_batch_sizes(256), 48, {}, [1, 2, 4, 8, 12, 16, 24, 32, 40, 48]),
        ([1, 3, 5, 7], 6, {}, [1, 3, 5, 6]),
        ([1, 3, 5, 7], 6, {"mul_base": 2}, [6]),
        (default_decode_batch_sizes(256, speculative=True), 48, {"mul_base": 8, "captured_req_width": 4},
         [2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 40, 44, 48]),
        # TBO + gathered attn_tp=4: mul_base 8 and the alignment width drops to 1.
        (default_decode_batch_sizes(256), 48, {"mul_base": 8, "captured_req_width": 4, "two_batch_overlap": True},
         [8, 16, 24, 32, 40, 48]),
    ],
)
def test_runtime_filter_examples(sizes, pool, kwargs, expected):
    assert captured_batch_sizes(sizes, pool, **kwargs) == expected


def test_pool_is_rounded_up_to_the_alignment():
    # Pool 5 with mul_base 4 becomes 8, which is appended because the list goes above it.
    assert captured_batch_sizes([1, 4, 16], 5, mul_base=4) == [4, 8]


def test_list_below_the_pool_is_kept_as_is():
    assert captured_batch_sizes([1, 2, 4], 2048) == [1, 2, 4]


def test_nothing_capturable_is_refused_like_sglangs_assert():
    # Pool 3 rounds up to 4, which is not appended (the list stays below it); 1 and 3 are not multiples of 4.
    with pytest.raises(ValueError, match=r"nothing capturable"):
        captured_batch_sizes([1, 3], 3, mul_base=4)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, 1), ({"two_batch_overlap": True}, 2), ({"gathered_buffer": True, "attn_tp_size": 4}, 4),
        ({"two_batch_overlap": True, "gathered_buffer": True, "attn_tp_size": 4}, 8),
        ({"attn_cp_size": 3}, 3), ({"gathered_buffer": True, "attn_tp_size": 4, "attn_cp_size": 2}, 4),
        ({"attn_cp_size": 3, "is_hip": True}, 1),
    ],
)
def test_alignment(kwargs, expected):
    assert batch_size_alignment(**kwargs) == expected


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"max_running_requests": 192}, 192),
        ({"max_running_requests": 192, "attn_dp_size": 4}, 48),
        ({"max_running_requests": 3, "attn_dp_size": 8}, 1),
        ({"max_running_requests": 192, "token_capacity": 100}, 50),
        # Unset: int(1_000_000 / 8192 * 512) = 62500 -> clamped to 4096.
        ({"max_running_requests": None, "token_capacity": 1_000_000, "context_len": 8192}, 4096),
        # int(20_000 / 8192 * 512) = 1250 -> raised to 2048, then capped at 20_000 // 2.
        ({"max_running_requests": None, "token_capacity": 20_000, "context_len": 8192}, 2048),
        ({"max_running_requests": None, "token_capacity": 3000, "context_len": 8192}, 1500),
    ],
)
def test_request_pool_size(kwargs, expected):
    assert request_pool_size(**kwargs) == expected


def test_request_pool_needs_capacity_without_max_running_requests():
    with pytest.raises(ValueError, match=r"^token_capacity=None, context_len=None"):
        request_pool_size(max_running_requests=None)


@pytest.mark.parametrize("algorithm", ["EAGLE", "eagle3", "NEXTN", "STANDALONE", "FROZEN_KV_MTP", "DFLASH", "DSPARK",
                                       "NGRAM"])
def test_speculative_sets_48_when_unset(algorithm):
    assert effective_max_running_requests(algorithm, None) == 48
    assert effective_max_running_requests(algorithm, 200) == 200


def test_uno_and_plain_decode_keep_it_unset():
    assert effective_max_running_requests("UNO", None) is None
    assert effective_max_running_requests(None, None) is None


def test_unknown_algorithm_is_refused():
    with pytest.raises(ValueError, match=r"^speculative_algorithm='MEDUSA' must be one of"):
        effective_max_running_requests("MEDUSA", None)


def test_speculative_list_built_to_256_is_cut_to_48_but_the_reserve_still_counts_256():
    graphs = resolve_decode_graphs(gpu_memory_mib=H100_MIB, speculative_algorithm="EAGLE",
                                   speculative_num_draft_tokens=4)
    assert graphs.requested_batch_sizes == default_decode_batch_sizes(256, speculative=True)
    assert graphs.max_bs == 256  # what mem_fraction_static reserved 2 x 256 MiB for
    assert graphs.max_running_requests == 48 and graphs.pool_size == 48
    assert graphs.batch_sizes[-3:] == [40, 44, 48]
    assert graphs.widths[-1] == 48 * 4
    assert list(graphs.eager_batch_sizes) == []


def test_default_list_leaves_batches_between_its_max_and_the_pool_eager():
    graphs = resolve_decode_graphs(gpu_memory_mib=H100_MIB, max_running_requests=400)
    assert graphs.batch_sizes == default_decode_batch_sizes(256)
    assert graphs.eager_batch_sizes == range(257, 401)
    assert graphs.tokens_per_request == 1 and graphs.widths == graphs.batch_sizes


def test_user_max_running_requests_below_the_default_max_shapes_the_list():
    graphs = resolve_decode_graphs(gpu_memory_mib=H100_MIB, max_running_requests=64)
    assert graphs.max_bs == 64 and graphs.batch_sizes[-1] == 64 and len(graphs.batch_sizes) == 12


def test_explicit_list_sets_max_bs_and_is_capped_at_the_pool():
    graphs = resolve_decode_graphs(gpu_memory_mib=H100_MIB, max_running_requests=100, cuda_graph_bs=[1, 8, 64, 128])
    assert graphs.max_bs == 128
    assert graphs.batch_sizes == [1, 8, 64, 100]


def test_speculative_graphs_need_the_draft_token_count():
    with pytest.raises(ValueError, match=r"^speculative_num_draft_tokens=None must be >= 1"):
        resolve_decode_graphs(gpu_memory_mib=H100_MIB, speculative_algorithm="EAGLE")


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"model_arch": "LlamaForCausalLM"}, (5, 4, 8)),
        ({"model_arch": "Qwen3ForCausalLM"}, (3, 1, 4)),
        ({"model_arch": "Grok1ForCausalLM"}, (5, 4, 8)),
        # topk == 1 forces num_draft_tokens = num_steps + 1.
        ({"model_arch": "LlamaForCausalLM", "num_steps": 6, "eagle_topk": 1, "num_draft_tokens": 16}, (6, 1, 7)),
        ({"model_arch": "LlamaForCausalLM", "num_steps": 5, "eagle_topk": 8, "num_draft_tokens": 32}, (5, 8, 32)),
    ],
)
def test_eagle_params(kwargs, expected):
    assert resolve_eagle_params("EAGLE3", **kwargs) == expected


def test_standalone_auto_params_ignore_the_architecture():
    assert resolve_eagle_params("STANDALONE", model_arch="LlamaForCausalLM") == (3, 1, 4)


# ---------------------------------------------------------------------------------------------- by hand (facts file)
def test_the_alignment_multiplies_by_hand():
    from tuner.engines.sglang.capture import batch_size_alignment as align

    assert align() == 1 and align(gathered_buffer=True) == 1  # attn_tp_size 1: nothing to gather over
    assert align(attn_tp_size=8) == 1  # no gathered buffer: the attention TP size does not align
    assert align(two_batch_overlap=True) == 2 and align(gathered_buffer=True, attn_tp_size=8) == 8
    assert align(two_batch_overlap=True, gathered_buffer=True, attn_tp_size=4) == 8
    assert align(attn_cp_size=3) == 3 and align(two_batch_overlap=True, attn_cp_size=2) == 2  # already divisible
    assert align(two_batch_overlap=True, attn_cp_size=3) == 6 and align(attn_cp_size=3, is_hip=True) == 1
    for name in ("attn_tp_size", "attn_cp_size"):
        with pytest.raises(ValueError, match=rf"^{name}=0 must be >= 1$"):
            align(**{name: 0})


def test_the_request_pool_by_hand():
    from tuner.engines.sglang.capture import request_pool_size as pool

    assert pool(max_running_requests=48, attn_dp_size=2) == 24 and pool(max_running_requests=1) == 1
    assert pool(max_running_requests=48, token_capacity=31) == 15  # half the KV capacity, in whole requests
    # Unset: int(capacity / context x 512) clamped to 2048..4096, then at most half the capacity.
    assert pool(max_running_requests=None, token_capacity=40960, context_len=8192) == 2560
    assert pool(max_running_requests=None, token_capacity=10**6, context_len=8192) == 4096
    assert pool(max_running_requests=None, token_capacity=3001, context_len=8192) == 1500
    assert pool(max_running_requests=None, token_capacity=4096, context_len=1) == 2048
    with pytest.raises(ValueError, match=r"^token_capacity=None, context_len=8192: both are needed"):
        pool(max_running_requests=None, context_len=8192)
    for kwargs, message in (({"max_running_requests": 0}, "max_running_requests=0 must be >= 1"),
                            ({"max_running_requests": 4, "token_capacity": 0}, "token_capacity=0 must be >= 1"),
                            ({"max_running_requests": 4, "attn_dp_size": 0}, "attn_dp_size=0 must be >= 1"),
                            ({"max_running_requests": None, "token_capacity": 9, "context_len": 0},
                             "context_len=0 must be >= 1")):
        with pytest.raises(ValueError, match=f"^{message}$"):
            pool(**kwargs)


def test_the_capture_filter_by_hand():
    from tuner.engines.sglang.capture import captured_batch_sizes as captured

    # Pool 10 rounded up to mul_base 4 is 12; the list goes above it, so 12 joins; bs x width 2 must be a multiple of
    # 4 (even bs); two-batch overlap aligns bs alone (multiples of 4).
    assert captured([1, 2, 3, 4, 6, 8, 12, 16], 10, mul_base=4, captured_req_width=2) == [2, 4, 6, 8, 12]
    assert captured([1, 2, 3, 4, 6, 8, 12, 16], 10, mul_base=4, captured_req_width=2,
                    two_batch_overlap=True) == [4, 8, 12]
    assert captured([1, 2, 4], 1) == [1]
    for args, kwargs, message in (([[]], {}, r"batch_sizes=\[\] must hold at least one size"),
                                  ([[1], 0], {}, "pool_size=0 must be >= 1"),
                                  ([[1], 4], {"mul_base": 0}, "mul_base=0, captured_req_width=1 must be >= 1"),
                                  ([[1], 4], {"captured_req_width": 0},
                                   "mul_base=1, captured_req_width=0 must be >= 1"),
                                  ([[0, 4], 4], {}, r"batch_sizes=\[0, 4\]: nothing capturable")):
        if not args[1:]:
            args = [*args, 4]
        with pytest.raises(ValueError, match=f"^{message}"):
            captured(*args, **kwargs)


def test_resolve_decode_graphs_from_flags_by_hand():
    from tuner.engines.sglang.capture import resolve_decode_graphs as resolve

    # The facts file's speculative list at max_bs 80 (29 sizes); EAGLE sets max_running_requests 48, so the pool is
    # 48 and 48 joins the captured list; verify graphs hold 4 tokens per request.
    g = resolve(gpu_memory_mib=None, cuda_graph_max_bs=80, speculative_algorithm="EAGLE",
                speculative_num_draft_tokens=4)
    assert g.requested_batch_sizes == [*range(1, 9), *range(10, 33, 2), 40, 44, 48, 52, 56, 60, 64, 72, 80]
    assert (g.max_bs, g.max_running_requests, g.pool_size, g.tokens_per_request) == (80, 48, 48, 4)
    assert g.batch_sizes == [*range(1, 9), *range(10, 33, 2), 40, 44, 48]
    # A gathered attn_tp=8 layout (mul_base 8): even sizes only (bs x 4 a multiple of 8), as the facts file has it.
    assert resolve(gpu_memory_mib=None, cuda_graph_max_bs=80, speculative_algorithm="EAGLE",
                   speculative_num_draft_tokens=4, mul_base=8).batch_sizes == [*range(2, 33, 2), 40, 44, 48]
    # Two-batch overlap aligns the batch size alone: multiples of 8 up to 48.
    assert resolve(gpu_memory_mib=None, cuda_graph_max_bs=80, speculative_algorithm="EAGLE",
                   speculative_num_draft_tokens=4, mul_base=8, two_batch_overlap=True).batch_sizes == \
        [8, 16, 24, 32, 40, 48]
    # The GPU-memory default reads the TP size (an H100 80 GB: 256 below tp 4, 512 from it); a pool from the KV
    # capacity and DP size; padding off lists every size.
    h100 = {"gpu_memory_mib": 81559, "max_running_requests": 1024}
    assert resolve(**h100).max_bs == 256 and resolve(**h100, tp_size=4).max_bs == 512
    kv = resolve(gpu_memory_mib=None, max_running_requests=64, attn_dp_size=2, token_capacity=40)
    assert (kv.pool_size, kv.batch_sizes[-1]) == (20, 20)  # half the KV capacity binds
    dp = resolve(gpu_memory_mib=None, max_running_requests=64, attn_dp_size=2, token_capacity=1000)
    assert (dp.pool_size, dp.batch_sizes[-1]) == (32, 32)  # 64 requests over 2 DP ranks bind
    unset = resolve(gpu_memory_mib=None, cuda_graph_max_bs=8, token_capacity=3001, context_len=8192)
    assert unset.pool_size == 1500 and unset.batch_sizes == [1, 2, 4, 8]
    assert resolve(gpu_memory_mib=None, max_running_requests=8, cuda_graph_max_bs=5,
                   disable_padding=True).batch_sizes == [1, 2, 3, 4, 5]
    assert resolve(gpu_memory_mib=None, max_running_requests=8, cuda_graph_bs=[3, 1]).requested_batch_sizes == [3, 1]
    with pytest.raises(ValueError, match=r"^cuda_graph_bs_decode=\[0, 2\] must hold sizes >= 1$"):
        resolve(gpu_memory_mib=None, max_running_requests=8, cuda_graph_bs=[0, 2])
