"""Runtime dispatch: padding, eager above the max, FULL decode rounding to query-length multiples."""

from __future__ import annotations

import pytest

from tuner.engines.vllm import Dispatcher, default_capture_sizes, full_decode_sizes
from tuner.engines.vllm.dispatch import Dispatch


def test_padding_to_next_captured_size():
    d = Dispatcher([1, 2, 4, 8, 16], cudagraph_mode="PIECEWISE", max_num_seqs=64)
    assert d.dispatch(3).padded_size == 4
    assert d.dispatch(8).padded_size == 8
    assert d.dispatch(9).padded_size == 16
    assert d.dispatch(9).runtime_mode == "PIECEWISE"


def test_eager_above_the_max():
    d = Dispatcher([1, 2, 4, 8, 16], max_num_seqs=64)
    result = d.dispatch(17, uniform_decode=True)
    assert result.eager and result.padded_size is None
    assert d.dispatch(17).eager


def test_full_decode_sizes_round_up_to_query_len_multiples():
    # q=17, 32 seqs: 1,2,4,8,16 -> 17; 24,32 -> 34; 40,48 -> 51; 512 -> 527 > max 512 is dropped.
    sizes = full_decode_sizes([1, 2, 4, 8, 16, 24, 32, 40, 48, 512], 17, 32)
    assert sizes[:3] == [17, 34, 51]
    assert all(s % 17 == 0 for s in sizes)
    assert max(sizes) <= 512 and 527 not in sizes


def test_full_decode_sizes_capped_by_max_num_seqs():
    sizes = full_decode_sizes([1, 8, 64, 256, 512], 4, 16)  # q*max_num_seqs = 64
    assert sizes == [4, 8, 64]


def test_uniform_decode_uses_full_graph_and_mixed_uses_piecewise():
    defaults = default_capture_sizes(128, 16)
    d = Dispatcher(defaults.sizes, decode_query_len=17, max_num_seqs=128)
    decode = d.dispatch(17 * 3, uniform_decode=True)
    assert decode.runtime_mode == "FULL" and decode.padded_size % 17 == 0 and decode.padded_size >= 51
    mixed = d.dispatch(51)
    assert mixed.runtime_mode == "PIECEWISE" and mixed.padded_size == 56
    assert d.dispatch(2176, uniform_decode=True).eager  # the DFlash width runs eager by default


def test_uniform_decode_above_full_decode_falls_back_to_piecewise():
    # q=17, 2 seqs: FULL decode widths are capped at 34 and 40 rounds to 51 > 34, so only 17 is a
    # FULL graph; a 34-token decode step replays the PIECEWISE graph of 40 instead.
    d = Dispatcher([1, 2, 4, 8, 16, 17, 40], decode_query_len=17, max_num_seqs=2)
    assert d.decode_graph_sizes == [17]
    assert d.dispatch(17, uniform_decode=True) == d.dispatch(17, uniform_decode=True).__class__("FULL", 17)
    fallback = d.dispatch(34, uniform_decode=True)
    assert (fallback.runtime_mode, fallback.padded_size) == ("PIECEWISE", 40)


def test_full_decode_only_runs_mixed_eager():
    d = Dispatcher([4, 8, 16], cudagraph_mode="FULL_DECODE_ONLY", decode_query_len=4, max_num_seqs=8)
    assert d.dispatch(8, uniform_decode=True).runtime_mode == "FULL"
    assert d.dispatch(8).eager


def test_full_mode_pads_every_step_without_rounding():
    d = Dispatcher([1, 2, 4, 8, 16], cudagraph_mode="FULL", decode_query_len=3, max_num_seqs=8)
    assert d.decode_graph_sizes == []
    assert d.dispatch(6, uniform_decode=True).padded_size == 8
    assert d.dispatch(6, uniform_decode=True).runtime_mode == "FULL"


def test_none_mode_is_always_eager():
    d = Dispatcher([1, 2, 4], cudagraph_mode="NONE", max_num_seqs=8)
    assert d.dispatch(1).eager and d.graphs() == []


def test_capture_order_mixed_first_then_full_largest_first():
    d = Dispatcher([1, 4, 8], decode_query_len=2, max_num_seqs=8)
    assert d.graphs() == [("PIECEWISE", 8), ("PIECEWISE", 4), ("PIECEWISE", 1), ("FULL", 8), ("FULL", 4),
                          ("FULL", 2)]


@pytest.mark.parametrize("bad, message", [
    (dict(cudagraph_mode="SOME"),
     "cudagraph_mode='SOME' must be one of NONE, PIECEWISE, FULL, FULL_DECODE_ONLY, FULL_AND_PIECEWISE"),
    (dict(decode_query_len=0), "decode_query_len=0 must be >= 1"),
    (dict(max_num_seqs=0), "max_num_seqs=0 must be >= 1")])
