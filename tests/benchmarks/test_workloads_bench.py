"""Workload loading speed (pytest-benchmark; skipped by the default run).

Run: python -m pytest tests/benchmarks/test_workloads_bench.py --benchmark-only
"""

from __future__ import annotations

import datetime as dt

from cbbench.workloads import load_workload, with_arrivals
from cbbench.workloads.trace_csv import parse_wallclock_ns

STAMPS = [
    f"2023-11-16 18:{m:02d}:{s:02d}.{s * 12345 % 10**7:07d}" for m in range(60) for s in range(60)
]


def test_bench_load_azure_conv(benchmark):
    wl = benchmark(load_workload, "azure-conv")
    assert len(wl) == 19_366


def test_bench_load_mooncake_conv(benchmark):
    wl = benchmark(load_workload, "mooncake-conv")
    assert len(wl) == 12_031


def test_bench_synthetic_mixed_10k(benchmark):
    wl = benchmark(load_workload, "mixed", num_requests=10_000)
    assert len(wl) == 10_000


def test_bench_poisson_arrivals_10k(benchmark):
    wl = load_workload("mixed", num_requests=10_000)
    assert benchmark(with_arrivals, wl, "poisson", rate=10.0).open_loop


def test_bench_wallclock_parse(benchmark):
    def parse_all() -> int:
        minutes: dict[str, int] = {}
        return sum(parse_wallclock_ns(s, minutes) for s in STAMPS)

    assert benchmark(parse_all) > 0


def test_bench_wallclock_strptime_baseline(benchmark):
    def parse_all() -> float:
        fmt = "%Y-%m-%d %H:%M:%S.%f"
        return sum(dt.datetime.strptime(s[:26], fmt).timestamp() for s in STAMPS)

    assert benchmark(parse_all) > 0
