"""The cost model's vectorised dispatch against the rulebook's own Dispatcher, step by step: both runners, every
cudagraph mode, dynamic speculative schedules (decode steps at each tier's query length) and prompt chunks of one
length (uniform on V1 only)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/handmade_profiles.py (import-mode=importlib)
from handmade_profiles import handmade_profile, handmade_workload  # noqa: E402

from tuner.model.costmodel import CostModel  # noqa: E402

MODES = ["FULL_AND_PIECEWISE", "FULL", "FULL_DECODE_ONLY", "PIECEWISE"]


def random_model(tmp_path: Path, seed: int) -> CostModel:
    rnd = random.Random(seed)
    spec = rnd.choice([0, 1, 2, 3])
    r = rnd.choice([4, 8])
    schedule = None
    if spec and rnd.random() < 0.7:
        cut = rnd.randint(1, r - 1)
        schedule = [[1, cut, rnd.randint(0, spec)], [cut + 1, r, rnd.randint(0, spec)]]
    wl = handmade_workload(num_speculative_tokens=spec, max_num_seqs=r, max_num_batched_tokens=48,
                           traffic={"requests": {"kind": "uniform", "min": 1, "max": r}, "mixed_share": 0.3,
                                    "mixed_tokens": {"kind": "uniform", "min": 1, "max": 48}},
                           cudagraph_mode=MODES[seed % 4], model_runner=rnd.choice(["v1", "v2"]),
                           **({"speculative_schedule": schedule} if schedule else {}))
    widths = list(range(1, 49))
    eager = {w: rnd.uniform(1, 3) for w in widths}
    # The LM head grows with the tokens (a padded step pays it for its real ones, so it must differ by width).
    logits = {w: 0.02 * w + rnd.uniform(0, 0.05) for w in widths}
    path = handmade_profile(tmp_path, wl, widths, eager_ms=eager.get, full_ms=lambda w: eager[w] * 0.6 + logits[w],
                            piecewise_ms=lambda w: eager[w] * 0.8 + logits[w], logits_ms=logits.get,
                            name=f"dispatch{seed}")
    return CostModel.from_files(path, wl)


@pytest.mark.parametrize("seed", range(24))
def test_vectorised_dispatch_equals_the_dispatcher_on_every_step(tmp_path, seed):
    m = random_model(tmp_path, seed)
    q, s = m.q, m.serving
    # The workload's steps, plus prompt chunks of q tokens per request and decode steps at every query length 1..q.
    steps = [(st.num_tokens, st.uniform_decode, st.query_len, st.num_reqs) for st in m.steps]
    steps += [(n * q, False, q, n) for n in range(1, s.max_num_seqs + 1) if n * q <= 48]
    steps += [(n * ql, True, ql, n) for ql in range(1, q + 1) for n in range(1, s.max_num_seqs + 1) if n * ql <= 48]
    widths = np.array([w for w, _, _, _ in steps])
    uniform = np.array([u for _, u, _, _ in steps])
    query_lens = np.array([ql or 0 for _, _, ql, _ in steps])
    requests = np.array([n or 0 for _, _, _, n in steps])
    rnd = random.Random(seed)
    modes = set()
    for _ in range(25):
        runs = m.runs_as(rnd.sample(range(1, 49), rnd.randint(1, 8)))
        d = m.engine.dispatcher(list(runs))
        got = m._step_parts(runs, widths, uniform, query_lens, requests)[0]
        for (w, u, ql, _), ms in zip(steps, got):
            hit = d.dispatch(w, uniform_decode=u, query_len=ql)
            modes.add(hit.runtime_mode)
            want = (float(m.eager_ms(w)) if hit.eager else
                    float(m.graph_body_ms(hit.padded_size, hit.runtime_mode)) + float(m.logits_at(w)))
            assert ms == pytest.approx(want), (runs, w, u, ql, hit)
    assert len(modes) >= 2  # the case exercises more than one outcome


def test_tier_steps_are_decode_steps_at_their_own_query_length(tmp_path):
    # V2, K=2, schedule [[1,1,2],[2,8,1]], list [4, 6]: a 1-request 3-token decode step is shadowed by the ql-2 graph
    # at 4 (PIECEWISE 4), a 3-request 6-token one replays the ql-2 FULL graph at 6.
    wl = handmade_workload(num_speculative_tokens=2, max_num_seqs=8, max_num_batched_tokens=48,
                           speculative_schedule=[[1, 1, 2], [2, 8, 1]], model_runner="v2")
    m = CostModel.from_files(handmade_profile(tmp_path, wl, list(range(1, 17)), piecewise_ms=lambda w: 0.8), wl)
    assert [(st.num_tokens, st.uniform_decode, st.query_len, st.num_reqs) for st in m.steps][:3] == \
        [(3, True, 3, 1), (4, True, 2, 2), (6, True, 2, 3)]
    assert m.step_latency_ms(3, True, (4, 6), query_len=3, num_reqs=1) == pytest.approx(0.8)  # PIECEWISE 4
    assert m.step_latency_ms(6, True, (4, 6), query_len=2, num_reqs=3) == pytest.approx(
        float(m.graph_latency_ms(6, "FULL")))
