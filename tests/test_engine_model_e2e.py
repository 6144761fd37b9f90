"""End to end: the same greedy requests through LLMEngine with the real ModelRunner give the
same tokens under static, dynamic and continuous batching (with chunked prefill, a KV pool so
small that it forces preemption, and prefix caching) and equal transformers' `generate`."""

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
from engine_model_support import HF_TINY_SHAPE, hf_greedy, save_hf_model

transformers = pytest.importorskip("transformers")

PROMPTS = [
    [5, 17, 300, 42, 7, 99, 12, 8, 1],
    [250, 3],
    [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4],
    [77, 66, 55],
    [5, 17, 300, 42, 7, 99, 12, 8, 1, 400, 401],  # shares a 9-token prefix with the first
]
MAX_TOKENS = 10
BLOCK = 4


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> str:
    cfg = transformers.LlamaConfig(**HF_TINY_SHAPE)
    return save_hf_model(tmp_path_factory, "e2e-llama", cfg)


@pytest.fixture(scope="module")
def expected(llama_dir) -> list[list[int]]:
    return hf_greedy(llama_dir, PROMPTS, MAX_TOKENS)


def _run(engine: LLMEngine, max_steps: int = 2000) -> tuple[list[list[int]], dict]:
    for i, p in enumerate(PROMPTS):
        engine.add_request(str(i), p, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0))
    out: dict[str, list[int]] = {str(i): [] for i in range(len(PROMPTS))}
    metrics = {}
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            break
        for o in engine.step():
            out[o.request_id].extend(o.new_token_ids)
            metrics[o.request_id] = o.metrics
        engine.check_invariants()
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_used_blocks == 0 or engine.config.enable_prefix_caching
    return [out[str(i)] for i in range(len(PROMPTS))], metrics


CASES = {
    "static": dict(scheduler="static", static=StaticConfig(batch_size=2, drain_timeout_s=0.0)),
    "dynamic": dict(
        scheduler="dynamic",
        dynamic=DynamicConfig(max_batch_size=3, preferred_batch_sizes=(2, 3), max_queue_delay_s=0),
    ),
    "continuous": dict(scheduler="continuous"),
    "continuous-chunked": dict(
        scheduler="continuous",
        continuous=ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=6),
    ),
    # 9 blocks of 4 hold ~1.5 of the longest sequences: decode growth preempts others
    "continuous-preempt": dict(
        scheduler="continuous",
        num_kv_blocks=9,
        continuous=ContinuousConfig(max_num_seqs=5, max_num_batched_tokens=16, watermark=0.0),
    ),
    # two at a time: the last prompt arrives at the cache after the first one filled it
    "continuous-prefix-cache": dict(
        scheduler="continuous",
        enable_prefix_caching=True,
        continuous=ContinuousConfig(max_num_seqs=2, max_num_batched_tokens=32),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_scheduler_equals_transformers(llama_dir, expected, case):
    kw = dict(CASES[case])
    kw.setdefault("num_kv_blocks", 64)
    cfg = EngineConfig(model=llama_dir, block_size=BLOCK, max_model_len=40, **kw)
    engine = LLMEngine.from_config(cfg)
    assert engine.executor.model_config.num_hidden_layers == HF_TINY_SHAPE["num_hidden_layers"]
    got, metrics = _run(engine)
    assert got == expected
    if case == "continuous-preempt":
        assert engine.scheduler.num_preemptions > 0
    if case == "continuous-prefix-cache":
        assert metrics["4"].num_cached_tokens == 2 * BLOCK  # two full blocks of the shared 9


def test_seeded_sampling_same_tokens_under_every_scheduler():
    """Sampled (not greedy) requests with a seed: identical streams whatever the policy,
    batch composition or preemption."""
    results = []
    for case in CASES:
        kw = {k: v for k, v in CASES[case].items() if k != "enable_prefix_caching"}
        kw.setdefault("num_kv_blocks", 64)
        engine = LLMEngine.from_config(
            EngineConfig(model="tiny", block_size=BLOCK, max_model_len=40, seed=5, **kw)
        )
        for i, p in enumerate(PROMPTS):
            params = SamplingParams(
                max_tokens=MAX_TOKENS, temperature=0.9, top_p=0.9, seed=100 + i, ignore_eos=True
            )
            engine.add_request(str(i), p, params)
        out: dict[str, list[int]] = {str(i): [] for i in range(len(PROMPTS))}
        while engine.has_unfinished_requests():
            for o in engine.step():
                out[o.request_id].extend(o.new_token_ids)
        results.append([out[str(i)] for i in range(len(PROMPTS))])
    assert all(r == results[0] for r in results)
    assert all(len(t) == MAX_TOKENS for t in results[0])
