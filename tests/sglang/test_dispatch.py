"""SGLang decode dispatch: bisect_left padding, eager above the max, exact sizes only without padding."""

from __future__ import annotations

import pytest

from tuner.engines.sglang import Dispatcher, decode_tokens_per_request, default_decode_batch_sizes


def test_padding_rounds_up_with_bisect_left():
    d = Dispatcher([1, 2, 4, 8, 12, 16, 24, 32, 40, 48])
    assert d.dispatch(3).padded_bs == 4
    assert d.dispatch(8).padded_bs == 8
    assert d.dispatch(33).padded_bs == 40
    assert d.dispatch(48).num_tokens == 48


def test_above_the_largest_captured_size_runs_eager():
    d = Dispatcher(default_decode_batch_sizes(256))
    result = d.dispatch(257)
    assert result.eager and result.padded_bs is None and result.num_tokens is None


def test_disable_padding_replays_exact_sizes_only():
    d = Dispatcher([1, 2, 4, 8], disable_padding=True)
    assert d.dispatch(4).padded_bs == 4
    assert d.dispatch(3).eager


def test_target_verify_graphs_hold_draft_tokens_per_request():
    width = decode_tokens_per_request(speculative_algorithm="EAGLE", speculative_num_draft_tokens=4)
    d = Dispatcher([1, 2, 4, 8], tokens_per_request=width)
    assert d.dispatch(5).num_tokens == 8 * 4
    assert d.graph_widths() == [4, 8, 16, 32]


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [({}, 1), ({"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 8}, 8),
     ({"dllm_block_size": 32}, 32)],
)
def test_tokens_per_request(kwargs, expected):
    assert decode_tokens_per_request(**kwargs) == expected


def test_bad_batch_size_is_refused():
    with pytest.raises(ValueError, match=r"^bs=0 must be >= 1$"):
        Dispatcher([1, 2]).dispatch(0)


def test_one_draft_token_and_a_block_of_one_are_allowed_and_less_is_refused_by_name():
    assert decode_tokens_per_request(speculative_algorithm="EAGLE", speculative_num_draft_tokens=1) == 1
    assert decode_tokens_per_request(dllm_block_size=1) == 1
    with pytest.raises(ValueError, match=r"^speculative_num_draft_tokens=0 must be >= 1 when "
                                         r"speculative_algorithm='EAGLE'$"):
        decode_tokens_per_request(speculative_algorithm="EAGLE", speculative_num_draft_tokens=0)
    with pytest.raises(ValueError, match=r"^speculative_num_draft_tokens=None must be >= 1"):
        decode_tokens_per_request(speculative_algorithm="EAGLE")
    with pytest.raises(ValueError, match=r"^dllm_block_size=0 must be >= 1$"):
        decode_tokens_per_request(dllm_block_size=0)
    with pytest.raises(ValueError, match=r"^tokens_per_request=0 must be >= 1$"):
        Dispatcher([1], tokens_per_request=0)
