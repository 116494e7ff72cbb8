"""vLLM's own model classes as the oracle for cgtune's weight and KV sizing (`ModelShape.weight_bytes`,
`kv_bytes_per_token`, the MTP drafter's weights): each case's config.json is read by vLLM's ModelConfig and its model
class (and, for `mtp`, DeepSeek's MTP module) is built on the meta device as one tensor-parallel rank builds it; the
bytes of the parameters it allocates are summed, and each attention layer's own KV-cache spec gives the KV bytes a
token costs.

Run as a script in a process of its own (vLLM's import sets process-wide state): `python model_weights_oracle.py`
reads a JSON list of cases {config, tp, dtype, mtp} on stdin and prints one JSON list of answers {version, weights_bytes,
kv_bytes_per_token, mtp_weights_bytes, mtp_kv_bytes_per_token}. For vLLM 0.34 put its --target directory first on PYTHONPATH.

What is stubbed stands in only for the hardware and the process group, never for a number: the platform is vLLM's CPU
platform (this host has no GPU); 0.34's refusal of an x86 CPU host without triton-cpu is passed (it
guards kernels, none of which run); the tensor-parallel group is a stand-in of `tp` ranks seen from rank 0 (the layers
read only its size and rank); the FP8 GEMM kernel choice (made while creating a layer's weights, it picks how to
multiply, not what to allocate) returns a stand-in; the model registry inspects a class in this process, not a child (its reason, CUDA, is
absent); `compressed_tensors`, a package vLLM's quantization registry
imports but no FP8 checkpoint uses, is an empty stand-in when not installed.

Counted as vLLM holds the model once loaded: every parameter once (a tied LM head is the embedding); the attention
layers' FP8 KV-scale placeholders not counted (vLLM deletes them after loading, quantization/kv_cache.py); MLA's
W_UK_T/W_UV through vLLM's own `split_kv_b_proj`, which counts only when it is a new tensor (a dequantized kv_b_proj),
not views of the parameter."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

_KV_SCALES = ("k_scale", "v_scale", "q_scale", "prob_scale")


class _AnyAttr(type):
    """A stand-in class whose every attribute is another stand-in class (enum members used as dict keys included)."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _AnyAttr(name, (), {})


class _StandInModule(types.ModuleType):
    __path__: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _AnyAttr(name, (), {})


class _StandInFinder:
    """Serves `compressed_tensors` (and its submodules) as stand-ins when the package is not installed."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name == "compressed_tensors" or name.startswith("compressed_tensors."):
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        return _StandInModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class _Group:
    """A tensor-parallel (or other) process group of `size` ranks, seen from rank 0."""

    def __init__(self, size: int) -> None:
        self.world_size = size
        self.rank_in_group = self.rank = self.local_rank = 0
        self.ranks = list(range(size))
        self.device_group = self.cpu_group = types.SimpleNamespace(size=lambda: size, rank=lambda: 0)
        self.is_first_rank = self.is_last_rank = True


class _SpeculativeStandIn(types.SimpleNamespace):
    """The speculative config the MTP module is built under: its draft model config is the target's (an MTP module
    reads its layers' widths there); every other setting absent (None), as no adaptive or other feature is on."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return None


def _install_stand_ins() -> None:
    if importlib.util.find_spec("compressed_tensors") is None:
        sys.meta_path.insert(0, _StandInFinder())
    from vllm.model_executor.layers.quantization import fp8
    from vllm.platforms import current_platform

    fp8.init_fp8_linear_kernel = lambda **kwargs: types.SimpleNamespace()
    # The registry inspects a model class in a child process so as not to initialise CUDA; there is none here, and a
    # child process per architecture costs ~15 s on this host.
    from vllm.model_executor.models import registry

    registry._run_in_subprocess = lambda fn: fn()
    check = type(current_platform).check_and_update_config

    def check_without_triton(vllm_config: Any) -> None:
        # 0.34's CPU platform refuses an x86 host without triton-cpu (it runs kernels; building a model on meta
        # runs none): the check is passed as on a host that has it.
        import vllm.triton_utils as triton_utils

        had = triton_utils.HAS_TRITON
        triton_utils.HAS_TRITON = True
        try:
            check(vllm_config)
        finally:
            triton_utils.HAS_TRITON = had

    type(current_platform).check_and_update_config = staticmethod(check_without_triton)


