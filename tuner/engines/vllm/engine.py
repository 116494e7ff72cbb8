"""vLLM 0.33 behind the Engine interface, once per model runner (V1 and V2 differ in the list they run, the graphs
they capture, their graph-memory estimate and where the drafter's graphs enter the pool), from this rulebook."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tuner.engines.engine import LIST_LABELS, Deployment, DrafterSweep, Engine, Speculation, flag_file_line, placeholder
from tuner.engines.serving import ServingConfig, read_serving
from tuner.engines.vllm.defaults import (
    CaptureDefaults,
    default_capture_sizes,
    dense_speculative_schedule,
    request_count_grid,
    uniform_decode_tiers,
)
from tuner.engines.vllm.dispatch import Dispatcher
from tuner.engines.vllm.drafter import EagerDrafterPasses, drafter_graphs, drafter_pass_widths, eager_drafter_passes
from tuner.engines.vllm.drafter_cost import DrafterCost
from tuner.engines.vllm.emit import (
    COMPILATION_CONFIG_FILE,
    COMPILATION_NOTES_FILE,
    FLAGS_FILE,
    NEEDS_DRAFT_CHECKPOINT,
    SERVE_YAML_FILE,
    EmitError,
    ServeSettings,
    env_prefix,
    render_files,
)
from tuner.engines.vllm.data_parallel import dispatch_ranks
from tuner.engines.vllm.log_lines import estimate_line_note, memory_lines
from tuner.engines.vllm.lora import capture_cases, case_text, dispatch_cases
from tuner.engines.vllm.memory import GraphCost, KvRule, estimate_bytes, kv_capacity, start_kv_bytes
from tuner.engines.vllm.refusals import lookahead_tokens, scheduler_refusal, slots_refusal
from tuner.engines.vllm.runner import (
    effective_cudagraph_mode,
    keeps_dynamic_schedule,
    resolve_model_runner,
    runner_reason,
    runs_as,
    v1_rewrite_applies,
)
from tuner.fields import FieldReader, WorkloadError

if TYPE_CHECKING:
    from pathlib import Path

    from tuner.engines.vllm.emit import Provenance
    from tuner.profile.table import Profile

__all__ = ["VllmEngine", "VllmV1Engine", "VllmV2Engine"]

_LABELS = {**LIST_LABELS, "default": "vLLM default", "widest": "widest capture (PR 50488)",
           "sglang": "SGLang default (same config, as a vLLM list)"}


class VllmEngine(Engine):
    """vLLM: capture sizes in tokens; its KV cache sized from a graph-memory estimate made before the capture."""

    name = "vllm"
    label = "vLLM"
    unit = "tokens"
    files = (COMPILATION_CONFIG_FILE, SERVE_YAML_FILE, FLAGS_FILE)
    note_files = (COMPILATION_NOTES_FILE,)
    report_words = "tuner.report.vllm_words"
    makes_estimate = True
    exports_vllm_metrics = True
    peer_rows = ("sglang",)

    version = "0.33"
    """The vLLM release whose rules this class answers with (`tuner.engines.vllm.versions.VERSIONS`)."""
    split_lists = False
    """A list is one list of token widths (0.34: two lists, as keys)."""

    @classmethod
    def bind(cls, serving: ServingConfig) -> VllmEngine:
        """The model runner's class (the release is `tuner.engines.vllm.releases`' to pick)."""
        runner = resolve_model_runner(serving.model_runner, serving.speculative_method,
                                      parallel_drafting=serving.parallel_drafting)
        return _BY_RUNNER[runner](serving)

    @classmethod
    def parse_serving(cls, r: FieldReader, *, speculative_method: str | None,
                      parallel_drafting: bool) -> ServingConfig:
        config = read_serving(r, speculative_method=speculative_method, parallel_drafting=parallel_drafting)
        if config.vllm_version == "0.34":
            if config.model_runner == "v1":  # Platform.validate_environ refuses VLLM_USE_V2_MODEL_RUNNER=0
                raise WorkloadError(f"{r.at('model_runner')}: 'v1': vLLM 0.34 removed Model Runner V1 (set auto or "
                                    f"v2, or serving.vllm_version: '0.33')")
            return config
        try:  # a runner pinned where it cannot run the setup
            runner = resolve_model_runner(config.model_runner, speculative_method, parallel_drafting=parallel_drafting)
        except ValueError as exc:
            raise WorkloadError(f"{r.at('model_runner')}: {exc}") from None
        lora = config.lora
        if runner == "v1" and lora is not None and not lora.cudagraph_specialize_lora and config.data_parallel_size > 1:
            # V1 then captures no graph without LoRA: a rank's step with no adapter runs eager and takes every rank
            # with it, which the ranks' agreement (tuner.engines.vllm.data_parallel) does not follow.
            raise WorkloadError(f"{r.at('cudagraph_specialize_lora')}: false with data_parallel_size "
                                f"{config.data_parallel_size} on the V1 runner is not modelled (a rank without an "
                                f"adapter runs every rank eager)")
        return config

    @property
    def speculation(self) -> Speculation:
        return Speculation(self.serving.speculative_method, self.decode_query_len)

    @property
    def runner_reason(self) -> str:
        s = self.serving
        return runner_reason(s.model_runner, s.speculative_method, parallel_drafting=s.parallel_drafting)

    # ------------------------------------------------------------------ the steps it runs
    @property
    def dynamic_schedule(self) -> tuple[tuple[int, int, int], ...] | None:
        """`speculative_schedule`, unless vLLM drops it: under data parallelism (`_maybe_disable_dynamic_sd_for_data_
        parallel`, before anything else reads it: ranks could pick different K), and on the V1 runner for the
        speculative method (`keeps_dynamic_schedule`: suffix and custom_class then run static K); None without one."""
        s = self.serving
        if not s.speculative_schedule or s.num_speculative_tokens <= 0 or s.data_parallel_size > 1:
            return None
        return s.speculative_schedule if keeps_dynamic_schedule(self.runner, s.speculative_method) else None

    # ------------------------------------------------------------------ LoRA and data parallelism
    def lora_cases(self) -> tuple[int, ...]:
        """The LoRA cases each graph is captured for, in the order one width's graphs enter the pool
        (`tuner.engines.vllm.lora.capture_cases`); (0,) without LoRA."""
        return capture_cases(self.serving.lora, self.runner)

    def lora_dispatch(self, active: np.ndarray) -> np.ndarray:
        """The LoRA case steps with `active` adapters dispatch to (`dispatch_cases`; -1: no graph, eager)."""
        return dispatch_cases(self.serving.lora, self.runner, active)

    def graphs(self, runs: Sequence[int]) -> list[tuple[str, int]]:
        """The dispatcher's graphs, each once per LoRA case, a width's cases one after another."""
        cases = self.lora_cases()
        graphs = self.dispatcher(runs).graphs()
        return graphs if len(cases) == 1 else [g for g in graphs for _ in cases]

    @property
    def data_parallel_size(self) -> int:
        return self.serving.data_parallel_size

    def dispatch_ranks(self, dispatcher: Any, widths: np.ndarray, utc: np.ndarray, own_tokens: np.ndarray,
                       own_utc: np.ndarray, widest_utc: np.ndarray, widest_tokens: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The DP ranks' agreed dispatch (`tuner.engines.vllm.data_parallel.dispatch_ranks`)."""
        return dispatch_ranks(dispatcher, widths, utc, own_tokens, own_utc, widest_utc, widest_tokens)

    @property
    def effective_cudagraph_mode(self) -> str:
        """NONE under enforce_eager; V1 drops full graphs under a dynamic speculative schedule it keeps."""
        s = self.serving
        if s.enforce_eager:
            return "NONE"
        return effective_cudagraph_mode(s.cudagraph_mode, self.runner, dynamic_schedule=self.dynamic_schedule is not None)

    def decode_query_lens(self) -> list[int]:
        """1 + K(n) with K from the dynamic speculative schedule in force (vLLM's dense lookup; the schedule was
        validated on load), else q."""
        s = self.serving
        if self.dynamic_schedule is not None:
            dense = dense_speculative_schedule([list(e) for e in self.dynamic_schedule], s.max_num_seqs,
                                               s.num_speculative_tokens)
            return [1 + k for k in dense]
        return super().decode_query_lens()

    def decode_widths(self) -> list[int]:
        """Requests x query length, for each speculative tier (its own request range)."""
        s = self.serving
        schedule = [list(e) for e in self.dynamic_schedule] if self.dynamic_schedule else None
        widths = {n * query_len
                  for query_len, tier_max in uniform_decode_tiers(s.max_num_seqs, s.num_speculative_tokens, schedule)
                  for n in range(1, tier_max + 1)}
        return sorted(w for w in widths if w <= s.max_num_batched_tokens)

    def config_refusal(self, *, as_flags: bool = False) -> str | None:
        """vLLM's own start-up checks on the fields cgtune reads (`tuner.engines.vllm.refusals`), then its resolution of
        the capture settings: the first refusal as `serving.FIELD: VALUE: vLLM X refuses to start with it: REASON`."""
        for field, value, reason in self._refusals():
            if reason is not None:
                name = "--" + field.split(".")[-1].replace("_", "-") if as_flags else field
                return f"{name}: {value}: vLLM {self.version} refuses to start with it: {reason}"
        try:
            self.defaults()
        except ValueError as exc:  # the capture settings or the speculative schedule, as vLLM's config refuses them
            return f"serving: vLLM {self.version} refuses to start with these capture settings: {exc}"
        return None

    def _refusals(self) -> list[tuple[str, object, str | None]]:
        """`(field, value, vLLM's reason or None)` for each start-up check, in the order vLLM makes them (the scheduler
        config is built before the VllmConfig that checks the speculative slots)."""
        s = self.serving
        return [("serving.max_num_seqs", s.max_num_seqs, scheduler_refusal(s.max_num_seqs, s.max_num_batched_tokens)),
                ("serving.max_num_batched_tokens", s.max_num_batched_tokens,
                 slots_refusal(s.max_num_batched_tokens,
                               lookahead_tokens(s.speculative_method, s.num_speculative_tokens)))]

    # ------------------------------------------------------------------ lists and their graphs
    def defaults(self, *, gpu_memory_mib: float | None = None) -> CaptureDefaults:
        s = self.serving
        return default_capture_sizes(
            s.max_num_seqs, s.num_speculative_tokens, s.max_num_batched_tokens, gpu_capability=s.gpu_capability,
            performance_mode=s.performance_mode, cudagraph_mode=s.cudagraph_mode,
            max_cudagraph_capture_size=s.max_cudagraph_capture_size, cudagraph_capture_sizes=s.cudagraph_capture_sizes,
            speculative_schedule=[list(e) for e in self.dynamic_schedule] if self.dynamic_schedule else None,
            enforce_eager=s.enforce_eager,
        )

    def runs_as(self, capture_sizes: Sequence[int]) -> tuple[int, ...]:
        """After vLLM drops sizes above the token budget: V1 rewrites the list when speculating, V2 keeps it."""
        kept = sorted({int(s) for s in capture_sizes if 1 <= int(s) <= self.serving.max_num_batched_tokens})
        return tuple(runs_as(kept, runner=self.runner, cudagraph_mode=self.effective_cudagraph_mode,
                             decode_query_len=self.decode_query_len))

    def _decode_tiers(self) -> list[int] | None:
        """The query lengths the runner captures FULL decode graphs at (None: q alone)."""
        return None

    def dispatcher(self, capture_sizes: Sequence[int]) -> Dispatcher:
        s = self.serving
        return Dispatcher(self.runs_as(capture_sizes), cudagraph_mode=self.effective_cudagraph_mode,
                          decode_query_len=self.decode_query_len, max_num_seqs=s.max_num_seqs, runner=self.runner,
                          decode_query_lens=self._decode_tiers())

    def widest_sizes(self) -> tuple[int, ...]:
        """PR 50488's behaviour: the default grid with the ceiling lifted to the widest uniform decode batch
        (max_num_seqs x q), so every decode batch has a graph."""
        s, q = self.serving, self.decode_query_len
        top = min(s.max_num_seqs * q, s.max_num_batched_tokens)
        grid = default_capture_sizes(s.max_num_seqs, s.num_speculative_tokens, s.max_num_batched_tokens,
                                     max_cudagraph_capture_size=top).sizes
        decode = {n * q for n in request_count_grid(s.max_num_seqs, s.max_num_seqs) if n * q <= top}
        return tuple(sorted(set(grid) | decode | {top}))

    def rewrites_lists(self) -> bool:
        return v1_rewrite_applies(self.runner, self.effective_cudagraph_mode, self.decode_query_len)

    # ------------------------------------------------------------------ memory
    def kv_rule(self, *, total_memory_bytes: int, non_kv_cache_bytes: int, weights_bytes: Callable[[], int],
                required_kv_bytes: int, tensor_parallel_size: int, notes: list[str],
                pre_load_free_bytes: int | None = None,
                activation_peak_bytes: int | None = None, kv: Any = None) -> KvRule:
        s = self.serving
        if not s.estimate_cudagraph_memory:
            notes.append("estimate_cudagraph_memory: false (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0): vLLM "
                         "subtracts no graph memory from the KV cache, so the real capture must fit in the memory "
                         "it does not request")
        return KvRule(total_memory_bytes, s.gpu_memory_utilization, non_kv_cache_bytes, required_kv_bytes,
                      estimate_enabled=s.estimate_cudagraph_memory)

    def start_kv_bytes(self, kv_bytes_per_token: int) -> int:
        return start_kv_bytes(self.serving.max_model_len, kv_bytes_per_token)

    def kv_capacity(self, kv_available_bytes: int, kv_bytes_per_token: int) -> tuple[int, float]:
        return kv_capacity(kv_available_bytes, kv_bytes_per_token, self.serving.max_model_len)

    def estimate_bytes(self, costs: Sequence[GraphCost]) -> float:
        return estimate_bytes(costs, self.runner)

    # ------------------------------------------------------------------ what the cost model notes
    def profile_checks(self, metadata: dict[str, Any]) -> tuple[list[tuple[str, object, object, str]], list[str]]:
        return [("compiled", metadata.get("compiled"), not self.serving.enforce_eager,
                 "vLLM runs the compiled model unless serving.enforce_eager; profile with --no-compile only for "
                 "that")], []

    def lora_dp_notes(self, dispatcher: Any) -> list[str]:
        """How LoRA and data parallelism change what runs (both releases)."""
        s, notes = self.serving, []
        if s.lora is not None and dispatcher.cudagraph_mode != "NONE":
            cases = case_text(self.lora_cases(), s.lora.max_loras)
            notes.append(f"LoRA (max_loras {s.lora.max_loras}, rank {s.lora.max_lora_rank}): the {self.runner.upper()} "
                         f"runner captures every graph once per LoRA case, {cases}, and a step replays its active "
                         f"adapters' case")
        if s.speculative_schedule and s.data_parallel_size > 1:
            notes.append(f"vLLM drops speculative_schedule under data_parallel_size {s.data_parallel_size} "
                         f"(_maybe_disable_dynamic_sd_for_data_parallel: ranks could pick different K): every step "
                         f"drafts num_speculative_tokens={s.num_speculative_tokens}")
        return notes

    def setting_notes(self, dispatcher: Any) -> list[str]:
        s, notes = self.serving, self.lora_dp_notes(dispatcher)
        if dispatcher.cudagraph_mode != s.cudagraph_mode and not s.enforce_eager:
            notes.append(f"the {self.runner.upper()} runner uses cudagraph_mode {dispatcher.cudagraph_mode} here "
                         f"(dynamic speculative decoding drops its full graphs), not {s.cudagraph_mode}")
        if s.speculative_schedule and self.dynamic_schedule is None and s.data_parallel_size <= 1:
            notes.append(f"the {self.runner.upper()} runner drops speculative_schedule for method "
                         f"{s.speculative_method!r} (vLLM's _maybe_disable_dynamic_sd_for_v1): every step drafts "
                         f"num_speculative_tokens={s.num_speculative_tokens}")
        return notes

    def drafter_cost(self, profile: Profile, speculative: Any, dispatcher: Any, name: str,
                     notes: list[str]) -> DrafterCost:
        s = self.serving
        dynamic_ks = sorted({ql - 1 for ql in self.decode_query_lens()[1:]}) if self.dynamic_schedule else None
        return DrafterCost(
            profile, speculative.method, runner=self.runner, cudagraph_mode=dispatcher.cudagraph_mode,
            decode_mode=dispatcher.decode_mode, mixed_mode=dispatcher.mixed_mode,
            num_speculative_tokens=s.num_speculative_tokens, max_num_seqs=s.max_num_seqs,
            parallel_drafting=s.parallel_drafting, name=name, notes=notes, dynamic_ks=dynamic_ks)

    def drafter_sweep(self, method: str, candidates: Sequence[int]) -> DrafterSweep:
        """The runner's drafter graph modes (`drafter_graphs`) over the candidate list as it runs, and the widths its
        N-token passes pad to (`drafter_pass_widths`)."""
        s, mode = self.serving, self.effective_cudagraph_mode
        try:
            runs = sorted(self.runs_as(list(candidates)))
        except ValueError:  # a list V1 refuses: the candidates themselves are the best guess at what runs
            runs = sorted(candidates)
        modes: tuple[str, ...] = ()
        if mode != "NONE" and runs:
            graphs = drafter_graphs(method, runner=self.runner, capture_sizes=runs, cudagraph_mode=mode,
                                    num_speculative_tokens=s.num_speculative_tokens, max_num_seqs=s.max_num_seqs)
            modes = tuple(m.lower() for m in ("PIECEWISE", "FULL") if any(g.mode == m for g in graphs))
        widths = drafter_pass_widths(method, runner=self.runner, num_speculative_tokens=s.num_speculative_tokens,
                                     parallel_drafting=s.parallel_drafting, max_num_seqs=s.max_num_seqs,
                                     candidates=candidates, runs=runs)
        return DrafterSweep(self.runner, widths, modes)

    def eager_drafter_passes(self, method: str, request_counts: Sequence[int],
                             capture_sizes: Sequence[int]) -> list[EagerDrafterPasses]:
        """`tuner.engines.vllm.drafter.eager_drafter_passes` over the list as the runner runs it."""
        s = self.serving
        try:
            runs = list(self.runs_as(list(capture_sizes)))
        except ValueError:
            runs = []
        dense = [ql - 1 for ql in self.decode_query_lens()] if self.dynamic_schedule else None
        return eager_drafter_passes(
            method, runner=self.runner, request_counts=list(request_counts), capture_sizes=runs,
            cudagraph_mode=self.effective_cudagraph_mode, num_speculative_tokens=s.num_speculative_tokens,
            max_num_seqs=s.max_num_seqs, dense_schedule=dense, parallel_drafting=s.parallel_drafting)

    # ------------------------------------------------------------------ files to emit
    def render_files(self, capture_sizes: Sequence[int], deployment: Deployment, *, cudagraph_mode: str,
                     provenance: Provenance | None = None) -> dict[str, str]:
        """`compilation_config.json`, `vllm-serve.yaml` and `vllm-flags.txt`, the last two with the serving flags,
        the speculative config and the environment the tuning assumed; EmitError for a list the runner refuses to start
        with (V1's rewrite when speculating)."""
        if capture_sizes and cudagraph_mode != "NONE":
            try:
                self.runs_as(capture_sizes)
            except ValueError as exc:
                raise EmitError(str(exc)) from None
        return render_files(capture_sizes, self.serve_settings(deployment), cudagraph_mode=cudagraph_mode,
                            provenance=provenance)

    def serve_settings(self, deployment: Deployment) -> ServeSettings:
        """What `vllm serve` must be given besides the compilation config; a checkpoint the workload does not name
        stands as a placeholder vLLM refuses, with a note saying what to put there."""
        s, notes = self.serving, []
        model = deployment.checkpoint
        if model is None:
            model = placeholder("CHECKPOINT", "model.name")
            notes.append(f"model: {model} stands for the served checkpoint (vLLM refuses it as it is)")
        pin = deployment.kv_cache_memory_bytes
        if pin is not None:
            notes.append(f"kv-cache-memory-bytes: {pin} ({pin / (1 << 30):.3f} GiB per rank) pins the KV cache at what "
                         f"vLLM's engine measured for this list (cgtune validate --pin-kv); {self.pin_note}")
        return ServeSettings(
            model=model, dtype=deployment.dtype, tensor_parallel_size=deployment.tensor_parallel_size,
            max_num_seqs=s.max_num_seqs, max_num_batched_tokens=s.max_num_batched_tokens,
            max_model_len=s.max_model_len, gpu_memory_utilization=s.gpu_memory_utilization,
            enforce_eager=s.enforce_eager, speculative_config=self._speculative_config(deployment, notes),
            environment=self._environment(), notes=tuple(notes), kv_cache_memory_bytes=pin,
            performance_mode=s.performance_mode, extensible_kv_cache=self._extensible_flag,
            data_parallel_size=s.data_parallel_size, lora=s.lora)

    @property
    def _extensible_flag(self) -> bool | None:
        """The extensible-KV-cache flag the files write (0.33 has none)."""
        return None

    @property
    def pin_note(self) -> str:
        """What a pinned KV cache changes at this release's start-up, in words."""
        return ("vLLM then skips its memory profiling and its graph-memory estimate, so the KV cache no longer rides on "
                "that estimate; gpu_memory_utilization no longer sizes it")

    def _speculative_config(self, deployment: Deployment, notes: list[str]) -> dict[str, object] | None:
        """`--speculative-config` as tuned: method, num_speculative_tokens, the draft checkpoint, parallel drafting
        and the dynamic schedule. Without it vLLM would run q = 1."""
        s = self.serving
        if s.num_speculative_tokens <= 0:
            return None
        method = s.speculative_method
        config: dict[str, object] = {"method": method or placeholder("SPECULATIVE METHOD", "speculative.method",
                                                                     "vLLM's name for it"),
                                     "num_speculative_tokens": s.num_speculative_tokens}
        if method is None:
            notes.append(f"speculative-config.method: {config['method']} stands for the method that drafts the "
                         f"{s.num_speculative_tokens} tokens (vLLM refuses it as it is)")
        draft = deployment.draft_model(str(method), needed=method in NEEDS_DRAFT_CHECKPOINT,
                                       key="speculative-config.model",
                                       why=f"vLLM refuses {method} without one, and this value as it is",
                                       notes=notes)
        if draft is not None:
            config["model"] = draft
        if s.parallel_drafting:
            config["parallel_drafting"] = True
        if s.speculative_schedule:
            config["num_speculative_tokens_per_batch_size"] = [list(e) for e in s.speculative_schedule]
        return config

    def _environment(self) -> tuple[tuple[str, str, str], ...]:
        """Environment variables vLLM must see to run as modelled: the runner where the workload pins one vLLM would
        not pick, and no graph-memory estimate where the workload turns it off."""
        s, env = self.serving, []
        vllm_pick = resolve_model_runner("auto", s.speculative_method, parallel_drafting=s.parallel_drafting)
        if self.runner != vllm_pick:
            env.append(("VLLM_USE_V2_MODEL_RUNNER", "1" if self.runner == "v2" else "0",
                        f"the workload pins model_runner {self.runner}; vLLM 0.33 would run {vllm_pick.upper()}"))
        if not s.estimate_cudagraph_memory:
            env.append(("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "0",
                        "estimate_cudagraph_memory: false (vLLM subtracts no graph-memory estimate from the KV "
                        "cache)"))
        return tuple(env)

    def measured_capture_config(self, widths: Sequence[int]) -> dict[str, object]:
        """The compilation-config fields that make vLLM capture graphs at every width a profile times: the widths as
        the capture list (mixed graphs at each, FULL decode graphs at the uniform ones)."""
        return {"cudagraph_capture_sizes": sorted(set(widths))}

    def memory_log_lines(self, **figures: Any) -> list[str]:
        """The memory lines vLLM logs at start-up for a list with these figures (`tuner.engines.vllm.log_lines`)."""
        figures.pop("kv_capacity_bytes", None)
        figures.pop("capture_s", None)  # 0.33's predicted lines stop before the capture line
        return memory_lines(runner=self.runner, **figures)

    @property
    def estimate_line_note(self) -> str:
        """Where the runner logs its graph-memory estimate, in words."""
        return estimate_line_note(self.runner)

    # ------------------------------------------------------------------ its start-up log, read back (cgtune check)
    def read_compilation_config(self, config: dict[str, Any]) -> tuple[int, ...]:
        """The list a run's compilation_config.json gives vLLM, as cgtune carries it (KeyError, TypeError or
        ValueError for a file of another shape)."""
        return tuple(int(s) for s in config["cudagraph_capture_sizes"])

    def config_lists(self, capture_sizes: Sequence[int]) -> list[tuple[str, tuple[int, ...]]]:
        """A list as vLLM's compilation config names it: (field, sizes) for each list vLLM takes."""
        return [("cudagraph_capture_sizes", tuple(capture_sizes))]

    def kv_line_figure(self, kv_available_bytes: float, *, requested_bytes: float,
                       non_kv_cache_bytes: float) -> tuple[str, float]:
        """What vLLM's "Available KV cache memory" line shows for a list whose KV cache is `kv_available_bytes`, as
        (cgtune check's name for the figure, bytes): vLLM 0.33 logs the KV cache it sized, the estimate subtracted."""
        return "kv_available_bytes", kv_available_bytes

    @property
    def no_estimate_note(self) -> str:
        """Why `cgtune check` compares no graph-memory estimate, where vLLM made or subtracted none."""
        return ("the estimate is off (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0): vLLM subtracted none, so "
                "vllm_graph_estimate_bytes is not compared")

    def estimate_refusal(self, *, warned_disabled: bool, logged_estimate: bool) -> str | None:
        """Why a start-up log's graph-memory estimate is not this deployment's (None: it is): vLLM warns when the
        estimate is switched off, and the workload says whether it is (`logged_estimate`: the log holds an estimate's
        line; 0.33 makes one either way)."""
        enabled = self.serving.estimate_cudagraph_memory
        if warned_disabled == enabled:
            return (f"vLLM ran with VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS={0 if warned_disabled else 1}, the run's "
                    f"workload has estimate_cudagraph_memory: {str(enabled).lower()}")
        return None

    @property
    def release_words(self) -> str:
        """`vLLM 0.34 (cgtune's default, the newest release it speaks, as no vLLM is installed here)`."""
        why = self.serving.vllm_version_why
        return f"vLLM {self.version}" + (f" ({why})" if why else "")

    def serve_line(self, out_dir: Path, checkpoint: str | None) -> str | None:
        line = flag_file_line(out_dir / FLAGS_FILE)
        if not line:
            return None
        env = env_prefix(self._environment())
        return f"{env}vllm serve {shlex.quote(checkpoint or placeholder('CHECKPOINT', 'model.name'))} {line}"

    # ------------------------------------------------------------------ words
    def list_label(self, name: str) -> str:
        return _LABELS.get(name, name)


