"""The reference engine's /v1/responses and /v1/messages, driven by the official clients over
real HTTP on 127.0.0.1 (`openai` for Responses, `anthropic` for Messages): streaming and not,
greedy text equal to /v1/chat/completions' for the same conversation, usage in each API's own
fields, errors in each API's own shape, the same Prometheus counters."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest
from cbbench.reference_engine.config.engine_config import EngineConfig

from tests.server_support import scrape, serve, wait_for_metric

CONVERSATION = [
    {"role": "user", "content": "Hello there"},
    {"role": "assistant", "content": "General Kenobi"},
    {"role": "user", "content": "Tell me a story"},
]
N = 10
GREEDY = {"temperature": 0, "max_tokens": N}
EXT = {"ignore_eos": True}
ANT = {"temperature": 0, **EXT}  # this anthropic SDK takes no temperature argument


@pytest.fixture(scope="module")
def server():
    with serve(EngineConfig(model="tiny", scheduler="continuous", max_model_len=256)) as (
        url,
        stack,
    ):
        yield url


def _oai(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _ant(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=60)


def _chat_text(url: str) -> str:
    r = _oai(url).chat.completions.create(
        model="tiny", messages=CONVERSATION, extra_body=EXT, **GREEDY
    )
    assert r.usage.completion_tokens == N
    return r.choices[0].message.content


def test_responses_stream_and_body_equal_chat(server):
    want = _chat_text(server)
    c = _oai(server)
    kinds, text = [], []
    with c.responses.stream(
        model="tiny", input=CONVERSATION, max_output_tokens=N, temperature=0, extra_body=EXT
    ) as stream:
        for ev in stream:
            kinds.append(ev.type)
            if ev.type == "response.output_text.delta":
                text.append(ev.delta)
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert "".join(text) == want == final.output_text
    assert final.usage.output_tokens == N and final.usage.input_tokens > 0
    assert final.usage.output_tokens_details.reasoning_tokens == 0
    assert final.status == "incomplete" and final.incomplete_details.reason == "max_output_tokens"
    body = c.responses.create(
        model="tiny", input=CONVERSATION, max_output_tokens=N, temperature=0, extra_body=EXT
    )
    assert body.output_text == want and body.usage.output_tokens == N


def test_responses_string_input_and_instructions_equal_chat(server):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    r = _oai(server).chat.completions.create(model="tiny", messages=msgs, extra_body=EXT, **GREEDY)
    body = _oai(server).responses.create(
        model="tiny", instructions="Be brief.", input="Hi", max_output_tokens=N, temperature=0,
        extra_body=EXT,
    )  # fmt: skip
    assert body.output_text == r.choices[0].message.content


def test_messages_stream_and_body_equal_chat(server):
    want = _chat_text(server)
    c = _ant(server)
    kinds = []
    with c.messages.stream(
        model="tiny", messages=CONVERSATION, max_tokens=N, extra_body=ANT
    ) as stream:
        for ev in stream:
            kinds.append(ev.type)
        text = stream.get_final_text()
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and "content_block_delta" in kinds
    assert kinds[-1] == "message_stop"
    assert text == want
    assert final.usage.output_tokens == N and final.stop_reason == "max_tokens"
    body = c.messages.create(model="tiny", messages=CONVERSATION, max_tokens=N, extra_body=ANT)
    assert body.content[0].text == want and body.usage.output_tokens == N
    assert body.usage.input_tokens == final.usage.input_tokens > 0


def test_each_api_errors_in_its_own_shape(server):
    with pytest.raises(openai.NotFoundError) as e:  # 404 model_not_found, as OpenAI answers
        _oai(server).responses.create(model="nope", input="hi", max_output_tokens=4)
    assert e.value.body["message"].startswith("model 'nope' is not served")
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        _oai(server).responses.create(
            model="tiny", input="hi", previous_response_id="resp_1", max_output_tokens=4
        )
    with pytest.raises(anthropic.BadRequestError) as e2:
        _ant(server).messages.create(
            model="tiny", messages=[{"role": "robot", "content": "x"}], max_tokens=4
        )
    err = e2.value.body
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert "role" in err["error"]["message"]
    r = httpx.post(server + "/v1/messages", json={"model": "tiny", "messages": []}, timeout=10)
    assert r.status_code == 400 and r.json()["type"] == "error"
    r = httpx.post(server + "/v1/messages", content=b"{not json", timeout=10,
                   headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_requests_of_every_api_count_in_the_same_metrics(server):
    before = scrape(server)
    gen, e2e = "vllm:generation_tokens_total", "vllm:e2e_request_latency_seconds_count"
    _oai(server).responses.create(model="tiny", input="hi", max_output_tokens=3, extra_body=EXT)
    _ant(server).messages.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3, extra_body=EXT
    )
    assert wait_for_metric(server, e2e, before[e2e] + 2) == before[e2e] + 2
    assert scrape(server)[gen] == before[gen] + 6


def test_embeddings_with_the_openai_client(server):
    import numpy as np

    c = _oai(server)
    r = c.embeddings.create(model="tiny", input=["Hello there", "Tell me a story", "Hi"])
    assert [d.index for d in r.data] == [0, 1, 2]
    vecs = np.array([d.embedding for d in r.data])  # the client asked for base64 and decoded
    assert vecs.shape[1] > 8 and np.allclose(np.linalg.norm(vecs, axis=1), 1, atol=1e-4)
    assert r.usage.prompt_tokens == r.usage.total_tokens > 3
    alone = c.embeddings.create(model="tiny", input="Tell me a story", encoding_format="float")
    assert np.allclose(alone.data[0].embedding, vecs[1], atol=1e-4)  # batched or not
    assert not np.allclose(vecs[0], vecs[1], atol=1e-3)
    ids = c.embeddings.create(model="tiny", input=[[5, 17, 99], [5, 17]], encoding_format="float")
    assert ids.usage.prompt_tokens == 5 and len(ids.data) == 2
    with pytest.raises(openai.BadRequestError, match="input"):
        c.embeddings.create(model="tiny", input=[[]])
    with pytest.raises(openai.BadRequestError, match="vocabulary"):
        c.embeddings.create(model="tiny", input=[10**9])


def test_embeddings_on_a_simulated_engine_are_a_clear_400():
    with serve(EngineConfig(model="tiny", executor="sim", max_model_len=256)) as (url, _):
        with pytest.raises(openai.BadRequestError, match="no hidden states"):
            _oai(url).embeddings.create(model="tiny", input="hello")
        text = _oai(url).responses.create(model="tiny", input="hi", max_output_tokens=3)
        assert text.usage.output_tokens == 3  # generation still works there
