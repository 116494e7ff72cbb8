"""`cgtune workload from-metrics` writes traffic.load from vLLM's request metrics: rate over a known interval,
prompt/output lengths at each bucket's middle whole length, acceptance when speculating; a note instead when the
scrapes cannot give it, one line and exit 2 when they are corrupt. Expositions are written by prometheus_client."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from tuner.cli import main
from tuner.workload.load import Lengths, Load
from tuner.workload.spec import load_workload
from tuner.workload.traffic import (
    MetricAbsent,
    Scrapes,
    TokenHistogram,
    TrafficError,
    fit_model_len,
    parse_counter,
    read_counter,
    representative_lengths,
)

WORKLOADS = Path(__file__).resolve().parents[2] / "workloads"
SPECULATIVE = str(WORKLOADS / "dflash-llama-3.1-8b.yaml")  # q = 17, max_model_len 8192
PLAIN = str(WORKLOADS / "baseline-llama-3.1-8b.yaml")  # q = 1, max_model_len 8192
TINY = str(WORKLOADS / "tiny-cpu.yaml")  # q = 4, max_model_len 512

# vLLM 0.33's default request-length buckets, build_1_2_5_buckets(max_model_len), written out by hand.
BUCKETS_8192 = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000]
BUCKETS_512 = [1, 2, 5, 10, 20, 50, 100, 200, 500]
REASONS = ("stop", "length", "abort", "error", "repetition")  # str(FinishReason) for each


class Server:
    """One vLLM server run's metrics as vLLM declares them (names, label names, request-length buckets), kept in a
    prometheus_client registry; `scrape()` is what its /metrics would answer now."""

    def __init__(self, buckets: list[int], *, engines: tuple[str, ...] = ("0",), lengths: bool = True,
                 speculative: bool = True) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        self.widths = Histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                                labels, buckets=[1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384],
                                registry=self.registry)
        self.success = Counter("vllm:request_success", "Count of successfully processed requests.",
                               [*labels, "finished_reason"], registry=self.registry)
        self.prompt = self.output = None
        if lengths:
            self.prompt = Histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", labels,
                                    buckets=buckets, registry=self.registry)
            self.output = Histogram("vllm:request_generation_tokens", "Number of generation tokens processed.",
                                    labels, buckets=buckets, registry=self.registry)
        self.drafts = self.accepted = None
        if speculative:
            self.drafts = Counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", labels,
                                  registry=self.registry)
            self.accepted = Counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", labels,
                                    registry=self.registry)
        for engine in engines:  # vLLM creates each engine's series at start-up (create_metric_per_engine), at 0
            for metric in (self.widths, self.prompt, self.output, self.drafts, self.accepted):
                if metric is not None:
                    metric.labels("m", engine)
            for reason in REASONS:
                self.success.labels("m", engine, reason)

    def finish(self, prompt: int, output: int, *, engine: str = "0", reason: str = "stop") -> None:
        self.success.labels("m", engine, reason).inc()
        if self.prompt is not None and self.output is not None:
            self.prompt.labels("m", engine).observe(prompt)
            self.output.labels("m", engine).observe(output)

    def steps(self, width: int, n: int, *, engine: str = "0") -> None:
        for _ in range(n):
            self.widths.labels("m", engine).observe(width)

    def speculate(self, drafts: int, accepted: int, *, engine: str = "0") -> None:
        assert self.drafts is not None and self.accepted is not None
        self.drafts.labels("m", engine).inc(drafts)
        self.accepted.labels("m", engine).inc(accepted)

    def scrape(self) -> str:
        return generate_latest(self.registry).decode()


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["workload", "from-metrics", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _two_engine_run() -> tuple[str, str]:
    """Scrapes before and after a benchmark on two engines; what finished before the first must not count."""
    server = Server(BUCKETS_8192, engines=("0", "1"))
    server.steps(34, 10)
    server.steps(34, 10, engine="1")
    server.finish(100, 30)
    server.finish(100, 30, engine="1")
    server.speculate(10, 20)
    before = server.scrape()
    server.steps(51, 20)
    server.steps(68, 20, engine="1")
    for prompt, output, reason in ((15, 1, "stop"), (18, 7, "stop"), (40, 8, "stop"), (300, 60, "stop"),
                                   (300, 100, "stop"), (450, 150, "length")):
        server.finish(prompt, output, reason=reason)
    server.finish(3000, 900, engine="1", reason="abort")
    server.finish(6000, 1200, engine="1", reason="abort")
    server.speculate(150, 250)
    server.speculate(50, 50, engine="1")
    return before, server.scrape()


# --------------------------------------------------------------------------- a full interval
def test_before_and_elapsed_write_the_load_of_the_interval(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before, after = _two_engine_run()
    (tmp_path / "t0.prom").write_text(before)
    (tmp_path / "t1.prom").write_text(after)
    out = tmp_path / "bench.yaml"
    code, stdout, err = _run(capsys, str(tmp_path / "t1.prom"), "--before", str(tmp_path / "t0.prom"),
                             "--elapsed", "4", "--base", SPECULATIVE, "--out", str(out))
    assert code == 0, err
    assert "no traffic.load" not in err and "2 requests/s" in stdout
    workload = load_workload(out)
    # 8 requests finished in the interval (6 on engine 0, 2 on engine 1, stop/length/abort summed) in 4 s.
    # Prompts 15, 18 -> (10, 20] at 15; 40 -> (20, 50] at 35; 300, 300, 450 -> (200, 500] at 350;
    # 3000 -> (2000, 5000] at 3500; 6000 -> +Inf bucket (5000, 8192] at (5001 + 8192) // 2 = 6596.
    # Outputs 1 -> (0, 1] at 1; 7, 8 -> (5, 10] at 8; 60, 100 -> (50, 100] at 75; 150 -> (100, 200] at 150;
    # 900 -> (500, 1000] at 750; 1200 -> (1000, 2000] at 1500. 6596 + 1500 <= 8192: nothing clipped.
    # Acceptance: 1 + (250 + 50) accepted / (150 + 50) drafts = 2.5.
    expected = Load(Lengths(1, counts=((15, 2.0), (35, 1.0), (350, 3.0), (3500, 1.0), (6596, 1.0))),
                    Lengths(1, counts=((1, 1.0), (8, 2.0), (75, 2.0), (150, 1.0), (750, 1.0), (1500, 1.0))),
                    rate_per_s=2.0, acceptance=2.5)
    assert workload.load == expected
    assert sum(w for _, w in workload.traffic.widths.counts) == pytest.approx(40)  # widths as before: the interval
    note = workload.traffic.source_note
    assert "8 requests finished" in note and "in 4 s" in note and "every finished_reason summed" in note
    assert "middle whole length, rounded down" in note and "+Inf bucket ends at max_model_len=8192" in note
    assert "1 + 300 accepted draft tokens / 200 drafts" in note
    assert "counted at 6596, the middle of 5001..max_model_len=8192" in note
    header = out.read_text().split("name:")[0]
    assert "traffic.load comes from vLLM's request metrics" in header and "interval of 4 s" in header
    assert "1 + 300 accepted draft tokens" in header


def test_the_engine_filter_selects_the_request_metrics_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before, after = _two_engine_run()
    (tmp_path / "t0.prom").write_text(before)
    (tmp_path / "t1.prom").write_text(after)
    out = tmp_path / "e1.yaml"
    code, _, err = _run(capsys, str(tmp_path / "t1.prom"), "--before", str(tmp_path / "t0.prom"), "--elapsed", "4",
                        "--engine", "1", "--base", SPECULATIVE, "--out", str(out))
    assert code == 0, err
    # Engine 1 alone: 2 requests in 4 s, prompts 3000 and 6000, outputs 900 and 1200, 1 + 50 / 50 = 2.
    assert load_workload(out).load == Load(Lengths(1, counts=((3500, 1.0), (6596, 1.0))),
                                           Lengths(1, counts=((750, 1.0), (1500, 1.0))),
                                           rate_per_s=0.5, acceptance=2.0)


def test_wait_measures_the_time_between_the_scrapes(tmp_path: Path, loopback, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    server = Server(BUCKETS_8192, speculative=False)
    server.steps(20, 5)
    early = server.scrape()
    server.steps(40, 5)
    for _ in range(30):
        server.finish(50, 10)  # (20, 50] at 35, (5, 10] at 8
    for _ in range(30):
        server.finish(1000, 200, reason="length")  # (500, 1000] at 750, (100, 200] at 150
    late = server.scrape()
    # Each fetch is dated at its middle: 100.25 and 130.25, so 30 s apart, though --wait asked for 0.05.
    ticks = iter([100.0, 100.5, 130.0, 130.5])
    slept: list[float] = []
    monkeypatch.setattr("tuner.commands.workload._clock", lambda: next(ticks))
    monkeypatch.setattr("tuner.commands.workload._sleep", slept.append)
    out = tmp_path / "live.yaml"
    with loopback({"/metrics": [(200, early.encode()), (200, late.encode())]}) as base_url:
        code, _, err = _run(capsys, f"{base_url}/metrics", "--wait", "0.05", "--base", PLAIN, "--out", str(out))
    assert code == 0, err
    assert slept == [0.05]
    workload = load_workload(out)
    # 60 requests in 30 s; no speculation in the base, so the acceptance stays 1.
    assert workload.load == Load(Lengths(1, counts=((35, 30.0), (750, 30.0))),
                                 Lengths(1, counts=((8, 30.0), (150, 30.0))), rate_per_s=2.0, acceptance=1.0)
    assert "acceptance" not in yaml.safe_load(out.read_text())["traffic"]["load"]
    assert "30 s measured between the scrapes" in workload.traffic.source_note


# --------------------------------------------------------------------------- no load, and a note why
def _one_note(err: str, needle: str) -> None:
    notes = [line for line in err.splitlines() if line.startswith("note: no traffic.load written")]
    assert len(notes) == 1 and needle in notes[0], err


@pytest.mark.parametrize("interval, needle", [
    (False, "one scrape gives no request rate (use --wait SECONDS, or --before EARLIER with --elapsed SECONDS)"),
    (True, "--before without --elapsed"),
])
def test_without_an_interval_of_known_length_no_load_is_written(interval: bool, needle: str, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    before, after = _two_engine_run()
    (tmp_path / "t0.prom").write_text(before)
    (tmp_path / "t1.prom").write_text(after)
    out = tmp_path / "w.yaml"
    args = [str(tmp_path / "t1.prom"), "--base", SPECULATIVE, "--out", str(out)]
    code, _, err = _run(capsys, *args, *(["--before", str(tmp_path / "t0.prom")] if interval else []))
    assert code == 0, err
    _one_note(err, needle)
    assert load_workload(out).load is None and load_workload(out).traffic.widths is not None
    assert "No traffic.load: " in out.read_text().split("name:")[0]


def test_a_server_without_length_histograms_gets_no_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server = Server(BUCKETS_8192, lengths=False, speculative=False)
    before = server.scrape()
    server.steps(40, 5)
    server.finish(50, 10)
    (tmp_path / "t0.prom").write_text(before)
    (tmp_path / "t1.prom").write_text(server.scrape())
    out = tmp_path / "old.yaml"
    code, _, err = _run(capsys, str(tmp_path / "t1.prom"), "--before", str(tmp_path / "t0.prom"), "--elapsed", "10",
                        "--base", PLAIN, "--out", str(out))
    assert code == 0, err
    _one_note(err, "vllm:request_prompt_tokens histogram not present")
    assert load_workload(out).load is None


def test_a_speculative_base_without_spec_decode_counters_gets_no_load(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    server = Server(BUCKETS_8192, speculative=False)
    before = server.scrape()
    server.steps(51, 5)
    server.finish(50, 10)
    (tmp_path / "t0.prom").write_text(before)
    (tmp_path / "t1.prom").write_text(server.scrape())
    out = tmp_path / "spec.yaml"
    code, _, err = _run(capsys, str(tmp_path / "t1.prom"), "--before", str(tmp_path / "t0.prom"), "--elapsed", "10",
                        "--base", SPECULATIVE, "--out", str(out))
    assert code == 0, err
    _one_note(err, "speculates (q=17) but")
    _one_note(err, "vllm:spec_decode_num_drafts_total")
    assert load_workload(out).load is None


def test_no_draft_in_the_interval_gives_no_acceptance_and_no_load(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    server = Server(BUCKETS_8192)
    server.speculate(5, 5)
    before = server.scrape()
    server.steps(51, 5)
    server.finish(50, 10)
    (tmp_path / "t0.prom").write_text(before)
    (tmp_path / "t1.prom").write_text(server.scrape())
    out = tmp_path / "spec.yaml"
    code, _, err = _run(capsys, str(tmp_path / "t1.prom"), "--before", str(tmp_path / "t0.prom"), "--elapsed", "10",
                        "--base", SPECULATIVE, "--out", str(out))
    assert code == 0, err
    _one_note(err, "vllm:spec_decode_num_drafts_total did not grow")


# --------------------------------------------------------------------------- clipping
def test_lengths_and_acceptance_are_clipped_to_the_base_spec(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    server = Server(BUCKETS_512)
    before = server.scrape()
    server.steps(100, 5)
    server.finish(30, 3)  # prompt (20, 50] at 35, output (2, 5] at 4
    server.finish(150, 450)  # prompt (100, 200] at 150, output (200, 500] at 350
    server.finish(505, 3)  # prompt in the +Inf bucket (500, 512]: at (501 + 512) // 2 = 506
    server.speculate(10, 40)  # 1 + 40 / 10 = 5 tokens per step, more than q = 4 can hold
    (tmp_path / "t0.prom").write_text(before)
    (tmp_path / "t1.prom").write_text(server.scrape())
    out = tmp_path / "tiny.yaml"
    code, _, err = _run(capsys, str(tmp_path / "t1.prom"), "--before", str(tmp_path / "t0.prom"), "--elapsed", "1.5",
                        "--base", TINY, "--out", str(out))
    assert code == 0, err
    # 506 + 350 > 512: cut in proportion, prompts to 512 * 506 // 856 = 302, outputs to 512 - 302 = 210.
    workload = load_workload(out)
    assert workload.load == Load(Lengths(1, counts=((35, 1.0), (150, 1.0), (302, 1.0))),
                                 Lengths(1, counts=((4, 2.0), (210, 1.0))), rate_per_s=2.0, acceptance=4.0)
    note = workload.traffic.source_note
    assert "exceed serving.max_model_len=512 together" in note
    assert "cut in proportion to their lengths to 302 + 210: 1 requests' prompts counted at 302 tokens, " \
           "1 requests' outputs counted at 210 tokens." in note
    assert "= 5 tokens per decode step, clipped to 4 (1..q=4)" in note


def test_representative_lengths_of_vllm_buckets_and_past_max_model_len() -> None:
    # Buckets (0,1] (1,2] (2,5] (5,10] (10,20] (20,50] +Inf with one request each, max_model_len 60.
    hist = TokenHistogram((1, 2, 5, 10, 20, 50), (1, 2, 3, 4, 5, 6), 7)
    placed = representative_lengths(hist, 60)
    assert placed.counts == {1: 1, 2: 1, 4: 1, 8: 1, 15: 1, 35: 1, 55: 1}  # +Inf: (51 + 60) // 2
    # A server with a longer max_model_len than the base spec: (0, 100] ends at 40, (100, +Inf] sits at 40.
    wide = representative_lengths(TokenHistogram((100,), (3,), 5), 40)
    assert wide.counts == {20: 3, 40: 2}
    assert any("above the base spec's serving.max_model_len=40" in n for n in wide.notes)
    # Requests with no output tokens (a bucket le=0) count as 1 token.
    assert representative_lengths(TokenHistogram((0, 1), (2, 2), 2), 60).counts == {1: 2}
    with pytest.raises(TrafficError, match="holds no whole token count"):
        representative_lengths(TokenHistogram((1.2, 1.8), (0, 3), 3), 60)


def test_fit_model_len_leaves_lengths_that_fit_alone() -> None:
    assert fit_model_len({10: 1.0, 100: 2.0}, {50: 1.0}, 150) == ({10: 1.0, 100: 2.0}, {50: 1.0}, None)
    prompt, output, note = fit_model_len({100: 1.0}, {100: 1.0}, 150)
    assert (prompt, output) == ({75: 1.0}, {75: 1.0}) and note is not None


# --------------------------------------------------------------------------- counters and corrupt input
def test_counters_are_read_by_their_total_samples_and_selected_by_label() -> None:
    server = Server(BUCKETS_8192, engines=("0", "1"))
    server.finish(10, 10, reason="stop")
    server.finish(10, 10, reason="length")
    server.finish(10, 10, engine="1", reason="abort")
    text = server.scrape()
    series = parse_counter(text, "vllm:request_success")
    assert len(series) == 10 and sum(series.values()) == 3  # 2 engines x 5 reasons
    assert read_counter(Scrapes(text, "t"), "vllm:request_success").total == 3
    assert read_counter(Scrapes(text, "t", engine="0"), "vllm:request_success").total == 2
    no_comments = "".join(line + "\n" for line in text.splitlines() if not line.startswith("#"))
    assert sum(parse_counter(no_comments, "vllm:request_success").values()) == 3  # untyped samples, same names
    with pytest.raises(MetricAbsent, match="no vllm:spec_decode_num_drafts_total counter"):
        parse_counter(Server(BUCKETS_8192, speculative=False).scrape(), "vllm:spec_decode_num_drafts")
    with pytest.raises(MetricAbsent, match="engine='7'"):
        read_counter(Scrapes(text, "t", engine="7"), "vllm:request_success")


@pytest.mark.parametrize("value", ["NaN", "-3", "+Inf"])
def test_a_counter_that_is_not_a_count_is_one_line(value: str) -> None:
    text = f'vllm:request_success_total{{engine="0",finished_reason="stop",model_name="m"}} {value}\n'
    with pytest.raises(TrafficError) as info:
        parse_counter(text, "vllm:request_success", where="t1.prom")
    message = str(info.value)
    assert "\n" not in message and message.startswith("t1.prom: vllm:request_success_total{")
    assert "must be finite and >= 0" in message


def test_a_counter_that_went_down_is_a_restart_exit_2_nothing_written(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    first = Server(BUCKETS_8192, speculative=False)  # the run the earlier scrape saw
    first.steps(40, 2)
    for _ in range(10):
        first.finish(50, 10)
    second = Server(BUCKETS_8192, speculative=False)  # after a restart: more steps already, fewer requests
    second.steps(40, 6)
    for _ in range(4):
        second.finish(50, 10)
    (tmp_path / "t0.prom").write_text(first.scrape())
    (tmp_path / "t1.prom").write_text(second.scrape())
    out = tmp_path / "new.yaml"
    before = sorted(p.name for p in tmp_path.iterdir())
    code, stdout, err = _run(capsys, str(tmp_path / "t1.prom"), "--before", str(tmp_path / "t0.prom"),
                             "--elapsed", "10", "--base", PLAIN, "--out", str(out))
    assert code == 2 and stdout == ""
    assert err.count("\n") == 1 and err.startswith("cgtune workload: error: --before ")
    assert "vllm:request_success_total{" in err and "went down between the scrapes (10 -> 4" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize("argv, match", [
    (["--elapsed", "5"], "--elapsed: only with --before"),
    (["--before", "T0", "--elapsed", "0"], "must be a finite number > 0"),
])
def test_elapsed_needs_before_and_a_positive_number(argv: list[str], match: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "t1.prom").write_text(Server(BUCKETS_8192).scrape())
    argv = [str(tmp_path / "t0.prom") if a == "T0" else a for a in argv]
    try:
        code, _, err = _run(capsys, str(tmp_path / "t1.prom"), *argv, "--base", PLAIN, "--out",
                            str(tmp_path / "o.yaml"))
    except SystemExit as exc:  # argparse's own type check
        code, err = exc.code, capsys.readouterr().err
    assert code == 2 and match in err and err.count("\n") == 1, err
    assert not (tmp_path / "o.yaml").exists()


def test_the_names_buckets_and_formula_written_here_are_vllm_0_33s() -> None:
    # Read from the installed vLLM 0.33.0 source (as .ci/run installs it), without importing vLLM itself.
    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        version = None
    if version != "0.33.0":
        reason = f"vllm==0.33.0 is not installed (found {version})"
        if os.environ.get("CGTUNE_REQUIRE_VLLM") == "1":
            pytest.fail(f"CGTUNE_REQUIRE_VLLM=1 but {reason}")
        pytest.skip(reason)
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    root = Path(next(iter(spec.submodule_search_locations)))
    buckets_spec = importlib.util.spec_from_file_location("_vllm_buckets", root / "v1/metrics/buckets.py")
    assert buckets_spec is not None and buckets_spec.loader is not None
    buckets = importlib.util.module_from_spec(buckets_spec)
    buckets_spec.loader.exec_module(buckets)  # stdlib imports only
    assert buckets.histogram_buckets("request_tokens", max_model_len=8192) == BUCKETS_8192
    assert buckets.histogram_buckets("request_tokens", max_model_len=512) == BUCKETS_512
    loggers = (root / "v1/metrics/loggers.py").read_text()
    for name in ("vllm:request_success", "vllm:request_prompt_tokens", "vllm:request_generation_tokens"):
        assert f'name="{name}"' in loggers
    assert 'labelnames = ["model_name", "engine"]' in loggers and 'labelnames + ["finished_reason"]' in loggers
    spec_decode = (root / "v1/spec_decode/metrics.py").read_text()
    assert '"vllm:spec_decode_num_drafts"' in spec_decode and '"vllm:spec_decode_num_accepted_tokens"' in spec_decode
    formula = re.sub(r"\s+", " ", spec_decode)
    assert ("1 + ( rate(vllm:spec_decode_num_accepted_tokens_total[$interval]) / "
            "rate(vllm:spec_decode_num_drafts_total[$interval]))") in formula
    reasons = re.search(r"FINISH_REASON_STRINGS = \(([^)]*)\)", (root / "v1/engine/__init__.py").read_text())
    assert reasons is not None and tuple(re.findall(r'"(\w+)"', reasons.group(1))) == REASONS
