"""What vLLM 0.33 builds from the files cgtune WRITES (one list), held to what cgtune costed for the same list. Seeded
random deployments (both runners, pinned or vLLM's pick, every cudagraph mode, default and explicit lists, SM90 and
SM100, dynamic speculative schedules, each drafter method) each get random tuned lists, the default and its neighbours;
cgtune's own emit path (`Engine.render_files`) writes the files, and tests/vllm/files_answers.py, in a process of its
own, parses the `vllm serve --config` YAML with vLLM 0.33's own parser, picks the runner vLLM picks under the
environment the files name, and runs vLLM's config resolution, graphs, capture and dispatch. Their list, runner,
graphs in capture order (target then drafter) and the dispatch of ~36 batches each must equal cgtune's
`Engine.dispatcher` and drafter rules for the list. A list the emit refuses must be one vLLM would change. Skipped where
vllm==0.33.0 is not installed, unless CGTUNE_REQUIRE_VLLM=1."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import oracle_compare as oc  # noqa: E402  (random deployments and batches: plain data, no vLLM imported here)
from vllm_code import require_vllm_033  # noqa: E402

from tuner.engines.engine import Deployment  # noqa: E402
from tuner.engines.vllm.drafter import capture_sequence, drafter_graphs  # noqa: E402
from tuner.engines.vllm.emit import (  # noqa: E402
    COMPILATION_CONFIG_FILE,
    SERVE_YAML_FILE,
    EmitError,
    Provenance,
    compilation_config,
    render_files,
)
from tuner.engines.vllm.runner import resolve_model_runner  # noqa: E402

SEED, DEPLOYMENTS, LISTS = 33, 360, 3
PROVENANCE = Provenance("test", "-", "-", "random deployment", "-")
DRAFTERS = ("eagle", "eagle3", "mtp", "dflash", "draft_model")


def random_lists(rnd: random.Random, engine: Any) -> list[tuple[str, tuple[int, ...]]]:
    """The default, a neighbour of it, and random tuned lists (now and then a size vLLM would drop)."""
    s = engine.serving
    default = tuple(engine.defaults().sizes)
    out = [("default", default)]
    if default and rnd.random() < 0.5:
        drop = rnd.choice(default)
        out.append(("default less one", tuple(k for k in default if k != drop)))
    else:
        out.append(("default and one", tuple(sorted({*default, rnd.randint(1, s.max_num_batched_tokens)}))))
    for _ in range(LISTS):
        sizes = set(rnd.sample(range(1, s.max_num_batched_tokens + 1),
                               min(s.max_num_batched_tokens, rnd.randint(1, 24))))
        if rnd.random() < 0.3:  # the decode widths, as a tuned list covers them
            q = engine.decode_query_len
            sizes |= {n * q for n in rnd.sample(range(1, s.max_num_seqs + 1), min(s.max_num_seqs, 8))
                      if n * q <= s.max_num_batched_tokens}
        if rnd.random() < 0.04:
            sizes.add(s.max_num_batched_tokens + rnd.randint(1, 50))
        out.append(("tuned", tuple(sorted(sizes))))
    return out


def environment_of(serve_yaml: str) -> dict[str, str]:
    """The variables the YAML's comments say must be set (`# environment: VAR=value must be set: why`)."""
    out = {}
    for line in serve_yaml.splitlines():
        if line.startswith("# environment: "):
            name, value = line.removeprefix("# environment: ").split(" must be set", 1)[0].split("=", 1)
            out[name] = value
    return out


