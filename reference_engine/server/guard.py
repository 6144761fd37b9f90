"""ASGI middleware in front of every route: body size limit (413), API key (401) and the
`x-cbbench-scheduler` header on every response. It also stamps the request's arrival
(`arrival_ns`: `time.monotonic_ns()` once the guard has the whole body, before the routing
and the route's own work) for the timing check (`cbbench_send_times`'s `t_recv_ns`).

A pure ASGI wrapper (not BaseHTTPMiddleware) so that streaming responses pass through
untouched and client disconnects still reach the route.
"""

from __future__ import annotations

import hmac
import json
import time
from dataclasses import dataclass

from cbbench.reference_engine.server.errors import error_body
from cbbench.reference_engine.server.messages_api import error_body as messages_error
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Paths that need no API key (probes and scrapers).
OPEN_PATHS = ("/health", "/metrics")
ARRIVAL_KEY = "cbbench.arrival_ns"  # an ASGI scope extension key: routes share the scope


def arrival_ns(scope: Scope) -> int:
    """When the request reached the app (the guard's stamp), else now."""
    t = scope.get(ARRIVAL_KEY)
    return t if isinstance(t, int) else time.monotonic_ns()


@dataclass
class GuardMiddleware:
    app: ASGIApp
    scheduler: str
    max_body_bytes: int
    api_key: str | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope[ARRIVAL_KEY] = time.monotonic_ns()  # a request without a body: here
        extra = (b"x-cbbench-scheduler", self.scheduler.encode())

        async def send_with_header(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), extra]}
            await send(message)

        headers = dict(scope.get("headers") or [])
        path = scope["path"]
        if self.api_key is not None and scope["path"] not in OPEN_PATHS:
            auth = headers.get(b"authorization", b"").decode("latin-1")
            token = auth[7:] if auth[:7].lower() == "bearer " else ""
            token = token or headers.get(b"x-api-key", b"").decode("latin-1")  # Anthropic's
            if not hmac.compare_digest(token.encode(), self.api_key.encode()):
                msg = "invalid API key" if token else "missing API key (Authorization: Bearer ...)"
                await _reply(
                    send_with_header, 401, msg, "authentication_error", "invalid_api_key", path
                )
                return
        if scope["method"] in ("POST", "PUT", "PATCH"):
            body = await self._read_body(headers, receive)
            if body is None:
                await _reply(
                    send_with_header,
                    413,
                    f"request body larger than {self.max_body_bytes} bytes",
                    "invalid_request_error",
                    "request_too_large",
                    path,
                )
                return
            scope[ARRIVAL_KEY] = time.monotonic_ns()  # the request is complete
            receive = _replay(body, receive)
        await self.app(scope, receive, send_with_header)

    async def _read_body(self, headers: dict[bytes, bytes], receive: Receive) -> bytes | None:
        """The whole body, or None if it is over the limit (checked before reading when the
        client declares Content-Length)."""
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            return None
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break  # disconnected while sending: the route sees an empty body
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: wait for http.disconnect

    return replay


async def _reply(
    send: Send, status: int, message: str, type_: str, code: str, path: str = ""
) -> None:
    body = error_body(message, type_, None, code)
    if path == "/v1/messages":  # Anthropic's error shape on Anthropic's route
        body = messages_error(status, message)
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})
