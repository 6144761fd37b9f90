"""The worker loop's turn marks: a sound floor under the arrival of any byte a read delivers.

A timer (`loadgen._marker`: a task that sleeps ~10 ms) calls `mark` with the time it ran.
On both loops the client runs on, a mark's successor runs at least one poll later, and the
readers a poll reports run before the next mark: asyncio runs the readers of its poll in
the same turn and a sleep's wake-up two turns after the one that set it (the timer fires
after a turn's readers, the task steps at the start of the next); uvloop runs timers and
then the task's step (idle phase) before its poll, and the poll's readers in the same turn.
So between marks M(c-1) and M(c) lies a whole poll that began after M(c-1) and whose ready
readers all ran before M(c). A read that runs after M(c) (it sees `floor_ns` = M(c-1)) is
of bytes that arrived after M(c-1): either its socket was ready at that poll, was read then
and drained (`SockConn._readable` reads until a short read or EAGAIN), so these bytes came
after that read; or it was empty at that poll, which began after M(c-1). Nothing here is
inferred from how late reads look: it follows from the loop's order.

A read that holds the first token and a later event carries (kernel stamps) the later
one's arrival; the first token came at or after max(send, floor), so its TTFT error is at
most stamp - that (response.merged_slack). Without marks (no load generator running the
marker) the floor is 0 and the send bounds it alone: sound, looser.
"""

from __future__ import annotations


class LoopMarks:
    __slots__ = ("floor_ns", "last_ns", "count")

    def __init__(self) -> None:
        self.floor_ns = 0  # the mark before the latest: every later read's bytes came after it
        self.last_ns = 0  # the latest mark
        self.count = 0

    def mark(self, now_ns: int) -> None:
        """The marker ran at `now_ns` (monotonic, on the loop's thread)."""
        self.floor_ns, self.last_ns = self.last_ns, now_ns
        self.count += 1
