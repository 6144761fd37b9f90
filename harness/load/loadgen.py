"""Load scheduling inside one worker process: open loop by arrival time, closed loop by
concurrency, open loop with a concurrency cap (slot wait = client queue time), warmup.

`run_worker` is the same coroutine in-process (`--workers 1`) and in each spawned worker
(`workers.py`); it reports through `emit(kind, payload)`:
  ("record", RequestRecord)  a finished request (ok or failed), times relative to t0
  ("sample", dict)           a client self-check sample (event-loop lag, CPU) for timeseries

Over 400 lines because open loop, closed loop, the capped open loop, sessions and warmup
share one Worker's slots, stop event and record bookkeeping: split by mode they would copy it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from cbbench.harness.client.api import ClientConfig, OpenAIClient
from cbbench.harness.client.turns import LoopMarks
from cbbench.harness.load.agent import AgentConversation
from cbbench.harness.load.graph import CallSlots, GraphConversation, HeldSlot, predecessors
from cbbench.harness.load.heap import FrozenHeap
from cbbench.harness.load.lookahead import Lookahead, Prepared
from cbbench.harness.load.prompts import PromptBuilder
from cbbench.harness.load.sessions import (
    CAP_UNITS,
    Conversation,
    Reply,
    group_sessions,
    history_mode,
)
from cbbench.harness.load.text_fit import TextFit
from cbbench.harness.results.records import RequestRecord
from cbbench.workloads.stats import describe_array

SAMPLE_PERIOD_S = 0.1  # event-loop lag probe
MARK_PERIOD_S = 0.01  # the loop turn marks (`_marker`, client/turns.py)
REPORT_PERIOD_S = 1.0  # one client sample a second to timeseries

Emit = Callable[[str, object], None]


@dataclass(frozen=True)
class Job:
    """One request to send: the workload fields a worker needs (picklable, small)."""

    index: int
    prompt_len: int
    output_len: int
    arrival_s: float | None = None
    priority: int = 0
    prefix_ids: tuple[int, ...] = ()
    warmup: bool = False
    session_id: str | None = None
    turn: int | None = None
    think_s: float | None = None
    text: str | None = None  # the message's own text (ShareGPT); None = generated
    agent: Any = None  # workloads.spec.AgentStep: an agent session's step (load/agent.py)
    graph: Any = None  # workloads.graph.GraphCall: a call of an agent graph (load/graph.py)


@dataclass
class WorkerPlan:
    worker: int
    jobs: list[Job]
    warmup_jobs: list[Job]
    client: ClientConfig
    concurrency: int | None  # closed loop slots, or the cap in open loop; None = no cap
    duration_s: float | None  # stop issuing new requests after this (from t0)
    seed: int = 0
    prefix_block_size: int = 512
    tokenizer: str | None = None
    text_prompts: bool = False  # chat endpoint or --text-prompts: text of (about) the length
    cap_unit: str = "sessions"  # with sessions: a concurrency slot holds a session or a request
    keep_token_ids: bool = False  # sessions: keep prompt/reply token ids in record.extra
    prewarm: bool = True  # open `concurrency` connections before t0 (raw client)
    text_fit: TextFit | None = None  # exact text prompts on the server's tokenizer (/tokenize)


@dataclass
class WorkerStats:
    """Live counters and self-check samples of one worker."""

    sent: int = 0
    finished: int = 0
    cancelled: int = 0  # in flight when the run was stopped: not recorded
    loop_lag_s: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    connections: dict = field(default_factory=dict)  # the raw pool's counts (http1.PoolStats)
    timestamp_source: str = "user"  # "kernel" | "user": who stamped the reads (http1.py)
    cpu_s: float = 0.0  # process CPU (user + system) spent in the measured phase
    send_window_s: dict = field(default_factory=dict)  # Stats: sent_s stamped -> write returned
    read_delay_s: dict = field(default_factory=dict)  # Stats: kernel stamp -> the loop's read

    @property
    def in_flight(self) -> int:
        return self.sent - self.finished

    def final(self) -> dict:
        """What a worker reports when it ends (picklable)."""
        return {
            "loop_lag_s": self.loop_lag_s,
            "cpu": self.cpu,
            "cancelled": self.cancelled,
            "connections": self.connections,
            "timestamp_source": self.timestamp_source,
            "cpu_s": self.cpu_s,
            "send_window_s": self.send_window_s,
            "read_delay_s": self.read_delay_s,
        }


def _arrival(job: Job) -> tuple[float, int]:
    return (job.arrival_s or 0.0, job.index)


def _now_s(t0_ns: int) -> float:
    return (time.monotonic_ns() - t0_ns) / 1e9


async def _sleep_until_s(t_s: float, t0_ns: int, stop: asyncio.Event) -> None:
    """Until t_s (seconds from t0) or stop, never early: event-loop timers (uvloop's in whole
    milliseconds) may fire a little before their time, and the rest is slept again."""
    while not stop.is_set():
        delay = t_s - _now_s(t0_ns)
        if delay <= 0:
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)


async def _think(think_s: float, t0_ns: int, stop: asyncio.Event) -> None:
    """A session's pause: at least think_s (event-loop timers, uvloop's in whole
    milliseconds, may fire a little early: the rest is slept again)."""
    until = _now_s(t0_ns) + think_s
    while not stop.is_set() and _now_s(t0_ns) < until:
        await _sleep_until_s(until, t0_ns, stop)


_ABSOLUTE = ("scheduled_s", "ready_s", "sent_s", "first_token_s", "last_token_s", "end_s")


def shift_record(rec: RequestRecord, delta_s: float) -> None:
    """Move every absolute time of `rec` by delta_s (warmup records measured before t0)."""
    for name in _ABSOLUTE:
        v = getattr(rec, name)
        if v is not None:
            setattr(rec, name, v + delta_s)
    rec.token_times_s = [t + delta_s for t in rec.token_times_s]


class Worker:
    def __init__(self, plan: WorkerPlan, emit: Emit) -> None:
        self.plan = plan
        self.emit = emit
        self.stats = WorkerStats()
        self.prompts = PromptBuilder(
            plan.seed, plan.prefix_block_size, plan.tokenizer, text_fit=plan.text_fit
        )
        self.stop = asyncio.Event()
        self.t0_ns = 0
        self._warmup_t0_ns = 0
        self._tasks: set[asyncio.Task] = set()
        self.ahead: Lookahead | None = None  # requests built ahead (`lookahead`)
        # what the plan is, found once (before t0: a scan of every job is not per request)
        self.open_loop = any(j.arrival_s is not None for j in plan.jobs)
        self.sessions = any(j.session_id is not None for j in plan.jobs)
        self._texts = any(j.text is not None for j in plan.jobs)
        self._graphs = any(j.graph is not None for j in plan.jobs)
        self._sorted: list[Job] | None = None  # `_send_order`
        self._lags: list[float] = []  # loop-lag samples not yet reported (`_sampler`)

    def _record(self, job: Job) -> RequestRecord:
        tag = "w" if job.warmup else ""
        return RequestRecord.build(
            id=f"cbb-{tag}{job.index}",
            index=job.index,
            prompt_len=job.prompt_len,
            output_len=job.output_len,
            priority=job.priority,
            worker=self.plan.worker,
            warmup=job.warmup,
            session_id=job.session_id,
            turn=job.turn,
        )

    def _prompt(self, job: Job) -> list[int] | str:
        build = self.prompts.text if self.plan.text_prompts else self.prompts.token_ids
        return build(job.index, job.prompt_len, job.prefix_ids)

    def _client_tokens(self, rec: RequestRecord, prompt) -> int | None:
        """The prompt's token count as the client reckons it (None: unknown)."""
        session = rec.session_id is not None
        return self.prompts.count_prompt(prompt, self.plan.client.endpoint, rec.prompt_len, session)

    def prepare(self, client: OpenAIClient, job: Job) -> Prepared:
        """Everything about `job`'s request that does not depend on timing."""
        rec = self._record(job)
        prompt = self._prompt(job)
        return Prepared(rec, client.encode(rec, prompt), self._client_tokens(rec, prompt))

    def lookahead(self, client: OpenAIClient) -> Lookahead:
        """The measured jobs (not sessions) in send order, built ahead; fill it before t0."""
        jobs = self._send_order()
        if self.open_loop and self.plan.duration_s is not None:
            jobs = [j for j in jobs if (j.arrival_s or 0.0) < self.plan.duration_s]
        self.ahead = Lookahead(jobs, lambda j: self.prepare(client, j), prefetch=self._prefetch)
        return self.ahead

    def _send_order(self) -> list[Job]:
        """The jobs by arrival time (open loop; sorted once, before t0) or as planned."""
        if self._sorted is None:
            jobs = self.plan.jobs
            self._sorted = sorted(jobs, key=_arrival) if self.open_loop else jobs
        return self._sorted

    def _prefetch(self, jobs: Sequence[Job]) -> None:
        """Prompt ids of the next jobs the look-ahead builds, in one batch."""
        self.prompts.prefetch([(j.index, j.prompt_len, j.prefix_ids) for j in jobs])

    async def warmup(self, client: OpenAIClient) -> list[RequestRecord]:
        """Send the warmup jobs (before t0); their records are shifted once t0 is known."""
        if not self.plan.warmup_jobs:
            return []
        client.t0_ns = time.monotonic_ns()
        slots = asyncio.Semaphore(self.plan.concurrency or len(self.plan.warmup_jobs))

        async def one(job: Job) -> RequestRecord:
            async with slots:
                return await client.send(self._record(job), self._prompt(job))

        recs = await asyncio.gather(*(one(j) for j in self.plan.warmup_jobs))
        self._warmup_t0_ns = client.t0_ns
        return list(recs)

    async def _send(
        self,
        client: OpenAIClient,
        job: Job,
        rec: RequestRecord,
        prompt,
        slots,
        reply=None,
        encoded: bytes | None = None,
    ) -> bool:
        """Send (after a slot, if capped) and emit the record; False if cancelled."""
        try:
            if slots is not None:
                async with slots:
                    if self.stop.is_set():
                        raise asyncio.CancelledError
                    if rec.scheduled_s is not None or rec.session_id is not None:
                        rec.client_queue_s = max(0.0, _now_s(self.t0_ns) - rec.ready_s)
                    await self._send_now(client, rec, prompt, reply, encoded)
            else:
                await self._send_now(client, rec, prompt, reply, encoded)
        except asyncio.CancelledError:
            self.stats.cancelled += 1
            return False
        self.stats.finished += 1
        if reply is not None and self.plan.keep_token_ids:  # before the record goes out
            rec.extra["prompt_token_ids"] = reply.prompt_token_ids
            rec.extra["reply_token_ids"] = reply.token_ids
        self.emit("record", rec)
        return True

    async def _send_now(
        self, client: OpenAIClient, rec: RequestRecord, prompt, reply, encoded=None
    ) -> None:
        """Send; `encoded` (built ahead, with `rec.prompt_tokens_client` set) or `prompt`."""
        self.stats.sent += 1
        if encoded is None:
            rec.prompt_tokens_client = self._client_tokens(rec, prompt)
        await client.send(rec, prompt, reply, encoded)
        assert rec.sent_s is not None and rec.ready_s is not None
        rec.send_lag_s = (
            rec.sent_s - rec.ready_s - (rec.client_queue_s or 0.0) - (rec.connect_s or 0.0)
        )

    def _take(self, client: OpenAIClient, job: Job) -> Prepared:
        p = self.ahead.take(job) if self.ahead is not None else self.prepare(client, job)
        p.rec.prompt_tokens_client = p.prompt_tokens_client
        return p

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _open_loop(self, client: OpenAIClient) -> None:
        slots = asyncio.Semaphore(self.plan.concurrency) if self.plan.concurrency else None
        for job in self._send_order():
            t = job.arrival_s or 0.0
            if self.plan.duration_s is not None and t >= self.plan.duration_s:
                break
            p = self._take(client, job)  # built before the wait, off the send path
            await _sleep_until_s(t, self.t0_ns, self.stop)
            if self.stop.is_set():
                break
            p.rec.scheduled_s = p.rec.ready_s = t
            self._spawn(self._send(client, job, p.rec, None, slots, None, p.encoded))

    async def _closed_loop(self, client: OpenAIClient) -> None:
        jobs = iter(self.plan.jobs)
        deadline = self.plan.duration_s

        async def slot() -> None:
            for job in jobs:
                if self.stop.is_set() or (deadline is not None and _now_s(self.t0_ns) >= deadline):
                    return
                p = self._take(client, job)
                p.rec.ready_s = _now_s(self.t0_ns)
                await self._send(client, job, p.rec, None, None, None, p.encoded)

        n = self.plan.concurrency or 1
        await asyncio.gather(*(self._spawn(slot()) for _ in range(n)), return_exceptions=True)

    # --- sessions ---------------------------------------------------------------------------
    def _history_mode(self) -> str:
        return history_mode(self.plan.client.endpoint, self.plan.text_prompts, self._texts)

    async def _run_session(
        self, client: OpenAIClient, unit: list[Job], session_slots, request_slots, held=None
    ) -> None:
        """A session's calls, each once its predecessors have answered and its wait has passed
        (a chain: turn after turn, each after the previous reply and its think time; a graph:
        calls whose predecessors are done run together). A failed call fails those after it."""
        graph = any(j.graph is not None for j in unit)
        agent = unit[0].agent is not None
        if graph:
            conv: Any = GraphConversation()
        elif agent:
            conv = AgentConversation(self.prompts)
        else:
            conv = Conversation(self._history_mode(), self.prompts)
        preds = predecessors(unit)
        done = {j.index: asyncio.Event() for j in unit}  # set when a call ended (or never will)
        answered: set[int] = set()
        deadline = self.plan.duration_s
        start = _now_s(self.t0_ns)

        async def call(k: int, job: Job) -> None:
            try:
                for p in preds[job.index]:
                    await done[p].wait()
                if not all(p in answered for p in preds[job.index]):
                    return  # a predecessor failed: no answer to build on
                ready = start
                if k:  # the tool ran / the user thought / the recorded wait
                    waited = _now_s(self.t0_ns)
                    await _think(job.think_s or 0.0, self.t0_ns, self.stop)
                    ready = _now_s(self.t0_ns)
                if self.stop.is_set() or (deadline is not None and ready >= deadline):
                    return
                rec = self._record(job)
                if k and agent:  # the tool ran: shown apart, never inside a latency
                    rec.extra["tool_wait_s"] = ready - waited
                if k == 0 and job.arrival_s is not None:
                    rec.scheduled_s = job.arrival_s
                rec.ready_s = ready if k else (rec.scheduled_s or ready)
                if k == 0 and session_slots is not None:  # waited for a session slot
                    rec.client_queue_s = max(0.0, _now_s(self.t0_ns) - rec.ready_s)
                prompt = conv.prompt(rec, job)
                if graph:
                    rec.extra["graph"]["wait_s"] = ready - waited if k else 0.0
                reply = Reply()
                slots = held if k == 0 and held is not None else request_slots
                if not await self._send(client, job, rec, prompt, slots, reply):
                    return
                if conv.reply(rec, prompt, reply):
                    answered.add(job.index)
            finally:
                if k == 0 and held is not None:
                    held.release()  # never used: the call did not go
                done[job.index].set()

        async with session_slots if session_slots is not None else contextlib.nullcontext():
            await asyncio.gather(*(call(k, job) for k, job in enumerate(unit)))

    async def _sessions(self, client: OpenAIClient) -> None:
        """Sessions start by the arrival process (open loop) or fill the slots (closed loop);
        the cap counts sessions (a slot held from turn 1 to the last reply) or requests."""
        units = group_sessions(self.plan.jobs)
        n = self.plan.concurrency
        assert self.plan.cap_unit in CAP_UNITS, self.plan.cap_unit
        by_session = self.plan.cap_unit == "sessions"
        request_slots: Any = None
        if n and not by_session:  # agent graphs: a started session's calls go first
            request_slots = CallSlots(n) if self._graphs else asyncio.Semaphore(n)
        open_loop = any(u[0].arrival_s is not None for u in units)
        if open_loop:
            session_slots = asyncio.Semaphore(n) if n and by_session else None
            for unit in sorted(units, key=lambda u: (u[0].arrival_s or 0.0, u[0].index)):
                t = unit[0].arrival_s or 0.0
                if self.plan.duration_s is not None and t >= self.plan.duration_s:
                    break
                await _sleep_until_s(t, self.t0_ns, self.stop)
                if self.stop.is_set():
                    break
                self._spawn(self._run_session(client, unit, session_slots, request_slots))
            return
        if not by_session and request_slots is not None and self._graphs:
            # agent graphs, closed loop: a session starts when a call slot is free, its
            # first call in that slot; calls in flight stay at the cap
            for unit in units:
                await request_slots.acquire(start=True)
                held = HeldSlot(request_slots)
                late = (
                    self.plan.duration_s is not None and _now_s(self.t0_ns) >= self.plan.duration_s
                )
                if self.stop.is_set() or late:
                    held.release()
                    return
                self._spawn(self._run_session(client, unit, None, request_slots, held))
            return
        if not by_session:  # every session at once; the requests share the slots
            for unit in units:
                self._spawn(self._run_session(client, unit, None, request_slots))
            return
        pending = iter(units)

        async def slot() -> None:
            for unit in pending:
                if self.stop.is_set():
                    return
                await self._run_session(client, unit, None, None)

        await asyncio.gather(*(self._spawn(slot()) for _ in range(n or 1)), return_exceptions=True)

    async def _sampler(self, client: OpenAIClient) -> None:
        period = SAMPLE_PERIOD_S
        last_report = time.monotonic()
        cpu0, wall0 = time.process_time(), time.monotonic()
        lags = self._lags  # the last partial second's are kept when the run ends (`run`)
        while True:
            t = time.monotonic()
            await asyncio.sleep(period)
            now = time.monotonic()
            lags.append(max(0.0, now - t - period))
            if now - last_report >= REPORT_PERIOD_S:
                cpu = (time.process_time() - cpu0) / (now - wall0)
                self.stats.loop_lag_s.extend(lags)
                self.stats.cpu.append(cpu)
                self.emit(
                    "sample",
                    {
                        "t_s": _now_s(self.t0_ns),
                        "source": "client",
                        "worker": self.plan.worker,
                        "loop_lag_max_s": max(lags),
                        "cpu": cpu,
                        "in_flight": self.stats.in_flight,
                        "sent": self.stats.sent,
                    },
                )
                lags.clear()
                last_report = now
                cpu0, wall0 = time.process_time(), now

    async def run(self, client: OpenAIClient, t0_ns: int) -> None:
        """The measured phase: from t0 until every job is done, the duration ends, or stop."""
        self.t0_ns = client.t0_ns = t0_ns
        cpu0 = time.process_time()
        sampler = asyncio.ensure_future(self._sampler(client))
        pool = getattr(client, "pool", None)
        marker = asyncio.ensure_future(_marker(pool.stats.marks)) if pool is not None else None
        refill = asyncio.ensure_future(self.ahead.refill()) if self.ahead is not None else None
        stopped = asyncio.ensure_future(self.stop.wait())
        if self.sessions:
            main = asyncio.ensure_future(self._sessions(client))
        else:
            main = asyncio.ensure_future(
                self._open_loop(client) if self.open_loop else self._closed_loop(client)
            )
        try:
            await asyncio.wait([main, stopped], return_when=asyncio.FIRST_COMPLETED)
            while self._tasks and not self.stop.is_set():  # open loop: the last requests
                await asyncio.wait([*self._tasks, stopped], return_when=asyncio.FIRST_COMPLETED)
        finally:  # stopped (Ctrl-C): requests in flight are cancelled, not recorded
            self.stop.set()
            # the measured phase is over: tearing down thousands of requests in flight is
            # not loop lag of the run (at 4,096 streams it was one multi-second sample)
            sampler.cancel()
            if marker is not None:
                marker.cancel()
            for task in [main, *self._tasks]:
                task.cancel()
            await asyncio.gather(main, *self._tasks, return_exceptions=True)
            self.stats.loop_lag_s.extend(self._lags)  # a run shorter than a report period too
            self._lags.clear()
            if refill is not None:
                refill.cancel()
            stopped.cancel()
            self.stats.cpu_s = time.process_time() - cpu0


