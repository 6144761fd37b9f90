"""Minimal HTTP/1.1 client on asyncio: the load generator's hot path.

Why not httpx alone: against a zero-delay local server httpx (httpcore + h11 + anyio) costs
about 100 us of client CPU per streamed token and its pool scans every connection per
request; this transport costs a fraction of that (docs/timing.md), so the client stays far
from being the bottleneck. httpx remains available (`--http-client httpx`).

Scope: one request at a time per connection, keep-alive, `Content-Length`, chunked and
read-until-close bodies, http and https. `H1Pool.exchange` sends a request and waits for its
whole response; its `Sink` gets `head(status, header)` once the status line and headers are
in, then `data(bytes, t_ns)` for every read of the body, synchronously in the read's callback.

Arrival times (`t_ns`, CLOCK_MONOTONIC). On Linux, plain-http connections are sockets the pool
reads itself with `recvmsg` and `SO_TIMESTAMPNS`: `t_ns` is when the kernel received the
bytes, so time a read waits for the event loop (256 streams' tokens landing in one burst) is
not counted. TCP reports the receive time of the *last* segment a read consumed: a read that
holds several events stamps all of them with that time (they were all in by then, the earlier
ones at most one inter-segment gap earlier). Elsewhere (https, other systems, a kernel that
gives no timestamp) reads go through an asyncio Protocol and `t_ns` is `time.monotonic_ns()`
when the read is handled; `H1Pool.timestamp_source` says which one a run got.

Connections are opened apart from requests: `H1Pool.prewarm(n)` opens n before the measured
phase, and a request that must open one reports the set-up time (`Conn.connect_ns`) and
stamps its send after it, so connection set-up never counts as time to first token.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from array import array
from urllib.parse import urlsplit

from cbbench.harness.client.h1conn import (
    SO_TIMESTAMPNS,
    BadResponse,
    Conn,
    ConnectFailed,
    ConnectionLost,
    PoolStats,
    ProtoConn,
    Sink,
    SockConn,
    kernel_timestamps_supported,
)
from cbbench.harness.errors import CbbenchError, resource_hint

__all__ = [
    "BadResponse",
    "Conn",
    "ConnectFailed",
    "ConnectionLost",
    "H1Pool",
    "PoolStats",
    "Sink",
    "kernel_timestamps_supported",
]

_log = logging.getLogger("cbbench")
_warned = False


class H1Pool:
    """Keep-alive connections to one origin; a connection serves one request at a time.

    `kernel_timestamps=False` forces user-space stamps (the comparison `cbbench selftest`
    makes); True uses the kernel's where the platform allows, with one warning otherwise."""

    def __init__(self, base_url: str, kernel_timestamps: bool = True) -> None:
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if u.scheme == "https" else None
        self.prefix = u.path.rstrip("/")
        default_port = self.port == (443 if self.ssl else 80)
        self.host_header = self.host if default_port else f"{self.host}:{self.port}"
        self._idle: list[Conn] = []
        self._busy: dict[Conn, int] = {}  # a request's connection -> its deadline (ns)
        self._sweep_s = 1.0
        self._sweeper: asyncio.TimerHandle | None = None
        self.stats = PoolStats()
        # per request: `sent_s` stamped -> the write returned (the send side of the stamps'
        # error; the summary's per-worker timing bound)
        self.send_window_ns = array("q")
        self._addr: tuple | None = None
        self._keeper: socket.socket | None = None
        self.kernel = False
        if kernel_timestamps:
            why = "https (the TLS layer reads the socket)" if self.ssl else None
            why = why or kernel_timestamps_supported()
            self.kernel = why is None
            if why:
                _warn_once(f"kernel receive timestamps unavailable: {why}; stamping in user space")
            else:  # asks the kernel to start stamping now, well before the first request
                self._keeper = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                self._keeper.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)

    @property
    def timestamp_source(self) -> str:
        """`kernel` when the kernel stamped the reads, else `user`. Linux turns receive
        stamping on a moment after the first socket asks for it (a deferred static key), so a
        read or two at the very start may come unstamped and get a user stamp: up to 1% of
        reads is still `kernel` (`stats.user_reads` counts them)."""
        s = self.stats
        total = s.kernel_reads + s.user_reads
        ok = self.kernel and s.kernel_reads > 0 and s.user_reads * 100 <= total
        return "kernel" if ok else "user"

    async def _connect(self) -> Conn:
        loop = asyncio.get_running_loop()
        t = time.monotonic_ns()
        try:
            if self.kernel:
                conn = await self._connect_sock(loop)
            else:
                _, conn = await loop.create_connection(
                    lambda: ProtoConn(self.stats), self.host, self.port, ssl=self.ssl
                )
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {self.host}:{self.port}: {exc}") from None
        conn.connect_ns = time.monotonic_ns() - t
        self.stats.opened += 1
        return conn

    async def _connect_sock(self, loop) -> Conn:
        if self._addr is None:
            infos = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
            self._addr = infos[0]
        family, type_, proto, _, addr = self._addr
        sock = socket.socket(family, type_, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            await loop.sock_connect(sock, addr)
        except BaseException:
            sock.close()
            raise
        return SockConn(self.stats, sock, loop)

    async def prewarm(self, n: int) -> int:
        """Open connections until n are idle (before t0); returns how many were opened."""
        want = n - len(self._idle)
        if want <= 0:
            return 0
        got = await asyncio.gather(*(self._connect() for _ in range(want)), return_exceptions=True)
        conns = [c for c in got if not isinstance(c, BaseException)]
        failed = [e for e in got if isinstance(e, BaseException)]
        if failed:  # one line, and nothing left open behind it
            for c in conns:
                c.abort()
            if not isinstance(failed[0], Exception):
                raise failed[0]
            raise CbbenchError(
                f"opening {want} connections before the run: {len(conns)} opened, then "
                f"{failed[0]}{resource_hint(failed[0])}"
            ) from None
        for c in conns:
            c.connect_ns = None  # opened before the measured phase: no request pays for it
        self._idle.extend(conns)
        self.stats.prewarmed += len(conns)
        return len(conns)

    def _take(self) -> Conn | None:
        while self._idle:
            cand = self._idle.pop()
            if not cand.closed:
                return cand
        return None

    def request_bytes(self, method: str, path: str, headers: dict[str, str], body: bytes) -> bytes:
        """One whole request as written to the socket (head, then body)."""
        return self._head(method, path, headers, len(body)) + body

    def _head(self, method: str, path: str, headers: dict[str, str], n: int) -> bytes:
        return self.head_start(method, path, headers) + b"content-length: %d\r\n\r\n" % n

    def head_start(self, method: str, path: str, headers: dict[str, str]) -> bytes:
        """The head up to its content-length line: build it once for requests that share
        their headers, then add `content-length: N CRLF CRLF` and the body."""
        lines = [f"{method} {self.prefix}{path} HTTP/1.1", f"host: {self.host_header}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        return ("\r\n".join(lines) + "\r\n").encode("latin-1")

    async def exchange(
        self, method: str, path: str, headers: dict[str, str], body: bytes, sink: Sink
    ) -> None:
        """Send one request and wait for the whole response. `sink.sent` is told when the
        request was written, the set-up time if this request opened the connection (else
        None) and whether the connection was reused; `sink.head` gets the status and
        headers, `sink.data` each read of the body with its arrival time.

        A kept-alive connection the server closed just as we reused it (its idle timeout)
        fails before any response byte: the request is sent once more on a new connection."""
        await self.send_request(self.request_bytes(method, path, headers, body), sink)

    async def send_request(self, data: bytes, sink: Sink, timeout_s: float | None = None) -> None:
        """`exchange` for a request already encoded (`request_bytes`). With `timeout_s`, a
        request not complete by then fails with TimeoutError: its connection's deadline is
        checked every min(1 s, timeout_s / 10) by one timer for the whole pool (`_sweep`),
        which costs less than a timer a request; so it fires up to that much late."""
        conn = self._take()
        # a kept connection knows its loop: get_running_loop costs a getpid() syscall (3.11)
        loop = conn.loop if conn is not None and conn.loop is not None else None
        loop = loop or asyncio.get_running_loop()
        deadline = None
        if timeout_s is not None:
            deadline = time.monotonic_ns() + int(timeout_s * 1e9)
            self._sweep_s = min(self._sweep_s, timeout_s / 10)
        while True:
            if conn is None:
                if deadline is None:
                    conn = await self._connect()
                else:  # opening one is rare (the pool is prewarmed): a timer of its own
                    left = max(0.0, (deadline - time.monotonic_ns()) / 1e9)
                    conn = await asyncio.wait_for(self._connect(), left)
            conn._reset(sink, loop)
            reused = conn.requests_sent > 0
            if reused or conn.connect_ns is None:
                conn.connect_ns = None  # reused or prewarmed: no set-up in this request
            if reused:
                self.stats.reused += 1
            conn.requests_sent += 1
            conn.sent_ns = time.monotonic_ns()
            sink.sent(conn.sent_ns, conn.connect_ns, reused)
            conn.write(data)
            window = time.monotonic_ns() - conn.sent_ns
            self.send_window_ns.append(window)
            sink.send_window_ns = window
            sink.marks = self.stats.marks
            watched = conn
            if deadline is not None:
                self._busy[watched] = deadline
                if self._sweeper is None:
                    self._sweeper = loop.call_later(self._sweep_s, self._sweep, loop)
            try:
                await conn.done  # type: ignore[misc]
            except ConnectionLost as exc:
                self.discard(conn)
                if reused and not exc.got_response:
                    self.stats.retried += 1
                    conn = None
                    continue
                raise
            except BaseException:
                self.discard(conn)
                raise
            finally:
                if deadline is not None:
                    del self._busy[watched]
            if conn.keep_alive and not conn.closed:
                conn.sink = None
                self._idle.append(conn)
            else:
                self.discard(conn)
            return

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        """Fail the requests past their deadline; again in `_sweep_s` while any is out."""
        now = time.monotonic_ns()
        late = [c for c, t in self._busy.items() if t <= now]
        for conn in late:
            conn._fail(asyncio.TimeoutError(), abort=False)  # its send_request discards it
        self._sweeper = loop.call_later(self._sweep_s, self._sweep, loop) if self._busy else None

    @staticmethod
    def discard(conn: Conn) -> None:
        """A connection in an unknown state (error, cancel, timeout) is never reused."""
        conn.abort()

    def close(self) -> None:
        for conn in self._idle:
            self.discard(conn)
        self._idle.clear()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._keeper is not None:
            self._keeper.close()
            self._keeper = None


def _warn_once(msg: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        _log.warning("cbbench: %s", msg)
