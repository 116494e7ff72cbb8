"""SGLang 0.5.23 default decode lists and capacity defaults: the facts file's worked examples (section 1.3)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuner.engines.sglang import (
    auto_mem_fraction_static,
    default_chunked_prefill_size,
    default_decode_batch_sizes,
    default_decode_max_bs,
    default_prefill_batch_sizes,
    default_prefill_max_tokens,
)


@pytest.mark.parametrize(
    ("max_bs", "kwargs", "expected"),
    [
        (8, {}, [1, 2, 4, 8]),
        (100, {}, [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 100]),
        (80, {"speculative": True},
         [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 40, 44, 48, 52, 56, 60, 64, 72, 80]),
        (10, {"disable_padding": True}, list(range(1, 11))),
    ],
)
def test_worked_example_lists(max_bs, kwargs, expected):
    assert default_decode_batch_sizes(max_bs, **kwargs) == expected


@pytest.mark.parametrize(
    ("max_bs", "tail", "count"),
    [(100, [96, 100], 17), (300, [240, 248, 256, 272, 288, 300], 39), (600, [480, 496, 512, 544, 576, 600], 55)],
)
def test_worked_example_tails_and_counts(max_bs, tail, count):
    sizes = default_decode_batch_sizes(max_bs)
    assert sizes[-len(tail):] == tail
    assert len(sizes) == count


@pytest.mark.parametrize(("max_bs", "count"), [(8, 4), (24, 7), (32, 8), (80, 14), (160, 24), (256, 36), (512, 52)])
def test_graph_counts(max_bs, count):
    assert len(default_decode_batch_sizes(max_bs)) == count


def test_speculative_list_at_256_has_51_graphs():
    sizes = default_decode_batch_sizes(256, speculative=True)
    assert len(sizes) == 51 and sizes[-1] == 256


def test_max_bs_off_the_grid_is_appended():
    # 100 is not on the 8-step grid: SGLang appends it after 96.
    assert default_decode_batch_sizes(100)[-2:] == [96, 100]
    assert default_decode_batch_sizes(5) == [1, 2, 4, 5]


@pytest.mark.parametrize("max_bs", [0, -3])
def test_non_positive_max_bs_is_refused_in_one_line(max_bs):
    with pytest.raises(ValueError, match=rf"^max_bs={max_bs} must be >= 1") as info:
        default_decode_batch_sizes(max_bs)
    assert "\n" not in str(info.value)


@given(st.integers(1, 3000), st.booleans(), st.booleans())
def test_lists_are_sorted_unique_and_end_at_max(max_bs, speculative, disable_padding):
    sizes = default_decode_batch_sizes(max_bs, speculative=speculative, disable_padding=disable_padding)
    assert sizes == sorted(set(sizes))
    assert sizes[0] == 1 and sizes[-1] == max_bs


# GPU memory in MiB as nvidia-smi reports it for each card. These per-card values are hand-entered (the facts file's
# run stubbed them without listing them); with them, SGLang's defaults below reproduce the facts file's table.
GPU_MIB = {"T4": 15360, "L4": 23034, "A100-40": 40960, "H100": 81559, "H200": 143771, "B200": 183359}


@pytest.mark.parametrize(
    ("gpu", "tp_size", "max_bs", "graphs", "mem_fraction"),
    [
        ("T4", 1, 8, 4, 0.735), ("L4", 1, 48, 10, 0.684), ("A100-40", 1, 32, 8, 0.823), ("H100", 1, 256, 36, 0.830),
        ("H100", 8, 512, 52, 0.812), ("H200", 1, 256, 36, 0.903), ("B200", 1, 512, 52, 0.854),
        (None, 1, 160, 24, 0.95),
    ],
)
def test_gpu_defaults_table(gpu, tp_size, max_bs, graphs, mem_fraction):
    gpu_mib = GPU_MIB.get(gpu)
    assert default_decode_max_bs(gpu_mib, tp_size) == max_bs
    assert len(default_decode_batch_sizes(max_bs)) == graphs
    assert auto_mem_fraction_static(gpu_mib, decode_max_bs=max_bs, tp_size=tp_size) == mem_fraction


def test_user_max_running_requests_lowers_the_defaulted_max():
    assert default_decode_max_bs(GPU_MIB["H100"], max_running_requests=64) == 64
    assert len(default_decode_batch_sizes(64)) == 12
    # Above the default it changes nothing.
    assert default_decode_max_bs(GPU_MIB["H100"], max_running_requests=1000) == 256


@pytest.mark.parametrize(
    ("gpu_mib", "tp_size", "max_bs", "chunked"),
    [
        (20479, 1, 8, 2048), (20480, 1, 48, 4096), (20480, 4, 160, 4096), (35840, 1, 32, 4096),
        (35840, 4, 160, 4096), (61440, 1, 256, 8192), (61440, 4, 512, 8192), (92160, 1, 256, 8192),
        (163839, 2, 256, 8192), (163840, 1, 512, 16384), (163840, 8, 512, 16384),
    ],
)
def test_gpu_memory_tier_boundaries(gpu_mib, tp_size, max_bs, chunked):
    assert default_decode_max_bs(gpu_mib, tp_size) == max_bs
    assert default_chunked_prefill_size(gpu_mib) == chunked


def test_prefill_list_is_in_tokens_and_does_not_append_its_max():
    assert default_prefill_batch_sizes(3000)[-1] == 2816
    assert default_prefill_batch_sizes(2) == []
    assert len(default_prefill_batch_sizes(8192)) == 58
    assert default_prefill_max_tokens(16384, use_mla=True) == 8192
    assert default_prefill_max_tokens(8192, model_path="meta-llama/Llama-2-7b-hf") == 4096


def test_speculative_list_above_256_steps_by_16_and_ends_at_max():
    # SGLang's spec-decoding rule by hand: 1..8, 10..32 by 2, 40..64 by 4, 72..256 by 8, then 272.. by 16; max appended.
    got = default_decode_batch_sizes(600, speculative=True)
    assert got[-23:] == [256] + list(range(272, 593, 16)) + [600] and len(got) == 8 + 12 + 7 + 24 + 21 + 1
    assert default_decode_batch_sizes(600)[-5:] == [496, 512, 544, 576, 600]


@pytest.mark.parametrize(("kwargs", "max_tokens"), [
    ({}, 16384),
    ({"pp_size": 2}, 8192),  # pipeline parallel, breakable prefill graphs: capped at 8192
    ({"pp_size": 2, "prefill_backend": "full"}, 16384),
    ({"use_mla": True}, 8192),
    ({"max_total_tokens": 5000}, 5000),
    ({"model_path": "meta-llama/Llama-2-7b-hf"}, 4096),
])
def test_prefill_max_tokens_by_hand(kwargs, max_tokens):
    assert default_prefill_max_tokens(16384, **kwargs) == max_tokens