def cgtune_model(engine: Any, sizes: tuple[int, ...], method: str | None) -> dict[str, Any]:
    """What cgtune costs for the list: the list that runs, the runner, the target's graphs in capture order (in the
    oracle's terms), every graph the capture takes (`capture_sequence`), and its dispatcher."""
    runs = list(engine.runs_as(sizes))
    # an empty list captures nothing, as the cost model runs it (its files say cudagraph_mode NONE)
    mode = engine.effective_cudagraph_mode if runs else "NONE"
    d = engine.dispatcher(runs)
    if engine.runner == "v2":
        graphs = ([[d.mixed_mode, w, None] for w in reversed(d.mixed_graph_sizes)]
                  + [["FULL", w, ql] for w, ql in d.decode_graphs])
    else:
        graphs = [[d.mixed_mode, w, False] for w in reversed(d.mixed_graph_sizes)] + [["FULL", w, True]
                                                                                     for w, _ in d.decode_graphs]
    ks = sorted({ql - 1 for ql in engine.decode_query_lens()[1:]}) if engine.dynamic_schedule else None
    s = engine.serving
    drafter = (drafter_graphs(method, runner=engine.runner, capture_sizes=runs, cudagraph_mode=mode,
                              num_speculative_tokens=s.num_speculative_tokens, max_num_seqs=s.max_num_seqs,
                              dynamic_ks=ks) if method in DRAFTERS and mode != "NONE" else [])
    capture = capture_sequence(runner=engine.runner, target_graphs=d.graphs(), drafter=drafter) \
        if mode != "NONE" else []
    return {"dispatcher": d, "runs": runs if mode != "NONE" else [], "mode": mode, "runner": engine.runner,
            "graphs": graphs if mode != "NONE" else [], "capture": [list(g) for g in capture]}


