"""Speculative decoding on the real model (tiny preset, CPU): greedy output is identical with
and without speculation for every method, under preemption (a small KV pool), chunked
prefill (a small token budget) and prefix caching; on a transformers-made checkpoint too;
bad configurations fail with one clear EngineError."""

from __future__ import annotations

import random

import pytest
from cbbench.reference_engine.config.engine_config import (
    ContinuousConfig,
    EngineConfig,
    SpeculativeConfig,
)
from cbbench.reference_engine.engine.llm_engine import LLMEngine
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.sampling_params import SamplingParams
from engine_model_support import HF_TINY_SHAPE, hf_greedy, save_hf_model


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        base = [rng.randrange(512) for _ in range(rng.randint(3, 12))]
        out.append(base * (1 + i % 3))  # repeats give n-gram lookup something to find
    return out


def run(
    spec: SpeculativeConfig,
    *,
    model: str = "tiny",
    n: int = 6,
    num_kv_blocks: int | None = None,
    budget: int = 2048,
    prefix: bool = False,
    params: SamplingParams | None = None,
) -> tuple[dict[str, list[int]], LLMEngine]:
    cfg = EngineConfig(
        model=model,
        speculative=spec,
        num_kv_blocks=num_kv_blocks,
        block_size=4,
        max_model_len=128,
        enable_prefix_caching=prefix,
        continuous=ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=budget),
    )
    e = LLMEngine.from_config(cfg)
    for i, p in enumerate(_prompts(n)):
        e.add_request(
            f"r{i}",
            p,
            params or SamplingParams(max_tokens=20 + 7 * i, temperature=0, ignore_eos=True),
        )
    outs: dict[str, list[int]] = {}
    while e.has_unfinished_requests():
        for o in e.step():
            outs.setdefault(o.request_id, []).extend(o.new_token_ids)
        e.check_invariants()
    assert e.block_manager.num_free_blocks == e.block_manager.num_blocks
    return outs, e


@pytest.fixture(scope="module")
def baseline() -> dict[str, list[int]]:
    return run(SpeculativeConfig())[0]


SPECS = {
    "ngram": SpeculativeConfig("ngram", 4, ngram_min=1, ngram_max=3),
    "draft=target": SpeculativeConfig("draft", 4, model="tiny"),
    "draft k=2": SpeculativeConfig("draft", 2, model="tiny"),
}
SETUPS = {
    "roomy": {},
    "preemption": {"num_kv_blocks": 22},
    "chunked prefill": {"budget": 10},
    "prefix caching": {"prefix": True, "num_kv_blocks": 40},
}


@pytest.mark.parametrize("setup", SETUPS)
@pytest.mark.parametrize("method", SPECS)
def test_greedy_output_identical(baseline, method, setup):
    outs, e = run(SPECS[method], **SETUPS[setup])
    assert outs == baseline
    s = e.spec_stats
    assert s.num_drafts > 0 and s.num_accepted_tokens > 0
    if method.startswith("draft"):  # the target as its own draft: every draft accepted
        assert s.num_accepted_tokens == s.num_draft_tokens
    if setup == "preemption":
        assert e.scheduler.num_preemptions > 0
    metrics = [e.seqs.get(r) for r in outs]
    assert not any(metrics)  # all finished


def test_fewer_steps_with_full_acceptance(baseline):
    _, plain = run(SpeculativeConfig())
    _, spec = run(SpeculativeConfig("draft", 4, model="tiny"))
    assert spec.num_steps < plain.num_steps / 2


def test_stop_inside_accepted_drafts():
    """EOS among accepted drafts ends the request there: nothing after it is emitted."""
    p = SamplingParams(max_tokens=40, temperature=0)
    cfg = EngineConfig(model="tiny", max_model_len=128)
    e = LLMEngine.from_config(cfg)
    e.add_request("x", [1, 2, 3], p)
    toks = []
    while e.has_unfinished_requests():
        for o in e.step():
            toks += o.new_token_ids
    stop = toks[10]  # make the 11th output a stop token
    p2 = SamplingParams(max_tokens=40, temperature=0, stop_token_ids=(stop,))
    outs = {}
    for spec in (SpeculativeConfig(), SpeculativeConfig("draft", 4, model="tiny")):
        e = LLMEngine.from_config(EngineConfig(model="tiny", max_model_len=128, speculative=spec))
        e.add_request("x", [1, 2, 3], p2)
        got, reason = [], None
        while e.has_unfinished_requests():
            for o in e.step():
                got += o.new_token_ids
                reason = o.finish_reason
            e.check_invariants()
        outs[spec.method] = (got, reason)
        assert e.block_manager.num_free_blocks == e.block_manager.num_blocks
    assert outs[None] == outs["draft"]
    assert outs[None][1] == "stop" and outs[None][0][-1] == stop


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_hf_checkpoint_greedy_equals_transformers(tmp_path_factory, kind):
    """Transformers-written checkpoints: speculative greedy output (n-gram, and the folder
    as its own draft; chunked prefill with a 7-token budget) equals transformers' generate."""
    transformers = pytest.importorskip("transformers")
    cls = transformers.LlamaConfig if kind == "llama" else transformers.Qwen2Config
    path = save_hf_model(tmp_path_factory, f"spec-{kind}", cls(**HF_TINY_SHAPE))
    prompts = _prompts(3)
    expected = hf_greedy(path, prompts, 16)
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    for spec in (SpeculativeConfig("ngram", 3), SpeculativeConfig("draft", 3, model=path)):
        outs, e = run(spec, model=path, n=3, budget=7, params=params)
        assert [outs[f"r{i}"] for i in range(3)] == expected, spec.method
        assert e.spec_stats.num_draft_tokens > 0


