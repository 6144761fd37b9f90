"""The load generator's own speed (pytest-benchmark; skipped by the default run).

Run: python -m pytest tests/benchmarks/test_client_bench.py --benchmark-only -s
Each ceiling case prints requests/s, tokens/s, client CPU and the timing error (client
receive time - the server's send time of each chunk, one monotonic clock) against the
zero-delay fake server in its own processes (2, SO_REUSEPORT).
"""

from __future__ import annotations

import itertools
import random

import pytest
from cbbench.harness.cli.selftest import ServerProcess
from cbbench.harness.client.sse import SSEParser
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.results.summary import summarize
from cbbench.harness.servers.fake_server import Behavior, FakeServerConfig
from cbbench.harness.studies.selftest import measure


@pytest.fixture(scope="module")
def server():
    with ServerProcess(FakeServerConfig(Behavior(queue_time_s=None)), procs=2) as srv:
        yield srv


@pytest.mark.parametrize(
    ("streams", "workers", "http_client"),
    [
        (1, 1, "raw"),
        (64, 1, "raw"),
        (256, 1, "raw"),
        (64, 2, "raw"),
        (256, 2, "raw"),
        (64, 1, "httpx"),
    ],
)
def test_client_ceiling(benchmark, server, streams, workers, http_client):
    m = benchmark.pedantic(
        measure,
        args=(server.url, streams, workers, 64, 4000, 5.0, http_client),
        rounds=1,
        iterations=1,
    )
    benchmark.extra_info.update(m)
    print(
        f"\n{http_client} streams={streams} workers={workers}: {m['requests_per_s']:.0f} req/s, "
        f"{m['tokens_per_s']:.0f} tok/s ({m['tokens_per_s_per_worker']:.0f} per worker), "
        f"client CPU {m['client_cpu_mean']:.0%} per worker, "
        f"{m['tokens_per_client_cpu_s']:.0f} tok per client CPU-s, "
        f"timing error p50 {m['timing_error_ms_p50']:.3f} ms p99 {m['timing_error_ms_p99']:.3f} ms"
    )
    assert m["failed"] == 0 and m["requests"] > 0


@pytest.fixture(scope="module")
def paced_server():
    with ServerProcess(FakeServerConfig(Behavior(itl_s=0.02, queue_time_s=None)), procs=2) as srv:
        yield srv


@pytest.mark.parametrize(("streams", "workers"), [(64, 1), (256, 1), (256, 2)])
def test_client_timing_error_paced(benchmark, paced_server, streams, workers):
    """20 ms between tokens: 50 tok/s per stream, a load the client carries."""
    m = benchmark.pedantic(
        measure, args=(paced_server.url, streams, workers, 64, 4000, 5.0), rounds=1, iterations=1
    )
    benchmark.extra_info.update(m)
    print(
        f"\npaced 20 ms streams={streams} workers={workers}: {m['tokens_per_s']:.0f} tok/s, "
        f"client CPU {m['client_cpu_mean']:.0%} per worker, timing error p50 "
        f"{m['timing_error_ms_p50']:.3f} ms p99 {m['timing_error_ms_p99']:.3f} ms"
    )
    assert m["failed"] == 0 and m["requests"] > 0


@pytest.mark.parametrize(("streams", "workers"), [(256, 1), (1024, 2)])
def test_timing_error_vs_server_log_kernel_and_user(benchmark, paced_server, streams, workers):
    """The targets of docs/timing.md, side by side: TTFT and ITL error vs the server's log,
    first requests included, with kernel and with user-space arrival stamps."""
    rows = {}

    def both() -> dict:
        for kernel in (True, False):
            args = (paced_server.url, streams, workers, 64, 4 * streams, 5.0)
            rows["kernel" if kernel else "user"] = measure(*args, kernel_timestamps=kernel)
        return rows

    benchmark.pedantic(both, rounds=1, iterations=1)
    for stamp, m in rows.items():
        benchmark.extra_info[stamp] = m
        print(
            f"\n{streams} streams, {workers} worker(s), {m['timestamp_source']} stamps: TTFT err "
            f"p50 {m['ttft_error_ms_p50']:.3f} p99 {m['ttft_error_ms_p99']:.3f} ms, ITL err p50 "
            f"{m['itl_error_ms_p50']:.3f} p99 {m['itl_error_ms_p99']:.3f} ms, client-bound "
            f"{m['client_bound']}"
        )
        assert m["failed"] == 0 and m["requests"] > 0


