"""What a hostile client found (issue 20), each against a real server on 127.0.0.1: dropped
non-streaming requests log no traceback, lone surrogates and NaN are 400s that say why, big
bodies are parsed off the event loop, and a non-loopback bind without a key warns."""

from __future__ import annotations

import json
import logging
import socket
import time

import httpx
import openai
import pytest
from cbbench.harness.cli import main
from cbbench.reference_engine.config.engine_config import EngineConfig, StaticConfig
from cbbench.reference_engine.server.body import OFFLOAD_BYTES
from cbbench.reference_engine.server.runner import bind_warning

from tests.server_support import scrape, serve

JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def url():
    with serve(EngineConfig(scheduler="continuous", max_model_len=64)) as (url, stack):
        yield url


def post_raw(url: str, path: str, content: bytes) -> httpx.Response:
    return httpx.post(url + path, content=content, headers=JSON, timeout=60)


def error(r: httpx.Response, status: int = 400) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_dropped_non_streaming_request_logs_no_traceback():
    # A static batch of 2 that never fills holds the request in the queue, so the client is
    # certainly gone before it finishes; the server must abort it quietly.
    config = EngineConfig(
        scheduler="static", max_model_len=64, static=StaticConfig(batch_size=2, drain_timeout_s=60)
    )
    seen = _Records()
    loggers = [logging.getLogger(n) for n in ("uvicorn.error", "asyncio", "uvicorn")]
    try:
        with serve(config) as (url, _):
            for logger in loggers:  # after uvicorn's dictConfig, which replaces handlers
                logger.addHandler(seen)
            host, port = url.removeprefix("http://").split(":")
            body = json.dumps({"prompt": "hi", "max_tokens": 4}).encode()
            for _ in range(3):
                with socket.create_connection((host, int(port)), timeout=10) as s:
                    s.sendall(
                        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n"
                        b"content-type: application/json\r\n"
                        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
                    )
                    deadline = time.monotonic() + 10
                    while scrape(url).get("vllm:num_requests_waiting") != 1:
                        assert time.monotonic() < deadline, "request never queued"
                        time.sleep(0.02)
                # closed: the server sees the disconnect and aborts the request
                deadline = time.monotonic() + 10
                while scrape(url).get("vllm:num_requests_waiting") != 0:
                    assert time.monotonic() < deadline, "dropped request was not aborted"
                    time.sleep(0.02)
            assert httpx.get(url + "/health", timeout=10).status_code == 200
    finally:
        for logger in loggers:
            logger.removeHandler(seen)
    noisy = [r for r in seen.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not noisy, [r.getMessage() for r in noisy]


@pytest.mark.parametrize(
    "path, raw, param",
    [
        ("/v1/completions", rb'{"prompt": "\ud800abc"}', "prompt"),
        ("/v1/completions", rb'{"prompt": "ok", "stop": ["\udc00"]}', "stop"),
        ("/v1/completions", rb'{"prompt": "ok", "model": "\ud800"}', "model"),
        ("/v1/completions", rb'{"prompt": "ok", "user": "x\udbff"}', "user"),
        (
            "/v1/chat/completions",
            rb'{"messages": [{"role": "user", "content": "\udfff"}]}',
            "messages.0.content",
        ),
        (
            "/v1/chat/completions",
            rb'{"messages": [{"role": "\ud800", "content": "hi"}]}',
            "messages.0.role",
        ),
        (
            "/v1/chat/completions",
            rb'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]}',
            "messages.0.content",
        ),
    ],
)
def test_lone_surrogates_are_400_naming_the_field(url, path, raw, param):
    err = error(post_raw(url, path, raw))
    assert err["param"] is not None and err["param"].startswith(param), err
    # Our check names the surrogate; pydantic's own (length-bounded fields) says "unicode".
    assert "surrogate" in err["message"] or "unicode" in err["message"], err
    assert err["type"] == "invalid_request_error"


def test_paired_surrogates_are_fine(url):
    r = post_raw(url, "/v1/completions", rb'{"prompt": "\ud83d\ude00", "max_tokens": 2}')
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("field", ["temperature", "top_p"])
@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_floats_are_400_saying_so(url, field, value):
    raw = f'{{"prompt": "hi", "{field}": {value}}}'.encode()
    err = error(post_raw(url, "/v1/completions", raw))
    assert err["param"] == field
    assert "finite" in err["message"], err


def test_big_token_id_body_is_parsed_off_the_event_loop():
    config = EngineConfig(scheduler="continuous", max_model_len=64)
    with serve(config) as (url, stack):
        ids = [5] * 300_000  # ~2 MB of JSON
        raw = json.dumps({"prompt": ids, "max_tokens": 2}).encode()
        assert len(raw) > OFFLOAD_BYTES
        err = error(post_raw(url, "/v1/completions", raw))
        assert err["code"] == "context_length_exceeded" and "300000 tokens" in err["message"]
        assert stack.body_parser.offloaded == 1  # parsed in the parser's worker process
        # Invalid big bodies are judged there too, and small ones stay in-process.
        bad = json.dumps({"prompt": [*ids[:30_000], "x"]}).encode()
        assert error(post_raw(url, "/v1/completions", bad))["param"] == "prompt.30000"
        big_text = json.dumps({"prompt": "ab" * 100_000, "max_tokens": 2}).encode()
        assert error(post_raw(url, "/v1/completions", big_text))["code"] == (
            "context_length_exceeded"
        )
        assert stack.body_parser.offloaded == 3
        ok = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        assert ok.completions.create(model="tiny", prompt="hi", max_tokens=2).usage
        chat_big = {"messages": [{"role": "user", "content": "y" * 100_000}], "max_tokens": 2}
        r = httpx.post(url + "/v1/chat/completions", json=chat_big, timeout=60)
        assert error(r)["code"] == "context_length_exceeded"
        assert stack.body_parser.offloaded == 4
    assert stack.body_parser.closed


@pytest.mark.parametrize(
    "host, api_key, warns",
    [
        ("0.0.0.0", None, True),
        ("::", None, True),
        ("192.168.7.7", None, True),
        ("example.internal", None, True),
        ("0.0.0.0", "k", False),
        ("127.0.0.1", None, False),
        ("127.8.8.8", None, False),
        ("::1", None, False),
        ("localhost", None, False),
    ],
)
def test_bind_warning(host, api_key, warns):
    text = bind_warning(host, api_key)
    assert (text is not None) == warns
    if warns:
        assert host in text and "--api-key" in text


def test_serve_warns_before_binding_all_interfaces_without_a_key(capsys):
    # --max-waiting 0 is rejected before anything is bound: no socket on 0.0.0.0 in tests.
    assert main(["serve", "--host", "0.0.0.0", "--max-waiting", "0"]) == 2
    err = capsys.readouterr().err
    assert "warning" in err and "0.0.0.0" in err and "--api-key" in err
    assert main(["serve", "--host", "0.0.0.0", "--api-key", "k", "--max-waiting", "0"]) == 2
    assert "warning" not in capsys.readouterr().err
