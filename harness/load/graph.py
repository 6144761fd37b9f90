"""Agent graphs on the client side: the messages of each call, with its predecessors' live
answers spliced in, and when a call may go.

A call's messages are its recorded ones (`GraphCall.messages`); each assistant turn that is a
predecessor's output (`GraphCall.live`) is replaced by what the server answered for that call
(its text; the recorded `tool_calls` stay, so the `tool` messages after it still answer them: a
model with random weights calls no tools). The `tools` list goes with the call. A call is sent
when every predecessor has answered and its wait (`think_s`) has passed; a failed call fails
the calls that need it (there is no answer to splice), and the session is unsuccessful.
Chains (sessions without a `GraphCall`: multi-turn and agent loops) are the special case:
turn k's predecessor is turn k-1 (`predecessors`).
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from typing import TYPE_CHECKING, Any

from cbbench.harness.client.reply import Reply

if TYPE_CHECKING:
    from cbbench.harness.results.records import RequestRecord


def predecessors(unit: list[Any]) -> dict[int, tuple[int, ...]]:
    """Each job's predecessors (job indices): its graph's, else the previous turn's."""
    out: dict[int, tuple[int, ...]] = {}
    prev: int | None = None
    for job in unit:
        if job.graph is not None:
            out[job.index] = tuple(p for p in job.graph.after)
        else:
            out[job.index] = () if prev is None else (prev,)
        prev = job.index
    return out


class GraphConversation:
    """One graph session as the client runs it: the live answers so far, by call index."""

    def __init__(self) -> None:
        self.answers: dict[int, str] = {}

    def prompt(self, rec: RequestRecord, job: Any) -> dict:
        g = job.graph
        assert g is not None, "a graph conversation got a request without its call"
        messages = json.loads(g.messages)
        for pos, src in g.live:
            assert src in self.answers, f"call {job.index} ran before call {src} answered"
            messages[pos] = {**messages[pos], "content": self.answers[src]}
        rec.extra["graph"] = {
            "after": list(g.after),
            "depth": g.depth,
            "calls": g.calls,
            "live": len(g.live),
            "name": g.name,
        }
        out: dict = {"messages": messages}
        if g.tools:
            out["tools"] = json.loads(g.tools)
        return out

    def reply(self, rec: RequestRecord, prompt: dict, reply: Reply) -> bool:
        if not rec.ok:
            return False
        idx = rec.index
        self.answers[idx] = reply.full_text
        return True


class CallSlots:
    """`--concurrency` for agent graphs: at most n calls in flight, and a call of a session
    already running goes before a new session's first call (`acquire(start=True)`), so a
    closed loop starts a session only when no started session has a call waiting."""

    def __init__(self, n: int) -> None:
        assert n >= 1, n
        self.free = n
        self.waiting: tuple[deque, deque] = (deque(), deque())  # calls, session starts

    async def acquire(self, start: bool = False) -> None:
        if self.free > 0 and not self.waiting[0] and not (start and self.waiting[1]):
            self.free -= 1
            return
        fut = asyncio.get_running_loop().create_future()
        self.waiting[int(start)].append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # granted as it was cancelled: pass the slot on
            else:
                self.waiting[int(start)].remove(fut)
            raise

    def release(self) -> None:
        self.free += 1
        for queue in self.waiting:
            while queue and self.free > 0:
                fut = queue.popleft()
                if not fut.done():
                    self.free -= 1
                    fut.set_result(None)

    async def __aenter__(self) -> CallSlots:
        await self.acquire()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()


class HeldSlot:
    """A call slot taken for a session's first call before the session started (closed-loop
    agent graphs: a session starts when a slot is free); released once, whether the call
    went or not."""

    def __init__(self, slots: Any) -> None:
        self.slots = slots
        self.held = True

    async def __aenter__(self) -> HeldSlot:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        if self.held:
            self.held = False
            self.slots.release()
