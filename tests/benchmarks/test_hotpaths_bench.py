"""KV block allocation and free: the block manager's hot paths, at 16, 256 and 1024
sequences (the scheduler-step, SSE-parsing and 1M-record summary benchmarks live in
test_scheduler_bench.py and test_client_bench.py). Run:
    .venv/bin/python -m pytest tests/benchmarks/test_hotpaths_bench.py -o addopts="" --benchmark-only
"""

from __future__ import annotations

import pytest
from cbbench.reference_engine.core.block_manager import BlockManager
from cbbench.reference_engine.core.outputs import RequestMetrics
from cbbench.reference_engine.core.sequence import Sequence
from cbbench.reference_engine.sampling_params import SamplingParams

BLOCK = 16
PROMPT = 512  # 32 blocks per sequence


def _seqs(n: int, caching_prompt: bool = False) -> list[Sequence]:
    out = []
    for i in range(n):
        ids = [7] * PROMPT if caching_prompt else [1 + (i + j) % 500 for j in range(PROMPT)]
        out.append(
            Sequence(
                f"r{i}", ids, SamplingParams(max_tokens=16), RequestMetrics(0.0), token_ids=ids
            )
        )
    return out


@pytest.mark.parametrize("n", (16, 256, 1024))
def test_allocate_and_free_prompts(benchmark, n):
    """Admit n sequences of 512 tokens (32 blocks each), then free them all."""
    bm = BlockManager(n * 40, BLOCK)
    seqs = _seqs(n)

    def cycle() -> None:
        for s in seqs:
            assert bm.allocate_slots(s, PROMPT)
        for s in seqs:
            bm.free(s)

    benchmark(cycle)
    assert bm.num_used_blocks == 0 and bm.num_free_blocks == n * 40


@pytest.mark.parametrize("n", (16, 256, 1024))
def test_decode_growth(benchmark, n):
    """One decode step's KV bookkeeping for n running sequences: each grows by one token,
    one in BLOCK steps crossing into a new block."""
    bm = BlockManager(n * 64, BLOCK)
    seqs = _seqs(n)
    for s in seqs:
        bm.allocate_slots(s, PROMPT)
    length = [PROMPT]

    def step() -> None:
        length[0] += 1
        if length[0] > PROMPT + 30 * BLOCK:  # stay inside the pool: start over
            for s in seqs:
                bm.free(s)
                bm.allocate_slots(s, PROMPT)
            length[0] = PROMPT + 1
        for s in seqs:
            bm.allocate_slots(s, length[0])

    benchmark(step)
    assert all(len(s.block_table) == -(-length[0] // BLOCK) for s in seqs)


def test_prefix_cache_hits(benchmark):
    """256 sequences sharing one 512-token prompt: hit lookup, adopt, free."""
    bm = BlockManager(4096, BLOCK, enable_prefix_caching=True)
    first, *rest = _seqs(257, caching_prompt=True)
    bm.allocate_slots(first, PROMPT)
    first.num_computed_tokens = PROMPT
    bm.cache_blocks(first)

    def cycle() -> int:
        hits = 0
        for s in rest:
            blocks = bm.get_computed_blocks(s)
            hits += len(blocks)
            assert bm.allocate_slots(s, PROMPT, blocks)
        for s in rest:
            bm.free(s)
        return hits

    hits = benchmark(cycle)
    assert hits == 256 * ((PROMPT - 1) // BLOCK)