@pytest.fixture(scope="module")
def run() -> dict[str, Any]:
    require_vllm_033()
    rnd = random.Random(SEED)
    cases: list[dict[str, Any]] = []
    ours: list[dict[str, Any]] = []
    counts: Counter[str] = Counter()
    while counts["deployments"] < DEPLOYMENTS:
        cfg = oc.random_config(rnd)
        engine = oc.engine_for(cfg)
        try:
            resolve_model_runner(cfg.runner, cfg.method, parallel_drafting=False)
            refused = engine.config_refusal()
        except ValueError as exc:  # a runner pinned where it cannot run the setup: the workload is refused
            refused = str(exc)
        if refused is not None:
            counts["deployments refused"] += 1
            continue
        counts["deployments"] += 1
        counts[f"runner {engine.runner}"] += 1
        counts[f"sm {cfg.gpu_capability[0]}"] += 1
        deployment = Deployment("org/target", "org/draft" if cfg.method in DRAFTERS else None, "bfloat16", 1)
        mode = engine.effective_cudagraph_mode
        batches = oc.random_batches(rnd, engine)
        wire = [[[x.tokens, x.drafts, x.prefill_len, x.computed_prefill] for x in reqs] for reqs in batches]
        for kind, sizes in random_lists(rnd, engine):
            try:
                files = engine.render_files(sizes, deployment, cudagraph_mode=mode, provenance=PROVENANCE)
                counts[f"lists: {kind}"] += 1
                model = {"kind": kind, **cgtune_model(engine, sizes, cfg.method)}
            except EmitError as exc:
                # what the files would have said: vLLM must keep another list from them
                files = render_files(sizes, engine.serve_settings(deployment), cudagraph_mode=mode,
                                     provenance=PROVENANCE, compilation=compilation_config)
                counts["refused by the emit"] += 1
                model = {"kind": "refused by the emit", "refusal": str(exc)}
            cases.append({"yaml": files[SERVE_YAML_FILE], "compilation_config": files[COMPILATION_CONFIG_FILE],
                          "environment": environment_of(files[SERVE_YAML_FILE]),
                          "gpu_capability": list(cfg.gpu_capability), "batches": wire})
            ours.append({"config": oc._cfg_dict(cfg), "sizes": sizes, "batches": batches, **model})
    proc = subprocess.run([sys.executable, str(HERE / "files_answers.py")], input=json.dumps({"cases": cases}),
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    assert data["status"] == "ok", data
    assert data["vllm_version"] == "0.33.0"
    return {"vllm": data, "ours": ours, "counts": counts}


@pytest.fixture(scope="module")
def comparison(run: dict[str, Any]) -> tuple[list[dict[str, Any]], Counter[str]]:
    out: list[dict[str, Any]] = []
    checks: Counter[str] = Counter()

    def check(area: str, ours: dict[str, Any], vllm: Any, cgtune: Any, **where: Any) -> None:
        checks[area] += 1
        if vllm != cgtune:
            out.append({"area": area, "kind": ours["kind"], "config": ours["config"], "sizes": ours["sizes"], **where,
                        "vllm": vllm, "cgtune": cgtune})

    for ours, theirs in zip(run["ours"], run["vllm"]["answers"], strict=True):
        if ours["kind"] == "refused by the emit":
            # vLLM refuses it, keeps another list, or its V1 runner would refuse it (a list the rewrite leaves empty)
            changed = theirs["error"] is not None or theirs.get("sizes") != sorted(ours["sizes"]) or \
                (theirs["runner"] == "v1" and not theirs.get("sizes"))
            check("a refused emit is a list vLLM would change", ours, changed, True, refusal=ours["refusal"])
            continue
        check("read every field", ours, theirs["unread"], [])
        check("runner", ours, theirs["runner"], ours["runner"])
        check("refused", ours, theirs["error"], None)
        if theirs["error"] is not None:
            continue
        check("mode", ours, theirs["mode"], ours["mode"])
        check("list", ours, theirs["sizes"], ours["runs"])
        check("graphs", ours, theirs["graphs"], ours["graphs"])
        check("capture order", ours, theirs["capture"], ours["capture"])
        d = ours["dispatcher"]
        for reqs, desc in zip(ours["batches"], theirs["batches"], strict=True):
            tokens, _, decode, query_len = oc.step_of(reqs)
            got = d.dispatch(tokens, uniform_decode=decode, query_len=query_len) if ours["mode"] != "NONE" else None
            check("dispatch", ours, desc, [got.runtime_mode, got.padded_size] if got else ["NONE", None],
                  batch=[vars(x) for x in reqs])
    return out, checks


def test_vllm_033_builds_from_cgtunes_files_what_cgtune_costed(run, comparison, capsys):
    out, checks = comparison
    shown = "\n".join(json.dumps(d, default=str) for d in out[:10])
    assert not out, f"{len(out)} disagreements, first ones:\n{shown}"
    c = run["counts"]
    lists = sum(v for k, v in c.items() if k.startswith("lists: "))
    with capsys.disabled():
        print(f"\nvLLM 0.33 from cgtune's files (seed {SEED}): {c['deployments']} deployments (runner V1 "
              f"{c['runner v1']}, V2 {c['runner v2']}; SM90 {c['sm 9']}, SM100 {c['sm 10']}), {lists} emitted lists "
              f"({c['lists: default']} defaults), {c['refused by the emit']} refused by the emit (each one vLLM would "
              f"change), {checks['graphs']} graph sets, {checks['capture order']} capture orders, "
              f"{checks['dispatch']} dispatched batches: 0 disagreements; vLLM's side took {run['vllm']['seconds']} s")


def test_the_comparison_covers_what_it_claims(run, comparison):
    _, checks = comparison
    seen: Counter[str] = Counter()
    for ours in run["ours"]:
        c = ours["config"]
        seen.update([ours["kind"], f"mode {c['cudagraph_mode']}", f"method {c.get('method')}", f"runner {c['runner']}"])
        seen["dynamic schedule"] += "schedule" in c
        seen["explicit list in the deployment"] += "capture_sizes" in c
    for mode in oc.MODES:
        assert seen[f"mode {mode}"] >= 100, mode
    for method in (*DRAFTERS, "ngram", "suffix", None):
        assert seen[f"method {method}"] >= 40, method
    for key in ("runner v1", "runner v2", "dynamic schedule", "explicit list in the deployment", "default", "tuned"):
        assert seen[key] >= 100, key
    assert checks["a refused emit is a list vLLM would change"] >= 20
    assert checks["dispatch"] >= 40_000 and checks["capture order"] >= 1200
