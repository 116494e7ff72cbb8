"""vLLM 0.34's own answers on multi-LoRA graphs and data parallelism, as one JSON object on stdout: for seeded random
configurations with LoRA (max_loras, specialize_active_lora, cudagraph_specialize_lora), the LoRA capture cases
(`get_lora_capture_cases`), the runner's `CudaGraphManager` built with them (its graphs in capture order, each with its
case), the real pool of its capture over a simulated pool, its dispatch of random batches with active adapters; for
data parallelism, what every rank of a random joint draw runs after `dispatch_cg_and_sync_dp` agreed (the all-reduce
is a stand-in that hands every rank every rank's column, as the sum of the ranks' one-column tensors is), and
`_maybe_disable_dynamic_sd_for_data_parallel` on schedules. Only vLLM runs here (tests/vllm034/vllm034_oracle.py's
Oracle); tests/vllm034/test_lora_034.py holds the answers to cgtune's rulebook in another process.

    PYTHONPATH="$CGTUNE_VLLM034_PATH" python tests/vllm034/lora_answers.py --seed 51 --configs 300

Prints `{"status": "ok", ...}` or `{"status": "unavailable", "reason"}`.
"""

from __future__ import annotations

import json
import random
import sys
import time
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parents[1]))  # tests/: the scripts' shared opening
import vllm034_oracle as vo  # noqa: E402
from oracle_script import open_oracle  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vllm"))
from dp_all_reduce import agree_v2  # noqa: E402