def _set_groups(tp: int) -> None:
    from vllm.distributed import parallel_state as ps

    for name in dir(ps):
        if name.startswith("_") and name.isupper() and name.strip("_") and \
                (getattr(ps, name) is None or isinstance(getattr(ps, name), _Group)):
            size = tp if name in ("_TP", "_WORLD") else 1
            setattr(ps, name, _Group(size))


def _parameter_bytes(model: Any) -> int:
    """Every parameter once; the attention layers' KV-scale placeholders left out."""
    seen: set[int] = set()
    total = 0
    for module in model.modules():
        attention = hasattr(module, "get_kv_cache_spec")
        for name, p in module.named_parameters(recurse=False):
            if id(p) in seen or (attention and name in _KV_SCALES):
                continue
            seen.add(id(p))
            total += p.numel() * p.element_size()
    return total


def _absorbed_bytes(model: Any, dtype: Any) -> int:
    """MLA's W_UK/W_UV as vLLM's `split_kv_b_proj` makes them: new memory only when it dequantized kv_b_proj."""
    try:
        from vllm.model_executor.layers.attention.mla_attention import split_kv_b_proj
    except ImportError:
        return 0
    total = 0
    for module in model.modules():
        if type(module).__name__ != "MLAAttention":
            continue
        w_uk, _ = split_kv_b_proj(module.kv_b_proj, dtype, module.kv_lora_rank, module.num_heads,
                                  module.qk_nope_head_dim, module.v_head_dim)
        root = w_uk._base if w_uk._base is not None else w_uk  # views keep the tensor they view as their _base
        if root is not module.kv_b_proj.weight:
            total += root.numel() * root.element_size()
    return total


def _kv_bytes_per_token(model: Any, vllm_config: Any) -> int:
    total = 0
    for module in model.modules():
        if hasattr(module, "get_kv_cache_spec") and hasattr(module, "kv_cache_dtype"):
            spec = module.get_kv_cache_spec(vllm_config)
            if spec is not None:
                total += spec.page_size_bytes // spec.block_size
    return total


def answer(case: dict[str, Any], workdir: Path) -> dict[str, Any]:
    import torch

    import vllm
    from vllm.config import DeviceConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.model_loader.utils import get_model_architecture

    model_dir = workdir / f"m{case['index']}"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(case["config"]))
    dtype = case["dtype"]
    model_config = ModelConfig(model=str(model_dir), dtype=dtype, skip_tokenizer_init=True, max_model_len=256)
    vllm_config = VllmConfig(model_config=model_config, device_config=DeviceConfig(device="cpu"))
    _set_groups(case["tp"])
    torch_dtype = getattr(torch, dtype)
    out: dict[str, Any] = {"version": vllm.__version__}
    with set_current_vllm_config(vllm_config), torch.device("meta"):
        torch.set_default_dtype(torch_dtype)
        cls, _ = get_model_architecture(model_config)
        model = cls(vllm_config=vllm_config, prefix="")
        out["weights_bytes"] = _parameter_bytes(model) + _absorbed_bytes(model, torch_dtype)
        out["kv_bytes_per_token"] = _kv_bytes_per_token(model, vllm_config)
        if case.get("mtp"):
            from vllm.model_executor.models.deepseek_mtp import DeepSeekMTP

            draft = types.SimpleNamespace(hf_config=model_config.hf_config)
            object.__setattr__(vllm_config, "speculative_config", _SpeculativeStandIn(draft_model_config=draft))
            mtp = DeepSeekMTP(vllm_config=vllm_config, prefix="model")
            # What the proposer takes from the target (vllm-drafter-facts §4: MTP always shares the embedding and
            # the LM head, shared_head.head included) is not the drafter's own.
            shared = sum(p.numel() * p.element_size() for n, p in mtp.named_parameters()
                         if n.endswith("embed_tokens.weight") or n.endswith("shared_head.head.weight"))
            out["mtp_weights_bytes"] = _parameter_bytes(mtp) + _absorbed_bytes(mtp, torch_dtype) - shared
            out["mtp_kv_bytes_per_token"] = _kv_bytes_per_token(mtp, vllm_config)
    return out


def main() -> int:
    cases = json.loads(sys.stdin.read())
    _install_stand_ins()
    with tempfile.TemporaryDirectory() as tmp:
        answers = [answer({**case, "index": i}, Path(tmp)) for i, case in enumerate(cases)]
    print(json.dumps(answers))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
