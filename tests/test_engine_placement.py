"""compare-engines' placement and CPU split (harness/studies/engine_placement.py) on real
processes: a server's CPU split into its own (API) process and its children (engine), and
the API process and this process (the load generator) moved off the engine cores for the
block, the engine process left bound, this process's cores given back afterwards."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

from cbbench.harness.studies.engine_placement import (
    bind_engine,
    compute_thread_split,
    engine_thread_times,
    host_work_off,
    server_cpu,
)

from tests.process_support import kill, readline_within

# a parent that starts a child, prints the child's pid, and then both sleep (or the child
# burns CPU for `busy` seconds first)
_PARENT = (
    "import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', "
    "'import time\\nt = time.process_time()\\nwhile time.process_time() - t < {busy}: pass\\n"
    "time.sleep(30)']); print(c.pid, flush=True); time.sleep(30)"
)


def _start(busy: float) -> tuple[subprocess.Popen, int]:
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT.format(busy=busy)],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    return parent, int(readline_within(parent, 30.0, "the parent process"))


def test_server_cpu_puts_the_childrens_cpu_on_the_engine_side():
    parent, _child = _start(busy=0.5)
    try:
        deadline = time.monotonic() + 30
        while (cpu := server_cpu(parent.pid)) is not None and cpu.engine_s < 0.4:
            assert time.monotonic() < deadline, "the busy child's CPU was never seen"
            time.sleep(0.05)
        assert cpu is not None
        assert cpu.engine_s >= 0.4 and cpu.api_s < cpu.engine_s  # the parent only sleeps
        later = server_cpu(parent.pid)
        assert later is not None
        diff = later - cpu
        assert diff.engine_s >= 0 and diff.api_s >= 0
        assert abs(later.total_s - (later.api_s + later.engine_s)) < 1e-9
    finally:
        kill(parent)
    assert server_cpu(parent.pid) is None  # gone: no figure rather than a wrong one


def test_host_work_leaves_the_engine_cores_and_comes_back():
    parent, child = _start(busy=0.0)
    mine = os.sched_getaffinity(0)
    engine = {min(mine)}
    try:
        bind_engine(parent.pid, engine)
        with host_work_off(parent.pid, engine) as spare:
            assert spare == mine - engine
            if spare:  # API process and this process on the other cores, engine unmoved
                assert os.sched_getaffinity(parent.pid) == spare
                assert os.sched_getaffinity(0) == spare
            else:  # one core: nothing to move to, nothing moved
                assert os.sched_getaffinity(parent.pid) == mine
                assert os.sched_getaffinity(0) == mine
            assert os.sched_getaffinity(child) == engine
        assert os.sched_getaffinity(0) == mine  # the load generator's cores are given back
    finally:
        kill(parent)
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, 9)


def test_the_compute_thread_split_finds_the_busy_thread_and_adds_up():
    parent, _child = _start(busy=0.4)
    try:
        before = engine_thread_times(parent.pid)
        deadline = time.monotonic() + 30
        while (cpu := server_cpu(parent.pid)) is not None and cpu.engine_s < 0.4:
            assert time.monotonic() < deadline, "the busy child's CPU was never seen"
            time.sleep(0.05)
        time.sleep(0.2)  # the child sleeps now: blocked time
        split = compute_thread_split(before, engine_thread_times(parent.pid))
    finally:
        kill(parent)
    assert split is not None
    assert split["on_cpu_s"] >= 0.2  # the busy loop's, not the sleeping parent's
    parts = split["on_cpu_s"] + split["waiting_for_core_s"] + split["blocked_s"]
    assert split["blocked_s"] > 0 and abs(parts - split["wall_s"]) < 0.05
