"""The router's HTTP app: the OpenAI API in front, the replicas' OpenAI API behind.

POST /v1/completions, /v1/chat/completions, /v1/messages and /v1/responses: the body is read
once, a policy picks a replica, the request goes there unchanged (streaming or not) with the
client's end-to-end headers (the session id among them; router/headers.py) and the replica's
answer comes back as it is, with `x-cbbench-replica` naming the replica. The router reads the
body only for `stream` and, for prefix-affinity, the prompt's first blocks.

Failures keep the OpenAI shape, and each answer's outcome feeds the replica's circuit
breaker (router/breaker.py). No healthy replica is a 503. A replica that refuses the
connection is taken out of rotation and the request goes to another one (nothing was sent).
A failure before any byte reached the client (lost, timed out, a 5xx, a 200 that is not
JSON, a stream whose first chunk is not SSE) is resent once (`--retries`) to a replica not
tried yet, and the answer says so in `x-cbbench-retried-from` (the failed replicas); with
none left, the failure is the answer: a 502/504 (a replica's 5xx keeps its status) naming
the replica. A replica lost mid-stream (the client has seen tokens) is not retried: the
stream ends with an SSE error event and `[DONE]`. A client that disconnects closes
the upstream connection, which aborts the request at the replica.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
from cbbench.reference_engine.router.cache_reset import reset_replicas
from cbbench.reference_engine.router.headers import forward_headers
from cbbench.reference_engine.router.metrics import CONTENT_TYPE, RouterMetrics
from cbbench.reference_engine.router.options import RETRIES, SESSION_HEADER, UPSTREAM_TIMEOUT_S
from cbbench.reference_engine.router.pd import PDPools, forward_pd
from cbbench.reference_engine.router.policy import NoReplicaAvailable, RouteRequest, RoutingPolicy
from cbbench.reference_engine.router.prefix import body_block_hashes
from cbbench.reference_engine.router.upstream import Replica, ReplicaPool, junk_reason
from cbbench.reference_engine.server.errors import error_body, truncate
from cbbench.reference_engine.server.guard import GuardMiddleware
from cbbench.reference_engine.server.messages_api import error_body as messages_error
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import ASGIApp

PARSE_IN_THREAD_BYTES = 256 * 1024
# Response headers passed back from the replica (the guard adds x-cbbench-scheduler).
PASS_HEADERS = ("content-type", "x-cbbench-queue-time-s", "cache-control")
PD_PATHS = ("/v1/completions", "/v1/chat/completions")  # two hops; the others: decode workers


class Router:
    """The routing state of one app: the pool, the policy, the upstream HTTP client."""

    def __init__(
        self,
        pool: ReplicaPool,
        policy: RoutingPolicy,
        upstream_timeout_s: float = UPSTREAM_TIMEOUT_S,
        retries: int = RETRIES,
        session_header: str = SESSION_HEADER,
    ) -> None:
        self.pool, self.policy, self.retries = pool, policy, retries
        self.session_header = session_header  # session-affinity pins a session by it
        self.metrics = RouterMetrics(pool, policy.name)
        self.pd: PDPools | None = None  # prefill/decode pools (router/pd.py), else None
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
        timeout = httpx.Timeout(upstream_timeout_s, connect=5.0)
        self.client = httpx.AsyncClient(timeout=timeout, limits=limits)

    def pick(
        self,
        body: Any,
        exclude: set[int] | frozenset = frozenset(),
        session_id: str | None = None,
    ) -> Replica:
        """The policy's pick among the healthy replicas not in `exclude` (tried already)."""
        t = time.perf_counter()
        hashes = body_block_hashes(body) if self.policy.needs_prefix else ()
        hidden = [r for r in self.pool.loads if r.index in exclude and r.healthy]
        for r in hidden:  # no await until restored: no other request sees this
            r.healthy = False
        try:
            i = self.policy.choose(RouteRequest(hashes, session_id), self.pool.loads)
        finally:
            for r in hidden:
                r.healthy = True
        self.metrics.routing_time.observe(time.perf_counter() - t)
        return self.pool.replicas[i]

    async def aclose(self) -> None:
        await self.client.aclose()


