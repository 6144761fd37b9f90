"""Routing decision time at 64 replicas, per policy, and the cluster simulator's cost.

`decide` times one `choose()` (and, for prefix-affinity, with hashing a 600-token prompt at
doubling lengths, as the router does per request) over replicas whose loads change between
decisions; it prints p50 / p99 per policy (goal: p99 <= 50 us). `cluster_sim` replays a
workload over N simulated replicas (reference_engine/router/cluster_sim.py) and prints the
wall time per request and per engine step; `CBBENCH_ROUTER_SIM_BIG=1` adds 1,000 replicas x
100,000 requests (`cbbench sim --replicas 1000 --workload chat --num-requests 100000` is the
same run from the command line).
Run:
    .venv/bin/python -m pytest tests/benchmarks/test_router_bench.py -o addopts="" --benchmark-only -s
"""

from __future__ import annotations

import random
import time

import pytest
from cbbench.harness.envflags import env_flag
from cbbench.reference_engine.config.options import SIM_DEFAULTS, build_engine_config
from cbbench.reference_engine.router.cluster_sim import simulate_cluster
from cbbench.reference_engine.router.policy import ReplicaLoad, RouteRequest
from cbbench.reference_engine.router.prefix import token_block_hashes
from cbbench.reference_engine.router.registry import POLICY_NAMES, make_policy
from cbbench.workloads import load_workload
from cbbench.workloads.stats import describe

REPLICAS = 64
DECISIONS = 20_000


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    """n prompts of 600 tokens from 200 conversations: repeated prefixes, as in chat."""
    rng = random.Random(seed)
    heads = [[rng.randrange(32_000) for _ in range(512)] for _ in range(200)]
    return [rng.choice(heads) + [rng.randrange(32_000) for _ in range(88)] for _ in range(n)]


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_decide(benchmark, policy):
    rng = random.Random(1)
    replicas = [ReplicaLoad(i, f"r{i}") for i in range(REPLICAS)]
    for r in replicas:
        r.stats_read(rng.randrange(32), rng.randrange(8), rng.random())
    p = make_policy(policy)
    ids = prompts(512)
    times: list[float] = []  # choose() alone
    with_hash: list[float] = []  # hashing the prompt's blocks + choose()

    def one(k: int) -> int:
        t0 = time.perf_counter_ns()
        hashes = token_block_hashes(ids[k % len(ids)]) if p.needs_prefix else ()
        t1 = time.perf_counter_ns()
        i = p.choose(RouteRequest(hashes), replicas)
        t2 = time.perf_counter_ns()
        times.append((t2 - t1) / 1e3)
        with_hash.append((t2 - t0) / 1e3)
        return i

    for k in range(DECISIONS):
        i = one(k)
        replicas[i].sent()
        done = replicas[rng.randrange(REPLICAS)]
        if done.in_flight:
            done.ended()
    counter = iter(range(10**9))
    benchmark(lambda: one(next(counter)))
    d, h = describe(times), describe(with_hash)
    print(
        f"\n{policy}: {REPLICAS} replicas, {d['count']} decisions: choose() p50 "
        f"{d['p50']:.1f} us, p99 {d['p99']:.1f} us; with prefix hashing p50 {h['p50']:.1f} us, "
        f"p99 {h['p99']:.1f} us"
    )


# (replicas, requests): how the simulation's wall time grows with both. The chat preset
# (prompts median 64, outputs median 160), every request at t = 0, prefix caching on.
SCALES = [(8, 800), (64, 6_400), (64, 25_600), (256, 25_600)]
if env_flag("CBBENCH_ROUTER_SIM_BIG"):
    SCALES.append((1_000, 100_000))


@pytest.mark.parametrize("replicas,requests", SCALES)
@pytest.mark.parametrize("policy", ["least-outstanding", "prefix-affinity"])
def test_cluster_sim(benchmark, replicas, requests, policy):
    wl = load_workload("chat", num_requests=requests)
    cfg = build_engine_config({"enable_prefix_caching": True}, SIM_DEFAULTS, scheduler="continuous")

    def run():
        return simulate_cluster(wl.requests, cfg, replicas, make_policy(policy), seed=wl.seed)

    res = benchmark.pedantic(run, rounds=1, iterations=1)
    s = res.summary()
    steps = sum(t.steps for t in res.replicas)
    print(
        f"\n{policy}: {replicas} replicas x {requests} requests: {res.wall_s:.1f} s wall, "
        f"{res.wall_s / requests * 1e3:.2f} ms/request, {steps} steps "
        f"({res.wall_s / steps * 1e6:.0f} us/step); simulated {s['duration_s']:.0f} s, "
        f"requests/replica CV {s['requests_per_replica']['cv']:.3f}"
    )
