"""The raw client's socket read in C (`cread.RECV`, used by `h1conn.SockConn._readable`)
against the Python lines it replaces (`socket.recvmsg` and the SO_TIMESTAMPNS stamp): the
same bytes, the same stamp rule (the kernel's receive time on CLOCK_MONOTONIC, or a user
stamp where none came), the same end of file and errors, over real loopback sockets."""

from __future__ import annotations

import asyncio
import os
import socket
import time

import pytest
from cbbench.harness.client import cread, h1conn, response, stamped
from cbbench.harness.client.h1conn import SO_TIMESTAMPNS, PoolStats, SockConn
from read_paths import require_compiled

pytestmark = pytest.mark.skipif(
    h1conn.kernel_timestamps_supported() is not None, reason="needs SO_TIMESTAMPNS"
)


def _pair(stamps: bool = True) -> tuple[socket.socket, socket.socket, socket.socket]:
    """(listener, client, server side): a loopback TCP connection, the client non-blocking."""
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen()
    cli = socket.socket()
    # a window for the largest payload at once: else its tail is sent only when the read
    # opens the window, 30 ms after sendall returned, and is stamped then
    cli.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    cli.connect(lst.getsockname())
    srv, _ = lst.accept()
    cli.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    srv.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if stamps:
        cli.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    cli.setblocking(False)
    if stamps:
        _until_stamped(cli, srv)
    return lst, cli, srv


def _until_stamped(cli: socket.socket, srv: socket.socket) -> None:
    """Linux turns receive stamping on for the host a moment after the first socket asks
    (a deferred switch), so the first bytes may come unstamped: send a byte until one is."""
    sent = got = 0
    stamped = False
    for _ in range(200):
        srv.sendall(b".")
        sent += 1
        time.sleep(0.002)
        try:
            data, anc, _, _ = cli.recvmsg(256, 1024)
        except BlockingIOError:
            continue
        got += len(data)
        if anc:
            stamped = True
            break
    if not stamped:
        pytest.fail("the kernel stamped none of 200 reads with SO_TIMESTAMPNS on")
    deadline = time.monotonic() + 5
    while got < sent and time.monotonic() < deadline:  # leave nothing behind for the test
        try:
            got += len(cli.recv(256))
        except BlockingIOError:
            time.sleep(0.001)
    assert got == sent, "warm-up bytes still in flight after 5 s"


class Reads(SockConn):
    """A SockConn that keeps what it was fed: (bytes, stamp, user_read)."""

    def __init__(self, sock: socket.socket, loop) -> None:
        super().__init__(PoolStats(), sock, loop)
        self.got: list[tuple[bytes, int, bool]] = []
        self.sink = self  # the flag `_readable` sets per read
        self.user_read = False
        self.lost: list = []

    def feed(self, data: bytes, t: int) -> None:
        self.got.append((data, t, self.user_read))

    def _lost(self, exc) -> None:
        self.lost.append(exc)
        self.closed = True


def _read_both(payloads: list[bytes], stamps: bool, gap_s: float):
    """Each payload written `gap_s` before it is read, through the compiled and the Python
    path in turn (a connection each): per path, (reads, stats, sends' times)."""
    out = {}
    loop = asyncio.new_event_loop()
    try:
        for name, recv in (("c", cread.RECV), ("python", None)):
            lst, cli, srv = _pair(stamps)
            conn = Reads(cli, loop)
            sent = []
            saved = stamped._recv
            stamped._recv = recv
            try:
                for p in payloads:
                    before = time.monotonic_ns()
                    srv.sendall(p)  # loopback: delivered (and stamped) before it returns
                    sent.append((before, time.monotonic_ns()))
                    time.sleep(gap_s)
                    conn._readable()
            finally:
                stamped._recv = saved
                conn.abort()
                srv.close()
                lst.close()
            out[name] = (conn.got, conn.stats, sent)
    finally:
        loop.close()
    return out


