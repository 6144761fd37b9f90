"""`cbbench_send_times`'s `t_recv_ns` (the reference engine's own record of a request's
arrival) is stamped by the guard middleware once the request is complete, not at the route
after the routing and the route's own work: the engine's TTFT span starts as close to the
socket as the app can see it. Over real HTTP on 127.0.0.1: a body sent in two parts with a
pause between them is stamped after its last byte was sent and before the first token."""

from __future__ import annotations

import asyncio
import json
import socket
import time

from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.server.guard import ARRIVAL_KEY, GuardMiddleware, arrival_ns

from tests.server_support import serve


def test_the_guard_stamps_the_arrival_before_the_app_runs_once_the_body_is_in():
    seen: dict[str, int] = {}
    parts = [b'{"a": ', b"1}"]
    handed: list[int] = []

    async def receive():
        await asyncio.sleep(0.02)
        handed.append(time.monotonic_ns())
        body = parts.pop(0)
        return {"type": "http.request", "body": body, "more_body": bool(parts)}

    async def app(scope, receive, send):
        seen["called"] = time.monotonic_ns()
        await asyncio.sleep(0.02)  # the routing and the route's own work
        seen["stamp"] = arrival_ns(scope)

    async def send(message):
        pass

    scope = {"type": "http", "method": "POST", "path": "/v1/messages", "headers": []}
    asyncio.run(GuardMiddleware(app, "continuous", 1 << 20)(scope, receive, send))
    assert ARRIVAL_KEY in scope
    assert handed[-1] <= seen["stamp"] <= seen["called"]  # after the last byte, before the app


def test_t_recv_ns_is_after_the_last_body_byte_and_before_the_first_token():
    with serve(EngineConfig(model="tiny", scheduler="continuous", max_model_len=256)) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        body = json.dumps({
            "model": "tiny", "max_tokens": 4, "stream": True, "ignore_eos": True,
            "cbbench_send_times": True, "messages": [{"role": "user", "content": "hi"}],
        }).encode()  # fmt: skip
        head = (
            f"POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n"
        ).encode()
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(head + body[:10])
            time.sleep(0.3)  # the route cannot have started: the body is not complete
            t_last = time.monotonic_ns()
            s.sendall(body[10:])
            got = b""
            while b"message_stop" not in got:
                chunk = s.recv(65536)
                assert chunk, got[-200:]
                got += chunk
    events = [json.loads(line[6:]) for line in got.decode().splitlines() if line.startswith("data: ")]
    sends = [e["t_send_ns"] for e in events if "t_send_ns" in e]
    (t_recv,) = [e["cbbench"]["t_recv_ns"] for e in events if "cbbench" in e]
    assert sends  # one per delta (a delta may carry several tokens)
    assert t_last <= t_recv < sends[0]