class VllmV1Engine(VllmEngine):
    """The V1 model runner: it rewrites an explicit list when speculating, captures FULL decode graphs at q only, and
    estimates graph memory per mode in one profiling pool."""

    runner = "v1"

    def estimate_form(self, dispatcher: Any, estimate_enabled: bool) -> str:
        return "per_mode" if estimate_enabled else "real"

    def offered_widths(self, widths: list[int], dispatcher: Any, notes: list[str]) -> list[int]:
        """V1 rounds every size up to a multiple of q: the lists it runs are lists of multiples of q. Above the widest
        decode batch a size would only serve mixed steps, and its PIECEWISE graph would become the estimate's first
        sample next to a smaller FULL one; the search stays at or below it (see exact.py)."""
        if not self.rewrites_lists():
            return widths
        q, limit = self.decode_query_len, self.decode_query_len * self.serving.max_num_seqs
        widths = [w for w in widths if w % q == 0]
        note = f"the V1 runner rewrites lists when speculating: the search offers multiples of q = {q}"
        if dispatcher.separate_decode and dispatcher.mixed_mode != "NONE":
            widths = [w for w in widths if w <= limit]
            note += f" up to the widest decode batch ({limit} tokens; wider ones would serve mixed steps only)"
        notes.append(note + ", lists V1 runs as written")
        return widths


