"""Parsing vLLM's iteration-tokens histogram from real-format exposition text, and the interval of two scrapes."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from tuner.workload.traffic import TrafficError, combine, interval, parse_exposition, select_series

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def test_reads_every_engine_series_with_buckets_count_and_sum(vllm_metrics: str) -> None:
    series = parse_exposition(vllm_metrics)
    assert sorted(dict(k)["engine"] for k in series) == ["0", "1"]
    engine0 = series[(("engine", "0"), ("model_name", MODEL))]
    assert engine0.bounds == (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
    assert engine0.cumulative[:3] == (3, 10, 25)
    assert engine0.count == 900 and engine0.sum == 231000
    # The +Inf bucket becomes the last bucket; non-cumulative counts add back up to _count.
    buckets = engine0.buckets()
    assert buckets[0] == (0.0, 1, 3) and buckets[1] == (1, 8, 7)
    assert buckets[-1][1] == math.inf and buckets[-1][2] == 0
    assert sum(c for _, _, c in buckets) == 900


def test_sums_engines_and_filters_by_label(vllm_metrics: str) -> None:
    series = parse_exposition(vllm_metrics)
    total = combine(series)
    assert total.count == 1700 and total.sum == 401000 and len(total.series) == 2
    assert total.cumulative[0] == 4
    one = combine(select_series(series, engine="1"))
    assert one.count == 800
    assert combine(select_series(series, model_name=MODEL)).count == 1700
    with pytest.raises(TrafficError, match=r"engine='7' \(found: 0, 1\)"):
        select_series(series, engine="7")
    with pytest.raises(TrafficError, match="model_name='other'"):
        select_series(series, model_name="other")


def test_reads_what_prometheus_client_itself_exports() -> None:
    registry = CollectorRegistry()
    hist = Histogram("vllm:iteration_tokens_total", "tokens per step", ["model_name", "engine"],
                     buckets=[1, 8, 16, 32], registry=registry)
    for width in (1, 5, 8, 9, 40, 40):
        hist.labels("m", "0").observe(width)
    parsed = combine(parse_exposition(generate_latest(registry).decode()))
    assert parsed.cumulative == (1, 3, 4, 4) and parsed.count == 6 and parsed.sum == 103


def test_no_type_lines_still_finds_the_histogram() -> None:
    # Some relabeling proxies drop comments; the samples alone must still be read.
    text = "\n".join([
        'vllm:iteration_tokens_total_bucket{le="8"} 2',
        'vllm:iteration_tokens_total_bucket{le="+Inf"} 5',
        "vllm:iteration_tokens_total_count 5",
    ]) + "\n"
    assert combine(parse_exposition(text)).cumulative == (2,)


def _scrape(counts0: list[int], total0: int, counts1: list[int], total1: int, sum0: float = 0, sum1: float = 0) -> str:
    lines = ["# TYPE vllm:iteration_tokens_total histogram"]
    for engine, counts, total, s in (("0", counts0, total0, sum0), ("1", counts1, total1, sum1)):
        for le, c in zip(("8.0", "16.0", "32.0"), counts):
            lines.append(f'vllm:iteration_tokens_total_bucket{{engine="{engine}",le="{le}",model_name="m"}} {c}')
        lines.append(f'vllm:iteration_tokens_total_bucket{{engine="{engine}",le="+Inf",model_name="m"}} {total}')
        lines.append(f'vllm:iteration_tokens_total_count{{engine="{engine}",model_name="m"}} {total}')
        lines.append(f'vllm:iteration_tokens_total_sum{{engine="{engine}",model_name="m"}} {s}')
    return "\n".join(lines) + "\n"


def test_interval_is_the_difference_of_two_scrapes_per_series() -> None:
    before = parse_exposition(_scrape([1, 2, 3], 4, [0, 0, 5], 5, 50, 100))
    after = parse_exposition(_scrape([3, 6, 9], 12, [0, 1, 7], 9, 170, 190))
    diff = interval(after, before)
    engine0 = diff[(("engine", "0"), ("model_name", "m"))]
    assert engine0.cumulative == (2, 4, 6) and engine0.count == 8 and engine0.sum == 120
    total = combine(diff)
    assert total.cumulative == (2, 5, 8) and total.count == 12 and total.sum == 210


def test_interval_counts_an_engine_that_appeared_later_in_full() -> None:
    before = select_series(parse_exposition(_scrape([1, 2, 3], 4, [0, 0, 5], 5)), engine="0")
    after = parse_exposition(_scrape([1, 2, 3], 4, [0, 1, 7], 9))
    assert combine(interval(after, before)).count == 9


@pytest.mark.parametrize("before, after, match", [
    ((_scrape([3, 6, 9], 12, [0, 1, 7], 9)), (_scrape([1, 2, 3], 4, [0, 0, 5], 5)), "went down"),
    ((_scrape([1, 2, 3], 4, [0, 0, 5], 5)), (_scrape([1, 2, 3], 4, [0, 0, 5], 5).replace('le="32.0"', 'le="64.0"')),
     "different bucket bounds"),
    # The later scrape is cumulative, but minus the earlier one it is not: the two runs are unrelated.
    ((_scrape([0, 5, 5], 5, [0, 0, 0], 0)), (_scrape([4, 6, 9], 9, [0, 0, 0], 0)), "not cumulative"),
])
def test_interval_rejects_scrapes_of_different_runs(before: str, after: str, match: str) -> None:
    with pytest.raises(TrafficError, match=match):
        interval(parse_exposition(after), parse_exposition(before))


def test_interval_rejects_a_series_that_vanished() -> None:
    before = parse_exposition(_scrape([1, 2, 3], 4, [0, 0, 5], 5))
    after = select_series(before, engine="0")
    with pytest.raises(TrafficError, match="not the later"):
        interval(after, before)


@pytest.mark.parametrize("text, match", [
    ("<html><body>502 Bad Gateway</body></html>\n", r"not Prometheus text exposition \(line 1"),
    ('{"iteration_tokens": [1, 2]}\n', "not Prometheus text"),
    ("# just a comment\n\n", "no samples"),
    ("", "no samples"),
    ("vllm:num_requests_running 3\n", "histogram not present"),
    ("vllm:iteration_tokens_total_count 3\nvllm:iteration_tokens_total_sum 9\n", "no _bucket samples"),
    ('vllm:iteration_tokens_total_bucket{le="8"} 2\n', r'no le="\+Inf" bucket'),
    ('vllm:iteration_tokens_total_bucket{le="8"} -2\nvllm:iteration_tokens_total_bucket{le="+Inf"} 2\n', ">= 0"),
    ('vllm:iteration_tokens_total_bucket{le="8"} 5\nvllm:iteration_tokens_total_bucket{le="16"} 3\n'
     'vllm:iteration_tokens_total_bucket{le="+Inf"} 6\n', r"not cumulative: le=16 holds 3"),
    ('vllm:iteration_tokens_total_bucket{le="8"} 5\nvllm:iteration_tokens_total_bucket{le="+Inf"} 4\n',
     "not cumulative: le=inf"),
    ('vllm:iteration_tokens_total_bucket{le="8"} 5\nvllm:iteration_tokens_total_bucket{le="+Inf"} 6\n'
     "vllm:iteration_tokens_total_count 7\n", "_count=7 differs"),
    ('vllm:iteration_tokens_total_bucket{le="8"} NaN\nvllm:iteration_tokens_total_bucket{le="+Inf"} 6\n', "finite"),
    ('vllm:iteration_tokens_total_bucket{le="eight"} 1\nvllm:iteration_tokens_total_bucket{le="+Inf"} 6\n',
     "not a number"),
    ("vllm:iteration_tokens_total_bucket 1\n", "no le label"),
])
def test_bad_exposition_is_one_clear_error(text: str, match: str) -> None:
    with pytest.raises(TrafficError, match=match) as info:
        parse_exposition(text, where="m.prom")
    assert str(info.value).startswith("m.prom: ") and "\n" not in str(info.value)


def test_combine_refuses_series_with_other_bounds() -> None:
    text = _scrape([1, 2, 3], 4, [0, 0, 5], 5).replace('engine="1",le="32.0"', 'engine="1",le="64.0"')
    with pytest.raises(TrafficError, match="pick one with --engine"):
        combine(parse_exposition(text))
