"""The client against the scripted server on loopback: timing vs a known schedule, token
counting, multi-token chunks, and every failure mode ending in a failed record.

Tolerance: the client may see a chunk at most TOL after the server sent it (same monotonic
clock; loopback plus a loaded 2-core CI box), and never before.
"""

import asyncio
import socket
import time

import openai
import pytest
from cbbench.harness.client.api import ClientConfig, OpenAIClient
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.results.summary import summarize
from servers.fake import Behavior, FakeServerConfig, threaded

TOL = 0.05


def _send(url, output_len=10, prompt=None, **cfg):
    async def go():
        client = OpenAIClient(ClientConfig(base_url=url, model="m", **cfg), time.monotonic_ns())
        try:
            rec = RequestRecord(id="cbb-1", index=1, prompt_len=5, output_len=output_len)
            return await client.send(rec, prompt if prompt is not None else [11, 12, 13, 14, 15])
        finally:
            await client.aclose()

    return asyncio.run(go())


HTTP_CLIENTS = pytest.mark.parametrize("hc", ["raw", "httpx"])


@HTTP_CLIENTS
def test_timing_agrees_with_the_server_schedule(hc):
    with threaded(FakeServerConfig(Behavior(ttft_s=0.1, itl_s=0.02, queue_time_s=0.123))) as srv:
        r = _send(srv.url, collect_server_times=True, http_client=hc)
    assert r.ok, r.error
    assert r.output_tokens_client == r.output_tokens_server == 10
    assert r.prompt_tokens_client == r.prompt_tokens_server == 5
    lags = r.extra["recv_minus_send_s"]
    assert len(lags) == 10 and all(0 <= d < TOL for d in lags)
    assert 0.1 <= r.ttft_s < 0.1 + TOL
    assert r.tpot_s == pytest.approx(0.02, abs=TOL / 9)
    assert len(r.itl_s) == 9 and sum(r.itl_s) == pytest.approx(r.e2e_s - r.ttft_s)
    assert r.e2e_s == pytest.approx(r.last_token_s - r.sent_s)
    assert r.server_queue_s == 0.123
    assert r.extra["scheduler"] == "fake" and r.finish_reason == "length"


def test_keep_alive_reuses_one_connection_for_sequential_requests():
    async def go(url):
        client = OpenAIClient(ClientConfig(base_url=url, model="m"), time.monotonic_ns())
        recs = []
        for i in range(3):
            rec = RequestRecord(id=f"cbb-{i}", index=i, prompt_len=2, output_len=3)
            recs.append(await client.send(rec, [1, 2]))
        idle = len(client.pool._idle)
        await client.aclose()
        return recs, idle

    with threaded(FakeServerConfig(Behavior())) as srv:
        recs, idle = asyncio.run(go(srv.url))
        assert srv.server.connections == 1
    assert all(r.ok for r in recs) and idle == 1


def test_request_dropped_on_a_reused_connection_is_sent_again_once():
    async def go(url):
        client = OpenAIClient(ClientConfig(base_url=url, model="m"), time.monotonic_ns())
        recs = []
        for i in range(3):
            rec = RequestRecord(id=f"cbb-{i}", index=i, prompt_len=2, output_len=3)
            recs.append(await client.send(rec, [1, 2]))
        await client.aclose()
        return recs

    with threaded(FakeServerConfig(Behavior(), drop_reused=1)) as srv:
        recs = asyncio.run(go(srv.url))
        assert srv.server.dropped == 1 and srv.server.connections == 2
    assert all(r.ok for r in recs), [r.error for r in recs]


def test_multi_token_chunks_spread_their_gap_over_their_tokens():
    with threaded(FakeServerConfig(Behavior(itl_s=0.04, tokens_per_chunk=4))) as srv:
        r = _send(srv.url, output_len=12)
    assert r.ok and r.output_tokens_client == 12 and len(r.token_times_s) == 12
    itl = r.itl_s
    assert itl[:3] == [0.0, 0.0, 0.0]  # arrived with the first token
    for a, b in ((3, 7), (7, 11)):
        assert max(itl[a:b]) - min(itl[a:b]) < 1e-6  # one chunk: equal shares
        gap = r.token_times_s[b] - r.token_times_s[a]
        assert sum(itl[a:b]) == pytest.approx(gap)
        assert itl[a] == pytest.approx(0.01, abs=TOL / 4)
    assert r.tpot_s == pytest.approx(sum(itl) / 11)


