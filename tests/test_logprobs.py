"""logprobs/top_logprobs on both endpoints in OpenAI's shapes (streaming and not), `echo` on
completions, and 400s naming unsupported combinations; through the official openai client
against the reference server (tiny model, byte tokenizer)."""

from __future__ import annotations

import math

import openai
import pytest
import torch
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.execution.sampler import token_logprobs
from server_support import serve

PROMPT = "the cat sat on"


@pytest.fixture(scope="module")
def client():
    with serve(EngineConfig(model="tiny")) as (url, _):
        yield openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)


def test_token_logprobs_rank_and_top():
    lp = torch.log_softmax(torch.tensor([[0.0, 2.0, 1.0, -1.0], [3.0, 0.0, 0.0, 0.0]]), -1)
    a, b = token_logprobs(lp, [2, 0], top_k=2)
    assert a.rank == 2 and a.logprob == pytest.approx(float(lp[0, 2]))
    assert [t for t, _ in a.top] == [1, 2] and b.rank == 1 and b.top[0][0] == 0


def _greedy(**kw):
    return {"temperature": 0, "max_tokens": 6, "extra_body": {"ignore_eos": True}, **kw}


def test_completions_logprobs_stream_and_not(client):
    r = client.completions.create(model="tiny", prompt=PROMPT, logprobs=3, **_greedy())
    lp = r.choices[0].logprobs
    n = r.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == n == 6
    for tok, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert value <= 0 and len(top) >= 3 and top[tok] == value  # the sampled one is there
        assert value == pytest.approx(max(top.values()))  # greedy: the most likely token
        assert sum(math.exp(v) for v in top.values()) <= 1 + 1e-5
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    chunks = list(
        client.completions.create(model="tiny", prompt=PROMPT, logprobs=3, stream=True, **_greedy())
    )
    streamed = [
        v
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for v in c.choices[0].logprobs.token_logprobs
    ]
    assert streamed == pytest.approx(lp.token_logprobs, abs=1e-5)


def test_chat_logprobs_stream_and_not(client):
    msgs = [{"role": "user", "content": PROMPT}]
    r = client.chat.completions.create(
        model="tiny", messages=msgs, logprobs=True, top_logprobs=2, **_greedy()
    )
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 6
    for item in content:
        assert len(item.top_logprobs) == 2 and item.logprob <= 0
        assert item.logprob == pytest.approx(item.top_logprobs[0].logprob)
        assert item.bytes == list(item.token.encode())
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=msgs, logprobs=True, stream=True, **_greedy()
        )
    )
    items = [
        i
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for i in c.choices[0].logprobs.content
    ]
    assert [i.logprob for i in items] == pytest.approx([i.logprob for i in content], abs=1e-5)
    assert all(i.top_logprobs == [] for i in items)  # top_logprobs 0: the token alone
    plain = client.chat.completions.create(model="tiny", messages=msgs, **_greedy())
    assert plain.choices[0].logprobs is None


def test_echo_starts_the_text_with_the_prompt(client):
    r = client.completions.create(model="tiny", prompt=PROMPT, echo=True, **_greedy())
    plain = client.completions.create(model="tiny", prompt=PROMPT, **_greedy())
    assert r.choices[0].text == PROMPT + plain.choices[0].text
    chunks = list(
        client.completions.create(model="tiny", prompt=PROMPT, echo=True, stream=True, **_greedy())
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda c: c.completions.create(model="tiny", prompt="x", echo=True, logprobs=1), "echo"),
        (
            lambda c: c.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "x"}], top_logprobs=2
            ),
            "top_logprobs needs logprobs",
        ),
        (lambda c: c.completions.create(model="tiny", prompt="x", logprobs=21), "logprobs"),
    ],
)
def test_unsupported_combinations_are_400s(client, call, match):
    with pytest.raises(openai.BadRequestError, match=match):
        call(client)


def test_simulator_says_it_has_no_logprobs():
    with serve(EngineConfig(model="tiny", executor="sim")) as (url, _):
        c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="real executor"):
            c.completions.create(model="tiny", prompt="x", logprobs=1, max_tokens=2)


def test_logprobs_cross_the_engine_process(client):
    want = client.completions.create(model="tiny", prompt=PROMPT, logprobs=2, **_greedy())
    with serve(EngineConfig(model="tiny"), engine_process=True) as (url, _):
        c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        got = c.completions.create(model="tiny", prompt=PROMPT, logprobs=2, **_greedy())
    assert got.choices[0].logprobs.token_logprobs == pytest.approx(
        want.choices[0].logprobs.token_logprobs, abs=1e-5
    )


def test_logprobs_equal_transformers_log_softmax(tmp_path_factory):
    """Served logprobs (sampled, temperature 1.5) are the model's own next-token log-softmax:
    checked against a transformers forward over prompt + generated tokens."""
    import transformers
    from engine_model_support import HF_TINY_SHAPE, save_hf_model

    path = save_hf_model(
        tmp_path_factory, "llama-lp", transformers.LlamaConfig(**HF_TINY_SHAPE, rope_theta=1e4)
    )
    prompt = [5, 17, 300, 42, 7]
    with serve(EngineConfig(model=path, max_model_len=64)) as (url, _):
        c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        r = c.completions.create(
            model=path,
            prompt=prompt,
            max_tokens=5,
            temperature=1.5,
            seed=3,
            logprobs=3,
            extra_body={"return_token_ids": True},
        )
    choice = r.choices[0]
    out = choice.model_extra["token_ids"]
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out])).logits[0]
    want = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)  # row j predicts out[j]
    got = choice.logprobs
    for j, tok in enumerate(out):
        assert got.token_logprobs[j] == pytest.approx(float(want[j, tok]), abs=1e-4)
        top3 = sorted(want[j].tolist(), reverse=True)[:3]
        assert sorted(got.top_logprobs[j].values(), reverse=True)[:3] == pytest.approx(
            top3, abs=1e-4
        )
