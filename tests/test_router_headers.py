"""The router passes a client's end-to-end headers to the replica it picks (the session id,
x-request-id, anthropic-version, the client's credentials when it holds no replica key) and
keeps hop-by-hop ones to itself; /v1/messages and /v1/responses are routed like the OpenAI
routes. Real servers on 127.0.0.1 (recording replicas, the reference engine), the router in
a thread, `cbbench bench` sessions and the official openai / anthropic clients."""

from __future__ import annotations

import contextlib
import http.server
import io
import json
import threading
from collections.abc import Iterator

import anthropic
import httpx
import openai
from cbbench.harness.load.runner import BenchConfig, run_bench
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.router.headers import forward_headers
from cbbench.reference_engine.router.serve import RouterOptions, RouterThread
from cbbench.reference_engine.server.runner import ThreadedServer
from cbbench.workloads.loader import build_from_spec
from fastapi import Request
from rich.console import Console

from tests.recording_server import recording_app
from tests.server_support import serve

SPEC = {  # 6 chats x 2 turns
    "prompt": {"dist": "constant", "value": 20},
    "output": {"dist": "constant", "value": 2},
    "session": {"turns": 2, "think_ms": 5, "message": 10},
}


def test_each_replica_sees_the_session_header_of_the_sessions_routed_to_it(tmp_path):
    logs: list[list[dict]] = [[], []]
    wl = build_from_spec(SPEC, "chats", "spec", seed=0, num_requests=12)
    with (
        ThreadedServer(recording_app(logs[0])) as u1,
        ThreadedServer(recording_app(logs[1])) as u2,
        RouterThread(RouterOptions([u1, u2], policy="session-affinity", port=0)) as url,
    ):
        cfg = BenchConfig(
            base_url=url, workload=wl, endpoint="chat", out_dir=tmp_path, live=False,
            concurrency=2,
        )  # fmt: skip
        res = run_bench(cfg, console=Console(file=io.StringIO()))
    assert res.summary["counts"]["completed"] == 12
    seen = [{e["headers"].get("x-session-id") for e in log} for log in logs]
    assert all(None not in s for s in seen), seen  # every request carried its session id
    assert len(seen[0] | seen[1]) == 6  # one id per chat
    assert not seen[0] & seen[1]  # a session's requests all reached one replica
    assert seen[0] and seen[1]


def test_end_to_end_headers_pass_hop_by_hop_do_not_and_the_replica_key_replaces_the_clients():
    log: list[dict] = []
    with ThreadedServer(recording_app(log)) as u1:
        opts = RouterOptions([u1], port=0, api_key="front", replica_api_key="back")
        with RouterThread(opts) as url:
            client = openai.OpenAI(base_url=url + "/v1", api_key="front", max_retries=0)
            extra = {"x-request-id": "req-7", "anthropic-version": "2023-06-01", "x-api-key": "front"}
            list(
                client.chat.completions.create(
                    model="rec", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                    stream=True, extra_headers=extra,
                )
            )  # fmt: skip
            r = httpx.post(
                url + "/v1/chat/completions",
                json={"model": "rec", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1,
                      "stream": True},
                headers={"authorization": "Bearer front", "connection": "keep-alive, x-hop", "x-hop": "1"},
                timeout=30,
            )  # fmt: skip
            assert r.status_code == 200
        with RouterThread(RouterOptions([u1], port=0)) as url:  # no key: the client's goes on
            client = openai.OpenAI(base_url=url + "/v1", api_key="client-key", max_retries=0)
            list(
                client.chat.completions.create(
                    model="rec", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                    stream=True,
                )
            )  # fmt: skip
    first, second, third = (e["headers"] for e in log)
    assert first["x-request-id"] == "req-7" and first["anthropic-version"] == "2023-06-01"
    assert first["authorization"] == "Bearer back" and first["x-api-key"] == "back"
    assert first["user-agent"].startswith("OpenAI/")  # the client's own, not the router's
    assert first["x-stainless-lang"] == "python"
    assert "x-hop" not in second and second["authorization"] == "Bearer back"
    assert "front" not in json.dumps([first, second])
    assert third["authorization"] == "Bearer client-key"


def test_forward_headers_drops_hop_by_hop_and_connection_bound_ones():
    client = [
        ("Host", "router:9000"), ("Content-Length", "12"), ("Transfer-Encoding", "chunked"),
        ("Connection", "close, X-Private"), ("X-Private", "1"), ("Keep-Alive", "5"),
        ("TE", "trailers"), ("Upgrade", "h2c"), ("Proxy-Authorization", "Basic x"),
        ("Accept-Encoding", "gzip"), ("X-Session-Id", "s1"), ("x-tag", "a"), ("x-tag", "b"),
    ]  # fmt: skip
    out = forward_headers(client, {})
    assert out == {"x-session-id": "s1", "x-tag": "a, b", "content-type": "application/json"}


def _record_messages_route(app, log: list[dict]) -> None:
    @app.post("/v1/messages")
    async def messages(request: Request) -> dict:
        log.append({"headers": dict(request.headers), "body": json.loads(await request.body())})
        return {
            "id": "msg_1", "type": "message", "role": "assistant", "model": "rec",
            "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
            "stop_sequence": None, "usage": {"input_tokens": 3, "output_tokens": 1},
        }  # fmt: skip


