"""Bad input gets a 4xx with an OpenAI-style error body, never a 5xx: fixed cases, then a
hypothesis fuzz of the request schema against a real server."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from cbbench.reference_engine.config.engine_config import EngineConfig, StaticConfig
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.openapi_strategy import body_strategy
from tests.server_support import serve

KEY = "sekrit"
AUTH = {"authorization": f"Bearer {KEY}"}
MAX_BODY = 64 * 1024


@pytest.fixture(scope="module")
def url():
    config = EngineConfig(scheduler="continuous", max_model_len=64)
    with serve(config, api_key=KEY, max_body_bytes=MAX_BODY) as (url, _):
        yield url


def post(url: str, path: str, body=None, *, content=None, headers=None) -> httpx.Response:
    h = {**AUTH, **(headers or {})}
    return httpx.post(url + path, json=body, content=content, headers=h, timeout=60)


def assert_error(r: httpx.Response, status: int, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and 0 < len(err["message"]) <= 300
    assert err["code"] is None or isinstance(err["code"], str), err  # OpenAI's shape
    if param is not None:
        assert err["param"] == param, err
    return err


@pytest.mark.parametrize(
    "body, param",
    [
        ({}, "prompt"),  # missing prompt
        ({"prompt": ""}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": 123}, "prompt"),
        ({"prompt": [1, "a"]}, "prompt.1"),
        ({"prompt": [1, 2, 512]}, "prompt"),  # outside the tiny vocabulary
        ({"prompt": "hi", "max_tokens": -1}, "max_tokens"),
        ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "hi", "max_tokens": 10**12}, "max_tokens"),
        ({"prompt": "hi", "max_tokens": "5"}, "max_tokens"),
        ({"prompt": "x" * 70}, "prompt"),  # longer than the 64-token context
        ({"prompt": "hi", "temperature": "hot"}, "temperature"),
        ({"prompt": "hi", "top_p": 0}, "top_p"),
        ({"prompt": "hi", "stream": "yes"}, "stream"),
        ({"prompt": "hi", "n": 2}, "n"),
        ({"prompt": "hi", "stop": ["x"] * 17}, "stop"),
        ({"prompt": "hi", "min_tokens": 9, "max_tokens": 2}, None),
    ],
)
def test_completion_bad_requests_are_400(url, body, param):
    err = assert_error(post(url, "/v1/completions", body), 400, param)
    assert err["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/completions", {"prompt": "hi", "model": "gpt-4"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "model": "gpt-4"}),
        ("/v1/embeddings", {"input": "hi", "model": "gpt-4"}),
        ("/tokenize", {"prompt": "hi", "model": "gpt-4"}),
    ],
)
def test_a_model_not_served_is_404_model_not_found(url, path, body):
    """OpenAI and vLLM answer 404 for a model a server does not have (clients map it to
    NotFoundError), not 400."""
    err = assert_error(post(url, path, body), 404, "model")
    assert err["code"] == "model_not_found" and "'gpt-4' is not served" in err["message"]


@pytest.mark.parametrize(
    "body",
    [
        {"messages": []},
        {"messages": "hello"},
        {"messages": [{"content": "no role"}]},
        {"messages": [{"role": "user", "content": 5}]},
        {"messages": [{"role": "user", "content": "x" * 200}]},
    ],
)
def test_chat_bad_requests_are_400(url, body):
    assert_error(post(url, "/v1/chat/completions", body), 400)


def test_invalid_json_and_non_objects_are_400(url):
    ct = {"content-type": "application/json"}
    assert (
        "invalid JSON"
        in assert_error(post(url, "/v1/completions", content=b"{bad", headers=ct), 400)["message"]
    )
    assert_error(post(url, "/v1/completions", content=b"[1, 2]", headers=ct), 400)
    assert_error(post(url, "/v1/completions", content=b"\xff\xfe{", headers=ct), 400)
    assert_error(post(url, "/v1/completions", content=b'{"prompt": "hi"}'), 400)  # no JSON type


def test_errors_never_echo_unbounded_input(url):
    err = assert_error(post(url, "/v1/completions", {"prompt": "hi", "model": "m" * 20_000}), 400)
    assert len(err["message"]) <= 300


def test_unknown_path_and_method_get_openai_bodies(url):
    err = assert_error(httpx.get(url + "/v1/nope", headers=AUTH), 404)
    assert err["message"] == "Invalid URL (GET /v1/nope)", err  # as OpenAI says it
    assert_error(httpx.get(url + "/v1/completions", headers=AUTH), 405)


def test_api_key_is_required_except_for_probes(url):
    assert_error(httpx.post(url + "/v1/completions", json={"prompt": "hi"}), 401)
    bad = {"authorization": "Bearer wrong"}
    err = assert_error(httpx.post(url + "/v1/completions", json={"prompt": "hi"}, headers=bad), 401)
    assert err["type"] == "authentication_error"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).models.list()
    assert httpx.get(url + "/health").status_code == 200
    assert httpx.get(url + "/metrics").status_code == 200
    ok = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    assert (
        ok.completions.create(model="tiny", prompt="hi", max_tokens=2).usage.completion_tokens >= 1
    )


def test_body_size_limit_is_413(url):
    big = {"prompt": "x" * (MAX_BODY + 10)}
    assert_error(post(url, "/v1/completions", big), 413)

    def chunked():  # no Content-Length: the limit holds while reading
        for _ in range(MAX_BODY // 1024 + 2):
            yield b" " * 1024

    ct = {"content-type": "application/json"}
    assert_error(post(url, "/v1/completions", content=chunked(), headers=ct), 413)


def test_full_waiting_queue_is_429():
    # A static batch of 2 that never fills (long drain timeout) holds its first request in the
    # waiting queue; with --max-waiting 1 the second is rejected.
    config = EngineConfig(
        scheduler="static",
        max_model_len=64,
        max_waiting=1,
        static=StaticConfig(batch_size=2, drain_timeout_s=60),
    )
    with serve(config) as (url, _):
        body = {"prompt": "hi", "max_tokens": 4, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as first:
            assert first.status_code == 200  # accepted, waiting for a batch
            err = assert_error(httpx.post(url + "/v1/completions", json=body, timeout=30), 429)
            assert err["code"] == "queue_full"
            with pytest.raises(openai.RateLimitError):
                openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0).completions.create(
                    model="tiny", prompt="hi", max_tokens=2
                )


# --- fuzz --------------------------------------------------------------------------------
# Text as JSON can carry it: any character, lone surrogates included (issue 20: "\ud800abc"
# was a 500).
HOSTILE_TEXT = st.text(st.characters() | st.characters(categories=["Cs"]), max_size=12)


def _any_json(max_leaves: int = 4):
    scalars = st.none() | st.booleans() | st.integers() | st.floats() | HOSTILE_TEXT
    return st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
        ),
        max_leaves=max_leaves,
    )


# Valid values per field: requests built from these must succeed (64-token context).
VALID = {
    "model": st.just("tiny"),
    "max_tokens": st.integers(1, 8),
    "min_tokens": st.integers(0, 2),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.01, 1),
    "top_k": st.sampled_from([-1, 0, 1, 5, 511]),
    "seed": st.integers(0, 2**63 - 1),
    "stop": st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=3),
    "user": st.text(max_size=8),
    "ignore_eos": st.booleans(),
    "n": st.just(1),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "priority": st.integers(-100, 100),
    "return_token_ids": st.booleans(),
}
HOSTILE = ["\ud800abc", "\udfff", "a\udbff", "\x00", "\ufeff", "[" * 50, "\u202e"]
WILD = (
    _any_json()
    | st.sampled_from([-1, 0, 2**64, -(2**63), float("nan"), float("inf"), float("-inf"), "", []])
    | st.sampled_from(HOSTILE)
    | st.lists(st.sampled_from(HOSTILE), min_size=1, max_size=2)
)
PROMPT = (
    st.text(min_size=1, max_size=30)
    | st.lists(st.integers(0, 511), min_size=1, max_size=30)
    | st.sampled_from(HOSTILE)
)
MESSAGES = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant"]) | st.sampled_from(HOSTILE)},
        optional={
            "content": st.text(max_size=12)
            | st.sampled_from(HOSTILE)
            | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": HOSTILE_TEXT}))
        },
    ),
    min_size=1,
    max_size=2,
)


def _requests(required: dict) -> st.SearchStrategy[dict]:
    """Valid requests, valid requests with one field replaced by anything, and anything."""
    valid = st.fixed_dictionaries(required, optional=VALID)
    keys = sorted({*required, *VALID})

    @st.composite
    def one_wild(draw) -> dict:
        body = draw(valid)
        body[draw(st.sampled_from(keys))] = draw(WILD)
        return body

    anything = st.fixed_dictionaries(
        {}, optional={k: v | WILD for k, v in {**required, **VALID}.items()}
    )
    return valid | one_wild() | anything


COMPLETION = _requests({"prompt": PROMPT})
CHAT = _requests({"messages": MESSAGES})


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    path_body=st.tuples(st.just("/v1/completions"), COMPLETION)
    | st.tuples(st.just("/v1/chat/completions"), CHAT)
)
def test_fuzzed_requests_never_get_5xx(url, path_body):
    path, body = path_body
    content = json.dumps(body).encode()  # NaN/Infinity included: Python's JSON allows them
    with httpx.stream(
        "POST",
        url + path,
        content=content,
        headers={**AUTH, "content-type": "application/json"},
        timeout=60,
    ) as r:
        text = r.read().decode()
    event(f"HTTP {r.status_code}")
    assert r.status_code < 500, text
    if r.status_code >= 400:
        assert_error(httpx.Response(r.status_code, content=text.encode()), r.status_code)
    elif body.get("stream") is True:
        assert text.rstrip().endswith("data: [DONE]")
    else:
        assert json.loads(text)["usage"]["completion_tokens"] >= 1


# --- fuzz from the server's own OpenAPI schema -------------------------------------------
def test_fuzz_from_the_openapi_schema_never_gets_5xx(url):
    openapi = httpx.get(url + "/openapi.json", headers=AUTH).json()
    paths = ("/v1/completions", "/v1/chat/completions")
    for p in paths:  # documents what the server does: 400 with the OpenAI error body
        assert set(openapi["paths"][p]["post"]["responses"]) == {"200", "400"}
    # Schema-valid bodies whose strings may hold any character JSON can carry.
    alphabet = st.characters() | st.characters(categories=["Cs"])
    bodies = st.one_of(*(st.tuples(st.just(p), body_strategy(openapi, p, alphabet)) for p in paths))

    @settings(max_examples=60, deadline=None)
    @given(bodies)
    def check(path_body):
        path, body = path_body
        for key in ("max_tokens", "max_completion_tokens", "min_tokens"):
            if body.get(key) is not None:
                body[key] = min(body[key], 8)  # keep generation short
        content = json.dumps(body).encode()  # ASCII escapes: lone surrogates survive
        headers = {**AUTH, "content-type": "application/json"}
        with httpx.stream("POST", url + path, content=content, headers=headers, timeout=60) as r:
            text = r.read().decode()
        event(f"HTTP {r.status_code}")
        assert r.status_code < 500, text
        if r.status_code >= 400:
            assert_error(httpx.Response(r.status_code, content=text.encode()), r.status_code)

    check()
