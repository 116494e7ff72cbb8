"""SGLang 0.5.23 behind the Engine interface: its serving settings in its own words, its default list, capture
filter, dispatch, KV rule and files, from this rulebook, in requests (a graph holds bs x tokens-per-request
tokens)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tuner.engine import Speculation, flag_file_line
from tuner.fields import FieldReader, WorkloadError
from tuner.request_engine import RequestEngine
from tuner.sglang.capture import captured_batch_sizes, request_pool_size, resolve_decode_graphs
from tuner.sglang.defaults import default_decode_batch_sizes
from tuner.sglang.dispatch import Dispatcher
from tuner.sglang.emit import CUDA_GRAPH_CONFIG_FILE, FLAGS_FILE, render_files
from tuner.sglang.memory import SglangKvRule
from tuner.sglang.speculative import effective_max_running_requests

if TYPE_CHECKING:
    from pathlib import Path

    from tuner.vllm.emit import Provenance

__all__ = ["SglangEngine", "SglangSettings"]

MIB = 1 << 20


@dataclass(frozen=True)
class SglangSettings:
    """SGLang's serving settings that have no vLLM counterpart (the shared ones live in ServingConfig under vLLM's
    names; tokens per request, speculative_num_draft_tokens, in its `tokens_per_request`)."""

    speculative_algorithm: str | None = None
    """SGLang's speculative algorithm (EAGLE, EAGLE3, NEXTN, DFLASH, NGRAM, ...); None without speculation."""
    mem_fraction_static: float | None = None
    """--mem-fraction-static; None: SGLang's automatic fraction (which moves with the list's max)."""
    gpu_memory_mib: float | None = None
    """The GPU memory its defaults read (nvidia-smi memory.total, MiB); None: the profile's, else unknown."""


