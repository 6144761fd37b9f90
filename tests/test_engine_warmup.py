"""The engine's start-up warm-up (execution/warmup.py): on CUDA it runs dummy steps through the
real kernels before the first request; here its code path runs on the CPU and must leave the
engine exactly as it found it (pool, prefix cache, KV bytes, stats, expert counters), and the
outputs after it must equal a fresh engine's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from cbbench.reference_engine.config.engine_config import ContinuousConfig, EngineConfig
from cbbench.reference_engine.engine.llm_engine import LLMEngine
from cbbench.reference_engine.execution.warmup import should_warm_up, warm_up
from cbbench.reference_engine.sampling_params import SamplingParams


def _engine(model: str = "tiny", **kw) -> LLMEngine:
    cfg = EngineConfig(model=model, device="cpu", dtype="float32", num_kv_blocks=24,
                       max_model_len=128, enable_prefix_caching=True,
                       continuous=ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=64),
                       **kw)  # fmt: skip
    return LLMEngine.from_config(cfg)


def _state(engine: LLMEngine) -> dict:
    bm = engine.block_manager
    return {"free": bm.num_free_blocks, "used": bm.num_used_blocks,
            "cached": bm.num_cached_blocks, "peak": bm.peak_used, "steps": engine.num_steps,
            "stats": engine.get_stats() if hasattr(engine, "get_stats") else None}  # fmt: skip


def _generate(engine: LLMEngine) -> dict[str, list[int]]:
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    for i in range(3):
        engine.add_request(f"r{i}", [(5 * i + j) % 90 + 3 for j in range(20 + 9 * i)], params)
    out: dict[str, list[int]] = {}
    for _ in range(200):
        if not engine.has_unfinished_requests():
            break
        for o in engine.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
    return out


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_warm_up_leaves_the_engine_as_empty_as_before(kv_cache_dtype):
    engine = _engine(kv_cache_dtype=kv_cache_dtype)
    assert engine.warmup is None  # the CPU: skipped at start (no JIT)
    runner = engine.executor
    before, kv = _state(engine), runner.kv_cache.view(torch.uint8).clone()
    report = warm_up(runner, engine.max_model_len)
    # block size 16: 17 tokens from scratch, 18 over them (a block edge crossed), one decode
    assert report.steps == ["prefill 17 over 0", "prefill 18 over 17", "decode 1"]
    assert report.seconds > 0
    assert _state(engine) == before
    assert torch.equal(runner.kv_cache.view(torch.uint8), kv)  # the written blocks zeroed
    assert _generate(engine) == _generate(_engine(kv_cache_dtype=kv_cache_dtype))


def test_warm_up_restores_moe_expert_counters():
    engine = _engine("tiny-moe")
    load = engine.executor.expert_load()
    warm_up(engine.executor, engine.max_model_len)
    assert engine.executor.expert_load() == load


def test_warm_up_skips_a_pool_too_small_for_it():
    cfg = EngineConfig(model="tiny", device="cpu", dtype="float32", num_kv_blocks=4,
                       block_size=1, max_model_len=2,
                       continuous=ContinuousConfig(max_num_seqs=1, max_num_batched_tokens=2))  # fmt: skip
    engine = LLMEngine.from_config(cfg)
    assert warm_up(engine.executor, engine.max_model_len) is None


def test_warm_up_runs_on_cuda_only():
    assert should_warm_up(SimpleNamespace(device=torch.device("cuda", 0)))
    assert not should_warm_up(SimpleNamespace(device=torch.device("cpu")))
    assert not should_warm_up(SimpleNamespace())  # the simulator's executor
