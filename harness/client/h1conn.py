"""One HTTP/1.1 connection of the raw client: the response parser and its request future
(`Conn`), carried by an asyncio transport (`ProtoConn`: https, or user-space stamps) or by a
socket it reads itself with `recvmsg` and `SO_TIMESTAMPNS` (`SockConn`: the kernel's receive
time of every read). The pool that owns them, and the timing rules, are in `http1.py`.
"""

from __future__ import annotations

import asyncio
import socket
import time
from array import array
from dataclasses import dataclass
from typing import Protocol

from cbbench.harness.client import stamped
from cbbench.harness.client.chunks import whole_chunks as _whole_chunks
from cbbench.harness.client.stamped import (  # noqa: F401 - where the pool and tests find them
    _ANC_SIZE,
    SO_TIMESTAMPNS,
    kernel_timestamps_supported,
)
from cbbench.harness.client.turns import LoopMarks

_SIZE, _DATA, _CRLF, _TRAILER = range(4)
READ_SIZE = 262144
# parsed response heads by their bytes (status, headers, keep-alive, body mode, length): a
# server's responses repeat theirs byte for byte; a head that varies (a date, an id) is
# parsed each time, and at most HEAD_CACHE distinct heads are kept. The headers dict is
# shared between the responses of one head: read only (`Sink.head` gets its `get`).
HEAD_CACHE = 256
_HEADS: dict[bytes, tuple[int, dict[str, str], bool, str, int]] = {}


class Sink(Protocol):
    send_window_ns: int | None  # set by H1Pool: sent stamp -> the write returned
    user_read: bool  # set before each read: stamped in user space, not by the kernel
    marks: LoopMarks | None  # set by H1Pool: the worker loop's turn marks (turns.py)
    tail: bool  # set by the chunk state machine: this read ended inside a later chunk's framing

    def sent(self, t: int, connect_ns: int | None, reused: bool | None) -> None: ...
    def head(self, status: int, header) -> None: ...
    def data(self, raw: bytes, t: int) -> None: ...


class ConnectFailed(Exception):
    """The TCP (or TLS) connection could not be made."""


class ConnectionLost(Exception):
    """The server closed or reset the connection before the response was complete."""

    def __init__(self, message: str, got_response: bool) -> None:
        super().__init__(message)
        self.got_response = got_response


class BadResponse(Exception):
    """Not an HTTP/1.1 response we can read."""


@dataclass
class PoolStats:
    opened: int = 0  # connections opened (prewarmed included)
    prewarmed: int = 0  # opened before the measured phase
    reused: int = 0  # requests sent on a connection that had served one before
    closed_by_server: int = 0  # closed or reset by the server (not by us)
    retried: int = 0  # requests sent again after a kept-alive connection was found closed
    kernel_reads: int = 0  # reads stamped by the kernel
    user_reads: int = 0  # reads stamped in user space

    def __post_init__(self) -> None:
        # per kernel-stamped read: when the loop read it - the kernel's stamp (ns); how long
        # bytes waited for the loop (not a field: kept out of the counts run.json holds)
        self.read_delay_ns = array("q")
        self.marks = LoopMarks()  # the loop's turn marks: a floor under any read's bytes


