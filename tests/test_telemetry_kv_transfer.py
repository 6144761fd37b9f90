"""A disaggregated server's KV transfers over the run's window, from its Prometheus histograms:
vLLM's NixlConnector names (vLLM 0.32, kv_connector/v1/nixl/stats.py), written by the real
`prometheus-client` and served over loopback, read by the run's server sampler."""

from __future__ import annotations

import time

import pytest
from cbbench.harness.telemetry.server_sampler import ServerMetricsSampler
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from telemetry_server import MetricsServer

LABELS = {"model_name": "m", "engine": "0"}


def _nixl_text(transfers: list[tuple[float, int]], nixl: bool = True) -> str:
    reg = CollectorRegistry()
    Gauge("vllm:num_requests_running", "", list(LABELS), registry=reg).labels(**LABELS).set(2)
    if not nixl:  # an aggregated server: no connector, no transfer families
        return generate_latest(reg).decode()
    secs = Histogram("vllm:nixl_xfer_time_seconds", "", list(LABELS), registry=reg,
                     buckets=(0.001, 0.005, 0.01, 0.05, 0.1))  # fmt: skip
    nbytes = Histogram("vllm:nixl_bytes_transferred", "", list(LABELS), registry=reg,
                       buckets=[2 ** (10 + i) for i in range(1, 25, 2)])  # fmt: skip
    for s, b in transfers:
        secs.labels(**LABELS).observe(s)
        nbytes.labels(**LABELS).observe(b)
    return generate_latest(reg).decode()


def test_vllm_nixl_transfer_seconds_and_bytes_over_the_window():
    before = [(0.5, 2**30)]  # before the run: not in the window
    during = [(0.004, 2**20), (0.004, 2**20), (0.03, 2**22), (0.03, 2**22)]
    summary: dict = {}
    with MetricsServer(_nixl_text(before)) as server:
        sampler = ServerMetricsSampler(server.url, interval_s=0.02)
        samples: list = []
        sampler.start(time.monotonic_ns(), samples.append)
        try:
            deadline = time.monotonic() + 10
            while len(samples) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            server.text = _nixl_text(before + during)
            hits = server.hits
            while server.hits < hits + 2 and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            sampler.stop()
        summary = sampler.summary()
    t, b = summary["kv_transfer_time"], summary["kv_transfer_bytes"]
    assert t["count"] == 4 and t["mean"] == pytest.approx(0.017)
    assert b["count"] == 4 and b["mean"] == pytest.approx((2 * 2**20 + 2 * 2**22) / 4)
    assert t["method"] == "estimated from histogram"


def test_no_kv_transfer_fields_on_an_aggregated_server():
    with MetricsServer(_nixl_text([], nixl=False)) as server:
        sampler = ServerMetricsSampler(server.url, interval_s=0.02)
        samples: list = []
        sampler.start(time.monotonic_ns(), samples.append)
        deadline = time.monotonic() + 10
        while len(samples) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        sampler.stop()
        summary = sampler.summary()
    assert "kv_transfer_time" not in summary and "kv_transfer_bytes" not in summary  # absent
