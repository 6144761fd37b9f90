"""Pooling requests in the engine (`SamplingParams.embed`, `execution/pooling.py`): LAST
pooling, L2-normalized; the same vector whether the prompt's prefill ran whole or in chunks
beside other requests' steps, whether it shared a step with generation, and under async
scheduling."""

from __future__ import annotations

import torch
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.config.policy_config import ContinuousConfig
from cbbench.reference_engine.engine.llm_engine import LLMEngine
from cbbench.reference_engine.execution.pooling import pooled
from cbbench.reference_engine.sampling_params import SamplingParams

EMBED = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, embed=True)
PROMPT = [(7 * i + 3) % 500 for i in range(40)]


def _embed(budget: int, with_generation: bool, async_scheduling: bool = False) -> list[float]:
    cfg = EngineConfig(
        model="tiny",
        scheduler="continuous",
        max_model_len=128,
        continuous=ContinuousConfig(max_num_seqs=4, max_num_batched_tokens=budget),
        async_scheduling=async_scheduling,
    )
    engine = LLMEngine.from_config(cfg)
    if with_generation:
        engine.add_request("gen", [5, 6, 7], SamplingParams(max_tokens=12, ignore_eos=True))
        engine.step()  # the generation is decoding when the pooling request arrives
    engine.add_request("emb", PROMPT, EMBED)
    vec, steps = None, 0
    while engine.has_unfinished_requests() and steps < 100:  # bounded
        for out in engine.step():
            if out.request_id == "emb" and out.embedding is not None:
                vec = out.embedding
        steps += 1
    assert vec is not None, "no embedding came back"
    return vec


def test_pooled_picks_each_embed_requests_last_row():
    class Q:
        def __init__(self, embed):
            self.params = SamplingParams(embed=embed)

    class Step:
        class batch:
            sample_rows = [(0, 2), (1, 5)]  # (chunk, row)

        sample_requests = [Q(True), Q(False)]
        request_ids = ["a", "b"]

    hidden = torch.arange(24, dtype=torch.float32).reshape(6, 4)
    out = pooled(hidden, Step)
    assert list(out) == ["a"]
    want = hidden[2] / hidden[2].norm()
    assert torch.allclose(torch.tensor(out["a"]), want)


def test_same_embedding_whole_chunked_or_beside_generation():
    whole = torch.tensor(_embed(budget=256, with_generation=False))
    chunked = torch.tensor(_embed(budget=16, with_generation=True))  # 40 tokens in 3 chunks
    assert abs(float(whole.norm()) - 1) < 1e-5
    assert torch.allclose(whole, chunked, atol=1e-4), float((whole - chunked).abs().max())
    pipelined = torch.tensor(_embed(budget=16, with_generation=True, async_scheduling=True))
    assert torch.allclose(whole, pipelined, atol=1e-4)  # async scheduling keeps it too
