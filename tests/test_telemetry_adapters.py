"""Engine adapters against a real loopback server serving recorded vLLM/SGLang/TGI metrics."""

from __future__ import annotations

import time

import httpx
import pytest
from cbbench.harness.telemetry.adapters import SERVER_FIELDS, detect
from cbbench.harness.telemetry.prom import fetch_metrics
from cbbench.harness.telemetry.queue_time import METHOD
from cbbench.harness.telemetry.server_sampler import SUMMARY_FIELDS, ServerMetricsSampler
from telemetry_server import MetricsServer, fixture, observe, set_value

# fixture -> (engine, fields every sample must carry, summary fields that must be unavailable)
EXPECTED = {
    "vllm.txt": (
        "vllm",
        {
            "running": 7.0,
            "waiting": 3.0,
            "kv_usage": 0.4375,
            "preemptions_total": 12.0,
            "prefix_cache_hit_rate": 0.25,  # hits 64 / queries 256
        },
        ["batch_occupancy", "kv_reserved_unused_tokens", "scheduler_time", "step_gap"],
    ),
    "vllm_v0.txt": (
        "vllm",
        {
            "running": 5.0,
            "waiting": 2.0,
            "kv_usage": 0.625,  # the older vllm:gpu_cache_usage_perc
            "preemptions_total": 4.0,
            "prefix_cache_hit_rate": 0.375,  # the older gauge
        },
        [
            "batch_occupancy",
            "kv_reserved_unused_tokens",
            "queue_time",
            "scheduler_time",
            "step_gap",
        ],
    ),
    "sglang.txt": (
        "sglang",
        {"running": 24.0, "waiting": 11.0, "kv_usage": 0.28, "prefix_cache_hit_rate": 0.0075},
        [
            "batch_occupancy",
            "kv_reserved_unused_tokens",
            "preemptions",
            "scheduler_time",
            "step_gap",
        ],
    ),
    "tgi.txt": (
        "tgi",
        {"running": 9.0, "waiting": 6.0},
        [
            "kv_usage",
            "batch_occupancy",
            "kv_reserved_unused_tokens",
            "preemptions",
            "prefix_cache_hit_rate",
            "scheduler_time",
            "step_gap",
        ],
    ),
}


def run_sampler(server: MetricsServer, min_samples: int = 2, change=None) -> tuple[list, dict]:
    """Sample `server` until `min_samples` arrived (then apply `change` and wait for one more)."""
    samples: list[dict] = []
    sampler = ServerMetricsSampler(server.url, interval_s=0.02)
    sampler.start(time.monotonic_ns(), samples.append)
    try:
        deadline = time.monotonic() + 10
        while len(samples) < min_samples and time.monotonic() < deadline:
            time.sleep(0.01)
        if change is not None:
            server.text = change(server.text)
            hits = server.hits
            while server.hits < hits + 2 and time.monotonic() < deadline:
                time.sleep(0.01)
    finally:
        sampler.stop()
    return samples, sampler.summary()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_adapter_maps_every_field(name: str) -> None:
    engine, fields, unavailable = EXPECTED[name]
    with MetricsServer(fixture(name)) as server, httpx.Client() as client:
        scrape = fetch_metrics(client, server.url)
        adapter = detect(scrape)
        assert adapter is not None and adapter.engine == engine
        assert adapter.read(scrape) == pytest.approx(fields)
        samples, summary = run_sampler(server)
    assert len(samples) >= 2
    for s in samples:
        assert s["source"] == "server" and "raw" not in s
        assert {k: s[k] for k in s if k in SERVER_FIELDS} == pytest.approx(fields)
    assert [s["t_s"] for s in samples] == sorted(s["t_s"] for s in samples)
    assert summary["engine"] == engine
    assert summary["failures"] == 0 and summary["samples"] == len(samples)
    assert summary["cpu_s"] >= 0.0  # the sampler thread's own CPU, reported
    assert summary["unavailable"] == [f for f in SUMMARY_FIELDS if f in unavailable]
    for f in ("running", "waiting", "kv_usage"):
        if f in fields:
            assert summary[f] == pytest.approx({"mean": fields[f], "max": fields[f]})
        else:
            assert f not in summary  # absent, never zero
    if "preemptions" not in unavailable:
        assert summary["preemptions"] == 0.0  # the counter did not move during the window


