"""`vllm serve`'s own argument parsing, vLLM 0.33.0's code (or 0.34.0's: `"version"` in the request) run on CPU, in a
process of its own (vLLM's import sets process-wide options): the parser `vllm serve` builds (`FlexibleArgumentParser` + `make_arg_parser`, which reads a
`--config` YAML the way the CLI does), `AsyncEngineArgs.from_cli_args`, and `ModelConfig` for a checkpoint vLLM must
refuse. Nothing is stubbed: `VLLM_TARGET_DEVICE=cpu` gives vLLM its CPU platform (its DeviceConfig default needs a
device type); the refusal check runs with huggingface_hub offline, so no lookup leaves this machine.

Reads `{"parse": {name: argv after "vllm serve"}, "refuse": [checkpoint, ...], "refuse_method": [method, ...]}` on
stdin; prints one JSON line: `{"status": "ok", "parsed": {name: settings}, "refused": {checkpoint: {"vllm": error,
"repo_id": error}}, "refused_methods": {method: error}}`, or `{"status": "unavailable", "reason": ...}` where vLLM
0.33.0's modules do not import."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


class ServeParser:
    """`vllm serve`'s own argument parser (`FlexibleArgumentParser` + `make_arg_parser`), built once."""

    def __init__(self) -> None:
        import tempfile
        from pathlib import Path

        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.entrypoints.common.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        self.AsyncEngineArgs = AsyncEngineArgs
        self.parser = FlexibleArgumentParser(prog="vllm")
        make_arg_parser(self.parser.add_subparsers(dest="subparser").add_parser("serve"))
        self.path = Path(tempfile.mkdtemp(prefix="cgtune-files-")) / "vllm-serve.yaml"

    def engine_args(self, argv: list[str]) -> Any:
        """What `vllm serve ARGV` hands its engine (`AsyncEngineArgs.from_cli_args`)."""
        args = self.parser.parse_args(["serve", *argv])
        if args.model_tag is not None:  # vllm/entrypoints/cli/serve.py:56-57: a positional model wins over the config's
            args.model = args.model_tag
        return self.AsyncEngineArgs.from_cli_args(args)

    def of_yaml(self, yaml_text: str) -> Any:
        """What `vllm serve --config FILE` hands its engine, FILE holding `yaml_text`."""
        self.path.write_text(yaml_text)
        return self.engine_args(["--config", str(self.path)])


def parse(argv: list[str]) -> dict[str, Any]:
    """What `vllm serve ARGV` hands its engine: the parsed settings cgtune tuned for."""
    engine = ServeParser().engine_args(argv)
    cc = engine.compilation_config
    lora = None
    if engine.enable_lora:  # the LoRAConfig create_engine_config builds from them, validated by vLLM itself
        from vllm.config.lora import LoRAConfig

        c = LoRAConfig(max_loras=engine.max_loras, max_lora_rank=engine.max_lora_rank,
                       specialize_active_lora=engine.specialize_active_lora)
        lora = {"max_loras": c.max_loras, "max_lora_rank": c.max_lora_rank,
                "specialize_active_lora": c.specialize_active_lora,
                "cudagraph_specialize_lora": cc.cudagraph_specialize_lora}
    return {
        "data_parallel_size": engine.data_parallel_size, "lora": lora,
        "model": engine.model, "dtype": engine.dtype, "tensor_parallel_size": engine.tensor_parallel_size,
        "max_model_len": engine.max_model_len, "max_num_seqs": engine.max_num_seqs,
        "max_num_batched_tokens": engine.max_num_batched_tokens,
        "gpu_memory_utilization": engine.gpu_memory_utilization, "enforce_eager": engine.enforce_eager,
        "kv_cache_memory_bytes": engine.kv_cache_memory_bytes,
        "speculative_config": engine.speculative_config,
        "cudagraph_mode": cc.cudagraph_mode.name if cc.cudagraph_mode is not None else None,
        "cudagraph_capture_sizes": cc.cudagraph_capture_sizes,
        "max_cudagraph_capture_size": cc.max_cudagraph_capture_size,
        # vLLM 0.34's split lists and their caps (absent in 0.33: None)
        **{name: getattr(cc, name, None) for name in (
            "prefill_cudagraph_capture_token_sizes", "max_prefill_cudagraph_capture_tokens",
            "decode_cudagraph_capture_request_sizes", "max_decode_cudagraph_capture_requests")},
    }


def refusal(checkpoint: str) -> dict[str, str | None]:
    """How vLLM meets a checkpoint it cannot load: `ModelConfig`'s error (the draft model's `SpeculativeConfig` builds
    the same `ModelConfig`), and Hugging Face's repo-id check that vLLM's lookups run (None where it passes: such a
    value is refused, offline, only for being absent)."""
    import huggingface_hub.constants
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    from vllm.config import ModelConfig

    huggingface_hub.constants.HF_HUB_OFFLINE = True  # no lookup leaves this machine
    answer: dict[str, str | None] = {"vllm": None, "repo_id": None}
    try:
        ModelConfig(model=checkpoint)
    except Exception as exc:  # noqa: BLE001 - whatever vLLM raises is the answer
        answer["vllm"] = " ".join(line.strip() for line in str(exc).splitlines()[:2])
    try:
        validate_repo_id(checkpoint)
    except HFValidationError as exc:
        answer["repo_id"] = str(exc)
    return answer


def method_refusal(method: str) -> str | None:
    """vLLM's error for a speculative method it does not have (`SpeculativeConfig.method` is a Literal), None where it
    takes it."""
    from vllm.config.speculative import SpeculativeConfig

    try:
        SpeculativeConfig(method=method, num_speculative_tokens=1)
    except Exception as exc:  # noqa: BLE001 - whatever vLLM raises is the answer
        return " ".join(line.strip() for line in str(exc).splitlines()[:3])
    return None


def main() -> None:
    request = json.loads(sys.stdin.read())
    version = request.get("version", "0.33.0")
    try:
        import vllm

        if vllm.__version__ != version:
            raise ImportError(f"vllm {vllm.__version__} is installed, not {version}")
        parsed = {name: parse(argv) for name, argv in request.get("parse", {}).items()}
        refused = {c: refusal(c) for c in request.get("refuse", [])}
        refused_methods = {m: method_refusal(m) for m in request.get("refuse_method", [])}
    except ImportError as exc:
        print(json.dumps({"status": "unavailable", "reason": f"vLLM {version}'s modules do not import here: {exc!r}"}))
        return
    print(json.dumps({"status": "ok", "parsed": parsed, "refused": refused, "refused_methods": refused_methods},
                     default=str))


if __name__ == "__main__":
    main()
