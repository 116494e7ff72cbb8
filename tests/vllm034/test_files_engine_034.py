"""What vLLM 0.34 builds from the files cgtune WRITES, held to what cgtune costed for the same list. Seeded random
deployments (SM90 and SM100, every cudagraph mode, with and without a decode token budget, default and deprecated and
new capture settings, dynamic speculative schedules, each drafter method) each get random tuned list pairs, the
default's keys and their neighbours; cgtune's own emit path (`Engine.render_files`) writes the files, and
tests/vllm034/files_answers.py, in a process of its own with vLLM 0.34.0's code first on its path, parses the
`vllm serve --config` YAML with vLLM's own parser, resolves it with vLLM's config code and builds its runner's
`CudaGraphManager` and drafter managers. Their graphs, the capture order and the dispatch of ~40 batches each must
equal cgtune's `Engine.dispatcher` and drafter rules for the list; the default is also held, as vLLM resolves the
deployment's own settings, to `dispatcher(default keys)`. A list the emit refuses must be one vLLM would change.
Skipped where CGTUNE_VLLM034_PATH is not set, unless CGTUNE_REQUIRE_VLLM=1."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from vllm_code import vllm_034_code

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import answers as oracle_answers  # noqa: E402  (random deployments: plain data, no vLLM imported here)
import vllm034_oracle as vo  # noqa: E402

from tuner.engines.engine import Deployment  # noqa: E402
from tuner.engines.serving import ServingConfig  # noqa: E402
from tuner.engines.vllm.drafter import MODEL_BASED_METHODS  # noqa: E402
from tuner.engines.vllm.emit import (  # noqa: E402
    COMPILATION_CONFIG_FILE,
    SERVE_YAML_FILE,
    EmitError,
    Provenance,
    render_files,
)
from tuner.engines.vllm.v034.dispatch import join_keys, split_keys  # noqa: E402
from tuner.engines.vllm.v034.drafter_cost import Drafter034  # noqa: E402
from tuner.engines.vllm.v034.emit import compilation_config_034  # noqa: E402
from tuner.engines.vllm.v034.engine import Vllm034Engine  # noqa: E402
from tuner.engines.vllm.v034.settings import Vllm034Settings  # noqa: E402

SEED, DEPLOYMENTS, PAIRS = 48, 600, 3
EXAMPLES = {
    # issue 48: SM100, 512 requests, K = 24, a 16384-token decode budget: the files must carry the budget, or vLLM
    # clamps the decode graphs at 327 requests (FULL 8175) where cgtune costs 512 (FULL 12800).
    "SM100 decode budget 16384": (vo.Config(max_num_seqs=512, max_num_batched_tokens=16384, num_speculative_tokens=24,
                                            speculative_method="ngram", gpu_capability=(10, 0),
                                            max_decode_tokens=16384), join_keys([1, 2, 4, 8, 4096, 16384],
                                                                                [1, 2, 4, 64, 327, 512])),
    # SM90, max_num_seqs 2, max_num_batched_tokens 2, decode budget 1: only FULL 1 (vLLM captured FULL 2 as well from
    # files without the budget).
    "SM90 decode budget 1": (vo.Config(max_num_seqs=2, max_num_batched_tokens=2, max_decode_tokens=1),
                             join_keys([1, 2], [1, 2])),
    # the default with a deprecated field set on SM100: no decode budget, FULL decode graphs up to 257 requests.
    "SM100 default with max_cudagraph_capture_size": (vo.Config(
        max_num_seqs=257, max_num_batched_tokens=16384, num_speculative_tokens=31, speculative_method="ngram",
        gpu_capability=(10, 0), max_cudagraph_capture_size=16384), None),
}
PROVENANCE = Provenance("test", "-", "-", "random deployment", "-")
NEEDS_CHECKPOINT = ("eagle", "eagle3", "dflash", "draft_model")


# ------------------------------------------------------------------------------------------------ the deployments
def random_deployment(rnd: random.Random) -> tuple[vo.Config, bool]:
    """answers.py's random configuration (every mode, method, schedule, GPU family and capture knob), a decode token
    budget added to a third of them whatever else is set, multi-module MTP left out (a checkpoint's property, which
    no setting of cgtune's or vLLM's names); now and then a token budget below max_num_seqs or about the drafter's
    lookahead slots, 0.33's custom_class method, parallel drafting. Returns the config and whether it drafts in parallel."""
    cfg, _ = oracle_answers.random_config(rnd)
    if rnd.random() < 0.33:
        cfg = dataclasses.replace(cfg, max_decode_tokens=rnd.choice(
            (rnd.randint(1, 3 * cfg.max_num_batched_tokens), cfg.max_num_batched_tokens, 8192, 16384, 1)))
    if rnd.random() < 0.03 and cfg.max_num_seqs > 1:
        cfg = dataclasses.replace(cfg, max_num_batched_tokens=rnd.randint(1, cfg.max_num_seqs - 1))
    elif rnd.random() < 0.04 and cfg.num_speculative_tokens:  # a token budget about the drafter's lookahead slots
        mnbt = rnd.randint(1, cfg.num_speculative_tokens + 2)
        cfg = dataclasses.replace(cfg, max_num_batched_tokens=mnbt, max_num_seqs=min(cfg.max_num_seqs, mnbt))
    if rnd.random() < 0.02 and cfg.num_speculative_tokens:
        cfg = dataclasses.replace(cfg, speculative_method="custom_class", speculative_schedule=None)
    parallel = bool(cfg.num_speculative_tokens) and rnd.random() < 0.05
    return dataclasses.replace(cfg, multi_module_mtp=False), parallel