@pytest.mark.parametrize("stamps", [True, False], ids=["kernel", "no-stamps"])
def test_recv_reads_and_stamps_as_the_python_lines(stamps):
    require_compiled()
    payloads = [b"a", b"x" * 3500, os.urandom(70_000), b"\r\n0\r\n\r\n"]
    gap = 0.03  # the stamp is the arrival, not the read 30 ms later (kernel stamps)
    both = _read_both(payloads, stamps, gap)
    for name, (got, stats, sent) in both.items():
        assert b"".join(g[0] for g in got) == b"".join(payloads), name
        # every payload was read whole before the next was written: its reads' stamps
        # lie after its write began and (kernel) before it returned, not at the read 30 ms
        # later (a stamp is converted from CLOCK_REALTIME: off by microseconds)
        at = 0
        for p, (before, after) in zip(payloads, sent, strict=True):
            n = 0
            while n < len(p):
                data, t, user = got[at]
                at += 1
                n += len(data)
                assert t >= before - 1_000_000, (name, t - before)
                assert user is (not stamps), name
                if stamps:
                    assert t <= after + 1_000_000, (name, (t - after) / 1e6)
        assert at == len(got)
        if stamps:
            assert stats.kernel_reads == len(got) and stats.user_reads == 0, name
            assert len(stats.read_delay_ns) == len(got)
            assert min(stats.read_delay_ns) > gap * 1e9 * 0.5, name  # waited ~30 ms unread
        else:
            assert stats.user_reads == len(got) and stats.kernel_reads == 0, name
            assert len(stats.read_delay_ns) == 0


def test_recv_says_nothing_to_read_end_of_file_and_errors():
    require_compiled()
    lst, cli, srv = _pair()
    try:
        assert cread.RECV(cli.fileno(), 4096) is None  # EAGAIN: nothing yet
        srv.sendall(b"hello")
        time.sleep(0.01)
        data, t, delay = cread.RECV(cli.fileno(), 3)  # at most `size`
        assert data == b"hel" and delay >= 0 and t <= time.monotonic_ns()
        assert cread.RECV(cli.fileno(), 4096)[0] == b"lo"
        srv.close()
        time.sleep(0.01)
        assert cread.RECV(cli.fileno(), 4096)[0] == b""  # the server closed: end of file
        with pytest.raises(ValueError):
            cread.RECV(cli.fileno(), 0)
        with pytest.raises(ValueError):
            cread.RECV(cli.fileno(), h1conn.READ_SIZE + 1)
        with pytest.raises(TypeError):
            cread.RECV(cli.fileno())
    finally:
        cli.close()
        lst.close()
    with pytest.raises(OSError):  # a closed descriptor: EBADF, as socket.recvmsg raises
        cread.RECV(cli.fileno() if cli.fileno() >= 0 else 10_000, 4096)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_a_reset_or_closed_connection_is_lost_on_both_paths(compiled):
    """The server's close ends the connection (`_lost(None)`), an error too (`_lost(exc)`)."""
    if compiled:
        require_compiled()
    loop = asyncio.new_event_loop()
    saved = stamped._recv
    stamped._recv = cread.RECV if compiled else None
    try:
        lst, cli, srv = _pair()
        conn = Reads(cli, loop)
        srv.sendall(b"bye")
        srv.close()
        time.sleep(0.01)
        conn._readable()  # the bytes (a short read: drained, as far as it can tell)
        conn._readable()  # then the end of file
        assert [g[0] for g in conn.got] == [b"bye"] and conn.lost == [None]
        lst.close()
        lst, cli, srv = _pair()
        conn = Reads(cli, loop)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        srv.close()  # linger 0: a reset
        time.sleep(0.01)
        conn._readable()
        conn._readable()  # (a no-op once lost)
        assert len(conn.lost) == 1 and isinstance(conn.lost[0], OSError)
        lst.close()
    finally:
        stamped._recv = saved
        loop.close()


def test_the_switch_turns_the_compiled_read_off_and_on():
    require_compiled()
    try:
        response.use_compiled_read(False)
        assert stamped._recv is None
    finally:
        response.use_compiled_read(True)
    assert stamped._recv is cread.RECV
