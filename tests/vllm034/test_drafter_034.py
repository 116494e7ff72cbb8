"""vLLM 0.34's drafter costs (`Drafter034`) on hand-made drafter rows (test fixtures, never measurements): a profile
without the drafter's FULL graphs is refused only where vLLM replays them (DFlash's query graphs, the one-token draft
decode graphs from K = 2 on), and a draft model's first pass is costed eager and said so, with nothing of it in the
split solver's per-member terms."""

from __future__ import annotations

import numpy as np
import pytest

from tuner.engines.vllm.v034.drafter_cost import Drafter034
from tuner.profile.table import Profile, ProfileRow

MIB = 1 << 20
WIDTHS = range(1, 65)


def _profile(*, full: bool) -> Profile:
    rows = [ProfileRow(w, "drafter_eager", "ok", latency_ms=0.3 + 0.01 * w) for w in WIDTHS]
    if full:
        rows += [ProfileRow(w, "drafter_full", "ok", latency_ms=0.1 + 0.002 * w, capture_delta_bytes=MIB,
                            standalone_bytes=2 * MIB) for w in WIDTHS]
    return Profile(rows)


def _drafter(method: str, k: int, *, full: bool, notes: list[str] | None = None) -> Drafter034:
    return Drafter034(_profile(full=full), method, dispatcher=lambda keys: None, num_speculative_tokens=k,
                      max_num_seqs=64, decode_mode="FULL", name="p.csv", notes=[] if notes is None else notes)


@pytest.mark.parametrize(("method", "k"), [("dflash", 1), ("dflash", 3), ("eagle", 2), ("mtp", 3)])
def test_a_profile_without_the_drafters_full_graphs_is_refused_where_vllm_replays_them(method, k):
    with pytest.raises(ValueError, match="p.csv: no drafter_full rows"):
        _drafter(method, k, full=False)


def test_eagle_drafting_one_token_replays_no_drafter_graph_of_its_own_and_needs_none_measured():
    # K = 1: no later one-token steps, so no draft decode graphs (step 0 replays the target's shapes).
    d = _drafter("eagle", 1, full=False)
    assert d.grid == [] and d.full_ms is None
    assert d.terms(2).decode_bytes(np.array([2, 4])).tolist() == [0, 0]


def test_a_draft_models_first_pass_is_costed_eager_and_said_so():
    notes: list[str] = []
    d = _drafter("draft_model", 3, full=True, notes=notes)
    assert any("draft model: its first pass" in n for n in notes)
    terms = d.terms(4)
    w = np.array([4, 8])
    assert terms.prefill_ms is None
    assert [terms.decode_ms(w).tolist(), terms.decode_bytes(w).tolist(), terms.prefill_bytes(w).tolist()] == \
        [[0, 0], [0, 0], [0, 0]]
    assert not any("draft model" in n for n in _notes_of("eagle"))


def _notes_of(method: str) -> list[str]:
    notes: list[str] = []
    _drafter(method, 3, full=True, notes=notes)
    return notes


def test_under_a_dynamic_schedule_each_one_token_draft_graph_is_captured_once_per_k_above_one():
    # vLLM 0.34 captures the one-token draft decode graphs for each K of the schedule's dense lookup above 1 (a K of 0
    # or 1 drafts no later token): K in {4, 2, 1} captures them twice, {1, 0} not at all.
    def drafter(ks):
        return Drafter034(_profile(full=True), "eagle", dispatcher=lambda keys: None, num_speculative_tokens=4,
                          max_num_seqs=64, decode_mode="FULL", name="p.csv", notes=[], dynamic_ks=ks)

    def later_bytes(ks):  # the one-token draft decode graphs' bytes, beside the target's decode graphs
        return drafter(ks).later_steps(np.array([8, 16]), np.array([4, 4]), True)[1]

    assert later_bytes(None) > 0
    assert drafter([4, 2, 1]).copies == (4, 2) and later_bytes([4, 2, 1]) == 2 * later_bytes(None)
    assert drafter([1, 0]).copies == () and later_bytes([1, 0]) == 0
