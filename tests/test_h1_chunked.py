"""The raw client's chunked-body reader (harness/client/h1conn.py): a read of whole chunks takes the
fast path, anything else the state machine; both give the same bytes however the body is
split across reads, and the body ends exactly at its last chunk."""

import asyncio

from cbbench.harness.client.h1conn import Conn, PoolStats, _whole_chunks
from hypothesis import given, settings
from hypothesis import strategies as st

HEAD = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"


class _Sink:
    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def head(self, status, header) -> None:
        self.status = status

    def data(self, raw: bytes, t: int) -> None:
        self.parts.append(raw)


class _Conn(Conn):
    def write(self, data: bytes) -> None:
        pass

    def abort(self) -> None:
        self.aborted = True


def _read(reads: list[bytes]) -> tuple[bytes, bool]:
    loop = asyncio.new_event_loop()
    try:
        conn, sink = _Conn(PoolStats()), _Sink()
        conn._reset(sink, loop)
        for r in reads:
            conn.feed(r, 0)
        done = conn.done.done() and conn.done.exception() is None
        return b"".join(sink.parts), done
    finally:
        loop.close()


def _chunk(payload: bytes, ext: bool = False) -> bytes:
    return b"%x%s\r\n%s\r\n" % (len(payload), b";x=1" if ext else b"", payload)


def test_whole_chunks_fast_path_and_what_it_leaves_to_the_state_machine():
    body = _chunk(b"data: a\n\n") + _chunk(b"data: bc\n\n")
    assert _whole_chunks(body) == (b"data: a\n\ndata: bc\n\n", False)
    assert _whole_chunks(body + b"0\r\n\r\n") == (b"data: a\n\ndata: bc\n\n", True)
    assert _whole_chunks(_chunk(b"a\r\nb")) is None  # CRLF inside a payload
    assert _whole_chunks(_chunk(b"abc", ext=True)) is None  # a chunk extension
    assert _whole_chunks(b"0\r\nx-trailer: 1\r\n\r\n") is None
    assert _whole_chunks(_chunk(b"abc")[:-3] + b"\r\n") is None  # wrong size
    assert _whole_chunks(b"0\r\n\r\n" + _chunk(b"late")) is None  # bytes after the end
    # each of those still reads right through the state machine
    for body in (_chunk(b"a\r\nb"), _chunk(b"abc", ext=True)):
        assert _read([HEAD + body + b"0\r\nx-trailer: 1\r\n\r\n"])[1]


@settings(max_examples=200, deadline=None)
@given(
    payloads=st.lists(st.binary(min_size=1, max_size=30), max_size=8),
    ext=st.booleans(),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8),
)
def test_any_split_reads_the_same_body(payloads, ext, cuts):
    stream = HEAD + b"".join(_chunk(p, ext) for p in payloads) + b"0\r\n\r\n"
    bounds = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    reads = [stream[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    assert _read(reads) == (b"".join(payloads), True)
    partial = _read(reads[:-1]) if len(reads) > 1 else (b"", False)
    assert not partial[1]  # not done before the last chunk's end arrived
