"""What the HTTP layer costs: the same 64 requests through the engine offline and through
the server (64 concurrent streams, one chunk per token). Skipped by the default run.

Run: python -m pytest tests/benchmarks/test_server_bench.py --benchmark-only -s
Prints output tokens/s both ways (best of 3) and their ratio (HTTP / offline).
"""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
from cbbench.reference_engine.config import EngineConfig
from cbbench.reference_engine.engine import LLMEngine
from cbbench.reference_engine.sampling_params import SamplingParams

from tests.server_support import serve

N, PROMPT_LEN, MAX_TOKENS = 64, 32, 32
CONFIG = EngineConfig(scheduler="continuous", max_model_len=256)


def prompt(i: int) -> list[int]:
    return [3 + (i * 7 + j) % 256 for j in range(PROMPT_LEN)]


def offline_tokens_per_s() -> float:
    engine = LLMEngine.from_config(CONFIG)
    start = time.perf_counter()
    for i in range(N):
        engine.add_request(
            f"r{i}", prompt(i), SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
        )
    tokens = 0
    while engine.has_unfinished_requests():
        tokens += sum(len(o.new_token_ids) for o in engine.step())
    assert tokens == N * MAX_TOKENS
    return tokens / (time.perf_counter() - start)


def http_tokens_per_s(url: str) -> float:
    async def one(client: openai.AsyncOpenAI, i: int) -> int:
        stream = await client.completions.create(
            model="tiny",
            prompt=prompt(i),
            max_tokens=MAX_TOKENS,
            stream=True,
            extra_body={"ignore_eos": True, "return_token_ids": True},
        )
        return sum([len(c.choices[0].token_ids) async for c in stream])

    async def main() -> int:
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=N + 8), timeout=300) as h:
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", http_client=h)
            return sum(await asyncio.gather(*(one(client, i) for i in range(N))))

    start = time.perf_counter()
    tokens = asyncio.run(main())
    assert tokens == N * MAX_TOKENS
    return tokens / (time.perf_counter() - start)


def test_http_overhead(benchmark):
    offline_tokens_per_s()  # warm-up: the first forward passes are slow
    offline = max(offline_tokens_per_s() for _ in range(3))
    with serve(CONFIG) as (url, _):
        http_tokens_per_s(url)  # warm-up
        rates: list[float] = []
        benchmark.pedantic(lambda: rates.append(http_tokens_per_s(url)), rounds=3, iterations=1)
        http = max(rates)
    print(
        f"\n{N} requests x {MAX_TOKENS} tokens, tiny model, CPU: offline {offline:.0f} tok/s, "
        f"HTTP streaming {http:.0f} tok/s, ratio {http / offline:.2f}"
    )