def engine_of(cfg: vo.Config, parallel_drafting: bool = False, extensible: bool = True) -> Vllm034Engine:
    settings = Vllm034Settings(prefill_token_sizes=cfg.prefill_token_sizes, max_prefill_tokens=cfg.max_prefill_tokens,
                               decode_request_sizes=cfg.decode_request_sizes,
                               max_decode_requests=cfg.max_decode_requests, max_decode_tokens=cfg.max_decode_tokens,
                               extensible_kv_cache=extensible)
    return Vllm034Engine(ServingConfig(
        max_num_seqs=cfg.max_num_seqs, num_speculative_tokens=cfg.num_speculative_tokens,
        max_num_batched_tokens=cfg.max_num_batched_tokens, cudagraph_mode=cfg.cudagraph_mode,
        performance_mode=cfg.performance_mode, gpu_capability=cfg.gpu_capability,
        max_cudagraph_capture_size=cfg.max_cudagraph_capture_size, cudagraph_capture_sizes=cfg.cudagraph_capture_sizes,
        speculative_schedule=cfg.speculative_schedule, enforce_eager=cfg.enforce_eager,
        speculative_method=cfg.speculative_method, parallel_drafting=parallel_drafting, engine_settings=settings,
        vllm_version="0.34"))


def random_pairs(rnd: random.Random, engine: Vllm034Engine) -> list[tuple[str, tuple[int, ...]]]:
    """The default's keys, a neighbour of them, and random tuned pairs (empty lists, the widest sizes, now and then a
    size vLLM would drop)."""
    s = engine.serving
    default = tuple(engine.defaults().sizes)
    out = [("default", default)]
    prefill, decode = split_keys(default)
    if rnd.random() < 0.5 and (prefill or decode):
        drop = rnd.choice([*prefill, *(-n for n in decode)])
        out.append(("default less one", tuple(k for k in default if k != drop)))
    else:
        out.append(("default and one", join_keys([*prefill, rnd.randint(1, s.max_num_batched_tokens)],
                                                 [*decode, rnd.randint(1, s.max_num_seqs)])))
    for _ in range(PAIRS):
        pre: set[int] = set()
        dec: set[int] = set()
        if rnd.random() > 0.1:
            pre = set(rnd.sample(range(1, s.max_num_batched_tokens + 1), min(s.max_num_batched_tokens,
                                                                              rnd.randint(1, 20))))
            if rnd.random() < 0.2:
                pre.add(s.max_num_batched_tokens)
        if rnd.random() > 0.1:
            dec = set(rnd.sample(range(1, s.max_num_seqs + 1), min(s.max_num_seqs, rnd.randint(1, 20))))
            if rnd.random() < 0.2:
                dec.add(s.max_num_seqs)
        if rnd.random() < 0.04:
            pre.add(s.max_num_batched_tokens + rnd.randint(1, 50))
        if rnd.random() < 0.04:
            dec.add(s.max_num_seqs + rnd.randint(1, 5))
        out.append(("tuned", join_keys(pre, dec)))
    return out


