"""The server's side of prefill/decode disaggregation (docs/disaggregation.md).

A request's `kv_transfer_params` (vLLM's field name) says which hop it is:
- `{"do_remote_decode": true}` (to a prefill worker, non-streaming, max_tokens 1): the engine
  runs the prompt and ships its KV; the answer's `kv_transfer_params` name the staged payload
  (transfer id, bytes, tokens, first token) and the prefill's own times.
- `{"transfer_id": ..., "remote_url": ...}` (to a decode worker, the client's own request
  otherwise): the worker pulls the payload through the connector, then the engine continues
  from it. A pull that fails is HTTP 502 `kv_transfer_failed`: nothing was admitted, no block
  is held on either side.
The decode worker's `cbbench` field then carries the request's phases: prefill queue,
prefill, transfer (seconds and bytes), decode queue, decode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cbbench.reference_engine.kv_transfer.connector import KV_HEADER, KV_ROUTE, LoopbackConnector
from cbbench.reference_engine.kv_transfer.payload import KVTransferError
from cbbench.reference_engine.server.errors import APIError, bad_request
from fastapi import FastAPI
from fastapi.responses import Response

if TYPE_CHECKING:
    from cbbench.reference_engine.core.outputs import RequestMetrics


@dataclass
class KVHop:
    """What one request's kv_transfer_params asked for, and what came of it."""

    kv: dict[str, Any] = field(default_factory=dict)  # add_request's kv_export / kv_import
    phases: dict[str, Any] = field(default_factory=dict)  # known before the engine runs it

    @property
    def exports(self) -> bool:
        return bool(self.kv.get("kv_export"))


async def kv_hop(
    role: str, connector: LoopbackConnector, params: Any, stream: bool, metrics: Any = None
) -> KVHop:
    """The hop `params` (a body's kv_transfer_params) names on a server of `role`."""
    if params is None:
        return KVHop()
    if not isinstance(params, dict):
        raise bad_request("kv_transfer_params must be an object", "kv_transfer_params")
    if params.get("do_remote_decode"):
        if role == "decode":
            raise bad_request("this server is a decode worker (--role decode): it runs no "
                              "prefill for another worker", "kv_transfer_params")  # fmt: skip
        if stream:
            raise bad_request("a prefill hop (do_remote_decode) is not streamed",
                              "kv_transfer_params")  # fmt: skip
        return KVHop({"kv_export": True})
    if "transfer_id" in params:
        if role == "prefill":
            raise bad_request("this server is a prefill worker (--role prefill): it continues "
                              "no request from another's KV", "kv_transfer_params")  # fmt: skip
        try:
            got = await connector.fetch(params)
        except KVTransferError as exc:
            raise APIError(502, str(exc), "server_error", "kv_transfer_params",
                           "kv_transfer_failed") from None  # fmt: skip
        if metrics is not None:
            metrics.kv_transfer.received(got.payload.nbytes, got.seconds)
        phases = {
            "prefill_queue_s": params.get("prefill_queue_s"),
            "prefill_s": params.get("prefill_s"),
            "kv_transfer_s": got.seconds,
            "kv_transfer_bytes": got.payload.nbytes,
            "prefill_worker": params.get("remote_url"),
        }
        return KVHop({"kv_import": got.payload}, phases)
    raise bad_request("kv_transfer_params: expected do_remote_decode or transfer_id",
                      "kv_transfer_params")  # fmt: skip


def stage_export(
    connector: LoopbackConnector, payload: Any, m: RequestMetrics | None, metrics: Any = None
) -> dict:
    """A prefill worker's finished request: stage its payload; the answer's kv_transfer_params."""
    if payload is None:
        raise APIError(500, "the prefill produced no KV payload", "server_error", None,
                       "kv_transfer_failed")  # fmt: skip
    params = connector.stage(payload)
    if metrics is not None:
        metrics.kv_transfer.sent_bytes.inc(payload.nbytes)
        metrics.kv_transfer.staged.set(connector.staged_bytes)
    if m is not None:
        params["prefill_queue_s"] = m.queue_time
        if m.first_token_time is not None and m.first_scheduled_time is not None:
            params["prefill_s"] = m.first_token_time - m.first_scheduled_time
    return params


def decode_phases(hop: KVHop, m: RequestMetrics | None) -> dict[str, Any]:
    """The decode worker's `cbbench` phases of a request that came with a payload."""
    out = dict(hop.phases)
    if m is not None and m.first_scheduled_time is not None:
        out["decode_queue_s"] = m.first_scheduled_time - m.arrival_time
        if m.finished_time is not None:
            out["decode_s"] = m.finished_time - m.first_scheduled_time
    return out


def add_kv_routes(app: FastAPI, connector: LoopbackConnector, metrics: Any = None) -> None:
    @app.get(KV_ROUTE + "/{transfer_id}", include_in_schema=False)
    async def pull(transfer_id: str) -> Response:
        """A decode worker pulls a staged payload (once; then it is forgotten)."""
        payload = connector.take(transfer_id)
        if metrics is not None:
            metrics.kv_transfer.staged.set(connector.staged_bytes)
        if payload is None:
            raise APIError(404, f"no staged KV payload {transfer_id!r} (pulled already, or "
                           f"expired after {connector.ttl_s:g} s)", "invalid_request_error",
                           None, "kv_transfer_expired")  # fmt: skip
        return Response(payload.data, media_type="application/octet-stream",
                        headers={KV_HEADER: payload.header()})  # fmt: skip
