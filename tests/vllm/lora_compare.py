"""cgtune's vLLM 0.33 rulebook on multi-LoRA graphs and data parallelism against vLLM 0.33's own code, both runners:
for seeded random configurations with LoRA (max_loras, specialize_active_lora, cudagraph_specialize_lora) and a DP size,
the graphs each runner captures with their LoRA cases in capture order (V2: its `CudaGraphManager` with
`get_lora_capture_cases`; V1: `CudagraphDispatcher.get_capture_descs` with the config's LoRA), and what each rank of
random joint draws runs: V2's `dispatch_cg_and_sync_dp` (v1/worker/gpu/dp_utils.py), V1's
`GPUModelRunner._determine_batch_execution_and_padding` with `coordinate_batch_across_dp` (v1/worker/dp_utils.py), the
all-reduce a stand-in that hands every rank every rank's column. One rank alone is LoRA dispatch without DP. Run as a
script, in a process of its own (vLLM's import sets process-wide state); prints one JSON object:

    python tests/vllm/lora_compare.py --seed 51 --configs 300
"""

from __future__ import annotations

import json
import random
import sys
import time
import types
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.append(str(Path(__file__).resolve().parents[1]))  # tests/: the scripts' shared opening
import vllm_oracle as vo  # noqa: E402
from oracle_script import open_oracle  # noqa: E402
from dp_all_reduce import agree_ranks, agree_v2  # noqa: E402

from tuner.engines.registry import engine_of  # noqa: E402
from tuner.engines.serving import ServingConfig  # noqa: E402
from tuner.engines.vllm.data_parallel import synced_dispatch  # noqa: E402
from tuner.engines.vllm.dispatch import uniform_token_count  # noqa: E402
from tuner.engines.vllm.lora import LoraSettings  # noqa: E402

