"""`--workers 2`: a worker killed mid-run is reported (summary `worker_crashes`), the other
worker's records still arrive (records travel in batches over a pipe per worker)."""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import signal
import threading
import time

from cbbench.harness.cli.selftest import ServerProcess
from cbbench.harness.load.runner import BenchConfig, run_bench
from cbbench.harness.servers.fake_server import Behavior, FakeServerConfig
from cbbench.workloads.spec import RequestSpec, Workload
from rich.console import Console


def test_a_killed_worker_is_reported_and_the_other_one_still_counts(tmp_path):
    cfg = FakeServerConfig(default=Behavior(itl_s=0.01, queue_time_s=None))
    killed: list[str] = []

    def kill_one() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            kids = [c for c in mp.active_children() if c.name.startswith("cbbench-worker")]
            if len(kids) == 2:
                time.sleep(1.5)  # well inside the measured phase
                victim = max(kids, key=lambda c: c.name)
                killed.append(victim.name)
                os.kill(victim.pid, signal.SIGKILL)
                return
            time.sleep(0.05)

    with ServerProcess(cfg) as srv:
        wl = Workload("crash", 0, tuple(RequestSpec(i, 16, 8) for i in range(100_000)))
        bench = BenchConfig(
            base_url=srv.url,
            workload=wl,
            concurrency=4,
            duration_s=3.0,
            warmup=0,
            workers=2,
            out_dir=str(tmp_path / "run"),
            name="crash",
            live=False,
        )
        threading.Thread(target=kill_one, daemon=True).start()
        res = run_bench(bench, console=Console(file=io.StringIO()))
    assert killed == ["cbbench-worker-1"]
    assert res.summary["worker_crashes"] == ["worker 1 exited with code -9"]
    by_worker = {r.index % 2 for r in res.records if r.ok}
    assert 0 in by_worker and res.summary["counts"]["completed"] > 0
