"""`--workers N`: N spawned load-generator processes, each with its own event loop.

Request i goes to worker i % N; all share one t0 on CLOCK_MONOTONIC (system-wide on Linux),
fixed by the parent once every worker has warmed up. Workers send each finished record to the
parent over a multiprocessing queue as soon as it finishes (the parent is the only writer, so
a worker that dies loses only its in-flight requests). SIGINT is ignored in workers: the
parent turns Ctrl-C into a stop event they poll. Workers die with the parent, even on
kill -9 (harness/lifeline.py).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import queue
import signal
import threading
import time
from collections.abc import Callable

from cbbench.harness import aio
from cbbench.harness.lifeline import die_with_parent
from cbbench.harness.loadgen import WorkerPlan, run_worker
from cbbench.harness.records import RequestRecord

T0_MARGIN_NS = 20_000_000  # t0 a little after "go", so every worker is waiting when it comes


def _worker_main(plan: WorkerPlan, q, t0_value, go, stop, parent_pid: int) -> None:
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def emit(kind: str, payload) -> None:
        q.put((kind, payload.to_dict() if kind == "record" else payload))

    async def wait_t0() -> int:
        q.put(("ready", plan.worker))
        await asyncio.get_running_loop().run_in_executor(None, go.wait)
        return int(t0_value.value)

    stats = aio.run(run_worker(plan, emit, wait_t0, stop.is_set))
    q.put(("done", plan.worker, stats.final()))


def run_workers(
    plans: list[WorkerPlan],
    on_event: Callable[[str, object], None],
    stop_flag: threading.Event,
) -> dict[int, dict]:
    """Run the plans in spawned processes; returns per-worker final stats (or crash info).

    on_event("t0", ns) once, then ("record", RequestRecord) and ("sample", dict) as they come.
    """
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    go, stop = ctx.Event(), ctx.Event()
    t0_value = ctx.Value("q", 0)
    procs = {
        p.worker: ctx.Process(
            target=_worker_main,
            args=(p, q, t0_value, go, stop, os.getpid()),
            name=f"cbbench-worker-{p.worker}",
        )
        for p in plans
    }
    for proc in procs.values():
        proc.daemon = True
        proc.start()
    ready: set[int] = set()
    done: dict[int, dict] = {}
    while len(done) < len(procs):
        if stop_flag.is_set() and not stop.is_set():
            stop.set()
            if not go.is_set():  # a worker still waiting for t0 wakes up and stops at once
                t0_value.value = time.monotonic_ns()
                on_event("t0", int(t0_value.value))
                go.set()
        try:
            msg = q.get(timeout=0.1)
        except queue.Empty:
            for w, proc in procs.items():
                if w not in done and proc.exitcode is not None:
                    done[w] = {"crashed": f"worker {w} exited with code {proc.exitcode}"}
                    ready.add(w)
            msg = None
        if msg is not None:
            kind = msg[0]
            if kind == "record":
                on_event("record", RequestRecord.from_dict(msg[1]))
            elif kind == "sample":
                on_event("sample", msg[1])
            elif kind == "ready":
                ready.add(msg[1])
            elif kind == "done":
                done[msg[1]] = msg[2]
        if len(ready) == len(procs) and not go.is_set():
            t0_value.value = time.monotonic_ns() + T0_MARGIN_NS
            on_event("t0", int(t0_value.value))
            go.set()
    for proc in procs.values():
        proc.join(5)
        if proc.is_alive():
            proc.terminate()
    return done
