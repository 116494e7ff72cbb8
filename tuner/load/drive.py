"""A bounded load generator for a real server: a fixed number of requests at seeded Poisson times, each a streamed
`/v1/completions` call with an exact prompt (token ids) and an exact output length, under one time limit; it records
every request's send, first-token and finish times and the server's `vllm:iteration_tokens_total` over the run.

Standard library only (http.client and threads: one thread per request in flight), so it runs wherever the load model
does. The times are `time.perf_counter()` seconds from the run's start, the clock the load model's arrivals use.
"""

from __future__ import annotations

import http.client
import json
import math
import socket
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from tuner.workload.load import LoadError
from tuner.workload.traffic.metrics import (
    ITERATION_TOKENS,
    TokenHistogram,
    combine,
    interval,
    parse_exposition,
    read_source,
)

__all__ = ["ENGINE_TPOT", "Drive", "DriveResult", "RequestRecord", "drive_load", "scrape", "tpot_ms"]

ENGINE_TPOT = "vllm:request_time_per_output_token_seconds"
"""vLLM's histogram of each finished request's TPOT, timed by the engine core's own output timestamps (decode time /
(generated tokens - 1)), so a frontend or client too busy to stream every token on time does not blur it."""
FIRST_TOKEN_ID = 3
"""Prompt token ids are drawn from [FIRST_TOKEN_ID, vocab_size): ids below it are the usual pad/bos/eos ids."""


