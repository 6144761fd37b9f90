"""The per-request bound's logic (response.merged_slack, client/turns.py), read by read: a
first token alone in a kernel-stamped read is exact; merged with a later event, a later
chunk's framing, part of an event, or stamped in user space, it came in [floor, stamp],
floor the later of the send and the loop's turn mark before last. And the premise of that
floor, on both loops: bytes a read returns never arrived before the mark before last."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest
from cbbench.harness.client import aio, response
from cbbench.harness.client.h1conn import PoolStats
from cbbench.harness.client.turns import LoopMarks
from cbbench.harness.load.loadgen import _marker
from cbbench.harness.results.records import RequestRecord
from read_paths import HEAD, FeedConn

SENT = 1_000_000
WINDOW = 5_000


def _event(i: int) -> bytes:
    obj = {
        "id": "x",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": " t"}, "token_ids": [i]}],
    }
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _chunk(body: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(body), body)


def _slack(reads: list[tuple[bytes, int, bool]], floor: int = 0, compiled: bool = True):
    """Feed (raw bytes, stamp, user-stamped) reads after the head; (the request's slack,
    its stamp_bound_s)."""
    response.use_compiled_read(compiled)
    loop = asyncio.new_event_loop()
    try:
        rec = RequestRecord(id="c", index=0, prompt_len=3, output_len=4)
        r = response.Response(rec, stream=True, collect_server_times=False)
        r.sent(SENT)
        r.send_window_ns = WINDOW
        marks = r.marks = LoopMarks()
        if floor:
            marks.mark(floor)
            marks.mark(floor + 1)  # the floor is the mark before the latest
        conn = FeedConn(PoolStats())
        conn._reset(r, loop)
        conn.feed(HEAD, SENT + 10)
        for raw, t, user in reads:
            r.user_read = user
            conn.feed(raw, t)
        assert not conn.done.done() or conn.done.exception() is None  # no framing error
        response.finish(rec, r, 0, reads[-1][1])
        return response.merged_slack(r), rec.extra["stamp_bound_s"]
    finally:
        loop.close()
        response.use_compiled_read(True)


@pytest.mark.parametrize("compiled", [True, False])
def test_a_first_token_alone_in_a_kernel_stamped_read_is_exact(compiled):
    got = _slack(
        [(_chunk(_event(1)), SENT + 50_000, False)], floor=SENT + 30_000, compiled=compiled
    )
    assert got == (0, WINDOW / 1e9)


@pytest.mark.parametrize("compiled", [True, False])
def test_a_first_token_merged_with_a_later_event_counts_from_the_later_of_send_and_floor(compiled):
    read = _chunk(_event(1)) + _chunk(_event(2))
    t = SENT + 90_000
    # the loop's mark before last is after the send: the token came after it
    assert _slack([(read, t, False)], floor=SENT + 40_000, compiled=compiled)[0] == 50_000
    # no marks (or older than the send): the send is the floor
    assert _slack([(read, t, False)], compiled=compiled)[0] == 90_000
    assert _slack([(read, t, False)], floor=SENT - 5, compiled=compiled)[0] == 90_000
    got = _slack([(read, t, False)], floor=SENT + 40_000, compiled=compiled)[1]
    assert got == pytest.approx((WINDOW + 50_000) / 1e9)


def test_a_later_chunks_framing_or_part_of_an_event_in_the_read_counts_as_merged():
    t = SENT + 90_000
    # the next chunk's size line came with it (written apart, stamped with the later write)
    nxt = _chunk(_event(2))
    tail = _chunk(_event(1)) + nxt[: nxt.index(b"\r\n") + 2]
    assert _slack([(tail, t, False), (nxt[nxt.index(b"\r\n") + 2 :], t + 9, False)])[0] == t - SENT
    # a part of the next event's payload
    part = _chunk(_event(1)) + nxt[:20]
    assert _slack([(part, t, False), (nxt[20:], t + 9, False)])[0] == t - SENT
    # a partial size line
    assert _slack([(_chunk(_event(1)) + nxt[:1], t, False), (nxt[1:], t + 9, False)])[0] == t - SENT


def test_a_user_stamped_first_token_is_bounded_from_the_floor_even_alone():
    t = SENT + 70_000
    assert _slack([(_chunk(_event(1)), t, True)], floor=SENT + 20_000)[0] == 50_000


def test_marks_keep_the_one_before_the_latest_as_the_floor():
    m = LoopMarks()
    assert m.floor_ns == 0
    m.mark(10)
    assert (m.floor_ns, m.last_ns) == (0, 10)
    m.mark(25)
    assert (m.floor_ns, m.last_ns, m.count) == (10, 25, 2)


async def _premise(stall_s: float, n_msgs: int) -> list[tuple[int, int]]:
    """A socket written by a thread every ~3 ms while the loop stalls in a callback for
    `stall_s` every 50 ms; per message, (the moment its send returned, the floor the read
    that returned it saw)."""
    loop = asyncio.get_running_loop()
    a, b = socket.socketpair()
    a.setblocking(False)
    marks = LoopMarks()
    marker = asyncio.ensure_future(_marker(marks))
    posted: list[int] = []
    seen: list[int] = []  # per message read: its read's floor
    buf = bytearray()
    done = asyncio.Event()

    def readable() -> None:
        while True:  # as SockConn: until a short read or EAGAIN
            try:
                data = a.recv(65536)
            except BlockingIOError:
                return
            buf.extend(data)
            seen.extend([marks.floor_ns] * data.count(b"\n"))
            if len(seen) >= n_msgs:
                done.set()
            if len(data) < 65536:
                return

    def stall() -> None:
        end = time.monotonic() + stall_s
        while time.monotonic() < end:
            pass
        if not done.is_set():
            loop.call_later(0.05, stall)

    def writer() -> None:
        for _ in range(n_msgs):
            b.send(b"x\n")
            posted.append(time.monotonic_ns())  # arrived by now (loopback)
            time.sleep(0.003)

    loop.add_reader(a.fileno(), readable)
    loop.call_later(0.02, stall)
    th = threading.Thread(target=writer, daemon=True)
    th.start()
    try:
        await asyncio.wait_for(done.wait(), 20)
    finally:
        loop.remove_reader(a.fileno())
        marker.cancel()
        th.join(5)
        a.close()
        b.close()
    return list(zip(posted, seen, strict=True))


@pytest.mark.parametrize("use_uvloop", [False, True])
def test_no_byte_a_read_returns_arrived_before_the_floor_it_saw(use_uvloop):
    if use_uvloop and aio.loop_name(True) != "uvloop":
        pytest.skip("uvloop is not installed")
    pairs = aio.run(_premise(0.04, 300), use_uvloop=use_uvloop)
    assert len(pairs) == 300
    assert all(posted >= floor for posted, floor in pairs)
    # not vacuous: reads after stalls saw a floor from before them (merged messages)
    assert sum(1 for posted, floor in pairs if posted - floor > 20_000_000) >= 5
