"""The requests of a load in arrival order, drawn lazily in blocks (Poisson gaps, or the given times; prompt and output
lengths), with the times the simulator writes back (first token, finish): one table indexed by request id, because
vLLM's FCFS scheduler admits requests in arrival order, so the waiting queue is just the ids between the admitted and
the arrived."""

from __future__ import annotations

import numpy as np

from tuner.workload.load import Lengths, Load

__all__ = ["Requests"]

_BLOCK = 4096
"""Requests drawn at a time for Poisson arrivals (an open stream has no end to draw up to)."""


class Requests:
    """Arrival times, lengths and recorded times of a load's requests; `initial` extra requests arrive at t = 0 ahead of
    the stream (a saturated start), with lengths from a stream of their own so the arrivals after them are the same
    requests, at the same times, as an empty start's. The arrays are views of the `count` requests drawn so far."""

    def __init__(self, load: Load, initial: int = 0) -> None:
        gaps, sizes, pre = np.random.SeedSequence(load.seed).spawn(3)
        self._gap_rng = np.random.default_rng(gaps)
        self._len_rng = np.random.default_rng(sizes)
        self.load = load
        self.initial = initial
        self.count = 0
        """Requests drawn so far."""
        self._cols: dict[str, np.ndarray] = {"arrival_s": np.zeros(0), "prompt": np.zeros(0, dtype=np.int64),
                                             "output": np.zeros(0, dtype=np.int64), "first_token_s": np.zeros(0),
                                             "finish_s": np.zeros(0)}
        self._bind()
        self.finite = load.arrival_times_s is not None
        self._last_s = 0.0  # the last Poisson arrival drawn
        self._next_s = -1.0  # arrival time of request `_arrived` (inf: none left), so most steps need no search
        self._arrived = 0
        pre_rng = np.random.default_rng(pre)
        self._append(np.zeros(initial), self._draw(pre_rng, load.prompt_tokens, initial),
                     self._draw(pre_rng, load.output_tokens, initial))
        if load.arrival_times_s is not None:
            times = np.array(load.arrival_times_s, dtype=float)
            self._append(times, self._draw(self._len_rng, load.prompt_tokens, len(times)),
                         self._draw(self._len_rng, load.output_tokens, len(times)))

    def _bind(self) -> None:
        n = self.count
        self.arrival_s: np.ndarray = self._cols["arrival_s"][:n]
        """When each request arrives (s), ascending."""
        self.prompt: np.ndarray = self._cols["prompt"][:n]
        """Prompt tokens of each request."""
        self.output: np.ndarray = self._cols["output"][:n]
        """Output tokens of each request (the first token included)."""
        self.first_token_s: np.ndarray = self._cols["first_token_s"][:n]
        """When each request's first token came (s; NaN: not yet), written by the simulator."""
        self.finish_s: np.ndarray = self._cols["finish_s"][:n]
        """When each request finished (s; NaN: not yet), written by the simulator."""

    @staticmethod
    def _draw(rng: np.random.Generator, lengths: Lengths, n: int) -> np.ndarray:
        assert lengths.max is not None
        if lengths.counts:
            values = np.array([v for v, _ in lengths.counts], dtype=np.int64)
            weights = np.array([w for _, w in lengths.counts], dtype=float)
            return values[np.searchsorted(np.cumsum(weights / weights.sum()), rng.random(n), side="right").clip(
                max=len(values) - 1)]
        if lengths.min == lengths.max:
            return np.full(n, lengths.min, dtype=np.int64)
        return rng.integers(lengths.min, lengths.max + 1, size=n, dtype=np.int64)

    def _append(self, times: np.ndarray, prompt: np.ndarray, output: np.ndarray) -> None:
        n, new = self.count, self.count + len(times)
        if new > len(self._cols["arrival_s"]):  # capacity doubles: appending stays linear over a long run
            cap = max(new, 2 * len(self._cols["arrival_s"]))
            for key, col in self._cols.items():
                grown = np.full(cap, np.nan) if col.dtype.kind == "f" else np.zeros(cap, dtype=col.dtype)
                grown[:n] = col[:n]
                self._cols[key] = grown
        self._cols["arrival_s"][n:new] = times
        self._cols["prompt"][n:new] = prompt
        self._cols["output"][n:new] = output
        self._cols["first_token_s"][n:new] = np.nan
        self._cols["finish_s"][n:new] = np.nan
        self.count = new
        self._bind()

    def _extend_past(self, t: float) -> None:
        """Draw Poisson blocks until one arrival lies after `t` (so every arrival up to `t` is known)."""
        rate = self.load.rate_per_s
        assert rate is not None
        while self._last_s <= t:
            # Gaps as unit exponentials over the rate: loads that differ only in rate share their random numbers,
            # so a higher rate is the same requests, sooner (the rate search compares like with like).
            times = self._last_s + np.cumsum(self._gap_rng.standard_exponential(_BLOCK)) / rate
            self._last_s = float(times[-1])
            self._append(times, self._draw(self._len_rng, self.load.prompt_tokens, _BLOCK),
                         self._draw(self._len_rng, self.load.output_tokens, _BLOCK))

    def arrived_by(self, t: float) -> int:
        """How many requests have arrived at or before `t` (the ids below it); `t` never goes back."""
        if t < self._next_s:  # the common case: nobody new since the last call
            return self._arrived
        if not self.finite and self._last_s <= t:
            self._extend_past(t)
        k = int(self.arrival_s.searchsorted(t, side="right"))
        self._arrived = k
        self._next_s = float(self.arrival_s[k]) if k < self.count else float("inf")
        return k

    def next_arrival_s(self, count: int) -> float | None:
        """Arrival time of request `count` (the next to arrive after `count` have), None when a given list is done."""
        if count >= self.count:
            if self.finite:
                return None
            self._extend_past(self._last_s)
        return float(self.arrival_s[count])
