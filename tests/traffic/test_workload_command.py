"""`cgtune workload`: buckets, from-metrics (file, stdin, loopback URL, interval) and from-trace, and bad input."""

from __future__ import annotations

import io
import json
import socket
import threading
from pathlib import Path

import pytest
import yaml

from tuner.cli import main
from tuner.workload.spec import load_workload

WORKLOADS = Path(__file__).resolve().parents[2] / "workloads"
BASE = str(WORKLOADS / "dflash-llama-3.1-8b.yaml")


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["workload", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _scrape(total: int, per_bucket: dict[str, int] | None = None, engine: str = "0") -> str:
    """One engine's histogram with vLLM's default bounds; `per_bucket` puts steps into buckets by le."""
    per_bucket = per_bucket or {"64.0": total}
    lines = ["# HELP vllm:iteration_tokens_total Histogram of number of tokens per engine_step.",
             "# TYPE vllm:iteration_tokens_total histogram"]
    running = 0
    for le in ("1.0", "8.0", "16.0", "32.0", "64.0", "128.0", "256.0", "512.0", "1024.0", "2048.0", "4096.0",
               "8192.0", "16384.0"):
        running += per_bucket.get(le, 0)
        lines.append(f'vllm:iteration_tokens_total_bucket{{engine="{engine}",le="{le}",model_name="m"}} {running}.0')
    lines.append(f'vllm:iteration_tokens_total_bucket{{engine="{engine}",le="+Inf",model_name="m"}} {running}.0')
    lines.append(f'vllm:iteration_tokens_total_count{{engine="{engine}",model_name="m"}} {running}.0')
    lines.append(f'vllm:iteration_tokens_total_sum{{engine="{engine}",model_name="m"}} {running * 50}.0')
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- good paths
def test_buckets_prints_the_custom_histogram_buckets_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "buckets", str(WORKLOADS / "tiny-cpu.yaml"))
    assert code == 0 and err == ""
    value = json.loads(out)
    assert list(value) == ["iteration_tokens"]
    assert value["iteration_tokens"][:4] == [1, 2, 4, 8] and 640 in value["iteration_tokens"]
    assert " " not in out.strip()  # one shell word, so "$(cgtune workload buckets ...)" passes it intact


def test_from_metrics_file_writes_a_loadable_workload(tmp_path: Path, vllm_metrics: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "scrape.prom"
    source.write_text(vllm_metrics)
    out = tmp_path / "real.yaml"
    code, stdout, err = _run(capsys, "from-metrics", str(source), "--base", BASE, "--out", str(out))
    assert code == 0, err
    assert "1700 steps" in stdout and "coarse buckets" in err
    workload = load_workload(out)
    assert workload.name == "real"
    base = load_workload(BASE)
    assert workload.serving == base.serving and workload.model == base.model
    assert workload.traffic.widths is not None
    assert sum(w for _, w in workload.traffic.widths.counts) == pytest.approx(1700, rel=1e-5)
    assert abs(sum(s.probability for s in workload.steps()) - 1) < 1e-9
    note = workload.traffic.source_note
    assert "1700 steps" in note and "engine=0" in note and "engine=1" in note and "multiples of q=17" in note
    assert "cgtune workload buckets" in note  # default buckets are too coarse, and the note says how to fix it
    text = out.read_text()
    assert text.startswith("# Made by `cgtune workload from-metrics`") and "multiples of q=17" in text.split("name:")[0]


def test_from_metrics_engine_filter_and_stdin(tmp_path: Path, vllm_metrics: str, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(vllm_metrics))
    out = tmp_path / "e1.yaml"
    code, stdout, err = _run(capsys, "from-metrics", "-", "--engine", "1", "--base", BASE, "--out", str(out))
    assert code == 0, err
    workload = load_workload(out)
    assert sum(w for _, w in workload.traffic.widths.counts) == pytest.approx(800, rel=1e-5)
    assert "engine=0" not in workload.traffic.source_note and "stdin" in workload.traffic.source_note


def test_from_metrics_interval_between_two_scrapes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "t0.prom").write_text(_scrape(0, {"32.0": 10, "64.0": 5}))
    (tmp_path / "t1.prom").write_text(_scrape(0, {"32.0": 10, "64.0": 25, "128.0": 4}))
    out = tmp_path / "bench.yaml"
    code, stdout, err = _run(capsys, "from-metrics", "--after", str(tmp_path / "t1.prom"),
                             "--before", str(tmp_path / "t0.prom"), "--base", BASE, "--out", str(out))
    assert code == 0, err
    counts = dict(load_workload(out).traffic.widths.counts)
    # 20 new steps in (32, 64] (at 34 and 51) and 4 in (64, 128] (at 68, 85, 102, 119): nothing older.
    assert sum(counts.values()) == pytest.approx(24)
    assert sorted(counts) == [34, 51, 68, 85, 102, 119]
    assert "(interval)" in load_workload(out).traffic.source_note


