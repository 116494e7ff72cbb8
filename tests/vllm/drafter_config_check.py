"""What vLLM's own config code makes of the draft model cgtune writes for each model-based method
(tuner/measure/vllm_engine/engine.py `draft_source`, `engine_args`): the target's and the drafter's config.json go
through vLLM's `ModelConfig` and `SpeculativeConfig` (the method, the draft architecture after `EAGLEConfig` renames
it, parallel drafting) and the registry resolves the model class vLLM would build. Run on CPU against whichever vLLM
is first on the path (0.33 in the main venv, 0.34 with its code on PYTHONPATH) in a process of its own; prints one
JSON object: {"version", "methods": {method: {...} or {"error"}}, "refused": {architecture: error}}.

    python tests/vllm/drafter_config_check.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tuner.measure.vllm_engine import engine  # noqa: E402
from tuner.workload.spec import parse_workload  # noqa: E402

TARGET = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
          "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 1024, "rms_norm_eps": 1e-5,
          "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu", "bos_token_id": 1,
          "eos_token_id": 2, "architectures": ["LlamaForCausalLM"], "model_type": "llama"}
METHODS = {"eagle": {"num_layers": 1}, "eagle3": {"num_layers": 1}, "dflash": {"num_layers": 2},
           "draft_model": {"num_layers": 1, "intermediate_size": 64}}


def _workload(tmp: Path, method: str) -> object:
    (tmp / "target.json").write_text(json.dumps(TARGET))
    return parse_workload({
        "name": f"tiny-{method}", "model": {"config": "target.json", "dtype": "float32"},
        "speculative": {"method": method, "drafter": METHODS[method]},
        "serving": {"max_num_seqs": 8, "num_speculative_tokens": 3, "max_num_batched_tokens": 64, "max_model_len": 256},
        "traffic": {"requests": {"kind": "uniform", "min": 1, "max": 8}, "mean_context_len": 32},
    }, base_dir=tmp)


def _speculative(target_dir: str, speculative: dict) -> object:
    from vllm.config import ModelConfig, ParallelConfig
    from vllm.config.speculative import SpeculativeConfig

    target = ModelConfig(model=target_dir, skip_tokenizer_init=True, dtype="float32", max_model_len=256)
    return SpeculativeConfig(**speculative, target_model_config=target, target_parallel_config=ParallelConfig())


def main() -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import vllm
    from vllm.model_executor.models.registry import ModelRegistry

    out: dict = {"version": vllm.__version__, "methods": {}, "refused": {}}
    with tempfile.TemporaryDirectory() as d:
        for method in METHODS:
            tmp = Path(d) / method
            tmp.mkdir()
            wl = _workload(tmp, method)
            target_dir, _ = engine.model_source(wl, tmp / "scratch")
            draft_dir = engine.draft_source(wl, tmp / "scratch")
            args = engine.engine_args(wl, target_dir, [1, 4, 8], device="cuda", compile=True, draft_model=draft_dir)
            try:
                sc = _speculative(target_dir, args["speculative_config"])
                draft = sc.draft_model_config
                cls, arch = ModelRegistry.resolve_model_cls(draft.architectures, model_config=draft)
                out["methods"][method] = {
                    "method": sc.method, "architectures": list(draft.architectures), "class": cls.__name__,
                    "resolved": arch, "num_hidden_layers": draft.hf_config.num_hidden_layers,
                    "hidden_size": draft.hf_config.hidden_size, "parallel_drafting": bool(sc.parallel_drafting),
                    "num_speculative_tokens": sc.num_speculative_tokens,
                    "speculative_config": args["speculative_config"] | {"model": "<draft>"}}
            except Exception as exc:  # vLLM refusing what cgtune wrote: the check reports it
                out["methods"][method] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
        # The name EAGLE checkpoints of another convention carry: vLLM's EAGLEConfig prefixes it, the registry has no
        # such class (why cgtune writes EagleLlamaForCausalLM).
        tmp = Path(d) / "refused"
        tmp.mkdir()
        wl = _workload(tmp, "eagle")
        target_dir, _ = engine.model_source(wl, tmp / "scratch")
        draft_dir = Path(engine.draft_source(wl, tmp / "scratch"))
        config = json.loads((draft_dir / "config.json").read_text())
        (draft_dir / "config.json").write_text(json.dumps({**config, "architectures": ["LlamaForCausalLMEagle"]}))
        try:
            sc = _speculative(target_dir, {"method": "eagle", "model": str(draft_dir), "num_speculative_tokens": 3})
            ModelRegistry.resolve_model_cls(sc.draft_model_config.architectures, model_config=sc.draft_model_config)
            out["refused"]["LlamaForCausalLMEagle"] = None
        except Exception as exc:
            words = " ".join(str(exc).split()).split(" Supported architectures")[0]  # not vLLM's whole list
            out["refused"]["LlamaForCausalLMEagle"] = f"{type(exc).__name__}: {words}"
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
