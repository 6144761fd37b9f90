"""Feeding a response handler through the raw client's compiled read path (harness/client/
cread.py) or its Python path, for tests that run both and compare (the Python path is the
reference)."""

from __future__ import annotations

import asyncio
import shutil

import pytest
from cbbench.harness.client import cread, response
from cbbench.harness.client.h1conn import Conn, PoolStats

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def require_compiled() -> None:
    """The compiled path must be built where a C compiler is (CI has gcc): a silent fallback
    would make every 'both paths' test compare the Python path with itself. Without one
    (or with CBBENCH_NO_CREAD) there is no compiled path to test: skipped, saying why."""
    if cread.SCAN is not None:
        return
    cc = cread.compiler()
    if cread.reason() == "off (CBBENCH_NO_CREAD)" or shutil.which(cc[0]) is None:
        pytest.skip(f"no compiled read path here: {cread.reason()}")
    raise AssertionError(f"{cc[0]} is here but the compiled read path is not: {cread.reason()}")


def framed(body: bytes) -> bytes:
    """`body` as one chunk of a chunked body (the fake server writes an event a chunk)."""
    return b"%x\r\n%s\r\n" % (len(body), body) if body else b""


def feed(resp: response.Response, body: bytes, t: int) -> None:
    """One read of `body` through the compiled path where it takes it, else `data`."""
    if not body:
        return
    if resp.read_chunked(framed(body), t) is None:
        resp.data(body, t)


class FeedConn(Conn):
    """A connection fed by hand (no socket)."""

    def write(self, data: bytes) -> None:
        pass

    def abort(self) -> None:
        self.aborted = True


def through_conn(resp: response.Response, reads: list[bytes], t0: int = 1000):
    """Feed a whole response (head included) read by read, as SockConn does; (whether the
    body ended, the exception that ended the request or None)."""
    loop = asyncio.new_event_loop()
    try:
        conn = FeedConn(PoolStats())
        conn._reset(resp, loop)
        for i, raw in enumerate(reads):
            conn.feed(raw, t0 + i)
        done = conn.done
        if not done.done():
            return False, None
        return True, done.exception()
    finally:
        loop.close()