def test_vllm_window_deltas_queue_time_and_preemptions() -> None:
    # 20 requests queue during the run: 10 for 0.1 s (bucket le=0.3), 10 for 0.4 s (le=0.5)
    values = [0.1] * 10 + [0.4] * 10

    def change(text: str) -> str:
        text = observe(text, "vllm:request_queue_time_seconds", values)
        text = set_value(text, "vllm:num_preemptions_total", 15.0)
        text = set_value(text, "vllm:prefix_cache_queries_total", 356.0)  # +100 queried
        text = set_value(text, "vllm:prefix_cache_hits_total", 124.0)  # +60 hit
        return set_value(text, "vllm:kv_cache_usage_perc", 0.5)

    with MetricsServer(fixture("vllm.txt")) as server:
        samples, summary = run_sampler(server, change=change)
    assert samples[0]["kv_usage"] == 0.4375 and samples[-1]["kv_usage"] == 0.5
    assert summary["preemptions"] == 3.0
    assert summary["prefix_cache_hit_rate"] == pytest.approx(0.6)  # over the window only
    assert summary["kv_usage"]["max"] == 0.5
    q = summary["queue_time"]
    assert q["method"] == METHOD == "estimated from histogram"
    assert q["count"] == 20
    assert q["mean"] == pytest.approx(0.25)
    assert q["p50"] == pytest.approx(0.3)  # rank 10 ends the first bucket [0, 0.3]
    assert q["p90"] == pytest.approx(0.3 + 0.2 * 8 / 10)  # rank 18 in (0.3, 0.5]
    assert q["p99"] == pytest.approx(0.3 + 0.2 * 9.8 / 10)


def test_sglang_and_tgi_queue_time_from_histogram_delta() -> None:
    with MetricsServer(fixture("sglang.txt")) as server:
        _, summary = run_sampler(
            server, change=lambda t: observe(t, "sglang:queue_time_seconds", [0.05] * 4)
        )
    q = summary["queue_time"]
    assert q["count"] == 4 and q["mean"] == pytest.approx(0.05)
    assert q["p50"] == pytest.approx(0.05)  # rank 2 of 4 in (0.0, 0.1]

    with MetricsServer(fixture("tgi.txt")) as server:
        _, summary = run_sampler(
            server, change=lambda t: observe(t, "tgi_request_queue_duration", [0.4, 0.4, 0.6, 2.0])
        )
    q = summary["queue_time"]
    assert q["count"] == 4 and q["mean"] == pytest.approx(0.85)
    lo, hi = 0.00015 * 1.5**19, 0.00015 * 1.5**20  # both 0.4 s land in (0.3325, 0.4988]
    assert q["p50"] == pytest.approx(hi)  # rank 2 of 4: the end of that bucket
    assert lo < q["p50"] <= hi


def test_unknown_engine_keeps_raw_series_and_reports_fields_absent() -> None:
    text = (
        "# HELP myengine_queue_depth Requests queued\n# TYPE myengine_queue_depth gauge\n"
        'myengine_queue_depth{pool="a"} 5\n'
        "# TYPE myengine_steps counter\nmyengine_steps_total 42\n"
    )
    with MetricsServer(text) as server:
        samples, summary = run_sampler(server)
    assert samples and all(set(s) == {"t_s", "source", "raw"} for s in samples)
    assert samples[-1]["raw"] == {
        'myengine_queue_depth{pool="a"}': 5.0,
        "myengine_steps_total": 42.0,
    }
    assert summary["engine"] is None
    assert summary["unavailable"] == list(SUMMARY_FIELDS)
    assert not any(f in summary for f in SUMMARY_FIELDS)


