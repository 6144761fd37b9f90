"""The load generator's event loop: uvloop when it is installed, else asyncio's own.

uvloop (libuv) roughly halves the loop's own cost per I/O callback; it is an optional
accelerator (`pip install cbbench[fast]`): nothing needs it, and `CBBENCH_NO_UVLOOP=1` (or
`use_uvloop=False`) runs the pure asyncio loop, which stays tested.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Coroutine
from typing import Any, TypeVar

from cbbench.harness.envflags import env_flag

T = TypeVar("T")


def loop_name(use_uvloop: bool = True) -> str:
    """ "uvloop" when `run` would use it, else "asyncio"."""
    if not use_uvloop or env_flag("CBBENCH_NO_UVLOOP"):
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def run(coro: Coroutine[Any, Any, T], use_uvloop: bool = True) -> T:
    """`asyncio.run(coro)` on uvloop's loop when available."""
    if loop_name(use_uvloop) == "uvloop":
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)


class TurnBudget:
    """At most `n` passes per turn of the event loop; later callers wait for later turns.

    asyncio runs every ready callback before it polls its sockets again. When many requests
    finish together (256 streams of one length, a static batch) their bookkeeping (record,
    next request) would all run in one turn; a socket left unread for longer than one token
    gap gets its next segment merged into the waiting one, and the kernel stamps the merged
    bytes with the later segment's time. Passing through the budget spreads such a burst
    over turns of `n`, and the loop reads its sockets in between."""

    def __init__(self, n: int = 16) -> None:
        assert n >= 1
        self.n = n
        self._left = n
        self._waiters: collections.deque[asyncio.Future] = collections.deque()
        self._armed = False
        # the loop it was last armed on: get_running_loop costs a getpid() syscall (3.11),
        # and a budget arms once a turn (a client and its budgets belong to one loop)
        self._loop: asyncio.AbstractEventLoop | None = None

    def take(self) -> bool:
        """A pass now if this turn has one left and nobody waits (no coroutine: the common
        case costs a call); False: `await wait()`."""
        if self._left > 0 and not self._waiters:
            self._left -= 1
            self._arm()
            return True
        return False

    async def wait(self) -> None:
        if self.take():
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        self._arm()
        await fut

    def _arm(self) -> None:
        if not self._armed:
            self._armed = True
            loop = self._loop
            if loop is None or not loop.is_running():  # first use, or a new asyncio.run
                loop = self._loop = asyncio.get_running_loop()
            loop.call_soon(self._turn)

    def _turn(self) -> None:
        """Runs once in the next turn (after that turn's poll): a fresh budget, handed first
        to those waiting, in order."""
        self._armed = False
        self._left = self.n
        while self._waiters and self._left > 0:
            fut = self._waiters.popleft()
            if not fut.done():  # not cancelled
                self._left -= 1
                fut.set_result(None)
        if self._waiters or self._left < self.n:
            self._arm()
