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
from cbbench.harness.servers.launcher import launch_reference_server
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.engine.llm_engine import LLMEngine
from cbbench.reference_engine.sampling_params import SamplingParams

N, PROMPT_LEN, MAX_TOKENS = 64, 32, 32
CONFIG = EngineConfig(scheduler="continuous", max_model_len=256)


def prompt(i: int) -> list[int]:
    return [3 + (i * 7 + j) % 256 for j in range(PROMPT_LEN)]


def offline_tokens_per_s(streams: dict[int, list[int]] | None = None) -> float:
    engine = LLMEngine.from_config(CONFIG)
    start = time.perf_counter()
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.0)
    for i in range(N):
        engine.add_request(f"r{i}", prompt(i), params)
    out: dict[int, list[int]] = {i: [] for i in range(N)}
    while engine.has_unfinished_requests():
        for o in engine.step():
            out[int(o.request_id[1:])].extend(o.new_token_ids)
    elapsed = time.perf_counter() - start
    assert sum(map(len, out.values())) == N * MAX_TOKENS
    if streams is not None:
        streams.update(out)
    return N * MAX_TOKENS / elapsed


def http_tokens_per_s(url: str, streams: dict[int, list[int]] | None = None) -> float:
    async def one(client: httpx.AsyncClient, i: int) -> list[int]:
        body = {
            "prompt": prompt(i),
            "max_tokens": MAX_TOKENS,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
            "return_token_ids": True,
        }
        ids: list[int] = []
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    ids += json.loads(line[6:])["choices"][0]["token_ids"]
        return ids

    async def main() -> list[list[int]]:
        limits = httpx.Limits(max_connections=N + 8)
        async with httpx.AsyncClient(limits=limits, timeout=300) as client:
            return await asyncio.gather(*(one(client, i) for i in range(N)))

    start = time.perf_counter()
    out = asyncio.run(main())
    elapsed = time.perf_counter() - start
    assert sum(map(len, out)) == N * MAX_TOKENS
    if streams is not None:
        streams.update(enumerate(out))
    return N * MAX_TOKENS / elapsed


def test_http_overhead(benchmark):
    offline_tokens_per_s()  # warm-up: the first forward passes are slow
    offline: list[float] = []
    http: list[float] = []
    with launch_reference_server(extra_args=["--max-model-len", "256"]) as server:
        url = server.base_url
        http_tokens_per_s(url)  # warm-up

        offline_ids: dict[int, list[int]] = {}
        http_ids: dict[int, list[int]] = {}

        def both() -> None:  # interleaved, so a busy machine skews both alike
            offline.append(offline_tokens_per_s(offline_ids))
            http.append(http_tokens_per_s(url, http_ids))

        benchmark.pedantic(both, rounds=3, iterations=1)
    # the HTTP path delivers exactly the engine's tokens: same greedy streams, id for id (the
    # server's engine is built from the same config, so the same random weights)
    assert http_ids == offline_ids
    best_offline, best_http = max(offline), max(http)
    print(
        f"\n{N} requests x {MAX_TOKENS} tokens, tiny model, CPU (best of 3, interleaved): "
        f"offline {best_offline:.0f} tok/s, HTTP streaming {best_http:.0f} tok/s, "
        f"ratio {best_http / best_offline:.2f}"
    )
