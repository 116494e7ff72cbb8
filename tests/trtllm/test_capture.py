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
