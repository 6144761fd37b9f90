"""`cbbench serve --model tiny --replicas 2 --router least-outstanding`: real child
processes, the official openai client, a benchmark run through the router, and one
replica's process killed mid-run."""

from __future__ import annotations

import io
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from cbbench.harness.load.runner import BenchConfig, run_bench
from cbbench.harness.results.run_folder import load_run
from cbbench.harness.servers.launcher import ServerHandle, launch_server
from cbbench.workloads.spec import RequestSpec, Workload
from rich.console import Console

from tests.server_support import scrape

CMD = [
    sys.executable, "-m", "cbbench.harness.cli", "serve", "--model", "tiny",
    "--replicas", "2", "--router", "least-outstanding", "--port", "0",
    "--poll-interval", "0.2",
]  # fmt: skip


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[ServerHandle, dict[str, tuple[int, str]]]]:
    with launch_server(CMD, ready_timeout_s=180, name="cbbench serve --replicas") as h:
        found = re.findall(r"replica (r\d) \(pid (\d+)\) at (\S+)", h.log_tail)
        yield h, {name: (int(pid), url) for name, pid, url in found}


def served(url: str) -> float:
    return scrape(url).get("vllm:e2e_request_latency_seconds_count", 0.0)


def test_openai_client_through_two_replicas(cluster):
    h, replicas = cluster
    assert sorted(replicas) == ["r0", "r1"]
    urls = [replicas[n][1] for n in ("r0", "r1")]
    before = [served(u) for u in urls]
    client = openai.OpenAI(base_url=h.base_url + "/v1", api_key="none", max_retries=0)
    ok: list[int] = []

    def one(k: int) -> None:
        if k % 2:
            r = client.completions.create(model="tiny", prompt=f"q{k}", max_tokens=16)
            assert r.usage.completion_tokens == 16
        else:
            s = client.completions.create(model="tiny", prompt=f"q{k}", max_tokens=16, stream=True)
            assert sum(1 for c in s if c.choices and c.choices[0].text is not None) >= 1
        ok.append(k)

    threads = [threading.Thread(target=one, args=(k,)) for k in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(ok) == list(range(12))
    counts = [served(u) - b for u, b in zip(urls, before, strict=True)]
    assert sum(counts) == 12 and min(counts) >= 1  # each on exactly one; both served
    time.sleep(0.5)
    m = scrape(h.base_url)
    for name in ("r0", "r1"):
        for metric in (
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
            "cbbench:router_requests_routed_total",
            "cbbench:router_prefix_cache_hit_rate",
        ):
            assert f"{metric}{{replica={name}}}" in m, (metric, name)
    assert m["cbbench:router_routing_time_seconds_count{policy=least-outstanding}"] >= 12


def test_killing_one_replica_mid_run(cluster, tmp_path):
    h, replicas = cluster
    pid, _ = replicas["r1"]
    n = 40
    wl = Workload("t", 0, tuple(RequestSpec(i, 16, 48) for i in range(n)))

    def kill_after_first_records() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            files = list(tmp_path.glob("run/**/requests.jsonl"))
            if files and len(files[0].read_text().splitlines()) >= 4:
                break
            time.sleep(0.01)
        os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_after_first_records)
    killer.start()
    cfg = BenchConfig(
        base_url=h.base_url, workload=wl, out_dir=tmp_path / "run", live=False, concurrency=4
    )
    res = run_bench(cfg, console=Console(file=io.StringIO()))
    killer.join()
    recs = load_run(res.run_dir).records
    assert sorted(r.index for r in recs) == list(range(n))  # 0 records lost
    failed = [r for r in recs if not r.ok]
    assert len(failed) <= 4  # at most the requests in flight on r1 when it died
    for r in failed:
        assert "replica r1" in (r.error or ""), r.error
    ok = [r for r in recs if r.ok]
    assert len(ok) >= n - 4
    assert res.summary["counts"]["failed"] == len(failed)
    health = httpx.get(h.base_url + "/health").json()
    assert health["status"] == "degraded"
    assert [x["healthy"] for x in health["replicas"]] == [True, False]
    r = httpx.post(h.base_url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
    assert r.status_code == 200 and r.headers["x-cbbench-replica"] == "r0"
