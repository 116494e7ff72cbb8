"""`sglang serve`'s own argument parsing, SGLang 0.5.23's code run on CPU, in a process of its own: the parser
`ServerArgs.add_cli_args` builds and `ServerArgs.from_cli_args` (the record `sglang serve` launches from). The only
stand-in is SGLang's own Triton stub (`sglang/_platform_stubs.py`, which SGLang installs itself on Apple silicon):
`sglang.srt.utils` imports triton, a GPU compiler that neither parses nor resolves an argument. It is loaded from its
file, since importing the package first would import triton.

Reads `{"parse": {name: argv after "sglang serve"}}` on stdin; prints one JSON line: `{"status": "ok", "parsed":
{name: settings}}`, or `{"status": "unavailable", "reason": ...}` where SGLang 0.5.23's modules do not import."""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
from typing import Any

FIELDS = ("model_path", "max_running_requests", "context_length", "chunked_prefill_size", "tp_size", "dtype",
          "mem_fraction_static", "speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps",
          "speculative_eagle_topk", "speculative_num_draft_tokens", "cuda_graph_config", "cuda_graph_bs_decode")


def install_triton_stub() -> None:
    """SGLang's `install_platform_stubs`, which installs its Triton stub only on an arm64 Mac with MPS: run with
    those three answers given, then restored. (It also fills missing torch.mps attributes: unused here.)"""
    import torch

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("sglang is not installed")
    path = f"{next(iter(spec.submodule_search_locations))}/_platform_stubs.py"
    stub_spec = importlib.util.spec_from_file_location("_sglang_platform_stubs", path)
    module = importlib.util.module_from_spec(stub_spec)
    sys.modules[stub_spec.name] = module  # its dataclasses look their module up there
    stub_spec.loader.exec_module(module)
    saved = sys.platform, platform.machine, torch.backends.mps.is_available
    sys.platform, platform.machine, torch.backends.mps.is_available = "darwin", lambda: "arm64", lambda: True
    try:
        module.install_platform_stubs()
    finally:
        sys.platform, platform.machine, torch.backends.mps.is_available = saved


def parse(argv: list[str]) -> dict[str, Any]:
    """What `sglang serve ARGV` hands its launcher: the parsed settings cgtune tuned for."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    record = ServerArgs.from_cli_args(parser.parse_args(argv))
    return {name: getattr(record, name) for name in FIELDS}


def main() -> None:
    request = json.loads(sys.stdin.read())
    try:
        from importlib.metadata import version

        if version("sglang") != "0.5.23":
            raise ImportError(f"sglang {version('sglang')} is installed, not 0.5.23")
        install_triton_stub()
        parsed = {name: parse(argv) for name, argv in request.get("parse", {}).items()}
    except ImportError as exc:
        print(json.dumps({"status": "unavailable", "reason": f"SGLang 0.5.23's modules do not import here: {exc!r}"}))
        return
    print(json.dumps({"status": "ok", "parsed": parsed}, default=str))


if __name__ == "__main__":
    main()
