"""ModelRunner step benchmarks: one decode step at batch 1 / 8 / 32 (context ~128 tokens)
on the `tiny` and `small` presets, and one 128-token prefill, fp32 on the CPU.

    .venv/bin/python -m pytest tests/benchmarks/test_model_runner_bench.py --benchmark-only
"""

from __future__ import annotations

import pytest
from cbbench.reference_engine.core.executor import ScheduledChunk
from cbbench.reference_engine.core.outputs import RequestMetrics
from cbbench.reference_engine.core.sequence import Sequence
from cbbench.reference_engine.execution.model_runner import ModelRunner
from cbbench.reference_engine.sampling_params import SamplingParams

CONTEXT = 128
BLOCK = 16
MAX_BATCH = 32
_runners: dict[str, ModelRunner] = {}


def _runner(model: str) -> ModelRunner:
    if model not in _runners:
        blocks = MAX_BATCH * (CONTEXT // BLOCK + 1)
        _runners[model] = ModelRunner(model, num_kv_blocks=blocks, block_size=BLOCK)
    return _runners[model]


def _seqs(batch: int, context: int, computed: int) -> list[Sequence]:
    per = CONTEXT // BLOCK + 1
    seqs = []
    for i in range(batch):
        prompt = [(7 * i + j) % 500 + 1 for j in range(context)]
        seq = Sequence(str(i), prompt, SamplingParams(temperature=0.0), RequestMetrics(0.0))
        seq.block_table = list(range(i * per, (i + 1) * per))
        seq.num_computed_tokens = computed
        seqs.append(seq)
    return seqs


@pytest.mark.parametrize("model", ["tiny", "small"])
@pytest.mark.parametrize("batch", [1, 8, 32])
def test_decode_step(benchmark, model, batch):
    runner = _runner(model)
    seqs = _seqs(batch, CONTEXT, CONTEXT - 1)  # the cache is garbage: speed, not values
    chunks = [ScheduledChunk(s, 1) for s in seqs]
    out = benchmark(runner.execute, chunks)
    assert len(out) == batch and all(len(t) == 1 and isinstance(t[0], int) for t in out)
    benchmark.extra_info["tokens_per_s"] = batch / benchmark.stats.stats.mean


@pytest.mark.parametrize("model", ["tiny", "small"])
def test_prefill_128(benchmark, model):
    runner = _runner(model)
    (seq,) = _seqs(1, CONTEXT, 0)
    out = benchmark(runner.execute, [ScheduledChunk(seq, CONTEXT)])
    assert len(out[0]) == 1 and isinstance(out[0][0], int)
    benchmark.extra_info["prompt_tokens_per_s"] = CONTEXT / benchmark.stats.stats.mean
