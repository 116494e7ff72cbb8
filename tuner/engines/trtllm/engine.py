"""TensorRT-LLM (PyTorch backend) behind the Engine interface: its serving settings in its own words, its default
list, engine filter, dispatch, KV rule and extra_llm_api_options file, from this rulebook, in requests (a graph holds
bs x (1 + max_draft_len) tokens)."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tuner.engines.engine import Deployment, Speculation, placeholder
from tuner.engines.request_engine import RequestEngine
from tuner.engines.trtllm.capture import filter_cuda_graph_batch_sizes
from tuner.engines.trtllm.defaults import DEFAULT_FREE_GPU_MEMORY_FRACTION, default_batch_sizes
from tuner.engines.trtllm.dispatch import Dispatcher
from tuner.engines.trtllm.emit import EXTRA_OPTIONS_FILE, EmitError, render_files
from tuner.engines.trtllm.memory import TrtllmKvRule
from tuner.fields import FieldReader

if TYPE_CHECKING:
    from pathlib import Path

    from tuner.engines.vllm.emit import Provenance

__all__ = ["NEEDS_SPECULATIVE_MODEL", "TrtllmEngine", "TrtllmSettings"]

NEEDS_SPECULATIVE_MODEL = ("Eagle", "Eagle3", "Draft_Target")
"""Decoding types whose config refuses to load without `speculative_model` (tensorrt_llm/llmapi/llm_args.py:
`EagleDecodingConfig.validate_speculative_model`, "Draft model must be provided for EAGLE";
`DraftTargetDecodingConfig.validate_draft_target_config`, "speculative_model must be specified for DraftTarget")."""


@dataclass(frozen=True)
class TrtllmSettings:
    """TensorRT-LLM's serving settings that have no vLLM counterpart (the shared ones live in ServingConfig under
    vLLM's names)."""

    decoding_type: str | None = None
    """speculative_config.decoding_type, the tag of llm_args.py's union (Eagle, Eagle3, MTP, NGram, Draft_Target); None
    without speculation."""
    enable_padding: bool = False
    """cuda_graph_config.enable_padding (its default false: only exactly captured sizes replay)."""
    free_gpu_memory_fraction: float = DEFAULT_FREE_GPU_MEMORY_FRACTION
    """kv_cache_config.free_gpu_memory_fraction."""


