"""Requests built ahead of their send time (harness/load/lookahead.py): bounded, in send order,
each built once, and the bytes on the wire equal to a request built at send time."""

import asyncio
import json
from dataclasses import dataclass

from cbbench.harness.client.api import ClientConfig, OpenAIClient
from cbbench.harness.load.loadgen import Job, Worker, WorkerPlan
from cbbench.harness.load.lookahead import RECORD_BYTES, TOP_UP, Lookahead, Prepared
from cbbench.harness.results.records import RequestRecord
from cbbench.workloads.tokens import PromptTokenIds


@dataclass
class J:
    index: int


def _lookahead(n, **kw):
    built = []

    def build(job):
        built.append(job.index)
        return Prepared(RequestRecord(f"r{job.index}", job.index, 4, 4), b"x" * 100, 1)

    return Lookahead([J(i) for i in range(n)], build, **kw), built


def test_fill_stops_at_the_item_and_byte_caps():
    la, built = _lookahead(50, max_items=8)
    la.fill()
    assert built == list(range(8)) and len(la) == 8
    la, built = _lookahead(50, max_bytes=3 * (100 + RECORD_BYTES))
    la.fill()
    assert built == [0, 1, 2]


def test_take_in_order_builds_each_job_once_and_refill_tops_up():
    async def go():
        la, built = _lookahead(40, max_items=8)
        la.fill()
        refill = asyncio.ensure_future(la.refill())
        got = []
        for i in range(40):
            got.append(la.take(J(i)).rec.index)
            assert len(la) <= 8
            if i % 3 == 0:
                await asyncio.sleep(0)
        refill.cancel()
        return la, built, got

    la, built, got = asyncio.run(go())
    assert got == list(range(40))
    assert sorted(built) == list(range(40))  # nothing built twice, nothing skipped
    assert la.built_ahead + la.built_late == 40 and la.built_ahead > 8  # the refill ran


def test_refill_keeps_the_buffer_near_half_not_full():
    """Falling to half builds TOP_UP more, not back up to full: a timed run that ends leaves
    few requests built for nothing; under steady takes it never falls below half."""

    async def go():
        cap = 4 * TOP_UP
        la, built = _lookahead(20 * cap, max_items=cap)
        la.fill()
        refill = asyncio.ensure_future(la.refill())
        lowest = cap
        for i in range(6 * cap):
            la.take(J(i))
            lowest = min(lowest, len(la))
            await asyncio.sleep(0)
        for _ in range(4 * TOP_UP // 8):  # let it finish a top-up
            await asyncio.sleep(0)
        refill.cancel()
        return la, cap, lowest

    la, cap, lowest = asyncio.run(go())
    assert cap // 2 - 8 <= lowest  # a take a turn, 8 builds a turn: never far below half
    assert cap // 2 <= len(la) <= cap // 2 + TOP_UP  # was: back up to `cap`
    assert la.built_late == 0


def test_a_job_taken_before_it_was_built_is_built_then_and_not_again():
    la, built = _lookahead(5, max_items=2)
    la.fill()
    for i in range(5):  # no refill task: jobs 2.. are built late
        assert la.take(J(i)).rec.index == i
    assert built == [0, 1, 2, 3, 4] and la.built_late == 3


def test_encoded_request_equals_the_one_built_at_send_time():
    cfg = ClientConfig(base_url="http://127.0.0.1:9", model="m")
    plan = WorkerPlan(0, [Job(7, 12, 5, priority=2)], [], cfg, 1, None, seed=3)
    worker = Worker(plan, lambda *a: None)
    client = OpenAIClient(cfg)
    p = worker.prepare(client, plan.jobs[0])
    ids = worker.prompts.token_ids(7, 12)
    assert p.prompt_tokens_client == 12 and p.rec.id == "cbb-7"
    assert p.encoded == client.encode(p.rec, ids)
    head, body = p.encoded.split(b"\r\n\r\n", 1)
    assert b"x-request-id: cbb-7" in head and f"content-length: {len(body)}".encode() in head
    assert b'"prompt":[' + ",".join(map(str, ids)).encode() + b"]" in body
    assert p.encoded == client.pool.request_bytes(  # the head template = the general builder
        "POST",
        "/v1/completions",
        {"content-type": "application/json", "x-request-id": "cbb-7"},
        body,
    )


def test_prompt_ids_drawn_in_batches_equal_those_drawn_one_by_one():
    cfg = ClientConfig(base_url="http://127.0.0.1:9", model="m")
    jobs = [Job(i, 5 + i % 7, 2, prefix_ids=(i % 3,) if i % 2 else ()) for i in range(150)]
    plan = WorkerPlan(0, jobs, [], cfg, 4, None, seed=11, prefix_block_size=4)
    worker = Worker(plan, lambda *a: None)
    calls = []
    worker.prompts.prefetch = lambda reqs, f=worker.prompts.prefetch: (
        calls.append(len(reqs)) or f(reqs)
    )
    la = worker.lookahead(OpenAIClient(cfg))
    la.fill()
    assert calls == [64, 64, 22]  # PREFETCH at a time
    alone = PromptTokenIds(11, 4)
    for job in jobs:
        body = la.take(job).encoded.split(b"\r\n\r\n", 1)[1]
        want = alone(job.index, job.prompt_len, job.prefix_ids)
        assert json.loads(body)["prompt"] == want
    assert not worker.prompts._ready  # each handed out once
