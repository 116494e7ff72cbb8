"""The opening every cross-check script's main() shares (tests/vllm/oracle_compare.py, tests/vllm/lora_compare.py,
tests/vllm034/answers.py, tests/vllm034/lora_answers.py): its seed and configuration count, its clock, and vLLM's own
code loaded through the script's oracle module, or one JSON line saying why that code is not here (the test reading
the line skips, or fails where CI requires vLLM)."""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

__all__ = ["open_oracle"]


def open_oracle(doc: str, argv: Sequence[str] | None, oracle: ModuleType, *, seed: int, configs: int,
                more: Callable[[argparse.ArgumentParser], None] | None = None,
                quiet_vllm_logs: bool = False) -> tuple[argparse.Namespace, float, Any] | None:
    """(arguments, start time, the loaded oracle), or None once the unavailable line is printed. `more` adds the
    script's own arguments; `quiet_vllm_logs`: vLLM's log handler would write to stdout, where the answers go."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--seed", type=int, default=seed)
    p.add_argument("--configs", type=int, default=configs)
    if more is not None:
        more(p)
    args = p.parse_args(argv)
    start = time.perf_counter()
    if quiet_vllm_logs:
        os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    try:
        return args, start, oracle.load()
    except oracle.Unavailable as exc:
        print(json.dumps({"status": "unavailable", "reason": str(exc)}))
        return None
