"""The client's cost against Locust's FastHttpUser, side by side in one run: requests per
client CPU-second (user + system over each side's load phase), alternating Locust (one
constant body) and cbbench twice (A B A B) against the same zero-delay server, 32 streams,
16 tokens a request, 15 s a side (past cbbench's 16,384-request look-ahead on a fast host).
Prints each pair's ratio and keeps them in the benchmark's extra_info; the target (#57) is
>= 2x. Run:
    python -m pytest tests/benchmarks/test_client_vs_locust_bench.py -o addopts="" --benchmark-only -s
"""

from __future__ import annotations

import importlib.util

import pytest
from cbbench.harness.cli.selftest import ServerProcess
from cbbench.harness.servers.fake_server import Behavior, FakeServerConfig

# find_spec, not importorskip: importing locust monkey-patches the whole pytest process
# (gevent: sockets, threads, ssl), which broke every later test in the default run
if importlib.util.find_spec("locust") is None:
    pytest.skip("locust is not installed", allow_module_level=True)

STREAMS, TOKENS, SECONDS = 32, 16, 15.0


def test_requests_per_cpu_second_vs_locust(benchmark):
    from cbbench.harness.studies.locust_compare import run_cbbench, run_locust

    config = FakeServerConfig(default=Behavior(itl_s=0.0, queue_time_s=None))
    runs: list = []

    def pairs() -> None:
        with ServerProcess(config, 2) as server:
            for _ in range(2):
                runs.append(run_locust(server.url, STREAMS, TOKENS, SECONDS))
                runs.append(run_cbbench(server.url, STREAMS, TOKENS, SECONDS))

    benchmark.pedantic(pairs, rounds=1, iterations=1)
    assert len(runs) == 4 and all(r.requests > 0 and r.failed == 0 for r in runs)
    ratios = [runs[i + 1].requests_per_cpu_s / runs[i].requests_per_cpu_s for i in range(0, 4, 2)]
    for r in runs:
        print(
            f"{r.name}: {r.requests} requests, {r.cpu_s:.2f} CPU s, {r.requests_per_cpu_s:.0f}/CPU-s"
        )
    print("cbbench / Locust (one body), per pair: " + ", ".join(f"{x:.2f}x" for x in ratios))
    benchmark.extra_info["ratios"] = ratios
    benchmark.extra_info["requests_per_cpu_s"] = {
        f"{i}:{r.name}": r.requests_per_cpu_s for i, r in enumerate(runs)
    }
