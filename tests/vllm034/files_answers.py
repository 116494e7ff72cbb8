"""What vLLM 0.34's own code builds from the files cgtune writes, as one JSON object on stdout. Each case on stdin is a
`vllm serve --config` YAML cgtune emitted (or, for the default, a deployment's own settings); it is parsed by the
parser `vllm serve` builds (`FlexibleArgumentParser` + `make_arg_parser`, `AsyncEngineArgs.from_cli_args`), so its
`--compilation-config` becomes vLLM's own `CompilationConfig`; its capture fields, the scheduler's and the speculative
config's go through vLLM's config resolution, its runner's `CudaGraphManager` and its runner's capture (tests/vllm034/vllm034_oracle.py); the
answer is the target's graphs in capture order, every graph the capture takes in order (the target's, then the
drafter's managers'), and the dispatch of ~40 batches drawn around vLLM's own graphs. Only vLLM runs here: cgtune's side
is tests/vllm034/test_files_engine_034.py, in another process.

Run in a process of its own with vLLM 0.34.0's --target directory first on the path:

    PYTHONPATH="$CGTUNE_VLLM034_PATH" python tests/vllm034/files_answers.py < cases.json

Reads `{"seed", "cases": [{"yaml": text, "gpu_capability": [major, minor]} or {"config": {...}} or {"check": true,
"config": {...}, "parallel_drafting": bool}]}` (the last: vLLM's start-up checks on a deployment's fields); prints
`{"status": "ok", "answers": [...]}` or `{"status": "unavailable", "reason"}`."""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vllm034_oracle as vo  # noqa: E402
from answers import random_batches  # noqa: E402
from vllm_serve_parse import ServeParser  # noqa: E402  (tests/vllm, on the path vllm034_oracle sets)

CAPTURE_FIELDS = {
    "cudagraph_capture_sizes": "cudagraph_capture_sizes",
    "max_cudagraph_capture_size": "max_cudagraph_capture_size",
    "prefill_cudagraph_capture_token_sizes": "prefill_token_sizes",
    "max_prefill_cudagraph_capture_tokens": "max_prefill_tokens",
    "decode_cudagraph_capture_request_sizes": "decode_request_sizes",
    "max_decode_cudagraph_capture_requests": "max_decode_requests",
    "max_decode_cudagraph_capture_tokens": "max_decode_tokens",
}
"""`CompilationConfig`'s fields that decide the capture sizes -> the oracle's `Config` fields. A compilation config
that sets any other field than these and the mode is reported as unread (the test then fails: it could change what
vLLM builds without the oracle seeing it)."""


def config_of_files(parser: ServeParser, case: dict[str, Any]) -> tuple[vo.Config, list[str], bool | None]:
    """The oracle's Config of what `vllm serve --config` reads from the emitted YAML (the GPU is the deployment's),
    the compilation config's fields it does not read, and its `enable_extensible_kv_cache`."""
    engine = parser.of_yaml(case["yaml"])
    cc = engine.compilation_config
    given = json.loads(case["compilation_config"])
    unread = sorted(set(given) - set(CAPTURE_FIELDS) - {"cudagraph_mode"})
    spec = engine.speculative_config or {}
    schedule = spec.get("num_speculative_tokens_per_batch_size")
    fields = {ours: getattr(cc, theirs) for theirs, ours in CAPTURE_FIELDS.items() if getattr(cc, theirs) is not None}
    cfg = vo.Config(
        max_num_seqs=engine.max_num_seqs, max_num_batched_tokens=engine.max_num_batched_tokens,
        num_speculative_tokens=spec.get("num_speculative_tokens", 0), speculative_method=spec.get("method"),
        speculative_schedule=tuple(tuple(e) for e in schedule) if schedule else None,
        gpu_capability=tuple(case["gpu_capability"]), performance_mode=engine.performance_mode,
        cudagraph_mode=cc.cudagraph_mode.name if cc.cudagraph_mode is not None else "FULL_AND_PIECEWISE",
        enforce_eager=bool(engine.enforce_eager),
        **{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})
    return cfg, unread, engine.enable_extensible_kv_cache


