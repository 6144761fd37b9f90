"""The soak study's pieces (tests/benchmarks/studies/soak.py): process sampling from /proc and the
flat-memory verdict. The soak itself is a benchmark, run by hand (docs/reliability.md)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from tests.benchmarks.studies.soak import ProcessSampler, process_usage, verdict

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")


def rows(rss: list[float], fds: int = 30) -> list[dict]:
    return [
        {"t_s": float(i), "rss_mb": r, "fds": fds, "children_rss_mb": 0.0, "children_fds": 0}
        for i, r in enumerate(rss)
    ]


def test_process_usage_of_this_process():
    rss, fds = process_usage(os.getpid())
    assert rss > 10 and fds >= 3
    assert process_usage(2**22 + 12345) == (0.0, 0)  # no such process


def test_verdict_flat_after_warmup_and_growing():
    warm = [100.0 + 20 * i for i in range(5)]  # warm-up growth is ignored
    flat = verdict(rows(warm + [200.0 + (i % 3) for i in range(20)]), 25.0, 0.2)
    assert flat["flat"] is True and abs(flat["server"]["rss_growth_mb"]) < 3
    leak = verdict(rows(warm + [200.0 + 5 * i for i in range(20)]), 25.0, 0.2)
    assert leak["flat"] is False and leak["server"]["rss_growth_mb"] > 16
    assert leak["children"]["flat"] is True
    fd_leak = rows(warm + [200.0] * 20)
    for i, r in enumerate(fd_leak):
        r["fds"] = 30 + 2 * i
    assert verdict(fd_leak, 25.0, 0.2)["flat"] is False
    assert verdict(rows([1.0, 2.0]), 10.0, 0.2)["flat"] is None


def test_process_sampler_samples_from_t0_until_stopped():
    seen: list[dict] = []
    got_two = threading.Event()

    def sink(row: dict) -> None:
        seen.append(row)
        if len(seen) >= 2:
            got_two.set()

    s = ProcessSampler(os.getpid(), interval_s=0.01)
    s.start(0, sink)
    assert got_two.wait(10)
    s.stop()
    assert all(r["source"] == "process" and r["rss_mb"] > 0 for r in seen)
    assert len(s.samples) >= len(seen) and s.summary()["samples"] == len(s.samples)
