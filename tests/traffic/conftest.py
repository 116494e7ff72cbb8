"""Shared fixtures for the traffic tests: real-format vLLM metrics text and a bounded loopback HTTP server."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

# What a vLLM v1 server with two engines (data parallel) exports, trimmed to a few families around the one
# we read: prometheus_client's text format with HELP/TYPE lines, `_created` gauges, counters that end in
# `_total`, and a histogram whose own name also ends in `_total`. Buckets are vLLM's defaults.
VLLM_METRICS = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 12045.0
python_gc_objects_collected_total{generation="1"} 1911.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 37.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 41.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 734211.0
vllm:prompt_tokens_total{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 702977.0
# HELP vllm:prompt_tokens_created Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_created gauge
vllm:prompt_tokens_created{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.7645e+09
vllm:prompt_tokens_created{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.7645e+09
# HELP vllm:iteration_tokens_total Histogram of number of tokens per engine_step.
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
vllm:iteration_tokens_total_bucket{engine="0",le="8.0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 10.0
vllm:iteration_tokens_total_bucket{engine="0",le="16.0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 25.0
vllm:iteration_tokens_total_bucket{engine="0",le="32.0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 60.0
vllm:iteration_tokens_total_bucket{engine="0",le="64.0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 160.0
vllm:iteration_tokens_total_bucket{engine="0",le="128.0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 400.0
vllm:iteration_tokens_total_bucket{engine="0",le="256.0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 700.0
vllm:iteration_tokens_total_bucket{engine="0",le="512.0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 800.0
vllm:iteration_tokens_total_bucket{engine="0",le="1024.0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 850.0
vllm:iteration_tokens_total_bucket{engine="0",le="2048.0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 880.0
vllm:iteration_tokens_total_bucket{engine="0",le="4096.0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 895.0
vllm:iteration_tokens_total_bucket{engine="0",le="8192.0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 900.0
vllm:iteration_tokens_total_bucket{engine="0",le="16384.0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 900.0
vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} 900.0
vllm:iteration_tokens_total_count{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 900.0
vllm:iteration_tokens_total_sum{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 231000.0
vllm:iteration_tokens_total_bucket{engine="1",le="1.0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.0
vllm:iteration_tokens_total_bucket{engine="1",le="8.0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 5.0
vllm:iteration_tokens_total_bucket{engine="1",le="16.0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 20.0
vllm:iteration_tokens_total_bucket{engine="1",le="32.0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 50.0
vllm:iteration_tokens_total_bucket{engine="1",le="64.0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 140.0
vllm:iteration_tokens_total_bucket{engine="1",le="128.0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 380.0
vllm:iteration_tokens_total_bucket{engine="1",le="256.0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 650.0
vllm:iteration_tokens_total_bucket{engine="1",le="512.0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 760.0
vllm:iteration_tokens_total_bucket{engine="1",le="1024.0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 790.0
vllm:iteration_tokens_total_bucket{engine="1",le="2048.0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 797.0
vllm:iteration_tokens_total_bucket{engine="1",le="4096.0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 799.0
vllm:iteration_tokens_total_bucket{engine="1",le="8192.0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 800.0
vllm:iteration_tokens_total_bucket{engine="1",le="16384.0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 800.0
vllm:iteration_tokens_total_bucket{engine="1",le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} 800.0
vllm:iteration_tokens_total_count{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 800.0
vllm:iteration_tokens_total_sum{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 170000.0
# HELP vllm:iteration_tokens_total_created Histogram of number of tokens per engine_step.
# TYPE vllm:iteration_tokens_total_created gauge
vllm:iteration_tokens_total_created{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.7645e+09
vllm:iteration_tokens_total_created{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.7645e+09
"""


@pytest.fixture
def vllm_metrics() -> str:
    return VLLM_METRICS


@contextmanager
def serve_text(routes: dict[str, tuple[int, bytes] | list[tuple[int, bytes]]], *, max_requests: int = 8, lifetime_s: float = 10.0
               ) -> Iterator[str]:
    """Serve fixed responses on 127.0.0.1 (ephemeral port) from a thread that answers at most `max_requests`
    and gives up after `lifetime_s`, so a failing test can never leave it running; yields the base URL."""

    served: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            served.append(self.path)
            answer = routes.get(self.path, (404, b"not found\n"))
            if isinstance(answer, list):  # successive scrapes: one answer each, the last one repeats
                answer = answer[min(served.count(self.path), len(answer)) - 1]
            status, body = answer
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:  # keep test output quiet
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    server.timeout = 0.2  # handle_request returns after this when idle, so the loop can check its deadline
    stop = threading.Event()

    def loop() -> None:
        deadline = time.monotonic() + lifetime_s
        while not stop.is_set() and len(served) < max_requests and time.monotonic() < deadline:
            server.handle_request()
        server.server_close()

    thread = threading.Thread(target=loop, name="cgtune-test-loopback", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        stop.set()
        thread.join(timeout=2.0)
        assert not thread.is_alive(), "loopback server did not stop"


@pytest.fixture
def loopback():
    """`serve_text` for a test: `with loopback({"/metrics": (200, body)}) as base_url: ...`."""
    return serve_text
