"""Event-skipping simulation against the step-by-step path, in one run (sim/event_skip.py).

`test_cluster_skip_ratio` replays the chat preset over 64 simulated replicas (6,400
requests, every request at t = 0, least-outstanding routing; prefix caching on and off: the
chat preset shares no prefixes, but caching costs both paths the hashing of every full
block, which the skipping path cannot skip) twice: step
by step (the oracle) and with `event_skip`, and prints both CPU times and their ratio (goal:
>= 10x); it asserts the per-request times are the same, so a fast wrong answer fails.
The `max_num_seqs` parameter shows how the gain depends on the batch: with 32 slots and
100 requests a replica, requests wait and every completion ends a window (an admission is
the scheduler's step); with 256 nothing waits and windows run through completions.
`test_single_skip_ratio` does the same for one engine (`simulate`).
`CBBENCH_SKIP_BIG=1` adds 1,000 replicas x 100,000 requests, skipping path only (time and
peak memory). Run:
    .venv/bin/python -m pytest tests/benchmarks/test_event_skip_bench.py -o addopts="" --benchmark-only -s
"""

from __future__ import annotations

import resource
import time

import pytest
from cbbench.harness.envflags import env_flag
from cbbench.reference_engine.config.options import SIM_DEFAULTS, build_engine_config
from cbbench.reference_engine.router.cluster_sim import simulate_cluster
from cbbench.reference_engine.router.registry import make_policy
from cbbench.reference_engine.sim.simulate import simulate
from cbbench.workloads import load_workload
from cbbench.workloads.arrivals import with_arrivals


def _cpu(fn):
    t = time.process_time()
    out = fn()
    return out, time.process_time() - t


@pytest.mark.parametrize(
    "max_num_seqs,caching,rate",
    [(32, True, None), (256, True, None), (32, False, None), (256, False, None),
     (256, True, 300.0), (32, True, 300.0), (256, True, 100.0)],
)  # fmt: skip
def test_cluster_skip_ratio(benchmark, max_num_seqs, caching, rate):
    wl = load_workload("chat", num_requests=6_400)
    if rate is not None:  # steady arrivals: windows must run behind arrivals to gain
        wl = with_arrivals(wl, "poisson", rate=rate)
    cfg = build_engine_config(
        {"enable_prefix_caching": caching, "max_num_seqs": max_num_seqs}, SIM_DEFAULTS,
        scheduler="continuous",
    )  # fmt: skip

    def run(skip: bool):
        return simulate_cluster(
            wl.requests, cfg, 64, make_policy("least-outstanding"), seed=wl.seed,
            event_skip=skip,
        )  # fmt: skip

    stepped, t_step = _cpu(lambda: run(False))
    box = {}
    skipped = benchmark.pedantic(lambda: box.setdefault("r", _cpu(lambda: run(True))),
                                 rounds=1, iterations=1)[0]  # fmt: skip
    t_skip = box["r"][1]
    for a, b in zip(stepped.requests, skipped.requests, strict=True):
        assert b.finished_s == pytest.approx(a.finished_s, rel=1e-9, abs=1e-9)
        assert b.first_token_s == pytest.approx(a.first_token_s, rel=1e-9, abs=1e-9)
    steps = sum(t.steps for t in stepped.replicas)
    benchmark.extra_info.update(step_cpu_s=t_step, skip_cpu_s=t_skip, ratio=t_step / t_skip)
    load = "all at t = 0" if rate is None else f"Poisson {rate:g} req/s"
    print(
        f"\n64 replicas x 6400 chat ({load}), max_num_seqs {max_num_seqs}, prefix caching "
        f"{'on' if caching else 'off'}: stepping {t_step:.2f} s CPU "
        f"({steps} engine steps), skipping {t_skip:.2f} s CPU: {t_step / t_skip:.1f}x"
    )


def test_single_skip_ratio(benchmark):
    wl = load_workload("chat", num_requests=2_000)
    cfg = build_engine_config({"max_num_seqs": 256}, SIM_DEFAULTS, scheduler="continuous")
    stepped, t_step = _cpu(lambda: simulate(wl.requests, cfg, seed=wl.seed))
    box = {}
    benchmark.pedantic(
        lambda: box.setdefault("r", _cpu(lambda: simulate(wl.requests, cfg, seed=wl.seed,
                                                          event_skip=True))),
        rounds=1, iterations=1,
    )  # fmt: skip
    skipped, t_skip = box["r"]
    assert [r.token_times_s for r in skipped.requests] == [
        pytest.approx(r.token_times_s) for r in stepped.requests
    ]
    print(f"\none engine x 2000 chat: stepping {t_step:.2f} s CPU, skipping {t_skip:.2f} s CPU: "
          f"{t_step / t_skip:.1f}x")  # fmt: skip


SCALES = [(64, 6_400), (256, 25_600)]
if env_flag("CBBENCH_SKIP_BIG"):
    SCALES.append((1_000, 100_000))


@pytest.mark.parametrize("replicas,requests", SCALES)
def test_cluster_skip_scale(benchmark, replicas, requests):
    """How the skipping path's cost grows with replicas and requests (100 a replica)."""
    wl = load_workload("chat", num_requests=requests)
    cfg = build_engine_config({"enable_prefix_caching": True}, SIM_DEFAULTS,
                              scheduler="continuous")  # fmt: skip
    box = {}

    def run():
        box["r"] = _cpu(lambda: simulate_cluster(
            wl.requests, cfg, replicas, make_policy("least-outstanding"), seed=wl.seed,
            event_skip=True,
        ))  # fmt: skip

    benchmark.pedantic(run, rounds=1, iterations=1)
    res, cpu = box["r"]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    steps = sum(t.steps for t in res.replicas)
    benchmark.extra_info.update(cpu_s=cpu, wall_s=res.wall_s, peak_rss_mib=rss)
    print(f"\nskipping, {replicas} replicas x {requests} chat: {cpu:.1f} s CPU, "
          f"{res.wall_s:.1f} s wall, {steps} engine steps simulated, peak RSS {rss:.0f} MiB")  # fmt: skip
