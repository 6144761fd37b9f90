"""`--workers N`: N spawned load-generator processes, each with its own event loop.

Sessions stay whole, lone requests and sessions are dealt round-robin (`shards.split_jobs`: the
same split `--shard I/N` makes across hosts); all share one t0 on CLOCK_MONOTONIC (system-wide
on Linux), fixed by the parent once every worker has warmed up, or at `--start-at`. Workers send each finished record to the
parent within 20 ms of its end (the parent is the only writer, so a worker that dies loses only
its in-flight requests and its last batch), in batches over a pipe of its own written from the
event loop's thread: a multiprocessing queue's feeder thread would take the GIL from the loop in
the middle of a send or a read (between stamping a request and writing it: milliseconds of
timing error), and one write per record would cost the parent a wake-up each. SIGINT is ignored in workers: the
parent turns Ctrl-C into a stop event they poll. Workers die with the parent, even on
kill -9 (reference_engine/server/lifeline.py).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing import connection as mp_connection

from cbbench.harness.client import aio
from cbbench.harness.load.loadgen import WorkerPlan, run_worker
from cbbench.harness.load.shards import monotonic_ns_at
from cbbench.harness.results.records import RequestRecord
from cbbench.reference_engine.server.lifeline import die_with_parent

T0_MARGIN_NS = 20_000_000  # t0 a little after "go", so every worker is waiting when it comes


def _worker_main(plan: WorkerPlan, q, t0_value, go, stop, parent_pid: int) -> None:
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    out = _Outbox(q)

    async def wait_t0() -> int:
        q.send(("ready", plan.worker))
        await asyncio.get_running_loop().run_in_executor(None, go.wait)
        return int(t0_value.value)

    stats = aio.run(run_worker(plan, out.emit, wait_t0, stop.is_set))
    out.flush()
    q.send(("done", plan.worker, stats.final()))
    q.close()


class _Outbox:
    """A worker's records and samples go to the parent in batches (one pickle and one write
    for up to `MAX_BATCH` of them, at most `MAX_WAIT_S` after the first), sent from the loop's
    own thread."""

    MAX_BATCH = 64
    MAX_WAIT_S = 0.02

    def __init__(self, conn) -> None:
        self.conn = conn
        self.batch: list = []
        self.timer: asyncio.TimerHandle | None = None

    def emit(self, kind: str, payload) -> None:
        self.batch.append((kind, payload.to_dict() if kind == "record" else payload))
        if len(self.batch) >= self.MAX_BATCH:
            self.flush()
        elif self.timer is None:
            self.timer = asyncio.get_running_loop().call_later(self.MAX_WAIT_S, self.flush)

    def flush(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.batch:
            self.conn.send(("batch", self.batch))
            self.batch = []


def run_workers(
    plans: list[WorkerPlan],
    on_event: Callable[[str, object], None],
    stop_flag: threading.Event,
    start_at: float | None = None,
) -> dict[int, dict]:
    """Run the plans in spawned processes; returns per-worker final stats (or crash info).
    t0: once every worker is ready (a little after), or at wall-clock `start_at` (unix s).

    on_event("t0", ns) once, then ("record", RequestRecord) and ("sample", dict) as they come.
    """
    ctx = mp.get_context("spawn")
    go, stop = ctx.Event(), ctx.Event()
    t0_value = ctx.Value("q", 0)
    pipes = {p.worker: ctx.Pipe(duplex=False) for p in plans}  # (parent's end, worker's end)
    procs = {
        p.worker: ctx.Process(
            target=_worker_main,
            args=(p, pipes[p.worker][1], t0_value, go, stop, os.getpid()),
            name=f"cbbench-worker-{p.worker}",
        )
        for p in plans
    }
    for w, proc in procs.items():
        proc.daemon = True
        proc.start()
        pipes[w][1].close()  # the worker holds it now: its exit ends our reads with EOF
    open_ends = {pipes[w][0]: w for w in procs}
    ready: set[int] = set()
    done: dict[int, dict] = {}
    while len(done) < len(procs):
        if stop_flag.is_set() and not stop.is_set():
            stop.set()
            if not go.is_set():  # a worker still waiting for t0 wakes up and stops at once
                t0_value.value = time.monotonic_ns()
                on_event("t0", int(t0_value.value))
                go.set()
        msgs = []
        for end in mp_connection.wait(list(open_ends), timeout=0.1):
            try:
                msgs.append(end.recv())
            except (EOFError, OSError):  # the worker is gone: its exit code says how
                del open_ends[end]
        if not msgs:
            for w, proc in procs.items():
                if w not in done and proc.exitcode is not None and w not in open_ends.values():
                    done[w] = {"crashed": f"worker {w} exited with code {proc.exitcode}"}
                    ready.add(w)
        for msg in [m for b in msgs for m in (b[1] if b[0] == "batch" else [b])]:
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
            on_event("ready", None)  # the samplers start: before t0, out of the window
            t0 = time.monotonic_ns() + T0_MARGIN_NS
            t0_value.value = t0 if start_at is None else monotonic_ns_at(start_at)
            on_event("t0", int(t0_value.value))
            go.set()
    for proc in procs.values():
        proc.join(5)
        if proc.is_alive():
            proc.terminate()
    return done
