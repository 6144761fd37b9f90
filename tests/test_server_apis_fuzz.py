"""Bad input to /v1/responses, /v1/messages and /v1/embeddings gets that API's 4xx error
body, never a 5xx: hypothesis fuzz of each request (valid bodies, one field made wild, and
anything), then of the server's own OpenAPI schemas, against a real server."""

from __future__ import annotations

import json

import httpx
import pytest
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.server.reasoning import ReasoningOptions
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.openapi_strategy import body_strategy
from tests.server_support import serve
from tests.test_server_errors import HOSTILE, HOSTILE_TEXT, PROMPT, VALID, WILD

KEY = "sekrit"
HEADERS = {
    "/v1/responses": {"authorization": f"Bearer {KEY}"},
    "/v1/embeddings": {"authorization": f"Bearer {KEY}"},
    "/v1/messages": {"x-api-key": KEY, "anthropic-version": "2023-06-01"},
}


@pytest.fixture(scope="module")
def url():
    cfg = EngineConfig(scheduler="continuous", max_model_len=64)
    reasoning = ReasoningOptions("qwen3", "reasoning", 0.5)  # reasoning items and blocks too
    with serve(cfg, api_key=KEY, reasoning=reasoning) as (u, _):
        yield u


def _requests(required: dict, valid: dict) -> st.SearchStrategy[dict]:
    good = st.fixed_dictionaries(required, optional=valid)
    keys = sorted({*required, *valid})

    @st.composite
    def one_wild(draw) -> dict:
        body = draw(good)
        body[draw(st.sampled_from(keys))] = draw(WILD)
        return body

    anything = st.fixed_dictionaries(
        {}, optional={k: v | WILD for k, v in {**required, **valid}.items()}
    )
    return good | one_wild() | anything


PARTS = st.lists(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["input_text", "output_text", "text"]), "text": HOSTILE_TEXT}
    ),
    max_size=2,
)
CALL_ID = st.sampled_from(["c1", "c2", ""]) | st.text(max_size=4)
INPUT_ITEMS = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "assistant", "system", "developer"]),
            "content": st.text(max_size=12) | PARTS,
        },
        optional={"type": st.just("message")},
    )
    | st.fixed_dictionaries({"type": st.just("function_call"), "call_id": CALL_ID,
                             "name": st.text(max_size=6), "arguments": HOSTILE_TEXT})
    | st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": CALL_ID,
                             "output": HOSTILE_TEXT}),
    min_size=1,
    max_size=3,
)  # fmt: skip
ANTHROPIC_MESSAGES = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant"]),  # wild roles: one_wild's messages
         "content": st.text(max_size=12) | st.sampled_from(HOSTILE)
         | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": HOSTILE_TEXT})
                    | st.fixed_dictionaries({"type": st.just("tool_use"), "id": CALL_ID,
                                             "name": st.text(max_size=6),
                                             "input": st.dictionaries(st.text(max_size=3), WILD,
                                                                      max_size=2)})
                    | st.fixed_dictionaries({"type": st.just("tool_result"),
                                             "tool_use_id": CALL_ID, "content": HOSTILE_TEXT}),
                    max_size=3)},
    ),
    min_size=1,
    max_size=2,
)  # fmt: skip
SAMPLING = {k: v for k, v in VALID.items() if k != "max_tokens"}
RESPONSES = _requests(
    {"input": st.text(min_size=1, max_size=30) | INPUT_ITEMS},
    {**SAMPLING, "max_output_tokens": st.integers(1, 8), "instructions": st.text(max_size=8),
     "previous_response_id": st.sampled_from([None, None, None, "resp_1"]), "store": st.just(False),
     "reasoning": st.fixed_dictionaries({}, optional={"effort": st.sampled_from(
         ["minimal", "low", "medium", "high"]), "summary": st.sampled_from(["auto", "concise"])})},
)  # fmt: skip
MESSAGES_REQ = _requests(
    {"messages": ANTHROPIC_MESSAGES, "max_tokens": st.integers(1, 8)},
    {**SAMPLING, "system": st.text(max_size=8),
     "stop_sequences": st.lists(st.text(max_size=3), max_size=2),
     "thinking": st.fixed_dictionaries({"type": st.sampled_from(["enabled", "disabled"])},
                                       optional={"budget_tokens": st.integers(1, 8)})},
)  # fmt: skip
EMBEDDINGS = _requests(
    {"input": PROMPT | st.lists(PROMPT, min_size=1, max_size=3)},
    {"model": st.just("tiny"), "encoding_format": st.sampled_from(["float", "base64"]),
     "dimensions": st.none() | st.integers(1, 4), "user": st.text(max_size=4)},
)  # fmt: skip