def _sse_stream(n_events: int) -> list[bytes]:
    event = b'data: {"id":"x","object":"text_completion","choices":[{"index":0,"text":" tok","token_ids":[17]}]}\n\n'
    blob = event * n_events
    rng = random.Random(0)
    cuts = sorted(rng.sample(range(1, len(blob)), n_events // 4))
    return [blob[a:b] for a, b in itertools.pairwise([0, *cuts, len(blob)])]


def test_sse_parse_100k_events(benchmark):
    reads = _sse_stream(100_000)

    def parse() -> int:
        p = SSEParser()
        return sum(len(p.feed(r)) for r in reads)

    assert benchmark(parse) == 100_000


def test_summarize_1m_records(benchmark):
    rng = random.Random(0)
    recs = []
    for i in range(1_000_000):
        ttft = rng.random() * 0.2
        r = RequestRecord(
            str(i), i, 100, 8, sent_s=i * 1e-3, ttft_s=ttft, tpot_s=0.01, e2e_s=ttft + 0.07
        )
        r.itl_s = [0.01] * 7
        r.output_tokens_client = 8
        r.end_s = r.sent_s + r.e2e_s
        recs.append(r)
    s = benchmark.pedantic(summarize, args=(recs, None, {"ttft": 0.1}), rounds=1, iterations=1)
    assert s["counts"]["completed"] == 1_000_000 and s["itl_s"]["count"] == 7_000_000


def _chunked_response(tokens: int) -> bytes:
    """A zero-delay server's whole streamed response, as one read brings it."""
    events = [
        b'data: {"id":"x","object":"text_completion","model":"m","choices":[{"index":0,'
        b'"finish_reason":null,"text":" tok","token_ids":[17]}]}\n\n'
    ] * tokens
    events.append(
        b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":16,"completion_tokens":%d}}\n\n'
        % tokens
    )
    events.append(b"data: [DONE]\n\n")
    body = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"
    return b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + body


@pytest.mark.parametrize("tokens", [16, 256])
def test_one_streamed_response(benchmark, tokens):
    """A request's response handling in the raw client, one read: head, chunked framing, SSE,
    JSON, token counting and the record's latencies (the per-request cost the client ceiling
    of docs/timing.md pays besides the socket calls)."""
    import asyncio

    from cbbench.harness.client import h1conn, response
    raw = _chunked_response(tokens)
    loop = asyncio.new_event_loop()

    class Conn(h1conn.Conn):
        def write(self, data: bytes) -> None: ...

        def abort(self) -> None: ...

    conn = Conn(h1conn.PoolStats())

    def one() -> RequestRecord:
        rec = RequestRecord("cbb-1", 1, 16, tokens)
        resp = response.Response(rec, True, False)
        conn._reset(resp, loop)
        resp.sent(1)
        conn.feed(raw, 2)
        resp.end(3)
        response.finish(rec, resp, 0, 4)
        return rec

    rec = benchmark(one)
    loop.close()
    assert rec.ok and rec.output_tokens_client == tokens == len(rec.token_times_s)


@pytest.mark.parametrize("batch", [1, 64])
def test_prompt_ids(benchmark, batch):
    """16-token prompts, one at a time (a session turn, a request built late) or as the
    look-ahead draws them (64 a batch); per call of `batch` requests."""
    from cbbench.workloads.tokens import PromptTokenIds

    ids = PromptTokenIds(0)
    reqs = [(i, 16, ()) for i in range(batch)]
    out = benchmark(ids.many if batch > 1 else lambda r: [ids(*r[0])], reqs)
    assert len(out) == batch and all(len(x) == 16 for x in out)
