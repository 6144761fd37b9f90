"""t0 comes after every telemetry sampler is up (issue 51 #2): a slow first /metrics scrape
(150 ms here, 70-170 ms measured on real exporters and NVML) is not inside the measured
window. A 96-request closed-loop run (~0.9 s): the first request leaves at t0, not a scrape
later (0.3 ms measured; bounded here by a third of the scrape, as the machine is shared), and
the reported requests/s is within 3 % of count / (last end - first send): a scrape inside the
window would be ~15 % (at 24 requests, ~0.22 s, a first send 7.4 ms after t0 on a clean CI
clone was already 3.3 %); the sampler's samples are still stamped from t0 (the window's first
scrape before it)."""

from __future__ import annotations

import json

import pytest
from cbbench.harness.cli import main
from servers.fake import Behavior, FakeServerConfig, threaded
from telemetry_server import MetricsServer, fixture

# serial (the first send within 50 ms of t0, requests/s within 3 %): the README's command
# runs it after the parallel phase, alone
pytestmark = pytest.mark.serial


def test_sampler_start_up_is_outside_the_measured_window(tmp_path) -> None:
    out = tmp_path / "r"
    with (
        MetricsServer(fixture("vllm.txt")) as metrics,
        threaded(FakeServerConfig(Behavior(ttft_s=0.005, itl_s=0.004))) as srv,
    ):
        metrics.delay_s = 0.15
        argv = ["bench", "--base-url", srv.url, "--out", str(out), "--no-live"]
        argv += ["--workload", "seed-demo", "--num-requests", "96", "--concurrency", "4"]
        argv += ["--metrics-url", metrics.url, "--no-gpu-metrics", "--metrics-interval", "0.05"]
        assert main(argv) == 0
    meta = json.loads((out / "run.json").read_text())
    rows = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    first_send = min(r["sent_s"] for r in rows)
    last_end = max(r["end_s"] for r in rows)
    # the exporter's 150 ms is outside the window (the done-when's 5 ms is a measurement on an
    # idle loop: 0.3 ms; a loaded CI box may be a few ms late, never a scrape late)
    assert 0 <= first_send < 0.05, first_send
    rps = meta["summary"]["request_throughput"]
    assert len(rows) == 96
    assert abs(rps / (96 / (last_end - first_send)) - 1) < 0.03, (rps, first_send, last_end)
    samples = [json.loads(x) for x in (out / "timeseries.jsonl").read_text().splitlines()]
    server = [s["t_s"] for s in samples if s.get("source") == "server"]
    assert server and min(server) < 0 < max(server), server  # first scrape before t0
    assert meta["summary"]["telemetry"]["server"]["samples"] >= 2


def test_an_open_loop_run_is_not_client_bound_from_sampler_start_up(tmp_path) -> None:
    """The first requests of an open-loop run were due while the samplers started: their send
    lag (76 ms p99) flagged the run CLIENT-BOUND."""
    out = tmp_path / "open"
    with (
        MetricsServer(fixture("vllm.txt")) as metrics,
        threaded(FakeServerConfig(Behavior(ttft_s=0.005, itl_s=0.002))) as srv,
    ):
        metrics.delay_s = 0.15
        argv = ["bench", "--base-url", srv.url, "--out", str(out), "--no-live"]
        argv += ["--workload", "seed-demo", "--num-requests", "40", "--request-rate", "40"]
        argv += ["--metrics-url", metrics.url, "--no-gpu-metrics", "--arrival", "constant"]
        assert main(argv) == 0
    summary = json.loads((out / "run.json").read_text())["summary"]
    assert not summary["client_bound"], summary["client_bound_reason"]
    assert summary["send_lag_s"]["max"] < 0.05, summary["send_lag_s"]
