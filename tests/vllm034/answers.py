"""vLLM 0.34's own answers, as one JSON object on stdout: the four cases of the 0.34 issue and their variants (sizes,
record, graphs in capture order, the drafters' graphs, dispatch of the batches the facts file names), the hand-worked
cases of tests/vllm034/hand_cases.py (every GPU family, every ordering of the token bounds), a memory and a KV example,
and seeded random configurations each with vLLM's resolution, graphs and dispatch of ~40 batches. Only
vLLM runs here (tests/vllm034/vllm034_oracle.py); everything printed is plain data, so that
tests/vllm034/test_vllm034_oracle.py can hold it against the facts file and cgtune's rulebook in another process.

Run in a process of its own with vLLM 0.34.0's --target directory first on the path (vLLM's import sets process-wide
state, and the main venv holds 0.33 in site-packages):

    PYTHONPATH="$CGTUNE_VLLM034_PATH" python tests/vllm034/answers.py --seed 34 --configs 2000

Prints `{"status": "ok", ...}` or `{"status": "unavailable", "reason"}`.
"""

from __future__ import annotations

import dataclasses
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parents[1]))  # tests/: the scripts' shared opening
import vllm034_oracle as vo  # noqa: E402
from oracle_script import open_oracle  # noqa: E402
from hand_cases import CASES as HAND_CASES, FAMILIES  # noqa: E402

MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
METHODS = ("dflash", "eagle", "eagle3", "mtp", "draft_model", "ngram", "suffix")
BATCHES_PER_CONFIG = 40
VARLEN_LIMITS = (0, 1, 2, 3, 4, 7, 8, 9, 31, 32, 33, 100, 1023, 1024, 1025, 1100, 4095, 4096, 4100, 8192, 9000)
MIB = 1 << 20
GIB = 1 << 30


# ------------------------------------------------------------------------------------------------ the cases
def case_config(**kwargs: Any) -> vo.Config:
    """The issue's shared settings (FULL_AND_PIECEWISE, max_num_batched_tokens 8192, balanced) with the case's own."""
    return vo.Config(**{"max_num_batched_tokens": 8192, "cudagraph_mode": "FULL_AND_PIECEWISE",
                        "performance_mode": "balanced", **kwargs})


# (d) drafts with ngram: its V2 speculator (NgramGPUSpeculator, spec_decode/ngram) is what 0.34 runs for "ngram", and
# like suffix it captures no graphs of its own.
CASES = {
    "a": case_config(max_num_seqs=256),
    "b": case_config(max_num_seqs=128, num_speculative_tokens=16, speculative_method="dflash"),
    "c": case_config(max_num_seqs=128, num_speculative_tokens=16, speculative_method="dflash", gpu_capability=(10, 0)),
    "d": case_config(max_num_seqs=256, num_speculative_tokens=24, speculative_method="ngram"),
}
VARIANTS = {
    "a on SM100": dataclasses.replace(CASES["a"], gpu_capability=(10, 0)),
    "d on SM100": dataclasses.replace(CASES["d"], gpu_capability=(10, 0)),
    "b with EAGLE": dataclasses.replace(CASES["b"], speculative_method="eagle"),
    "d with EAGLE": dataclasses.replace(CASES["d"], speculative_method="eagle"),
    "b interactivity": dataclasses.replace(CASES["b"], performance_mode="interactivity"),
    "b FULL_DECODE_ONLY": dataclasses.replace(CASES["b"], cudagraph_mode="FULL_DECODE_ONLY"),
    "b decode budget 256": dataclasses.replace(CASES["b"], max_decode_tokens=256),
    "b with a draft model": dataclasses.replace(CASES["b"], speculative_method="draft_model"),
    "b with multi-module MTP": dataclasses.replace(CASES["b"], speculative_method="mtp", multi_module_mtp=True),
    "dynamic EAGLE": case_config(max_num_seqs=128, num_speculative_tokens=4, speculative_method="eagle",
                                 speculative_schedule=((1, 32, 4), (33, 64, 2), (65, 128, 1))),
    "dynamic": case_config(max_num_seqs=256, num_speculative_tokens=16, speculative_method="dflash",
                           speculative_schedule=((1, 32, 16), (33, 128, 8), (129, 256, 4))),
    "deprecated and new": dataclasses.replace(CASES["a"], cudagraph_capture_sizes=(1, 2, 4), decode_request_sizes=(8,)),
    # The deprecated list equals the decode graphs' tokens it derives (q = 1: [1, 2, 4] requests): accepted as if the
    # config were being resolved again, although it never was.
    "deprecated equal to its decode tokens, and a prefill list": dataclasses.replace(
        CASES["a"], cudagraph_capture_sizes=(1, 2, 4), prefill_token_sizes=(8,)),
    "deprecated alone, speculating": case_config(max_num_seqs=8, num_speculative_tokens=3, speculative_method="ngram",
                                                 cudagraph_capture_sizes=(3, 10)),
    "deprecated alone, EAGLE": case_config(max_num_seqs=256, num_speculative_tokens=2, speculative_method="eagle",
                                           cudagraph_capture_sizes=(1, 2, 4)),
    "deprecated empty": dataclasses.replace(CASES["a"], cudagraph_capture_sizes=()),
    "prefill above its cap": dataclasses.replace(CASES["a"], prefill_token_sizes=(8, 64, 9000), max_prefill_tokens=32),
    "all empty": dataclasses.replace(CASES["a"], prefill_token_sizes=(), decode_request_sizes=()),
}
# Batches of the facts file §4: (b) 31 decode requests (527 tokens), (c) a 600-token mixed batch.
CASE_BATCHES = {"b": [(31, 31 * 17, 17), (30, 30 * 17, 17)], "c": [(128, 128 * 17, 17), (5, 600, None)]}