def test_without_token_ids_counts_chunks_and_keeps_server_usage():
    with threaded(FakeServerConfig(Behavior(tokens_per_chunk=4))) as srv:
        r = _send(srv.url, output_len=12, extensions=False)
    assert r.ok and r.output_tokens_client == 3 and r.output_tokens_server == 12
    assert r.tpot_s == pytest.approx((r.e2e_s - r.ttft_s) / 11)  # TPOT uses the server count
    assert summarize([r])["counts"]["output_token_mismatch"] == 1


@HTTP_CLIENTS
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_non_streaming_and_chat(endpoint, hc):
    with threaded(FakeServerConfig(Behavior(ttft_s=0.02))) as srv:
        r = _send(
            srv.url, endpoint=endpoint, stream=False, prompt="hello there world", http_client=hc
        )
        s = _send(srv.url, endpoint=endpoint, prompt="hello there world", http_client=hc)
    assert r.ok and r.output_tokens_server == 10 and r.e2e_s >= 0.02
    assert r.ttft_s is None and r.itl_s == []  # undefined without a stream
    assert s.ok and s.output_tokens_client == 10 and s.ttft_s >= 0.02


@pytest.mark.parametrize(
    ("behavior", "kind", "text"),
    [
        (Behavior(status=500), "http_5xx", "scripted failure 500"),
        (Behavior(status=429), "http_4xx", "HTTP 429"),
        (Behavior(reset_after_tokens=3), "stream", ""),
        (Behavior(error_after_tokens=2), "server_error", "scripted error event"),
        (Behavior(hang_s=3.0), "timeout", "0.3 s"),
    ],
)
@HTTP_CLIENTS
def test_failures_become_failed_records(behavior, kind, text, hc):
    with threaded(FakeServerConfig(Behavior(), rules={1: behavior})) as srv:
        r = _send(srv.url, timeout_s=0.3, http_client=hc)
    assert r.status == "error" and r.error_kind == kind, r.error
    assert text in r.error
    assert r.end_s is not None and r.e2e_s is None
    if kind == "stream":
        assert r.output_tokens_client == 3  # what arrived is kept


def test_one_timer_for_the_pool_fails_only_the_late_requests():
    """The raw pool checks deadlines with one timer (every min(1 s, timeout / 10)), not one
    per request: the hanging request fails as a timeout, the others finish, and the timer
    stops once nothing is out."""

    async def go(url):
        client = OpenAIClient(ClientConfig(base_url=url, model="m", timeout_s=0.3))
        pool = client.pool

        async def one(i):
            rec = RequestRecord(id=f"cbb-{i}", index=i, prompt_len=2, output_len=3)
            t = time.monotonic()
            await client.send(rec, [1, 2])
            return rec, time.monotonic() - t

        out = await asyncio.gather(*(one(i) for i in range(4)))
        busy, idle = dict(pool._busy), len(pool._idle)
        await asyncio.sleep(0.1)  # the timer's next turn sees nothing out
        stopped = pool._sweeper is None
        await client.aclose()
        return out, busy, idle, stopped

    with threaded(FakeServerConfig(Behavior(), rules={2: Behavior(hang_s=3.0)})) as srv:
        out, busy, idle, stopped = asyncio.run(go(srv.url))
    kinds = [r.error_kind for r, _ in out]
    assert kinds == [None, None, "timeout", None], [r.error for r, _ in out]
    assert 0.3 <= out[2][1] < 0.3 + 0.03 + TOL  # late by at most one period (0.03 s)
    assert not busy and stopped
    assert idle == 3  # the timed-out connection is closed, never reused


@HTTP_CLIENTS
def test_refused_connection_is_a_connection_error(hc):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    r = _send(f"http://127.0.0.1:{port}", http_client=hc)
    assert r.status == "error" and r.error_kind == "connection"


def test_fake_server_speaks_what_the_official_openai_client_expects():
    with threaded(FakeServerConfig(Behavior())) as srv:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x")
        chunks = list(
            c.completions.create(model="fake-model", prompt=[1, 2], max_tokens=5, stream=True)
        )
        chat = c.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
    assert sum(len(ch.choices[0].text.split()) for ch in chunks if ch.choices) == 5
    assert (
        chat.choices[0].message.content.split() == ["tok"] * 3 and chat.usage.completion_tokens == 3
    )
