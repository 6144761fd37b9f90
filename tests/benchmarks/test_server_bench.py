"""What the HTTP layer costs: the same 64 requests through the engine offline and through
`cbbench serve` in its own process (64 concurrent streams, one SSE chunk per token, read by
httpx here). Skipped by the default run.

Run: python -m pytest tests/benchmarks/test_server_bench.py --benchmark-only -s
Prints output tokens/s both ways (best of 3) and their ratio (HTTP / offline).
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
from cbbench.harness.launcher import launch_reference_server
from cbbench.reference_engine.config import EngineConfig
from cbbench.reference_engine.engine import LLMEngine
from cbbench.reference_engine.sampling_params import SamplingParams

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
    async def one(client: httpx.AsyncClient, i: int) -> int:
        body = {
            "prompt": prompt(i),
            "max_tokens": MAX_TOKENS,
            "ignore_eos": True,
            "stream": True,
            "return_token_ids": True,
        }
        tokens = 0
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    tokens += len(json.loads(line[6:])["choices"][0]["token_ids"])
        return tokens

    async def main() -> int:
        limits = httpx.Limits(max_connections=N + 8)
        async with httpx.AsyncClient(limits=limits, timeout=300) as client:
            return sum(await asyncio.gather(*(one(client, i) for i in range(N))))

    start = time.perf_counter()
    tokens = asyncio.run(main())
    assert tokens == N * MAX_TOKENS
    return tokens / (time.perf_counter() - start)


def test_http_overhead(benchmark):
    offline_tokens_per_s()  # warm-up: the first forward passes are slow
    offline: list[float] = []
    http: list[float] = []
    with launch_reference_server(extra_args=["--max-model-len", "256"]) as server:
        url = server.base_url
        http_tokens_per_s(url)  # warm-up

        def both() -> None:  # interleaved, so a busy machine skews both alike
            offline.append(offline_tokens_per_s())
            http.append(http_tokens_per_s(url))

        benchmark.pedantic(both, rounds=3, iterations=1)
    best_offline, best_http = max(offline), max(http)
    print(
        f"\n{N} requests x {MAX_TOKENS} tokens, tiny model, CPU (best of 3, interleaved): "
        f"offline {best_offline:.0f} tok/s, HTTP streaming {best_http:.0f} tok/s, "
        f"ratio {best_http / best_offline:.2f}"
    )
