"""TensorRT-LLM's engine filter and graph resolution: the facts file's filter examples."""

from __future__ import annotations

import pytest

from tuner.engines.trtllm import (
    captured_batch_sizes,
    default_batch_sizes,
    filter_cuda_graph_batch_sizes,
    graph_count,
    graph_draft_len,
    resolve_cuda_graphs,
)

PADDED_128 = [1, 2, 4] + [8 * i for i in range(1, 17)]


@pytest.mark.parametrize(
    ("sizes", "kwargs", "expected"),
    [
        (default_batch_sizes(), {"max_batch_size": 64}, list(range(1, 33)) + [64]),
        (default_batch_sizes(enable_padding=True), {"max_batch_size": 64, "enable_padding": True},
         [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]),
        (default_batch_sizes(512, enable_padding=True),
         {"max_num_tokens": 1024, "max_total_draft_tokens": 3, "enable_padding": True},
         PADDED_128 + [192, 256]),
        (default_batch_sizes(512), {"max_num_tokens": 1024, "max_total_draft_tokens": 3},
         list(range(1, 33)) + [64, 128, 256]),
        (default_batch_sizes(enable_padding=True), {"max_batch_size": 100, "enable_padding": True},
         PADDED_128[:-4] + [100]),  # ..., 88, 96, 100
    ],
)
def test_filter_examples(sizes, kwargs, expected):
    assert captured_batch_sizes(sizes, **kwargs) == expected


def test_cap_is_appended_only_with_padding_and_only_once():
    assert filter_cuda_graph_batch_sizes([1, 8, 64], 10, 8192, 1, True) == [1, 8, 10]
    assert filter_cuda_graph_batch_sizes([1, 8, 64], 10, 8192, 1, False) == [1, 8]
    assert filter_cuda_graph_batch_sizes([1, 10, 64], 10, 8192, 1, True) == [1, 10]
    # The first size already above the cap: padding keeps just the cap.
    assert filter_cuda_graph_batch_sizes([64, 128], 10, 8192, 1, True) == [10]


def test_token_budget_below_one_request_captures_nothing():
    assert filter_cuda_graph_batch_sizes([1, 2], 8, 3, 4, True) == []
    assert captured_batch_sizes([], enable_padding=True) == []


def test_resolution_from_options():
    graphs = resolve_cuda_graphs(batch_sizes=[1, 2, 4, 8, 16, 32, 64, 128, 256], enable_padding=True,
                                 max_batch_size=256, max_num_tokens=1024, max_draft_len=3)
    assert graphs.config_max_batch_size == 256
    assert graphs.batch_sizes == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert graphs.draft_len == 3 and graphs.tokens_per_request == 4
    assert graphs.widths[-1] == 1024 and graphs.max_supported_batch_size == 256


def test_default_options_capture_up_to_128():
    graphs = resolve_cuda_graphs()
    assert graphs.batch_sizes == list(range(1, 33)) + [64, 128]
    assert graphs.max_supported_batch_size == 128 and graphs.draft_len == 0


@pytest.mark.parametrize(
    ("args", "kwargs", "expected"),
    [((3,), {}, 3), ((3, 10), {}, 3), ((3, 10), {"linear_tree": False}, 10), ((), {}, 0)],
)
def test_graph_draft_len(args, kwargs, expected):
    assert graph_draft_len(*args, **kwargs) == expected


def test_graph_count_doubles_for_one_engine_speculation_and_short_long_sparse():
    sizes = list(range(1, 33)) + [64, 128]
    assert graph_count(sizes) == 34
    assert graph_count(sizes, one_engine_speculative=True) == 68
    assert graph_count(sizes, one_engine_speculative=True, short_long_sparse=True) == 136
    assert graph_count(sizes, draft_lengths=2) == 68


