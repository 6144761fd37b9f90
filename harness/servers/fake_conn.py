"""The scripted server's side of one connection (`fake_server`): a raw non-blocking socket
read with `recvmsg` and `SO_TIMESTAMPNS`, so the server's log can say when a request's bytes
reached the kernel, not when its event loop got round to them.

`ServerConn` offers the small part of asyncio's StreamReader/StreamWriter the server uses
(`readuntil`, `readexactly`, `write`, `drain`, `abort`, `close`) plus `rx_ns`: the arrival
time (CLOCK_MONOTONIC, ns) of the read that delivered the last byte consumed so far, and
`rx_kernel`: whether the kernel stamped it. TCP reports the receive time of the *last* segment
a read consumed, so a request that came in one segment gets that segment's time. Where the
kernel gives no stamp (not Linux, an unmapped socket ABI, `kernel_timestamps=False`, or the
first read or two while Linux turns stamping on) the read is stamped with `monotonic_ns()`
when it is handled, and `rx_kernel` is False.

Writes go straight to `send`; what the socket cannot take is kept and sent when it becomes
writable (`drain` waits while more than `HIGH_WATER` bytes are pending).

`Pacer` writes paced streams from one timer per process, no task or sleep per chunk.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import socket
import struct
import time
from collections.abc import Callable
from typing import Protocol

from cbbench.harness.client.h1conn import _ANC_SIZE, SO_TIMESTAMPNS

READ_SIZE = 65536
HIGH_WATER = 65536
LIMIT = 65536  # longest request head


def kernel_rx_ns(anc: list, now: int) -> int | None:
    """The SO_TIMESTAMPNS receive time in `anc` on CLOCK_MONOTONIC, else None. The kernel
    stamps on CLOCK_REALTIME; the offset between the two clocks is read once, at `now`."""
    for level, kind, cdata in anc:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(cdata) >= 16:
            sec, nsec = struct.unpack_from("qq", cdata)
            return min(now, sec * 1_000_000_000 + nsec - (time.time_ns() - now))
    return None


class ServerConn:
    """One accepted connection (see the module docstring)."""

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop, kernel: bool) -> None:
        self.sock = sock
        self.loop = loop
        self.kernel = kernel
        self.fd = sock.fileno()
        self.closed = False
        self.rx_ns = 0
        self.rx_kernel = False
        self.on_drained: Callable[[], None] | None = None  # called once the backlog is sent
        self._in = bytearray()
        self._eof = False
        self._waiter: asyncio.Future | None = None
        self._out = bytearray()
        self._drainer: asyncio.Future | None = None
        self._close_when_sent = False
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if kernel:
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        loop.add_reader(self.fd, self._readable)

    # reading
    def _readable(self) -> None:
        try:
            if self.kernel:
                data, anc, _, _ = self.sock.recvmsg(READ_SIZE, _ANC_SIZE)
            else:
                data, anc = self.sock.recv(READ_SIZE), []
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, anc = b"", []
        now = time.monotonic_ns()
        if not data:
            self._eof = True
            self.loop.remove_reader(self.fd)
        else:
            t = kernel_rx_ns(anc, now) if anc else None
            self.rx_kernel = t is not None
            self.rx_ns = now if t is None else t
            self._in += data
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def _wait(self) -> None:
        self._waiter = self.loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def readuntil(self, sep: bytes) -> bytes:
        while True:
            i = self._in.find(sep)
            if i >= 0:
                out = bytes(self._in[: i + len(sep)])
                del self._in[: i + len(sep)]
                return out
            if len(self._in) > LIMIT:
                raise asyncio.LimitOverrunError("request head too long", len(self._in))
            if self._eof or self.closed:
                raise asyncio.IncompleteReadError(bytes(self._in), None)
            await self._wait()

    async def readexactly(self, n: int) -> bytes:
        while len(self._in) < n:
            if self._eof or self.closed:
                raise asyncio.IncompleteReadError(bytes(self._in), n)
            await self._wait()
        out = bytes(self._in[:n])
        del self._in[:n]
        return out

    # writing
    @property
    def pending(self) -> int:
        """Bytes written but not yet taken by the socket."""
        return len(self._out)

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        if self._out:
            self._out += data
            return
        try:
            n = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError:
            self.abort()
            return
        if n < len(data):
            self._out += data[n:]
            self.loop.add_writer(self.fd, self._writable)

    def _writable(self) -> None:
        try:
            n = self.sock.send(self._out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.abort()
            return
        del self._out[:n]
        if self._out:
            return
        self.loop.remove_writer(self.fd)
        if self._close_when_sent:
            self.abort()
            return
        d, self._drainer = self._drainer, None
        if d is not None and not d.done():
            d.set_result(None)
        cb, self.on_drained = self.on_drained, None
        if cb is not None:
            cb()

    async def drain(self) -> None:
        if self.closed:
            raise ConnectionResetError("connection closed")
        if len(self._out) > HIGH_WATER:
            self._drainer = self.loop.create_future()
            await self._drainer
            if self.closed:
                raise ConnectionResetError("connection closed")

    # closing
    def abort(self) -> None:
        """Close now, dropping what is not sent (a reset if unread bytes remain)."""
        if self.closed:
            return
        self.closed = True
        if not self._eof:
            self.loop.remove_reader(self.fd)
        if self._out:
            self.loop.remove_writer(self.fd)
            self._out.clear()
        self.sock.close()
        for fut in (self._waiter, self._drainer):
            if fut is not None and not fut.done():
                fut.set_result(None)
        self.on_drained = None

    def close(self) -> None:
        """Close once everything written has been sent."""
        if self._out and not self.closed:
            self._close_when_sent = True
        else:
            self.abort()


class Paced(Protocol):
    def step(self) -> float | None:
        """Write what is due; the next due time (monotonic s), or None to leave the pacer."""
        ...


class Pacer:
    """Writes every stream's due chunks from one timer: a heap of (due time, stream); each
    tick takes the streams due by now, lets each write one chunk, puts them back at their
    next due time and re-arms for the earliest. Streams due in the past (a zero-delay
    schedule, or a late tick) get one chunk a tick, so the sockets' readers run in between."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.heap: list[tuple[float, int, Paced]] = []
        self.seq = itertools.count()
        self.armed_at = math.inf
        self.handle: asyncio.TimerHandle | asyncio.Handle | None = None

    def add(self, due: float, stream: Paced) -> None:
        heapq.heappush(self.heap, (due, next(self.seq), stream))
        if due < self.armed_at:
            self._arm(due)

    def _arm(self, due: float) -> None:
        if self.handle is not None:
            self.handle.cancel()
        self.armed_at = due
        # whole milliseconds, rounded up: the loops' timers count in ms (uvloop runs a delay
        # under 0.5 ms at once), and a timer that fires before its time would spin
        delay = math.ceil(max(0.0, due - time.monotonic()) * 1000) / 1000
        self.handle = self.loop.call_later(delay, self._tick)

    def _tick(self) -> None:
        self.handle, self.armed_at = None, math.inf
        heap, now = self.heap, time.monotonic()
        ready = []
        while heap and heap[0][0] <= now:
            ready.append(heapq.heappop(heap)[2])
        for stream in ready:
            due = stream.step()
            if due is not None:
                heapq.heappush(heap, (due, next(self.seq), stream))
        if heap and self.handle is None:
            self._arm(heap[0][0])