class Conn:
    """One connection's HTTP/1.1 response parser and its request futures, whatever carries
    the bytes (`SockConn` or `ProtoConn`)."""

    loop: asyncio.AbstractEventLoop | None = None  # the loop it is read on, once known

    def __init__(self, stats: PoolStats) -> None:
        self.stats = stats
        self.closed = False
        self.aborted = False  # we closed it (not the server)
        self.requests_sent = 0
        self.connect_ns: int | None = None  # set-up time, reported by its first request only
        self.sent_ns = 0  # when the current request was written
        self._reset(None, None)

    def _reset(self, sink: Sink | None, loop: asyncio.AbstractEventLoop | None) -> None:
        self.sink = sink
        self.done: asyncio.Future | None = loop.create_future() if loop else None
        self._buf = b""
        self._in_body = False
        self._mode = ""  # "chunked" | "length" | "close"
        self._left = 0
        self._cstate = _SIZE
        self.keep_alive = True
        self.status = 0
        self.headers: dict[str, str] = {}

    # the carrier: subclasses
    def write(self, data: bytes) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError

    def _lost(self, exc: Exception | None) -> None:
        if self.closed:
            return
        self.closed = True
        if not self.aborted:
            self.stats.closed_by_server += 1
        if self.done is None or self.done.done():
            return
        if self._in_body and self._mode == "close":
            self.done.set_result(None)  # read-until-close body: closing ends it
            return
        self._fail(
            ConnectionLost(
                f"connection closed by server{f' ({exc})' if exc else ''}"
                + (" mid-response" if self.status else " before a response"),
                got_response=bool(self.status),
            ),
            abort=False,
        )

    def _fail(self, exc: Exception, abort: bool = True) -> None:
        """End the request with `exc` (one future a request, always awaited: no exception
        is ever left unread)."""
        done = self.done
        if done is not None and not done.done():
            done.set_exception(exc)
        if abort:
            self.abort()

    def feed(self, data: bytes, t: int) -> None:
        """Bytes that arrived at `t` (ns)."""
        if self.done is None or self.done.done():
            return  # nothing asked for: stray bytes after a finished response
        try:
            if not self._in_body:
                self._buf += data
                end = self._buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(self._buf) > 65536:
                        raise BadResponse("response head larger than 64 KiB")
                    return
                head = self._buf[:end]
                parsed = _HEADS.get(head)
                if parsed is None:
                    self._parse_head(head.decode("latin-1"))
                    if len(_HEADS) < HEAD_CACHE:  # the same bytes parse the same: kept
                        _HEADS[head] = (
                            self.status,
                            self.headers,
                            self.keep_alive,
                            self._mode,
                            self._left,
                        )
                else:  # a head seen before (a server's responses share theirs, byte for byte)
                    self.status, self.headers, self.keep_alive, self._mode, self._left = parsed
                data, self._buf = self._buf[end + 4 :], b""
                self._in_body = True
                assert self.sink is not None
                self.sink.head(self.status, self.headers.get)
                if self._mode == "length" and self._left == 0:
                    self._finish()
                    return
                if not data:
                    return
            if self._mode == "chunked":
                self._chunked(data, t)
            elif self._mode == "length":
                take = data[: self._left]
                self._left -= len(take)
                if take and self.sink is not None:
                    self.sink.data(take, t)
                if self._left == 0:
                    self._finish()
            elif self.sink is not None:
                self.sink.data(data, t)
        except Exception as exc:  # a consumer error or a bad response ends this request only
            self._fail(exc)

    def _parse_head(self, head: str) -> None:
        lines = head.split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise BadResponse(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        self.status = int(parts[1])
        for line in lines[1:]:
            k, _, v = line.partition(":")
            self.headers[k.strip().lower()] = v.strip()
        h = self.headers
        self.keep_alive = h.get("connection", "").lower() != "close" and parts[0] != "HTTP/1.0"
        if "chunked" in h.get("transfer-encoding", "").lower():
            self._mode = "chunked"
        elif "content-length" in h:
            self._mode, self._left = "length", int(h["content-length"])
        else:
            self._mode, self.keep_alive = "close", False

    def _chunked(self, data: bytes, t: int) -> None:
        if self._cstate == _SIZE and not self._buf and data[-2:] == b"\r\n":
            sink = self.sink
            read = getattr(sink, "read_chunked", None)  # the compiled read path (cread.py)
            if read is not None:
                last = read(data, t)
                if last is not None:  # None: it took nothing, the Python path reads it
                    if last:
                        self._finish()
                    return
            whole = _whole_chunks(data)
            if whole is not None:  # the common case: the read is a run of whole chunks
                body, last = whole
                if body and self.sink is not None:
                    self.sink.data(body, t)
                if last:
                    self._finish()
                return
        buf = self._buf + data if self._buf else data  # _buf: at most a partial size line
        pos, out, finished = 0, [], False
        n = len(buf)
        while pos < n or self._cstate == _TRAILER:
            if self._cstate == _SIZE:
                j = buf.find(b"\r\n", pos)
                if j < 0:
                    if n - pos > 4096:
                        raise BadResponse("chunk size line longer than 4 KiB")
                    break
                line = buf[pos:j]
                size = int(line.split(b";", 1)[0] if b";" in line else line, 16)
                pos = j + 2
                if size == 0:
                    self._cstate = _TRAILER
                elif pos + size + 2 <= n:  # the common case: the whole chunk is here
                    out.append(buf[pos : pos + size])
                    pos += size + 2
                else:
                    self._left, self._cstate = size, _DATA
            elif self._cstate == _DATA:
                take = min(self._left, n - pos)
                out.append(buf[pos : pos + take] if take != n else buf)
                pos += take
                self._left -= take
                if self._left == 0:
                    self._cstate = _CRLF
            elif self._cstate == _CRLF:
                if n - pos < 2:
                    break
                pos += 2
                self._cstate = _SIZE
            else:  # trailer section: lines until an empty one
                j = buf.find(b"\r\n", pos)
                if j < 0:
                    break
                finished, pos = j == pos, j + 2
                if finished:
                    break
        self._buf = buf[pos:] if pos < n else b""
        if self.sink is not None:  # bytes of a later chunk came in this read (their stamp)
            self.sink.tail = bool(self._buf) or self._cstate == _DATA
        if out and self.sink is not None:
            self.sink.data(out[0] if len(out) == 1 else b"".join(out), t)
        if finished:
            self._finish()

    def _finish(self) -> None:
        assert self.done is not None
        if not self.done.done():
            self.done.set_result(None)


class ProtoConn(Conn, asyncio.Protocol):
    """Carried by an asyncio transport (https, or no kernel timestamps): user-space stamps."""

    def __init__(self, stats: PoolStats) -> None:
        super().__init__(stats)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        t = time.monotonic_ns()
        self.stats.user_reads += 1
        if self.sink is not None:
            self.sink.user_read = True
        self.feed(data, t)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost(exc)

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def abort(self) -> None:
        self.aborted = True
        if self.transport is not None and not self.closed:
            self.transport.abort()
        self.closed = True


class SockConn(Conn):
    """A plain socket read with `recvmsg`: each read carries the kernel's receive time."""

    def __init__(self, stats: PoolStats, sock: socket.socket, loop) -> None:
        super().__init__(stats)
        self.sock = sock
        self.loop = loop
        loop.add_reader(sock.fileno(), self._readable)

    def _readable(self) -> None:
        sock, stats, recv = self.sock, self.stats, stamped._recv
        fd = sock.fileno()
        while not self.closed:
            try:  # the bytes and their stamp (stamped.py: one C call where it is built)
                got = recv(fd, READ_SIZE) if recv is not None else stamped.read_py(sock, READ_SIZE)
            except OSError as exc:
                self._close()
                self._lost(exc)
                return
            if got is None:
                return
            data, t, delay = got
            if not data:
                self._close()
                self._lost(None)
                return
            user = delay < 0
            if user:
                stats.user_reads += 1
            else:
                stats.kernel_reads += 1
                stats.read_delay_ns.append(delay)
            if self.sink is not None:  # its bound may not take the stamp as exact (response.py)
                self.sink.user_read = user
            self.feed(data, t)
            if len(data) < READ_SIZE:
                return  # drained: spare the syscall that would say EAGAIN

    def write(self, data: bytes) -> None:
        try:
            n = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError as exc:
            self._close()
            self._lost(exc)
            return
        if n < len(data):  # a large body the socket buffer cannot take at once
            fut = self.loop.create_task(self.loop.sock_sendall(self.sock, data[n:]))
            fut.add_done_callback(self._sent)

    def _sent(self, fut: asyncio.Future) -> None:
        if not fut.cancelled() and fut.exception() is not None:
            self._close()
            self._lost(fut.exception())  # type: ignore[arg-type]

    def _close(self) -> None:
        if self.sock.fileno() >= 0:
            self.loop.remove_reader(self.sock.fileno())
            self.sock.close()

    def abort(self) -> None:
        self.aborted = True
        if not self.closed:
            self._close()
        self.closed = True