class TrtllmEngine(RequestEngine):
    """TensorRT-LLM: generation graphs by batch size, captured BEFORE the KV cache is sized."""

    name = "trtllm"
    label = "TensorRT-LLM"
    files = (EXTRA_OPTIONS_FILE,)
    aliases = {"max_batch_size": "max_num_seqs", "max_num_tokens": "max_num_batched_tokens",
               "max_seq_len": "max_model_len", "max_draft_len": "num_speculative_tokens"}
    speculative_names = {"eagle": "Eagle", "eagle3": "Eagle3", "mtp": "MTP", "ngram": "NGram",
                         "draft_model": "Draft_Target"}
    speculative_what = "TensorRT-LLM decoding_type"

    @property
    def settings(self) -> TrtllmSettings:
        return self.serving.engine_settings

    @classmethod
    def parse_settings(cls, r: FieldReader, num_speculative_tokens: int,
                       speculative_method: str | None) -> tuple[Any, int, int]:
        native = cls.native_method(r, num_speculative_tokens, speculative_method)
        settings = TrtllmSettings(
            decoding_type=native, enable_padding=r.bool("enable_padding", False),
            free_gpu_memory_fraction=r.float("free_gpu_memory_fraction", 0.9, minimum=0.0, maximum=1.0,
                                             exclusive_minimum=True))
        return settings, 1 + num_speculative_tokens, num_speculative_tokens

    @property
    def speculation(self) -> Speculation:
        return Speculation(self.settings.decoding_type, self.decode_query_len)

    @property
    def exact_dispatch(self) -> bool:
        return not self.settings.enable_padding

    def default_requests(self, gpu_memory_mib: float | None) -> list[int]:
        """TensorRT-LLM's generated list (max 128 whatever max_batch_size says)."""
        return default_batch_sizes(None, enable_padding=self.settings.enable_padding)

    def captured_requests(self, batch_sizes: Sequence[int]) -> list[int]:
        """The engine filter: sizes above min(max_batch_size, max_num_tokens // tokens per request) dropped, the cap
        appended with padding."""
        s = self.serving
        return filter_cuda_graph_batch_sizes(sorted(set(batch_sizes)), s.max_num_seqs, s.max_num_batched_tokens,
                                             self.decode_query_len, self.settings.enable_padding)

    def rule(self, batch_sizes: Sequence[int]) -> Dispatcher:
        return Dispatcher(batch_sizes, draft_len=self.decode_query_len - 1,
                          enable_padding=self.settings.enable_padding, max_batch_size=self.serving.max_num_seqs)

    def widest_requests(self) -> list[int]:
        return default_batch_sizes(self.serving.max_num_seqs, enable_padding=self.settings.enable_padding)

    def kv_rule(self, *, total_memory_bytes: int, non_kv_cache_bytes: int, weights_bytes: Callable[[], int],
                required_kv_bytes: int, tensor_parallel_size: int, notes: list[str],
                pre_load_free_bytes: int | None = None,
                activation_peak_bytes: int | None = None, kv: Any = None) -> TrtllmKvRule:
        return TrtllmKvRule(total_memory_bytes, non_kv_cache_bytes, required_kv_bytes,
                            self.settings.free_gpu_memory_fraction)

    def render_request_files(self, batch_sizes: Sequence[int], deployment: Deployment,
                             provenance: Provenance | None) -> dict[str, str]:
        """The extra_llm_api_options YAML with padding as the workload says, the context length and tensor
        parallelism it was tuned for, and the speculative config with its draft checkpoint."""
        s, e = self.serving, self.settings
        draft = self.decode_query_len - 1
        speculative, notes = None, []
        if draft > 0:
            if e.decoding_type is None:
                raise EmitError(f"speculative_config.decoding_type: None with max_draft_len={draft} (name "
                                f"speculative.method)")
            speculative = {"decoding_type": e.decoding_type, "max_draft_len": draft}
            model = deployment.draft_model(e.decoding_type, needed=e.decoding_type in NEEDS_SPECULATIVE_MODEL,
                                           key="speculative_config.speculative_model",
                                           why=f"TensorRT-LLM refuses {e.decoding_type} without one, and this value "
                                               f"as it is", notes=notes)
            if model is not None:
                speculative["speculative_model"] = model
        return render_files(batch_sizes, max_batch_size=s.max_num_seqs, max_num_tokens=s.max_num_batched_tokens,
                            max_seq_len=s.max_model_len, tensor_parallel_size=deployment.tensor_parallel_size,
                            enable_padding=e.enable_padding, free_gpu_memory_fraction=e.free_gpu_memory_fraction,
                            speculative_config=speculative, notes=notes, provenance=provenance)

    # ------------------------------------------------------------------ words
    def engine_line(self) -> str:
        padding = self.settings.enable_padding
        return (f"TensorRT-LLM (PyTorch backend): batch sizes in requests, each graph holding bs x "
                f"{self.decode_query_len} tokens, enable_padding {str(padding).lower()}"
                + ("" if padding else " (only exactly captured sizes replay)")
                + "; steps with context requests run without a graph")

    def memory_rule_words(self, budget: TrtllmKvRule, default_top: int, tuned_top: int,
                          mem: Callable[[float], str]) -> tuple[str, str]:
        b, f = budget, budget.free_gpu_memory_fraction
        return (f"- KV cache, as TensorRT-LLM sizes it: its graphs are captured BEFORE the KV cache is sized (an "
                f"estimation run), so KV = free_gpu_memory_fraction {f} x (total {mem(b.total_memory_bytes)} - peak "
                f"without graphs {mem(b.non_kv_cache_bytes)} - real pool): each graph costs {f} x its memory in KV; "
                f"required KV {mem(b.required_kv_bytes)}, so the real pool may be at most "
                f"{mem(max(0, b.real_budget_bytes()))}"), "total - peak without graphs - real pool"

    def summary_fields(self, budget: TrtllmKvRule, default_top: int, tuned_top: int) -> dict[str, Any]:
        e = self.settings
        return {"enable_padding": e.enable_padding, "free_gpu_memory_fraction": e.free_gpu_memory_fraction,
                "decoding_type": e.decoding_type, "real_pool_budget_bytes": budget.real_budget_bytes()}

    def defaults_rows(self, tensor_parallel_size: int) -> tuple[list[tuple[str, str]], dict[str, Any], int, str]:
        e, s, q = self.settings, self.serving, self.decode_query_len
        cap = min(s.max_num_seqs, s.max_num_batched_tokens // q)
        rows = [("engine", f"{self.label} (PyTorch backend): batch sizes counted in requests, each graph holding bs "
                           f"x {q} token{'s' if q > 1 else ''} (1 + max_draft_len)"),
                ("cuda_graph_config", f"unset: TensorRT-LLM's default list, max 128 whatever max_batch_size says; "
                                      f"enable_padding {str(e.enable_padding).lower()}"
                                      + ("" if e.enable_padding else " (its default: only exactly captured sizes "
                                                                     "replay)")),
                ("request cap", f"{cap} = min(max_batch_size {s.max_num_seqs}, max_num_tokens "
                                f"{s.max_num_batched_tokens} // {q})")]
        return rows, {"enable_padding": e.enable_padding}, cap, "request cap"

    def eager_reason(self, runs: Sequence[int], cap: int, cap_name: str) -> str:
        if not self.settings.enable_padding:
            return "no graph of their own size (padding off)"
        return f"above the list's max {runs[-1] if runs else 0}"

    def files_line(self) -> str:
        (options,) = self.files
        return f"Files: `{options}` (`trtllm-serve MODEL --extra_llm_api_options {options}`), `summary.json`."

    def serve_line(self, out_dir: Path, checkpoint: str | None) -> str | None:
        options = out_dir / EXTRA_OPTIONS_FILE
        if not options.is_file():
            return None
        return shlex.join(["trtllm-serve", checkpoint or placeholder("CHECKPOINT", "model.name"),
                           "--extra_llm_api_options", str(options)])
