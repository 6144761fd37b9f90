"""The OpenAI-compatible server, driven by the official `openai` client over real HTTP on
127.0.0.1, once per scheduler."""

from __future__ import annotations

import socket

import httpx
import openai
import pytest
from cbbench.reference_engine.config.engine_config import DynamicConfig, EngineConfig, StaticConfig
from cbbench.reference_engine.engine.llm_engine import LLMEngine
from cbbench.reference_engine.model.tokenizer import apply_chat_template
from cbbench.reference_engine.sampling_params import SamplingParams
from cbbench.reference_engine.server.build import build_stack
from cbbench.reference_engine.server.runner import ThreadedServer

from tests.server_support import scrape, serve

CONFIGS = {
    "static": EngineConfig(
        scheduler="static",
        max_model_len=256,
        static=StaticConfig(batch_size=2, drain_timeout_s=0.02),
    ),
    "dynamic": EngineConfig(
        scheduler="dynamic",
        max_model_len=256,
        dynamic=DynamicConfig(max_batch_size=4, max_queue_delay_s=0.005),
    ),
    "continuous": EngineConfig(scheduler="continuous", max_model_len=256),
}

PROMPT_IDS = [5, 17, 99, 260, 300, 42, 7]


@pytest.fixture(scope="module", params=list(CONFIGS))
def server(request):
    with serve(CONFIGS[request.param]) as (url, stack):
        yield request.param, url, stack


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_completion_non_streaming_with_token_id_prompt(server):
    scheduler, url, _ = server
    raw = client(url).completions.with_raw_response.create(
        model="tiny",
        prompt=PROMPT_IDS,
        max_tokens=6,
        temperature=0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    assert raw.headers["x-cbbench-scheduler"] == scheduler
    assert float(raw.headers["x-cbbench-queue-time-s"]) >= 0
    r = raw.parse()
    choice = r.choices[0]
    assert r.object == "text_completion"
    assert choice.finish_reason == "length"
    assert len(choice.token_ids) == 6 == r.usage.completion_tokens
    assert choice.prompt_token_ids == PROMPT_IDS
    assert r.usage.prompt_tokens == len(PROMPT_IDS)
    assert r.usage.total_tokens == len(PROMPT_IDS) + 6
    info = r.model_extra["cbbench"]
    assert info["scheduler"] == scheduler
    assert info["queue_time_s"] >= 0
    assert info["num_preemptions"] == 0


def test_completion_streaming_usage_equals_tokens_streamed(server):
    scheduler, url, stack = server
    chunks = list(
        client(url).completions.create(
            model="tiny",
            prompt="The quick brown fox",
            max_tokens=12,
            temperature=0.8,
            seed=3,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"return_token_ids": True, "ignore_eos": True},
        )
    )
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage.prompt_tokens == len(b"The quick brown fox")
    token_chunks = chunks[:-1]
    streamed = [t for c in token_chunks for t in c.choices[0].token_ids]
    assert len(streamed) == usage_chunk.usage.completion_tokens == 12
    assert token_chunks[0].choices[0].prompt_token_ids == stack.tokenizer.encode(
        "The quick brown fox"
    )
    assert all(c.usage is None for c in token_chunks)
    assert [c.choices[0].finish_reason for c in token_chunks] == [None] * 11 + ["length"]
    assert "".join(c.choices[0].text for c in token_chunks) == stack.tokenizer.decode(streamed)
    assert token_chunks[-1].model_extra["cbbench"]["scheduler"] == scheduler


def test_chat_streaming_and_not(server):
    scheduler, url, stack = server
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    prompt_len = len(
        stack.tokenizer.encode(apply_chat_template([(m["role"], m["content"]) for m in messages]))
    )
    c = client(url)
    full = c.chat.completions.create(
        model="tiny",
        messages=messages,
        max_tokens=5,
        temperature=0,
        extra_body={"return_token_ids": True},
    )
    assert full.object == "chat.completion"
    assert full.choices[0].message.role == "assistant"
    assert full.usage.prompt_tokens == prompt_len
    n = full.usage.completion_tokens
    assert 1 <= n <= 5 and len(full.choices[0].token_ids) == n
    assert full.choices[0].message.content == stack.tokenizer.decode(full.choices[0].token_ids)

    chunks = list(
        c.chat.completions.create(
            model="tiny",
            messages=messages,
            max_tokens=5,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"return_token_ids": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = [t for ch in chunks[:-1] for t in ch.choices[0].token_ids]
    # greedy: the stream repeats the non-streaming answer token for token
    assert streamed == full.choices[0].token_ids
    assert chunks[-1].usage.completion_tokens == len(streamed)
    assert (
        "".join(ch.choices[0].delta.content for ch in chunks[:-1])
        == full.choices[0].message.content
    )
    assert chunks[-2].model_extra["cbbench"]["scheduler"] == scheduler


def test_http_greedy_tokens_equal_offline_engine(server):
    scheduler, url, _ = server
    engine = LLMEngine.from_config(CONFIGS[scheduler])
    engine.add_request("offline", PROMPT_IDS, SamplingParams(max_tokens=20, temperature=0))
    offline: list[int] = []
    for _ in range(10_000):
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            offline.extend(out.new_token_ids)
    chunks = client(url).completions.create(
        model="tiny",
        prompt=PROMPT_IDS,
        max_tokens=20,
        temperature=0,
        stream=True,
        extra_body={"return_token_ids": True},
    )
    streamed = [t for c in chunks for t in c.choices[0].token_ids]
    assert streamed == offline and offline


def test_models_health_and_metrics(server):
    scheduler, url, _ = server
    models = client(url).models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert models.data[0].model_extra["max_model_len"] == 256
    info = models.data[0].model_extra["cbbench"]
    assert info["scheduler"] == scheduler and info["executor"] == "real"
    assert info["attention_backend"] == "torch" and info["device"] == "cpu"
    health = httpx.get(url + "/health")
    assert health.status_code == 200
    assert health.headers["x-cbbench-scheduler"] == scheduler
    m = scrape(url)
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_count",
        "vllm:inter_token_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:request_queue_time_seconds_count",
        "cbbench:batch_occupancy",
        "cbbench:kv_reserved_unused_tokens",
        f"cbbench:scheduler_info{{scheduler={scheduler}}}",
    ):
        assert name in m, name
    # the earlier tests in this module finished requests on this server
    assert m["vllm:e2e_request_latency_seconds_count"] >= 1
    assert m["vllm:generation_tokens_total"] >= m["vllm:e2e_request_latency_seconds_count"]
    assert m["vllm:kv_cache_usage_perc"] == 0.0


def test_connections_disable_nagle():
    # Without TCP_NODELAY each SSE chunk would wait for the ACK of the one before (~40 ms).
    stack = build_stack(CONFIGS["continuous"])
    threaded = ThreadedServer(stack.app, on_stop=stack.stop_soon)
    try:
        with threaded as url, httpx.Client() as http:
            assert http.get(url + "/health").status_code == 200
            (conn,) = threaded.server.server_state.connections  # the client's keep-alive one
            sock = conn.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        stack.shutdown()
