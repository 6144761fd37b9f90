"""Per-replica telemetry: the sampler over a router's `replica=` series and over one
`/metrics` per replica, a bench run through cbbench's router over a fast and a slowed fake
server (the report's Replicas section, the imbalance figure, `diagnose` naming it), and
(slow) a run against `cbbench serve --replicas 2`."""

from __future__ import annotations

import io
import re
import sys
import time

import pytest
from cbbench.harness.diagnose import diagnose_run
from cbbench.harness.load.runner import BenchConfig, run_bench
from cbbench.harness.report import build_report
from cbbench.harness.results.run_folder import load_run
from cbbench.harness.servers.fake_server import Behavior, FakeServerConfig, ThreadedServer
from cbbench.harness.servers.launcher import launch_server
from cbbench.harness.telemetry import TelemetryOptions, build_samplers
from cbbench.harness.telemetry.replicas import ReplicaSampler, imbalance
from cbbench.reference_engine.router.serve import RouterOptions, RouterThread
from cbbench.workloads.spec import RequestSpec, Workload
from rich.console import Console

from tests.telemetry_server import MetricsServer, fixture, set_value


def test_imbalance_figures():
    assert imbalance([1.0, 1.0]) == {"max_over_mean": 1.0, "cv": 0.0, "mean": 1.0}
    x = imbalance([3.0, 1.0])
    assert x["max_over_mean"] == 1.5 and x["cv"] == pytest.approx(0.5)
    assert imbalance([2.0]) is None and imbalance([0.0, 0.0]) is None


def test_pd_workers_are_judged_within_their_role():
    """Behind the P/D router (p0, d0, d1): a prefill worker's load against a decode worker's is
    no imbalance (1P:1D read "replica load max/mean 2"); two decode workers are peers."""
    s = ReplicaSampler(router_url="http://127.0.0.1:9/metrics")
    s._series = {"p0": {"load": [0.0, 0.0], "routed": [0.0, 20.0]},
                 "d0": {"load": [4.0, 4.0], "routed": [0.0, 20.0]}}  # fmt: skip
    assert s.summary()["imbalance"] == {}
    s._series["d1"] = {"load": [1.0, 1.0], "routed": [0.0, 20.0]}
    imb = s.summary()["imbalance"]
    assert imb["load"]["max_over_mean"] == pytest.approx(1.6) and "routed" in imb
    s._series = {"r0": {"load": [0.0, 0.0]}, "r1": {"load": [4.0, 4.0]}}  # plain replicas
    assert s.summary()["imbalance"]["load"]["max_over_mean"] == 2.0


def test_sampler_reads_one_metrics_url_per_replica():
    text = fixture("vllm.txt")
    busy = set_value(
        set_value(text, "vllm:num_requests_running", 6), "vllm:num_requests_waiting", 3
    )
    idle = set_value(
        set_value(text, "vllm:num_requests_running", 1), "vllm:num_requests_waiting", 0
    )
    with MetricsServer(busy) as a, MetricsServer(idle) as b:
        samples: list[dict] = []
        s = ReplicaSampler(replica_urls=[a.url, b.url], interval_s=0.02)
        s.start(time.monotonic_ns(), samples.append)
        time.sleep(0.15)
        s.stop()
    out = s.summary()
    assert out["available"] and out["source"] == "replica urls" and out["failures"] == 0
    assert out["per_replica"]["r0"]["load"]["mean"] == 9.0
    assert out["per_replica"]["r1"]["load"]["mean"] == 1.0
    assert out["imbalance"]["load"]["max_over_mean"] == pytest.approx(1.8)
    assert samples[0]["source"] == "replicas" and samples[0]["replicas"]["r0"]["running"] == 6
    assert "running" not in samples[0]  # nested: never read as the server's own running


