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
from tuner.engines.vllm.emit import COMPILATION_CONFIG_FILE, SERVE_YAML_FILE, EmitError, Provenance  # noqa: E402
from tuner.engines.vllm.v034.dispatch import join_keys, split_keys  # noqa: E402
from tuner.engines.vllm.v034.drafter_cost import Drafter034  # noqa: E402
from tuner.engines.vllm.v034.engine import Vllm034Engine  # noqa: E402
from tuner.engines.vllm.v034.settings import Vllm034Settings  # noqa: E402

SEED, DEPLOYMENTS, PAIRS = 48, 600, 3
PROVENANCE = Provenance("test", "-", "-", "random deployment", "-")
NEEDS_CHECKPOINT = ("eagle", "eagle3", "dflash", "draft_model")


# ------------------------------------------------------------------------------------------------ the deployments
def random_deployment(rnd: random.Random) -> vo.Config:
    """answers.py's random configuration (every mode, method, schedule, GPU family and capture knob), a decode token
    budget added to a third of them whatever else is set, multi-module MTP left out (a checkpoint's property, which
    no setting of cgtune's or vLLM's names)."""
    cfg, _ = oracle_answers.random_config(rnd)
    if rnd.random() < 0.33:
        cfg = dataclasses.replace(cfg, max_decode_tokens=rnd.choice(
            (rnd.randint(1, 3 * cfg.max_num_batched_tokens), cfg.max_num_batched_tokens, 8192, 16384, 1)))
    return dataclasses.replace(cfg, multi_module_mtp=False)


def engine_of(cfg: vo.Config) -> Vllm034Engine:
    settings = Vllm034Settings(prefill_token_sizes=cfg.prefill_token_sizes, max_prefill_tokens=cfg.max_prefill_tokens,
                               decode_request_sizes=cfg.decode_request_sizes,
                               max_decode_requests=cfg.max_decode_requests, max_decode_tokens=cfg.max_decode_tokens)
    return Vllm034Engine(ServingConfig(
        max_num_seqs=cfg.max_num_seqs, num_speculative_tokens=cfg.num_speculative_tokens,
        max_num_batched_tokens=cfg.max_num_batched_tokens, cudagraph_mode=cfg.cudagraph_mode,
        performance_mode=cfg.performance_mode, gpu_capability=cfg.gpu_capability,
        max_cudagraph_capture_size=cfg.max_cudagraph_capture_size, cudagraph_capture_sizes=cfg.cudagraph_capture_sizes,
        speculative_schedule=cfg.speculative_schedule, enforce_eager=cfg.enforce_eager,
        speculative_method=cfg.speculative_method, engine_settings=settings, vllm_version="0.34"))


def accepted(engine: Vllm034Engine) -> str | None:
    """None where cgtune takes the deployment, else its one-line refusal (vLLM's own reason)."""
    try:
        refusal = engine.config_refusal()
    except ValueError as exc:
        return str(exc)
    return refusal


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
    while counts["deployments"] < DEPLOYMENTS:
        cfg = random_deployment(rnd)
        engine = engine_of(cfg)
        if accepted(engine) is not None:
            counts["deployments refused"] += 1
            continue
        counts["deployments"] += 1
        counts[f"sm {cfg.gpu_capability[0]}"] += 1
        counts["with a decode budget" if cfg.max_decode_tokens is not None else "no decode budget"] += 1
        default = tuple(engine.defaults().sizes)
        # the default as vLLM resolves the deployment's own settings
        config = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
        cases.append({"config": config})
        ours.append({"kind": "deployment's own settings", "config": config, **cgtune_model(engine, default)})
        for kind, keys in random_pairs(rnd, engine):
            try:
                files = emit(engine, keys)
            except EmitError as exc:
                refused_emits.append((kind, str(exc)))
                continue
            counts[f"pairs: {kind}"] += 1
            cases.append({"yaml": files[SERVE_YAML_FILE], "compilation_config": files[COMPILATION_CONFIG_FILE],
                          "gpu_capability": list(cfg.gpu_capability)})
            ours.append({"kind": kind, "config": config, "keys": keys,
                         "compilation_config": json.loads(files[COMPILATION_CONFIG_FILE]),
                         **cgtune_model(engine, keys)})
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
        check("read every field", ours, theirs.get("unread", []), [])
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
        print(f"\nvLLM 0.34 from cgtune's files (seed {SEED}): {c['deployments']} deployments (SM90 {c['sm 9']}, "
              f"SM100 {c['sm 10']}; {c['with a decode budget']} with a decode budget), {pairs} emitted list pairs "
              f"({c['pairs: default']} defaults), {len(run['refused_emits'])} refused by the emit, "
              f"{checks['graphs']} graph sets, {checks['drafter graphs']} drafter graph sets, {checks['capture order']} "
              f"capture orders, {checks['dispatch']} dispatched batches: 0 disagreements; vLLM's side took "
              f"{run['vllm']['seconds']} s")
