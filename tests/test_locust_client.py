"""The Locust users' blocking client against the scripted server on loopback: the same record
as the async bench client (token counts, ITL entries, derived latencies), keep-alive reuse,
and every failure ending in a failed record, never an exception."""

import asyncio
import socket
import time

from cbbench.harness.client.api import ClientConfig, OpenAIClient
from cbbench.harness.locust.sync_client import SyncOpenAIClient
from cbbench.harness.results.records import RequestRecord
from servers.fake import Behavior, FakeServerConfig, threaded

PROMPT = [11, 12, 13, 14, 15]


def _rec(index: int = 1, output_len: int = 12) -> RequestRecord:
    return RequestRecord(id=f"cbb-{index}", index=index, prompt_len=5, output_len=output_len)


def _sync(url: str, index: int = 1, output_len: int = 12, **cfg) -> RequestRecord:
    client = SyncOpenAIClient(ClientConfig(base_url=url, model="m", **cfg), time.monotonic_ns())
    try:
        return client.send_sync(_rec(index, output_len), PROMPT)
    finally:
        client.close()


def _async(url: str, index: int = 1, output_len: int = 12) -> RequestRecord:
    async def go() -> RequestRecord:
        client = OpenAIClient(ClientConfig(base_url=url, model="m"), time.monotonic_ns())
        try:
            return await client.send(_rec(index, output_len), PROMPT)
        finally:
            await client.aclose()

    return asyncio.run(go())


def test_same_record_as_the_bench_client():
    behavior = Behavior(ttft_s=0.05, itl_s=0.01, tokens_per_chunk=3, queue_time_s=0.25)
    with threaded(FakeServerConfig(behavior)) as srv:
        sync_rec = _sync(srv.url)
        async_rec = _async(srv.url)
    for r in (sync_rec, async_rec):
        assert r.ok, r.error
    for name in (
        "output_tokens_client",
        "output_tokens_server",
        "prompt_tokens_client",
        "prompt_tokens_server",
        "finish_reason",
        "server_queue_s",
    ):
        assert getattr(sync_rec, name) == getattr(async_rec, name), name
    r = sync_rec
    assert r.output_tokens_client == 12 and r.server_queue_s == 0.25
    assert len(r.itl_s) == 11 and len(r.token_times_s) == 12
    # causal bounds: the server sends chunk k at (receipt + 0.05 + k * 0.01), k = 0..3
    assert r.ttft_s >= 0.05 and r.e2e_s >= 0.05 + 3 * 0.01
    assert abs(r.tpot_s - (r.e2e_s - r.ttft_s) / 11) < 1e-9
    assert abs(sum(r.itl_s) - (r.e2e_s - r.ttft_s)) < 1e-6
    assert r.sent_s <= r.first_token_s <= r.last_token_s <= r.end_s


def test_keep_alive_connection_is_reused():
    with threaded(FakeServerConfig(Behavior())) as srv:
        client = SyncOpenAIClient(ClientConfig(base_url=srv.url, model="m"), time.monotonic_ns())
        try:
            first = client.send_sync(_rec(1, 4), PROMPT)
            conn = client._conn
            second = client.send_sync(_rec(2, 4), PROMPT)
            assert first.ok and second.ok, (first.error, second.error)
            assert client._conn is conn and conn is not None
        finally:
            client.close()


def test_non_streaming_has_no_ttft():
    with threaded(FakeServerConfig(Behavior())) as srv:
        r = _sync(srv.url, stream=False, output_len=6)
    assert r.ok, r.error
    assert r.output_tokens_server == 6 and r.e2e_s > 0
    assert r.ttft_s is None and r.itl_s == [] and r.token_times_s == []


def test_http_error_is_a_failed_record():
    with threaded(FakeServerConfig(Behavior(), rules={3: Behavior(status=429)})) as srv:
        r = _sync(srv.url, index=3)
        after = _sync(srv.url, index=4)  # a fresh request still works
    assert not r.ok and r.error_kind == "http_4xx" and "429" in r.error
    assert after.ok


def test_connection_reset_mid_stream_is_a_stream_failure():
    with threaded(FakeServerConfig(Behavior(reset_after_tokens=3, itl_s=0.005))) as srv:
        r = _sync(srv.url)
    assert not r.ok and r.error_kind == "stream", (r.error_kind, r.error)
    assert r.output_tokens_client == 3


def test_refused_connection_is_a_connection_failure():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    r = _sync(f"http://127.0.0.1:{port}")
    assert not r.ok and r.error_kind == "connection" and r.output_tokens_client == 0


def test_timeout_is_a_timeout_failure():
    with threaded(FakeServerConfig(Behavior(hang_s=2.0))) as srv:
        r = _sync(srv.url, timeout_s=0.3)
    assert not r.ok and r.error_kind == "timeout", (r.error_kind, r.error)
