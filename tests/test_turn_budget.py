"""aio.TurnBudget: a burst of finished requests does its bookkeeping a few per turn of the
event loop, in order, so the loop reads its sockets in between (docs/timing.md)."""

from __future__ import annotations

import asyncio

import pytest
from cbbench.harness.client.aio import TurnBudget


async def _burst(n_tasks: int, n: int, cancel: set[int] = frozenset()) -> list:
    budget = TurnBudget(n)
    log: list = []
    done = asyncio.Event()
    loop = asyncio.get_running_loop()

    def tick() -> None:  # one entry per turn, as a socket's reader would run
        log.append("turn")
        if not done.is_set():
            loop.call_soon(tick)

    async def finished(i: int) -> None:
        await budget.wait()
        log.append(i)

    loop.call_soon(tick)
    tasks = [asyncio.ensure_future(finished(i)) for i in range(n_tasks)]
    await asyncio.sleep(0)  # every task is now waiting (or through)
    for i in cancel:
        tasks[i].cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    done.set()
    return log


@pytest.mark.parametrize("use_cancel", [False, True])
def test_at_most_n_per_turn_in_order_and_turns_in_between(use_cancel):
    cancel = {10, 11, 20} if use_cancel else set()  # waiting (the first 8 pass at once)
    log = asyncio.run(_burst(40, 8, cancel))
    passes = [x for x in log if x != "turn"]
    assert passes == [i for i in range(40) if i not in cancel]  # all, first come first
    batch, batches = 0, []
    for x in log:
        if x == "turn":
            batches.append(batch)
            batch = 0
        else:
            batch += 1
    batches.append(batch)
    assert max(batches) <= 8
    assert sum(1 for b in batches if b) >= 5  # 37-40 passes: several turns, reads between


def test_a_lone_caller_passes_at_once():
    async def main() -> int:
        budget = TurnBudget(2)
        for _ in range(5):  # one at a time, each in a later turn: never waits
            await budget.wait()
            await asyncio.sleep(0)
        return budget._left

    assert asyncio.run(main()) >= 1


def test_a_burst_of_sends_goes_out_a_batch_per_turn():
    """A closed loop's start (every stream sends at once) is paced: at most SENDS_PER_TURN
    writes per turn of the loop, so the sockets are read in between (#57)."""
    import time

    from cbbench.harness.client.api import SENDS_PER_TURN, ClientConfig, OpenAIClient
    from cbbench.harness.results.records import RequestRecord
    from servers.fake import Behavior, FakeServerConfig, threaded

    n = 3 * SENDS_PER_TURN + 5

    async def main(url: str) -> list:
        loop = asyncio.get_running_loop()
        client = OpenAIClient(ClientConfig(base_url=url, model="m"), time.monotonic_ns())
        assert client.pool is not None
        turn = [0]
        done = asyncio.Event()

        def tick() -> None:
            turn[0] += 1
            if not done.is_set():
                loop.call_soon(tick)

        sent_in: list[int] = []
        send_request = client.pool.send_request

        async def counted(*args, **kwargs):
            sent_in.append(turn[0])
            return await send_request(*args, **kwargs)

        client.pool.send_request = counted
        loop.call_soon(tick)
        try:
            recs = [RequestRecord(id=f"r{i}", index=i, prompt_len=2, output_len=2) for i in range(n)]
            await asyncio.gather(*(client.send(r, [1, 2]) for r in recs))
        finally:
            done.set()
            await client.aclose()
        assert all(r.ok for r in recs)
        return sent_in

    with threaded(FakeServerConfig(Behavior(itl_s=0.0))) as srv:
        sent_in = asyncio.run(main(srv.url))
    per_turn: dict[int, int] = {}
    for t in sent_in:
        per_turn[t] = per_turn.get(t, 0) + 1
    assert len(sent_in) == n and max(per_turn.values()) <= SENDS_PER_TURN
    assert len(per_turn) >= 4


def test_a_budget_used_again_under_a_new_loop_arms_on_that_loop():
    """The budget keeps the loop it arms on (no getpid() a turn); a later asyncio.run (a new
    loop, the old one closed) must arm on the new one, not call the closed one."""
    budget = TurnBudget(2)

    async def two_turns() -> list[bool]:
        got = [budget.take(), budget.take(), budget.take()]  # the third: none left this turn
        await asyncio.sleep(0)
        await asyncio.sleep(0)  # the budget's turn has run: a fresh one
        return [*got, budget.take()]

    assert asyncio.run(two_turns()) == [True, True, False, True]
    assert asyncio.run(two_turns()) == [True, True, False, True]
