"""TensorRT-LLM cuda_graph_config defaults and validator: the facts file's worked examples (section 2.3)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuner.engines.trtllm import default_batch_sizes, generate_batch_sizes, merge_schedule_keys
from tuner.engines.trtllm import resolve_cuda_graph_config

PADDED_128 = [1, 2, 4] + [8 * i for i in range(1, 17)]


@pytest.mark.parametrize(
    ("max_batch_size", "padding", "expected"),
    [
        (None, False, list(range(1, 32)) + [32, 64, 128]),
        (128, True, PADDED_128),
        (300, True, PADDED_128 + [192, 256, 300]),
        (1000, False, list(range(1, 33)) + [64, 128, 256, 512, 1000]),
        (2048, True, PADDED_128 + list(range(192, 2049, 64))),
        (8, False, list(range(1, 9))),
    ],
)
def test_worked_examples(max_batch_size, padding, expected):
    assert default_batch_sizes(max_batch_size, enable_padding=padding) == expected


@pytest.mark.parametrize(("max_batch_size", "padding", "count"),
                         [(None, False, 34), (128, True, 19), (300, True, 22), (1000, False, 37), (2048, True, 49)])
def test_worked_example_counts(max_batch_size, padding, count):
    assert len(default_batch_sizes(max_batch_size, enable_padding=padding)) == count


def test_default_max_is_128_whatever_the_llm_max():
    assert default_batch_sizes()[-1] == 128
    assert default_batch_sizes(0) == default_batch_sizes(None)


def test_explicit_list_is_sorted_and_sets_the_max():
    assert resolve_cuda_graph_config([64, 1, 8], 0) == ([1, 8, 64], 64)
    assert resolve_cuda_graph_config([1, 8, 64], 64) == ([1, 8, 64], 64)


def test_explicit_list_with_a_different_max_is_rejected_in_one_line():
    with pytest.raises(ValueError) as info:
        resolve_cuda_graph_config([1, 2, 3], 128)
    assert str(info.value).startswith("cuda_graph_config.max_batch_size=128 must equal max(batch_sizes)=3")
    assert "\n" not in str(info.value)


def test_empty_list_means_the_generated_default():
    assert resolve_cuda_graph_config([], 0, enable_padding=True) == (PADDED_128, 128)


def test_negative_max_is_rejected():
    with pytest.raises(ValueError, match=r"^cuda_graph_config.max_batch_size=-1 must be >= 0"):
        resolve_cuda_graph_config(None, -1)


def test_schedule_keys_are_merged_up_to_the_max():
    # The docstring example of _merge_schedule_keys: {100: 4, 200: 3, 300: 2} adds 100, 200, 300.
    assert merge_schedule_keys([1, 64, 128, 256, 512], {100: 4, 200: 3, 300: 2}) == [1, 64, 100, 128, 200, 256, 300,
                                                                                      512]
    assert merge_schedule_keys([1, 64], {100: 4}) == [1, 64]


@given(st.integers(1, 5000), st.booleans())
def test_generated_lists_are_sorted_and_end_at_the_max(max_batch_size, padding):
    sizes = generate_batch_sizes(max_batch_size, padding)
    assert sizes == sorted(set(sizes)) and sizes[-1] == max_batch_size and sizes[0] == 1


def test_padded_lists_step_by_64_past_128_and_end_at_max():
    # TensorRT-LLM's rule by hand: 1, 2, 4, 8..128 by 8, then +64 while within max; max appended.
    assert generate_batch_sizes(300, True) == PADDED_128 + [192, 256, 300]
    assert generate_batch_sizes(320, True) == PADDED_128 + [192, 256, 320]
    # Without padding: 1..31, 32, 64, 128, powers of two from 256 below max, then max.
    assert generate_batch_sizes(1000, False) == list(range(1, 32)) + [32, 64, 128, 256, 512, 1000]
    with pytest.raises(ValueError, match=r"^max_batch_size=0 must be >= 1$"):
        generate_batch_sizes(0, True)


def test_schedule_keys_merge_in_order_and_collapse_on_equal_sizes():
    assert merge_schedule_keys([1, 2, 4, 8], {3: 2, 4: 1, 16: 1}) == [1, 2, 3, 4, 8]  # 16 is above the list's max
    assert merge_schedule_keys([1, 2, 4, 8], {5: 1, 6: 1}) == [1, 2, 4, 5, 6, 8]
    assert merge_schedule_keys([4, 8], {1: 3, 2: 2}) == [1, 2, 4, 8]
    with pytest.raises(ValueError, match=r"^batch_sizes=\[\] must hold at least one size$"):
        merge_schedule_keys([], {1: 1})


def test_a_schedule_key_after_one_the_list_holds_is_still_merged():
    # The merge's equal branch moves both lists on by one: 64 is in the list and a key, 100 only a key.
    assert merge_schedule_keys([1, 64, 128], {64: 3, 100: 2}) == [1, 64, 100, 128]
    assert merge_schedule_keys([1, 64, 128], {1: 4, 64: 3, 128: 1}) == [1, 64, 128]


def test_the_defaults_without_arguments_are_unpadded_up_to_128():
    # TensorRT-LLM's field defaults: enable_padding False, max_batch_size 0 (then 128).
    unpadded = list(range(1, 32)) + [32, 64, 128]
    assert default_batch_sizes(300) == list(range(1, 32)) + [32, 64, 128, 256, 300]
    assert resolve_cuda_graph_config() == (unpadded, 128)
    assert resolve_cuda_graph_config(None) == resolve_cuda_graph_config(None, 0, enable_padding=False)