# ---------------------------------------------------------------------------------------------- by hand, end to end
def test_resolve_cuda_graphs_applies_every_option_by_hand():
    from tuner.engines.trtllm.capture import resolve_cuda_graphs

    # Explicit list [1, 8, 64, 128, 256], padding on, LLM max_batch_size 200, max_num_tokens 600, tree decoding with
    # max_draft_len 3 and 7 draft tokens in all: each request holds 1 + 7 = 8 tokens, so the cap is
    # min(200, 600 // 8) = 75: 1, 8, 64 kept, then 75 appended (padding) at the first size above it.
    g = resolve_cuda_graphs(batch_sizes=[256, 1, 64, 8, 128], enable_padding=True, max_batch_size=200,
                            max_num_tokens=600, max_draft_len=3, max_total_draft_tokens=7, linear_tree=False)
    assert (g.config_batch_sizes, g.config_max_batch_size) == ([1, 8, 64, 128, 256], 256)
    assert g.batch_sizes == [1, 8, 64, 75] and g.enable_padding is True
    assert g.draft_len == 7 and g.widths == [8, 64, 512, 600]
    # Linear-tree speculation keys its graphs by max_draft_len; the filter still counts every draft token.
    linear = resolve_cuda_graphs(batch_sizes=[1, 8, 64, 128, 256], enable_padding=True, max_batch_size=200,
                                 max_num_tokens=600, max_draft_len=3, max_total_draft_tokens=7)
    assert linear.batch_sizes == [1, 8, 64, 75] and linear.draft_len == 3
    # Without max_total_draft_tokens, max_draft_len is the count: 1 + 3 tokens, cap min(200, 150) = 150; no padding
    # stops at the first size above it without appending.
    plain = resolve_cuda_graphs(batch_sizes=[1, 8, 64, 128, 256], max_batch_size=200, max_num_tokens=600,
                                max_draft_len=3)
    assert plain.batch_sizes == [1, 8, 64, 128] and plain.draft_len == 3 and plain.enable_padding is False
    # cuda_graph_config.max_batch_size generates the list when none is given (unpadded: 1..31, 32, 64, 128, ... max).
    gen = resolve_cuda_graphs(cuda_graph_max_batch_size=40)
    assert gen.config_batch_sizes == list(range(1, 33)) + [40] and gen.batch_sizes == gen.config_batch_sizes
    padded = resolve_cuda_graphs(cuda_graph_max_batch_size=200, enable_padding=True)
    assert padded.config_batch_sizes == [1, 2, 4, *range(8, 129, 8), 192, 200]
    # The LLM's max_batch_size caps what the engine captures.
    assert resolve_cuda_graphs(batch_sizes=[1, 8, 64, 128], max_batch_size=50).batch_sizes == [1, 8]


@pytest.mark.parametrize("field, kwargs", [("max_batch_size", {"max_batch_size": 0}),
                                           ("max_num_tokens", {"max_num_tokens": 0})])
def test_resolve_cuda_graphs_refuses_a_bad_cap_by_name(field, kwargs):
    from tuner.engines.trtllm.capture import resolve_cuda_graphs

    with pytest.raises(ValueError, match=rf"^{field}=0 must be >= 1$"):
        resolve_cuda_graphs(**kwargs)
    assert resolve_cuda_graphs(max_batch_size=1, max_num_tokens=1).batch_sizes == [1]


def test_the_filter_edges_one_request_and_a_fractional_cap():
    from tuner.engines.trtllm.capture import captured_batch_sizes, filter_cuda_graph_batch_sizes, graph_count

    # A cap of exactly 1 keeps the one-request graph; 7 tokens per request in 20 leave a cap of 2 (not 2.86).
    assert filter_cuda_graph_batch_sizes([1, 2, 4], 8, 1, 1, False) == [1]
    assert filter_cuda_graph_batch_sizes([1, 2, 3, 4], 8, 20, 7, True) == [1, 2]
    assert filter_cuda_graph_batch_sizes([1, 2, 3, 4], 8, 6, 7, True) == []
    # captured_batch_sizes' defaults: no draft tokens, no padding (a list above the cap stops without the cap).
    assert captured_batch_sizes([1, 2, 4, 8], max_batch_size=6) == [1, 2, 4]
    assert captured_batch_sizes([1, 2, 4, 8], max_num_tokens=4) == [1, 2, 4]  # one token a request by default
    with pytest.raises(ValueError, match=r"^max_total_draft_tokens=-1 must be >= 0$"):
        captured_batch_sizes([1], max_total_draft_tokens=-1)
    with pytest.raises(ValueError, match=r"^tokens_per_request=0 must be >= 1$"):
        filter_cuda_graph_batch_sizes([1], 8, 8, 0, False)
    with pytest.raises(ValueError, match=r"^draft_lengths=0 must be >= 1$"):
        graph_count([1], draft_lengths=0)


def test_the_graphs_draft_length_by_hand():
    from tuner.engines.trtllm.capture import graph_draft_len

    assert graph_draft_len(3, None, linear_tree=False) == 3  # tree decoding without a total: max_draft_len
    assert graph_draft_len(3, 7, linear_tree=False) == 7 and graph_draft_len(3, 7) == 3 and graph_draft_len() == 0
    with pytest.raises(ValueError, match=r"^max_draft_len=-1 must be >= 0$"):
        graph_draft_len(-1)
