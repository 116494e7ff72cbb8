"""TensorRT-LLM dispatch: generation-only steps, bisect_left padding only with enable_padding, eager above max."""

from __future__ import annotations

import pytest

from tuner.engines.trtllm import Dispatcher, default_batch_sizes

LIST_2048 = default_batch_sizes(2048, enable_padding=True)


@pytest.mark.parametrize(("bs", "padded"), [(129, 192), (193, 256), (128, 128), (3, 4), (2049, None)])
def test_round_up_on_the_2048_list(bs, padded):
    d = Dispatcher(LIST_2048, enable_padding=True)
    assert d.dispatch(bs).padded_bs == padded


def test_without_padding_only_exact_sizes_replay():
    d = Dispatcher([1, 2, 4, 8, 64], enable_padding=False)
    assert d.dispatch(8).padded_bs == 8
    assert d.dispatch(5).eager


def test_steps_with_context_requests_run_eager():
    d = Dispatcher([1, 2, 4, 8], enable_padding=True)
    assert d.dispatch(4, has_context_requests=True).eager


def test_no_free_kv_for_the_padding_dummy_runs_eager_unless_exact():
    d = Dispatcher([1, 2, 4, 8], enable_padding=True)
    assert d.dispatch(3, dummy_request_fits=False).eager
    assert d.dispatch(4, dummy_request_fits=False).padded_bs == 4


def test_padding_never_exceeds_the_llm_max_batch_size():
    # A hand-made list that bypassed the engine filter: padding 5 -> 8 would exceed max_batch_size 6.
    d = Dispatcher([1, 2, 4, 8], enable_padding=True, max_batch_size=6)
    assert d.dispatch(5).eager


def test_graph_width_counts_draft_tokens():
    d = Dispatcher([1, 8, 16], draft_len=3, enable_padding=True)
    assert d.dispatch(9).num_tokens == 16 * 4
    assert d.graph_widths() == [4, 32, 64]


def test_padding_up_to_exactly_max_batch_size_still_replays():
    # Padding is refused only past the LLM's max_batch_size: 5 requests pad to the 8-graph when max_batch_size is 8.
    d = Dispatcher([1, 2, 4, 8], enable_padding=True, max_batch_size=8)
    assert d.dispatch(5).padded_bs == 8
    assert Dispatcher([1, 2, 4, 8], enable_padding=True, max_batch_size=7).dispatch(5).padded_bs is None


def test_bad_dispatch_input_names_the_value():
    with pytest.raises(ValueError, match=r"^draft_len=-1 must be >= 0$"):
        Dispatcher([1], draft_len=-1)
    with pytest.raises(ValueError, match=r"^bs=0 must be >= 1$"):
        Dispatcher([1]).dispatch(0)