def test_dead_endpoint_counts_failures_and_never_stalls() -> None:
    with MetricsServer("") as server:
        url = server.url
    # the server is closed: connection refused on every scrape
    samples: list[dict] = []
    sampler = ServerMetricsSampler(url, interval_s=0.02)
    sampler.start(time.monotonic_ns(), samples.append)
    deadline = time.monotonic() + 10
    while sampler.failures < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    sampler.stop()
    sampler.stop()  # idempotent
    summary = sampler.summary()
    assert samples == [] and sampler.latest() == {}
    assert summary["failures"] >= 3 and summary["samples"] == 0
    assert "ConnectError" in summary["last_error"]
    assert summary["engine"] is None and summary["unavailable"] == list(SUMMARY_FIELDS)


def test_hanging_endpoint_times_out_and_stop_returns() -> None:
    with MetricsServer(fixture("vllm.txt")) as server:
        server.hang = True
        sampler = ServerMetricsSampler(server.url, interval_s=0.05, timeout_s=0.1)
        sampler.start(time.monotonic_ns(), lambda s: None)
        deadline = time.monotonic() + 10
        while sampler.failures < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        sampler.stop()
        assert not sampler._thread.is_alive()
    assert sampler.summary()["failures"] >= 1
    assert "Timeout" in sampler.summary()["last_error"]


def test_not_prometheus_text_is_a_counted_failure() -> None:
    with MetricsServer("<html><body>hello</body></html>", content_type="text/html") as server:
        samples, summary = run_sampler(server, min_samples=0)
        deadline = time.monotonic() + 5
        while server.hits < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert samples == []
    assert summary["failures"] >= 1 and summary["samples"] == 0


def test_bench_records_server_samples_from_metrics_url(tmp_path) -> None:
    """`cbbench bench --metrics-url`: samples land in timeseries.jsonl, summary in run.json."""
    from cbbench.harness.cli import main as cli_main
    from cbbench.harness.results.run_folder import load_run
    from cbbench.harness.servers.fake_server import ThreadedServer

    target = ThreadedServer()
    try:
        with MetricsServer(fixture("tgi.txt")) as metrics:
            argv = ["bench", "--base-url", target.url, "--workload", "seed-demo"]
            argv += ["--out", str(tmp_path / "run"), "--no-live", "--no-gpu-metrics"]
            argv += ["--metrics-url", metrics.url, "--metrics-interval", "0.05"]
            assert cli_main(argv) == 0
    finally:
        target.stop()
    run = load_run(tmp_path / "run")
    samples = [s for s in run.timeseries if s["source"] == "server"]
    assert len(samples) >= 2  # the first scrape and the closing one at least
    assert all(s["running"] == 9.0 and s["waiting"] == 6.0 for s in samples)
    assert samples[-1]["t_s"] >= max(r.last_token_s for r in run.records)
    server = run.meta["summary"]["telemetry"]["server"]
    assert server["engine"] == "tgi" and server["running"] == {"mean": 9.0, "max": 9.0}
    assert "kv_usage" in server["unavailable"] and "kv_usage" not in server


def test_live_view_shows_kv_usage_running_and_waiting() -> None:
    import io

    from cbbench.harness.console.live import LiveStats
    from rich.console import Console

    with MetricsServer(fixture("vllm.txt")) as server:
        sampler = ServerMetricsSampler(server.url, interval_s=0.02)
        sampler.start(time.monotonic_ns(), lambda s: None)
        deadline = time.monotonic() + 10
        while not sampler.latest() and time.monotonic() < deadline:
            time.sleep(0.01)
        live = LiveStats(total=10, samplers=[sampler])
        out = io.StringIO()
        Console(file=out, width=200).print(live.render())
        server.text = set_value(server.text, "vllm:kv_cache_usage_perc", 0.9)
        while sampler.latest().get("kv_usage") != 0.9 and time.monotonic() < deadline:
            time.sleep(0.01)
        later = io.StringIO()
        Console(file=later, width=200).print(live.render())
        sampler.stop()
    shown = out.getvalue()
    assert "running 7" in shown and "waiting 3" in shown and "KV cache used 44%" in shown
    assert "KV cache used 90%" in later.getvalue()  # it follows the server as it changes
