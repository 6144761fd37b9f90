"""Scheduler overhead per step at 16, 256 and 1024 running sequences (decode phase).

`schedule_decoding` times the decision inside a running decode (the state advances between
rounds, block boundaries spread over the steps): the figure to read for the continuous
scheduler, whose due-only path skips sequences that did not change (`continuous-full`: its
full loop, side by side).

`schedule` times the policy's decision alone (block allocation included). `step_engine`
times a whole engine iteration with `NullExecutor` (schedule + apply + outputs + stats: the
engine's own per-step Python cost, no model); `step` the same with the simulated executor,
whose cost model and pseudo tokens add their own per-sequence work. Run:
    .venv/bin/python -m pytest tests/benchmarks/test_scheduler_bench.py -o addopts="" --benchmark-only
"""

from __future__ import annotations

import pytest
from cbbench.reference_engine.config.engine_config import (
    ContinuousConfig,
    DynamicConfig,
    EngineConfig,
    StaticConfig,
)
from cbbench.reference_engine.engine.llm_engine import LLMEngine
from cbbench.reference_engine.sampling_params import SamplingParams

SIZES = (16, 256, 1024)


class NullExecutor:
    """The cheapest stand-in for a model: token 7 for every sampling chunk, 10 ms a step."""

    def __init__(self, clock: float) -> None:
        self.clock = clock

    def now(self) -> float:
        return self.clock

    def execute(self, chunks):
        self.clock += 0.01
        return [[7] if c.samples else [] for c in chunks]


def running_engine(scheduler: str, n: int, spread: int = 1) -> LLMEngine:
    """n sequences decoding (every prompt prefilled). `spread` > 1: prompts of 32 to
    31 + spread tokens, so the sequences reach their KV block boundaries at different
    steps, as in a run (equal prompts cross together: one step in block_size allocates a
    block for every sequence)."""
    cfg = EngineConfig(
        model="tiny",
        executor="sim",
        hardware="steps",
        scheduler=scheduler,
        static=StaticConfig(batch_size=n),
        dynamic=DynamicConfig(max_batch_size=n, max_queue_delay_s=0.0),
        continuous=ContinuousConfig(
            max_num_seqs=n, max_num_batched_tokens=max(2048, (32 + spread) * n)
        ),
        max_model_len=2048,
        num_kv_blocks=n * 128,
    )
    engine = LLMEngine.from_config(cfg)
    for i in range(n):
        engine.add_request(
            f"r{i}",
            [1 + i % 500] * (32 + i % spread),
            SamplingParams(max_tokens=1500, ignore_eos=True),
        )
    engine.step()  # every prompt prefilled: from here on, n decodes per step
    assert engine.get_stats().num_running == n
    return engine


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("scheduler", ["static", "dynamic", "continuous"])
def test_schedule(benchmark, scheduler, n):
    engine = running_engine(scheduler, n)
    out = benchmark(engine.scheduler.schedule, engine.now())
    assert len(out.chunks) == n and out.num_batched_tokens == n


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("scheduler", ["static", "continuous"])
def test_step(benchmark, scheduler, n):
    engine = running_engine(scheduler, n)
    outputs = benchmark.pedantic(engine.step, rounds=100, iterations=1, warmup_rounds=2)
    assert len(outputs) == n


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("scheduler", ["static", "continuous"])
def test_step_engine(benchmark, scheduler, n):
    engine = running_engine(scheduler, n)
    engine.executor = NullExecutor(engine.now())
    outputs = benchmark.pedantic(engine.step, rounds=200, iterations=1, warmup_rounds=2)
    assert len(outputs) == n and all(o.new_token_ids == [7] for o in outputs)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("scheduler", ["static", "dynamic", "continuous", "continuous-full"])
def test_schedule_decoding(benchmark, scheduler, n):
    """The decision alone, but inside a running decode: before each round (untimed) the
    last decision is computed and applied, so every sequence gains a token and block
    boundaries come as they do in a run (test_schedule repeats one frozen state). Compare
    the mean: one step in block_size allocates. `continuous-full`: the same scheduler made
    to take its full loop over every running sequence each step (what it did before the
    due-only path), side by side."""
    full = scheduler == "continuous-full"
    engine = running_engine(scheduler.removesuffix("-full"), n, spread=engine_block_size())
    if full:
        engine.scheduler._decide_due = lambda due, budget: None
    ex = NullExecutor(engine.now())
    last: list = []

    def apply_last():
        if last:
            chunks = last.pop().chunks
            engine._apply(chunks, ex.execute(chunks), ex.now())

    def decide():
        last.append(engine.scheduler.schedule(ex.now()))

    benchmark.pedantic(decide, setup=apply_last, rounds=400, iterations=1, warmup_rounds=16)
    apply_last()
    out = engine.scheduler.schedule(ex.now())
    assert len(out.chunks) == n and out.num_batched_tokens == n


def engine_block_size() -> int:
    return EngineConfig(model="tiny").block_size