# ------------------------------------------------------------------------------------------------ cgtune's side
def deployment_of(engine: Vllm034Engine) -> Deployment:
    method = engine.serving.speculative_method
    return Deployment("org/target", "org/draft" if method in NEEDS_CHECKPOINT else None, "bfloat16", 1)


def cgtune_model(engine: Vllm034Engine, keys: tuple[int, ...]) -> dict[str, Any]:
    """What cgtune costs for the keys: the target's graphs in capture order, the drafter's graphs, the whole capture's
    order (target, then drafter), and its dispatcher (for the batches vLLM's side draws)."""
    s = engine.serving
    probe = engine.dispatcher(engine.probe_sizes())
    runs = engine.runs_as(keys)
    d = engine.dispatcher(keys)
    drafter = None
    if s.speculative_method in MODEL_BASED_METHODS and s.num_speculative_tokens:
        drafter = Drafter034.rules(s.speculative_method, dispatcher=engine.dispatcher,
                                   num_speculative_tokens=s.num_speculative_tokens, max_num_seqs=s.max_num_seqs,
                                   decode_mode=probe.decode_mode, dynamic_ks=engine.dynamic_ks)
    target = engine.graphs(runs) if d.cudagraph_mode != "NONE" else []
    drafted = drafter.graphs(runs) if drafter is not None and d.cudagraph_mode != "NONE" else []
    return {"dispatcher": d, "graphs": [list(g) for g in d.manager_graphs()],
            "drafter": sorted([m, w] for m, w in drafted),
            "capture": [["target", m, w] for m, w in target] + [["drafter", m, w] for m, w in drafted]}


def emit(engine: Vllm034Engine, keys: tuple[int, ...]) -> dict[str, str]:
    """The files cgtune's emit writes for the keys, in the mode the cost model hands it (the probe's resolved one)."""
    mode = engine.dispatcher(engine.probe_sizes()).cudagraph_mode
    return engine.render_files(keys, deployment_of(engine), cudagraph_mode=mode, provenance=PROVENANCE)