def _check_error(path: str, status: int, text: str) -> None:
    body = json.loads(text)
    if path == "/v1/messages":
        assert body["type"] == "error", text
        err = body["error"]
        assert set(err) == {"type", "message"} and err["type"].endswith("_error")
    else:
        err = body["error"]
        assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and 0 < len(err["message"]) <= 300


def _post(url: str, path: str, body) -> None:
    content = json.dumps(body).encode()  # NaN/Infinity included: Python's JSON allows them
    headers = {**HEADERS[path], "content-type": "application/json"}
    with httpx.stream("POST", url + path, content=content, headers=headers, timeout=60) as r:
        text = r.read().decode()
    event(f"{path} HTTP {r.status_code}")
    assert r.status_code < 500, text
    if r.status_code >= 400:
        _check_error(path, r.status_code, text)
        return
    stream = isinstance(body, dict) and body.get("stream") is True
    if path == "/v1/responses":
        assert ("response.completed" in text) if stream else json.loads(text)["usage"]
    elif path == "/v1/messages":
        assert ("event: message_stop" in text) if stream else json.loads(text)["usage"]
    else:
        assert json.loads(text)["data"]


@settings(
    max_examples=90, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    path_body=st.tuples(st.just("/v1/responses"), RESPONSES)
    | st.tuples(st.just("/v1/messages"), MESSAGES_REQ)
    | st.tuples(st.just("/v1/embeddings"), EMBEDDINGS)
)
def test_fuzzed_requests_never_get_5xx(url, path_body):
    _post(url, *path_body)


def test_fuzz_from_the_openapi_schema_never_gets_5xx(url):
    openapi = httpx.get(url + "/openapi.json", headers=HEADERS["/v1/responses"]).json()
    paths = tuple(HEADERS)
    for p in paths:  # documents what the server does: 400 with the API's error body
        assert set(openapi["paths"][p]["post"]["responses"]) == {"200", "400"}
    alphabet = st.characters() | st.characters(categories=["Cs"])
    bodies = st.one_of(*(st.tuples(st.just(p), body_strategy(openapi, p, alphabet)) for p in paths))

    @settings(max_examples=60, deadline=None)
    @given(bodies)
    def check(path_body):
        path, body = path_body
        for key in ("max_tokens", "max_completion_tokens", "max_output_tokens", "min_tokens"):
            if body.get(key) is not None:
                body[key] = min(body[key], 8)  # keep generation short
        _post(url, path, body)

    check()


def test_key_and_size_errors_in_each_apis_shape(url):
    r = httpx.post(url + "/v1/messages", json={"max_tokens": 1}, timeout=10)
    assert r.status_code == 401, r.text
    assert r.json() == {
        "type": "error",
        "error": {"type": "authentication_error", "message": r.json()["error"]["message"]},
    }
    r = httpx.post(url + "/v1/responses", json={"input": "x"}, timeout=10)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    big = {"messages": [{"role": "user", "content": "x" * (5 << 20)}], "max_tokens": 1}
    r = httpx.post(url + "/v1/messages", json=big, headers=HEADERS["/v1/messages"], timeout=30)
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"