def test_messages_api_through_the_router_keeps_anthropic_headers():
    log: list[dict] = []
    app = recording_app(log)
    _record_messages_route(app, log)
    with ThreadedServer(app) as u1, RouterThread(RouterOptions([u1], port=0)) as url:
        client = anthropic.Anthropic(base_url=url, api_key="ak", max_retries=0)
        msg = client.messages.create(
            model="rec", max_tokens=4, messages=[{"role": "user", "content": "hi"}],
            extra_headers={"x-session-id": "s9"},
        )  # fmt: skip
        assert msg.content[0].text == "ok"
    (h,) = (e["headers"] for e in log)
    key = h.get("x-api-key") or h.get("authorization", "").removeprefix("Bearer ")
    assert key == "ak" and h["x-session-id"] == "s9"  # (anthropic 2.x sends the key as Bearer)
    assert h["anthropic-version"]  # the client's, as it sent it


def test_messages_and_responses_routed_to_reference_replicas_with_the_clients_key():
    cfg = EngineConfig(model="tiny")
    with serve(cfg, api_key="k1") as (u1, _), RouterThread(RouterOptions([u1], port=0)) as url:
        a = anthropic.Anthropic(base_url=url, api_key="k1", max_retries=0)
        msg = a.messages.create(
            model="tiny", max_tokens=3, messages=[{"role": "user", "content": "hi"}]
        )
        assert msg.usage.output_tokens == 3
        with a.messages.stream(
            model="tiny", max_tokens=3, messages=[{"role": "user", "content": "hi"}]
        ) as s:
            assert s.get_final_message().usage.output_tokens == 3
        o = openai.OpenAI(base_url=url + "/v1", api_key="k1", max_retries=0)
        r = o.responses.create(model="tiny", input="hi", max_output_tokens=3)
        assert r.usage.output_tokens == 3
        bad = anthropic.Anthropic(base_url=url, api_key="wrong", max_retries=0)
        try:
            bad.messages.create(model="tiny", max_tokens=3, messages=[{"role": "user", "content": "x"}])
        except anthropic.AuthenticationError as exc:  # the replica judged the client's key
            assert exc.status_code == 401
        else:
            raise AssertionError("a wrong key reached the replica and was accepted")


class _CutReplica(http.server.BaseHTTPRequestHandler):
    """/v1/messages and /v1/responses: a 500 HTML page, or (streamed) one event and then the
    connection closes."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _send(self, status: int, ctype: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        body = b'{"data": [{"id": "cut"}]}' if self.path == "/v1/models" else b"{}"
        self._send(200, "application/json", body if self.path != "/metrics" else b"")

    def do_POST(self) -> None:
        req = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if not req.get("stream"):
            return self._send(500, "text/html", b"<html>500</html>")
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        ev = b'event: message_start\ndata: {"type": "message_start", "message": {}}\n\n'
        self.wfile.write(b"%x\r\n%s\r\n" % (len(ev), ev))
        self.wfile.flush()
        self.close_connection = True  # cut mid-stream


@contextlib.contextmanager
def _cut_replica() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _CutReplica)
    server.daemon_threads = True
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _events(resp: httpx.Response) -> list[tuple[str | None, dict]]:
    out, name = [], None
    for line in resp.text.splitlines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: ") and line != "data: [DONE]":
            out.append((name, json.loads(line[6:])))
            name = None
    return out


def test_the_routers_own_errors_on_messages_and_responses_are_in_those_apis_shapes():
    opts = RouterOptions([], port=0, retries=0, breaker_failures=0, breaker_error_rate=0)
    with _cut_replica() as u1:
        opts.replicas = [u1]
        with RouterThread(opts) as url:
            a = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0)
            try:
                a.messages.create(model="cut", max_tokens=2, messages=[{"role": "user", "content": "x"}])
            except anthropic.InternalServerError as exc:
                assert exc.body["type"] == "error" and exc.body["error"]["type"] == "api_error"
                assert "replica r0" in exc.body["error"]["message"]
                assert exc.response.headers["x-cbbench-replica"] == "r0"
            else:
                raise AssertionError("a 500 from the replica was not an error")
            body = {"model": "cut", "max_tokens": 2, "stream": True,
                    "messages": [{"role": "user", "content": "x"}]}  # fmt: skip
            r = httpx.post(url + "/v1/messages", json=body, timeout=30)
            (name, ev) = _events(r)[-1]
            assert name == "error" and ev["type"] == "error" and "replica r0" in ev["error"]["message"]
            assert "[DONE]" not in r.text
            bad = httpx.post(url + "/v1/messages", content=b"{not json", timeout=30)
            assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
            assert bad.json()["type"] == "error"
        with RouterThread(opts) as url:  # a fresh breaker (a cut stream opened the last one)
            body = {"model": "cut", "input": "x", "stream": True}
            r = httpx.post(url + "/v1/responses", json=body, timeout=30)
            (name, ev) = _events(r)[-1]
            assert name == "error" and ev["type"] == "error" and ev["code"] == "replica_failed"


def test_prefix_hashes_of_messages_and_responses_bodies_match_chats():
    from cbbench.reference_engine.router.prefix import body_block_hashes

    system, history = "You are terse. " * 10, [{"role": "user", "content": "question " * 40}]
    chat = body_block_hashes({"messages": [{"role": "system", "content": system}, *history]})
    assert len(chat) >= 3
    assert body_block_hashes({"system": system, "messages": history, "max_tokens": 4}) == chat
    assert body_block_hashes({"input": [{"role": "system", "content": system}, *history]}) == chat
    text = "tell me " * 50
    assert body_block_hashes({"input": text}) == body_block_hashes({"prompt": text})
    longer = body_block_hashes({"input": text + "more " * 100})
    assert longer[: len(body_block_hashes({"input": text}))] == body_block_hashes({"input": text})