async def _marker(marks: LoopMarks) -> None:
    """The loop's turn marks every MARK_PERIOD_S (client/turns.py): the floor under the
    arrival of a merged first token, so its bound is the stall it waited through, not its
    whole TTFT (100 wake-ups a second: ~0.2 % of a core)."""
    while True:
        marks.mark(time.monotonic_ns())
        await asyncio.sleep(MARK_PERIOD_S)


async def run_worker(
    plan: WorkerPlan,
    emit: Emit,
    wait_t0: Callable[[], object],
    stop_check: Callable[[], bool] | None = None,
) -> WorkerStats:
    """Warm up, wait for t0 (`await wait_t0()` -> int ns), run, emit records; returns stats."""

    def emit_then_check(kind: str, payload) -> None:
        """A stop decided by a record (the same client error five times) is seen at that
        record, not at the watcher's next poll: a closed loop of 2 ms 404s would otherwise
        send every request before the poll (r51 finding 3)."""
        emit(kind, payload)
        if kind == "record" and stop_check is not None and stop_check():
            worker.stop.set()

    worker = Worker(plan, emit_then_check)
    client = OpenAIClient(plan.client)
    heap = FrozenHeap()
    try:
        warm = await worker.warmup(client)
        if plan.prewarm and client.pool is not None and plan.concurrency:
            await client.pool.prewarm(plan.concurrency)  # connect before t0, not in TTFT
        if not worker.sessions:  # turns need their replies
            worker.lookahead(client).fill()  # before t0: out of the measured phase
        heap.start()  # what is built so far stays out of the collector's scans (heap.py)
        t0_ns = await wait_t0()
        while (ahead_ns := t0_ns - time.monotonic_ns()) > 0:  # t0 may be ahead (--start-at:
            if stop_check is not None and stop_check():  # up to an hour; Ctrl-C ends it)
                break
            await asyncio.sleep(min(ahead_ns / 1e9, 0.05))  # a timer may wake a ms early
        if client.pool is not None:
            del client.pool.send_window_ns[:]  # the measured phase's sends and reads only
            del client.pool.stats.read_delay_ns[:]
        for rec in warm:
            shift_record(rec, (worker._warmup_t0_ns - t0_ns) / 1e9)
            emit("record", rec)
        watcher = None
        if stop_check is not None:

            async def watch() -> None:
                while not stop_check():
                    await asyncio.sleep(0.05)
                worker.stop.set()

            watcher = asyncio.ensure_future(watch())
        await worker.run(client, t0_ns)
        if watcher is not None:
            watcher.cancel()
    finally:
        heap.stop()
        await client.aclose()
        if client.pool is not None:
            worker.stats.connections = dataclasses.asdict(client.pool.stats)
            worker.stats.timestamp_source = client.pool.timestamp_source
            window = np.frombuffer(client.pool.send_window_ns, dtype=np.int64) / 1e9
            worker.stats.send_window_s = describe_array(window)
            delay = np.frombuffer(client.pool.stats.read_delay_ns, dtype=np.int64) / 1e9
            worker.stats.read_delay_s = describe_array(delay)
    return worker.stats