class VllmV2Engine(VllmEngine):
    """The V2 model runner: it keeps a written list, captures FULL decode graphs per dynamic-schedule tier, and
    estimates graph memory from the real capture with the FULL graphs extrapolated."""

    runner = "v2"

    def _decode_tiers(self) -> list[int] | None:
        return sorted(set(self.decode_query_lens()[1:]))

    def estimate_form(self, dispatcher: Any, estimate_enabled: bool) -> str:
        if not estimate_enabled or dispatcher.cudagraph_mode in ("PIECEWISE", "NONE"):
            return "real"  # the estimate is 0, or the real capture itself
        return "windows" if dispatcher.separate_decode else "per_graph"

    def profile_notes(self, dispatcher: Any, metadata: dict[str, Any], name: str) -> list[str]:
        if (dispatcher.separate_decode and dispatcher.mixed_mode == "PIECEWISE"
                and metadata.get("capture_order") != "piecewise-then-full"):
            return [f"{name} captured its full graphs without piecewise graphs in the pool: vLLM V2's FULL samples "
                    f"(taken after the PIECEWISE graphs) are stood in for by the full rows' capture deltas"]
        return []


_BY_RUNNER: dict[str, type[VllmEngine]] = {"v1": VllmV1Engine, "v2": VllmV2Engine}
