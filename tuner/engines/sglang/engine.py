"""SGLang 0.5.23 behind the Engine interface: its serving settings in its own words, its default list, capture
filter, dispatch, KV rule and files, from this rulebook, in requests (a graph holds bs x tokens-per-request
tokens)."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tuner.engines.engine import Deployment, Speculation, flag_file_line, placeholder
from tuner.engines.request_engine import RequestEngine
from tuner.engines.sglang.capture import captured_batch_sizes, request_pool_size, resolve_decode_graphs
from tuner.engines.sglang.defaults import default_decode_batch_sizes
from tuner.engines.sglang.dispatch import Dispatcher
from tuner.engines.sglang.emit import CUDA_GRAPH_CONFIG_FILE, FLAGS_FILE, LaunchSettings, render_files
from tuner.engines.sglang.memory import SglangKvRule
from tuner.engines.sglang.speculative import ResolvedSpeculation, effective_max_running_requests, resolve_speculation
from tuner.fields import FieldReader, WorkloadError

if TYPE_CHECKING:
    from pathlib import Path

    from tuner.engines.vllm.emit import Provenance

__all__ = ["NEEDS_DRAFT_MODEL_PATH", "SglangEngine", "SglangSettings"]

MIB = 1 << 20

NEEDS_DRAFT_MODEL_PATH = ("EAGLE", "EAGLE3", "STANDALONE", "DFLASH")
"""Algorithms that load a draft model of their own from --speculative-draft-model-path (DFLASH refuses to start
without it, speculative_hook.py:324-327); NEXTN takes its MTP layers from the target for the architectures SGLang
knows."""


@dataclass(frozen=True)
class SglangSettings:
    """SGLang's serving settings that have no vLLM counterpart (the shared ones live in ServingConfig under vLLM's
    names; tokens per request, speculative_num_draft_tokens, in its `tokens_per_request`)."""

    speculative_algorithm: str | None = None
    """SGLang's speculative algorithm (EAGLE, EAGLE3, NEXTN, DFLASH, NGRAM, ...); None without speculation."""
    speculation: ResolvedSpeculation | None = None
    """(steps, topk, draft tokens) as SGLang resolves them for the algorithm, with what it changed; None without
    speculation."""
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
    speculative_names = {"eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "NEXTN", "dflash": "DFLASH", "ngram": "NGRAM",
                         "draft_model": "STANDALONE"}
    speculative_what = "SGLang speculative algorithm"

    @property
    def settings(self) -> SglangSettings:
        return self.serving.engine_settings

    @classmethod
    def parse_settings(cls, r: FieldReader, num_speculative_tokens: int,
                       speculative_method: str | None) -> tuple[Any, int, int]:
        """SGLang's speculative numbers as its handler for the algorithm resolves them (`resolve_speculation`): the
        tokens per request are the resolved speculative_num_draft_tokens."""
        native = cls.native_method(r, num_speculative_tokens, speculative_method)
        given = {key: r.int(key, None, minimum=1)
                 for key in ("speculative_eagle_topk", "speculative_num_draft_tokens", "speculative_dflash_block_size")}
        resolved = None
        if native is not None:
            try:
                resolved = resolve_speculation(
                    native, num_steps=num_speculative_tokens or None, eagle_topk=given["speculative_eagle_topk"],
                    num_draft_tokens=given["speculative_num_draft_tokens"],
                    dflash_block_size=given["speculative_dflash_block_size"])
            except ValueError as exc:
                field, _, why = str(exc).partition(": ")
                raise WorkloadError(f"{r.at(field)}: {why}") from None
        elif (key := next((k for k, v in given.items() if v is not None), None)) is not None:
            raise WorkloadError(f"{r.at(key)}: {given[key]} needs speculative.method with engine {cls.name}")
        settings = SglangSettings(
            speculative_algorithm=native, speculation=resolved,
            mem_fraction_static=r.float("mem_fraction_static", None, minimum=0.0, maximum=1.0, exclusive_minimum=True),
            gpu_memory_mib=r.float("gpu_memory_mib", None, minimum=0.0, exclusive_minimum=True))
        if resolved is None:
            return settings, 1, num_speculative_tokens
        return settings, resolved.num_draft_tokens, resolved.num_steps

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
                required_kv_bytes: int, tensor_parallel_size: int, notes: list[str],
                pre_load_free_bytes: int | None = None,
                activation_peak_bytes: int | None = None, kv: Any = None) -> SglangKvRule:
        """SGLang's budget starts from the free memory before the weights load (kv_cache_configurator.py:3007,
        3038; bootstrap.py:207): the profile's `pre_load_free_bytes`, else total memory, which overstates the KV cache
        and the slack by what the CUDA context and other processes hold, times the fraction (a note says so)."""
        weights = weights_bytes()
        if pre_load_free_bytes is None:
            notes.append("the profile has no pre_load_free_bytes (free memory before the weights load, where SGLang's "
                         "KV budget starts): total memory stands in for it, which overstates the KV cache and the "
                         "graph slack by the CUDA context and other processes' memory times mem_fraction_static")
        return SglangKvRule(total_memory_bytes, weights, max(0, non_kv_cache_bytes - weights), required_kv_bytes,
                            self.settings.mem_fraction_static,
                            self.settings.gpu_memory_mib or total_memory_bytes / MIB, tensor_parallel_size,
                            self.serving.max_num_batched_tokens, self.decode_query_len,
                            pre_load_free_bytes=pre_load_free_bytes)

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
        base = (f"free memory before the weights load {mem(b.pre_load_bytes)}" if b.pre_load_free_bytes is not None
                else f"total memory {mem(b.total_memory_bytes)} (standing in for the free memory before the weights "
                     f"load, which the profile did not record)")
        return (f"- KV cache, as SGLang sizes it: BEFORE capturing, {base} x mem_fraction_static minus weights "
                f"{mem(b.weights_bytes)}; the graphs and the activations ({mem(b.activation_bytes)}) must fit in the "
                f"slack, that memory x (1 - mem_fraction_static); {fraction}; required KV "
                f"{mem(b.required_kv_bytes)}"), "slack - activations - real pool"

    def summary_fields(self, budget: SglangKvRule, default_top: int, tuned_top: int) -> dict[str, Any]:
        return {"mem_fraction_static": self.settings.mem_fraction_static,
                "pre_load_free_bytes": budget.pre_load_free_bytes,
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
        extra: dict[str, Any] = {"max_bs": graphs.max_bs, "gpu_memory_mib": e.gpu_memory_mib}
        if (r := e.speculation) is not None:
            rows.insert(1, ("speculative", f"{e.speculative_algorithm}: speculative_num_steps {r.num_steps}, "
                                           f"speculative_eagle_topk {r.eagle_topk}, speculative_num_draft_tokens "
                                           f"{r.num_draft_tokens}, as SGLang resolves them"))
            rows[2:2] = [("", f"SGLang changes: {change}") for change in r.changes]
            extra["speculative"] = {"algorithm": e.speculative_algorithm, "num_steps": r.num_steps,
                                    "eagle_topk": r.eagle_topk, "num_draft_tokens": r.num_draft_tokens,
                                    "changed_by_sglang": list(r.changes)}
        return rows, extra, graphs.pool_size, "request pool"

    def setting_notes(self, dispatcher: Any) -> list[str]:
        """What SGLang's speculative handler changes in the workload's numbers (the model runs the resolved ones)."""
        r = self.settings.speculation
        return [f"SGLang resolves the speculative settings: {change}" for change in (r.changes if r else ())]

    def eager_reason(self, runs: Sequence[int], cap: int, cap_name: str) -> str:
        return f"between the list's max {runs[-1] if runs else 0} and the {cap_name} {cap}"

    def files_line(self) -> str:
        flags, config = self.files
        return (f"Files: `{flags}` (append its last line to `sglang serve --model-path MODEL`: the serving and "
                f"speculative flags as tuned and the list as `--cuda-graph-config` JSON), `{config}` (that JSON; "
                f"SGLang takes it as a string, not a path: `--cuda-graph-config \"$(cat {config})\"`), "
                f"`summary.json`.")

    # ------------------------------------------------------------------ files
    def serve_line(self, out_dir: Path, checkpoint: str | None) -> str | None:
        line = flag_file_line(out_dir / FLAGS_FILE)
        model = shlex.quote(checkpoint or placeholder("CHECKPOINT", "model.name"))
        return f"sglang serve --model-path {model} {line}" if line else None

    def render_request_files(self, batch_sizes: Sequence[int], deployment: Deployment,
                             provenance: Provenance | None) -> dict[str, str]:
        """SGLang's flag file and `--cuda-graph-config` JSON, `--max-running-requests` pinned to the workload's
        (unset, speculative decoding would set 48) and the speculative numbers as SGLang resolves them."""
        s, e, notes = self.serving, self.settings, []
        speculative: list[tuple[str, object]] = []
        if (r := e.speculation) is not None:
            speculative.append(("speculative-algorithm", e.speculative_algorithm))
            draft = deployment.draft_model(str(e.speculative_algorithm),
                                           needed=e.speculative_algorithm in NEEDS_DRAFT_MODEL_PATH,
                                           key="--speculative-draft-model-path",
                                           why="SGLang loads the draft model from it, and refuses this value as it "
                                               "is", notes=notes)
            if draft is not None:
                speculative.append(("speculative-draft-model-path", draft))
            speculative += [("speculative-num-steps", r.num_steps), ("speculative-eagle-topk", r.eagle_topk),
                            ("speculative-num-draft-tokens", r.num_draft_tokens)]
        settings = LaunchSettings(
            max_running_requests=s.max_num_seqs, context_length=s.max_model_len,
            chunked_prefill_size=s.max_num_batched_tokens, tp_size=deployment.tensor_parallel_size,
            dtype=deployment.dtype, mem_fraction_static=e.mem_fraction_static, speculative=tuple(speculative),
            notes=tuple(notes))
        return render_files(batch_sizes, settings, tokens_per_request=self.decode_query_len, provenance=provenance)