MODES = ("PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
BATCHES = 30
DRAWS = 12
MIB = 1 << 20


def random_case(rnd: random.Random) -> tuple[vo.Config, dict[str, Any], int]:
    """A configuration (explicit prefill and decode lists, or vLLM's defaults; q from 1 to 5 with ngram drafting, which
    captures no graphs of its own), its LoRA settings and a data-parallel size."""
    k = rnd.choice((0, 0, 0, 1, 2, 4))
    r = rnd.choice((1, 2, 4, 8, 16, 32, 64, 128))
    mnbt = max(r * (k + 1), rnd.choice((64, 256, 512, 2048)))
    knobs: dict[str, Any] = {}
    if rnd.random() < 0.7:
        # Prefill lists topping below the decode graphs at times: a decode rank beside a mixed one then finds no graph
        # for the agreed step.
        top = min(mnbt, rnd.choice((8, 16, 64, 600)))
        knobs["prefill_token_sizes"] = tuple(sorted(rnd.sample(range(1, top + 1), rnd.randint(1, min(10, top)))))
        knobs["decode_request_sizes"] = tuple(sorted(rnd.sample(range(1, r + 1), rnd.randint(1, min(8, r)))))
    cfg = vo.Config(max_num_seqs=r, max_num_batched_tokens=mnbt, num_speculative_tokens=k,
                    speculative_method="ngram" if k else None,
                    cudagraph_mode=rnd.choices(MODES, weights=(1, 1, 1, 3))[0], **knobs)
    lora = {"max_loras": rnd.choice((1, 2, 3, 4, 5, 7, 8, 16)), "specialize_active_lora": rnd.random() < 0.5,
            "cudagraph_specialize_lora": rnd.random() < 0.7}
    return cfg, lora, rnd.choice((1, 2, 2, 3, 4))


def lora_cases(o: vo.Oracle, r: vo.Resolved, lora: dict[str, Any]) -> list[int]:
    """`get_lora_capture_cases` (v1/worker/gpu/lora_utils.py) for vLLM's own LoRAConfig and the resolved compilation
    config with `cudagraph_specialize_lora` set."""
    from vllm.config.lora import LoRAConfig
    from vllm.v1.worker.gpu.lora_utils import get_lora_capture_cases

    c = r.vllm_config.compilation_config
    c.cudagraph_specialize_lora = lora["cudagraph_specialize_lora"]
    return list(get_lora_capture_cases(LoRAConfig(max_loras=lora["max_loras"], max_lora_rank=16,
                                                  specialize_active_lora=lora["specialize_active_lora"]), c))


def manager(o: vo.Oracle, r: vo.Resolved, cases: list[int], dp_size: int) -> Any:
    """The runner's `CudaGraphManager` (model_runner.py:801-811) with the LoRA cases; its captures charge the
    simulated pool. Stand-ins as `Oracle.manager`'s; the config's parallel section says the DP size."""
    base, pool = o.graphs.CudaGraphManager, o.pool

    class Manager(base):  # type: ignore[misc,valid-type]
        def capture(self, *args: Any, **kwargs: Any) -> None:
            def create(desc: Any, warmup: bool) -> Any:
                return lambda cg_mode: pool.forward("target", desc.num_tokens, cg_mode.name, desc.num_active_loras)
            base.capture(self, create)

    vc = r.vllm_config
    vc.parallel_config = types.SimpleNamespace(tensor_parallel_size=1, data_parallel_size=dp_size, use_ubatching=False,
                                               enable_fault_tolerance=False)
    return Manager(vc, None, o.CUDAGraphMode[r.cudagraph_mode],
                   decode_query_lens=vc.get_decode_cudagraph_query_lens(r.q), lora_capture_cases=cases)


def costs(owner: str, mode: str, width: int) -> tuple[int, int]:
    """A graph's (standalone, delta) bytes in the simulated pool: seeded per width (the same on cgtune's side)."""
    rnd = random.Random(f"{mode}/{width}")
    return rnd.randint(4, 400) * MIB, rnd.choice((MIB // 4, MIB, rnd.randint(1, 60) * MIB))


def random_batch(rnd: random.Random, r: vo.Resolved, cfg: vo.Config, max_loras: int) -> list[int | None]:
    """`[num_reqs, num_tokens, uniform token count or None, active adapters]`: a uniform decode batch at q, or a mixed
    batch (narrow, or past the widest graph at times), 0 to max_loras adapters active among its requests."""
    seqs, mnbt = cfg.max_num_seqs, cfg.max_num_batched_tokens
    if rnd.random() < 0.5:
        n = rnd.randint(1, seqs)
        batch = [n, n * r.q, r.q]
    else:
        t = rnd.choice((rnd.randint(1, mnbt), rnd.randint(1, min(mnbt, 700)), rnd.randint(1, min(mnbt, 24))))
        batch = [rnd.randint(1, min(t, seqs)), t, None]
    return batch + [rnd.randint(0, min(max_loras, batch[0]))]


def dispatch_dp(o: vo.Oracle, m: Any, draw: list[list[int | None]], q: int) -> list[list[Any]]:
    """What each rank of the draw runs: `dispatch_cg_and_sync_dp` (v1/worker/gpu/dp_utils.py) called per rank as
    `execute_model` calls it (model_runner.py:1891-1907; max_query_len None for a batch that is not decode-graph
    eligible), twice: first to read the column the rank contributes, then with every rank's column in the tensor.
    Stand-in: the DP group's `cpu_all_reduce_` (torch.distributed)."""
    import vllm.v1.worker.gpu.dp_utils as dp

    def call(rank: int) -> list[Any]:
        n, t, utc, active = draw[rank]
        d = dp.dispatch_cg_and_sync_dp(m, n, t, utc, len(draw), rank, max_query_len=utc, num_active_loras=active,
                                       parallel_config=m.vllm_config.parallel_config, uniform_decode=utc == q)[0]
        return [d.cg_mode.name, d.num_tokens, d.num_reqs, d.num_active_loras]

    return agree_v2(dp, len(draw), call)


def schedule_rule(o: vo.Oracle) -> list[list[Any]]:
    """`_maybe_disable_dynamic_sd_for_data_parallel` (config/vllm.py) on a schedule at DP sizes 1, 2 and 4: the schedule
    that survives. Stand-ins: the config and speculative config (the fields it reads)."""
    out = []
    for dp_size in (1, 2, 4):
        spec = o._spec_class(method="ngram", num_speculative_tokens=4,
                             num_speculative_tokens_per_batch_size=[[1, 8, 4], [9, 64, 2]])
        vc = types.SimpleNamespace(speculative_config=spec,
                                   parallel_config=types.SimpleNamespace(data_parallel_size=dp_size))
        o.VllmConfig._maybe_disable_dynamic_sd_for_data_parallel(vc)
        out.append([dp_size, spec.num_speculative_tokens_per_batch_size])
    return out


def answer(o: vo.Oracle, rnd: random.Random) -> dict[str, Any] | None:
    cfg, lora, dp_size = random_case(rnd)
    r = o.resolve(cfg)
    if r.error is not None:
        return None
    cases = lora_cases(o, r, lora)
    m = manager(o, r, cases, dp_size)
    graphs = [[d.cg_mode.name, d.num_tokens, d.uniform_token_count, d.num_reqs, d.num_active_loras]
              for mode in ("PIECEWISE", "FULL") for d in m._capture_descs.get(o.CUDAGraphMode[mode], [])]
    o.pool.reset(costs)
    m.capture()
    pool_bytes = o.pool.used
    batches = []
    for _ in range(BATCHES):
        n, t, utc, active = random_batch(rnd, r, cfg, lora["max_loras"])
        d = m.dispatch(n, t, utc, active)
        batches.append([n, t, utc, active, [d.cg_mode.name, d.num_tokens, d.num_reqs, d.num_active_loras]])
    draws = []
    if dp_size > 1:
        for _ in range(DRAWS):
            draw = [random_batch(rnd, r, cfg, lora["max_loras"]) for _ in range(dp_size)]
            draws.append([draw, dispatch_dp(o, m, draw, r.q)])
    return {"config": {"max_num_seqs": cfg.max_num_seqs, "max_num_batched_tokens": cfg.max_num_batched_tokens,
                       "num_speculative_tokens": cfg.num_speculative_tokens, "cudagraph_mode": cfg.cudagraph_mode,
                       "prefill_token_sizes": r.prefill_token_sizes, "decode_request_sizes": r.decode_request_sizes},
            "resolved_mode": r.cudagraph_mode, "lora": lora, "data_parallel_size": dp_size, "cases": cases,
            "graphs": graphs, "pool_bytes": pool_bytes, "batches": batches, "draws": draws}


def main(argv: list[str] | None = None) -> int:
    opened = open_oracle(__doc__, argv, vo, seed=51, configs=300, quiet_vllm_logs=True)
    if opened is None:
        return 0
    args, start, o = opened
    import vllm

    rnd = random.Random(args.seed)
    configs: list[dict[str, Any]] = []
    with o.patched():
        while len(configs) < args.configs:
            got = answer(o, rnd)
            if got is not None:
                configs.append(got)
        rule = schedule_rule(o)
    print(json.dumps({"status": "ok", "vllm_version": vllm.__version__, "vllm_file": vllm.__file__, "seed": args.seed,
                      "configs": configs, "schedule_rule": rule, "seconds": round(time.perf_counter() - start, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
