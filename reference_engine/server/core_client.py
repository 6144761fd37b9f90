"""The API process's handle on an engine process (see engine_core.py).

`EngineCoreClient` has AsyncEngine's interface (start, add_request -> RequestStream, abort,
shutdown, accepting, dead), so the HTTP app cannot tell the two apart. Requests go out on a
ZMQ PUSH socket from the event loop (never blocking: ZMQ queues the frame); one reader thread
receives the engine's per-step messages, feeds the Prometheus metrics, and hands each
request's outputs to its asyncio queue with one `call_soon_threadsafe` per event loop per
step. If the engine process dies (crash, kill), every open stream and every later request
fails with ShuttingDown (HTTP 503) and /health answers 503; nothing waits on a dead engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import shutil
import tempfile
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.sampling_params import SamplingParams
from cbbench.reference_engine.server.async_engine import _ACCEPTED, RequestStream
from cbbench.reference_engine.server.engine_core import run_engine_core
from cbbench.reference_engine.server.errors import QueueFull, ShuttingDown
from cbbench.reference_engine.server.ipc import decode, encode

if TYPE_CHECKING:
    from cbbench.reference_engine.server.metrics import ServerMetrics

logger = logging.getLogger("cbbench.server")

STARTUP_TIMEOUT_S = 600.0  # loading a big checkpoint on a slow disk
STOP_TIMEOUT_S = 1.5  # then the engine process is killed (SIGTERM to exit within 2 s)
_POLL_MS = 100  # reader's poll interval: how soon a silently dead engine is noticed
# The engine process's OpenMP waiting (see start()): spin this many rounds, then sleep.
OMP_SPIN_ENV = {"GOMP_SPINCOUNT": "20000"}


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Any]


@dataclass
class EngineCoreClient:
    config: EngineConfig
    metrics: ServerMetrics | None = None
    nice: int = 0  # added to the engine process's niceness (os.nice): the API goes first
    info: dict[str, Any] = field(default_factory=dict)  # describe() of the engine
    max_model_len: int = 0
    vocab_size: int = 0
    dead: BaseException | None = None
    _closing: str | None = None
    _streams: dict[str, _Stream] = field(default_factory=dict)
    _last_token_time: dict[str, float] = field(default_factory=dict)  # reader thread only
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # --- life cycle ----------------------------------------------------------------------
    def start(self) -> None:
        """Start the engine process and wait until its engine is built (EngineError if it
        cannot be)."""
        import zmq

        self._dir = tempfile.mkdtemp(prefix="cbbench-core-")
        in_addr = f"ipc://{self._dir}/in"
        out_addr = f"ipc://{self._dir}/out"
        self._ctx = zmq.Context(1)
        self._to_core = self._ctx.socket(zmq.PUSH)
        self._to_core.setsockopt(zmq.LINGER, 0)
        self._to_core.bind(in_addr)
        self._from_core = self._ctx.socket(zmq.PULL)
        self._from_core.bind(out_addr)
        self._send_lock = threading.Lock()  # ZMQ sockets are not thread-safe
        mp = multiprocessing.get_context("spawn")  # torch + threads: never fork
        self.process = mp.Process(
            target=run_engine_core,
            args=(self.config, in_addr, out_addr, os.getpid(), self.nice),
            name="cbbench-engine-core",
            daemon=True,
        )
        # OpenMP threads between two parallel regions: spinning forever (ACTIVE) steals the
        # cores the API process and a load generator need, sleeping at once (PASSIVE) pays
        # a futex wake-up per region, ~100 per step. A short spin measured best with 2
        # torch threads (docs/performance.md). The child reads its environment at spawn; a
        # policy the user set (OMP_WAIT_POLICY or GOMP_SPINCOUNT) is kept.
        user_set = "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ
        added = {} if user_set else OMP_SPIN_ENV
        os.environ.update(added)
        try:
            self.process.start()
        finally:
            for key in added:
                del os.environ[key]
        first = self._wait_first_message()
        if first["t"] != "ready":
            self._close_transport()
            raise EngineError(first.get("message", "engine process failed to start"))
        self.info = first["info"]
        self.max_model_len = first["max_model_len"]
        self.vocab_size = first["vocab_size"]
        self._reader = threading.Thread(target=self._read, name="cbbench-core-reader", daemon=True)
        self._reader.start()

    def _wait_first_message(self) -> dict[str, Any]:
        waited = 0.0
        while waited < STARTUP_TIMEOUT_S:
            if self._from_core.poll(_POLL_MS):
                return decode(self._from_core.recv())
            waited += _POLL_MS / 1000
            if not self.process.is_alive():
                # the error message may still be in flight
                if self._from_core.poll(200):
                    return decode(self._from_core.recv())
                return {
                    "t": "error",
                    "message": f"engine process exited with code {self.process.exitcode}",
                }
        self.process.kill()
        return {"t": "error", "message": f"engine did not start within {STARTUP_TIMEOUT_S} s"}

    def shutdown(self, reason: str = "server shutting down", wait: bool = True) -> None:
        """Fail every open stream with ShuttingDown(reason) now, tell the engine to stop;
        wait: until the process has exited (killed after STOP_TIMEOUT_S)."""
        with self._lock:
            first = self._closing is None
            if first:
                self._closing = reason
            streams, self._streams = self._streams, {}
        self._fail(streams, ShuttingDown(reason))
        if first and self.dead is None:
            self._send(["shutdown"])
        if wait:
            self.process.join(STOP_TIMEOUT_S)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(1.0)
            reader = getattr(self, "_reader", None)
            if reader is not None and reader is not threading.current_thread():
                reader.join(1.0)
            self._close_transport()

    def _close_transport(self) -> None:
        with self._send_lock:
            if getattr(self, "_ctx", None) is None:
                return
            self._to_core.close(linger=0)
            self._from_core.close(linger=0)
            self._ctx.term()
            self._ctx = None
        shutil.rmtree(self._dir, ignore_errors=True)

    @property
    def accepting(self) -> bool:
        return self._closing is None and self.dead is None

    # --- called from the event loop --------------------------------------------------------
    async def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        priority: int = 0,
        **kv: Any,
    ) -> RequestStream:
        queue: asyncio.Queue[Any] = asyncio.Queue()
        with self._lock:
            if not self.accepting:
                raise ShuttingDown(self._closing or str(self.dead))
            self._streams[request_id] = _Stream(asyncio.get_running_loop(), queue)
        self._send(["add", request_id, prompt_token_ids, sampling_params, priority, kv])
        first = await queue.get()
        if isinstance(first, BaseException):
            raise first
        assert first is _ACCEPTED
        return RequestStream(request_id, self, queue)  # type: ignore[arg-type]

    def abort(self, request_id: str) -> None:
        with self._lock:
            known = self._streams.pop(request_id, None) is not None
        if known and self.accepting:
            self._send(["abort", request_id])

    def reset_prefix_cache(self) -> None:
        """Drop the prefix cache before any request added after this call (one ordered
        channel: the engine applies commands in the order sent)."""
        if self.accepting:
            self._send(["reset_prefix_cache"])

    def _send(self, command: list[Any]) -> None:
        data = encode([command])
        with self._send_lock:
            if getattr(self, "_ctx", None) is not None:
                self._to_core.send(data)

    # --- reader thread ---------------------------------------------------------------------
    def _read(self) -> None:
        try:
            while True:
                if not self._from_core.poll(_POLL_MS):
                    if not self.process.is_alive():
                        self._died(f"engine process exited with code {self.process.exitcode}")
                        return
                    continue
                msg = decode(self._from_core.recv())
                kind = msg["t"]
                if kind == "step":
                    self._on_step(msg)
                elif kind == "bye":
                    return
                elif kind == "error":
                    self._died(msg["message"])
                    return
        except Exception as exc:  # zmq closed under us at shutdown, or a bug: never hang
            if self._closing is None:
                logger.exception("engine reader failed")
                self._died(f"{type(exc).__name__}: {exc}")

    def _died(self, message: str) -> None:
        error = ShuttingDown(f"engine failed: {message}")
        with self._lock:
            if self._closing is not None:
                return
            self.dead = error
            streams, self._streams = self._streams, {}
        logger.error("engine process failed (%s); the server now answers 503", message)
        self._fail(streams, error)

    def _on_step(self, msg: dict[str, Any]) -> None:
        batches: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[Any], Any]]]
        batches = defaultdict(list)
        if self.metrics is not None:  # before the clients hear (a scrape right after a
            self.metrics.update_stats(msg["stats"])  # final token sees its blocks freed)
        now = msg["now"]
        with self._lock:
            streams = self._streams
            for request_id in msg["accepted"]:
                s = streams.get(request_id)
                if s is not None:
                    batches[s.loop].append((s.queue, _ACCEPTED))
            for request_id, kind, message in msg["rejected"]:
                s = streams.pop(request_id, None)
                if s is not None:
                    batches[s.loop].append((s.queue, _rejection(kind, message)))
            for out in msg["outputs"]:
                s = streams.get(out.request_id)
                if s is None:
                    continue  # aborted by its client
                if self.metrics is not None:
                    last = self._last_token_time.get(out.request_id)
                    self.metrics.observe_output(out, now, last)
                if out.new_token_ids:
                    self._last_token_time[out.request_id] = now
                batches[s.loop].append((s.queue, out))
                if out.finished:
                    del streams[out.request_id]
                    self._last_token_time.pop(out.request_id, None)
        for loop, items in batches.items():
            _deliver(loop, items)

    def _fail(self, streams: dict[str, _Stream], error: BaseException) -> None:
        batches: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[Any], Any]]]
        batches = defaultdict(list)
        for s in streams.values():
            batches[s.loop].append((s.queue, error))
        for loop, items in batches.items():
            _deliver(loop, items)


def _rejection(kind: str, message: str) -> BaseException:
    if kind == "queue_full":
        return QueueFull(message)
    if kind == "invalid":
        return EngineError(message)
    return RuntimeError(message)


def _put_all(items: list[tuple[asyncio.Queue[Any], Any]]) -> None:
    for queue, item in items:
        queue.put_nowait(item)


def _deliver(loop: asyncio.AbstractEventLoop, items: list[tuple[asyncio.Queue[Any], Any]]) -> None:
    # RuntimeError: that loop is closed, nobody is listening any more
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(_put_all, items)
