"""The bounded load generator against a stand-in OpenAI server on 127.0.0.1 (stdlib http.server in a thread): exact
prompts and lengths in each request, every token counted (chunks carrying two included), the times it records, the
metrics interval it scrapes, the time limit that cuts a stalled stream off, and one-line input errors."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from tuner.load.drive import FIRST_TOKEN_ID, Drive, drive_load, tpot_ms
from tuner.workload.load import LoadError


class _State:
    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.steps: list[int] = []  # widths the stand-in "stepped", for its iteration_tokens histogram
        self.tpots_s: list[float] = []
        self.stall = False
        self.lock = threading.Lock()


def _exposition(state: _State) -> str:
    with state.lock:
        steps, tpots = list(state.steps), list(state.tpots_s)
    out = ["# TYPE vllm:iteration_tokens_total histogram"]
    for b in (1.0, 8.0, 16.0):
        out.append(f'vllm:iteration_tokens_total_bucket{{engine="0",le="{b}"}} {sum(w <= b for w in steps)}.0')
    out += [f'vllm:iteration_tokens_total_bucket{{engine="0",le="+Inf"}} {len(steps)}.0',
            f'vllm:iteration_tokens_total_count{{engine="0"}} {len(steps)}.0',
            f'vllm:iteration_tokens_total_sum{{engine="0"}} {sum(steps)}.0',
            "# TYPE vllm:request_time_per_output_token_seconds histogram",
            f'vllm:request_time_per_output_token_seconds_bucket{{engine="0",le="0.01"}} {sum(x <= 0.01 for x in tpots)}'
            ".0",
            f'vllm:request_time_per_output_token_seconds_bucket{{engine="0",le="+Inf"}} {len(tpots)}.0',
            f'vllm:request_time_per_output_token_seconds_count{{engine="0"}} {len(tpots)}.0',
            f'vllm:request_time_per_output_token_seconds_sum{{engine="0"}} {sum(tpots)}']
    return "\n".join(out) + "\n"


def _handler(state: _State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            body = _exposition(state).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with state.lock:
                state.bodies.append(req)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            n = req["max_tokens"]
            # The first token alone, then two tokens a chunk (as a busy server coalesces outputs).
            chunks = [[7]] + [[7, 7][: min(2, n - i)] for i in range(1, n, 2)]
            try:
                for i, ids in enumerate(chunks):
                    if state.stall and i == 1:
                        time.sleep(30)
                    event = {"choices": [{"index": 0, "text": "", "token_ids": ids, "finish_reason": None}]}
                    self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                    self.wfile.flush()
                    time.sleep(0.002)
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
            except OSError:
                return
            with state.lock:
                state.steps.extend([len(req["prompt"]) + 1] + [1] * (n - 1))
                state.tpots_s.append(0.002)

    return Handler


@pytest.fixture
def server() -> Iterator[tuple[int, _State]]:
    state = _State()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd.server_address[1], state
    finally:
        httpd.shutdown()
        httpd.server_close()


def _drive(port: int = 8000, **kw: object) -> Drive:
    base: dict = {"host": "127.0.0.1", "port": port, "model": "m", "num_requests": 4, "rate_per_s": 50.0,
                  "prompt_tokens": 12, "output_tokens": 5, "vocab_size": 256, "time_limit_s": 10.0, "seed": 3}
    return Drive(**{**base, **kw})


def test_every_request_is_exact_and_every_token_counted(server) -> None:
    port, state = server
    d = _drive(port)
    result = drive_load(d)
    assert not result.notes and len(result.finished) == 4
    for body in state.bodies:
        assert len(body["prompt"]) == 12 and all(FIRST_TOKEN_ID <= t < 256 for t in body["prompt"])
        assert body["max_tokens"] == body["min_tokens"] == 5 and body["ignore_eos"] and body["temperature"] == 0
        assert body["stream"] and body["return_token_ids"]
    assert len({tuple(b["prompt"]) for b in state.bodies}) == 4  # distinct prompts: nothing for a prefix cache
    for r in result.records:
        assert r.tokens == 5 and r.planned_s <= r.sent_s < r.first_token_s <= r.finish_s
        assert tpot_ms(r) == pytest.approx((r.finish_s - r.first_token_s) / 4 * 1000)
    assert list(result.arrival_times_s()) == sorted(result.arrival_times_s())
    assert len(result.tpot_ms()) == 4


def test_the_metrics_are_the_runs_own_interval(server) -> None:
    port, _ = server
    drive_load(_drive(port, num_requests=2, seed=1))  # steps before the run: not the run's
    result = drive_load(_drive(port))
    h = result.histogram
    assert h is not None and h.count == 4 * 5 and h.sum == 4 * (12 + 1 + 4)
    assert result.engine_tpot_mean_ms == pytest.approx(2.0)


def test_the_arrivals_are_seeded_poisson_at_the_rate() -> None:
    d = Drive(host="h", port=1, model="m", num_requests=2000, rate_per_s=4.0, prompt_tokens=1, output_tokens=2,
              vocab_size=8, time_limit_s=1.0, seed=5)
    times = d.schedule_s()
    assert np.array_equal(times, d.schedule_s()) and np.all(np.diff(times) > 0)
    # 2000 exponential gaps: the mean within 10% of 1/rate (its standard error is 2.2%).
    assert np.mean(np.diff(times)) == pytest.approx(0.25, rel=0.10)


def test_a_stalled_stream_is_cut_off_at_the_time_limit(server) -> None:
    port, state = server
    state.stall = True
    t0 = time.monotonic()
    result = drive_load(_drive(port, num_requests=2, time_limit_s=1.5, rate_per_s=100.0), metrics=False)
    assert time.monotonic() - t0 < 1.5 + 5
    assert not result.finished and len(result.unfinished) == 2
    assert all("cut off at the time limit" in (r.error or "") and r.tokens == 1 for r in result.records)
    assert any("still streaming at the time limit" in n for n in result.notes)


def test_requests_due_after_the_time_limit_are_not_sent(server) -> None:
    port, state = server
    result = drive_load(_drive(port, num_requests=50, rate_per_s=20.0, time_limit_s=0.5), metrics=False)
    assert any("not sent" in n for n in result.notes)
    assert len(state.bodies) < 50 and all(np.isnan(r.sent_s) for r in result.records[len(state.bodies):])


def test_a_refused_connection_is_recorded_not_raised() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        result = drive_load(_drive(port, num_requests=1), metrics=False)
    (r,) = result.records
    assert not r.finished and "Connection" in (r.error or "") and "failed" in result.notes[0]


@pytest.mark.parametrize(("field", "value", "says"), [
    ("num_requests", 0, "Drive.num_requests=0 must be an integer >= 1"),
    ("output_tokens", 1, "Drive.output_tokens=1 must be an integer >= 2"),
    ("rate_per_s", float("inf"), "Drive.rate_per_s=inf must be a finite number > 0"),
    ("time_limit_s", 0, "Drive.time_limit_s=0 must be a finite number > 0"),
    ("vocab_size", 3, "Drive.vocab_size=3 must be an integer >= 4"),
    ("port", 70000, "Drive.port=70000 must be <= 65535"),
    ("model", "", "Drive.model=''"),
])
def test_a_bad_field_is_named_on_one_line(field: str, value: object, says: str) -> None:
    with pytest.raises(LoadError, match="^" + says.replace("(", r"\(").replace(".", r"\.")) as err:
        _drive(**{"port": 8000, field: value})
    assert "\n" not in str(err.value)