def test_sampler_behind_a_plain_server_says_so_and_stops():
    with MetricsServer(fixture("vllm.txt")) as m:
        s = ReplicaSampler(router_url=m.url, interval_s=0.02)
        s.start(time.monotonic_ns(), lambda _x: None)
        hits = m.hits
        time.sleep(0.1)
        s.stop()
        assert m.hits == hits == 1  # one scrape, then no thread
    assert s.summary() == {"available": False, "reason": f"{m.url} has no per-replica series"}


def bench(url: str, out, n: int = 40, concurrency: int = 8):
    wl = Workload(name="replicas", seed=0, requests=tuple(RequestSpec(i, 8, 8) for i in range(n)))
    cfg = BenchConfig(
        base_url=url, workload=wl, concurrency=concurrency, out_dir=str(out), live=False
    )
    opts = TelemetryOptions(gpu_metrics=False, interval_s=0.05)
    text = io.StringIO()
    res = run_bench(cfg, build_samplers(opts, url), console=Console(file=text, width=200))
    return res, text.getvalue()


def test_router_run_shows_replicas_and_diagnose_names_the_slow_one(tmp_path):
    fast = ThreadedServer(FakeServerConfig(default=Behavior(ttft_s=0.01, itl_s=0.002)))
    slow = ThreadedServer(FakeServerConfig(default=Behavior(ttft_s=0.3, itl_s=0.01)))
    try:
        opts = RouterOptions([fast.url, slow.url], policy="round-robin", port=0)
        with RouterThread(opts) as url:
            res, console = bench(url, tmp_path / "run")
    finally:
        fast.stop()
        slow.stop()
    rep = res.summary["telemetry"]["replicas"]
    assert rep["available"] and rep["source"] == "router"
    per = rep["per_replica"]
    assert per["r0"]["routed"] == per["r1"]["routed"] == 20  # round-robin
    assert per["r1"]["load"]["mean"] > 2 * per["r0"]["load"]["mean"]  # the slow one holds them
    assert rep["imbalance"]["load"]["max_over_mean"] > 1.4
    assert rep["imbalance"]["routed"]["max_over_mean"] == 1.0
    assert re.search(r"replicas: mean load r0 \S+ \(20 routed\), r1", console)
    recs = load_run(tmp_path / "run").records  # each request says where it ran
    assert sorted(r.extra.get("replica") for r in recs) == ["r0"] * 20 + ["r1"] * 20
    found = {f.rule: f for f in diagnose_run(load_run(tmp_path / "run")).findings}
    f = found["replica-imbalance"]
    assert f.values["busiest"] == "r1" and "least-outstanding" in f.fixes["cbbench"]
    assert "--policy" in f.fixes["sglang"]
    report = build_report([str(tmp_path / "run")])
    html = report.html()
    assert "<h2>Replicas</h2>" in html and "replica load (running + waiting" in html
    assert "requests routed to each replica" in html and "replica load max/mean" in html
    assert "replica load max/mean" in report.markdown()


@pytest.mark.slow
def test_serve_replicas_run_shows_per_replica_timelines(tmp_path):
    cmd = [sys.executable, "-m", "cbbench.harness.cli", "serve", "--model", "tiny",
           "--replicas", "2", "--router", "least-outstanding", "--port", "0",
           "--poll-interval", "0.2"]  # fmt: skip
    with launch_server(cmd, ready_timeout_s=240, name="cbbench serve --replicas") as h:
        res, _ = bench(h.base_url, tmp_path / "run", n=24, concurrency=6)
    rep = res.summary["telemetry"]["replicas"]
    assert set(rep["per_replica"]) == {"r0", "r1"}
    for d in rep["per_replica"].values():  # the engines' own series, through the router
        assert "running" in d and "kv_usage" in d and d["routed"] >= 1
    assert sum(d["routed"] for d in rep["per_replica"].values()) == 24
    assert "load" in rep["imbalance"]
    html = build_report([str(tmp_path / "run")]).html()
    for title in ("replica running requests", "replica KV cache usage", "requests routed"):
        assert title in html
    assert "replica load max/mean" in html and "imbalance of load: max / mean" in html
