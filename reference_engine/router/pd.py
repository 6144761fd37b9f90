"""P/D dispatch: a request goes to a prefill worker, then to a decode worker (vLLM's
disaggregated-prefill proxy and Dynamo's prefill router do the same two hops).

1. Prefill hop: the router's policy (least-outstanding by default, or prefix-affinity) picks
   among the prefill workers; the body goes there non-streaming with max_tokens 1 and
   `kv_transfer_params: {"do_remote_decode": true}`. The worker runs the prompt, stages the
   KV and answers with `kv_transfer_params` naming the payload.
2. Decode hop: kv-aware picks the decode worker with the most KV headroom; the client's own
   body goes there with those params (plus the prefill worker's URL to pull from), and the
   answer, streaming or not, is relayed as from any replica: the client sees one stream.
A failure names its hop: `prefill_worker_failed` (before any token), `kv_transfer_failed`
(the decode worker's pull), `decode_worker_failed` (mid-stream: an SSE error event, then
[DONE]). Each request's two hops are one log line (logger `cbbench.router`) and counted in
`cbbench:router_pd_requests_total{prefill,decode}`; the transfer's bytes in
`cbbench:router_pd_kv_transfer_bytes_total`.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
from cbbench.reference_engine.router.headers import forward_headers
from cbbench.reference_engine.router.kv_aware import KVAware
from cbbench.reference_engine.router.policy import NoReplicaAvailable, RouteRequest
from cbbench.reference_engine.server.errors import error_body, truncate
from fastapi import Request
from fastapi.responses import JSONResponse, Response

if TYPE_CHECKING:
    from cbbench.reference_engine.router.upstream import Replica

Router = Any  # router/app.py's Router (it imports this module: typed loosely, no cycle)

log = logging.getLogger("cbbench.router")


@dataclass
class PDPools:
    """Which of the pool's replicas prefill and which decode (indices into pool.replicas)."""

    prefill: frozenset[int]
    decode: frozenset[int]


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    out = copy.copy(body)
    out["stream"] = False
    out.pop("stream_options", None)
    out["max_tokens"] = 1
    if isinstance(out.get("min_tokens"), int):  # >= 1 keeps EOS masked on the first token
        out["min_tokens"] = min(out["min_tokens"], 1)
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out["kv_transfer_params"] = {"do_remote_decode": True}
    return out


def _error(status: int, message: str, code: str) -> JSONResponse:
    return JSONResponse(error_body(message, "server_error", None, code), status)


async def forward_pd(
    router: Router, request: Request, path: str, body: Any, exchange: Callable[..., Awaitable]
) -> Response:
    """The two hops of one request; `exchange` is the app's send-and-relay of one upstream
    request (router/app.py `_exchange`), used for the decode hop."""
    pd = router.pd
    assert pd is not None
    if not isinstance(body, dict):
        return _error(400, "the request body must be a JSON object", "invalid_request")
    if body.get("logprobs") not in (None, False):  # the first token is the prefill's
        return JSONResponse(error_body("logprobs are not supported through the P/D router: "
                            "the first token is sampled on the prefill worker",
                            "invalid_request_error", "logprobs"), 400)  # fmt: skip
    stream = body.get("stream") is True
    headers = forward_headers(request.headers.items(), router.pool.headers)
    try:
        pre = router.pick(body, set(pd.decode))
    except NoReplicaAvailable:
        return _error(503, "no healthy prefill worker", "no_prefill_worker")
    t0 = time.perf_counter()
    pre.load.sent()
    work = asyncio.ensure_future(
        router.client.post(pre.url + path, content=json.dumps(prefill_body(body)), headers=headers)
    )
    watch = asyncio.ensure_future(_until_disconnected(request))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if not work.done():  # the client left: closing the connection aborts the prefill
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        pre.load.ended()
        return Response(status_code=499)
    try:
        resp = work.result()
    except httpx.HTTPError as exc:
        pre.load.ended()
        router.pool.answered(pre, f"connection lost: {type(exc).__name__}"[:200], hard=True)
        return _error(502, f"prefill worker {pre.name} ({pre.url}) failed: "
                      f"{type(exc).__name__}: {exc}"[:300], "prefill_worker_failed")  # fmt: skip
    pre.load.ended()
    prefill_s = time.perf_counter() - t0
    if resp.status_code >= 400:  # the client's error (4xx) or the worker's (5xx), relayed
        router.pool.answered(
            pre, None if resp.status_code < 500 else f"answered {resp.status_code}"
        )
        return Response(resp.content, resp.status_code, media_type="application/json",
                        headers={"x-cbbench-prefill-replica": pre.name})  # fmt: skip
    router.pool.answered(pre, None)
    try:
        params = resp.json()["kv_transfer_params"]
        assert isinstance(params, dict) and "transfer_id" in params
    except (ValueError, KeyError, TypeError, AssertionError):
        text = truncate(resp.text.strip()) or "(empty body)"
        return _error(502, f"prefill worker {pre.name} ({pre.url}) answered without "
                      f"kv_transfer_params: {text}", "prefill_worker_failed")  # fmt: skip
    params = {**params, "remote_url": pre.url}
    try:
        dec = _pick_decode(router, pd)
    except NoReplicaAvailable:
        return _error(503, "no healthy decode worker", "no_decode_worker")
    decode = {**body, "kv_transfer_params": params}
    upstream = router.client.build_request(
        "POST", dec.url + path, content=json.dumps(decode), headers=headers
    )
    dec.load.sent()
    out = await exchange(
        router, dec, upstream, request, stream, path, pd_error="decode_worker_failed"
    )
    if not isinstance(out, Response):  # _Failed: no byte reached the client
        out = out.response
    out.headers["x-cbbench-prefill-replica"] = pre.name
    router.metrics.pd_request(pre.name, dec.name, int(params.get("num_bytes") or 0))
    log.info("P/D %s: prefill %s (%.3f s, %s KV bytes) -> decode %s (%d)", path, pre.name,
             prefill_s, params.get("num_bytes"), dec.name, out.status_code)  # fmt: skip
    return out


async def _until_disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


_KV_AWARE = KVAware()


def _pick_decode(router: Router, pd: PDPools) -> Replica:
    loads = router.pool.loads
    hidden = [r for r in loads if r.index in pd.prefill and r.healthy]
    for r in hidden:  # no await until restored
        r.healthy = False
    try:
        i = _KV_AWARE.choose(RouteRequest(), loads)
    finally:
        for r in hidden:
            r.healthy = True
    return router.pool.replicas[i]
