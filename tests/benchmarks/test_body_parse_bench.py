"""Does a big request body stall the event loop? /health latency while 4 MiB bodies of token
ids are posted, with bodies parsed in place (as before issue 20) and in the BodyParser's
worker process, side by side in one run. Skipped by the default run.

Run: python -m pytest tests/benchmarks/test_body_parse_bench.py --benchmark-only -s
Prints the worst and median /health latency both ways and their ratio.
"""

from __future__ import annotations

import json
import statistics
import threading
import time

import httpx
from cbbench.reference_engine.config.engine_config import EngineConfig

from tests.server_support import serve

POSTS, BODY_IDS = 8, 550_000  # ~3.7 MiB of JSON each


def health_latencies(url: str, big: bytes) -> list[float]:
    stop = threading.Event()
    seen: list[float] = []

    def poll() -> None:
        with httpx.Client(timeout=30) as client:
            while not stop.is_set():
                t = time.perf_counter()
                client.get(url + "/health")
                seen.append(time.perf_counter() - t)
                time.sleep(0.002)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        with httpx.Client(timeout=120) as client:
            for _ in range(POSTS):
                r = client.post(
                    url + "/v1/completions",
                    content=big,
                    headers={"content-type": "application/json"},
                )
                assert r.status_code == 400  # longer than the context
    finally:
        stop.set()
        poller.join()
    return seen


def test_health_stays_responsive_during_big_bodies(benchmark):
    big = json.dumps({"prompt": [12345] * BODY_IDS, "max_tokens": 1}).encode()
    results = {}

    def run() -> None:
        for mode in ("in place", "worker process"):
            with serve(EngineConfig(max_model_len=64), max_body_bytes=8 << 20) as (url, stack):
                if mode == "in place":
                    stack.body_parser.offload_bytes = 1 << 40
                else:  # start the worker before measuring
                    httpx.post(url + "/v1/completions", content=big, timeout=120)
                results[mode] = health_latencies(url, big)

    benchmark.pedantic(run, rounds=1, iterations=1)
    print(f"\n/health while posting {POSTS} bodies of {len(big) / 2**20:.1f} MiB")
    for mode, seen in results.items():
        print(
            f"  parsed {mode:>14}: worst {max(seen) * 1e3:6.1f} ms, "
            f"median {statistics.median(seen) * 1e3:5.1f} ms ({len(seen)} probes)"
        )
    ratio = max(results["in place"]) / max(results["worker process"])
    print(f"  worst-case ratio (in place / worker): {ratio:.1f}x")
