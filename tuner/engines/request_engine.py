"""What every engine that counts its CUDA graphs in requests shares (SGLang, TensorRT-LLM, and any engine like them):
its own names for the serving fields, its default and captured lists turned into token widths, and its decode-graph
dispatch shaped like vLLM's. A graph of bs requests holds bs x tokens-per-request tokens; mixed and prefill steps
run without a graph. Each such engine supplies only its rules, in requests."""

from __future__ import annotations

import bisect
from abc import abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from tuner.engines.engine import Deployment, Engine, Speculation
from tuner.engines.serving import VLLM_ONLY_FIELDS, ServingConfig, read_serving
from tuner.engines.vllm.defaults import CaptureDefaults
from tuner.engines.vllm.dispatch import Dispatch, dispatch_steps
from tuner.fields import FieldReader, WorkloadError

if TYPE_CHECKING:
    from tuner.engines.vllm.emit import Provenance

__all__ = ["PaddedRule", "RequestDispatcher", "RequestEngine", "RequestRule", "requests_of"]


def requests_of(sizes: Sequence[int], tokens_per_request: int) -> list[int]:
    """Token widths as batch sizes (a width between two multiples belongs to the next batch size up)."""
    return sorted({-(-int(s) // tokens_per_request) for s in sizes if s >= 1})


class RequestRule(Protocol):
    """An engine rulebook's decode-graph dispatch in requests (`tuner.engines.sglang.Dispatcher`,
    `tuner.engines.trtllm.Dispatcher`)."""

    def dispatch(self, batch_size: int) -> Any: ...

    def graph_widths(self) -> list[int]: ...


@dataclass(frozen=True)
class PaddedDispatch:
    """What a decode batch runs under `PaddedRule`."""

    num_tokens: int | None
    """Token width of the graph replayed; None when eager."""

    @property
    def eager(self) -> bool:
        return self.num_tokens is None


class PaddedRule:
    """A decode batch replays the smallest captured batch size at or above it, and runs eager above the largest."""

    def __init__(self, batch_sizes: Sequence[int], tokens_per_request: int) -> None:
        self.batch_sizes = sorted({int(b) for b in batch_sizes})
        self.tokens_per_request = tokens_per_request

    def graph_widths(self) -> list[int]:
        return [b * self.tokens_per_request for b in self.batch_sizes]

    def dispatch(self, batch_size: int) -> PaddedDispatch:
        i = bisect.bisect_left(self.batch_sizes, batch_size)
        return PaddedDispatch(self.batch_sizes[i] * self.tokens_per_request if i < len(self.batch_sizes) else None)


class RequestDispatcher:
    """An engine's decode-graph dispatch (its rulebook's, in requests) in token widths, shaped like
    tuner.engines.vllm.dispatch.Dispatcher (FULL decode graphs only; mixed and prefill steps run without them): a
    uniform decode step of T tokens is a batch of ceil(T / tokens per request) requests, and replays the graph the
    engine picks for that batch, or runs eager."""

    cudagraph_mode = "FULL_DECODE_ONLY"
    decode_mode = "FULL"
    mixed_mode = "NONE"
    separate_decode = True

    def __init__(self, rule: RequestRule, tokens_per_request: int, *, exact: bool = False) -> None:
        self.q = tokens_per_request
        self.decode_query_lens = [tokens_per_request]
        """One query length: no dynamic tiers."""
        self.rule = rule
        self.exact = exact
        """Only an exactly captured width replays (TensorRT-LLM without padding)."""
        self.capture_sizes = rule.graph_widths()
        self.decode_graph_sizes = list(self.capture_sizes)
        self.mixed_graph_sizes: list[int] = []

    @property
    def max_size(self) -> int:
        return self.capture_sizes[-1] if self.capture_sizes else 0

    @property
    def decode_graphs(self) -> list[tuple[int, int]]:
        """`(width, tokens per request)` of every decode graph, largest first (one query length: no dynamic tiers)."""
        return [(s, self.q) for s in reversed(self.capture_sizes)]

    @property
    def full_pad_sizes(self) -> list[int]:
        """The widths a decode step pads up to: the decode graphs'."""
        return self.decode_graph_sizes

    def graphs(self) -> list[tuple[str, int]]:
        """Every graph the engine captures, largest first (one shared pool)."""
        return [("FULL", s) for s in reversed(self.capture_sizes)]

    def uniform_token_counts(self, query_lens: np.ndarray, uniform: np.ndarray) -> np.ndarray:
        """Per step, the query length a decode step is dispatched at (0: not a decode step)."""
        return np.where(uniform, query_lens, 0)

    def dispatch_steps(self, widths: np.ndarray, utc: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`dispatch` of many steps at once, as vLLM's dispatcher does it (`tuner.engines.vllm.dispatch`)."""
        return dispatch_steps(self, widths, utc)

    def dispatch(self, num_tokens: int, *, uniform_decode: bool = False, query_len: int | None = None) -> Dispatch:
        if num_tokens < 1:
            raise ValueError(f"num_tokens={num_tokens} must be >= 1")
        if uniform_decode:
            d = self.rule.dispatch(-(-num_tokens // self.q))
            if not d.eager:
                return Dispatch("FULL", d.num_tokens)
        return Dispatch("NONE", None)


class RequestEngine(Engine):
    """An engine that counts its decode graphs in requests; a subclass gives its rules in requests."""

    unit = "requests"
    report_words = "tuner.report.request_words"
    aliases: ClassVar[dict[str, str]] = {}
    """The engine's own names for the serving fields ServingConfig keeps under vLLM's names."""
    speculative_names: ClassVar[dict[str, str]] = {}
    """vLLM's speculative methods (the workload's `speculative.method`) as the engine names them."""
    speculative_what: ClassVar[str] = "speculative method"
    """What the engine calls that name (SGLang's "speculative algorithm")."""

    @classmethod
    def field_name(cls, name: str) -> str:
        return next((native for native, ours in cls.aliases.items() if ours == name), name)

    @property
    def request_cap_name(self) -> str:
        """The engine's name for its request cap (max_num_seqs)."""
        return self.field_name("max_num_seqs")

    # ------------------------------------------------------------------ what each engine gives
    @abstractmethod
    def default_requests(self, gpu_memory_mib: float | None) -> list[int]:
        """The engine's default decode list as written (requests)."""

    @abstractmethod
    def render_request_files(self, batch_sizes: Sequence[int], deployment: Deployment,
                             provenance: Provenance | None) -> dict[str, str]:
        """File name -> text of the engine's files for a list of batch sizes (requests), with everything the tuning
        assumed that changes what the engine runs, checked by its emitter."""

    @abstractmethod
    def memory_rule_words(self, budget: Any, default_top: int, tuned_top: int,
                          mem: Callable[[float], str]) -> tuple[str, str]:
        """`(the KV rule in words with this budget's numbers, what capture headroom is)`; `*_top`: the default and
        tuned lists' max in requests as the engine runs them, `mem` writes a memory figure."""

    @classmethod
    def native_method(cls, r: FieldReader, num_speculative_tokens: int, speculative_method: str | None) -> str | None:
        """The engine's own name for the workload's speculative method; None without speculation. Draft tokens need
        a method the engine has."""
        native = cls.speculative_names.get(speculative_method) if speculative_method else None
        if speculative_method is not None and native is None:
            raise WorkloadError(f"speculative.method: {speculative_method!r} has no {cls.speculative_what} "
                                f"({', '.join(cls.speculative_names)})")
        if num_speculative_tokens and native is None:
            raise WorkloadError(f"{r.at('num_speculative_tokens')}: {num_speculative_tokens} needs speculative.method "
                                f"with engine {cls.name} (its {cls.speculative_what})")
        return native

    # ------------------------------------------------------------------ what an engine may give (defaults)
    @classmethod
    def parse_settings(cls, r: FieldReader, num_speculative_tokens: int,
                       speculative_method: str | None) -> tuple[Any, int, int]:
        """`(the engine's own settings, tokens per request, draft tokens)` from the serving section, the speculative
        method and numbers resolved as the engine resolves them; by default no settings of its own, 1 + draft tokens
        and the draft tokens as written."""
        cls.native_method(r, num_speculative_tokens, speculative_method)
        return None, 1 + num_speculative_tokens, num_speculative_tokens

    @property
    def speculation(self) -> Speculation:
        return Speculation(self.serving.speculative_method, self.decode_query_len)

    def captured_requests(self, batch_sizes: Sequence[int]) -> list[int]:
        """What the engine really captures for a written list (requests, non-empty); by default the sizes within
        the request cap."""
        return sorted({int(b) for b in batch_sizes if b <= self.serving.max_num_seqs})

    def rule(self, batch_sizes: Sequence[int]) -> RequestRule:
        """The engine's dispatch for a list as it captures it (requests); by default a batch pads up to the
        smallest captured size, and runs eager above the largest."""
        return PaddedRule(batch_sizes, self.decode_query_len)

    def widest_requests(self) -> list[int]:
        """The engine's own generator run up to the request cap (what setting its max batch size to it writes); by
        default every batch size."""
        return list(range(1, self.serving.max_num_seqs + 1))

    def engine_line(self) -> str:
        """The engine in the report's header: its unit and what runs without a graph."""
        return (f"{self.label}: decode graphs by batch size (requests), each holding bs x {self.decode_query_len} "
                f"tokens; mixed and prefill steps run without a graph")

    def summary_fields(self, budget: Any, default_top: int, tuned_top: int) -> dict[str, Any]:
        """summary.json's fields of the engine's own settings and memory rule."""
        return {}

    def defaults_rows(self, tensor_parallel_size: int) -> tuple[list[tuple[str, str]], dict[str, Any], int, str]:
        """`cgtune defaults`' rows on the engine and its request cap, the JSON fields they stand for, the cap and its
        name, for a model sharded over `tensor_parallel_size` ranks."""
        cap = self.serving.max_num_seqs
        return [("engine", self.engine_line()), ("request cap", f"{cap} ({self.request_cap_name})")], {}, cap, \
            "request cap"

    def eager_reason(self, runs: Sequence[int], cap: int, cap_name: str) -> str:
        """Why decode batches run without a graph under a list captured as `runs` (requests)."""
        return f"above the list's max {runs[-1] if runs else 0}"

    def files_line(self) -> str:
        """What the run directory holds for the engine, and how its command line reads them."""
        return "Files: " + ", ".join(f"`{name}`" for name in self.files) + ", `summary.json`."

    @property
    def exact_dispatch(self) -> bool:
        """Only an exactly captured batch size replays (no padding up to the next graph)."""
        return False

    # ------------------------------------------------------------------ the interface, from those
    @classmethod
    def parse_serving(cls, r: FieldReader, *, speculative_method: str | None,
                      parallel_drafting: bool) -> ServingConfig:
        if parallel_drafting:
            raise WorkloadError(f"speculative.parallel_drafting: true is vLLM's (P-EAGLE/PARD on its V1 runner); "
                                f"engine {cls.name} has no such setting")
        for key in VLLM_ONLY_FIELDS:
            if r.has(key):
                raise WorkloadError(f"{r.at(key)}: a vLLM setting; engine {cls.name} has none (see docs/engines.md)")
        data = dict(r.data)
        for native, ours in cls.aliases.items():
            if native in data:
                if ours in data:
                    raise WorkloadError(f"{r.at(native)}: give {native} or {ours}, not both")
                data[ours] = data.pop(native)
                r.used.add(native)
            if ours not in r.data:  # errors name the key the user wrote, the engine's own where vLLM's is absent
                r.written[ours] = native
        r.data = data
        return read_serving(r, speculative_method=speculative_method, parallel_drafting=parallel_drafting,
                            engine=cls.name, own=lambda k: cls.parse_settings(r, k, speculative_method))

    @property
    def effective_cudagraph_mode(self) -> str:
        # decode graphs only: prefill and mixed steps run without them
        return "NONE" if self.serving.enforce_eager else "FULL_DECODE_ONLY"

    def defaults(self, *, gpu_memory_mib: float | None = None) -> CaptureDefaults:
        q = self.decode_query_len
        written = self.default_requests(gpu_memory_mib)
        rule = self.rule(self.captured_requests(written) if written else [])
        eager = [n * q for n in range(1, self.serving.max_num_seqs + 1) if rule.dispatch(n).eager]
        return CaptureDefaults([b * q for b in written], max(written) * q if written else 0, eager)

    def runs_as(self, capture_sizes: Sequence[int]) -> tuple[int, ...]:
        q = self.decode_query_len
        written = requests_of(capture_sizes, q)
        return tuple(b * q for b in (self.captured_requests(written) if written else []))

    def dispatcher(self, capture_sizes: Sequence[int]) -> RequestDispatcher:
        q = self.decode_query_len
        return RequestDispatcher(self.rule([w // q for w in self.runs_as(capture_sizes)]), q,
                                 exact=self.exact_dispatch)

    def widest_sizes(self) -> tuple[int, ...]:
        written = self.widest_requests()
        return tuple(b * self.decode_query_len for b in (self.captured_requests(written) if written else []))

    def in_engine_unit(self, capture_sizes: Sequence[int]) -> list[int]:
        return requests_of(capture_sizes, self.decode_query_len)

    def list_label(self, name: str) -> str:
        """The default and widest lists are the engine's own."""
        if name == "default":
            return f"{self.label} default"
        if name == "widest":
            return f"widest ({self.label}'s grid up to {self.request_cap_name})"
        return super().list_label(name)

    def render_files(self, capture_sizes: Sequence[int], deployment: Deployment, *, cudagraph_mode: str,
                     provenance: Provenance | None = None) -> dict[str, str]:
        return self.render_request_files(self.in_engine_unit(capture_sizes), deployment, provenance)
