"""vLLM 0.34 behind the Engine interface: one model runner (V2), two capture lists (decode graphs by request count,
prefill graphs by token count), the KV cache sized after capture (the extensible KV cache) or from 0.33's estimate
without it, and the split compilation-config fields in its files. A 0.34 list inside cgtune is one set of keys
(`tuner.engines.vllm.v034.dispatch.split_keys`: positive keys are prefill token sizes, -n the decode graphs of n
requests)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from tuner.engines.engine import Deployment, DrafterSweep, KvFacts
from tuner.engines.serving import ServingConfig
from tuner.engines.vllm.defaults import CaptureDefaults
from tuner.engines.vllm.dispatch import mode_parts
from tuner.engines.vllm.drafter import MODEL_BASED_METHODS
from tuner.engines.vllm.engine import VllmV2Engine
from tuner.engines.vllm.log_lines import CAPTURE, GIB, KV_AVAILABLE, KV_SIZE, format_gib
from tuner.engines.vllm.memory import GraphCost, KvRule, estimate_v2_bytes
from tuner.engines.vllm.v034.defaults import WIDE_DECODE_TOKENS, SplitSizes, decode_grid, resolve_capture_sizes
from tuner.engines.vllm.v034.dispatch import Dispatcher034, join_keys, split_keys
from tuner.engines.vllm.v034.drafter_cost import Drafter034
from tuner.engines.vllm.v034.emit import (
    COMPILATION_FIELDS,
    keys_of_compilation_config,
    list_fields,
    render_034_files,
)
from tuner.engines.vllm.v034.kv_layout import BLOCK_SIZE_TOKENS, GRANULE_BYTES, KvGeometry, KvLayer, KvLayout
from tuner.engines.vllm.v034.memory import ExtensibleKvRule
from tuner.engines.vllm.v034.refusals import speculative_refusals_034
from tuner.engines.vllm.v034.settings import Vllm034Settings

if TYPE_CHECKING:
    from tuner.engines.vllm.emit import Provenance
    from tuner.profile.table import Profile

__all__ = ["Vllm034Engine"]


class Vllm034Engine(VllmV2Engine):
    """vLLM 0.34: the V2 runner over split capture lists."""

    version = "0.34"
    report_words = "tuner.report.vllm034_words"
    split_lists = True
    """A list is two lists (decode request sizes, prefill token sizes): the search's keys carry both."""

    @classmethod
    def bind(cls, serving: ServingConfig) -> Vllm034Engine:
        return cls(serving)  # one runner: nothing to pick

    @property
    def settings_034(self) -> Vllm034Settings:
        return self.serving.engine_settings or Vllm034Settings()

    @property
    def runner_reason(self) -> str:
        return "V2: the only model runner vLLM 0.34 has (V1 was removed)"

    @property
    def makes_estimate(self) -> bool:  # type: ignore[override]
        """An estimate sizes the KV cache only without the extensible KV cache."""
        return not self.extensible

    @property
    def extensible(self) -> bool:
        """The KV cache is sized after capture (the default); off, from 0.33's estimate rule."""
        return self.settings_034.extensible_kv_cache

    @property
    def pin_note(self) -> str:
        """0.34 with its extensible KV cache already sizes the KV cache after capture, by measurement: a pin turns
        that off (vllm.py's _resolve_extensible_kv_cache), fixing the size the engine measured instead."""
        if self.extensible:
            return ("vLLM 0.34 then turns its extensible KV cache off (it would size the KV cache after capture by "
                    "measurement at every start): the size is fixed at what it measured here, the same at every start "
                    "on this device, and skips its memory profiling")
        return super().pin_note

    def _refusals(self) -> list[tuple[str, object, str | None]]:
        """What 0.34's `SpeculativeConfig` refuses of the method (built first: `EngineArgs.create_engine_config`),
        then 0.33's checks, which 0.34 makes the same."""
        s = self.serving
        return [*speculative_refusals_034(s.speculative_method, s.parallel_drafting), *super()._refusals()]

    # ------------------------------------------------------------------ lists and their graphs
    def resolve(self, *, prefill: Sequence[int] | None = None, decode: Sequence[int] | None = None,
                from_workload: bool = True) -> SplitSizes:
        """vLLM 0.34's resolution of the workload's settings (`from_workload`: the deployment's default), or of explicit
        lists as cgtune's files write them (with the decode token budget they carry, `files_decode_tokens`)."""
        if from_workload:
            return self._default_split
        return self.resolve_fields(self.list_fields(prefill or (), decode or ()))

    def resolve_fields(self, fields: dict[str, Any], cudagraph_mode: str | None = None) -> SplitSizes:
        """vLLM 0.34's resolution of a compilation config's capture fields (`COMPILATION_FIELDS`' names: what a
        `--compilation-config` holds) beside the workload's other settings; ValueError where vLLM refuses."""
        s = self.serving
        schedule = [list(e) for e in self.dynamic_schedule] if self.dynamic_schedule else None
        given = {COMPILATION_FIELDS[k]: list(v) if isinstance(v, tuple | list) else v for k, v in fields.items()}
        return resolve_capture_sizes(
            max_num_seqs=s.max_num_seqs, max_num_batched_tokens=s.max_num_batched_tokens,
            num_speculative_tokens=s.num_speculative_tokens, speculative_method=s.speculative_method,
            speculative_schedule=schedule, gpu_capability=s.gpu_capability, performance_mode=s.performance_mode,
            cudagraph_mode=cudagraph_mode or s.cudagraph_mode, enforce_eager=s.enforce_eager, **given)

    def deployment_fields(self) -> dict[str, Any]:
        """The capture fields the workload sets, under the compilation config's names (what the deployment runs with
        today; none set: vLLM's own default)."""
        s, o = self.serving, self.settings_034
        values = {"cudagraph_capture_sizes": s.cudagraph_capture_sizes,
                  "max_cudagraph_capture_size": s.max_cudagraph_capture_size,
                  "prefill_cudagraph_capture_token_sizes": o.prefill_token_sizes,
                  "max_prefill_cudagraph_capture_tokens": o.max_prefill_tokens,
                  "decode_cudagraph_capture_request_sizes": o.decode_request_sizes,
                  "max_decode_cudagraph_capture_requests": o.max_decode_requests,
                  "max_decode_cudagraph_capture_tokens": o.max_decode_tokens}
        return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items() if v is not None}

    @cached_property
    def _default_split(self) -> SplitSizes:
        return self.resolve_fields(self.deployment_fields())

    @property
    def files_decode_tokens(self) -> int | None:
        """The `max_decode_cudagraph_capture_tokens` cgtune's files write (None: none). A tuned pair keeps the decode
        token budget the deployment runs with (its own, SM100's 8192 under the wide defaults, or none once a deprecated
        field turns those off); the files write it where vLLM, reading lists and no deprecated field, would apply
        another: 8192 on SM100 (vllm.py:2607-2611), none elsewhere. No budget on SM100 is written as
        max_num_batched_tokens, which bounds every decode graph anyway (`min(mnbt, budget)`)."""
        s = self.serving
        kept = self._default_split.max_decode_tokens
        vllm_default = WIDE_DECODE_TOKENS if s.gpu_capability[0] == 10 else None
        if kept == vllm_default:
            return None
        return s.max_num_batched_tokens if kept is None else kept

    def list_fields(self, prefill: Sequence[int], decode: Sequence[int]) -> dict[str, Any]:
        """The capture fields cgtune's files write for a pair of lists: both lists, each capped at its max (so vLLM
        builds no grid and drops nothing), and the decode token budget where vLLM's would differ."""
        fields = list_fields(join_keys(prefill, decode))
        if self.files_decode_tokens is not None:
            fields["max_decode_cudagraph_capture_tokens"] = self.files_decode_tokens
        return fields

    def defaults(self, *, gpu_memory_mib: float | None = None) -> CaptureDefaults:
        split = self.resolve()
        keys = self._default_keys
        d = self._default_dispatcher
        covered = set(d.decode_graph_sizes)
        tops = {q: max((n for n, ql in d.decode_shapes if ql == q), default=0) for q in split.decode_query_lens}
        without = sorted({w for w in self.decode_widths() if w not in covered
                          and any(w % q == 0 and w // q > tops[q] for q in tops)})
        return CaptureDefaults(sizes=list(keys), max_size=split.max_record, uniform_decode_sizes_without_graph=without,
                               warnings=list(split.warnings), split=split)

    @cached_property
    def _default_keys(self) -> tuple[int, ...]:
        split = self._default_split
        return join_keys(split.prefill_token_sizes, split.decode_request_sizes) if split.max_record else ()

    @cached_property
    def _default_dispatcher(self) -> Dispatcher034:
        """The default's graphs and dispatch as vLLM resolves the deployment's own settings (not as cgtune's files
        would write its lists: a deprecated field set turns SM100's decode token budget off, and keeps the prefill
        sizes in the record the decode graphs are bounded by)."""
        return Dispatcher034.from_split(self._default_split, max_num_seqs=self.serving.max_num_seqs,
                                        uniform_decode_query_len=self.decode_query_len)

    def runs_as(self, capture_sizes: Sequence[int]) -> tuple[int, ...]:
        """The keys vLLM keeps: prefill sizes within the token budget, decode sizes within max_num_seqs."""
        s = self.serving
        prefill, decode = split_keys(capture_sizes)
        return join_keys([t for t in prefill if t <= s.max_num_batched_tokens],
                         [n for n in decode if n <= s.max_num_seqs])

    def normalise(self, capture_sizes: Iterable[int]) -> tuple[int, ...]:
        return self.runs_as(list(capture_sizes))

    def probe_sizes(self) -> Sequence[int]:
        """Both lists' widest sizes: with one list empty a mode that captures only the other would capture nothing."""
        s = self.serving
        return join_keys([s.max_num_batched_tokens], [s.max_num_seqs])

    def every_key(self, top_width: int) -> Sequence[int]:
        """Every prefill size up to the widest step and every decode request count."""
        return join_keys(range(1, top_width + 1), range(1, self.serving.max_num_seqs + 1))

    def dispatcher(self, capture_sizes: Sequence[int]) -> Dispatcher034:
        """The graphs and dispatch of a pair of lists as vLLM 0.34 builds them from cgtune's files; the default's keys
        as vLLM resolves the deployment's own settings (one answer for every "vs vLLM default" figure)."""
        runs = self.runs_as(capture_sizes)
        if runs == self._default_keys:
            return self._default_dispatcher
        prefill, decode = split_keys(runs)
        split = self.resolve(prefill=prefill, decode=decode, from_workload=False)
        return Dispatcher034.from_split(split, max_num_seqs=self.serving.max_num_seqs,
                                        uniform_decode_query_len=self.decode_query_len)

    def key_widths(self, keys: Sequence[int]) -> list[int]:
        """The token widths of the graphs a list's keys make (decode: n x each query length)."""
        return self.dispatcher(keys).capture_sizes

    def widest_sizes(self) -> tuple[int, ...]:
        """PR 50488's aim in 0.34's terms: a decode graph for every request count the grid reaches up to
        max_num_seqs (as SM100's wide defaults do), beside the default prefill sizes."""
        split = self.resolve()
        return join_keys(split.prefill_token_sizes, decode_grid(self.serving.max_num_seqs))

    def in_engine_unit(self, capture_sizes: Sequence[int]) -> list[int]:
        return sorted(set(capture_sizes))

    def added_above(self, default: Sequence[int], added: Sequence[int]) -> list[int]:
        """Decode sizes above the default's most requests, and prefill sizes above its widest prefill graph."""
        prefill, decode = split_keys(default)
        return sorted(k for k in added if (k < 0 and -k > max(decode, default=0))
                      or (k > 0 and k > max(prefill, default=0)))

    def graph_kinds(self, capture_sizes: Sequence[int]) -> list[tuple[str, str, list[int]]]:
        """Decode graphs (n requests x q tokens each) and prefill graphs (token-keyed), at their token widths."""
        d = self.dispatcher(capture_sizes)
        kinds = [(f"decode graphs (requests x {self.decode_query_len} tokens)", d.decode_mode, d.decode_graph_sizes),
                 ("prefill graphs (tokens)", d.mixed_mode, d.mixed_graph_sizes)]
        return [(what, mode, list(widths)) for what, mode, widths in kinds if widths]

    def key_text(self, key: int) -> str:
        """`128 requests x 17 = 2176 tokens` (a decode size), `512 tokens (prefill)`."""
        q = self.decode_query_len
        return f"{-key} requests x {q} = {-key * q} tokens" if key < 0 else f"{key} tokens (prefill)"

    def tops_text(self, capture_sizes: Sequence[int]) -> str:
        prefill, decode = split_keys(capture_sizes)
        return f"{max(decode, default=0)} requests, {max(prefill, default=0)} tokens"

    def list_text(self, capture_sizes: Sequence[int], limit: int | None = 24) -> str:
        """`decode requests 1, 2, ... (30 sizes); prefill tokens 1, 2, 4, ... (55 sizes)`."""
        prefill, decode = split_keys(capture_sizes)
        return (f"decode requests {super().list_text(decode, limit)}; prefill tokens "
                f"{super().list_text(prefill, limit)}")

    def list_shape(self, capture_sizes: Sequence[int], *, short: bool = False) -> str:
        """`30 decode sizes (1..30 requests x 17 = 17..510 tokens), 55 prefill sizes (1..512 tokens)` (`short`: `30
        decode + 55 prefill sizes`); an empty list is `no decode graphs` or `no prefill graphs`."""
        prefill, decode = split_keys(capture_sizes)
        if short:
            return f"{len(decode)} decode + {len(prefill)} prefill sizes"
        q = self.decode_query_len

        def span(values: list[int], scale: int = 1) -> str:
            lo, hi = values[0] * scale, values[-1] * scale
            return str(lo) if lo == hi else f"{lo}..{hi}"

        dec = (f"{len(decode)} decode size{'s' if len(decode) > 1 else ''} ({span(decode)} requests x {q} = "
               f"{span(decode, q)} tokens)" if decode else "no decode graphs")
        pre = (f"{len(prefill)} prefill size{'s' if len(prefill) > 1 else ''} ({span(prefill)} "
               f"token{'s' if prefill[-1] > 1 else ''})" if prefill else "no prefill graphs")
        return f"{dec}, {pre}"

    def offered_widths(self, widths: list[int], dispatcher: Any, notes: list[str]) -> list[int]:
        """The keys worth offering: every measured graph width as a prefill size (where mixed steps replay graphs),
        and -n for every n whose decode width n x q was measured (where decode steps replay FULL graphs)."""
        s, q = self.serving, self.decode_query_len
        keys: set[int] = set()
        if dispatcher.mixed_mode != "NONE":
            keys |= {w for w in widths if w <= s.max_num_batched_tokens}
        if dispatcher.separate_decode and dispatcher.decode_mode == "FULL":
            keys |= {-(w // q) for w in widths if w % q == 0 and w // q <= s.max_num_seqs}
        notes.append("vLLM 0.34 captures two lists: the search offers the measured widths as prefill token sizes and "
                     f"the measured multiples of q = {q} as decode request sizes")
        return sorted(keys)

    # ------------------------------------------------------------------ memory
    def kv_rule(self, *, total_memory_bytes: int, non_kv_cache_bytes: int, weights_bytes: Callable[[], int],
                required_kv_bytes: int, tensor_parallel_size: int, notes: list[str],
                pre_load_free_bytes: int | None = None,
                activation_peak_bytes: int | None = None, kv: KvFacts | None = None) -> ExtensibleKvRule | KvRule:
        s = self.serving
        if not self.extensible:
            return super().kv_rule(total_memory_bytes=total_memory_bytes, non_kv_cache_bytes=non_kv_cache_bytes,
                                   weights_bytes=weights_bytes, required_kv_bytes=required_kv_bytes,
                                   tensor_parallel_size=tensor_parallel_size, notes=notes,
                                   pre_load_free_bytes=pre_load_free_bytes)
        notes.append("vLLM 0.34 sizes the KV cache after capture (extensible KV cache): every graph's real pool comes "
                     "out of it, in whole blocks of 2 MiB-rounded layer segments, and no estimate is made")
        kv = kv or KvFacts()
        recorded = dict(kv.recorded or {})
        peak = recorded.get("transient_peak_bytes", activation_peak_bytes)
        growth = recorded.get("torch_reserve_growth_bytes", kv.torch_reserve_growth_bytes)
        start = recorded.get("init_free_memory_bytes", pre_load_free_bytes)
        for value, missing in ((peak, "no activation peak: the margin vLLM 0.34 keeps free is taken at its 1 GiB "
                                      "floor"),
                               (growth, "no torch reserve growth: vLLM 0.34 keeps the larger of it and the transient "
                                        "peak free, here the peak"),
                               (start, "no free memory at start: the device's whole memory stands for it")):
            if value is None:
                notes.append(f"the profile records {missing}")
        return ExtensibleKvRule(total_memory_bytes, s.gpu_memory_utilization, non_kv_cache_bytes, required_kv_bytes,
                                geometry=self.kv_geometry(kv), peak_bytes=int(peak or 0),
                                torch_reserve_growth_bytes=int(growth or 0), start_free_bytes=start,
                                granule_bytes=int(recorded.get("granule_bytes", GRANULE_BYTES)))

    def kv_geometry(self, kv: KvFacts) -> KvGeometry:
        """The KV cache's segments and pool bytes per block: as vLLM 0.34 recorded them in the profile, else laid out
        from the workload's attention layers (full attention: the target's, then the drafter's)."""
        recorded = kv.recorded or {}
        if recorded.get("segment_strides") and recorded.get("pool_bytes_per_block"):
            return KvGeometry(tuple(int(x) for x in recorded["segment_strides"]), int(recorded["pool_bytes_per_block"]))
        layers = tuple(KvLayer("full", heads, head_dim, dtype_bytes)
                       for count, heads, head_dim, dtype_bytes in kv.layers for _ in range(count))
        per_token = sum(2 * count * heads * head_dim * size for count, heads, head_dim, size in kv.layers)
        if layers and kv.bytes_per_token and kv.bytes_per_token != per_token:
            # the profile measured another figure (MLA, a quantized KV cache): its bytes, over the same layers
            page = BLOCK_SIZE_TOKENS * kv.bytes_per_token // len(layers)
            layers = tuple(KvLayer("full", 1, 1, 1, page_size_padded=page) for _ in layers)
        return KvLayout(layers).geometry

    def estimate_bytes(self, costs: Sequence[GraphCost]) -> float:
        """No estimate under the extensible KV cache (0: the real pool is what the KV cache loses); without it, 0.33's
        V2 sampling estimate (its code is unchanged in 0.34)."""
        return 0.0 if self.extensible else estimate_v2_bytes(costs)

    def pool_bytes(self, costs: Sequence[GraphCost]) -> float:
        """The real pool: the widest activations once (the graph of the largest standalone footprint), every other
        graph its delta. 0.34 captures PIECEWISE graphs before FULL ones, and a decode graph wider than every prefill
        graph does not fit in their buffers, so the first captured is not always the one whose buffers the others
        share (vLLM 0.33's lists kept every FULL graph within the widest PIECEWISE one)."""
        if not costs:
            return 0.0
        widest = max(range(len(costs)), key=lambda i: costs[i].standalone_bytes - costs[i].delta_bytes)
        return float(costs[widest].standalone_bytes + sum(g.delta_bytes for i, g in enumerate(costs) if i != widest))

    def estimate_form(self, dispatcher: Any, estimate_enabled: bool) -> str:
        return "real"

    # ------------------------------------------------------------------ drafters
    def drafter_cost(self, profile: Profile, speculative: Any, dispatcher: Any, name: str,
                     notes: list[str]) -> Drafter034 | None:
        """0.34's drafter rules (`tuner.engines.vllm.v034.drafter_cost`) for the model-based methods."""
        method = speculative.method
        if method not in MODEL_BASED_METHODS:
            return None
        s = self.serving
        return Drafter034(profile, method, dispatcher=self.dispatcher, num_speculative_tokens=s.num_speculative_tokens,
                          max_num_seqs=s.max_num_seqs, decode_mode=dispatcher.decode_mode, name=name, notes=notes,
                          multi_module_mtp=(speculative.num_nextn_predict_layers or 1) > 1,
                          dynamic_ks=self.dynamic_ks)

    @property
    def dynamic_ks(self) -> list[int] | None:
        """The K of each batch size under the dynamic speculative schedule (None without one)."""
        return [q - 1 for q in self.decode_query_lens()[1:]] if self.dynamic_schedule else None

    def drafter_sweep(self, method: str, candidates: Sequence[int]) -> DrafterSweep:
        """What a sweep measures of 0.34's drafter: its graphs' modes (DFlash: FULL at the target's decode shapes; the
        autoregressive drafters: the target's shapes, PIECEWISE and FULL, and their one-token FULL decode graphs), and
        the one-token passes' widths (the request grid up to max_num_seqs)."""
        s, mode = self.serving, self.effective_cudagraph_mode
        decode_full = mode_parts(mode)[0] == "FULL" if mode != "NONE" else False
        if mode == "NONE" or method not in MODEL_BASED_METHODS:
            return DrafterSweep("v2", [], ())
        if method == "dflash":
            return DrafterSweep("v2", [], ("full",) if decode_full else ())
        grid = decode_grid(s.max_num_seqs) if s.num_speculative_tokens >= 2 and decode_full else []
        modes = tuple(m for m, on in (("piecewise", mode_parts(mode)[1] == "PIECEWISE"), ("full", True)) if on)
        return DrafterSweep("v2", grid, modes)

    def eager_drafter_passes(self, method: str, request_counts: Sequence[int], capture_sizes: Sequence[int]) -> list:
        return []

    def setting_notes(self, dispatcher: Any) -> list[str]:
        return [w for w in self.resolve().warnings if "deprecated" in w] + self.lora_dp_notes(dispatcher)

    def measured_capture_config(self, widths: Sequence[int]) -> dict[str, object]:
        """Both of 0.34's lists: every width a prefill size, every multiple of q a decode size of its requests (the
        deprecated single list would make 0.34 derive the decode sizes itself, with a warning)."""
        s, q = self.serving, self.decode_query_len
        decode = sorted({w // q for w in widths if w % q == 0 and w // q <= s.max_num_seqs})
        prefill = sorted({w for w in widths if w <= s.max_num_batched_tokens})
        return {"prefill_cudagraph_capture_token_sizes": prefill, "decode_cudagraph_capture_request_sizes": decode}

    def memory_log_lines(self, **figures: Any) -> list[str]:
        """The memory lines vLLM 0.34 logs at start-up. With the extensible KV cache: the capacity it reserves
        ("Available KV cache memory", no estimate subtracted), the real capture, then the KV cache measured after it;
        without, 0.33's V2 lines (the same format strings, facts §5)."""
        capacity = figures.pop("kv_capacity_bytes")
        if not self.extensible:
            return super().memory_log_lines(**figures)
        lines = [KV_AVAILABLE % format_gib(capacity)]
        if figures["captures"]:
            lines.append(CAPTURE % (figures.get("capture_s", 0.0), figures["pool_bytes"] / GIB))
        lines.append(KV_SIZE % ("GPU", f"{figures['kv_tokens']:,}", f"{figures['max_model_len']:,}",
                                figures["max_concurrency"]))
        return lines

    @property
    def estimate_line_note(self) -> str:
        return ("0.34 makes no estimate under the extensible KV cache: it reserves the capacity, captures, then sizes "
                "the KV cache from what is left; the capture's seconds are the profile's capture time summed over the "
                "list's graphs, as the tables and `cgtune check` predict them (vLLM adds its warm-up runs; 0 where the "
                "profile records none)" if self.extensible else super().estimate_line_note)

    # ------------------------------------------------------------------ its start-up log, read back (cgtune check)
    def read_compilation_config(self, config: dict[str, Any]) -> tuple[int, ...]:
        """The keys of the two lists vLLM 0.34 resolves from a run's compilation_config.json."""
        return keys_of_compilation_config(self, config)

    def config_lists(self, capture_sizes: Sequence[int]) -> list[tuple[str, tuple[int, ...]]]:
        prefill, decode = split_keys(capture_sizes)
        return [("decode_cudagraph_capture_request_sizes", tuple(decode)),
                ("prefill_cudagraph_capture_token_sizes", tuple(prefill))]

    def kv_line_figure(self, kv_available_bytes: float, *, requested_bytes: float,
                       non_kv_cache_bytes: float) -> tuple[str, float]:
        """Under the extensible KV cache "Available KV cache memory" is the capacity vLLM reserves before capture
        (requested - non-KV; gpu_worker.py:776-798 with a 0 estimate), not the KV cache it keeps after."""
        if not self.extensible:
            return super().kv_line_figure(kv_available_bytes, requested_bytes=requested_bytes,
                                          non_kv_cache_bytes=non_kv_cache_bytes)
        return "kv_capacity_bytes", requested_bytes - non_kv_cache_bytes

    @property
    def no_estimate_note(self) -> str:
        if not self.extensible:
            return super().no_estimate_note
        return ("vLLM 0.34 makes no graph-memory estimate under the extensible KV cache, so vllm_graph_estimate_bytes "
                "is not compared; its \"Available KV cache memory\" is the capacity it reserves before capture "
                "(kv_capacity_bytes, predicted = requested - non-KV), and the KV cache it keeps, sized after the "
                "capture, is in kv_tokens and max_concurrency")

    def estimate_refusal(self, *, warned_disabled: bool, logged_estimate: bool) -> str | None:
        """Under the extensible KV cache 0.34 makes no estimate and never warns that it is off (gpu_worker.py:
        742-747, 822-834): either in the log means vLLM ran without it."""
        if not self.extensible:
            return super().estimate_refusal(warned_disabled=warned_disabled, logged_estimate=logged_estimate)
        if not (warned_disabled or logged_estimate):
            return None
        what = ("warned that VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0" if warned_disabled
                else "logged a graph-memory estimate")
        return (f"vLLM {what}, so it sized the KV cache without the extensible KV cache; the run's workload has it "
                f"(serving.extensible_kv_cache: true)")

    # ------------------------------------------------------------------ files to emit
    def render_files(self, capture_sizes: Sequence[int], deployment: Deployment, *, cudagraph_mode: str,
                     provenance: Provenance | None = None) -> dict[str, str]:
        """The three files with 0.34's own fields: `prefill_cudagraph_capture_token_sizes` and
        `decode_cudagraph_capture_request_sizes` with their caps, checked against 0.34's resolution first."""
        return render_034_files(self, capture_sizes, self.serve_settings(deployment), cudagraph_mode=cudagraph_mode,
                                provenance=provenance)

    @property
    def _extensible_flag(self) -> bool | None:
        """Off where the workload sizes the KV cache without the extensible KV cache (vLLM turns it on by default)."""
        return None if self.extensible else False

    def _environment(self) -> tuple[tuple[str, str, str], ...]:
        """0.34 has no runner to pin; the estimate switch matters only without the extensible KV cache."""
        s = self.serving
        if not s.estimate_cudagraph_memory and not self.extensible:
            return (("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "0",
                     "estimate_cudagraph_memory: false (vLLM subtracts no graph-memory estimate from the KV cache)"),)
        return ()
