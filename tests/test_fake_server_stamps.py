"""The scripted server's log (`fake_server`, `fake_conn`): a request's arrival is the kernel's
receive time of its bytes (not when the server's loop got to them), with a user-space stamp
and one warning where the kernel gives none; chunks follow the schedule (first chunk from
the arrival, the rest from the first), never early; a client that stops reading holds the stream back without losing it."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

import pytest
from cbbench.harness.client.h1conn import kernel_timestamps_supported
from cbbench.harness.servers import fake_server
from cbbench.harness.servers.fake_server import Behavior, FakeServerConfig, ThreadedServer

KERNEL = kernel_timestamps_supported() is None


def _request(port: int, max_tokens: int = 3, index: int = 0, rcvbuf: int = 0) -> socket.socket:
    body = json.dumps(
        {"model": "m", "prompt": "hi", "max_tokens": max_tokens, "stream": True}
    ).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nhost: x\r\nx-request-id: cbb-{index}\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:  # before connect: the window is sized from it
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", port))
    sock.sendall(head + body)
    return sock


def _read_events(sock: socket.socket) -> list[dict]:
    """Every JSON event of one streamed response (reads until the last chunk)."""
    parts = [b""]
    sock.settimeout(30)
    while not (parts[-2] + parts[-1] if len(parts) > 1 else parts[-1]).endswith(b"0\r\n\r\n"):
        data = sock.recv(262144)
        assert data, f"connection closed early: {parts[-1][-200:]!r}"
        parts.append(data)
    buf = b"".join(parts)
    out = []
    for line in buf.split(b"\n"):
        if line.startswith(b"data: {"):
            out.append(json.loads(line[6:]))
    return out


def _blocked_server_request(kernel: bool) -> tuple[int, int, int, dict]:
    """Hold the server's loop, send a request, release the loop: (before send, release,
    t_recv_ns, the final event's cbbench object)."""
    srv = ThreadedServer(FakeServerConfig(Behavior(queue_time_s=None)), kernel_timestamps=kernel)
    started, release = threading.Event(), threading.Event()
    try:
        srv.loop.call_soon_threadsafe(lambda: (started.set(), release.wait(10)))
        assert started.wait(10)
        t_before = time.monotonic_ns()
        sock = _request(srv.port)
        time.sleep(0.05)  # the kernel has the bytes; the server's loop is still held
        t_release = time.monotonic_ns()
        release.set()
        with sock:
            events = _read_events(sock)
    finally:
        release.set()
        srv.stop()
    return t_before, t_release, events[-1]["cbbench"]["t_recv_ns"], events[-1]["cbbench"]


@pytest.mark.skipif(not KERNEL, reason=f"no SO_TIMESTAMPNS here: {kernel_timestamps_supported()}")
def test_kernel_stamp_is_the_arrival_not_when_the_loop_got_to_it():
    t_before, t_release, t_recv, info = _blocked_server_request(kernel=True)
    assert info["t_recv_stamp"] == "kernel"
    assert t_before <= t_recv < t_release  # arrived while the server's loop was held


def test_user_stamp_is_when_the_loop_handled_the_request():
    t_before, t_release, t_recv, info = _blocked_server_request(kernel=False)
    assert info["t_recv_stamp"] == "user"
    assert t_recv >= t_release


def test_no_kernel_stamps_falls_back_with_one_warning(monkeypatch, caplog):
    monkeypatch.setattr(fake_server, "kernel_timestamps_supported", lambda: "not here (test)")
    with caplog.at_level(logging.WARNING, logger="cbbench"):
        srv = ThreadedServer(FakeServerConfig(Behavior(queue_time_s=None)))
    try:
        with _request(srv.port) as sock:
            events = _read_events(sock)
    finally:
        srv.stop()
    assert events[-1]["cbbench"]["t_recv_stamp"] == "user"
    warnings = [r.getMessage() for r in caplog.records if "kernel receive" in r.getMessage()]
    assert len(warnings) == 1 and "not here (test)" in warnings[0]


def test_paced_streams_follow_the_schedule_from_arrival_never_early():
    ttft, itl, n = 0.01, 0.004, 6
    srv = ThreadedServer(FakeServerConfig(Behavior(ttft_s=ttft, itl_s=itl, queue_time_s=None)))
    try:
        socks = [_request(srv.port, n, i) for i in range(40)]
        streams = [_read_events(s) for s in socks]
    finally:
        for s in socks:
            s.close()
        srv.stop()
    for events in streams:
        token_events = [e for e in events if e.get("choices")]
        assert len(token_events) == n
        t_recv = events[-1]["cbbench"]["t_recv_ns"]
        sends = [e["t_send_ns"] for e in token_events]
        assert sends == sorted(sends)
        assert sends[0] >= t_recv + round(ttft * 1e9) - 1000  # 1 us: float rounding
        for k, t in enumerate(sends):  # the gap runs from the first chunk actually sent
            assert t >= sends[0] + round(k * itl * 1e9) - 1000


def test_a_client_that_stops_reading_holds_the_stream_back_without_losing_it():
    n, per_chunk = 5_000_000, 1000  # 5,000 events of ~4 KB at zero delay: 20 MB, far past
    # what the socket buffers hold
    cfg = Behavior(tokens_per_chunk=per_chunk, queue_time_s=None)
    srv = ThreadedServer(FakeServerConfig(cfg))
    try:
        sock = _request(srv.port, n, rcvbuf=65536)
        time.sleep(0.3)  # the server fills the buffers, then must wait for us
        with sock:
            events = _read_events(sock)
    finally:
        srv.stop()
    assert srv.server.held_back > 0  # it did wait
    texts = [e for e in events if e.get("choices")]
    assert len(texts) == n // per_chunk
    assert texts[-1]["choices"][0]["finish_reason"] == "length"
