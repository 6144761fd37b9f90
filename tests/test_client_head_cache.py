"""The raw client's per-response shortcuts (#57): a response head parsed once per distinct
bytes, and chunk sizes read through a table; both must read exactly what the parser reads."""

from __future__ import annotations

from cbbench.harness.client import h1conn
from cbbench.harness.client.h1conn import Conn, PoolStats, _whole_chunks


class _Done:
    def __init__(self) -> None:
        self.result = self.exc = None
        self._done = False

    def done(self) -> bool:
        return self._done

    def set_result(self, v) -> None:
        self._done, self.result = True, v

    def set_exception(self, exc) -> None:
        self._done, self.exc = True, exc


class _Sink:
    send_window_ns = marks = None
    tail = False
    user_read = False

    def __init__(self) -> None:
        self.heads: list = []
        self.body = b""

    def sent(self, *a) -> None: ...

    def head(self, status, header) -> None:
        self.heads.append((status, header("content-type"), header("x-a")))

    def data(self, raw: bytes, t: int) -> None:
        self.body += raw


class _Conn(Conn):
    def write(self, data: bytes) -> None: ...

    def abort(self) -> None:
        self.closed = True


def _exchange(conn: _Conn, response: bytes, split: int) -> tuple[_Sink, _Done]:
    sink, done = _Sink(), _Done()
    conn._reset(sink, None)
    conn.done = done
    conn.feed(response[:split], 1)
    conn.feed(response[split:], 2)
    return sink, done


def test_a_repeated_head_parses_as_the_first_and_a_different_one_apart() -> None:
    h1conn._HEADS.clear()
    conn = _Conn(PoolStats())
    chunked = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nx-a: 1\r\ntransfer-encoding: chunked\r\n\r\n"
    body = b"3\r\nabc\r\n0\r\n\r\n"
    for split in (5, len(chunked) + 2, len(chunked) + len(body)):
        sink, done = _exchange(conn, chunked + body, split)
        assert done.result is None and done.exc is None and done.done()
        assert sink.heads == [(200, "text/event-stream", "1")] and sink.body == b"abc"
        assert conn.keep_alive
    assert len(h1conn._HEADS) == 1
    # same length, other bytes: another head, its own parse (length mode, close)
    other = (
        b"HTTP/1.0 404 NF\r\ncontent-type: application/json\r\nx-a: 2\r\ncontent-length: 2\r\n\r\n"
    )
    sink, done = _exchange(conn, other + b"{}", len(other))
    assert done.done() and sink.heads == [(404, "application/json", "2")] and sink.body == b"{}"
    assert not conn.keep_alive  # HTTP/1.0
    sink, done = _exchange(conn, chunked + body, 7)
    assert sink.heads == [(200, "text/event-stream", "1")] and conn.keep_alive
    assert len(h1conn._HEADS) == 2


def test_the_head_cache_is_bounded() -> None:
    h1conn._HEADS.clear()
    conn = _Conn(PoolStats())
    for i in range(h1conn.HEAD_CACHE + 20):
        head = b"HTTP/1.1 200 OK\r\nx-a: %d\r\ncontent-length: 1\r\n\r\n" % i
        sink, done = _exchange(conn, head + b"z", len(head))
        assert sink.heads == [(200, None, str(i))] and sink.body == b"z" and done.done()
    assert len(h1conn._HEADS) == h1conn.HEAD_CACHE
    h1conn._HEADS.clear()


def test_chunk_sizes_in_any_spelling_read_as_int_reads_them() -> None:
    payload = b"x" * 0xBC
    for size in (b"bc", b"BC", b"0bc", b"00BC"):
        data = size + b"\r\n" + payload + b"\r\n" + b"0\r\n\r\n"
        assert _whole_chunks(data) == (payload, True), size
    big = b"y" * 5000  # past the table
    assert _whole_chunks(b"%x\r\n%s\r\n" % (5000, big)) == (big, False)
    assert _whole_chunks(b"bd\r\n" + payload + b"\r\n") is None  # a size that does not match
    assert _whole_chunks(b"zz\r\n" + payload + b"\r\n") is None  # not hex
