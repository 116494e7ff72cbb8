"""What vLLM 0.33's own code builds from the files cgtune writes, as one JSON object on stdout. Each case on stdin is
a `vllm serve --config` YAML cgtune emitted, with the environment its comments say must be set; the YAML is parsed by
the parser `vllm serve` builds (`FlexibleArgumentParser` + `make_arg_parser`, `AsyncEngineArgs.from_cli_args`), the
model runner is the one `VllmConfig.use_v2_model_runner` picks under that environment, and the capture settings go
through vLLM's config resolution and that runner's graphs, capture and dispatch (tests/vllm/vllm_oracle.py). The answer
is the list vLLM keeps, the runner, the target's graphs in capture order, every graph the real capture takes (target,
then drafter), and the dispatch of the batches the case brings. Only vLLM runs here: cgtune's side is
tests/vllm/test_files_engine.py.

    python tests/vllm/files_answers.py < cases.json

Reads `{"cases": [{"yaml": text, "environment": {VAR: value}, "gpu_capability": [major, minor], "batches": [[request,
...], ...]}]}` (a request: `[tokens, drafts, prefill_len, computed_prefill]`); prints `{"status": "ok", "answers":
[...]}` or `{"status": "unavailable", "reason"}`."""

from __future__ import annotations

import json
import os
import sys
import time
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vllm_oracle as vo  # noqa: E402
from vllm_serve_parse import ServeParser  # noqa: E402

DRAFTERS = ("eagle", "eagle3", "mtp", "dflash", "draft_model")
"""Methods whose drafter the oracle's runners capture graphs for."""


def uses_v2(environment: dict[str, str], method: str | None, parallel_drafting: bool) -> bool:
    """`VllmConfig.use_v2_model_runner` under the files' environment (vLLM's own property and its unsupported-feature
    list). Stand-ins: the VllmConfig instance (the fields read: no HiSparse, no watermark, one rank) and Triton's
    presence (a GPU host has it; without it vLLM falls back to V1)."""
    import vllm.config.vllm as config_module
    import vllm.envs as envs
    from vllm.config import VllmConfig

    saved_env = os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
    if "VLLM_USE_V2_MODEL_RUNNER" in environment:
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = environment["VLLM_USE_V2_MODEL_RUNNER"]
    if envs._is_envs_cache_enabled():  # vLLM caches environment reads once a server starts
        envs.disable_envs_cache()
    ns = types.SimpleNamespace
    config = ns(attention_config=ns(hisparse_config=None), watermark_config=None,
                speculative_config=ns(method=method, parallel_drafting=parallel_drafting) if method else None,
                parallel_config=ns(distributed_executor_backend=None, pipeline_parallel_size=1, use_ubatching=False))
    config._get_v2_model_runner_unsupported_features = types.MethodType(
        VllmConfig._get_v2_model_runner_unsupported_features, config)
    saved_triton = config_module.HAS_TRITON
    config_module.HAS_TRITON = True
    try:
        return bool(VllmConfig.use_v2_model_runner.fget(config))
    finally:
        config_module.HAS_TRITON = saved_triton
        os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
        if saved_env is not None:
            os.environ["VLLM_USE_V2_MODEL_RUNNER"] = saved_env


def answer(o: vo.Oracle, parser: ServeParser, case: dict[str, Any]) -> dict[str, Any]:
    engine = parser.of_yaml(case["yaml"])
    cc = engine.compilation_config
    spec = engine.speculative_config or {}
    method = spec.get("method")
    capability = tuple(case["gpu_capability"])
    runner = "v2" if uses_v2(case["environment"], method, bool(spec.get("parallel_drafting"))) else "v1"
    schedule = spec.get("num_speculative_tokens_per_batch_size")
    cfg = vo.Config(runner=runner, cudagraph_mode=cc.cudagraph_mode.name if cc.cudagraph_mode is not None else
                    "FULL_AND_PIECEWISE", max_num_seqs=engine.max_num_seqs,
                    max_num_batched_tokens=engine.max_num_batched_tokens,
                    num_speculative_tokens=spec.get("num_speculative_tokens", 0), method=method,
                    schedule=tuple(tuple(e) for e in schedule) if schedule else None,
                    capture_sizes=tuple(cc.cudagraph_capture_sizes) if cc.cudagraph_capture_sizes is not None
                    else None, max_capture_size=cc.max_cudagraph_capture_size, gpu_capability=capability,
                    performance_mode=engine.performance_mode)
    given = json.loads(case["compilation_config"])
    out: dict[str, Any] = {"runner": runner, "enforce_eager": bool(engine.enforce_eager),
                           "unread": sorted(set(given) - {"cudagraph_mode", "cudagraph_capture_sizes",
                                                          "max_cudagraph_capture_size"})}
    if engine.enforce_eager:  # VllmConfig.__post_init__: no graphs at all
        return {**out, "error": None, "mode": "NONE", "sizes": [], "graphs": [], "capture": [],
                "batches": [["NONE", None]] * len(case["batches"])}
    r = o.resolve(cfg)
    out.update(error=r.error, mode=r.mode, sizes=r.sizes)
    if r.error is not None:
        return out
    drafter = method if method in DRAFTERS else None
    costs = (lambda *key: (1, 1))
    if runner == "v2":
        target = o.v2_manager(r, r.mode, r.q)
        out["graphs"] = [list(g) for g in o.graphs_of(target)]
        out["capture"] = [list(g[:3]) for g in o.v2_capture(r, drafter, True, costs)[0].graphs]
    else:
        target = o.v1_dispatcher(r)
        out["graphs"] = [list(g) for g in o.v1_graphs(target)]
        out["capture"] = [list(g[:3]) for g in o.v1_capture(r, drafter, costs).graphs]
    batches = []
    for reqs in case["batches"]:
        requests = [vo.Request(*x) for x in reqs]
        tokens = sum(x.tokens for x in requests)
        if runner == "v2":
            batches.append(list(o.v2_dispatch(target, len(requests), tokens,
                                              o.v2_uniform_token_count(r.q, requests))))
        else:
            batches.append(list(o.v1_dispatch(target, tokens, o.v1_uniform(r.q, requests))))
    out["batches"] = batches
    return out


def main() -> int:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # the parser's DeviceConfig default needs a device type
    request = json.loads(sys.stdin.read())
    start = time.perf_counter()
    try:
        o = vo.load()
        parser = ServeParser()
    except (vo.Unavailable, ImportError) as exc:
        print(json.dumps({"status": "unavailable", "reason": str(exc)}))
        return 0
    import vllm

    with o.patched():
        answers = [answer(o, parser, case) for case in request["cases"]]
    print(json.dumps({"status": "ok", "vllm_version": vllm.__version__, "answers": answers,
                      "seconds": round(time.perf_counter() - start, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
