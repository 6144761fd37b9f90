"""A decode worker sends an imported request's first token (the prefill worker's) as soon as
the request is in, not a decode step later with the second one; the running streams keep
stepping meanwhile. Both engine drivers: the engine thread (AsyncEngine) and the engine
process's loop (EngineCore.serve, here on in-process ZMQ sockets). Once the imported request
is in, each step waits for an event the test sets only after the first token has arrived,
so "before the next step" is an order, not a time (before: the token came out of step())."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.engine.llm_engine import LLMEngine
from cbbench.reference_engine.sampling_params import SamplingParams
from cbbench.reference_engine.server.async_engine import AsyncEngine
from cbbench.reference_engine.server.engine_core import EngineCore
from cbbench.reference_engine.server.ipc import decode, encode

PROMPT = list(range(3, 40))
GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
WAIT_S = 10.0


def _payload():
    pre = LLMEngine.from_config(EngineConfig(model="tiny", role="prefill"))
    pre.add_request("p", PROMPT, SamplingParams(max_tokens=1, temperature=0), kv_export=True)
    for _ in range(100):
        for o in pre.step():
            if o.kv_transfer is not None:
                return o.kv_transfer
    raise AssertionError("no payload")


def _gated(engine: LLMEngine) -> tuple[threading.Event, list[int]]:
    """Each step of `engine` once request "imp" is in waits for the event; counts those."""
    gate, held_steps = threading.Event(), [0]
    step = engine.step

    def held() -> list:
        if "imp" in engine.seqs and not gate.is_set():
            held_steps[0] += 1
            assert gate.wait(WAIT_S), "the test never released the step"
        return step()

    engine.step = held  # type: ignore[method-assign]
    return gate, held_steps


def test_engine_thread_sends_the_imported_first_token_before_the_next_step():
    payload = _payload()
    engine = LLMEngine.from_config(EngineConfig(model="tiny", role="decode"))
    gate, held = _gated(engine)
    driver = AsyncEngine(engine)
    driver.start()

    async def drain(it) -> list[int]:
        return [t async for out in it for t in out.new_token_ids]

    async def run() -> list[int]:
        running = aiter(await driver.add_request("run", PROMPT, GREEDY))  # a stream, stepping
        await asyncio.wait_for(anext(running), WAIT_S)  # its first step is done
        imported = aiter(await driver.add_request("imp", PROMPT, GREEDY, kv_import=payload))
        first = await asyncio.wait_for(anext(imported), WAIT_S)  # the next step is held
        assert held[0] <= 1 and first.new_token_ids == [payload.first_token_id]
        gate.set()
        rest = await asyncio.wait_for(drain(imported), WAIT_S)
        await asyncio.wait_for(drain(running), WAIT_S)
        return first.new_token_ids + rest

    try:
        tokens = asyncio.run(run())
    finally:
        gate.set()
        driver.shutdown()
    assert len(tokens) == GREEDY.max_tokens and engine.block_manager.num_used_blocks == 0


def test_engine_process_loop_sends_the_imported_first_token_before_the_next_step():
    zmq = pytest.importorskip("zmq")
    payload = _payload()
    core = EngineCore(EngineConfig(model="tiny", role="decode"))
    gate, held = _gated(core.engine)
    ctx = zmq.Context()
    to_core, core_in = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    core_out, from_core = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    core_in.bind("inproc://cmd")
    to_core.connect("inproc://cmd")
    from_core.bind("inproc://out")
    core_out.connect("inproc://out")
    from_core.setsockopt(zmq.RCVTIMEO, int(WAIT_S * 1000))
    loop = threading.Thread(target=core.serve, args=(core_in, core_out, os.getppid()),
                            daemon=True)  # fmt: skip

    done: set[str] = set()  # finished requests, in whichever message they came

    def outputs_until(rid: str) -> list:
        seen = []
        while not any(o.request_id == rid for o in seen):
            msg = decode(from_core.recv())
            assert msg["t"] == "step", msg
            seen += msg["outputs"]
            done.update(o.request_id for o in msg["outputs"] if o.finished)
        return seen

    loop.start()
    try:
        to_core.send(encode([["add", "run", PROMPT, GREEDY, 0, {}]]))
        outputs_until("run")  # the running stream's first step is done
        to_core.send(encode([["add", "imp", PROMPT, GREEDY, 0, {"kv_import": payload}]]))
        first = [o for o in outputs_until("imp") if o.request_id == "imp"]
        assert held[0] <= 1 and [t for o in first for t in o.new_token_ids] == [
            payload.first_token_id
        ]
        gate.set()  # "run" may have finished already (a slow test thread adds "imp" late)
        while done != {"run", "imp"}:
            done |= {o.request_id for o in decode(from_core.recv())["outputs"] if o.finished}
    finally:
        gate.set()
        to_core.send(encode([["shutdown"]]))
        loop.join(WAIT_S)
        for s in (to_core, core_in, core_out, from_core):
            s.close(linger=0)
        ctx.term()
    assert not loop.is_alive() and core.engine.block_manager.num_used_blocks == 0