MODES = ("PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
DRAWS = 16


def random_case(rnd: random.Random) -> tuple[vo.Config, LoraSettings, int]:
    runner = rnd.choice(("v1", "v2"))
    k = rnd.choice((0, 0, 0, 1, 2, 4))
    r = rnd.choice((1, 2, 4, 8, 16, 32, 64))
    mnbt = max(r * (k + 1), rnd.choice((64, 256, 512)))
    sizes = None
    if rnd.random() < 0.6:
        top = min(mnbt, rnd.choice((8, 64, 300)))
        sizes = tuple(rnd.sample(range(1, top + 1), rnd.randint(1, min(10, top))))
    cfg = vo.Config(runner=runner, cudagraph_mode=rnd.choices(MODES, weights=(1, 1, 1, 3))[0], max_num_seqs=r,
                    max_num_batched_tokens=mnbt, num_speculative_tokens=k, method="ngram" if k else None,
                    capture_sizes=sizes)
    lora = LoraSettings(max_loras=rnd.choice((1, 2, 3, 4, 5, 7, 8, 16)), specialize_active_lora=rnd.random() < 0.5,
                        cudagraph_specialize_lora=rnd.random() < 0.6)
    # V1 without the no-LoRA graphs runs a step with no adapter eager, and all DP ranks with it: cgtune refuses that
    # deployment (serving.data_parallel_size), so it is drawn with one rank.
    dp_size = rnd.choice((1, 2, 2, 3, 4)) if runner == "v2" or lora.cudagraph_specialize_lora else 1
    return cfg, lora, dp_size


def random_batch(rnd: random.Random, cfg: vo.Config, q: int, max_loras: int) -> tuple[int, int, int, int]:
    """(requests, tokens, the largest request's tokens, active adapters): a decode batch at q, a batch of q-token prompt
    chunks, or a mixed batch (one request holding the rest)."""
    seqs, mnbt = cfg.max_num_seqs, cfg.max_num_batched_tokens
    roll = rnd.random()
    if roll < 0.55:
        n = rnd.randint(1, seqs)
        batch = (n, n * q, q)
    else:
        t = rnd.choice((rnd.randint(1, mnbt), rnd.randint(1, min(mnbt, 400)), rnd.randint(1, min(mnbt, 24))))
        n = rnd.randint(1, min(t, seqs))
        batch = (n, t, t - (n - 1))
    return (*batch, rnd.randint(0, min(max_loras, batch[0])))


def v2_manager(o: vo.Oracle, r: vo.Resolved, lora: LoraSettings) -> tuple[Any, list[int]]:
    """The V2 runner's manager with the LoRA cases `get_lora_capture_cases` gives (v1/worker/gpu/lora_utils.py)."""
    from vllm.config.lora import LoRAConfig
    from vllm.v1.worker.gpu.lora_utils import get_lora_capture_cases

    c = r.vllm_config.compilation_config
    c.cudagraph_specialize_lora = lora.cudagraph_specialize_lora
    cases = list(get_lora_capture_cases(LoRAConfig(max_loras=lora.max_loras, max_lora_rank=16,
                                                   specialize_active_lora=lora.specialize_active_lora), c))
    m = o.v2_graphs.CudaGraphManager(r.vllm_config, None, o.CUDAGraphMode[r.mode], r.q, lora_capture_cases=cases)
    m._graphs_captured = True  # as after capture(); dispatch answers eager before it
    return m, cases


def v2_dispatch(o: vo.Oracle, m: Any, draw: list[tuple[int, int, int, int]], q: int) -> list[list[Any]]:
    """Each rank's `dispatch_cg_and_sync_dp` as V2's `execute_model` calls it, uniform at q for a decode batch
    (`gather_batch_req_state`); with one rank, the manager's own dispatch."""
    import vllm.v1.worker.gpu.dp_utils as dp

    def call(rank: int) -> list[Any]:
        n, t, top, active = draw[rank]
        utc = q if t == n * q and top == q else None
        d = dp.dispatch_cg_and_sync_dp(m, n, t, utc, len(draw), rank, max_query_len=utc, num_active_loras=active,
                                       uniform_decode=utc == q)[0]
        return [d.cg_mode.name, d.num_tokens, d.num_active_loras]

    return agree_v2(dp, len(draw), call)


def v1_dispatch(o: vo.Oracle, r: vo.Resolved, dispatcher: Any, draw: list[tuple[int, int, int, int]]
                ) -> list[list[Any]]:
    """Each rank's `_determine_batch_execution_and_padding` (gpu_model_runner.py) on a stand-in runner (the fields the
    method reads: its dispatcher, q, the active LoRAs of its input batch, the parallel config of its rank), DP
    coordinated by vLLM's `coordinate_batch_across_dp`. Stand-ins: the DP group (its device: the CPU all-reduce path)
    and `torch.distributed.all_reduce`."""
    import vllm.v1.worker.dp_utils as dp

    cls = o.v1_runner.GPUModelRunner

    def call(rank: int) -> list[Any]:
        n, t, top, active = draw[rank]
        ns = types.SimpleNamespace
        parallel = ns(data_parallel_size=len(draw), data_parallel_rank=rank, use_ubatching=False, num_ubatches=2,
                      disable_nccl_for_dp_synchronization=True)
        runner = ns(cudagraph_dispatcher=dispatcher, uniform_decode_query_len=r.q, parallel_config=parallel,
                    vllm_config=ns(parallel_config=parallel, observability_config=ns(cudagraph_metrics=False)),
                    model_config=ns(is_encoder_decoder=False),
                    input_batch=ns(lora_id_to_lora_request={i + 1: i + 1 for i in range(active)}),
                    _is_uniform_decode=cls._is_uniform_decode)
        sched = np.array([top] + [1] * (n - 1)) if t != n * top else np.full(n, top)
        mode, desc, *_ = cls._determine_batch_execution_and_padding(runner, t, n, sched, top, allow_microbatching=False)
        return [mode.name, desc.num_tokens, desc.num_active_loras]

    def install(reduce: Any) -> None:
        dp.dist = types.SimpleNamespace(all_reduce=lambda tensor, group=None: reduce(tensor))

    saved = dp.get_dp_group, dp.dist
    dp.get_dp_group = lambda: types.SimpleNamespace(device="cpu", device_group=None, cpu_group=None)
    try:
        return agree_ranks(len(draw), call, install)
    finally:
        dp.get_dp_group, dp.dist = saved


def v1_dispatcher(o: vo.Oracle, r: vo.Resolved, lora: LoraSettings) -> Any:
    """V1's `CudagraphDispatcher` with the config's LoRA (`_get_lora_cases`, `specialize_lora_count`)."""
    from vllm.config.lora import LoRAConfig

    r.vllm_config.lora_config = LoRAConfig(max_loras=lora.max_loras, max_lora_rank=16,
                                           specialize_active_lora=lora.specialize_active_lora)
    r.vllm_config.compilation_config.cudagraph_specialize_lora = lora.cudagraph_specialize_lora
    return o.v1_dispatcher(r)


def compare(o: vo.Oracle, rnd: random.Random, tally: Counter[str], out: list[dict[str, Any]],
            seen: Counter[str]) -> bool:
    cfg, lora, dp_size = random_case(rnd)
    r = o.resolve(cfg)
    if r.error is not None or r.mode == "NONE":
        return False
    engine = engine_of(ServingConfig(
        max_num_seqs=cfg.max_num_seqs, num_speculative_tokens=cfg.num_speculative_tokens,
        max_num_batched_tokens=cfg.max_num_batched_tokens, cudagraph_mode=cfg.cudagraph_mode,
        cudagraph_capture_sizes=cfg.capture_sizes, model_runner=cfg.runner, speculative_method=cfg.method,
        vllm_version="0.33", lora=lora, data_parallel_size=dp_size))
    where = {"config": {k: v for k, v in vars(cfg).items() if v is not None}, "lora": vars(lora), "dp": dp_size}

    def check(area: str, vllm: Any, cgtune: Any, **more: Any) -> None:
        tally[area] += 1
        if vllm != cgtune:
            out.append({"area": area, **where, **more, "vllm": vllm, "cgtune": cgtune})

    d = engine.dispatcher(r.sizes)
    cases = list(engine.lora_cases())
    if cfg.runner == "v2":
        m, vllm_cases = v2_manager(o, r, lora)
        check("cases", vllm_cases, sorted(cases))
        graphs = [[x.cg_mode.name, x.num_tokens, x.num_active_loras] for mode in ("PIECEWISE", "FULL")
                  for x in m._capture_descs.get(o.CUDAGraphMode[mode], [])]
    else:
        dispatcher = v1_dispatcher(o, r, lora)
        graphs = [[mode.name, x.num_tokens, x.num_active_loras] for mode, descs in dispatcher.get_capture_descs()
                  for x in descs]
    check("graphs", graphs, [[m_, w, c] for m_, w in d.graphs() for c in cases])
    check("graph count", len(graphs), len(engine.graphs(r.sizes)))
    seen[f"runner {cfg.runner}"] += 1
    seen[f"{len(cases)} cases"] += 1
    for _ in range(DRAWS):
        draw = [random_batch(rnd, cfg, r.q, lora.max_loras) for _ in range(dp_size)]
        got = v2_dispatch(o, m, draw, r.q) if cfg.runner == "v2" else v1_dispatch(o, r, dispatcher, draw)
        steps = []
        for n, t, top, _ in draw:
            query_len = top if t == n * top else None
            utc = uniform_token_count(cfg.runner, r.q, query_len, query_len == r.q)
            steps.append((t, utc or 0))
        top_width = max(t for t, _ in steps)
        for rank, (vllm, (n, t, _, active)) in enumerate(zip(got, draw)):
            case = int(engine.lora_dispatch(np.array([active]))[0])
            mode, width = synced_dispatch(d, steps, rank)
            if case < 0:  # no graph holds the case: eager at its own width (V1 without the no-LoRA graphs)
                mode, width = "NONE", t
            # vLLM's descriptor keeps the effective case (V2, V1 on a graph) or the step's own count (V1 eager).
            vllm_case = vllm[2] if vllm[0] != "NONE" or cfg.runner == "v2" else None
            ours_case = (case if cfg.runner == "v2" or mode != "NONE" else None)
            check("dp dispatch" if dp_size > 1 else "dispatch", [vllm[0], vllm[1], vllm_case],
                  [mode, width, ours_case], draw=draw, rank=rank)
            seen[f"dispatched {vllm[0]}"] += 1
            if case < 0:
                seen["no graph for the no-LoRA case"] += 1
            elif case and vllm[0] != "NONE":
                seen["LoRA graph replayed"] += 1
            if dp_size > 1 and t < top_width:
                seen["narrower rank eager" if vllm[0] == "NONE" else "narrower rank padded to a graph"] += 1
    return True


def schedule_rule(o: vo.Oracle) -> list[list[Any]]:
    """0.33's `_maybe_disable_dynamic_sd_for_data_parallel` (config/vllm.py) on a schedule at DP sizes 1, 2, 4 (the
    schedule that survives) beside cgtune's, both runners. Stand-ins: the config and speculative config (the fields it
    reads)."""
    out = []
    schedule = ((1, 8, 4), (9, 64, 2))
    for dp_size in (1, 2, 4):
        spec = o._spec_class(method="ngram", num_speculative_tokens=4,
                             num_speculative_tokens_per_batch_size=[list(e) for e in schedule])
        vc = types.SimpleNamespace(speculative_config=spec,
                                   parallel_config=types.SimpleNamespace(data_parallel_size=dp_size))
        o.VllmConfig._maybe_disable_dynamic_sd_for_data_parallel(vc)
        ours = [engine_of(ServingConfig(max_num_seqs=64, num_speculative_tokens=4, speculative_method="ngram",
                                        speculative_schedule=schedule, vllm_version="0.33", model_runner=runner,
                                        data_parallel_size=dp_size)).dynamic_schedule is not None
                for runner in ("v1", "v2")]
        out.append([dp_size, spec.num_speculative_tokens_per_batch_size is not None, ours])
    return out


def main(argv: list[str] | None = None) -> int:
    opened = open_oracle(__doc__, argv, vo, seed=51, configs=300)
    if opened is None:
        return 0
    args, start, o = opened
    rnd = random.Random(args.seed)
    tally: Counter[str] = Counter()
    seen: Counter[str] = Counter()
    out: list[dict[str, Any]] = []
    done = 0
    with o.patched():
        while done < args.configs:
            done += compare(o, rnd, tally, out, seen)
        rule = schedule_rule(o)
    print(json.dumps({"status": "ok", "seed": args.seed, "configs": done, "checks": tally, "coverage": seen,
                      "schedule_rule": rule,
                      "disagreements": out[:20], "disagreement_count": len(out),
                      "seconds": round(time.perf_counter() - start, 1)}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
