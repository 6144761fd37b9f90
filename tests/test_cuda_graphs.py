"""Decode CUDA graphs' CPU-testable core (reference_engine/execution/cuda_graphs.py): the bucket list and
bucket choice, and the padded static-buffer path, which on the CPU runs eagerly: padded decode
batches (dummy rows writing a scratch KV block, outputs dropped) give the same greedy tokens
as unpadded ones, with sync and async scheduling, and the engine's KV blocks hold the same
values. The capture itself needs CUDA: `python -m tests.benchmarks.gpu.engine_check`."""

from __future__ import annotations

import pytest
import torch
from cbbench.reference_engine.config.engine_config import ContinuousConfig, EngineConfig
from cbbench.reference_engine.config.options import build_engine_config
from cbbench.reference_engine.engine.llm_engine import LLMEngine
from cbbench.reference_engine.execution.cuda_graphs import bucket_for, capture_sizes
from cbbench.reference_engine.execution.model_runner import ModelRunner
from cbbench.reference_engine.sampling_params import SamplingParams

NUM_BLOCKS, BLOCK, MAX_LEN, MAX_SEQS = 48, 4, 64, 6


def test_capture_sizes_follow_vllm_buckets():
    assert capture_sizes(1) == [1]
    assert capture_sizes(4) == [1, 2, 4]
    assert capture_sizes(6) == [1, 2, 4, 6]
    assert capture_sizes(8) == [1, 2, 4, 8]
    assert capture_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    big = capture_sizes(256)
    assert big[:11] == capture_sizes(64)
    assert big[11:] == list(range(80, 257, 16))
    assert capture_sizes(100)[-2:] == [96, 100]  # max_num_seqs itself always has a bucket
    for m in (1, 3, 17, 63, 130):
        s = capture_sizes(m)
        assert s == sorted(set(s)) and s[-1] == m


def test_bucket_for_is_the_smallest_bucket_that_fits():
    sizes = capture_sizes(100)
    for n in range(1, 101):
        b = bucket_for(n, sizes)
        assert b is not None and b >= n
        assert all(s < n for s in sizes if s < b)  # no smaller bucket fits
    assert bucket_for(3, sizes) == 4 and bucket_for(9, sizes) == 16 and bucket_for(97, sizes) == 100
    assert bucket_for(101, sizes) is None


def _engine(padded: bool, async_scheduling: bool) -> LLMEngine:
    cfg = EngineConfig(
        model="tiny",
        num_kv_blocks=NUM_BLOCKS,
        block_size=BLOCK,
        max_model_len=MAX_LEN,
        async_scheduling=async_scheduling,
        continuous=ContinuousConfig(max_num_seqs=MAX_SEQS, max_num_batched_tokens=64),
    )
    runner = ModelRunner(
        "tiny",
        num_kv_blocks=NUM_BLOCKS,
        block_size=BLOCK,
        num_threads=1,
        max_num_seqs=MAX_SEQS,
        max_model_len=MAX_LEN,
        padded_decode=padded,
    )
    return LLMEngine(cfg, runner.model_config, runner, NUM_BLOCKS, MAX_LEN)


def _generate(engine: LLMEngine) -> dict[str, list[int]]:
    """Staggered arrivals and lengths so decode batches of 1..6 sequences occur (3 and 5 pad
    to 4 and 6), interleaved with prefill steps that run eagerly."""
    gen = torch.Generator().manual_seed(1)
    vocab = engine.model_config.vocab_size
    out: dict[str, list[int]] = {}
    pending = [(f"r{i}", 3 + 5 * i % 11, 4 + 3 * i) for i in range(7)]
    steps = 0
    while pending or engine.has_unfinished_requests():
        if pending and steps % 3 == 0:
            rid, n, max_tokens = pending.pop(0)
            prompt = torch.randint(0, vocab, (n,), generator=gen).tolist()
            params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
            engine.add_request(rid, prompt, params)
            out[rid] = []
        for o in engine.step():
            out[o.request_id].extend(o.new_token_ids)
        steps += 1
        assert steps < 500
    return out


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_padded_decode_gives_the_same_tokens_as_unpadded(async_scheduling):
    eager = _engine(padded=False, async_scheduling=async_scheduling)
    padded = _engine(padded=True, async_scheduling=async_scheduling)
    assert eager.executor.decode_graphs is None
    graphs = padded.executor.decode_graphs
    assert graphs is not None and not graphs.use_cuda_graphs and graphs.sizes == [1, 2, 4, 6]
    seen: list[tuple[int, int]] = []  # (real rows, bucket) of each padded step
    real_run = graphs.run
    graphs.run = lambda b, size: seen.append((b.input_ids.shape[0], size)) or real_run(b, size)

    want, got = _generate(eager), _generate(padded)
    assert got == want
    assert all(len(t) == 4 + 3 * int(r[1:]) for r, t in got.items())
    assert any(n < size for n, size in seen), "no decode step was actually padded"
    assert all(size == bucket_for(n, graphs.sizes) for n, size in seen)
    # the dummy rows wrote the scratch block only: the engine's blocks hold the same K/V
    kv_eager = eager.executor.kv_cache
    kv_padded = padded.executor.kv_cache
    assert kv_padded.shape[2] == NUM_BLOCKS + 1 and graphs.scratch_block == NUM_BLOCKS
    torch.testing.assert_close(kv_padded[:, :, :NUM_BLOCKS], kv_eager, rtol=1e-5, atol=1e-5)


def test_cpu_engine_builds_no_graphs_and_enforce_eager_is_an_engine_option():
    engine = LLMEngine.from_config(EngineConfig(model="tiny", num_kv_blocks=8, max_model_len=32))
    assert engine.executor.decode_graphs is None  # the CPU runs eagerly, unpadded
    assert engine.executor.kv_cache.shape[2] == 8
    assert EngineConfig().enforce_eager is False
    cfg = build_engine_config({"enforce_eager": True})
    assert cfg.enforce_eager is True


def test_gpu_check_engine_modes_run_on_the_cpu():
    """The modes check's logic (on the CPU "graphs" is the padded path, run eagerly)."""
    from tests.benchmarks.gpu.graphs_check import MODES, modes_check, summary

    r = modes_check("cpu", "tiny", num_requests=5, max_tokens=6, max_num_seqs=4,
                    max_model_len=64, num_kv_blocks=40)  # fmt: skip
    assert set(r["modes"]) == {m[0] for m in MODES}
    assert r["passed"], r["checks"]
    assert r["modes"]["graphs"]["padded_steps"] > 0 and r["modes"]["eager"]["padded_steps"] == 0
    assert all(m["identical_to_eager"] == "5/5" for m in r["modes"].values())
    assert r["modes"]["eager-async"]["step_gap_p50_ms"] is not None
    assert "graphs-async" in summary(r)