# ------------------------------------------------------------------------------------------------ the run
@pytest.fixture(scope="module")
def run() -> dict[str, Any]:
    rnd = random.Random(SEED)
    cases: list[dict[str, Any]] = []
    ours: list[dict[str, Any]] = []
    counts: Counter[str] = Counter()
    refused_emits: list[tuple[str, str]] = []
    for name, (cfg, keys) in EXAMPLES.items():
        engine = engine_of(cfg)
        keys = tuple(engine.defaults().sizes) if keys is None else keys
        files = emit(engine, keys)
        config = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
        cases.append({"yaml": files[SERVE_YAML_FILE], "compilation_config": files[COMPILATION_CONFIG_FILE],
                      "gpu_capability": list(cfg.gpu_capability), "batches": [[n, n * engine.decode_query_len,
                                                                              engine.decode_query_len]
                                                                             for n in range(1, cfg.max_num_seqs + 1)]})
        ours.append({"kind": name, "config": config, "keys": keys,
                     "compilation_config": json.loads(files[COMPILATION_CONFIG_FILE]), **cgtune_model(engine, keys)})
    while counts["deployments"] < DEPLOYMENTS:
        cfg, parallel = random_deployment(rnd)
        engine = engine_of(cfg, parallel, extensible=rnd.random() < 0.8)
        config = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
        refusal = engine.config_refusal()
        # vLLM's own start-up checks on the deployment's fields, whether cgtune takes it or not
        cases.append({"check": True, "config": config, "parallel_drafting": parallel})
        ours.append({"kind": "start-up checks", "config": config, "refusal": refusal})
        if refusal is not None:
            counts["deployments refused"] += 1
            continue
        counts["deployments"] += 1
        counts[f"sm {cfg.gpu_capability[0]}"] += 1
        counts["with a decode budget" if cfg.max_decode_tokens is not None else "no decode budget"] += 1
        default = tuple(engine.defaults().sizes)
        # the default as vLLM resolves the deployment's own settings
        cases.append({"config": config})
        ours.append({"kind": "deployment's own settings", "config": config, **cgtune_model(engine, default)})
        mode = engine.dispatcher(engine.probe_sizes()).cudagraph_mode
        for kind, keys in random_pairs(rnd, engine):
            try:
                files = emit(engine, keys)
            except EmitError as exc:
                # what the files would have said: vLLM must build something else from them
                would_be = render_files(keys, engine.serve_settings(deployment_of(engine)), cudagraph_mode=mode,
                                        provenance=PROVENANCE, compilation=lambda v, m: compilation_config_034(
                                            v, m, engine.list_fields(*split_keys(v))))
                cases.append({"yaml": would_be[SERVE_YAML_FILE], "compilation_config":
                              would_be[COMPILATION_CONFIG_FILE], "gpu_capability": list(cfg.gpu_capability)})
                ours.append({"kind": "refused by the emit", "config": config, "keys": keys, "refusal": str(exc)})
                refused_emits.append((kind, str(exc)))
                continue
            counts[f"pairs: {kind}"] += 1
            cases.append({"yaml": files[SERVE_YAML_FILE], "compilation_config": files[COMPILATION_CONFIG_FILE],
                          "gpu_capability": list(cfg.gpu_capability)})
            ours.append({"kind": kind, "config": config, "keys": keys,
                         "compilation_config": json.loads(files[COMPILATION_CONFIG_FILE]),
                         "extensible": None if engine.extensible else False, **cgtune_model(engine, keys)})
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_USE_BREAKABLE_CUDAGRAPH", "VLLM_BATCH_INVARIANT")}
    env["PYTHONPATH"] = os.pathsep.join([str(vllm_034_code()), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["VLLM_CONFIGURE_LOGGING"] = "0"
    proc = subprocess.run([sys.executable, str(HERE / "files_answers.py")], input=json.dumps({"seed": SEED,
                                                                                            "cases": cases}),
                          capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    assert data["status"] == "ok", data
    assert data["vllm_version"] == "0.34.0", data["vllm_version"]
    return {"vllm": data, "ours": ours, "counts": counts, "refused_emits": refused_emits}


def _compare(run: dict[str, Any]) -> tuple[list[dict[str, Any]], Counter[str]]:
    out: list[dict[str, Any]] = []
    checks: Counter[str] = Counter()

    def check(area: str, ours: dict[str, Any], vllm: Any, cgtune: Any, **where: Any) -> None:
        checks[area] += 1
        if vllm != cgtune:
            out.append({"area": area, "kind": ours["kind"], "config": ours["config"], "keys": ours.get("keys"),
                        "compilation_config": ours.get("compilation_config"), **where, "vllm": vllm,
                        "cgtune": cgtune})

    for ours, theirs in zip(run["ours"], run["vllm"]["answers"], strict=True):
        if ours["kind"] == "start-up checks":
            check("refuses at start-up", ours, theirs["refusal"] is not None, ours["refusal"] is not None,
                  vllm_reason=theirs["refusal"], cgtune_reason=ours["refusal"])
            if theirs["stage"] == "start-up checks" and ours["refusal"] is not None:
                # the one line names vLLM's own reason (pydantic wraps the scheduler's in its own lines)
                reason = ours["refusal"].split("refuses to start with it: ", 1)[-1]
                check("vLLM's reason", ours, reason in theirs["refusal"], True, vllm_reason=theirs["refusal"],
                      cgtune_reason=ours["refusal"])
            continue
        if ours["kind"] == "refused by the emit":
            prefill, decode = split_keys(ours["keys"])
            captured = {g[3] for g in theirs.get("graphs", []) if g[2] is not None}
            changed = theirs["error"] is not None or theirs["prefill"] != prefill or theirs["decode"] != decode \
                or bool(captured - set(decode))
            check("a refused emit is a list vLLM would change", ours, changed, True, refusal=ours["refusal"])
            continue
        check("read every field", ours, theirs.get("unread", []), [])
        if "extensible" in ours:  # the KV cache sized as costed: vLLM's default, or off where the workload turns it off
            check("extensible KV cache", ours, theirs["extensible"], ours["extensible"])
        check("refused", ours, theirs["error"], None)
        if theirs["error"] is not None:
            continue
        d = ours["dispatcher"]
        # a mode that captures nothing dispatches every step eager, as NONE does
        check("mode", ours, theirs["cudagraph_mode"] if theirs["graphs"] else "NONE",
              d.cudagraph_mode if ours["graphs"] else "NONE")
        check("graphs", ours, theirs["graphs"], ours["graphs"])
        check("drafter graphs", ours, sorted(g[1:] for g in theirs["capture"] if g[0] == "drafter"), ours["drafter"])
        check("capture order", ours, theirs["capture"], ours["capture"])
        for n, t, utc, desc in theirs["batches"]:
            check("dispatch", ours, desc, list(d.dispatch_desc(n, t, utc)), batch=[n, t, utc])
    return out, checks


@pytest.fixture(scope="module")
def comparison(run: dict[str, Any]) -> tuple[list[dict[str, Any]], Counter[str]]:
    return _compare(run)


def test_vllm_034_builds_from_cgtunes_files_what_cgtune_costed(run, comparison, capsys):
    out, checks = comparison
    shown = "\n".join(json.dumps(d, default=str) for d in out[:10])
    assert not out, f"{len(out)} disagreements, first ones:\n{shown}"
    c = run["counts"]
    pairs = sum(v for k, v in c.items() if k.startswith("pairs: "))
    with capsys.disabled():
        print(f"\nvLLM 0.34 from cgtune's files (seed {SEED}): {checks['refuses at start-up']} deployments through "
              f"vLLM's start-up checks ({c['deployments refused']} refused by both), {c['deployments']} taken (SM90 "
              f"{c['sm 9']}, "
              f"SM100 {c['sm 10']}; {c['with a decode budget']} with a decode budget), {pairs} emitted list pairs "
              f"({c['pairs: default']} defaults), {len(run['refused_emits'])} refused by the emit (each one vLLM would "
              f"change), "
              f"{checks['graphs']} graph sets, {checks['drafter graphs']} drafter graph sets, {checks['capture order']} "
              f"capture orders, {checks['dispatch']} dispatched batches: 0 disagreements; vLLM's side took "
              f"{run['vllm']['seconds']} s")


def _example(run: dict[str, Any], name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    return next((ours, theirs) for ours, theirs in zip(run["ours"], run["vllm"]["answers"]) if ours["kind"] == name)


def _decode_graphs(graphs: list[list[Any]]) -> list[list[Any]]:
    return [list(g) for g in graphs if g[2] is not None]


def test_the_issues_examples_build_in_vllm_the_graphs_cgtune_costs(run):
    # SM100, 512 requests, K = 24, decode budget 16384: the files carry the budget, and vLLM's widest decode graph is
    # cgtune's, FULL 12800 for 512 requests (not 327 requests, FULL 8175); a 512-request decode step replays it.
    ours, theirs = _example(run, "SM100 decode budget 16384")
    assert ours["compilation_config"]["max_decode_cudagraph_capture_tokens"] == 16384
    assert _decode_graphs(theirs["graphs"])[0] == ["FULL", 12800, 25, 512] == _decode_graphs(ours["graphs"])[0]
    assert theirs["batches"][-1] == [512, 12800, 25, ["FULL", 12800, 512]]
    assert list(ours["dispatcher"].dispatch_desc(512, 12800, 25)) == ["FULL", 12800, 512]
    # SM90, max_num_seqs 2, max_num_batched_tokens 2, decode budget 1: FULL 1 alone on both sides; a 2-request decode
    # step replays the PIECEWISE graph of 2 tokens.
    ours, theirs = _example(run, "SM90 decode budget 1")
    assert ours["compilation_config"]["max_decode_cudagraph_capture_tokens"] == 1
    assert _decode_graphs(theirs["graphs"]) == [["FULL", 1, 1, 1]] == _decode_graphs(ours["graphs"])
    assert theirs["batches"][1] == [2, 2, 1, ["PIECEWISE", 2, None]] and \
        list(ours["dispatcher"].dispatch_desc(2, 2, 1)) == ["PIECEWISE", 2, None]
    # SM100, max_num_seqs 257, K = 31, max_cudagraph_capture_size 16384 (a deprecated field: no decode budget): the
    # default's FULL decode graphs reach 257 requests (8224 tokens) in vLLM and in cgtune's costing of the default, and
    # its files keep that (a 257-request step: FULL 8224, not PIECEWISE).
    ours, theirs = _example(run, "SM100 default with max_cudagraph_capture_size")
    assert _decode_graphs(theirs["graphs"])[0] == ["FULL", 8224, 32, 257] == _decode_graphs(ours["graphs"])[0]
    assert theirs["batches"][-1] == [257, 8224, 32, ["FULL", 8224, 257]]
    assert list(ours["dispatcher"].dispatch_desc(257, 8224, 32)) == ["FULL", 8224, 257]


def test_the_comparison_covers_what_it_claims(run, comparison):
    # So that "0 disagreements" means something: both GPU families, every mode, method and kind of setting, dynamic
    # schedules, budgets, refusals of each kind, and lists the emit refused.
    _, checks = comparison
    seen: Counter[str] = Counter()
    for ours in run["ours"]:
        c = ours["config"]
        if ours["kind"] in ("start-up checks", "refused by the emit") or ours["kind"] in EXAMPLES:
            continue
        seen.update([f"mode {c['cudagraph_mode']}", f"method {c['speculative_method']}", f"sm {c['gpu_capability'][0]}",
                     "budget" if c["max_decode_tokens"] is not None else "no budget", ours["kind"]])
        seen["dynamic schedule"] += c["speculative_schedule"] is not None
        seen["deprecated field"] += c["cudagraph_capture_sizes"] is not None or \
            c["max_cudagraph_capture_size"] is not None
        seen["decode budget written"] += "max_decode_cudagraph_capture_tokens" in (ours.get("compilation_config") or {})
        seen["the deployment's own fields written"] += "prefill_cudagraph_capture_token_sizes" not in \
            (ours.get("compilation_config") or {"prefill_cudagraph_capture_token_sizes": 0}) and \
            ours.get("compilation_config", {}).get("cudagraph_mode") != "NONE"
    for mode in oracle_answers.MODES:
        assert seen[f"mode {mode}"] >= 100, mode
    for method in ("dflash", "eagle", "eagle3", "mtp", "draft_model", "ngram", "suffix", None):
        assert seen[f"method {method}"] >= 50, method
    assert 50 <= checks["extensible KV cache"] and sum(o.get("extensible") is False for o in run["ours"]) >= 100
    for key in ("sm 9", "sm 10", "budget", "no budget", "dynamic schedule", "deprecated field", "default",
                "default less one", "default and one", "tuned", "decode budget written"):
        assert seen[key] >= 100, key
    assert seen["the deployment's own fields written"] >= 1
    refusals = [ours for ours in run["ours"] if ours["kind"] == "start-up checks" and ours["refusal"]]
    for needle in ("must be greater than or equal to max_num_seqs", "does not have enough slots",
                   "Unknown speculative method", "parallel_drafting is only supported", "capture settings"):
        assert sum(needle in ours["refusal"] for ours in refusals) >= 5, needle
    assert len(run["refused_emits"]) >= 100 and checks["a refused emit is a list vLLM would change"] >= 100
    assert checks["dispatch"] >= 100_000 and checks["capture order"] >= 3000
