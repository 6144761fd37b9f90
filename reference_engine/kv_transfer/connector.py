"""The one KV connector interface, and the loopback connector same-host workers use.

Roles (vLLM's KVConnector has the same two): the *producer* (a prefill worker) stages each
finished prefill's payload under a transfer id and says where to get it; the *consumer* (a
decode worker) pulls it before it schedules the request, then the producer forgets it. The
producer's KV blocks are already free when it stages: the payload is a copy. A payload nobody
pulls expires after `ttl_s` (a decode worker that died, a router that gave up), so the
staging area never grows without bound; a pull after that is a KVTransferError, which the
decode worker answers as HTTP 502 `kv_transfer_failed`.

`LoopbackConnector` pulls over HTTP on the producer's own API port (GET /v1/kv/{id}, one
socket read of the raw bytes). A real deployment's NIXL / RDMA / Mooncake connector
implements the same two methods: `stage` registers the blocks' memory with the transport
instead of copying them out, `fetch` issues the one-sided read into the consumer's
pre-allocated blocks (vLLM: NixlConnector's `start_load_kv`), and the params dict carries
the agent metadata instead of a URL.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Protocol

from cbbench.reference_engine.kv_transfer.payload import KVPayload, KVTransferError

KV_ROUTE = "/v1/kv"  # the producer's pull route: GET {KV_ROUTE}/{transfer_id}
KV_HEADER = "x-cbbench-kv-payload"  # the payload's header() on the pull's answer
DEFAULT_TTL_S = 60.0
DEFAULT_MAX_STAGED_BYTES = 4 * 2**30


@dataclass
class Fetched:
    payload: KVPayload
    seconds: float  # wall time of the pull (request sent -> last byte)


class KVConnector(Protocol):
    def stage(self, payload: KVPayload) -> dict[str, Any]:
        """Producer: keep `payload` until pulled or expired; the params a consumer needs."""
        ...

    def take(self, transfer_id: str) -> KVPayload | None:
        """Producer: hand the payload over (once) and forget it; None if unknown/expired."""
        ...

    async def fetch(self, params: dict[str, Any]) -> Fetched:
        """Consumer: pull the payload `params` names (KVTransferError on any failure)."""
        ...


@dataclass
class _Staged:
    payload: KVPayload
    at: float


@dataclass
class LoopbackConnector:
    ttl_s: float = DEFAULT_TTL_S
    max_staged_bytes: int = DEFAULT_MAX_STAGED_BYTES
    timeout_s: float = 30.0  # one pull, connect to last byte
    _staged: OrderedDict[str, _Staged] = field(default_factory=OrderedDict)
    _bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    num_expired: int = 0
    _client: Any = None

    # --- producer -------------------------------------------------------------------------
    def stage(self, payload: KVPayload) -> dict[str, Any]:
        transfer_id = uuid.uuid4().hex
        now = time.monotonic()
        with self._lock:
            self._expire(now, payload.nbytes)
            self._staged[transfer_id] = _Staged(payload, now)
            self._bytes += payload.nbytes
        return {"transfer_id": transfer_id, "num_bytes": payload.nbytes,
                "num_tokens": payload.num_tokens, "first_token_id": payload.first_token_id}  # fmt: skip

    def take(self, transfer_id: str) -> KVPayload | None:
        with self._lock:
            self._expire(time.monotonic(), 0)
            s = self._staged.pop(transfer_id, None)
            if s is None:
                return None
            self._bytes -= s.payload.nbytes
            return s.payload

    @property
    def staged_bytes(self) -> int:
        return self._bytes

    @property
    def num_staged(self) -> int:
        return len(self._staged)

    def _expire(self, now: float, incoming: int) -> None:
        """Drop payloads older than ttl_s, then the oldest while `incoming` would not fit."""
        while self._staged:
            tid, s = next(iter(self._staged.items()))
            if now - s.at < self.ttl_s and self._bytes + incoming <= self.max_staged_bytes:
                break
            del self._staged[tid]
            self._bytes -= s.payload.nbytes
            self.num_expired += 1

    # --- consumer -------------------------------------------------------------------------
    async def fetch(self, params: dict[str, Any]) -> Fetched:
        import httpx

        url, tid = params.get("remote_url"), params.get("transfer_id")
        if not isinstance(url, str) or not isinstance(tid, str):
            raise KVTransferError("kv_transfer_params needs remote_url and transfer_id")
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(self.timeout_s, connect=5.0))
        t0 = time.perf_counter()
        try:
            resp = await self._client.get(f"{url.rstrip('/')}{KV_ROUTE}/{tid}")
        except httpx.HTTPError as exc:
            raise KVTransferError(
                f"KV transfer from {url} failed: {type(exc).__name__}: {exc}"[:300]
            ) from None
        seconds = time.perf_counter() - t0
        if resp.status_code != 200:
            raise KVTransferError(
                f"KV transfer from {url}: the prefill worker answered {resp.status_code} "
                f"({resp.text[:120].strip()})"
            )
        header = resp.headers.get(KV_HEADER)
        if header is None:
            raise KVTransferError(f"KV transfer from {url}: answer without {KV_HEADER}")
        return Fetched(KVPayload.from_wire(header, resp.content), seconds)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
