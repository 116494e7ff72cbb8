"""The Engine interface: every question cgtune asks of the engine a workload deploys on, for one serving
configuration; each engine's rulebook answers it (vLLM's once per model runner). The cost model, exact solver,
search, comparison, report, plots, validation and commands ask this object, and never the engine's name or runner.

Lists inside cgtune are token widths (what a profile measures); an engine that counts its graphs in requests converts
at its own edge (`in_engine_unit`, its files and its words)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from tuner.engines.serving import ServingConfig
from tuner.engines.vllm.defaults import CaptureDefaults
from tuner.engines.vllm.dispatch import Dispatch
from tuner.engines.vllm.drafter import drafter_pass_widths
from tuner.engines.vllm.memory import GraphCost, pool_bytes
from tuner.fields import FieldReader
from tuner.steps import decode_steps_by_width

if TYPE_CHECKING:
    from pathlib import Path

    from tuner.engines.vllm.drafter import EagerDrafterPasses
    from tuner.engines.vllm.drafter_cost import DrafterCost
    from tuner.engines.vllm.emit import Provenance
    from tuner.profile.table import Profile

__all__ = ["LIST_LABELS", "Deployment", "DrafterSweep", "Engine", "GraphDispatcher", "KvFacts", "KvRule", "Speculation",
           "flag_file_line", "placeholder"]

LIST_LABELS = {"tuned": "tuned", "compact": "compact (least graph memory within the tolerance)",
               "exact": "exact solver", "ideal": "ideal (every width, memory ignored)"}
"""How reports and plots name the comparison's lists every engine has; an engine names its own default, widest and
peer rows (`Engine.list_label`)."""

class GraphDispatcher(Protocol):
    """The graphs one list makes the engine capture and the graph (or none) each step replays; vLLM's
    `tuner.engines.vllm.dispatch.Dispatcher` and `tuner.engines.request_engine.RequestDispatcher` are shaped alike."""

    cudagraph_mode: str
    decode_mode: str
    mixed_mode: str
    separate_decode: bool
    capture_sizes: list[int]
    decode_graph_sizes: list[int]
    mixed_graph_sizes: list[int]
    decode_query_lens: list[int]
    """The query lengths FULL decode graphs are captured at (vLLM V2: a dynamic schedule's tiers; else q)."""
    exact: bool
    """Only a decode step of exactly a captured width replays it (TensorRT-LLM without padding)."""

    @property
    def decode_graphs(self) -> list[tuple[int, int]]: ...

    @property
    def full_pad_sizes(self) -> list[int]: ...

    def graphs(self) -> list[tuple[str, int]]: ...

    def dispatch(self, num_tokens: int, *, uniform_decode: bool = False, query_len: int | None = None
                 ) -> Dispatch: ...

    def uniform_token_counts(self, query_lens: np.ndarray, uniform: np.ndarray) -> np.ndarray: ...

    def dispatch_steps(self, widths: np.ndarray, utc: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`dispatch` of many steps (their uniform token counts, 0: none): (runtime mode, padded width (0: eager),
        the FULL pad width a decode graph was looked for at (0: none))."""
        ...


class KvRule(Protocol):
    """How an engine sizes its KV cache around the graphs (`KvRule`, `SglangKvRule`, `TrtllmKvRule` in the rulebooks'
    memory modules)."""

    total_memory_bytes: int
    required_kv_bytes: int
    estimate_enabled: bool

    @property
    def requested_bytes(self) -> int: ...

    @property
    def non_kv_cache_bytes(self) -> int: ...

    def kv_available_bytes(self, estimate_bytes: float = 0.0, *, real_bytes: float = 0.0, top: int = 0) -> int: ...

    def capture_headroom_bytes(self, estimate_bytes: float, real_pool_bytes: float, *, top: int = 0) -> int: ...

    def applied_estimate(self, profiled_bytes: int) -> int: ...

    def graph_budget(self, top: int = 0) -> tuple[int, str]: ...

    def real_budget_bytes(self, top: int = 0) -> int:
        """Most real graph memory a list topped at `top` (requests) may take: asked of a rule whose engine's estimate
        form is `none`."""
        ...


@dataclass(frozen=True)
class Deployment:
    """What the workload says about the deployment beyond its serving section, which an engine's files must carry for
    the engine to run what was tuned."""

    checkpoint: str | None
    """The served model (a Hugging Face id or a path); None: the workload names none."""
    draft_checkpoint: str | None
    """The draft model (`speculative.model`); None: the workload names none."""
    dtype: str
    """The dtype the profile measured (the workload's model.dtype)."""
    tensor_parallel_size: int
    """Ranks the model is sharded over."""
    kv_cache_memory_bytes: int | None = None
    """The KV cache pinned per rank (vLLM's `--kv-cache-memory-bytes`), from what the engine measured for the shipped
    list (`cgtune validate --pin-kv`); None: the engine sizes it at start-up by its own rule."""

    def draft_model(self, method: str, *, needed: bool, key: str, why: str, notes: list[str]) -> str | None:
        """The draft checkpoint an engine's files name for `method` (its own name for it): the workload's; where it
        names none and the engine `needed` one, a placeholder the engine refuses, with a note under `key` (the
        engine's setting) saying what stands there and `why` it must be set; else None (the engine loads no draft
        model, or finds its own)."""
        if self.draft_checkpoint is not None or not needed:
            return self.draft_checkpoint
        value = placeholder(f"{method} DRAFT CHECKPOINT", "speculative.model")
        notes.append(f"{key}: {value} stands for the {method} draft model ({why})")
        return value


def placeholder(what: str, where: str, put: str = "its Hugging Face id or path") -> str:
    """A value that stands where a setting the workload does not give must go (a checkpoint, by default) and that
    every engine refuses (angle brackets and spaces are no Hugging Face id, no path that exists, no method name):
    `<WHAT: set WHERE in the workload, or put PUT here>`, never a silent omission."""
    return f"<{what}: set {where} in the workload, or put {put} here>"


def flag_file_line(path: Path) -> str | None:
    """The first line of a flag file that is not a comment (None when the file or the line is missing)."""
    if not path.is_file():
        return None
    return next((ln for ln in path.read_text().splitlines() if ln and not ln.startswith("#")), None)


@dataclass(frozen=True)
class KvFacts:
    """What the workload and the profile say of the KV cache's shape, for an engine that sizes it in whole blocks of
    its own layout."""

    layers: tuple[tuple[int, int, int, int], ...] = ()
    """`(attention layers, KV heads on one rank, head_dim, bytes per element)` of each group of identical layers: the
    target's, then the drafter's."""
    bytes_per_token: int | None = None
    """The KV bytes per token the model uses (a profile measured through the engine records its own)."""
    torch_reserve_growth_bytes: int | None = None
    """How far the profile's sizing step grew torch's reserved memory beyond what it kept (None: not measured)."""
    recorded: Mapping[str, Any] | None = None
    """The engine's own layout figures, where the profile measured through the engine recorded them (vLLM 0.34: its
    extensible KV cache's segment strides, pool bytes per block, granule, transient peak and reserve growth)."""


@dataclass(frozen=True)
class DrafterSweep:
    """What a profile sweep measures of the workload's draft model, by the engine's rules."""

    runner: str
    """The vLLM runner whose capture order the sweep follows (`v1` or `v2`)."""
    pass_widths: list[int]
    """Widths beyond the sweep's own that the drafter's N-token passes pad to."""
    graph_modes: tuple[str, ...]
    """Graph modes the drafter is captured in (`piecewise`, `full`, in capture order); empty: eager only."""


@dataclass(frozen=True)
class Speculation:
    """The workload's speculative settings as the engine resolves them."""

    method: str | None
    """The engine's own name for the speculative method (vLLM's method, SGLang's algorithm, TensorRT-LLM's
    decoding_type); None without speculation."""
    tokens_per_request: int
    """Tokens one request puts in a decode step (1 + draft tokens, or the engine's own count)."""


class Engine(ABC):
    """One engine's answers for one serving configuration (`serving`); `tuner.engines.registry` maps a workload's
    `engine:` to the class, and `bind` picks the implementation (vLLM: the model runner's)."""

    name: ClassVar[str]
    """The workload's `engine:` value."""
    label: ClassVar[str]
    """How reports and commands name the engine."""
    unit: ClassVar[str]
    """What the engine's lists count: `tokens` (vLLM) or `requests` (a graph of bs requests holds bs x q tokens)."""
    files: ClassVar[tuple[str, ...]]
    """The files a run directory holds for the engine's tuned list."""
    note_files: ClassVar[tuple[str, ...]] = ()
    """Files written beside them that carry notes a file's own format cannot (vLLM: the compilation config JSON's),
    replaced and removed with them."""
    report_words: ClassVar[str]
    """The module that words a run's report, summary and console lines for the engine's unit and rules
    (`tuner.report.vllm_words`, `tuner.report.request_words`); it asks the engine for the words that are its own."""
    exports_vllm_metrics: ClassVar[bool] = False
    """The engine's server exports vLLM's step-width histogram (`vllm:iteration_tokens_total`), which `cgtune workload
    buckets` and `from-metrics` read."""
    makes_estimate: ClassVar[bool] = False
    """The engine sizes its KV cache from a graph-memory estimate made before the real capture."""
    peer_rows: ClassVar[tuple[str, ...]] = ()
    """Other engines' default lists the comparison evaluates beside this one's (keys of
    `tuner.decision.compare.PEER_LISTS`)."""
    runner: str = "v2"
    """The model runner that runs, in vLLM's names (`v1` or `v2`); an engine without a runner choice has one, v2."""
    version: ClassVar[str | None] = None
    """The engine release whose rules this class answers with, where cgtune speaks several (vLLM: 0.33, 0.34)."""
    split_lists: ClassVar[bool] = False
    """The engine captures two lists (vLLM 0.34: decode graphs by request count, prefill graphs by tokens), carried as
    one list of keys (`tuner.engines.vllm.v034.dispatch.split_keys`) and solved by `tuner.search.exact_split`."""

    def __init__(self, serving: ServingConfig) -> None:
        self.serving = serving

    @classmethod
    def bind(cls, serving: ServingConfig) -> Engine:
        """The engine object for a serving configuration (vLLM: its model runner's class)."""
        return cls(serving)

    # ------------------------------------------------------------------ parsing and speculative resolution
    @classmethod
    @abstractmethod
    def parse_serving(cls, r: FieldReader, *, speculative_method: str | None,
                      parallel_drafting: bool) -> ServingConfig:
        """The workload's `serving:` section in the engine's own words (WorkloadError naming the field)."""

    @classmethod
    def field_name(cls, name: str) -> str:
        """The engine's own name for the serving field cgtune keeps as `name` (vLLM's), for errors and words."""
        return name

    @property
    @abstractmethod
    def speculation(self) -> Speculation:
        """The speculative settings as the engine resolved them."""

    @property
    def runner_reason(self) -> str:
        """Why that runner, in a few words."""
        return f"{self.label} has no runner choice"

    # ------------------------------------------------------------------ the steps it runs
    @property
    def decode_query_len(self) -> int:
        """q: tokens per request in a uniform decode step (and in a decode graph)."""
        return self.serving.decode_query_len

    def decode_query_lens(self) -> list[int]:
        """Tokens per request in a decode step of n requests (index n; index 0 unused)."""
        return [self.decode_query_len] * (self.serving.max_num_seqs + 1)

    def decode_step(self, num_tokens: int) -> tuple[int, int] | None:
        """`(requests, query length)` of the uniform decode step `num_tokens` wide (the fewest requests where several
        fit), None when no decode step of max_num_seqs requests or fewer is that wide."""
        return self._decode_steps.get(num_tokens)

    @cached_property
    def _decode_steps(self) -> dict[int, tuple[int, int]]:
        return decode_steps_by_width(self.decode_query_lens())

    def decode_widths(self) -> list[int]:
        """Every uniform decode width the engine may capture a graph for, within the token budget."""
        s = self.serving
        return [n * self.decode_query_len for n in range(1, s.max_num_seqs + 1)
                if n * self.decode_query_len <= s.max_num_batched_tokens]

    @property
    def dynamic_schedule(self) -> tuple[tuple[int, int, int], ...] | None:
        """The dynamic speculative schedule that runs (vLLM's); None without one."""
        return None

    def lora_cases(self) -> tuple[int, ...]:
        """The LoRA cases (active-adapter counts, 0: none) every graph is captured once for, in the order one width's
        graphs enter the pool; (0,): no LoRA."""
        return (0,)

    def lora_dispatch(self, active: np.ndarray) -> np.ndarray:
        """The LoRA case each step dispatches to for its count of active adapters (-1: no graph holds it)."""
        return np.zeros(len(active), dtype=np.int64)

    @property
    def data_parallel_size(self) -> int:
        """Data-parallel ranks that agree on every step's padded width (1: none)."""
        return 1

    def dispatch_ranks(self, dispatcher: GraphDispatcher, widths: np.ndarray, utc: np.ndarray, own_tokens: np.ndarray,
                       own_utc: np.ndarray, widest_utc: np.ndarray, widest_tokens: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The DP ranks' agreed dispatch of joint draws (the agreed step; this rank's own; each kind of step's widest
        rank): (mode, padded width (0: eager), the width an eager step runs at)."""
        raise NotImplementedError(f"{self.label}'s data-parallel agreement is not modelled")

    @property
    @abstractmethod
    def effective_cudagraph_mode(self) -> str:
        """The cudagraph mode the engine really uses (NONE: no graphs)."""

    def config_refusal(self, *, as_flags: bool = False) -> str | None:
        """The one line the engine refuses this serving configuration with at start-up (the field, its value and the
        engine's own reason), None where it starts; `as_flags`: the field named as the command-line flag that gave
        it (`--max-num-seqs`), not as the workload's field."""
        return None

    # ------------------------------------------------------------------ lists and their graphs
    @abstractmethod
    def defaults(self, *, gpu_memory_mib: float | None = None) -> CaptureDefaults:
        """The engine's default list (token widths) and the decode widths it leaves eager; `gpu_memory_mib`: the
        device's, for defaults that read it when the workload does not say."""

    @abstractmethod
    def runs_as(self, capture_sizes: Sequence[int]) -> tuple[int, ...]:
        """The list the engine really captures for a list written into its config (token widths in and out);
        ValueError when the engine refuses it."""

    @abstractmethod
    def dispatcher(self, capture_sizes: Sequence[int]) -> GraphDispatcher:
        """How the engine dispatches steps with this list (as it runs it)."""

    def graphs(self, runs: Sequence[int]) -> list[tuple[str, int]]:
        """Every graph the engine captures for a list as it runs, in capture order (one shared pool)."""
        return self.dispatcher(runs).graphs()

    @abstractmethod
    def widest_sizes(self) -> tuple[int, ...]:
        """The engine's own grid lifted to its widest decode batch (so every decode batch gets a graph)."""

    def normalise(self, capture_sizes: Iterable[int]) -> tuple[int, ...]:
        """A list as the engine's config keeps it: sizes within the token budget, deduplicated and sorted."""
        return tuple(sorted({int(s) for s in capture_sizes if 1 <= int(s) <= self.serving.max_num_batched_tokens}))

    def probe_sizes(self) -> Sequence[int]:
        """A list whose dispatcher shows the engine's modes and rules for steps in bulk: the widest size."""
        return [self.serving.max_num_batched_tokens]

    def every_key(self, top_width: int) -> Sequence[int]:
        """Every size a list could hold for steps up to `top_width` tokens (the ideal list: a graph for each)."""
        return range(1, top_width + 1)

    def key_widths(self, keys: Sequence[int]) -> list[int]:
        """The token widths of the graphs a list's keys make, ascending (a list of token widths: its own)."""
        return sorted(set(keys))

    def added_above(self, default: Sequence[int], added: Sequence[int]) -> list[int]:
        """The sizes a tuned list adds above the default list's max (what the report weighs one by one)."""
        top = max(default, default=0)
        return [w for w in sorted(added) if w > top]

    def graph_kinds(self, capture_sizes: Sequence[int]) -> list[tuple[str, str, list[int]]]:
        """The graphs a list makes, by what they are, for plots and tables: `(what, graph mode, token widths)` per
        kind the engine captures (one list: `graphs`, its sizes as the engine runs them, in its decode graphs' mode
        where it has them); [] with no graphs. Every user surface draws and marks a list through this, never through
        its keys."""
        d = self.dispatcher(capture_sizes)
        if d.cudagraph_mode == "NONE":
            return []
        widths = sorted(set(d.capture_sizes))  # one list: its sizes as the engine runs them
        mode = "FULL" if d.decode_mode == "FULL" and d.decode_graph_sizes else (
            d.mixed_mode if d.mixed_mode != "NONE" else d.decode_mode)
        return [("graphs", mode, widths)] if widths else []

    def key_text(self, key: int) -> str:
        """One size of a list, as a report names it (a token width: the number)."""
        return str(key)

    def tops_text(self, capture_sizes: Sequence[int]) -> str:
        """A list's max, as a report names it (`512`)."""
        return str(max(capture_sizes, default=0))

    def list_text(self, capture_sizes: Sequence[int], limit: int | None = 24) -> str:
        """A list as reports print it: `1, 2, 4, ... (51 sizes)`, cut after `limit` sizes; `(none)` when empty; whole,
        as a list (`[1, 2, 4]`), with no limit."""
        if limit is None:
            return str(list(capture_sizes))
        if not capture_sizes:
            return "(none)"
        return ", ".join(map(str, capture_sizes[:limit])) + (
            f", ... ({len(capture_sizes)} sizes)" if len(capture_sizes) > limit else "")

    def list_shape(self, capture_sizes: Sequence[int], *, short: bool = False) -> str:
        """A list in a few words: `51 graphs, max 512` (`short`: `51 graphs`)."""
        if short:
            return f"{len(capture_sizes)} graphs"
        return f"{len(capture_sizes)} graphs, max {max(capture_sizes) if capture_sizes else 0}"

    def list_max(self, capture_sizes: Sequence[int]) -> int:
        """The widest graph a list makes, in tokens (0: none)."""
        return max(self.key_widths(capture_sizes), default=0)

    def in_engine_unit(self, capture_sizes: Sequence[int]) -> list[int]:
        """A list of token widths in the engine's unit (token engines: unchanged)."""
        return sorted(set(capture_sizes))

    def rewrites_lists(self) -> bool:
        """The runner rewrites a written list (vLLM V1 when speculating): the search offers only lists it keeps."""
        return False

    def offered_widths(self, widths: list[int], dispatcher: GraphDispatcher, notes: list[str]) -> list[int]:
        """The measured widths worth offering the search (the engine's rules may drop some; a note says why)."""
        return widths

    # ------------------------------------------------------------------ memory
    @abstractmethod
    def kv_rule(self, *, total_memory_bytes: int, non_kv_cache_bytes: int, weights_bytes: Callable[[], int],
                required_kv_bytes: int, tensor_parallel_size: int, notes: list[str],
                pre_load_free_bytes: int | None = None,
                activation_peak_bytes: int | None = None, kv: KvFacts | None = None) -> KvRule:
        """How the engine sizes its KV cache on this device (`weights_bytes()`: the weights on one rank;
        `pre_load_free_bytes`: free device memory before the weights load, `activation_peak_bytes`: the transient
        activation peak of the profile's widest step, when the profile measured them; `kv`: the KV cache's shape, for
        a rule that counts whole blocks)."""

    def start_kv_bytes(self, kv_bytes_per_token: int) -> int:
        """The least KV memory the engine refuses to start below, whatever the workload asks (0: none)."""
        return 0

    def kv_capacity(self, kv_available_bytes: int, kv_bytes_per_token: int) -> tuple[int, float]:
        """(tokens the KV cache holds, max_model_len requests it holds at once)."""
        tokens = max(0, kv_available_bytes) // kv_bytes_per_token
        return tokens, tokens / self.serving.max_model_len

    def estimate_bytes(self, costs: Sequence[GraphCost]) -> float:
        """The graph-memory figure the engine's KV rule charges for graphs in capture order: its estimate, or the real
        pool where it makes none."""
        return self.pool_bytes(costs)

    def pool_bytes(self, costs: Sequence[GraphCost]) -> float:
        """The real pool of graphs captured in this order (`tuner.engines.vllm.memory.pool_bytes`: the first one's
        standalone footprint, every later one's delta, each captured no wider than those before it)."""
        return pool_bytes(costs)

    def estimate_form(self, dispatcher: GraphDispatcher, estimate_enabled: bool) -> str:
        """How the engine's graph-memory estimate counts a list's graphs, which is the exact solver's memory
        constraint: `none`, no estimate, the real pool counts against a budget that may move with the list's max
        (`KvRule.real_budget_bytes`; SGLang, TensorRT-LLM); `real`, the estimate is the real pool, or 0; `windows`,
        per FULL decode window the first graph plus (n - 1) times the second, other graphs at their real size (vLLM
        V2 with separate decode graphs); `per_graph`, first plus (n - 1) times the second over every graph of the
        list (vLLM V2 FULL); `per_mode`, that sum per graph mode in one profiling pool (vLLM V1)."""
        return "none"

    # ------------------------------------------------------------------ what the cost model notes
    def profile_checks(self, metadata: dict[str, Any]) -> tuple[list[tuple[str, object, object, str]], list[str]]:
        """Engine-specific `(what, profile value, workload value, hint)` checks of a profile against the workload,
        and notes on what the profile stands in for."""
        return [], [f"{self.name} runs its own kernels: the profile's "
                    f"{'compiled' if metadata.get('compiled') else 'eager'} step stands in for them"]

    def setting_notes(self, dispatcher: GraphDispatcher) -> list[str]:
        """Notes on how the engine resolves the workload's settings into what runs (a mode or schedule it drops)."""
        return []

    def profile_notes(self, dispatcher: GraphDispatcher, metadata: dict[str, Any], name: str) -> list[str]:
        """Notes on what the profile `name` (its metadata) stands in for under the engine's capture rules."""
        return []

    def drafter_cost(self, profile: Profile, speculative: Any, dispatcher: GraphDispatcher, name: str,
                     notes: list[str]) -> DrafterCost | None:
        """The draft model's cost by the engine's rules (None, with a note, where they are not modelled)."""
        notes.append(f"{self.name}'s drafter graphs and passes are not modelled (vLLM's rules only); the drafter's "
                     f"weights and KV layers are counted")
        return None

    def drafter_sweep(self, method: str, candidates: Sequence[int]) -> DrafterSweep:
        """What a profile sweep over `candidates` measures of the draft model. An engine whose drafter is not modelled
        has it measured eagerly, at the widths vLLM V2's passes would run at (its rows stand in for nothing)."""
        s = self.serving
        widths = drafter_pass_widths(method, runner=self.runner, num_speculative_tokens=s.num_speculative_tokens,
                                     parallel_drafting=s.parallel_drafting, max_num_seqs=s.max_num_seqs,
                                     candidates=candidates, runs=candidates)
        return DrafterSweep(self.runner, widths, ())

    def eager_drafter_passes(self, method: str, request_counts: Sequence[int],
                             capture_sizes: Sequence[int]) -> list[EagerDrafterPasses]:
        """The draft model's passes that run without a graph over decode steps of `request_counts` requests under a
        written list, one entry per pass role ([] where the engine's drafter is not modelled)."""
        return []

    # ------------------------------------------------------------------ files to emit
    @abstractmethod
    def render_files(self, capture_sizes: Sequence[int], deployment: Deployment, *, cudagraph_mode: str,
                     provenance: Provenance | None = None) -> dict[str, str]:
        """File name -> text of the engine's files for a tuned list (token widths): everything the tuning assumed that
        changes what the engine runs (serving flags, speculative settings, the environment), each file checked by the
        engine's emitter first (a ValueError, one line, for a list the engine would change or reject)."""

    def serve_line(self, out_dir: Path, checkpoint: str | None) -> str | None:
        """The command line, shell-quoted, that serves the model with the files written into `out_dir` (None: none to
        print)."""
        return None

    # ------------------------------------------------------------------ words
    @property
    def release_words(self) -> str | None:
        """The engine release the deployment runs and why that one (`vLLM 0.34, cgtune's default, ...`), as every
        emitted file and the search's console say it; None where the engine has one release cgtune speaks."""
        return None

    @property
    def default_name(self) -> str:
        """`vLLM's default`: the engine's default list in sentences."""
        return f"{self.label}'s default"

    def list_label(self, name: str) -> str:
        """A comparison list's name in reports and plots (`default`, `tuned`, `widest`, ...)."""
        return LIST_LABELS.get(name, name)
