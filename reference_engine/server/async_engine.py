"""Runs an LLMEngine in its own thread and serves it to asyncio handlers.

The engine is not thread-safe, so only the engine thread touches it. Handlers talk to it
through a command inbox guarded by a condition variable (add / abort / shutdown); the thread
answers each request through that request's asyncio.Queue, fed with
`loop.call_soon_threadsafe`, so the event loop never blocks on the engine. With nothing to
compute the thread sleeps on the condition until a command arrives or until the engine's
`next_wakeup()` (a dynamic batcher's max queue delay, a static drain timeout) is due.
A simulated executor (virtual clock) is paced to the wall clock, see `_WallClockPacer`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cbbench.reference_engine.core.outputs import RequestOutput
from cbbench.reference_engine.errors import EngineError, QueueFullError
from cbbench.reference_engine.sampling_params import SamplingParams
from cbbench.reference_engine.server.errors import QueueFull, ShuttingDown

if TYPE_CHECKING:
    from cbbench.reference_engine.server.metrics import ServerMetrics

logger = logging.getLogger("cbbench.server")

# Upper bound on one idle sleep, so an engine whose next_wakeup() is None while it holds
# unschedulable requests is still polled now and then.
MAX_IDLE_WAIT_S = 0.5

_ACCEPTED = object()


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Any]

    def put(self, item: Any) -> None:
        # RuntimeError: the handler's loop is closed, nobody is listening any more
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


@dataclass
class _Add:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    priority: int
    stream: _Stream
    kv: dict[str, Any] = field(default_factory=dict)  # kv_export / kv_import (disagg.py)


@dataclass
class _Abort:
    request_id: str


@dataclass
class _ResetPrefixCache:
    pass


@dataclass
class RequestStream:
    """The outputs of one request, as the engine produces them. Closing it (or leaving the
    `async for` early) aborts the request in the engine."""

    request_id: str
    _engine: AsyncEngine
    _queue: asyncio.Queue[Any]
    finished: bool = False

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        try:
            while not self.finished:
                item = await self._queue.get()
                if isinstance(item, BaseException):
                    self.finished = True
                    raise item
                assert isinstance(item, RequestOutput)
                self.finished = item.finished
                yield item
        finally:
            self.close()

    def close(self) -> None:
        if not self.finished:
            self.finished = True
            self._engine.abort(self.request_id)


@dataclass
class AsyncEngine:
    engine: Any  # LLMEngine (typed loosely: the server only uses its public methods)
    metrics: ServerMetrics | None = None
    _cv: threading.Condition = field(default_factory=threading.Condition)
    _inbox: list[_Add | _Abort | _ResetPrefixCache] = field(default_factory=list)
    _closing: str | None = None  # set by shutdown(): the reason streams are failed with
    _thread: threading.Thread | None = None
    _streams: dict[str, _Stream] = field(default_factory=dict)  # engine thread only
    _last_token_time: dict[str, float] = field(default_factory=dict)  # engine thread only
    dead: BaseException | None = None  # the engine thread's crash, if it crashed

    # --- called from the event loop --------------------------------------------------
    def start(self) -> None:
        assert self._thread is None
        self._thread = threading.Thread(target=self._run, name="cbbench-engine", daemon=True)
        self._thread.start()

    def shutdown(self, reason: str = "server shutting down", wait: bool = True) -> None:
        """Fail every in-flight request with ShuttingDown(reason) and stop the thread (wait:
        until it has stopped, at most 10 s)."""
        with self._cv:
            if self._closing is None:
                self._closing = reason
            self._cv.notify()
        thread = self._thread
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join(10.0)

    @property
    def accepting(self) -> bool:
        return self._closing is None and self.dead is None

    async def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        priority: int = 0,
        **kv: Any,
    ) -> RequestStream:
        """Queue a request; returns once the engine accepted it. Raises QueueFull,
        EngineError (bad request for this engine) or ShuttingDown. `kv`: the engine's
        kv_export / kv_import (prefill/decode roles)."""
        queue: asyncio.Queue[Any] = asyncio.Queue()
        stream = _Stream(asyncio.get_running_loop(), queue)
        cmd = _Add(request_id, prompt_token_ids, sampling_params, priority, stream, kv)
        with self._cv:
            if not self.accepting:
                raise ShuttingDown(self._closing or "engine failed")
            self._inbox.append(cmd)
            self._cv.notify()
        first = await queue.get()
        if isinstance(first, BaseException):
            raise first
        assert first is _ACCEPTED
        return RequestStream(request_id, self, queue)

    def abort(self, request_id: str) -> None:
        with self._cv:
            if self._closing is None:
                self._inbox.append(_Abort(request_id))
                self._cv.notify()

    def reset_prefix_cache(self) -> None:
        """Drop the prefix cache before any request added after this call is scheduled."""
        with self._cv:
            if self._closing is None:
                self._inbox.append(_ResetPrefixCache())
                self._cv.notify()

    # --- engine thread -----------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # keep serving errors, never hang the clients
            error = ShuttingDown(f"engine failed: {type(exc).__name__}: {str(exc)[:200]}")
            with self._cv:
                self.dead = exc
                pending, self._inbox = self._inbox, []
            for cmd in pending:
                if isinstance(cmd, _Add):
                    cmd.stream.put(error)
            for stream in self._streams.values():
                stream.put(error)
            self._streams.clear()
            logger.exception("engine thread failed; the server now answers 503")

    def _loop(self) -> None:
        engine = self.engine
        pacer = _WallClockPacer(engine.executor) if _is_virtual(engine) else None
        progressed = False
        while True:
            with self._cv:
                if pacer is not None:
                    pacer.catch_up()
                if not self._inbox and self._closing is None and not progressed:
                    self._cv.wait(self._idle_timeout())
                    if pacer is not None:
                        pacer.catch_up()
                commands, self._inbox = self._inbox, []
                closing = self._closing
            if closing is not None:
                for cmd in commands:
                    if isinstance(cmd, _Add):
                        cmd.stream.put(ShuttingDown(closing))
                for stream in self._streams.values():
                    stream.put(ShuttingDown(closing))
                self._streams.clear()
                return
            for cmd in commands:
                self._apply(cmd)
            early = engine.take_pending_outputs()  # imported first tokens: out before the step
            if early:
                self._dispatch(early)
            progressed = False
            if engine.has_unfinished_requests():
                outputs = engine.step()
                if pacer is not None:
                    pacer.wait_for_virtual_time()
                stats = engine.get_stats()
                progressed = bool(outputs) or stats.num_batched_tokens > 0
                if self.metrics is not None:  # before the clients hear: a scrape right after
                    self.metrics.update_stats(stats)  # a final token must see its blocks freed
                self._dispatch(outputs)
            elif self.metrics is not None:
                self.metrics.update_stats(engine.get_stats())

    def _idle_timeout(self) -> float | None:
        if not self.engine.has_unfinished_requests():
            return None
        wakeup = self.engine.next_wakeup()
        if wakeup is None:
            return MAX_IDLE_WAIT_S
        return min(MAX_IDLE_WAIT_S, max(0.0, wakeup - self.engine.now()))

    def _apply(self, cmd: _Add | _Abort | _ResetPrefixCache) -> None:
        if isinstance(cmd, _ResetPrefixCache):
            self.engine.reset_prefix_cache()
            return
        if isinstance(cmd, _Abort):
            if self._streams.pop(cmd.request_id, None) is not None:
                self._last_token_time.pop(cmd.request_id, None)
                self.engine.abort_request(cmd.request_id)
            return
        try:
            self.engine.add_request(
                cmd.request_id, cmd.prompt_token_ids, cmd.sampling_params, priority=cmd.priority,
                **cmd.kv,
            )
        except QueueFullError as exc:
            cmd.stream.put(QueueFull(str(exc)))
            return
        except EngineError as exc:
            cmd.stream.put(exc)
            return
        except Exception as exc:  # an engine bug: fail this request (HTTP 500), keep serving
            cmd.stream.put(exc)
            return
        self._streams[cmd.request_id] = cmd.stream
        cmd.stream.put(_ACCEPTED)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        now = self.engine.now()
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue  # aborted by its client
            if self.metrics is not None:
                last = self._last_token_time.get(out.request_id)
                self.metrics.observe_output(out, now, last)
            if out.new_token_ids:
                self._last_token_time[out.request_id] = now
            stream.put(out)
            if out.finished:
                del self._streams[out.request_id]
                self._last_token_time.pop(out.request_id, None)


def _is_virtual(engine: Any) -> bool:
    return hasattr(getattr(engine, "executor", None), "advance_to")


class _WallClockPacer:
    """Serves a simulator in real time: the virtual clock follows the wall clock while idle,
    and a modelled step's outputs are released only when its modelled duration has passed,
    so HTTP clients see the latencies of the simulated hardware."""

    def __init__(self, executor: Any):
        self.executor = executor
        self.offset = time.monotonic() - executor.now()  # wall = virtual + offset

    def catch_up(self) -> None:
        self.executor.advance_to(time.monotonic() - self.offset)

    def wait_for_virtual_time(self) -> None:
        delay = self.executor.now() + self.offset - time.monotonic()
        if delay > 0:
            time.sleep(delay)