def test_bad_dispatcher_config_names_the_field_and_value(bad, message):
    kwargs = dict(cudagraph_mode="PIECEWISE", decode_query_len=1, max_num_seqs=4) | bad
    with pytest.raises(ValueError) as err:
        Dispatcher([1, 2], **kwargs)
    assert str(err.value) == message


def test_the_smallest_valid_config_and_the_defaults():
    # One request at a time is a valid deployment; q defaults to 1, so FULL decode widths are the sizes themselves
    # (with q = 2 they would round to 2 and 4).
    d = Dispatcher([1, 3], max_num_seqs=1)
    assert d.decode_graph_sizes == [1] and d.dispatch(1, uniform_decode=True) == Dispatch("FULL", 1)
    assert Dispatcher([1, 3], max_num_seqs=8).decode_graph_sizes == [1, 3]
    with pytest.raises(ValueError) as err:
        d.dispatch(0)
    assert str(err.value) == "num_tokens=0 must be >= 1"
    # Under NONE nothing is captured, so nothing is the max either.
    assert Dispatcher([1, 3], cudagraph_mode="NONE", max_num_seqs=8).max_size == 0
    assert Dispatcher([1, 3], cudagraph_mode="PIECEWISE", max_num_seqs=8).max_size == 3


def test_every_width_dispatches_to_a_size_at_least_as_wide():
    defaults = default_capture_sizes(64, 7)
    d = Dispatcher(defaults.sizes, decode_query_len=8, max_num_seqs=64)
    for width in range(1, 1025):
        for uniform in (False, True):
            if uniform and width % 8:
                continue
            result = d.dispatch(width, uniform_decode=uniform)
            if width > defaults.max_size:
                assert result.eager
            else:
                assert not result.eager and result.padded_size >= width


# ---------------------------------------------------------------------------------------------- by hand (facts file)
def test_a_v2_manager_captures_no_graph_with_cudagraph_mode_none_and_none_above_the_widest_decode_batch():
    from tuner.engines.vllm.dispatch import manager_graphs

    assert manager_graphs([1, 2, 4, 8], "NONE", [1], 8, 8) == []
    # q = 4, 2 requests at most: FULL decode graphs at round_up(s, 4) up to 8 tokens only, though the list holds 64;
    # and with 8 requests allowed but a decode budget of 8 tokens (max_decode_tokens), the same: each cap binds alone.
    for max_decode_tokens, max_num_seqs in ((8, 2), (8, 8), (64, 2)):
        graphs = manager_graphs([4, 8, 16, 64], "FULL_AND_PIECEWISE", [4], max_decode_tokens, max_num_seqs)
        assert [(m, w) for m, w, _ in graphs if m == "FULL"] == [("FULL", 8), ("FULL", 4)]
        assert [w for m, w, _ in graphs if m == "PIECEWISE"] == [64, 16, 8, 4]


def test_v1_counts_a_step_uniform_only_at_q_and_v2_at_any_decode_query_length():
    from tuner.engines.vllm.dispatch import uniform_token_count

    assert uniform_token_count("v1", 4, 4, False) == 4  # a q-token prompt chunk counts in V1
    assert uniform_token_count("v1", 4, 3, True) is None
    assert uniform_token_count("v2", 4, 3, True) == 3 and uniform_token_count("v2", 4, 4, False) is None
    v1 = Dispatcher([4, 8], decode_query_len=4, max_num_seqs=8, runner="v1")
    v2 = Dispatcher([4, 8], decode_query_len=4, max_num_seqs=8, runner="v2")
    assert v1.uniform_token_count(3, True) is None and v2.uniform_token_count(3, True) == 3


@pytest.mark.parametrize("kwargs, message", [
    ({"runner": "v3"}, "runner='v3' must be v1 or v2"),
    ({"decode_query_lens": [0, 4]}, r"decode_query_lens=\[0, 4\] must be non-empty, each within 1..q=4"),
    ({"decode_query_lens": [2, 5]}, r"decode_query_lens=\[2, 5\] must be non-empty, each within 1..q=4"),
    ({"decode_query_lens": []}, r"decode_query_lens=\[\] must be non-empty, each within 1..q=4"),
    ({"runner": "v1", "decode_query_lens": [2, 4]},
     r"decode_query_lens=\[2, 4\]: the V1 runner captures FULL decode graphs at q=4 only \(it runs dynamic "
     r"schedules PIECEWISE\)"),
])
def test_the_dispatcher_refuses_what_the_runner_cannot_run_by_name(kwargs, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        Dispatcher([4, 8], decode_query_len=4, max_num_seqs=8, **kwargs)
    assert Dispatcher([4, 8], decode_query_len=4, max_num_seqs=8, runner="v2", decode_query_lens=[2, 4])