@dataclass(frozen=True)
class Drive:
    """One bounded load against one server: how many requests, when, how long, and the limits that keep it bounded."""

    host: str
    """The server's host (e.g. 127.0.0.1)."""
    port: int
    """The server's port, 1..65535."""
    model: str
    """The served model name the server expects in each request (`model` field)."""
    num_requests: int
    """Requests sent, >= 1."""
    rate_per_s: float
    """Poisson arrival rate (requests/s), > 0: the gaps are seeded exponentials at this rate."""
    prompt_tokens: int
    """Prompt length of every request (tokens, sent as token ids so the length is exact), >= 1."""
    output_tokens: int
    """Output length of every request (`max_tokens` = `min_tokens`, EOS ignored), >= 2 (a TPOT needs two tokens)."""
    vocab_size: int
    """The model's vocabulary: prompt ids are drawn from [FIRST_TOKEN_ID, vocab_size), > FIRST_TOKEN_ID."""
    time_limit_s: float
    """The whole run's limit (s), > 0: no request is sent after it and those still streaming are cut off."""
    seed: int = 0
    """Seed of the arrival gaps and the prompt ids."""
    connect_timeout_s: float = 10.0
    """A socket's limit on any single wait (connect, a chunk), > 0."""

    def __post_init__(self) -> None:
        for name, low in (("num_requests", 1), ("prompt_tokens", 1), ("output_tokens", 2),
                          ("vocab_size", FIRST_TOKEN_ID + 1), ("port", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise LoadError(f"Drive.{name}={value!r} must be an integer >= {low}")
        if self.port > 65535:
            raise LoadError(f"Drive.port={self.port!r} must be <= 65535")
        for name in ("rate_per_s", "time_limit_s", "connect_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value <= 0:
                raise LoadError(f"Drive.{name}={value!r} must be a finite number > 0")
        if not isinstance(self.host, str) or not self.host:
            raise LoadError(f"Drive.host={self.host!r} must be a host name")
        if not isinstance(self.model, str) or not self.model:
            raise LoadError(f"Drive.model={self.model!r} must be the served model's name")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise LoadError(f"Drive.seed={self.seed!r} must be an integer")

    def schedule_s(self) -> np.ndarray:
        """The planned send times (s from the start): cumulative seeded exponential gaps at the rate."""
        rng = np.random.default_rng(np.random.SeedSequence(self.seed).spawn(2)[0])
        return np.cumsum(rng.standard_exponential(self.num_requests)) / self.rate_per_s

    def prompts(self) -> list[list[int]]:
        """Every request's prompt ids, distinct random ids per request (no two prompts share a prefix to cache)."""
        rng = np.random.default_rng(np.random.SeedSequence(self.seed).spawn(2)[1])
        ids = rng.integers(FIRST_TOKEN_ID, self.vocab_size, size=(self.num_requests, self.prompt_tokens))
        return [[int(x) for x in row] for row in ids]


@dataclass
class RequestRecord:
    """One request's times (s from the run's start; NaN: not reached) and what came back."""

    index: int
    """Position in the arrival order."""
    planned_s: float
    """When it was due to be sent."""
    sent_s: float = math.nan
    """When it was sent (just before the request line went out)."""
    first_token_s: float = math.nan
    """When the first chunk carrying a token arrived."""
    finish_s: float = math.nan
    """When the last expected token arrived (or the stream ended, if it ended short)."""
    tokens: int = 0
    """Output tokens received (counted from the stream's token ids, so chunks that carry several count each)."""
    error: str | None = None
    """Why it did not finish (one line), None when it did."""

    @property
    def finished(self) -> bool:
        return self.error is None and not math.isnan(self.finish_s)


@dataclass
class DriveResult:
    """A run's requests and the server's step-width histogram over it."""

    drive: Drive
    """What was run."""
    records: list[RequestRecord]
    """Every request, in arrival order (unsent ones too)."""
    elapsed_s: float
    """From the start to the last request's end (or the time limit)."""
    histogram: TokenHistogram | None = None
    """The server's `vllm:iteration_tokens_total` between the scrapes before and after the run (None: not scraped)."""
    engine_tpot: TokenHistogram | None = None
    """The server's ENGINE_TPOT (seconds) between the same scrapes (None: not scraped)."""
    notes: list[str] = field(default_factory=list)
    """What went short (requests unsent, cut off, failed), one line each."""

    @property
    def finished(self) -> list[RequestRecord]:
        return [r for r in self.records if r.finished]

    @property
    def unfinished(self) -> list[RequestRecord]:
        return [r for r in self.records if not r.finished]

    def arrival_times_s(self) -> tuple[float, ...]:
        """The actual send times of the requests that were sent (the load model's `arrival_times_s`)."""
        return tuple(r.sent_s for r in self.records if not math.isnan(r.sent_s))

    def tpot_ms(self) -> np.ndarray:
        """TPOT of every finished request as the client saw it: (finish - first token) / (tokens - 1), ms."""
        return np.array([tpot_ms(r) for r in self.finished if r.tokens > 1])

    @property
    def engine_tpot_mean_ms(self) -> float | None:
        """The mean TPOT of the run's requests by the engine's own clock (ENGINE_TPOT's sum / count), ms."""
        h = self.engine_tpot
        return h.sum / h.count * 1000.0 if h is not None and h.sum is not None and h.count > 0 else None


def tpot_ms(record: RequestRecord) -> float:
    """(finish - first token) / (tokens - 1), ms: the mean gap between a request's output tokens after the first."""
    return (record.finish_s - record.first_token_s) / (record.tokens - 1) * 1000.0


def scrape(host: str, port: int, *, timeout_s: float = 10.0) -> dict[str, dict]:
    """The server's `vllm:iteration_tokens_total` and ENGINE_TPOT series now (metric -> label key -> histogram)."""
    url = f"http://{host}:{port}/metrics"
    text = read_source(url, timeout_s=timeout_s)
    return {m: parse_exposition(text, m, where=url) for m in (ITERATION_TOKENS, ENGINE_TPOT)}


def _body(d: Drive, prompt: list[int]) -> bytes:
    return json.dumps({"model": d.model, "prompt": prompt, "max_tokens": d.output_tokens,
                       "min_tokens": d.output_tokens, "ignore_eos": True, "temperature": 0.0, "stream": True,
                       "return_token_ids": True}).encode()


def _tokens_in(line: bytes) -> int | None:
    """Tokens one server-sent-events line carries (None: not a data line, or the end marker)."""
    if not line.startswith(b"data:"):
        return None
    payload = line[5:].strip()
    if payload == b"[DONE]":
        return None
    event = json.loads(payload)
    if "error" in event:
        raise RuntimeError(f"server error: {str(event['error'])[:200]}")
    choice = event["choices"][0]
    ids = choice.get("token_ids")
    if ids is None:  # a server without return_token_ids: one token a chunk is all it can say
        return 1 if choice.get("text") else 0
    return len(ids)


class _Stream:
    """One request's connection, so the time limit can cut it off from the dispatching thread."""

    def __init__(self, d: Drive, record: RequestRecord, prompt: list[int], t0: float) -> None:
        self.d, self.record, self.prompt, self.t0 = d, record, prompt, t0
        self.conn: http.client.HTTPConnection | None = None
        self.sock: socket.socket | None = None
        """The connection's socket, kept: http.client lets go of it once a `Connection: close` response starts."""
        self.thread = threading.Thread(target=self.run, name=f"drive-{record.index}", daemon=True)

    def run(self) -> None:
        r, d = self.record, self.d
        try:
            self.conn = http.client.HTTPConnection(d.host, d.port, timeout=d.connect_timeout_s)
            self.conn.connect()
            self.sock = self.conn.sock
            body = _body(d, self.prompt)
            r.sent_s = time.perf_counter() - self.t0
            self.conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
            response = self.conn.getresponse()
            if response.status != 200:
                r.error = f"HTTP {response.status}: {response.read(300).decode(errors='replace')}"
                return
            while True:
                line = response.readline()
                if not line:
                    break
                got = _tokens_in(line.strip())
                if not got:
                    continue
                now = time.perf_counter() - self.t0
                if r.tokens == 0:
                    r.first_token_s = now
                r.tokens += got
                if r.tokens >= d.output_tokens:
                    r.finish_s = now
            if r.tokens < d.output_tokens:
                r.error = f"the stream ended after {r.tokens} of {d.output_tokens} tokens"
        except Exception as exc:  # noqa: BLE001 - a refused connection, a cut-off stream, a timeout: recorded
            r.error = r.error or f"{type(exc).__name__}: {exc}"[:300]
        finally:
            if self.conn is not None:
                self.conn.close()

    def cut(self) -> None:
        """Stop the stream now (the time limit): shutting the socket wakes the thread's blocked read."""
        sock = self.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def drive_load(d: Drive, *, metrics: bool = True) -> DriveResult:
    """Run `d` against its server: each request sent at its planned time (never before; late if the host is busy,
    the actual send time recorded), the streams read to the end, everything stopped at the time limit; the server's
    step-width and TPOT histograms scraped before and after when `metrics`."""
    before = scrape(d.host, d.port, timeout_s=d.connect_timeout_s) if metrics else None
    planned = d.schedule_s()
    prompts = d.prompts()
    records = [RequestRecord(i, float(t)) for i, t in enumerate(planned)]
    streams: list[_Stream] = []
    t0 = time.perf_counter()
    deadline = t0 + d.time_limit_s
    for record, prompt in zip(records, prompts):
        wait = t0 + record.planned_s - time.perf_counter()
        if t0 + record.planned_s >= deadline:
            break
        if wait > 0:
            time.sleep(wait)
        stream = _Stream(d, record, prompt, t0)
        streams.append(stream)
        stream.thread.start()
    for stream in streams:
        stream.thread.join(max(0.0, deadline - time.perf_counter()))
    cut = [s for s in streams if s.thread.is_alive()]
    for stream in cut:
        stream.cut()
    for stream in cut:
        stream.thread.join(d.connect_timeout_s)
        # Whatever the read raised once its socket was shut is the cut's doing, not the server's.
        stream.record.error = f"cut off at the time limit ({d.time_limit_s:g} s) after {stream.record.tokens} tokens"
    elapsed = min(time.perf_counter(), deadline) - t0
    notes = []
    unsent = len(records) - len(streams)
    if unsent:
        notes.append(f"{unsent} of {len(records)} requests were due after the time limit ({d.time_limit_s:g} s) "
                     f"and not sent")
    if cut:
        notes.append(f"{len(cut)} requests were still streaming at the time limit and were cut off")
    failed = [s.record for s in streams if s not in cut and s.record.error is not None]
    if failed:
        notes.append(f"{len(failed)} requests failed (first: request {failed[0].index}: {failed[0].error})")
    result = DriveResult(d, records, elapsed, notes=notes)
    if before is not None:
        after = scrape(d.host, d.port, timeout_s=d.connect_timeout_s)
        result.histogram = combine(interval(after[ITERATION_TOKENS], before[ITERATION_TOKENS]))
        result.engine_tpot = combine(interval(after[ENGINE_TPOT], before[ENGINE_TPOT]))
    return result
