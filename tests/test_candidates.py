"""Candidate widths: default grid, every decode width (each speculative tier), stride grid above the ceiling."""

from __future__ import annotations

import pytest

from tuner.engines.registry import engine_of
from tuner.workload.candidates import candidate_widths, decode_widths
from tuner.workload.spec import ServingConfig


def test_dflash_candidates_cover_every_decode_width_up_to_2176():
    serving = ServingConfig(max_num_seqs=128, num_speculative_tokens=16)
    widths = candidate_widths(serving)
    assert set(engine_of(serving).defaults().sizes) <= set(widths)
    assert set(range(17, 2177, 17)) <= set(widths)
    assert max(widths) == 2176
    above = [w for w in widths if w > 512]
    assert set(above) == set(range(527, 2177, 17)) | set(range(528, 2177, 16)) | {2176}


def test_token_budget_caps_the_candidates():
    serving = ServingConfig(max_num_seqs=256, num_speculative_tokens=24, max_num_batched_tokens=4000)
    widths = candidate_widths(serving, stride_tokens=128)
    assert max(widths) == 4000 and 3975 in widths and 6400 not in widths


def test_each_speculative_tier_adds_its_decode_widths():
    serving = ServingConfig(max_num_seqs=64, num_speculative_tokens=3, speculative_schedule=((1, 8, 3), (9, 64, 1)))
    widths = decode_widths(serving)
    assert {4, 8, 32} <= set(widths)  # q=4 tier, up to 8 requests
    assert {2, 18, 128} <= set(widths) and 160 not in widths  # q=2 tier up to 64 requests; 40 x 4 never runs
    assert set(widths) <= set(candidate_widths(serving))


def test_bad_stride():
    with pytest.raises(ValueError, match="stride_tokens=0"):
        candidate_widths(ServingConfig(max_num_seqs=8), stride_tokens=0)
