"""SGLang's automatic mem_fraction_static and KV budget: only max(bs) moves KV, only in auto mode."""

from __future__ import annotations

import pytest

from tuner.engines.sglang import (
    auto_mem_fraction_static,
    auto_reserved_mib,
    default_decode_batch_sizes,
    graph_slack_bytes,
    kv_budget_bytes,
    kv_budget_change_bytes,
    reserve_for_graph_mib,
)

H100_MIB = 81559  # hand-entered nvidia-smi value, as in test_defaults.py
GIB = 1 << 30


def test_h100_default_graph_reserve_is_976_mib():
    # 2 x 256 (decode max_bs) + 8 x 58 (default prefill buckets at chunked_prefill_size 8192).
    assert reserve_for_graph_mib(256, prefill_graph_count=58) == 976


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"decode_backend": "disabled", "prefill_graph_count": 58}, 464),
        ({"prefill_backend": "disabled"}, 512),
        ({"use_mla": True, "prefill_graph_count": 58}, 512 + 1536),
        ({"dp_attention": True, "attn_dp_size": 2, "prefill_backend": "disabled"}, 512 + 3 * 256 * 2),
        ({"disaggregation_mode": "prefill", "prefill_graph_count": 10}, 80),
        ({"disaggregation_mode": "decode", "prefill_graph_count": 10}, 512),
        ({"prefill_graph_count": 10, "moe_a2a_deepep": True}, 512 + 80 + 1024),
    ],
)
def test_graph_reserve_branches(kwargs, expected):
    assert reserve_for_graph_mib(256, **kwargs) == expected


def test_dp_attention_extra_above_300():
    # 2 x 400 + 3 x 400 x 2 + 1.5 x 400 x 2 = 800 + 2400 + 1200
    assert reserve_for_graph_mib(400, dp_attention=True, attn_dp_size=2, prefill_backend="disabled") == 4400


@pytest.mark.parametrize(("max_bs", "fraction"), [(128, 0.833), (256, 0.830), (512, 0.823)])
def test_explicit_list_max_moves_the_h100_fraction(max_bs, fraction):
    assert auto_mem_fraction_static(H100_MIB, decode_max_bs=max_bs) == fraction


def test_reserved_mib_on_h100():
    # 512 + 1.5 x 8192 + 1/8 x 1024 + 976
    assert auto_reserved_mib(H100_MIB, decode_max_bs=256) == 13904


def test_ten_gib_floor_binds_for_small_chunks_on_large_gpus():
    # chunked 4096: 512 + 6144 + 128 + 2 x 256 + 8 x 50 = 7696 < 10240, so the floor holds and max_bs is invisible.
    low = auto_reserved_mib(H100_MIB, decode_max_bs=256, chunked_prefill_size=4096)
    high = auto_reserved_mib(H100_MIB, decode_max_bs=512, chunked_prefill_size=4096)
    assert low == high == 10240
    change = kv_budget_change_bytes([1, 2, 256], [1, 2, 512], gpu_memory_mib=H100_MIB,
                                    pre_model_load_available_bytes=80 * GIB, chunked_prefill_size=4096)
    assert change == 0


def test_only_the_max_moves_kv_not_the_number_of_graphs():
    many = default_decode_batch_sizes(256)
    few = [1, 256]
    assert kv_budget_change_bytes(many, few, gpu_memory_mib=H100_MIB, pre_model_load_available_bytes=80 * GIB) == 0


def test_raising_the_max_from_256_to_512_costs_seven_thousandths_of_the_memory():
    change = kv_budget_change_bytes([1, 256], [1, 512], gpu_memory_mib=H100_MIB,
                                    pre_model_load_available_bytes=80 * GIB)
    assert change == pytest.approx(-0.007 * 80 * GIB)


def test_user_set_fraction_never_moves_kv():
    assert kv_budget_change_bytes([1, 8], [1, 512], gpu_memory_mib=H100_MIB, pre_model_load_available_bytes=80 * GIB,
                                  mem_fraction_static=0.85) == 0


def test_post_capture_sizing_keeps_only_floor_and_parallel_slack():
    assert auto_reserved_mib(H100_MIB, decode_max_bs=512, tp_size=8, post_capture_kv_sizing=True) == 1536 + 1024


def test_kv_budget_and_slack():
    # Hand numbers: 80 GiB free before load, 64 GiB free after weights, fraction 0.9 -> 8 GiB slack, 56 GiB KV.
    assert graph_slack_bytes(80 * GIB, 0.9) == pytest.approx(8 * GIB)
    assert kv_budget_bytes(64 * GIB, 80 * GIB, 0.9) == pytest.approx(56 * GIB)


