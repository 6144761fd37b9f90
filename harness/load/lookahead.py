"""Requests built ahead of their send time: the record, the encoded request and its client-side
prompt token count depend on the workload only (never on timing), so a worker builds them
before t0 and keeps a bounded buffer topped up while the run goes on. Sending a request then
costs what depends on the moment only: take it, stamp it, write it.

The buffer holds at most `max_items` requests and `max_bytes` of encoded requests, whichever
comes first, so a long or open-ended workload keeps a bounded memory. Before t0 it is filled
(`fill`); during the run `refill` builds TOP_UP more whenever it falls to half (so it stays near
half: a run that ends holds few requests built for nothing), BUILD_PER_TURN requests per
turn of the event loop (a turn to wake up costs about as much as building one), so building
never holds a send back by more than ~30 us (~100 us when a turn starts a PREFETCH batch). A request
taken before it was built is built on the spot (the old path). Session turns (built from the
previous reply) never come through here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from cbbench.harness.results.records import RequestRecord

MAX_ITEMS = 16_384
MAX_BYTES = 64 * 2**20
PREFETCH = 64  # requests whose prompt ids are drawn in one batch (`prefetch`)
BUILD_PER_TURN = 8  # refill: requests built a turn of the event loop (~3 us each)
TOP_UP = 256  # refill: requests built each time the buffer falls to half
RECORD_BYTES = 2048  # a RequestRecord and its Prepared, ~2 KB (tracemalloc)


class _Job(Protocol):
    index: int


@dataclass(slots=True)
class Prepared:
    rec: RequestRecord
    encoded: bytes  # client.encode's output: what goes on the wire
    prompt_tokens_client: int | None


class Lookahead:
    """Prepared requests for `jobs`, taken in that order (`take`)."""

    def __init__(
        self,
        jobs: Sequence[_Job],
        build: Callable[[_Job], Prepared],
        max_items: int = MAX_ITEMS,
        max_bytes: int = MAX_BYTES,
        prefetch: Callable[[Sequence[_Job]], None] | None = None,
    ) -> None:
        assert max_items >= 1 and max_bytes >= 1
        self._jobs = jobs
        self._build = build
        self._prefetch = prefetch  # told the next PREFETCH jobs before the first is built
        self._prefetched = 0  # jobs before this position were passed to `prefetch`
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._next = 0  # position in `jobs` of the next one to build
        self._ready: dict[int, Prepared] = {}  # by job index
        self._bytes = 0
        self._low = asyncio.Event()
        self.built_ahead = 0  # counts, for tests and the docs
        self.built_late = 0

    def __len__(self) -> int:
        return len(self._ready)

    def _full(self) -> bool:
        return len(self._ready) >= self.max_items or self._bytes >= self.max_bytes

    def _build_next(self) -> None:
        if self._prefetch is not None and self._next >= self._prefetched:
            self._prefetched = min(self._next + PREFETCH, len(self._jobs))
            self._prefetch(self._jobs[self._next : self._prefetched])
        job = self._jobs[self._next]
        self._next += 1
        p = self._build(job)
        self._ready[job.index] = p
        self._bytes += len(p.encoded) + RECORD_BYTES
        self.built_ahead += 1

    def fill(self) -> None:
        """Build until the buffer is full or every job is built (before t0)."""
        while self._next < len(self._jobs) and not self._full():
            self._build_next()

    def take(self, job: _Job) -> Prepared:
        """`job`'s prepared request: from the buffer, or built now if the run outran it."""
        p = self._ready.pop(job.index, None)
        if p is None:
            if self._next < len(self._jobs) and self._jobs[self._next].index == job.index:
                self._next += 1  # the refill must not build it again
            self.built_late += 1
            return self._build(job)
        self._bytes -= len(p.encoded) + RECORD_BYTES
        half = len(self._ready) * 2 <= self.max_items and self._bytes * 2 <= self.max_bytes
        if half and self._next < len(self._jobs):
            self._low.set()
        return p

    async def refill(self) -> None:
        """Run alongside the load: when the buffer falls to half, build TOP_UP more (or up to
        full), BUILD_PER_TURN per turn of the event loop; again while takes keep it at half.
        Building back up to full instead left up to half the buffer built for nothing when a
        timed run ended (~8,400 of 47,652 builds in a 20 s selftest). Cancel it when the run
        ends."""
        while self._next < len(self._jobs):
            await self._low.wait()
            self._low.clear()
            built = 0
            while self._next < len(self._jobs) and not self._full() and built < TOP_UP:
                for _ in range(BUILD_PER_TURN):
                    self._build_next()
                    built += 1
                    if self._next >= len(self._jobs) or self._full():
                        break
                await asyncio.sleep(0)
