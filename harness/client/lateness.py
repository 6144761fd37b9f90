"""How late a worker's event loop was, over time: the bound on merged reads (response.py).

A read that delivers a first token together with a later event is stamped (by the kernel)
with the later segment's arrival: the first token came earlier, but only as much earlier as
the loop was late to read it. A loop that reads on time reads each segment alone, so events
that arrive together were sent together. `Lateness` keeps, per bucket of ~8 ms, the most
the loop was seen late there: each kernel-stamped read's wait (stamp -> the loop read it,
over every bucket it waited through) and each loop-lag probe's lag (over the probe's
interval). `worst(lo, hi)` is the most over [lo, hi]: a ring of buckets, so a window longer
than the ring, or a bucket last written a lap ago, gives a larger value, never a smaller one.
"""

from __future__ import annotations

from array import array

SHIFT = 23  # a bucket is 2**23 ns (8.4 ms)
SIZE = 8192  # buckets in the ring (~69 s)
# a loop that waited in its poll wakes for new bytes within this; a read that waited longer
# ended a stretch in which the loop was stalled or busy, not idle
WAKE_NS = 1_000_000
BURST_NS = 1_000_000  # reads closer than this are one burst (one turn, or turns back to back)


class Lateness:
    __slots__ = ("_ids", "_max", "_last", "_burst", "_prev", "_since")

    def __init__(self) -> None:
        self._ids = array("q", [-1]) * SIZE
        self._max = array("q", [0]) * SIZE
        self._last = 0  # when the loop last read a socket (user space)
        self._burst = 0  # when this burst of reads began
        self._prev = 0  # when the burst before it began
        self._since = 0  # when the one before that began

    def read(self, stamp_ns: int, now_ns: int) -> None:
        """A kernel-stamped read at `now_ns` of bytes that came at `stamp_ns`. Its own wait
        is lateness; and when it waited past WAKE_NS, the loop was not idle in its poll:
        it may have read nothing new since two bursts back (a burst starts after its turn's
        poll; bytes that came during the turn before missed that poll; then a stall, a long
        callback), so that whole stretch counts: a first token that came early in a stall
        waited through it, while the reads after the stall see only their last segment's
        (short) wait."""
        if now_ns - self._last > BURST_NS:
            self._since, self._prev, self._burst = self._prev, self._burst, now_ns
        self._last = now_ns
        wait = now_ns - stamp_ns
        if wait > WAKE_NS and self._since:
            self.note(self._since, now_ns - self._since, now_ns)
            return
        b = stamp_ns >> SHIFT
        if wait <= 0 or b != now_ns >> SHIFT:
            if wait > 0:
                self.note(stamp_ns, wait, now_ns)
            return
        i = b % SIZE  # the common case, inline: a short wait within one bucket
        if self._ids[i] != b:
            self._ids[i], self._max[i] = b, wait
        elif self._max[i] < wait:
            self._max[i] = wait

    def note(self, start_ns: int, late_ns: int, end_ns: int | None = None) -> None:
        """The loop was `late_ns` late somewhere in [start_ns, end_ns] (end: start + late)."""
        if late_ns <= 0:
            return
        ids, mx = self._ids, self._max
        first = start_ns >> SHIFT
        last = (start_ns + late_ns if end_ns is None else end_ns) >> SHIFT
        for b in range(first, min(last, first + SIZE - 1) + 1):
            i = b % SIZE
            if ids[i] != b:
                ids[i], mx[i] = b, late_ns
            elif mx[i] < late_ns:
                mx[i] = late_ns

    def worst(self, lo_ns: int, hi_ns: int) -> int:
        """The most the loop was seen late over [lo_ns, hi_ns] (ns; an upper estimate)."""
        a, b = lo_ns >> SHIFT, hi_ns >> SHIFT
        if b - a + 1 >= SIZE:
            return max(self._max)
        i, j = a % SIZE, b % SIZE
        mx = self._max
        return max(mx[i : j + 1]) if i <= j else max(max(mx[i:]), max(mx[: j + 1]))
