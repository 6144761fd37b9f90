"""Minimal HTTP/1.1 client on asyncio's Protocol API: the load generator's hot path.

Why not httpx alone: against a zero-delay local server httpx (httpcore + h11 + anyio) costs
about 100 us of client CPU per streamed token and its pool scans every connection per
request; this transport costs a fraction of that (numbers in the README), so the client
stays far from being the bottleneck. httpx remains available (`--http-client httpx`).

Scope: one request at a time per connection, keep-alive, `Content-Length`, chunked and
read-until-close bodies, http and https. Body bytes are handed to `on_data(bytes, t_ns)`
synchronously inside `data_received` (with the status), `t_ns = time.monotonic_ns()` taken on entry: the
arrival time of everything in that read, with no task switch in between.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import Callable
from urllib.parse import urlsplit

OnData = Callable[[bytes, int, int], None]  # (body bytes, arrival ns, HTTP status)
_SIZE, _DATA, _CRLF, _TRAILER = range(4)


class ConnectFailed(Exception):
    """The TCP (or TLS) connection could not be made."""


class ConnectionLost(Exception):
    """The server closed or reset the connection before the response was complete."""

    def __init__(self, message: str, got_response: bool) -> None:
        super().__init__(message)
        self.got_response = got_response


class BadResponse(Exception):
    """Not an HTTP/1.1 response we can read."""


class H1Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.requests_sent = 0
        self._reset(None, None)

    def _reset(self, on_data: OnData | None, loop: asyncio.AbstractEventLoop | None) -> None:
        self.on_data = on_data
        self.head: asyncio.Future | None = loop.create_future() if loop else None
        self.done: asyncio.Future | None = loop.create_future() if loop else None
        self._buf = b""
        self._in_body = False
        self._mode = ""  # "chunked" | "length" | "close"
        self._left = 0
        self._cstate = _SIZE
        self.keep_alive = True
        self.status = 0
        self.headers: dict[str, str] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.done is not None and not self.done.done():
            if self._in_body and self._mode == "close":
                self.done.set_result(None)  # read-until-close body: closing ends it
                return
            err = ConnectionLost(
                f"connection closed by server{f' ({exc})' if exc else ''}"
                + (" mid-response" if self.status else " before a response"),
                got_response=bool(self.status),
            )
            for fut in (self.head, self.done):
                if fut is not None and not fut.done():
                    fut.set_exception(err)

    def _fail(self, exc: Exception) -> None:
        for fut in (self.head, self.done):
            if fut is not None and not fut.done():
                fut.set_exception(exc)
        if self.transport is not None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        t = time.monotonic_ns()
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
                self._parse_head(self._buf[:end].decode("latin-1"))
                data, self._buf = self._buf[end + 4 :], b""
                self._in_body = True
                assert self.head is not None
                self.head.set_result(self.status)
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
                if take and self.on_data is not None:
                    self.on_data(take, t, self.status)
                if self._left == 0:
                    self._finish()
            elif self.on_data is not None:
                self.on_data(data, t, self.status)
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
        buf = self._buf + data if self._buf else data
        pos, out, finished = 0, [], False
        n = len(buf)
        while pos < n or self._cstate == _TRAILER:
            if self._cstate == _SIZE:
                j = buf.find(b"\r\n", pos)
                if j < 0:
                    break
                size = int(buf[pos:j].split(b";", 1)[0], 16)
                pos = j + 2
                if size == 0:
                    self._cstate = _TRAILER
                else:
                    self._left, self._cstate = size, _DATA
            elif self._cstate == _DATA:
                take = min(self._left, n - pos)
                out.append(buf[pos : pos + take])
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
        self._buf = buf[pos:]
        if out and self.on_data is not None:
            self.on_data(out[0] if len(out) == 1 else b"".join(out), t, self.status)
        if finished:
            self._finish()

    def _finish(self) -> None:
        assert self.done is not None
        if not self.done.done():
            self.done.set_result(None)


class H1Pool:
    """Keep-alive connections to one origin; a connection serves one request at a time."""

    def __init__(self, base_url: str) -> None:
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if u.scheme == "https" else None
        self.prefix = u.path.rstrip("/")
        default_port = self.port == (443 if self.ssl else 80)
        self.host_header = self.host if default_port else f"{self.host}:{self.port}"
        self._idle: list[H1Protocol] = []

    async def _connect(self) -> H1Protocol:
        loop = asyncio.get_running_loop()
        try:
            _, proto = await loop.create_connection(H1Protocol, self.host, self.port, ssl=self.ssl)
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {self.host}:{self.port}: {exc}") from None
        return proto

    async def request(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        body: bytes,
        on_data: OnData,
        fresh: bool = False,
    ) -> H1Protocol:
        """Send; returns once the status line and headers are in (`proto.status`,
        `proto.headers`); body bytes go to `on_data`; then `await finish(proto)`.

        A kept-alive connection the server closed just as we reused it (its idle timeout)
        fails before any response byte: the request is sent once more on a new connection."""
        proto = None
        while self._idle and not fresh:
            cand = self._idle.pop()
            if not cand.closed:
                proto = cand
                break
        if proto is None:
            proto = await self._connect()
        lines = [f"{method} {self.prefix}{path} HTTP/1.1", f"host: {self.host_header}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        lines.append(f"content-length: {len(body)}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        proto._reset(on_data, asyncio.get_running_loop())
        assert proto.transport is not None and proto.head is not None
        proto.transport.write(head + body)
        reused = proto.requests_sent > 0
        proto.requests_sent += 1
        try:
            await proto.head
        except ConnectionLost as exc:
            self.discard(proto)
            if reused and not exc.got_response:
                return await self.request(method, path, headers, body, on_data, fresh=True)
            raise
        except BaseException:
            self.discard(proto)
            raise
        return proto

    async def finish(self, proto: H1Protocol) -> None:
        """Wait for the end of the body, then put the connection back (or close it)."""
        assert proto.done is not None
        try:
            await proto.done
        except BaseException:
            self.discard(proto)
            raise
        if proto.keep_alive and not proto.closed:
            proto.on_data = None
            self._idle.append(proto)
        else:
            self.discard(proto)

    @staticmethod
    def discard(proto: H1Protocol) -> None:
        """A connection in an unknown state (error, cancel, timeout) is never reused."""
        if proto.transport is not None and not proto.closed:
            proto.transport.abort()
        proto.closed = True

    def close(self) -> None:
        for proto in self._idle:
            self.discard(proto)
        self._idle.clear()