def test_from_metrics_reads_a_url_on_a_loopback_server(tmp_path: Path, vllm_metrics: str, loopback,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "live.yaml"
    with loopback({"/metrics": (200, vllm_metrics.encode())}) as base_url:
        code, stdout, err = _run(capsys, "from-metrics", f"{base_url}/metrics", "--base", BASE, "--out", str(out),
                                 "--timeout", "2")
    assert code == 0, err
    assert sum(w for _, w in load_workload(out).traffic.widths.counts) == pytest.approx(1700, rel=1e-5)
    assert "127.0.0.1" in load_workload(out).traffic.source_note


def test_from_metrics_wait_scrapes_a_url_twice(tmp_path: Path, loopback, capsys: pytest.CaptureFixture[str]) -> None:
    early, late = _scrape(0, {"32.0": 10}), _scrape(0, {"32.0": 10, "64.0": 6})
    out = tmp_path / "hour.yaml"
    with loopback({"/metrics": [(200, early.encode()), (200, late.encode())]}) as base_url:
        code, stdout, err = _run(capsys, "from-metrics", f"{base_url}/metrics", "--wait", "0.05", "--base", BASE,
                                 "--out", str(out))
    assert code == 0, err
    counts = dict(load_workload(out).traffic.widths.counts)
    assert counts == {34: 3, 51: 3}
    assert "interval of 0.05 s" in load_workload(out).traffic.source_note


def test_from_metrics_force_replaces_and_name_flag(tmp_path: Path, vllm_metrics: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "s.prom"
    source.write_text(vllm_metrics)
    out = tmp_path / "w.yaml"
    out.write_text("old")
    code, _, err = _run(capsys, "from-metrics", str(source), "--base", BASE, "--out", str(out), "--force",
                        "--name", "prod-traffic")
    assert code == 0, err
    assert load_workload(out).name == "prod-traffic"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.prom", "w.yaml"]  # no temp file left behind


def test_from_trace_references_the_csv_relative_to_the_workload(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "logs").mkdir()
    trace = tmp_path / "logs" / "steps.csv"
    trace.write_text("num_tokens,num_reqs,is_uniform_decode\n1700,100,true\n2176,128,\n900,,false\n17,,\n")
    out = tmp_path / "traced.yaml"
    code, stdout, err = _run(capsys, "from-trace", str(trace), "--base", BASE, "--out", str(out))
    assert code == 0, err
    assert "4 steps" in stdout and "75% uniform decode" in stdout
    spec = yaml.safe_load(out.read_text())
    assert spec["traffic"]["trace"] == "logs/steps.csv"
    workload = load_workload(out)
    assert workload.traffic.trace == ((1700, True, 100), (2176, True, 128), (900, False, None), (17, True, None))

    # --out into folders that do not exist yet: created, as every command's --out; the trace path follows.
    nested = tmp_path / "new" / "deeper" / "traced.yaml"
    code, _, err = _run(capsys, "from-trace", str(trace), "--base", BASE, "--out", str(nested))
    assert code == 0, err
    assert yaml.safe_load(nested.read_text())["traffic"]["trace"] == "../../logs/steps.csv"
    assert load_workload(nested).traffic.trace == workload.traffic.trace


# --------------------------------------------------------------------------- bad input
def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


BAD_TEXT = {
    "html": "<html><body>502 Bad Gateway</body></html>\n",
    "missing": "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n",
    "negative": 'vllm:iteration_tokens_total_bucket{le="8"} -1\nvllm:iteration_tokens_total_bucket{le="+Inf"} 2\n',
    "non_monotone": ('vllm:iteration_tokens_total_bucket{le="8"} 5\nvllm:iteration_tokens_total_bucket{le="16"} 2\n'
                     'vllm:iteration_tokens_total_bucket{le="+Inf"} 6\n'),
    "no_inf": 'vllm:iteration_tokens_total_bucket{le="8"} 5\n',
    "zero": _scrape(0, {}),
    "too_wide": _scrape(0, {"16384.0": 3}),  # steps above the base spec's 8192-token budget
}


@pytest.mark.parametrize("case, match", [
    ("html", "not Prometheus text"),
    ("missing", "histogram not present"),
    ("negative", "must be >= 0"),
    ("non_monotone", "not cumulative"),
    ("no_inf", "+Inf"),
    ("zero", "zero steps"),
    ("too_wide", "max_num_batched_tokens=8192"),
    ("binary", "not text"),
    ("no_file", "no such file"),
    ("engine", "engine='9'"),
    ("out_exists", "exists (pass --force"),
    ("out_dir", "good.prom' is a file"),
    ("both_sources", "not both"),
    ("no_source", "SOURCE: required"),
    ("stdin_twice", "only one of the two"),
    ("swapped", "went down"),
    ("same_scrape", "zero steps between the two scrapes"),
    ("bad_base", "not a file"),
    ("bad_name", "--name"),
    ("refused", "cannot reach"),
    ("http_404", "HTTP 404"),
    ("timeout", "cannot reach"),
    ("wait_file", "needs SOURCE to be a URL"),
    ("wait_before", "not both"),
    ("trace_missing", "no such file"),
    ("trace_bad", "num_tokens"),
])
def test_bad_input_is_one_line_exit_2_nothing_written(case: str, match: str, tmp_path: Path, loopback,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "new.yaml"
    good = tmp_path / "good.prom"
    good.write_text(_scrape(10))
    later = tmp_path / "later.prom"
    later.write_text(_scrape(0, {"64.0": 30}))
    args = ["from-metrics", str(good), "--base", BASE, "--out", str(out)]
    if case in BAD_TEXT:
        (tmp_path / "bad.prom").write_text(BAD_TEXT[case])
        args[1] = str(tmp_path / "bad.prom")
    elif case == "binary":
        (tmp_path / "bad.prom").write_bytes(b"\xff\xfe\x00garbage")
        args[1] = str(tmp_path / "bad.prom")
    elif case == "no_file":
        args[1] = str(tmp_path / "nope.prom")
    elif case == "engine":
        args += ["--engine", "9"]
    elif case == "out_exists":
        out.write_text("keep me\n")
    elif case == "out_dir":  # missing parents are created (as for every --out), but not under a file
        out = tmp_path / "good.prom" / "new.yaml"
        args[-1] = str(out)
    elif case == "both_sources":
        args += ["--after", str(good)]
    elif case == "no_source":
        args = args[:1] + args[2:]
    elif case == "stdin_twice":
        monkeypatch.setattr("sys.stdin", io.StringIO(_scrape(10)))
        args[1] = "-"
        args += ["--before", "-"]
    elif case == "swapped":
        args[1] = str(good)
        args += ["--before", str(later)]
    elif case == "same_scrape":
        args += ["--before", str(good)]
    elif case == "bad_base":
        args[3] = str(tmp_path / "nope.yaml")
    elif case == "bad_name":
        args += ["--name", "has space"]
    elif case == "refused":
        args[1] = f"http://127.0.0.1:{_unused_port()}/metrics"
        args += ["--timeout", "2"]
    elif case == "wait_file":
        args += ["--wait", "1"]
    elif case == "wait_before":
        args[1] = "http://127.0.0.1:9/metrics"
        args += ["--wait", "1", "--before", str(good)]
    elif case == "trace_missing":
        args = ["from-trace", str(tmp_path / "nope.csv"), "--base", BASE, "--out", str(out)]
    elif case == "trace_bad":
        (tmp_path / "t.csv").write_text("tokens\n5\n")
        args = ["from-trace", str(tmp_path / "t.csv"), "--base", BASE, "--out", str(out)]

    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    if case == "http_404":
        with loopback({"/metrics": (200, b"")}) as base_url:
            args[1] = f"{base_url}/wrong"
            code, stdout, err = _run(capsys, *args)
    elif case == "timeout":
        # A socket that listens but never answers: the connection opens, the response never comes.
        with socket.socket() as silent:
            silent.bind(("127.0.0.1", 0))
            silent.listen(1)
            args[1] = f"http://127.0.0.1:{silent.getsockname()[1]}/metrics"
            args += ["--timeout", "0.3"]
            code, stdout, err = _run(capsys, *args)
    else:
        code, stdout, err = _run(capsys, *args)

    assert code == 2, (stdout, err)
    assert stdout == ""
    assert err.count("\n") == 1 and err.startswith("cgtune workload: error: ") and match in err, err
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    assert after == before  # nothing written, nothing replaced, no temp file left behind


def test_missing_required_flags_are_argparse_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["workload", "from-metrics", "x.prom"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--base" in err


def test_no_loopback_server_outlives_its_test() -> None:
    assert not [t for t in threading.enumerate() if t.name == "cgtune-test-loopback" and t.is_alive()]
