"""The client against servers that misbehave on purpose (tests/servers/scripted.py): a huge
event, token counts that disagree with `usage`, junk token ids, a stream that ends without
`[DONE]`. Every client transport (raw asyncio, httpx, the Locust user's blocking one) shares
one response handler, so each case runs on all three where it applies; the raw one both through
its compiled read path (harness/client/cread.py) and without it ("raw-python").
"""

import asyncio
import gc
import io
import logging
import time

import pytest
from cbbench.harness.client import response
from cbbench.harness.client.api import ClientConfig, OpenAIClient
from cbbench.harness.client.sse import SSEParser
from cbbench.harness.console.live import summary_table
from cbbench.harness.load.runner import BenchConfig, run_bench
from cbbench.harness.locust.sync_client import SyncOpenAIClient
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.results.summary import summarize
from cbbench.workloads.spec import RequestSpec, Workload
from rich.console import Console
from servers.scripted import scripted, sse, stream_response

TRANSPORTS = pytest.mark.parametrize("transport", ["raw", "raw-python", "httpx", "sync"])


def _send(url: str, transport: str, output_len: int = 8) -> RequestRecord:
    cfg = dict(base_url=url, model="m", timeout_s=30)
    rec = RequestRecord(id="cbb-1", index=1, prompt_len=3, output_len=output_len)
    if transport == "sync":
        client = SyncOpenAIClient(ClientConfig(**cfg), time.monotonic_ns())
        try:
            return client.send_sync(rec, [1, 2, 3])
        finally:
            client.close()

    async def go() -> RequestRecord:
        http = transport.removesuffix("-python")
        client = OpenAIClient(ClientConfig(**cfg, http_client=http), time.monotonic_ns())
        try:
            return await client.send(rec, [1, 2, 3])
        finally:
            await client.aclose()

    response.use_compiled_read(transport != "raw-python")
    try:
        return asyncio.run(go())
    finally:
        response.use_compiled_read(True)


def test_sse_parser_keeps_an_unfinished_event_without_copying_it():
    """Linear, not quadratic: the reads of one growing event are kept as they came (the
    same objects, never re-joined per read), and joined once when the event ends."""
    p = SSEParser()
    pieces = [b"data: " + b"x" * 4090] + [b"y" * 4096 for _ in range(2047)]
    for piece in pieces:
        assert p.feed(piece) == []
    assert len(p._parts) == len(pieces)
    assert all(a is b for a, b in zip(p._parts, pieces, strict=True))
    (event,) = p.feed(b"\n\n")
    assert len(event) == 4090 + 2047 * 4096 and event.endswith(b"y")
    assert p.pending == b""


@TRANSPORTS
def test_one_huge_event_arrives_whole(transport):
    text = "x" * (24 << 20)  # 24 MB in one `data:` line (seconds per request when quadratic)
    body = sse({"choices": [{"text": text, "token_ids": [7]}]}, {"choices": [], "usage": {}})
    with scripted(stream_response(body)) as srv:
        r = _send(srv.url, transport, output_len=1)
    assert r.ok, r.error
    assert r.output_tokens_client == 1


def _eight_tokens_usage_says(n: int, ids=None) -> bytes:
    events = [
        {"choices": [{"text": "a", "token_ids": ids if ids is not None else [100 + i]}]}
        for i in range(8)
    ]
    events.append({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": n}})
    return stream_response(sse(*events))


@TRANSPORTS
def test_usage_disagreeing_with_streamed_token_ids_marks_the_record(transport):
    with scripted(_eight_tokens_usage_says(80)) as srv:
        r = _send(srv.url, transport)
    assert r.ok, r.error
    assert r.output_tokens_client == 8 and r.output_tokens_server == 80
    assert "80" in r.token_mismatch and "8 streamed" in r.token_mismatch
    assert r.tpot_s == pytest.approx((r.e2e_s - r.ttft_s) / 7)  # the streamed count times it
    s = summarize([r])
    assert s["counts"]["token_count_mismatch"] == 1
    note = summary_table(s, "t")
    text = io.StringIO()
    Console(file=text, width=200).print(note)
    shown = " ".join(text.getvalue().split())  # the caption wraps
    assert "disagrees with the streamed token_ids" in shown
    assert "(no token_ids)" not in shown


def test_agreeing_counts_leave_no_mark():
    with scripted(_eight_tokens_usage_says(8)) as srv:
        r = _send(srv.url, "raw")
    assert r.ok and r.token_mismatch is None
    assert summarize([r])["counts"]["token_count_mismatch"] == 0


@TRANSPORTS
def test_junk_token_ids_fail_the_request(transport):
    with scripted(_eight_tokens_usage_says(8, ids=[-5, "x", None])) as srv:
        r = _send(srv.url, transport)
    assert not r.ok and r.error_kind == "protocol"
    assert "token_ids must be non-negative integers" in r.error


@pytest.mark.parametrize("http_client", ["raw", "httpx"])
def test_stream_without_done_then_close_leaves_no_unretrieved_future(http_client, caplog, tmp_path):
    """Each response is a complete chunked body without `[DONE]`, then the server closes:
    the records say so, and asyncio logs no 'Future exception was never retrieved'."""
    ev = {"choices": [{"text": "a", "token_ids": [1]}]}
    wl = Workload("t", 0, tuple(RequestSpec(i, 4, 2) for i in range(40)))
    caplog.set_level(logging.ERROR, logger="asyncio")
    with scripted(stream_response(sse(ev, ev, done=False))) as srv:
        cfg = BenchConfig(
            base_url=srv.url,
            workload=wl,
            concurrency=4,
            out_dir=tmp_path / "run",
            live=False,
            http_client=http_client,
        )
        res = run_bench(cfg, console=Console(file=io.StringIO()))
    gc.collect()
    assert res.summary["counts"]["failed"] == 40
    reasons = res.summary["errors_by_reason"]
    if http_client == "httpx":
        # httpx does not resend a request that met a kept-alive connection the server had
        # just closed (the raw transport does): such a request fails as a read error instead
        stale = {k: v for k, v in reasons.items() if k != "stream ended without [DONE]"}
        assert set(stale) <= {"ReadError: ", "RemoteProtocolError: "}, reasons
        assert reasons.get("stream ended without [DONE]", 0) > 0, reasons
    else:
        assert reasons == {"stream ended without [DONE]": 40}
    logged = [r.getMessage() for r in caplog.records]
    assert not [m for m in logged if "never retrieved" in m], logged


def test_connection_closed_before_a_response_leaves_no_unretrieved_future(caplog):
    """The deterministic core of the case above: the server closes a kept-alive connection
    just as the next request arrives on it (no response byte). The request is sent again on
    a new connection, and the first attempt's futures are all accounted for."""
    from servers.fake import Behavior, FakeServerConfig, threaded

    async def go(url):
        client = OpenAIClient(ClientConfig(base_url=url, model="m"), time.monotonic_ns())
        recs = []
        for i in range(4):
            rec = RequestRecord(id=f"cbb-{i}", index=i, prompt_len=2, output_len=3)
            recs.append(await client.send(rec, [1, 2]))
        await client.aclose()
        return recs, getattr(client.pool, "stats", None)

    caplog.set_level(logging.ERROR, logger="asyncio")
    with threaded(FakeServerConfig(Behavior(), drop_reused=2)) as srv:
        recs, stats = asyncio.run(go(srv.url))
    gc.collect()
    assert all(r.ok for r in recs), [r.error for r in recs]
    logged = [r.getMessage() for r in caplog.records]
    assert not [m for m in logged if "never retrieved" in m], logged
    assert stats.retried == 2 and stats.closed_by_server == 2
