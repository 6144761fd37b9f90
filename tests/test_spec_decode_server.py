"""A served run with speculative decoding: a real server on 127.0.0.1 (engine in a thread,
and in its own process), the official openai client; the target as its own draft model, so
every draft is accepted. /metrics shows vLLM's spec_decode counters with accepted tokens
> 0, each response's `cbbench` block its request's draft/accepted counts, and the greedy
text equals a server without speculation."""

from __future__ import annotations

import openai
import pytest
from cbbench.reference_engine.config.engine_config import EngineConfig, SpeculativeConfig
from server_support import scrape, serve

PROMPT = [5, 17, 300, 42, 7, 99, 12, 5, 17, 300]


def _complete(url: str, stream: bool) -> tuple[list[int], dict]:
    c = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
    kw = dict(
        model="tiny",
        prompt=PROMPT,
        max_tokens=24,
        temperature=0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    if not stream:
        r = c.completions.create(**kw)
        return r.choices[0].token_ids, r.model_extra["cbbench"]
    toks: list[int] = []
    info: dict = {}
    for chunk in c.completions.create(stream=True, **kw):
        if chunk.choices:
            toks += chunk.choices[0].model_extra.get("token_ids") or []
        info = (chunk.model_extra or {}).get("cbbench") or info
    return toks, info


@pytest.fixture(scope="module")
def plain_tokens() -> list[int]:
    with serve(EngineConfig(model="tiny")) as (url, _):
        return _complete(url, stream=False)[0]


@pytest.mark.parametrize("engine_process", [False, True])
def test_served_draft_model_counts_accepted_tokens(plain_tokens, engine_process):
    cfg = EngineConfig(model="tiny", speculative=SpeculativeConfig("draft", 3, model="tiny"))
    with serve(cfg, engine_process=engine_process) as (url, _):
        toks, info = _complete(url, stream=False)
        assert toks == plain_tokens
        assert info["num_draft_tokens"] > 0
        assert info["num_accepted_tokens"] == info["num_draft_tokens"]  # draft = target
        stoks, sinfo = _complete(url, stream=True)
        assert stoks == plain_tokens
        assert sinfo["num_accepted_tokens"] == info["num_accepted_tokens"]
        m = scrape(url)
    accepted = m["vllm:spec_decode_num_accepted_tokens_total"]
    assert accepted == 2 * info["num_accepted_tokens"] > 0
    assert m["vllm:spec_decode_num_draft_tokens_total"] == accepted
    assert m["vllm:spec_decode_num_drafts_total"] >= accepted / 3
    per_pos = [
        m[f"vllm:spec_decode_num_accepted_tokens_per_pos_total{{position={i}}}"] for i in range(3)
    ]
    assert sum(per_pos) == accepted and per_pos[0] >= per_pos[1] >= per_pos[2] > 0
    assert m["vllm:generation_tokens_total"] == 2 * len(plain_tokens)