def create_router_app(
    router: Router, *, api_key: str | None = None, max_body_bytes: int = 4 * 1024 * 1024
) -> ASGIApp:
    """The app; whoever built `router` starts its pool first and closes both after."""
    app = FastAPI(title="cbbench router", version="0.1.0")
    pool = router.pool

    @app.exception_handler(Exception)
    async def internal_error(_: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(
            error_body(f"internal error: {type(exc).__name__}", "server_error"), 500
        )

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _forward(router, request, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _forward(router, request, "/v1/chat/completions")

    @app.post("/v1/messages")  # Anthropic's Messages API: the router's own errors in its shape
    async def messages(request: Request) -> Response:
        return _anthropic_error(await _forward(router, request, "/v1/messages"))

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        return await _forward(router, request, "/v1/responses")

    @app.post("/reset_prefix_cache")  # vLLM's name; SGLang's below: every replica's cache
    @app.post("/flush_cache")
    async def reset_prefix_cache(request: Request) -> JSONResponse:
        return await reset_replicas(router, request.url.path)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        cards: dict[str, dict] = {}
        roles: dict[str, int] = {}
        for r in pool.replicas:
            for card in r.models:
                cards.setdefault(str(card.get("id")), card)
                role = (card.get("cbbench") or {}).get("role")
                if isinstance(role, str):
                    roles[role] = roles.get(role, 0) + 1
        if {"prefill", "decode"} <= set(roles):  # P/D: say so, not the first worker's role
            cards = {k: _pd_card(c, roles) for k, c in cards.items()}
        return {"object": "list", "data": list(cards.values())}

    @app.get("/health")
    async def health() -> Response:
        replicas = [r.describe() for r in pool.replicas]
        up = sum(r["healthy"] for r in replicas)
        if up == 0:
            body = error_body("no healthy replica", "server_error", None, "no_replica")
            return JSONResponse({**body, "replicas": replicas}, 503)
        status = "ok" if up == len(replicas) else "degraded"
        return JSONResponse({"status": status, "replicas": replicas})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(router.metrics.render(), media_type=CONTENT_TYPE)

    scheduler = f"router:{router.policy.name}"
    return GuardMiddleware(app, scheduler, max_body_bytes, api_key)


def _error(status: int, message: str, code: str, type_: str = "server_error") -> JSONResponse:
    return JSONResponse(error_body(message, type_, None, code), status)


def _anthropic_error(resp: Response) -> Response:
    """An error the router made itself (a JSONResponse; a replica's own answer is relayed as
    bytes) in Anthropic's shape, its headers kept."""
    if not isinstance(resp, JSONResponse) or resp.status_code < 400:
        return resp
    err = json.loads(resp.body).get("error")
    if not isinstance(err, dict):
        return resp
    keep = {k: v for k, v in resp.headers.items() if k not in ("content-length", "content-type")}
    body = messages_error(resp.status_code, str(err.get("message")))
    return JSONResponse(body, resp.status_code, headers=keep)


@dataclass
class _Failed:
    """A failure before any byte reached the client: resent to another replica (within the
    retry budget), else `response` is the client's answer."""

    response: Response
    refused: bool = False  # nothing reached the replica: free of the retry budget


async def _forward(router: Router, request: Request, path: str) -> Response:
    raw = await request.body()
    try:
        if len(raw) > PARSE_IN_THREAD_BYTES:
            body = await asyncio.to_thread(json.loads, raw)
        else:
            body = json.loads(raw)
    except ValueError as exc:
        return _error(400, f"invalid JSON: {exc}", "invalid_json", "invalid_request_error")
    if router.pd is not None and path in PD_PATHS:
        return await forward_pd(router, request, path, body, _exchange)
    stream = isinstance(body, dict) and body.get("stream") is True
    headers = forward_headers(request.headers.items(), router.pool.headers)
    tried: set[int] = set(router.pd.prefill) if router.pd is not None else set()
    retried_from: list[str] = []  # replicas whose failure was resent elsewhere
    failed: _Failed | None = None
    tried_last: Replica | None = None
    budget = router.retries  # resends after an answer failed (a refusal is free)
    while True:
        try:
            replica = router.pick(body, tried, request.headers.get(router.session_header))
        except NoReplicaAvailable as exc:
            if failed is not None:  # no other replica to resend to: the failure stands
                return _mark(failed.response, retried_from)
            return _error(503, str(exc), "no_replica")
        if failed is not None:  # resent: say where it failed
            assert tried_last is not None
            retried_from.append(tried_last.name)
            tried_last.retried += 1
        tried.add(replica.load.index)
        tried_last = replica
        upstream = router.client.build_request(
            "POST", replica.url + path, content=raw, headers=headers
        )
        replica.load.sent()
        out = await _exchange(router, replica, upstream, request, stream, path)
        if not isinstance(out, _Failed):
            return _mark(out, retried_from)
        out.response.headers["x-cbbench-replica"] = replica.name
        failed = out
        if not out.refused:
            if budget == 0:
                return _mark(out.response, retried_from)
            budget -= 1


def _mark(resp: Response, retried_from: list[str]) -> Response:
    if retried_from:
        resp.headers["x-cbbench-retried-from"] = ",".join(retried_from)
    return resp


async def _exchange(
    router: Router,
    replica: Replica,
    upstream: httpx.Request,
    request: Request,
    stream: bool,
    path: str = "",
    pd_error: str = "replica_failed",
) -> Response | _Failed:
    """Send, racing the client's disconnect; the replica's `load.ended()` is called once,
    when the answer is complete, abandoned or failed, and its outcome goes to the breaker."""
    pool = router.pool
    work = asyncio.ensure_future(_send(router, upstream, stream))
    watch = asyncio.ensure_future(_until_disconnected(request))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if not work.done():  # the client left: closing the connection aborts the replica's work
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        replica.load.ended()
        return Response(status_code=499)
    exc = work.exception()
    if exc is not None:
        replica.load.ended()
        if isinstance(exc, httpx.ConnectError):  # nothing reached the replica
            replica.failed += 1
            pool.mark_down(replica, f"connection refused: {exc}"[:200])
            return _Failed(_error(502, _failed_message(replica, exc), pd_error), True)
        if isinstance(exc, httpx.TimeoutException):
            pool.answered(replica, f"timed out: {type(exc).__name__}")
            return _Failed(_error(504, _failed_message(replica, exc), "replica_timeout"))
        if not isinstance(exc, httpx.HTTPError):
            raise exc
        pool.answered(replica, _lost(exc), hard=True)
        return _Failed(_error(502, _failed_message(replica, exc), pd_error))
    resp, head, chunks = work.result()
    out_headers = {k: v for k in PASS_HEADERS if (v := resp.headers.get(k)) is not None}
    out_headers["x-cbbench-replica"] = replica.name
    junk = junk_reason(resp.status_code, resp.headers.get("content-type", ""), head, stream)
    if junk is not None:
        replica.load.ended()
        if chunks is not None:
            await resp.aclose()
        pool.answered(replica, junk)
        message = f"replica {replica.name} ({replica.url}) {truncate(junk)}"
        status = resp.status_code if resp.status_code >= 500 else 502
        return _Failed(_error(status, message, "replica_failed"))
    if chunks is None:  # the whole answer was read
        replica.load.ended()
        pool.answered(replica, None)
        if resp.status_code >= 400 and not _is_error_body(head):
            message = f"replica {replica.name} answered {resp.status_code}: "
            message += truncate(head.decode("utf-8", "replace").strip() or "(empty body)")
            return JSONResponse(
                error_body(message, "invalid_request_error", None, resp.status_code),
                resp.status_code,
            )
        return Response(head, resp.status_code, headers=out_headers)
    relay = _relay(router, replica, resp, head, chunks, path, pd_error)
    return StreamingResponse(relay, resp.status_code, headers=out_headers)


async def _send(
    router: Router, upstream: httpx.Request, stream: bool
) -> tuple[httpx.Response, bytes, AsyncIterator[bytes] | None]:
    """The answer's head: the whole body, or an SSE stream's first chunk and the rest."""
    resp = await router.client.send(upstream, stream=True)
    is_sse = resp.headers.get("content-type", "").startswith("text/event-stream")
    if stream and is_sse and resp.status_code < 400:
        try:
            chunks = resp.aiter_raw()
            async for first in chunks:
                if first:
                    return resp, first, chunks  # the rest relayed chunk by chunk
            raise httpx.RemoteProtocolError("the stream ended before its first event")
        except BaseException:
            await resp.aclose()
            raise
    try:
        return resp, await resp.aread(), None
    finally:
        await resp.aclose()


async def _relay(
    router: Router,
    replica: Replica,
    resp: httpx.Response,
    first: bytes,
    chunks: AsyncIterator[bytes],
    path: str = "",
    code: str = "replica_failed",
) -> AsyncIterator[bytes]:
    try:
        yield first
        async for chunk in chunks:
            yield chunk
    except httpx.HTTPError as exc:  # mid-stream: the client saw tokens, no retry
        router.pool.answered(replica, _lost(exc), hard=True)
        yield _stream_error(path, _failed_message(replica, exc), code)
    else:
        router.pool.answered(replica, None)
    finally:
        await resp.aclose()  # also when the client went away: the replica aborts
        replica.load.ended()


def _stream_error(path: str, message: str, code: str = "replica_failed") -> bytes:
    """The error event that ends a stream cut mid-answer, in the route's API's shape."""
    if path == "/v1/messages":  # Anthropic's error event (its streams have no [DONE])
        return f"event: error\ndata: {json.dumps(messages_error(502, message))}\n\n".encode()
    if path == "/v1/responses":  # the Responses API's `error` event
        ev = {"type": "error", "code": code, "message": message}
        return f"event: error\ndata: {json.dumps(ev)}\n\n".encode()
    body = error_body(message, "server_error", None, code)
    return f"data: {json.dumps(body)}\n\ndata: [DONE]\n\n".encode()


def _lost(exc: BaseException) -> str:
    return f"connection lost: {type(exc).__name__}: {exc}"[:200]


def _failed_message(replica: Replica, exc: BaseException) -> str:
    return (
        f"replica {replica.name} ({replica.url}) failed during the request: "
        f"{type(exc).__name__}: {exc}"
    )


def _is_error_body(content: bytes) -> bool:
    try:
        return isinstance(json.loads(content).get("error"), dict)
    except (ValueError, AttributeError):
        return False


async def _until_disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _pd_card(card: dict, roles: dict[str, int]) -> dict:
    """A P/D router's card: its workers' (the first one's settings), with role
    "disaggregated" and the workers per role, where it said the prefill worker's "prefill"."""
    info = card.get("cbbench")
    if not isinstance(info, dict):
        return card
    workers = {k: v for k, v in roles.items() if k in ("prefill", "decode")}
    return {**card, "cbbench": {**info, "role": "disaggregated", "workers": workers}}