def test_unknown_gpu_fraction_and_bad_values():
    assert auto_mem_fraction_static(None, decode_max_bs=160) == 0.95
    with pytest.raises(ValueError, match=r"^mem_fraction_static=1.5 must be in \(0, 1\]$"):
        kv_budget_bytes(1, 1, 1.5)
    with pytest.raises(ValueError, match=r"^decode_backend='cuda' must be one of"):
        reserve_for_graph_mib(8, decode_backend="cuda")


# Each case by hand from `handle_gpu_memory_settings` (memory_hook.py:281-343) and `reserve_for_graph_mb` /
# `reserve_for_deepep_a2a_mb` (:357-415): 512 + 1.5 x activation tokens + tp x pp / 8 x 1024 + the graph reserve,
# floored at 10 GiB above 60 GiB, + 2048 for DeepEP with decode graphs, + 2048 on XPU.
RESERVE_CASES = {
    # PD decode: activation tokens = max(running x draft tokens, 2048) = 1000 x 4 = 4000 -> 6000; graphs 2 x 64;
    # no prefill graphs on a decode instance: 512 + 6000 + 128 + 128.
    "pd decode": (40960, dict(decode_max_bs=64, disaggregation_mode="decode", max_running_requests=1000,
                              speculative_num_draft_tokens=4, chunked_prefill_size=8192, prefill_graph_count=10), 6768),
    # Without max_running_requests the decode max_bs counts: max(64 x 4, 2048) = 2048 -> 3072.
    "pd decode, max_bs": (40960, dict(decode_max_bs=64, disaggregation_mode="decode", speculative_num_draft_tokens=4,
                                      chunked_prefill_size=8192, prefill_graph_count=10), 3840),
    # PD prefill: no decode graphs, no DeepEP a2a; 10 prefill buckets x 8 + 1024 for breakable prefill with DeepEP:
    # 512 + 12288 + 128 + 80 + 1024.
    "pd prefill": (40960, dict(decode_max_bs=64, disaggregation_mode="prefill", chunked_prefill_size=8192,
                               prefill_graph_count=10, moe_a2a_deepep=True), 14032),
    # DP attention above 300: 2 x 400 + 3 x 400 x 2 + 1.5 x 400 x 2, prefill graphs off: 512 + 6144 + 128 + 4400.
    "dp attention": (40960, dict(decode_max_bs=400, dp_attention=True, attn_dp_size=2, chunked_prefill_size=4096,
                                 prefill_graph_count=0, prefill_backend="disabled"), 11184),
    # At 300 exactly, no extra: 2 x 300 + 3 x 300.
    "dp attention at 300": (40960, dict(decode_max_bs=300, dp_attention=True, chunked_prefill_size=4096,
                                        prefill_graph_count=0, prefill_backend="disabled"), 6784 + 1500),
    # Chunked prefill off: max_prefill_tokens counts (16384 -> 24576); tp 2 x pp 2 -> 512; MLA prefill graphs 1536.
    "no chunking, mla": (40960, dict(decode_max_bs=8, chunked_prefill_size=0, max_prefill_tokens=16384,
                                     prefill_graph_count=4, use_mla=True, tp_size=2, pp_size=2), 512 + 24576 + 512 + 16
                         + 1536),
    # DeepEP with decode graphs, on top of the 10 GiB floor (80 GiB): max(3728, 10240) + 2048.
    "deepep over the floor": (81920, dict(decode_max_bs=8, chunked_prefill_size=2048, prefill_graph_count=0,
                                          prefill_backend="full", moe_a2a_deepep=True), 12288),
    "xpu": (81920, dict(decode_max_bs=8, chunked_prefill_size=2048, prefill_graph_count=0, prefill_backend="full",
                        moe_a2a_deepep=True, is_xpu=True), 14336),
    # Exactly 60 GiB is not above it: no floor.
    "60 GiB": (61440, dict(decode_max_bs=8, chunked_prefill_size=2048, prefill_graph_count=0), 3728),
    # Decode graphs off: neither their reserve nor DeepEP's a2a.
    "decode off": (40960, dict(decode_max_bs=8, decode_backend="disabled", chunked_prefill_size=2048,
                               prefill_graph_count=0, prefill_backend="full", moe_a2a_deepep=True), 3712),
    # Post-capture sizing: 1536 + tp 2 x pp 3 / 8 x 1024.
    "post capture": (40960, dict(decode_max_bs=8, tp_size=2, pp_size=3, post_capture_kv_sizing=True), 2304),
}


