"""Load and lifecycle on a real in-process server: many concurrent streams, client
disconnects, stop strings."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest
from cbbench.reference_engine.config.engine_config import (
    ContinuousConfig,
    EngineConfig,
    StaticConfig,
)

from tests.server_support import scrape, serve, wait_for_metric

NUM_CLIENTS = 200
MAX_TOKENS = 4


@pytest.fixture(scope="module")
def server():
    config = EngineConfig(
        scheduler="continuous", max_model_len=128, continuous=ContinuousConfig(max_num_seqs=64)
    )
    with serve(config) as (url, stack):
        yield url, stack


def test_200_concurrent_streaming_clients_finish_and_free_the_cache(server):
    url, _ = server
    before = scrape(url)

    async def one(client: openai.AsyncOpenAI, i: int) -> tuple[int, int]:
        stream = await client.completions.create(
            model="tiny",
            prompt=[3 + (i % 200), 10, 11, 12, 13],
            max_tokens=MAX_TOKENS,
            temperature=0.7,
            seed=i,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True, "return_token_ids": True},
        )
        streamed, usage = 0, -1
        async for chunk in stream:
            if chunk.choices:
                streamed += len(chunk.choices[0].token_ids)
            if chunk.usage is not None:
                usage = chunk.usage.completion_tokens
        return streamed, usage

    async def main() -> list[tuple[int, int]]:
        limits = httpx.Limits(max_connections=NUM_CLIENTS + 10)
        async with httpx.AsyncClient(limits=limits, timeout=120) as http:
            client = openai.AsyncOpenAI(
                base_url=url + "/v1", api_key="x", http_client=http, max_retries=0
            )
            return await asyncio.wait_for(
                asyncio.gather(*(one(client, i) for i in range(NUM_CLIENTS))), timeout=120
            )

    results = asyncio.run(main())
    assert results == [(MAX_TOKENS, MAX_TOKENS)] * NUM_CLIENTS
    assert wait_for_metric(url, "vllm:kv_cache_usage_perc", 0.0) == 0.0
    after = scrape(url)
    assert after["vllm:num_requests_running"] == 0 and after["vllm:num_requests_waiting"] == 0
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert generated == NUM_CLIENTS * MAX_TOKENS
    finished = (
        after["vllm:e2e_request_latency_seconds_count"]
        - before["vllm:e2e_request_latency_seconds_count"]
    )
    assert finished == NUM_CLIENTS
    # the default CPU pool holds every slot at full length (64 x 128 tokens): nothing is ever
    # preempted, and the counter says so (a missing counter is a KeyError)
    assert after["vllm:num_preemptions_total"] == before["vllm:num_preemptions_total"] == 0


def test_client_disconnect_aborts_and_frees_kv_blocks(server):
    url, stack = server
    before = scrape(url)["vllm:generation_tokens_total"]
    body = {"prompt": "abort me", "max_tokens": 120, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        data = [ln for ln in (next(lines) for _ in range(6)) if ln.startswith("data: ")]
        assert len(data) == 3 and json.loads(data[0][6:])["choices"][0]["finish_reason"] is None
        assert scrape(url)["vllm:kv_cache_usage_perc"] > 0  # the request holds blocks
    # the connection is closed here, mid-stream
    assert wait_for_metric(url, "vllm:kv_cache_usage_perc", 0.0) == 0.0
    assert wait_for_metric(url, "vllm:num_requests_running", 0.0) == 0.0
    assert not stack.engine.engine.has_unfinished_requests()
    generated = scrape(url)["vllm:generation_tokens_total"] - before
    assert 3 <= generated < 120  # aborted long before max_tokens
    # an aborted request is not a finished one
    assert stack.engine.accepting


def test_stop_strings_end_the_request_and_cut_the_text(server):
    url, stack = server
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    prompt = [40, 41, 42, 43]
    full = client.completions.create(
        model="tiny",
        prompt=prompt,
        max_tokens=60,
        temperature=0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    text = full.choices[0].text
    assert len(text) >= 6, "the greedy continuation should contain some text"
    stop = text[3:5]
    expected = text[: text.index(stop)]
    for stream in (False, True):
        r = client.completions.create(
            model="tiny",
            prompt=prompt,
            max_tokens=60,
            temperature=0,
            stop=[stop, "\x00never"],
            stream=stream,
            extra_body={"ignore_eos": True, "return_token_ids": True},
        )
        chunks = list(r) if stream else [r]
        got = "".join(c.choices[0].text for c in chunks)
        ids = [t for c in chunks for t in c.choices[0].token_ids]
        assert got == expected
        assert chunks[-1].choices[0].finish_reason == "stop"
        # generation stopped at the token that completed the stop string
        assert ids == full.choices[0].token_ids[: len(ids)] and len(ids) < 60
        assert stop in stack.tokenizer.decode(ids)
        assert stop not in stack.tokenizer.decode(ids[:-1])
    assert wait_for_metric(url, "vllm:kv_cache_usage_perc", 0.0) == 0.0


def test_simulator_is_served_in_wall_clock_time():
    # The static batch never fills: only the drain timeout, due on the virtual clock, flushes
    # it. The server keeps the virtual clock on the wall clock, so that timeout comes.
    config = EngineConfig(
        scheduler="static",
        executor="sim",
        max_model_len=128,
        num_kv_blocks=64,
        static=StaticConfig(batch_size=4, drain_timeout_s=0.05),
    )
    with serve(config) as (url, stack):
        r = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0).completions.create(
            model="tiny",
            prompt=[5, 6, 7],
            max_tokens=5,
            extra_body={"ignore_eos": True, "return_token_ids": True},
        )
        sim = stack.engine.engine.executor
        expected = [sim.token_for(r.id, 3 + i) for i in range(5)]
        assert r.choices[0].token_ids == expected
        assert r.model_extra["cbbench"]["queue_time_s"] >= 0.05


def test_non_streaming_client_disconnect_aborts_a_waiting_request():
    # A static batch that never fills holds the request in the waiting queue until the
    # client gives up; its disconnect must take the request out of the engine.
    config = EngineConfig(
        scheduler="static",
        max_model_len=64,
        static=StaticConfig(batch_size=2, drain_timeout_s=600),
    )
    with serve(config) as (url, stack):
        body = {"prompt": "never scheduled", "max_tokens": 4}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + "/v1/completions", json=body, timeout=httpx.Timeout(30, read=0.5))
        assert wait_for_metric(url, "vllm:num_requests_waiting", 0.0) == 0.0
        assert not stack.engine.engine.has_unfinished_requests()


def test_prefix_cache_hits_are_reported_per_request_and_in_metrics():
    config = EngineConfig(scheduler="continuous", max_model_len=128, enable_prefix_caching=True)
    prompt = [3 + (i * 13) % 250 for i in range(48)]  # three full 16-token blocks
    with serve(config) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        cached = []
        for _ in range(2):
            r = client.completions.create(model="tiny", prompt=prompt, max_tokens=2)
            cached.append(r.model_extra["cbbench"]["num_cached_tokens"])
        assert cached[0] == 0 and 0 < cached[1] < len(prompt)
        m = scrape(url)
        assert m["vllm:prefix_cache_queries_total"] == 2 * len(prompt)
        assert m["vllm:prefix_cache_hits_total"] == cached[1]


def test_engine_failure_ends_streams_with_an_error_and_health_turns_503():
    # Fault injection: the real engine's step raises after a few tokens.
    config = EngineConfig(scheduler="continuous", max_model_len=64)
    with serve(config) as (url, stack):
        engine = stack.engine.engine
        real_step, calls = engine.step, []

        def failing_step():
            calls.append(1)
            if len(calls) > 3:
                raise RuntimeError("device lost")
            return real_step()

        engine.step = failing_step
        body = {"prompt": "x", "max_tokens": 30, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as r:
            events = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
        error = json.loads(events[-2][6:])["error"]
        assert "engine failed: RuntimeError: device lost" in error["message"]
        assert events[-1] == "data: [DONE]" and len(events) == 5  # 3 tokens, error, DONE
        assert httpx.get(url + "/health").status_code == 503
        r = httpx.post(url + "/v1/completions", json={"prompt": "x"}, timeout=30)
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"


def test_priority_field_orders_waiting_requests():
    # One sequence at a time: while A runs, B (priority 5) and then C (priority -5) wait;
    # C is admitted first although it arrived later.
    config = EngineConfig(
        scheduler="continuous",
        max_model_len=512,
        continuous=ContinuousConfig(max_num_seqs=1, max_num_batched_tokens=512, policy="priority"),
    )
    with serve(config) as (url, stack):
        # A is held after its first step until B and C both wait, so the order is the
        # scheduler's, not a race between A's decode and their arrival (which a busy core
        # lost once: A's 300 tokens finished before C came). Bounded: after 20 s it steps on.
        engine, sched = stack.engine.engine, stack.engine.engine.scheduler
        real_step, released, deadline = engine.step, [], time.monotonic() + 20

        def held_step():
            if not released and sched.num_running >= 1 and time.monotonic() < deadline:
                if sched.num_waiting < 2:
                    time.sleep(0.001)  # not stepping: the engine loop takes B's and C's adds
                    return []
                released.append(True)
            return real_step()

        engine.step = held_step

        async def main() -> tuple[list[str], dict[str, dict]]:
            async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x",
                                          max_retries=0) as client:  # fmt: skip
                done: list[str] = []

                async def ask(name: str, priority: int) -> dict:
                    r = await client.completions.create(
                        model="tiny",
                        prompt=[5, 6, 7],
                        max_tokens=20,
                        extra_body={"ignore_eos": True, "priority": priority},
                    )
                    done.append(name)
                    return r.model_extra["cbbench"]

                async def until(name: str, at_least: float) -> None:
                    for _ in range(2000):  # bounded: ~10 s
                        if scrape(url)[name] >= at_least:
                            return
                        await asyncio.sleep(0.005)
                    raise AssertionError(f"{name} never reached {at_least}")

                a = asyncio.ensure_future(ask("A", 0))
                await until("vllm:num_requests_running", 1)
                b = asyncio.ensure_future(ask("B", 5))
                await until("vllm:num_requests_waiting", 1)  # B waits before C is sent
                c = asyncio.ensure_future(ask("C", -5))
                info = {"A": await a, "B": await b, "C": await c}
                return done, info

        done, info = asyncio.run(main())
        assert released, "B and C never both waited while A ran"
        assert done == ["A", "C", "B"]  # one at a time: finished in the order admitted
        assert info["A"]["queue_time_s"] < info["C"]["queue_time_s"] < info["B"]["queue_time_s"]


def test_gauges_are_current_when_the_client_gets_its_last_token(server):
    # No polling: the scrape right after a finished response must already see the KV freed.
    url, _ = server
    with httpx.Client(timeout=30) as http:
        for i in range(20):
            body = {
                "prompt": [5 + i, 6, 7],
                "max_tokens": 3,
                "ignore_eos": True,
                "stream": i % 2 == 0,
            }
            assert http.post(url + "/v1/completions", json=body).status_code == 200
            m = scrape(url)
            assert m["vllm:kv_cache_usage_perc"] == 0 and m["vllm:num_requests_running"] == 0
