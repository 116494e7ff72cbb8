"""A bounded load served to vLLM's engine in this process: requests added to its `LLMEngine` at their arrival times
(exact prompt token ids, exact output lengths, EOS ignored), the engine stepped until all finish or the time limit,
every request's arrival, first-token and output-token times read by the engine loop's clock. Before the load, two
calibrations measure the engine's own work around the forward (one request alone; `together` requests at once), which
a profile's forward does not include. Standard library and vLLM only (it runs inside a list's process)."""

from __future__ import annotations

import random
import time
from typing import Any

__all__ = ["FIRST_TOKEN_ID", "serve_load"]

FIRST_TOKEN_ID = 3
"""Prompt ids are drawn from [FIRST_TOKEN_ID, vocab_size) (`tuner.load.drive`'s rule: below it, pad/bos/eos)."""


def _params(output_tokens: int) -> Any:
    from vllm import SamplingParams

    return SamplingParams(max_tokens=output_tokens, min_tokens=output_tokens, ignore_eos=True, temperature=0.0,
                          detokenize=False)


def _run(llm: Any, arrivals_s: list[float], prompts: list[list[int]], outputs: list[int], limit_s: float,
         tag: str) -> dict[str, Any]:
    """Serve the requests (module docstring); per request: arrival (planned), added (actual), token times; and each
    engine step's wall time and outputs."""
    engine = llm.llm_engine
    n = len(arrivals_s)
    added = [float("nan")] * n
    token_times: list[list[float]] = [[] for _ in range(n)]
    seen = [0] * n
    steps_ms: list[float] = []
    t0 = time.perf_counter()
    i = 0
    while True:
        now = time.perf_counter() - t0
        if now > limit_s:
            break
        while i < n and arrivals_s[i] <= now:
            engine.add_request(f"{tag}{i}", {"prompt_token_ids": prompts[i]}, _params(outputs[i]))
            added[i] = time.perf_counter() - t0
            i += 1
        if not engine.has_unfinished_requests():
            if i >= n:
                break
            time.sleep(max(0.0, min(arrivals_s[i] - (time.perf_counter() - t0), limit_s)))
            continue
        s0 = time.perf_counter()
        outs = engine.step()
        t = time.perf_counter()
        steps_ms.append((t - s0) * 1e3)
        for o in outs:
            if not o.request_id.startswith(tag):
                continue
            k = int(o.request_id[len(tag):])
            got = len(o.outputs[0].token_ids) if o.outputs else 0
            token_times[k] += [t - t0] * (got - seen[k])  # tokens a step emits together share its time
            seen[k] = got
    cut = engine.has_unfinished_requests()
    if cut:
        engine.abort_request([f"{tag}{k}" for k in range(i) if seen[k] < outputs[k]])
        while engine.has_unfinished_requests():
            engine.step()
    return {"arrival_s": arrivals_s[:n], "added_s": added, "token_s": token_times, "output_tokens": outputs,
            "prompt_tokens": [len(p) for p in prompts], "steps_ms": steps_ms, "cut_by_limit": bool(cut),
            "wall_s": time.perf_counter() - t0}


def serve_load(llm: Any, request: dict[str, Any]) -> dict[str, Any]:
    """`request`: {"arrival_s", "prompt_tokens", "output_tokens" (per request), "vocab_size", "seed", "limit_s",
    "calibration": {"output_tokens", "prompt_tokens", "together"}}. Returns {"calibration": {"alone": run,
    "together": run}, "load": run} (`_run`'s records)."""
    rng = random.Random(request["seed"])
    vocab = int(request["vocab_size"])

    def ids(k: int) -> list[int]:
        return [rng.randrange(FIRST_TOKEN_ID, vocab) for _ in range(int(k))]

    cal = request["calibration"]
    limit = float(request["limit_s"])
    runs: dict[str, Any] = {}
    for name, count in (("alone", 1), ("together", int(cal["together"]))):
        runs[name] = _run(llm, [0.0] * count, [ids(cal["prompt_tokens"]) for _ in range(count)],
                          [int(cal["output_tokens"])] * count, limit, f"cal-{name}-")
    load = _run(llm, [float(t) for t in request["arrival_s"]], [ids(k) for k in request["prompt_tokens"]],
                [int(k) for k in request["output_tokens"]], limit, "load-")
    return {"calibration": runs, "load": load}