@pytest.mark.parametrize("case", list(RESERVE_CASES))
def test_the_automatic_reserve_by_hand_in_every_branch(case):
    gpu_mib, kwargs, reserved = RESERVE_CASES[case]
    assert auto_reserved_mib(gpu_mib, **kwargs) == reserved
    assert auto_mem_fraction_static(gpu_mib, **kwargs) == round((gpu_mib - reserved) / gpu_mib, 3)


def test_bad_memory_settings_are_refused_naming_the_value():
    with pytest.raises(ValueError, match=r"^gpu_memory_mib=0 must be > 0$"):
        auto_mem_fraction_static(0, decode_max_bs=8)
    with pytest.raises(ValueError, match=r"^decode_backend='fast' must be one of full, breakable, disabled$"):
        reserve_for_graph_mib(8, decode_backend="fast")
    with pytest.raises(ValueError, match=r"^prefill_backend='x' must be one of full, breakable, disabled$"):
        reserve_for_graph_mib(8, prefill_backend="x")
    with pytest.raises(ValueError, match=r"^mem_fraction_static=0 must be in \(0, 1\]$"):
        kv_budget_bytes(10 * GIB, 20 * GIB, 0)
    assert kv_budget_bytes(10 * GIB, 20 * GIB, 1.0) == 10 * GIB  # a fraction of 1 leaves no slack
    with pytest.raises(ValueError, match=r"^old_batch_sizes=\[\], new_batch_sizes=\[8\]: both must be non-empty$"):
        kv_budget_change_bytes([], [8], gpu_memory_mib=40960, pre_model_load_available_bytes=GIB)
    with pytest.raises(ValueError, match=r"^old_batch_sizes=\[8\], new_batch_sizes=\[\]: both must be non-empty$"):
        kv_budget_change_bytes([8], [], gpu_memory_mib=40960, pre_model_load_available_bytes=GIB)


@pytest.mark.parametrize(("kwargs", "reserved"), [
    ({}, 16),  # 2 x 8; no prefill buckets by default
    ({"dp_attention": True}, 16 + 24),  # + 3 x 8 x attn_dp_size 1
    ({"dp_attention": True, "disaggregation_mode": "prefill", "prefill_graph_count": 10}, 80),  # prefill only
    ({"dp_attention": True, "attn_dp_size": 2}, 16 + 48),
    ({"prefill_backend": "disabled", "prefill_graph_count": 10}, 16),  # buckets, but prefill graphs off
])
def test_the_graph_reserve_by_hand(kwargs, reserved):
    assert reserve_for_graph_mib(8, **kwargs) == reserved


def test_above_300_requests_dp_attention_reserves_half_as_much_again():
    assert reserve_for_graph_mib(301, dp_attention=True) == 2 * 301 + 3 * 301 + 1.5 * 301
    assert reserve_for_graph_mib(300, dp_attention=True) == 2 * 300 + 3 * 300


def test_the_kv_rule_by_hand_with_a_user_fraction():
    # 1000 MiB free before load, fraction 0.75: KV = 750 - 600 MiB of weights = 150 MiB; the rest, 250 MiB, holds the
    # activations (100 MiB) and the graphs: a real pool of at most 150 MiB.
    from tuner.engines.sglang.memory import SglangKvRule

    mib = 1 << 20
    rule = SglangKvRule(1000 * mib, 600 * mib, 100 * mib, 150 * mib, 0.75, 1000.0, pre_load_free_bytes=1000 * mib)
    assert rule.kv_available_bytes() == 150 * mib
    assert rule.real_budget_bytes(8) == 150 * mib and rule.graph_budget()[0] == 150 * mib  # KV exactly enough
    assert rule.capture_headroom_bytes(0.0, 20 * mib) == 130 * mib
    short = SglangKvRule(1000 * mib, 600 * mib, 100 * mib, 151 * mib, 0.75, 1000.0, pre_load_free_bytes=1000 * mib)
    assert short.real_budget_bytes(8) == -1 and short.graph_budget()[0] == 0  # short whatever the graphs take
    # The automatic fraction reads the rule's tensor parallelism and chunked prefill size.
    auto = SglangKvRule(1000 * mib, 600 * mib, 100 * mib, 0, None, 40960.0, tensor_parallel_size=8,
                        chunked_prefill_size=2048)
    assert auto.fraction(8) == auto_mem_fraction_static(40960.0, decode_max_bs=8, tp_size=8, chunked_prefill_size=2048)
    assert auto.fraction(8) != auto_mem_fraction_static(40960.0, decode_max_bs=8, chunked_prefill_size=2048)
