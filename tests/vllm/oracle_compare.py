"""Compare cgtune's vLLM rulebook with vLLM 0.33's own code (tests/vllm/vllm_oracle.py) on seeded random serving
configurations, and evaluate issue 19's six minimal cases on vLLM. Run as a script, in a process of its own (vLLM's
import sets process-wide torch and environment options that other tests must not inherit); prints one JSON object:
`{"status": "ok", "configs", "steps", "checks": {area: count}, "disagreements": [...], "cases": {...},
"families": {...}}` or
`{"status": "unavailable", "reason"}`.

    python tests/vllm/oracle_compare.py --seed 19 --configs 2000
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vllm034"))
sys.path.append(str(Path(__file__).resolve().parents[1]))  # tests/: the scripts' shared opening
import vllm_oracle as vo  # noqa: E402
from oracle_script import open_oracle  # noqa: E402
from hand_cases import FAMILIES  # noqa: E402  (plain data: the compute capability families a deployment runs)

from tuner.shapes import ModelShape  # noqa: E402
from tuner.engines.vllm.drafter import (  # noqa: E402
    capture_sequence,
    drafter_graphs,
    drafter_kv_bytes_per_token,
    drafter_passes,
)
from tuner.engines.vllm.memory import (  # noqa: E402
    MIB,
    GraphCost,
    KvRule,
    estimate_bytes,
    kv_capacity,
    pool_bytes,
    start_kv_bytes,
)
from tuner.engines.engine import Engine  # noqa: E402
from tuner.engines.registry import engine_of  # noqa: E402
from tuner.workload.spec import ServingConfig  # noqa: E402

MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
V2_METHODS = ("eagle", "eagle3", "mtp", "dflash", "draft_model", "ngram")
V1_METHODS = (*V2_METHODS, "suffix", "custom_class")
EAGLE = ("eagle", "eagle3", "mtp")
BATCHES_PER_CONFIG = 36


# ------------------------------------------------------------------------------------------------ random inputs
def random_config(rnd: random.Random) -> vo.Config:
    """Both runners, every mode, default and explicit lists, q from 1 to 25, dynamic schedules, drafters, every
    compute capability family, max_num_batched_tokens below and above max_num_seqs x q and the capture ceiling."""
    runner = rnd.choice(("v1", "v2"))
    # A fifth past 512 tokens at 2 x max_num_seqs x q with the default list, where the capture ceiling decides.
    ceiling = rnd.random() < 0.2
    k = rnd.choice((0, 0, 1, 1, 2, 3, 4, 7)) if rnd.random() < 0.85 else rnd.randint(5, 24)
    k = rnd.choice((1, 2, 3, 7)) if ceiling else k
    method = None
    if k:
        method = rnd.choice(V1_METHODS if runner == "v1" else V2_METHODS)
    r = rnd.choice((1, 2, 3, 4, 8, 16, 24, 64)) if rnd.random() < 0.9 else rnd.randint(65, 300)
    r = rnd.choice((128, 256)) if ceiling else r
    if k and r > 1 and rnd.random() < 0.25:  # below max_num_seqs x q: the widest decode steps are past the budget
        mnbt = rnd.randint(max(r, k + 1), r * (k + 1) - 1)
    else:
        mnbt = max(r, rnd.choice((16, 64, 256, 512, 1024, 2048, 8192)), rnd.randint(1, 4) * r * (k + 1))
    schedule = None
    if k and rnd.random() < 0.45:
        schedule, start = [], 1
        while start <= r + rnd.choice((0, 0, 3)):
            end = start + rnd.randint(0, max(1, r // 3))
            schedule.append((start, end, rnd.randint(0, k + (1 if rnd.random() < 0.1 else 0))))
            start = end + 1 + (rnd.randint(1, 3) if rnd.random() < 0.2 else 0)  # gaps carry K forward
        schedule = tuple(schedule)
    sizes = max_size = None
    if not ceiling and rnd.random() < 0.5:
        top = min(mnbt + 8, max(8, r * (k + 1) * rnd.choice((1, 2))), 700)
        sizes = tuple(rnd.sample(range(1, top + 1), rnd.randint(1, min(12, top))))
        if rnd.random() < 0.2:
            max_size = max(s for s in sizes if s <= mnbt) if any(s <= mnbt for s in sizes) else None
    elif not ceiling and rnd.random() < 0.2:
        max_size = rnd.randint(1, 600)
    return vo.Config(runner=runner, cudagraph_mode=rnd.choice(MODES), max_num_seqs=r, max_num_batched_tokens=mnbt,
                     num_speculative_tokens=k, method=method, schedule=schedule, capture_sizes=sizes,
                     max_capture_size=max_size, gpu_capability=rnd.choice(((9, 0), (10, 0), *FAMILIES)),
                     performance_mode=rnd.choice(("balanced", "balanced", "interactivity")),
                     fused_decode=rnd.random() < 0.8)


def engine_for(cfg: vo.Config) -> Engine:
    return engine_of(ServingConfig(
        max_num_seqs=cfg.max_num_seqs, num_speculative_tokens=cfg.num_speculative_tokens,
        max_num_batched_tokens=cfg.max_num_batched_tokens, cudagraph_mode=cfg.cudagraph_mode,
        performance_mode=cfg.performance_mode, gpu_capability=cfg.gpu_capability,
        max_cudagraph_capture_size=cfg.max_capture_size, cudagraph_capture_sizes=cfg.capture_sizes,
        speculative_schedule=cfg.schedule, model_runner=cfg.runner, speculative_method=cfg.method))


def random_batches(rnd: random.Random, s: Engine) -> list[list[vo.Request]]:
    """Decode steps at each request count's tier (and at other query lengths), prompt chunks of one length (q among
    them), one-token continuation chunks beside decodes, and mixed batches; at most max_num_batched_tokens."""
    q, r = s.decode_query_len, s.serving.max_num_seqs
    query_lens = s.decode_query_lens()
    out: list[list[vo.Request]] = []
    while len(out) < BATCHES_PER_CONFIG:
        n = rnd.randint(1, r) if rnd.random() < 0.7 else rnd.randint(1, min(r, 4))
        kind = rnd.random()
        if kind < 0.45:  # a decode step at its tier's query length
            reqs = [vo.Request(query_lens[n], query_lens[n] - 1)] * n
        elif kind < 0.55:  # a decode step at another query length
            ql = rnd.randint(1, q)
            reqs = [vo.Request(ql, ql - 1)] * n
        elif kind < 0.7:  # fresh prompt chunks of one length (q tokens: uniform on V1 only)
            chunk = q if rnd.random() < 0.5 else rnd.randint(1, 2 * q + 2)
            reqs = [vo.Request(chunk, 0, prefill_len=chunk + rnd.randint(0, 9), computed_prefill=0)] * n
        elif kind < 0.8:  # one-token continuation chunks beside one-token decodes (V2 runs them as decodes)
            reqs = [vo.Request(1, 0, prefill_len=50, computed_prefill=rnd.choice((0, 7))) if rnd.random() < 0.5
                    else vo.Request(1, 0) for _ in range(n)]
        else:  # a mixed batch
            reqs = [vo.Request(query_lens[n], query_lens[n] - 1) for _ in range(n - 1)]
            reqs.append(vo.Request(rnd.randint(1, 40), 0, prefill_len=100, computed_prefill=rnd.randint(0, 50)))
        if sum(x.tokens for x in reqs) <= s.serving.max_num_batched_tokens:
            out.append(reqs)
    return out


def step_of(reqs: list[vo.Request]) -> tuple[int, int, bool, int | None]:
    """cgtune's view of a batch, as `tuner.workload.spec.Step` describes one: (tokens, requests, decode step, query
    length when every request has the same). A decode step: no request is prefilling, one-token continuation chunks
    aside."""
    lengths = {x.tokens for x in reqs}
    prefilling = any(x.computed_prefill < x.prefill_len and not (x.tokens - x.drafts == 1 and x.computed_prefill > 0)
                     for x in reqs)
    query_len = lengths.pop() if len(lengths) == 1 else None
    return sum(x.tokens for x in reqs), len(reqs), query_len is not None and not prefilling, query_len


def cost_table(seed: int) -> Any:
    """Per (owner, mode, width): a standalone footprint and a delta in the pool, whole MiB with some deltas below
    vLLM's 1 MiB floor (seeded)."""
    cache: dict[tuple[str, str, int], tuple[int, int]] = {}

    def costs(owner: str, mode: str, width: int) -> tuple[int, int]:
        key = (owner, mode, width)
        if key not in cache:
            rnd = random.Random(f"{seed}/{owner}/{mode}/{width}")
            cache[key] = (rnd.randint(4, 400) * MIB, rnd.choice((0, MIB // 4, MIB, 3 * MIB, rnd.randint(1, 90) * MIB)))
        return cache[key]

    return costs


# ------------------------------------------------------------------------------------------------ the comparison
class Tally:
    """Checks per area, the configurations and steps they covered, and every disagreement."""

    def __init__(self) -> None:
        self.checks: Counter[str] = Counter()
        self.coverage: Counter[str] = Counter()
        self.disagreements: list[dict[str, Any]] = []

    def check(self, area: str, cfg: vo.Config, vllm: Any, cgtune: Any, **where: Any) -> bool:
        self.checks[area] += 1
        if vllm != cgtune:
            self.disagreements.append({"area": area, "config": _cfg_dict(cfg), **where, "vllm": _plain(vllm),
                                       "cgtune": _plain(cgtune)})
            return False
        return True


def _plain(x: Any) -> Any:
    return json.loads(json.dumps(x, default=str))


def _cfg_dict(cfg: vo.Config) -> dict[str, Any]:
    return {k: v for k, v in vars(cfg).items() if v is not None}


def compare_config(o: vo.Oracle, cfg: vo.Config, rnd: random.Random, t: Tally) -> int:
    """Every area for one configuration; returns the number of steps dispatched."""
    r = o.resolve(cfg)
    s = engine_for(cfg)
    try:
        runs, refused = list(s.runs_as(s.defaults().sizes)), None
    except ValueError as exc:
        runs, refused = [], str(exc)
    if not t.check("config refused", cfg, r.error is not None, refused is not None, vllm_error=r.error,
                   cgtune_error=refused) or r.error is not None:
        return 0
    mode = s.effective_cudagraph_mode
    for key in (f"runner {cfg.runner}", f"mode {cfg.cudagraph_mode}", f"q {cfg.num_speculative_tokens + 1}",
                "explicit list" if cfg.capture_sizes is not None else "default list",
                f"method {cfg.method}" if cfg.method else "no speculation",
                *(["dynamic schedule in force"] if s.dynamic_schedule else []),
                *(["dynamic schedule dropped (V1)"] if cfg.schedule and not s.dynamic_schedule else []),
                f"capability {cfg.gpu_capability[0]}.{cfg.gpu_capability[1]}", *_bounds(cfg, r)):
        t.coverage[key] += 1
    t.check("config list", cfg, r.sizes, runs)
    t.check("config mode", cfg, r.mode, mode)
    t.check("config schedule", cfg, r.schedule, [list(e) for e in s.dynamic_schedule] if s.dynamic_schedule else None)
    if r.sizes != runs or r.mode != mode:
        return 0
    d = s.dispatcher(runs)
    if cfg.runner == "v2":
        target = o.v2_manager(r, r.mode, r.q)
        ours = ([(d.mixed_mode, w, None) for w in reversed(d.mixed_graph_sizes)]
                + [("FULL", w, ql) for w, ql in d.decode_graphs])
        t.check("target graphs", cfg, o.graphs_of(target), ours)
    else:
        target = o.v1_dispatcher(r)
        ours = [(d.mixed_mode, w, False) for w in reversed(d.mixed_graph_sizes)] + [("FULL", w, True)
                                                                                    for w, _ in d.decode_graphs]
        t.check("target graphs", cfg, o.v1_graphs(target), ours)

    # Capture order (target and drafter), the real pool and the estimate, over the same simulated costs.
    costs = cost_table(rnd.randint(0, 10**9))
    ks = sorted({ql - 1 for ql in s.decode_query_lens()[1:]}) if s.dynamic_schedule else None
    method = cfg.method if cfg.method in EAGLE + ("dflash", "draft_model") else None
    runner = None
    if cfg.runner == "v2":
        cap, runner = o.v2_capture(r, method, cfg.fused_decode, costs)
    else:
        cap = o.v1_capture(r, method, costs)
    ours = cgtune_capture(cfg, s, runs, costs)
    t.check("capture order", cfg, [list(g) for g in cap.graphs], [list(g) for g in ours.graphs])
    t.check("real pool", cfg, cap.real_bytes, ours.real_bytes)
    t.check("estimate", cfg, cap.estimate_bytes, ours.estimate_bytes)

    # Dispatch of every batch: the target's, and the drafter's passes.
    batches = random_batches(rnd, s)
    for reqs in batches:
        tokens, n, decode, query_len = step_of(reqs)
        where = {"requests": [vars(x) for x in reqs]}
        t.coverage["steps: decode" if decode else "steps: prompt chunks of one length" if query_len else
                   "steps: mixed"] += 1
        if cfg.runner == "v2":
            utc = o.v2_uniform_token_count(r.q, reqs)
            t.check("uniform rule", cfg, utc, d.uniform_token_count(query_len, decode), **where)
            theirs = o.v2_dispatch(target, n, tokens, utc)
        else:
            uniform = o.v1_uniform(r.q, reqs)
            t.check("uniform rule", cfg, uniform, d.uniform_token_count(query_len, decode) is not None, **where)
            theirs = o.v1_dispatch(target, tokens, uniform)
        got = d.dispatch(tokens, uniform_decode=decode, query_len=query_len)
        t.check("dispatch", cfg, list(theirs), [got.runtime_mode, got.padded_size], **where)
        if cfg.runner == "v2" and method in EAGLE + ("dflash",) and runner is not None:
            _compare_v2_drafter(o, cfg, s, runner, runs, mode, ks, reqs, theirs, t)
    return len(batches)


def _bounds(cfg: vo.Config, r: vo.Resolved) -> list[str]:
    """Where the capture ceiling and max_num_batched_tokens decide a default list (a 512-token ceiling for 1024 or
    the other way round, or no clip at max_num_batched_tokens, would give another list), and explicit sizes above
    max_num_batched_tokens."""
    mnbt, widest = cfg.max_num_batched_tokens, cfg.max_num_seqs * (1 + cfg.num_speculative_tokens)
    default = cfg.capture_sizes is None and cfg.max_capture_size is None and r.sizes != []
    return [name for name, holds in (
        (f"capability {cfg.gpu_capability[0]}.{cfg.gpu_capability[1]}: the ceiling decides",
         default and min(2 * widest, mnbt) > 512),
        ("max_num_batched_tokens below max_num_seqs x q", mnbt < widest),
        ("default list clipped at max_num_batched_tokens", default and r.max_size == mnbt < 2 * widest),
        ("explicit list above max_num_batched_tokens", any(x > mnbt for x in cfg.capture_sizes or ())),
        ("explicit max above max_num_batched_tokens", (cfg.max_capture_size or 0) > mnbt)) if holds]


def cgtune_capture(cfg: vo.Config, s: Engine, runs: list[int], costs: Any) -> vo.Capture:
    """cgtune's capture of the list that runs: the target's graphs (`Dispatcher.graphs`) and the drafter's
    (`drafter_graphs`) in `capture_sequence` order, the pool (`pool_bytes`) and the estimate (`estimate_bytes`)."""
    mode = s.effective_cudagraph_mode
    ks = sorted({ql - 1 for ql in s.decode_query_lens()[1:]}) if s.dynamic_schedule else None
    method = cfg.method if cfg.method in EAGLE + ("dflash", "draft_model") else None
    drafter = (drafter_graphs(method, runner=cfg.runner, capture_sizes=runs, cudagraph_mode=mode,
                              num_speculative_tokens=cfg.num_speculative_tokens, max_num_seqs=cfg.max_num_seqs,
                              dynamic_ks=ks, fused_decode=cfg.fused_decode) if method else [])
    sequence = capture_sequence(runner=cfg.runner, target_graphs=s.dispatcher(runs).graphs(), drafter=drafter)
    graph_costs = [GraphCost(owner, m, w, *costs(owner, m, w)) for owner, m, w in sequence]
    return vo.Capture(sequence, int(round(pool_bytes(graph_costs))),
                      int(round(estimate_bytes(graph_costs, cfg.runner))))


def _compare_v2_drafter(o: vo.Oracle, cfg: vo.Config, s: Engine, runner: Any, runs: list[int], mode: str,
                        ks: list[int] | None, reqs: list[vo.Request], target: tuple[str, int | None],
                        t: Tally) -> None:
    """V2 speculator dispatch of one batch: EAGLE's prefill pass (its manager at the target's padded width with the
    batch's uniform token count) and decode passes, DFlash's query pass; against `drafter_passes`."""
    tokens, n, decode, query_len = step_of(reqs)
    k = query_len - 1 if decode and query_len is not None else cfg.num_speculative_tokens
    if cfg.method == "dflash":
        if not decode:
            return
        k = cfg.num_speculative_tokens
    elif k == 0 or (ks is not None and k not in ks) or (ks is None and k != cfg.num_speculative_tokens):
        return  # a K this configuration never drafts (drafter_passes takes the step's K as the one drafted)
    passes = drafter_passes(cfg.method, runner="v2", num_requests=n, num_tokens=tokens, uniform_decode=decode,
                            capture_sizes=runs, cudagraph_mode=mode, num_speculative_tokens=k,
                            max_num_seqs=cfg.max_num_seqs, dynamic_ks=ks, fused_decode=cfg.fused_decode)
    by_role = {p.role: p for p in passes}
    spec = runner.speculator
    where = {"requests": [vars(x) for x in reqs], "k": k}
    if cfg.method == "dflash":
        q = cfg.num_speculative_tokens + 1
        theirs = o.v2_dispatch(spec.query_cudagraph_manager, n, n * q, q)
        ours = by_role["query"]
        t.check("drafter dispatch", cfg, list(theirs), [ours.runtime_mode, ours.padded_size], role="query", **where)
        return
    utc = o.v2_uniform_token_count(cfg.num_speculative_tokens + 1, reqs)
    width = target[1] if target[1] is not None else tokens
    theirs = o.v2_dispatch(spec.prefill_cudagraph_manager, n, width, utc)
    ours = by_role["prefill"]
    t.check("drafter dispatch", cfg, list(theirs), [ours.runtime_mode, ours.padded_size], role="prefill", **where)
    if decode and k >= 2 and "decode" in by_role:
        mode_name, padded = o.v2_dispatch(spec.decode_cudagraph_manager, n, n, 1)
        if mode_name == "FULL":  # propose(): specialize_spec_tokens on the FULL descriptor (fused graphs per k)
            desc = spec.decode_cudagraph_manager.dispatch(n, n, 1, 0)
            desc = spec.decode_cudagraph_manager.specialize_spec_tokens(desc, k)
            mode_name, padded = desc.cg_mode.name, desc.num_tokens if desc.cg_mode.name != "NONE" else None
        ours = by_role["decode"]
        t.check("drafter dispatch", cfg, [mode_name, padded], [ours.runtime_mode, ours.padded_size], role="decode",
                **where)


def compare_kv(o: vo.Oracle, rnd: random.Random, t: Tally) -> None:
    """KV bytes per token (target and drafter layers, per TP rank) and the KV cache vLLM sizes."""
    cfg = vo.Config(runner="v2", cudagraph_mode="NONE", max_num_seqs=1, max_num_batched_tokens=1)
    heads = rnd.choice((1, 2, 4, 8, 16, 32, 64))
    kv = rnd.choice([h for h in (1, 2, 4, 8, 16, 32) if heads % h == 0])
    tp = rnd.choice((1, 2, 4, 8))
    head_dim, dtype = rnd.choice((64, 80, 96, 128, 256)), rnd.choice(("bfloat16", "float16", "float32"))
    shape = ModelShape(hidden_size=heads * head_dim, num_layers=rnd.randint(1, 80), num_attention_heads=heads,
                       num_kv_heads=kv, head_dim=head_dim, intermediate_size=64 * tp, vocab_size=32000)
    groups = [(shape.num_layers, shape.kv_heads_per_rank(tp), head_dim, dtype)]
    ours = shape.kv_bytes_per_token(dtype, tp)
    method = rnd.choice((None, "eagle", "mtp", "dflash", "draft_model", "ngram"))
    if method:
        drafter = ModelShape(hidden_size=shape.hidden_size, num_layers=rnd.randint(1, 6), num_attention_heads=heads,
                             num_kv_heads=kv, head_dim=head_dim, intermediate_size=64 * tp, vocab_size=32000)
        ours += drafter_kv_bytes_per_token(method, drafter, dtype, tp)
        if method != "ngram":  # vLLM registers draft attention layers beside the target's (facts §4)
            groups.append((drafter.num_layers, drafter.kv_heads_per_rank(tp), head_dim, dtype))
    t.check("kv bytes per token", cfg, o.kv_bytes_per_token(groups), ours, shape=vars(shape), tp=tp, method=method)
    # vLLM's start check and the KV size it logs: at the least memory cgtune says it starts with, one byte under it,
    # and a random amount above (whole blocks, the null block held back).
    max_model_len = rnd.choice((rnd.randint(1, 64), rnd.randint(65, 131072)))
    need = start_kv_bytes(max_model_len, ours)
    for available in (need - 1, need, need + rnd.randint(0, 64 * need)):
        starts = available >= need
        tokens, concurrency = kv_capacity(available, ours, max_model_len) if starts else (0, 0.0)
        t.check("kv start and size", cfg, list(o.kv_plan(groups, max_model_len, available)),
                [starts, tokens, concurrency], max_model_len=max_model_len, available=available, method=method)
    total = rnd.randint(8, 200) * (1 << 30) + rnd.randint(0, 1 << 20)
    util = round(rnd.uniform(0.3, 0.99), 4)
    non_kv, estimate, enabled = rnd.randint(1, 6) * (1 << 30), rnd.randint(0, 4 << 30), rnd.random() < 0.8
    rule = KvRule(total, util, non_kv, 0, estimate_enabled=enabled)
    t.check("kv available", cfg, o.kv_available_bytes(total, util, non_kv, estimate, enabled),
            rule.kv_available_bytes(estimate), total=total, util=util)


# ------------------------------------------------------------------------------------------------ issue 19's cases
def six_cases(o: vo.Oracle, t: Tally) -> dict[str, Any]:
    """Issue 19's six minimal cases: vLLM's answer beside cgtune's (tests/vllm/test_vllm_cases.py records vLLM's)."""
    out: dict[str, Any] = {}

    def case(name: str, cfg: vo.Config, vllm: Any, cgtune: Any) -> None:
        out[name] = {"vllm": _plain(vllm), "cgtune": _plain(cgtune)}
        t.check("issue 19 cases", cfg, _plain(vllm), _plain(cgtune), case=name)

    def target(cfg: vo.Config) -> tuple[vo.Resolved, Any, Any]:
        r = o.resolve(cfg)
        return r, (o.v2_manager(r, r.mode, r.q) if cfg.runner == "v2" else o.v1_dispatcher(r)), \
            engine_for(cfg).dispatcher(r.sizes)

    def dispatched(cfg: vo.Config, reqs: list[vo.Request]) -> tuple[list[Any], list[Any]]:
        r, theirs, ours = target(cfg)
        tokens, n, decode, query_len = step_of(reqs)
        vllm = (o.v2_dispatch(theirs, n, tokens, o.v2_uniform_token_count(r.q, reqs)) if cfg.runner == "v2" else
                o.v1_dispatch(theirs, tokens, o.v1_uniform(r.q, reqs)))
        got = ours.dispatch(tokens, uniform_decode=decode, query_len=query_len)
        return list(vllm), [got.runtime_mode, got.padded_size]

    cfg = vo.Config("v2", "FULL_AND_PIECEWISE", 1, 512, 1, "eagle", ((1, 1, 0),), (1, 2))
    _, m, d = target(cfg)
    case("case1 graphs", cfg, [list(g[:2]) for g in o.graphs_of(m)], [list(g) for g in d.graphs()])
    case("case1 dispatch", cfg, *dispatched(cfg, [vo.Request(1, 0)]))
    cfg = vo.Config("v2", "FULL_AND_PIECEWISE", 8, 512, 2, "eagle", ((1, 1, 2), (2, 8, 1)), (4, 6))
    _, m, d = target(cfg)
    case("case2 graphs", cfg, [[w, ql] for mode, w, ql in o.graphs_of(m) if mode == "FULL"],
         [list(g) for g in d.decode_graphs])
    case("case2 dispatch", cfg, *dispatched(cfg, [vo.Request(3, 2)]))
    cfg = vo.Config("v2", "FULL_DECODE_ONLY", 8, 512, 2, "eagle", ((1, 1, 2), (2, 8, 1)), (4, 6))
    case("case2 dispatch, FULL_DECODE_ONLY", cfg, *dispatched(cfg, [vo.Request(3, 2)]))
    fresh = [vo.Request(3, 0, prefill_len=3, computed_prefill=0)]
    for runner in ("v2", "v1"):
        cfg = vo.Config(runner, "FULL_AND_PIECEWISE", 2, 512, 2, "eagle", None, (3, 6))
        case(f"case3 dispatch {runner}", cfg, *dispatched(cfg, fresh))
    cfg = vo.Config("v1", "FULL_AND_PIECEWISE", 2, 512, 2, "suffix", ((1, 2, 1),), (3, 6))
    r = o.resolve(cfg)
    s = engine_for(cfg)
    case("case4 schedule and mode", cfg, [r.schedule, r.mode], [s.dynamic_schedule, s.effective_cudagraph_mode])
    case("case4 dispatch", cfg, *dispatched(cfg, [vo.Request(3, 2)] * 2))
    cfg = vo.Config("v1", "FULL_AND_PIECEWISE", 1, 512, 0, None, None, (1,))
    mib = {("target", "PIECEWISE", 1): (100 * MIB, 100 * MIB), ("target", "FULL", 1): (150 * MIB, 10 * MIB)}
    case("case5 estimate MiB", cfg, o.v1_capture(o.resolve(cfg), None, lambda *key: mib[key]).estimate_bytes / MIB,
         cgtune_capture(cfg, engine_for(cfg), [1], lambda *key: mib[key]).estimate_bytes / MIB)
    cfg = vo.Config("v2", "FULL_DECODE_ONLY", 8, 512, 3, "eagle", None, (3,))
    cap, _ = o.v2_capture(o.resolve(cfg), "eagle", True, lambda *key: (10 * MIB, MIB))
    ours = cgtune_capture(cfg, engine_for(cfg), [3], lambda *key: (10 * MIB, MIB))
    case("case6 graphs and estimate", cfg, [cap.graphs, cap.estimate_bytes], [ours.graphs, ours.estimate_bytes])
    return out


def family_cases(o: vo.Oracle, t: Tally) -> dict[str, Any]:
    """64 requests x 17 tokens (ngram, V2) on each compute capability family: vLLM's list and max beside cgtune's
    (1024 on the 10.x family only; tests/vllm/test_defaults.py works the lists by hand)."""
    out: dict[str, Any] = {}
    for major, minor in FAMILIES:
        cfg = vo.Config(runner="v2", cudagraph_mode="FULL_AND_PIECEWISE", max_num_seqs=64, max_num_batched_tokens=8192,
                        num_speculative_tokens=16, method="ngram", gpu_capability=(major, minor))
        r, s = o.resolve(cfg), engine_for(cfg)
        d = s.defaults()
        vllm, cgtune = [r.max_size, r.sizes], [d.max_size, list(s.runs_as(d.sizes))]
        out[f"{major}.{minor}"] = {"vllm": vllm, "cgtune": cgtune}
        t.check("family cases", cfg, vllm, cgtune)
    return out


def main(argv: list[str] | None = None) -> int:
    def more(p: argparse.ArgumentParser) -> None:
        p.add_argument("--kv-cases", type=int, default=480)
        p.add_argument("--max-disagreements", type=int, default=20, help="disagreements listed (all are counted)")

    opened = open_oracle(__doc__, argv, vo, seed=19, configs=2000, more=more)
    if opened is None:
        return 0
    args, start, o = opened
    rnd = random.Random(args.seed)
    t = Tally()
    steps = 0
    with o.patched():
        cases = six_cases(o, t)
        families = family_cases(o, t)
        for _ in range(args.configs):
            steps += compare_config(o, random_config(rnd), rnd, t)
        for _ in range(args.kv_cases):
            compare_kv(o, rnd, t)
    print(json.dumps({"status": "ok", "seed": args.seed, "configs": args.configs, "steps": steps,
                      "checks": dict(t.checks), "coverage": dict(sorted(t.coverage.items())),
                      "disagreement_count": len(t.disagreements),
                      "disagreements": t.disagreements[:args.max_disagreements], "cases": cases, "families": families,
                      "seconds": round(time.perf_counter() - start, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