def answer(o: vo.Oracle, rnd: random.Random, cfg: vo.Config, batches: list[list[Any]] | None = None) -> dict[str, Any]:
    """vLLM's resolution of `cfg`, its target manager's graphs in capture order, the graphs its runner's capture takes
    in order (target, then drafter) and the dispatch of batches drawn around the target's graphs."""
    r = o.resolve(cfg)
    out: dict[str, Any] = {"error": r.error, "cudagraph_mode": r.cudagraph_mode, "prefill": r.prefill_token_sizes,
                           "decode": r.decode_request_sizes}
    if r.error is not None:
        return out
    runner = o.runner_for(r, False)
    m = runner.cudagraph_manager
    out["graphs"] = o.graphs_of(m)
    o.pool.reset(lambda *key: (1, 1))
    runner.capture_model()  # the runner's own capture: the target's graphs, then the drafter's
    out["capture"] = [g[:3] for g in o.pool.log]
    if batches is None:
        batches = [b[:3] for b in random_batches(rnd, cfg, r, out["graphs"])]
    out["batches"] = [[n, t, utc, list(o.dispatch(m, n, t, utc))] for n, t, utc in batches]
    return out


def start_up_refusal(o: vo.Oracle, case: dict[str, Any]) -> dict[str, str | None]:
    """What vLLM 0.34's own start-up checks say of a deployment's fields (None: it starts): `SchedulerConfig` (a
    real one: its `verify_max_model_len`), `SpeculativeConfig`'s method validator and `_verify_args`, the speculative
    slots check (`VllmConfig._set_max_num_scheduled_tokens` with the method's own `SpeculatorConfig`), then the config
    resolution of the capture settings (`Oracle.resolve`). Stand-ins: the VllmConfig and SpeculativeConfig instances
    (namespaces borrowing their classes' methods: building real ones loads a model)."""
    import types

    from vllm.config import VllmConfig
    from vllm.config.scheduler import SchedulerConfig
    from vllm.config.speculative import SpeculativeConfig
    from vllm.v1.worker.gpu.spec_decode.speculator_config import get_method_config_class

    cfg = vo.Config(**{k: _tuples(v) for k, v in case["config"].items()})
    try:  # in EngineArgs.create_engine_config's order: the speculative config, the scheduler's, then VllmConfig
        spec = None
        if cfg.num_speculative_tokens:
            SpeculativeConfig.__dict__["_validate_method"].__func__(SpeculativeConfig, cfg.speculative_method)
            spec = types.SimpleNamespace(
                method=cfg.speculative_method, num_speculative_tokens=cfg.num_speculative_tokens, custom_method=None,
                draft_model_config=None, target_model_config=None, tensor_parallel_size=None,
                rejection_sample_method="standard", synthetic_acceptance_rates=None, synthetic_acceptance_length=None,
                parallel_drafting=True if case.get("parallel_drafting") else None)
            spec.speculator_config = get_method_config_class(spec)(spec)
            spec.verify_equal_vocab_size_if_draft_model = types.MethodType(
                SpeculativeConfig.verify_equal_vocab_size_if_draft_model, spec)
            SpeculativeConfig.__dict__["_verify_args"](spec)
        scheduler = SchedulerConfig(max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
                                    max_model_len=8192, is_encoder_decoder=False)
        if spec is not None:
            vc = type("VllmConfigStandIn", (types.SimpleNamespace,), {
                "num_lookahead_tokens": VllmConfig.num_lookahead_tokens,
                "num_speculative_tokens": VllmConfig.num_speculative_tokens})(
                scheduler_config=scheduler, speculative_config=spec)
            VllmConfig._set_max_num_scheduled_tokens(vc)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        return {"refusal": str(exc), "stage": "start-up checks"}
    error = o.resolve(cfg).error
    return {"refusal": error, "stage": "capture settings" if error else None}


def _tuples(value: Any) -> Any:
    """JSON's lists as the Config's tuples (nested for a schedule)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def main() -> int:
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")  # vLLM's handler writes to stdout, where the answer goes
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

    rnd = random.Random(request["seed"])
    answers = []
    with o.patched():
        for case in request["cases"]:
            if case.get("check"):
                answers.append(start_up_refusal(o, case))
            elif "yaml" in case:
                cfg, unread, extensible = config_of_files(parser, case)
                answers.append({**answer(o, rnd, cfg, case.get("batches")), "unread": unread,
                                "extensible": extensible})
            else:  # the deployment's own settings, as its workload gives them
                answers.append(answer(o, rnd, vo.Config(**{k: _tuples(v) for k, v in case["config"].items()})))
    print(json.dumps({"status": "ok", "vllm_version": vllm.__version__, "vllm_file": vllm.__file__,
                      "answers": answers, "seconds": round(time.perf_counter() - start, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
