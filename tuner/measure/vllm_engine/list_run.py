"""One list's run through vLLM's engine, in a process of its own: the engine built with the list's compilation
config, what it holds read from it (`replay.engine_figures`, its KV blocks), the trace replayed through its runner
(`replay.replay_steps`), optionally a load served to it (`serve.serve_load`), the engine shut down, the result
written as JSON. A process per list starts every list on a clean device, as a deployment starts (an engine built
after another in one process finds the memory the first left behind, and vLLM's CPU build cannot build a second
engine in a process that imported llvmlite in between).

    python -m tuner.measure.vllm_engine.list_run REQUEST.json RESULT.json

REQUEST: {"engine_args": LLM(**args), "environment": {...}, "steps": [[num_tokens, uniform], ...], "options":
{"context_len", "chunk_steps"}, "load": {...} or null}. RESULT: {"started": bool, "oom": text or null, "error": text
or null, "startup_s", "figures": engine_figures per rank, "kv_blocks", "block_size", "replay": per rank, "load":
serve_load's result or null}."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["main", "run_list"]


def run_list(request: dict[str, Any]) -> dict[str, Any]:
    """The run REQUEST asks for (module docstring); the engine is shut down whatever happens."""
    from tuner.measure.profile import error_text
    from tuner.measure.vllm_engine import engine, replay
    from tuner.measure.vllm_engine.sweep import shutdown_engine

    os.environ.update(request.get("environment") or {})
    out: dict[str, Any] = {"started": False, "oom": None, "error": None, "figures": None, "replay": None,
                           "load": None}
    lines = engine.StartupLines()
    t0 = time.perf_counter()
    from vllm import LLM  # after the environment: vLLM reads it at import

    with lines.attached():
        try:
            llm = LLM(**request["engine_args"])
        except Exception as exc:  # noqa: BLE001 - the list's start failing is its result
            text = error_text(exc)
            out["oom" if "out of memory" in text.lower() else "error"] = text[:300]
            out["startup_s"] = round(time.perf_counter() - t0, 3)
            return out
    out.update(started=True, startup_s=round(time.perf_counter() - t0, 3))
    try:
        cache = llm.llm_engine.vllm_config.cache_config
        out.update(kv_blocks=int(cache.num_gpu_blocks or 0), block_size=int(cache.block_size),
                   figures=llm.collective_rpc(replay.engine_figures))
        if request.get("steps"):
            out["replay"] = llm.collective_rpc(replay.replay_steps, args=(request["steps"], request["options"]))
        if request.get("load"):
            from tuner.measure.vllm_engine.serve import serve_load

            out["load"] = serve_load(llm, request["load"])
    except Exception as exc:  # noqa: BLE001 - what was measured before stays
        out["error"] = error_text(exc)[:300]
    finally:
        shutdown_engine(llm, lines.lines)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m tuner.measure.vllm_engine.list_run REQUEST.json RESULT.json", file=sys.stderr)
        return 2
    request = json.loads(Path(argv[0]).read_text())
    result = run_list(request)
    Path(argv[1]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