def test_sampled_requests_draft_equal_target_accepts_all():
    """Sampled drafts from q = p (the target as its own draft): rejection sampling accepts
    every draft (up to rounding between the two forwards); seeded requests repeat."""
    params = SamplingParams(max_tokens=30, temperature=1.0, seed=3, ignore_eos=True)
    outs, e = run(SpeculativeConfig("draft", 3, model="tiny"), n=3, params=params)
    assert all(len(t) == 30 for t in outs.values())
    s = e.spec_stats
    assert s.num_draft_tokens > 0 and s.num_accepted_tokens >= 0.95 * s.num_draft_tokens
    again, _ = run(SpeculativeConfig("draft", 3, model="tiny"), n=3, params=params)
    assert again == outs  # seeded: reproducible


def test_sampled_requests_with_ngram_run():
    params = SamplingParams(max_tokens=30, temperature=0.05, seed=3, ignore_eos=True)
    outs, e = run(SpeculativeConfig("ngram", 3), n=3, params=params)
    assert all(len(t) == 30 for t in outs.values())
    assert e.spec_stats.num_draft_tokens > 0


def test_draft_kv_cache_shares_the_memory_budget():
    """The draft's KV cache has as many blocks as the target's: a memory budget buys half
    the blocks when the draft is as big as the target."""
    plain = LLMEngine.from_config(EngineConfig(model="tiny", kv_cache_memory_gb=0.01))
    spec = SpeculativeConfig("draft", 2, model="tiny")
    both = LLMEngine.from_config(
        EngineConfig(model="tiny", kv_cache_memory_gb=0.01, speculative=spec)
    )
    assert both.block_manager.num_blocks == plain.block_manager.num_blocks // 2


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(scheduler="static"), "needs the continuous scheduler"),
        (dict(scheduler="dynamic"), "needs the continuous scheduler"),
        (dict(speculative=SpeculativeConfig("draft", 4)), "needs a draft model"),
        (dict(speculative=SpeculativeConfig("lookahead", 4)), "must be one of ngram, draft"),
        (dict(speculative=SpeculativeConfig("ngram", 0)), "num_speculative_tokens must be >= 1"),
        (dict(speculative=SpeculativeConfig("ngram", 2, ngram_min=4)), "ngram_min <= ngram_max"),
    ],
)
def test_bad_config(kwargs, match):
    kwargs.setdefault("speculative", SpeculativeConfig("ngram", 2))
    with pytest.raises(EngineError, match=match):
        EngineConfig(model="tiny", **kwargs)


def test_draft_vocab_mismatch():
    cfg = EngineConfig(model="tiny", speculative=SpeculativeConfig("draft", 2, model="small"))
    with pytest.raises(EngineError, match="must share the vocabulary"):
        LLMEngine.from_config(cfg)


def test_ngram_lookahead_is_charged_exactly():
    """N-gram drafts are known when scheduling: every lookahead slot reserved (and charged
    to the token budget) gets a draft."""
    cfg = EngineConfig(
        model="tiny",
        block_size=4,
        max_model_len=128,
        speculative=SpeculativeConfig("ngram", 4),
        continuous=ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=12),
    )
    e = LLMEngine.from_config(cfg)
    seen = []
    inner = e.proposer.propose

    def propose(chunks):
        inner(chunks)
        seen.extend((c.num_lookahead, len(c.spec_token_ids)) for c in chunks if c.num_lookahead)

    e.proposer.propose = propose
    for i, p in enumerate(_prompts(4)):
        e.add_request(f"r{i}", p, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
    while e.has_unfinished_requests():
        e.step()
        e.check_invariants()
    assert seen and all(reserved == drafted for reserved, drafted in seen)