def case_answer(o: vo.Oracle, cfg: vo.Config) -> dict[str, Any]:
    r = o.resolve(cfg)
    out: dict[str, Any] = {"config": config_dict(cfg), **r.plain()}
    if r.error is None:
        out["graphs"] = o.graphs_of(o.manager(r))
        s = o.speculator(r)
        out["drafter_graphs"] = o.speculator_graphs(s) if s is not None else {}
        # the real capture's order over the simulated pool (target, then drafter; the note: a draft decode graph's K)
        out["capture"] = o.capture(r, lambda *key: (MIB, MIB)).graphs
    return out


def vo_grid(limit: int, dense: bool) -> list[int]:
    """vLLM's `varlen_decode_cudagraph_capture_grid`."""
    from vllm.config.compilation import varlen_decode_cudagraph_capture_grid

    return list(varlen_decode_cudagraph_capture_grid(limit, dense))


def memory_example(o: vo.Oracle) -> dict[str, Any]:
    """Case (b) with EAGLE over a seeded cost table: every graph's (standalone, delta) bytes, the real capture's and the
    estimator's capture logs, and the three figures."""
    cfg = VARIANTS["b with EAGLE"]
    r = o.resolve(cfg)
    costs = cost_table(34)
    cap = o.capture(r, costs)
    o.pool.reset(costs)  # the estimator's own capture log (what it measured)
    estimate = int(o.runner_for(r, False).profile_cudagraph_memory())
    return {"config": config_dict(cfg), "graphs": cap.graphs, "profile_graphs": list(o.pool.log),
            "costs": sorted({(g[0], g[1], g[2]): costs(*g[:3]) for g in cap.graphs + o.pool.log}.items()),
            "real_bytes": cap.real_bytes, "estimate_bytes": cap.estimate_bytes, "estimate_again_bytes": estimate,
            "extensible_estimate_bytes": cap.extensible_estimate_bytes}


