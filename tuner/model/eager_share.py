"""What runs without a CUDA graph under a capture list, for a workload's traffic: the share of its uniform decode steps
and of their tokens (dispatched as the engine runs the list), and which drafter passes run eager (vLLM)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tuner.engines.registry import engine_of
from tuner.engines.vllm.drafter import EagerDrafterPasses
from tuner.steps import Step
from tuner.steps import uniform_decode_steps as _uniform_steps
from tuner.workload.spec import ServingConfig, Workload

__all__ = [
    "EagerShare",
    "decode_request_counts",
    "drafter_eager_passes",
    "eager_share",
    "uniform_decode_steps",
]


@dataclass(frozen=True)
class EagerShare:
    """Uniform decode steps that get no graph under a list, counted over a traffic's step distribution."""

    request_counts: tuple[int, ...]
    """Requests of the traffic's uniform decode steps (distinct, ascending)."""
    eager_request_counts: tuple[int, ...]
    """Those whose decode step runs without a graph."""
    eager_step_share: float | None
    """Share of the uniform decode steps (by probability) that run without a graph; None when there are none."""
    eager_token_share: float | None
    """Share of those steps' tokens that run without a graph; None when there are no decode steps."""
    decode_step_share: float
    """Share of all steps that are uniform decode steps (the rest are mixed or prefill steps, not counted above)."""

    def describe(self) -> str:
        """One line, e.g. `over 1..128 requests: 98 of 128 request counts eager = 76.6% of decode steps, 86.0% of
        their tokens`."""
        if self.eager_step_share is None or self.eager_token_share is None:
            return "no uniform decode steps in this traffic"
        counts = self.request_counts
        span = f"{counts[0]}..{counts[-1]}" if len(counts) > 1 else str(counts[0])
        line = (f"over {span} requests: {len(self.eager_request_counts)} of {len(counts)} request counts eager = "
                f"{self.eager_step_share:.1%} of decode steps, {self.eager_token_share:.1%} of their tokens")
        if self.decode_step_share < 1.0:
            line += f" (decode steps are {self.decode_step_share:.1%} of all steps)"
        return line

    def as_dict(self) -> dict[str, object]:
        return {"eager_step_share": self.eager_step_share, "eager_token_share": self.eager_token_share,
                "decode_request_counts": list(self.request_counts),
                "eager_request_counts": list(self.eager_request_counts), "decode_step_share": self.decode_step_share}


def uniform_decode_steps(serving: ServingConfig) -> list[Step]:
    """Decode traffic when no workload says: uniform decode steps of 1..max_num_seqs requests, each equally likely,
    each at its dynamic speculative schedule tier's query length (a decode step there all the same)."""
    return _uniform_steps(engine_of(serving).decode_query_lens(), serving.max_num_batched_tokens)


def eager_share(serving: ServingConfig, steps: Sequence[Step], capture_sizes: Sequence[int]) -> EagerShare:
    """Dispatch every uniform decode step of `steps` as the engine would with `capture_sizes` written into its config
    (the list as it RUNS: vLLM V1's rewrite, SGLang's and TensorRT-LLM's filters and padding) and count the ones that
    get no graph. A list the runner refuses captures nothing: every step runs eager."""
    try:
        dispatcher = engine_of(serving).dispatcher(list(capture_sizes))
    except ValueError:
        dispatcher = None
    decode = [st for st in steps if st.uniform_decode]
    total_p = sum(st.probability for st in decode)
    all_p = sum(st.probability for st in steps)
    total_tokens = sum(st.probability * st.num_tokens for st in decode)
    eager_p = eager_tokens = 0.0
    counts: set[int] = set()
    eager_counts: set[int] = set()
    for st in decode:
        n = _requests(serving, st)
        counts.add(n)
        if (dispatcher is None
                or dispatcher.dispatch(st.num_tokens, uniform_decode=True, query_len=st.query_len).eager):
            eager_counts.add(n)
            eager_p += st.probability
            eager_tokens += st.probability * st.num_tokens
    return EagerShare(
        request_counts=tuple(sorted(counts)), eager_request_counts=tuple(sorted(eager_counts)),
        eager_step_share=eager_p / total_p if total_p > 0 else None,
        eager_token_share=eager_tokens / total_tokens if total_tokens > 0 else None,
        decode_step_share=total_p / all_p if all_p > 0 else 0.0,
    )


def _requests(serving: ServingConfig, step: Step) -> int:
    """A decode step's requests (its width / q where the step does not say)."""
    return step.num_reqs if step.num_reqs is not None else step.num_tokens // serving.decode_query_len


def decode_request_counts(workload: Workload) -> list[int]:
    """Requests of the workload's decode steps: its `traffic.requests` values, else the uniform decode steps'
    requests (a width histogram or trace)."""
    t, s = workload.traffic, workload.serving
    if t.requests is not None:
        return sorted(t.requests.pmf())
    return sorted({_requests(s, st) for st in workload.steps() if st.uniform_decode})


def drafter_eager_passes(workload: Workload, capture_sizes: Sequence[int]) -> list[EagerDrafterPasses]:
    """vLLM's drafter passes that run without a graph over the workload's decode steps under a list (as the runner
    runs it), one entry per pass role (`tuner.engines.vllm.drafter.eager_drafter_passes`); [] without a model-based
    drafter or for an engine whose drafter is not modelled (SGLang's and TensorRT-LLM's)."""
    spec = workload.speculative
    if spec is None or spec.drafter is None or spec.method is None:
        return []
    return workload.engine.eager_drafter_passes(spec.method, decode_request_counts(workload), capture_sizes)
