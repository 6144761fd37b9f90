"""Every endpoint end to end: `run_bench` against the reference engine (counts reconciled with
each API's usage and the streamed token ids, the engine's queue time kept, a two-turn session
resending the whole conversation), and the Locust users' blocking client against the
independent test server (the same record as the async client)."""

from __future__ import annotations

import asyncio
import io
import time

import pytest
from cbbench.harness.client.api import ClientConfig, OpenAIClient
from cbbench.harness.load.runner import BenchConfig, run_bench
from cbbench.harness.locust.sync_client import SyncOpenAIClient
from cbbench.harness.results.records import RequestRecord
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.workloads.spec import RequestSpec, Workload
from rich.console import Console

from tests.server_support import serve
from tests.test_client_apis import _log, _server


@pytest.fixture(scope="module")
def engine():
    with serve(EngineConfig(model="tiny", scheduler="continuous", max_model_len=256)) as (u, _):
        yield u


def _bench(url, tmp_path, endpoint, reqs, **kw):
    cfg = BenchConfig(
        base_url=url,
        workload=Workload("apis", 0, tuple(reqs)),
        endpoint=endpoint,
        concurrency=4,
        out_dir=tmp_path / endpoint,
        live=False,
        **kw,
    )
    return run_bench(cfg, console=Console(file=io.StringIO()))


@pytest.mark.parametrize("endpoint", ["responses", "messages"])
def test_bench_against_the_engine_reconciles_counts(engine, tmp_path, endpoint):
    res = _bench(engine, tmp_path, endpoint, [RequestSpec(i, 12, 6 + i) for i in range(6)])
    for r in res.records:
        assert r.ok, r.error
        assert r.output_tokens_client == r.output_tokens_server == r.output_len
        assert r.token_mismatch is None and r.finish_reason == "length"
        assert r.prompt_tokens_server > 0 and r.server_queue_s is not None
        # (TTFO may trail TTFT by a token of no text on this branch: h41 settles its kind)
        assert r.ttft_s > 0 and r.ttfo_s >= r.ttft_s and r.reasoning_tokens == 0
        assert len(r.itl_s) == r.output_len - 1


def test_bench_embeddings_against_the_engine(engine, tmp_path):
    res = _bench(engine, tmp_path, "embeddings", [RequestSpec(i, 10, 1) for i in range(6)],
                 embeddings_batch=3)  # fmt: skip
    for r in res.records:
        assert r.ok, r.error
        assert r.extra["inputs"] == 3 and r.extra["dims"] > 8
        assert r.prompt_tokens_server == 30 and r.e2e_s > 0
    s = res.summary
    assert s["total_input_tokens"] == 6 * 30 and s["embedding_inputs"] == 18
    assert s["embedding_input_throughput"] == pytest.approx(18 / s["duration_s"])


@pytest.mark.parametrize("endpoint", ["responses", "messages"])
def test_a_session_resends_the_whole_conversation(engine, tmp_path, endpoint):
    reqs = [RequestSpec(0, 8, 4, 0.0, session_id="s", turn=1),
            RequestSpec(1, 8, 4, None, session_id="s", turn=2)]  # fmt: skip
    res = _bench(engine, tmp_path, endpoint, reqs)
    first, second = sorted(res.records, key=lambda r: r.turn)
    assert first.ok and second.ok, (first.error, second.error)
    # turn 2's prompt = turn 1's prompt + its reply + the new message, templated
    assert second.prompt_tokens_server > first.prompt_tokens_server + 4
    assert second.history_len and second.history_len >= first.prompt_tokens_server


def _rec(i: int) -> RequestRecord:
    return RequestRecord(id=f"cbb-{i}", index=i, prompt_len=8, output_len=64)


@pytest.mark.parametrize("api", ["responses", "messages", "embeddings"])
def test_locust_client_speaks_every_endpoint(api):
    proc, url = _server(api, "--gap-ms", "2", "--first-ms", "20")
    try:
        cfg = ClientConfig(base_url=url, model="mini", endpoint=api, extensions=False)
        sync = SyncOpenAIClient(cfg, time.monotonic_ns())
        try:
            s = sync.send_sync(_rec(1), "a b c d e f g h")
        finally:
            sync.close()

        async def go() -> RequestRecord:
            client = OpenAIClient(cfg, time.monotonic_ns())
            try:
                return await client.send(_rec(2), "a b c d e f g h")
            finally:
                await client.aclose()

        a = asyncio.run(go())
    finally:
        _log(proc)
    for r in (s, a):
        assert r.ok, r.error
    for name in ("output_tokens_client", "output_tokens_server", "reasoning_tokens",
                 "prompt_tokens_server", "finish_reason"):  # fmt: skip
        assert getattr(s, name) == getattr(a, name), name
    if api != "embeddings":
        assert s.output_tokens_client == 64 and s.reasoning_tokens == 32
        assert s.ttfo_s > s.ttft_s >= 0.02


@pytest.mark.serial  # a TPOT of ~70 us graded within 15 %: a busy neighbour core moves it
@pytest.mark.parametrize("endpoint", ["responses", "messages"])
def test_bench_timed_against_the_engines_own_stamps(engine, tmp_path, endpoint):
    """`cbbench_send_times`: the engine stamps each delta's send (as the event is built) and
    the request's arrival (in the guard middleware, once the body is in). The client's
    TTFT can only be later than the engine's span; on a loaded 2-core machine it measured
    2.4-2.8 ms later, 1.7 ms on a quiet one, and once 14 ms under a parallel test run (the
    engine's stamps are not at the socket: the event loop shares the GIL with the engine's
    thread), so the check is causal (never earlier) with a loose 20 ms bound, not the 1 ms
    that the independent servers in test_client_apis.py meet with stamps at their sockets."""
    import numpy as np

    reqs = [RequestSpec(i, 16, 24) for i in range(8)]
    res = _bench(engine, tmp_path, endpoint, reqs, collect_server_times=True,
                 extra_body={"cbbench_send_times": True})  # fmt: skip
    ours, truth = [], []
    for r in res.records:
        assert r.ok, r.error
        sends = r.extra["server_send_ns"]
        assert len(sends) == r.output_len == r.output_tokens_server
        recv = r.extra["t_recv_ns"]
        truth.append(((sends[0] - recv) / 1e9, (sends[-1] - sends[0]) / (len(sends) - 1) / 1e9))
        ours.append((r.ttft_s, r.tpot_s))
    p_ours, p_theirs = np.median(ours, axis=0), np.median(truth, axis=0)
    print(endpoint, "p50 client", p_ours, "engine", p_theirs)
    assert -2e-4 < p_ours[0] - p_theirs[0] < 2e-2, (p_ours, p_theirs)
    assert abs(p_ours[1] / p_theirs[1] - 1) < 0.15, (p_ours, p_theirs)


@pytest.mark.parametrize("endpoint", ["responses", "messages"])
def test_bench_non_streaming_against_the_engine(engine, tmp_path, endpoint):
    res = _bench(engine, tmp_path, endpoint, [RequestSpec(i, 12, 5) for i in range(3)],
                 stream=False)  # fmt: skip
    for r in res.records:
        assert r.ok, r.error
        assert r.output_tokens_server == r.output_tokens_client == 5 and r.finish_reason == "length"
        assert r.ttft_s is None and r.e2e_s > 0 and r.server_queue_s is not None