class SglangEngine(RequestEngine):
    """SGLang: decode graphs by batch size; its KV cache sized BEFORE capture from mem_fraction_static."""

    name = "sglang"
    label = "SGLang"
    files = (FLAGS_FILE, CUDA_GRAPH_CONFIG_FILE)
    aliases = {"max_running_requests": "max_num_seqs", "chunked_prefill_size": "max_num_batched_tokens",
               "context_length": "max_model_len", "speculative_num_steps": "num_speculative_tokens"}
    request_cap_name = "max_running_requests"
    speculative_names = {"eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "NEXTN", "dflash": "DFLASH", "ngram": "NGRAM",
                         "draft_model": "STANDALONE"}
    speculative_what = "SGLang speculative algorithm"

    @property
    def settings(self) -> SglangSettings:
        return self.serving.engine_settings

    @classmethod
    def parse_settings(cls, r: FieldReader, num_speculative_tokens: int,
                       speculative_method: str | None) -> tuple[Any, int]:
        native = cls.native_method(r, num_speculative_tokens, speculative_method)
        topk = r.int("speculative_eagle_topk", 1, minimum=1)
        draft = r.int("speculative_num_draft_tokens", None, minimum=1)
        if native is not None and draft is None:
            if topk > 1:
                raise WorkloadError(f"{r.at('speculative_num_draft_tokens')}: missing (needed with "
                                    f"speculative_eagle_topk={topk})")
            draft = num_speculative_tokens + 1  # SGLang forces num_draft_tokens = num_steps + 1 with topk 1
        settings = SglangSettings(
            speculative_algorithm=native,
            mem_fraction_static=r.float("mem_fraction_static", None, minimum=0.0, maximum=1.0, exclusive_minimum=True),
            gpu_memory_mib=r.float("gpu_memory_mib", None, minimum=0.0, exclusive_minimum=True))
        return settings, (draft if native is not None else 1)

    @property
    def speculation(self) -> Speculation:
        return Speculation(self.settings.speculative_algorithm, self.decode_query_len)

    def _max_running_requests(self) -> int:
        """max_running_requests after SGLang's speculative resolution; cgtune always sets it (max_num_seqs)."""
        s = self.serving
        return effective_max_running_requests(self.settings.speculative_algorithm, s.max_num_seqs) or s.max_num_seqs

    def default_requests(self, gpu_memory_mib: float | None) -> list[int]:
        e, s = self.settings, self.serving
        return resolve_decode_graphs(
            gpu_memory_mib=e.gpu_memory_mib if e.gpu_memory_mib is not None else gpu_memory_mib, tp_size=1,
            max_running_requests=s.max_num_seqs, speculative_algorithm=e.speculative_algorithm,
            speculative_num_draft_tokens=self.decode_query_len if e.speculative_algorithm else None,
        ).requested_batch_sizes

    def captured_requests(self, batch_sizes: Sequence[int]) -> list[int]:
        pool = request_pool_size(max_running_requests=self._max_running_requests())
        return captured_batch_sizes(batch_sizes, pool, captured_req_width=self.decode_query_len)

    def rule(self, batch_sizes: Sequence[int]) -> Dispatcher:
        return Dispatcher(batch_sizes, tokens_per_request=self.decode_query_len)

    def widest_requests(self) -> list[int]:
        return default_decode_batch_sizes(self.serving.max_num_seqs,
                                          speculative=self.settings.speculative_algorithm is not None)

    def kv_rule(self, *, total_memory_bytes: int, non_kv_cache_bytes: int, weights_bytes: Callable[[], int],
                required_kv_bytes: int, tensor_parallel_size: int, notes: list[str]) -> SglangKvRule:
        weights = weights_bytes()
        return SglangKvRule(total_memory_bytes, weights, max(0, non_kv_cache_bytes - weights), required_kv_bytes,
                            self.settings.mem_fraction_static,
                            self.settings.gpu_memory_mib or total_memory_bytes / MIB, tensor_parallel_size,
                            self.serving.max_num_batched_tokens, self.decode_query_len)

    # ------------------------------------------------------------------ words
    def engine_line(self) -> str:
        return (f"SGLang 0.5.23: decode graphs by batch size (requests), each holding bs x {self.decode_query_len} "
                f"tokens; mixed and prefill steps run without a decode graph")

    def memory_rule_words(self, budget: SglangKvRule, default_top: int, tuned_top: int,
                          mem: Callable[[float], str]) -> tuple[str, str]:
        b, mfs = budget, self.settings.mem_fraction_static
        if mfs is not None:
            fraction = (f"mem_fraction_static {mfs} (set in the workload: the list never moves the KV cache, bigger "
                        f"lists only eat the slack)")
        else:
            fraction = (f"SGLang's automatic mem_fraction_static: {b.fraction(default_top)} for the default list's "
                        f"max ({default_top} requests), {b.fraction(tuned_top)} for the tuned list's ({tuned_top}); "
                        f"only max(bs) moves it (2 MiB of reserve per request of max(bs), rounded to 0.001, and not "
                        f"while its 10 GiB floor binds), the number of graphs does not")
        return (f"- KV cache, as SGLang sizes it: BEFORE capturing, total {mem(b.total_memory_bytes)} x "
                f"mem_fraction_static minus weights {mem(b.weights_bytes)}; the graphs and the activations "
                f"({mem(b.activation_bytes)}) must fit in the slack, total x (1 - mem_fraction_static); {fraction}; "
                f"required KV {mem(b.required_kv_bytes)}"), "slack - activations - real pool"

    def summary_fields(self, budget: SglangKvRule, default_top: int, tuned_top: int) -> dict[str, Any]:
        return {"mem_fraction_static": self.settings.mem_fraction_static,
                "mem_fraction_static_used": budget.fraction(tuned_top),
                "mem_fraction_static_default_list": budget.fraction(default_top),
                "weights_bytes": budget.weights_bytes, "activation_bytes": budget.activation_bytes}

    def defaults_rows(self, tensor_parallel_size: int) -> tuple[list[tuple[str, str]], dict[str, Any], int, str]:
        e, s, q = self.settings, self.serving, self.decode_query_len
        graphs = resolve_decode_graphs(
            gpu_memory_mib=e.gpu_memory_mib, tp_size=tensor_parallel_size, max_running_requests=s.max_num_seqs,
            speculative_algorithm=e.speculative_algorithm,
            speculative_num_draft_tokens=q if e.speculative_algorithm else None)
        per_request = "speculative_num_draft_tokens" if e.speculative_algorithm else "normal decode"
        memory = (f"{e.gpu_memory_mib:g} MiB" if e.gpu_memory_mib is not None else
                  "unknown (serving.gpu_memory_mib unset: SGLang's unknown-GPU row; set it to nvidia-smi's "
                  "memory.total)")
        rows = [("engine", f"{self.label} 0.5.23: decode graphs counted in requests, each holding bs x {q} token"
                           f"{'s' if q > 1 else ''} ({per_request})"),
                ("GPU memory", memory),
                ("max_bs", f"{graphs.max_bs} (SGLang's GPU-memory table for tp {tensor_parallel_size}, capped at "
                           f"max_running_requests {s.max_num_seqs})"),
                ("request pool", f"{graphs.pool_size} (max_running_requests)")]
        return rows, {"max_bs": graphs.max_bs, "gpu_memory_mib": e.gpu_memory_mib}, graphs.pool_size, "request pool"

    def eager_reason(self, runs: Sequence[int], cap: int, cap_name: str) -> str:
        return f"between the list's max {runs[-1] if runs else 0} and the {cap_name} {cap}"

    def files_line(self) -> str:
        flags, config = self.files
        return (f"Files: `{flags}` (append its last line to `sglang serve --model-path MODEL`: "
                f"`--max-running-requests {self.serving.max_num_seqs} --cuda-graph-bs-decode ...`), `{config}` "
                f"(the same list for `--cuda-graph-config`), `summary.json`.")

    # ------------------------------------------------------------------ files
    def serve_line(self, out_dir: Path, checkpoint: str | None) -> str | None:
        line = flag_file_line(out_dir / FLAGS_FILE)
        return f"sglang serve --model-path {checkpoint or 'MODEL'} {line}" if line else None

    def render_request_files(self, batch_sizes: Sequence[int], provenance: Provenance | None) -> dict[str, str]:
        """SGLang's flag file and `--cuda-graph-config` JSON, `--max-running-requests` pinned to the workload's
        (unset, speculative decoding would set 48)."""
        return render_files(batch_sizes, max_running_requests=self.serving.max_num_seqs,
                            tokens_per_request=self.decode_query_len, provenance=provenance)
