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