def kv_example(o: vo.Oracle) -> dict[str, Any]:
    """KV bytes per token of a Llama-3.1-8B-like model (32 layers, 8 KV heads of 128, bf16) and the extensible
    cache's sizing arithmetic on measured numbers (a 141 GiB device, 20 GiB of weights and buffers, 4 GiB of graph
    pool, a 6 GiB warmup peak)."""
    measured = {"init_free_memory": 140 * GIB, "free_memory": 116 * GIB, "committed_bytes": 2 * MIB,
                "requested_memory": 140 * GIB, "transient_peak_bytes": 6 * GIB, "torch_reserve_growth_bytes": GIB}
    small_peak = {**measured, "transient_peak_bytes": GIB // 2, "torch_reserve_growth_bytes": 0}
    capped = {**measured, "requested_memory": 100 * GIB}
    bytes_per_block = 32 * 2 * 16 * 8 * 128 * 2
    blocks = {"num_bytes": 90 * GIB, "bytes_per_block": bytes_per_block,
              "segment_strides": [bytes_per_block // 32] * 32, "capacity_blocks": 10**6}
    return {"llama8b_bytes_per_token": o.kv_bytes_per_token([(32, 8, 128, "bfloat16")]),
            "constants": o.extensible_constants,
            "measured": [[m, o.extensible_kv_bytes(**m)] for m in (measured, small_peak, capped)],
            "blocks_within": [blocks, o.extensible_kv_blocks(**blocks)]}


# ------------------------------------------------------------------------------------------------ random inputs
def random_config(rnd: random.Random) -> tuple[vo.Config, list[str]]:
    """Every mode, q from 1 to 25, every method, dynamic schedules, every compute capability family, every
    performance mode, max_num_batched_tokens below and above max_num_seqs x q (and so below and above the decode token
    budget and the prefill cap), and the capture-size knobs: default, the deprecated list and cap, the new prefill and
    decode lists and caps and the decode token budget, each alone and combined, lists with out-of-range values, list
    plus its cap, list above its cap, empty lists. Returns the config and the kinds of its size knobs (for
    coverage)."""
    k = rnd.choice((0, 0, 1, 1, 2, 3, 4, 7, 15, 16)) if rnd.random() < 0.75 else rnd.randint(5, 24)
    method = rnd.choice(METHODS) if k else None
    r = rnd.choice((1, 2, 3, 4, 8, 16, 24, 64, 128, 256)) if rnd.random() < 0.85 else rnd.randint(65, 600)
    if k and r > 1 and rnd.random() < 0.3:  # below max_num_seqs x q: the decode graphs stop at the token budget
        mnbt = rnd.randint(max(r, k + 1), r * (k + 1) - 1)
    else:
        mnbt = min(max(r, rnd.choice((16, 64, 256, 512, 1024, 2048, 8192, 16384)), rnd.randint(1, 4) * r * (k + 1)),
                   max(r, 20000))
    schedule = None
    if k and rnd.random() < 0.3:
        schedule, start = [], 1
        while start <= r + rnd.choice((0, 0, 3)):
            end = start + rnd.randint(0, max(1, r // 3))
            schedule.append((start, end, rnd.randint(0, k + (1 if rnd.random() < 0.1 else 0))))
            start = end + 1 + (rnd.randint(1, 3) if rnd.random() < 0.2 else 0)  # gaps carry K forward
        schedule = tuple(schedule)
    kinds: list[str] = []
    knobs: dict[str, Any] = {}

    def token_list(limit: int, top: int) -> tuple[int, ...]:
        values = rnd.sample(range(1, top + 1), rnd.randint(1, min(14, top)))
        if rnd.random() < 0.3:  # out of range: above the limit, or not positive
            values.append(rnd.choice((limit + rnd.randint(1, 64), 0, -1 if rnd.random() < 0.2 else limit + 1)))
            kinds.append("out-of-range values")
        return tuple(values)

    def knob(kind: str, list_name: str, cap_name: str, limit: int, top: int, cap_top: int) -> None:
        roll = rnd.random()
        if roll < 0.08:
            knobs[list_name] = ()
            kinds.append(f"{kind} empty list")
        elif roll < 0.5:
            knobs[list_name] = token_list(limit, top)
            kept = [v for v in knobs[list_name] if 1 <= v <= limit]
            extra = rnd.random()
            if extra < 0.2 and kept:
                knobs[cap_name] = max(kept) + rnd.choice((0, 0, rnd.randint(1, 50)))
                kinds.append(f"{kind} list and its cap")
            elif extra < 0.4 and kept:
                knobs[cap_name] = rnd.randint(0, max(kept) - 1) if max(kept) > 1 else 0
                kinds.append(f"{kind} list above its cap")
            else:
                kinds.append(f"{kind} list")
        else:
            knobs[cap_name] = rnd.randint(0, cap_top) if rnd.random() < 0.9 else rnd.randint(cap_top, 4 * cap_top)
            kinds.append(f"{kind} cap")

    deprecated = rnd.random() < 0.35
    if deprecated:
        roll = rnd.random()
        top = min(mnbt + 8, max(8, r * (k + 1) * rnd.choice((1, 2))), 1100)
        if roll < 0.03:
            knobs["cudagraph_capture_sizes"] = ()
            kinds.append("deprecated empty list")
        elif roll < 0.7:
            knobs["cudagraph_capture_sizes"] = tuple(rnd.sample(range(1, top + 1), rnd.randint(1, min(12, top))))
            kept = [s for s in knobs["cudagraph_capture_sizes"] if s <= mnbt]
            if rnd.random() < 0.2:
                knobs["max_cudagraph_capture_size"] = max(kept) if kept and rnd.random() < 0.8 else rnd.randint(1, 600)
                kinds.append("deprecated list and its cap")
            else:
                kinds.append("deprecated list")
        else:
            knobs["max_cudagraph_capture_size"] = rnd.randint(1, 1100)
            kinds.append("deprecated cap")
    if not deprecated or rnd.random() < 0.15:  # the new kinds, alone or (rarely) with the deprecated ones
        if rnd.random() < 0.55:
            knob("prefill", "prefill_token_sizes", "max_prefill_tokens", mnbt, min(mnbt + 16, 9000), min(mnbt, 9000))
        if rnd.random() < 0.55:
            knob("decode", "decode_request_sizes", "max_decode_requests", r, r + 4, r + 8)
        if rnd.random() < 0.35:  # about max_num_batched_tokens, or below max_num_seqs x q (where it binds)
            top = rnd.choice((3 * mnbt, r * (k + 1)))
            knobs["max_decode_tokens"] = rnd.randint(1, top) if rnd.random() < 0.97 else 0
            kinds.append("decode token budget")
    if deprecated and any(name in knobs for name in ("prefill_token_sizes", "max_prefill_tokens",
                                                     "decode_request_sizes", "max_decode_requests")):
        kinds.append("deprecated and new combined")
    if not kinds:
        kinds.append("default")
    # FULL_AND_PIECEWISE (the default) has both kinds of graph and the most to get wrong: it is drawn most.
    mode = rnd.choices(MODES, weights=(12, 15, 15, 20, 38))[0]
    cfg = vo.Config(max_num_seqs=r, max_num_batched_tokens=mnbt, num_speculative_tokens=k, speculative_method=method,
                    speculative_schedule=schedule, gpu_capability=rnd.choice(((9, 0), (10, 0), *FAMILIES)),
                    performance_mode=rnd.choice(("balanced", "balanced", "interactivity", "throughput")),
                    cudagraph_mode=mode, enforce_eager=rnd.random() < 0.02,
                    multi_module_mtp=method == "mtp" and k >= 2 and rnd.random() < 0.3, **knobs)
    return cfg, kinds


def rerun_config(cfg: vo.Config, r: vo.Resolved) -> vo.Config:
    """The resolved config given back as input (every field set to what resolution wrote): the one case where the
    deprecated and the new fields may be combined (vllm.py:2715-2731)."""
    return dataclasses.replace(cfg, cudagraph_capture_sizes=tuple(r.record), max_cudagraph_capture_size=r.max_record,
                               prefill_token_sizes=tuple(r.prefill_token_sizes or ()),
                               max_prefill_tokens=max(r.prefill_token_sizes or (), default=0),
                               decode_request_sizes=tuple(r.decode_request_sizes or ()),
                               max_decode_requests=max(r.decode_request_sizes or (), default=0),
                               max_decode_tokens=r.max_decode_tokens)


def random_batches(rnd: random.Random, cfg: vo.Config, r: vo.Resolved,
                   graphs: list[tuple[str, int, int | None, int | None]]) -> list[list[Any]]:
    """`[num_reqs, num_tokens, uniform_token_count, kind]`: uniform decode batches of n requests at each decode query
    length (n from 1 to past max_num_seqs, at and above the largest decode graph), mixed batches of 1 to past
    max_num_batched_tokens tokens (at prefill-graph edges too), and uniform batches at a query length with no decode
    graphs of its own (one-token continuation chunks, or another K)."""
    mnbt, seqs = cfg.max_num_batched_tokens, cfg.max_num_seqs
    query_lens = sorted(r.decode_query_lens) or [r.q]
    widths = sorted({w for mode, w, utc, _ in graphs if utc is None})
    out: list[list[Any]] = []
    while len(out) < BATCHES_PER_CONFIG:
        roll = rnd.random()
        if roll < 0.45:
            ql = rnd.choice(query_lens)
            top = max((n for mode, _, utc, n in graphs if utc == ql and n is not None), default=0)
            n = rnd.choice((rnd.randint(1, seqs), rnd.randint(1, seqs), top, top + 1, seqs, seqs + rnd.randint(1, 3),
                            rnd.randint(1, 4)))
            if n < 1:
                continue
            kind = "decode, no decode graphs" if not top else "decode above the largest decode graph" if n > top \
                else "decode"
            out.append([n, n * ql, ql, kind])
        elif roll < 0.85:
            t = rnd.choice((rnd.randint(1, mnbt), rnd.randint(1, min(mnbt, 600)), mnbt, mnbt + rnd.randint(1, 9),
                            *(w + rnd.choice((-1, 0, 1)) for w in rnd.sample(widths, min(2, len(widths))))))
            if t < 1:
                continue
            out.append([rnd.randint(1, min(t, seqs)), t, None, "mixed"])
        else:
            ql = rnd.randint(1, r.q + 1)
            n = rnd.randint(1, seqs)
            out.append([n, n * ql, ql, "uniform at another query length" if ql not in query_lens else "decode"])
    return out


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


def config_dict(cfg: vo.Config) -> dict[str, Any]:
    """The config's non-default fields as JSON-ready data (tuples become lists)."""
    default = vo.Config(cfg.max_num_seqs, cfg.max_num_batched_tokens)
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)
            if f.name in ("max_num_seqs", "max_num_batched_tokens") or getattr(cfg, f.name) != getattr(default, f.name)}


def random_answer(o: vo.Oracle, rnd: random.Random, cfg: vo.Config, kinds: list[str]) -> dict[str, Any]:
    r = o.resolve(cfg)
    out: dict[str, Any] = {"config": config_dict(cfg), "kinds": kinds, **r.plain()}
    if r.error is not None:
        return out
    m = o.manager(r)
    out["q"], out["graphs"] = r.q, o.graphs_of(m)
    s = o.speculator(r)
    # every manager's graphs of the drafter vLLM builds for the method (none for ngram, suffix, no speculation)
    out["drafter_graphs"] = sorted((list(g) for graphs in (o.speculator_graphs(s) if s is not None else {}).values()
                                    for g in graphs), key=lambda g: (g[0], g[1]))
    batches = random_batches(rnd, cfg, r, out["graphs"])
    out["batches"] = [[n, t, utc, kind, list(o.dispatch(m, n, t, utc))] for n, t, utc, kind in batches]
    return out


def main(argv: list[str] | None = None) -> int:
    # vLLM's own log handler is kept off stdout; the oracle collects the warnings itself
    opened = open_oracle(__doc__, argv, vo, seed=34, configs=2000, quiet_vllm_logs=True)
    if opened is None:
        return 0
    args, start, o = opened
    import vllm

    rnd = random.Random(args.seed)
    configs = []
    with o.patched():
        cases = {name: case_answer(o, cfg) for name, cfg in CASES.items()}
        for name, batches in CASE_BATCHES.items():
            m = o.manager(o.resolve(CASES[name]))
            cases[name]["dispatch"] = [[n, t, utc, list(o.dispatch(m, n, t, utc))] for n, t, utc in batches]
        variants = {name: case_answer(o, cfg) for name, cfg in VARIANTS.items()}
        rerun = o.resolve(CASES["b"])
        variants["b resolved again"] = case_answer(o, rerun_config(CASES["b"], rerun))
        hand = {name: case_answer(o, vo.Config(**case["config"])) for name, case in HAND_CASES.items()}
        memory, kv = memory_example(o), kv_example(o)
        # adaptive verification's varlen decode grid, at and around each of its strides' edges
        varlen = [[limit, dense, vo_grid(limit, dense)] for limit in VARLEN_LIMITS for dense in (False, True)]
        for _ in range(args.configs):
            cfg, kinds = random_config(rnd)
            if rnd.random() < 0.04:  # a resolved config given back (deprecated and new fields combined, accepted)
                first = o.resolve(cfg)
                if first.error is None:
                    cfg, kinds = rerun_config(cfg, first), ["resolved config resolved again"]
            configs.append(random_answer(o, rnd, cfg, kinds))
    print(json.dumps({"status": "ok", "vllm_version": vllm.__version__, "vllm_file": vllm.__file__, "seed": args.seed,
                      "cases": cases, "variants": variants, "hand": hand, "varlen": varlen, "memory": memory, "kv": kv,
                      "configs": configs,
                      "seconds": round(time.perf_counter() - start, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
