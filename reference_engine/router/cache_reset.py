"""Prefix-cache resets through the router: `POST /reset_prefix_cache` (or `/flush_cache`) goes
to every replica, so `cbbench bench --flush-cache` empties a whole cluster's caches. 200 when
every replica answered 2xx; else 502 naming the ones that did not."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from cbbench.reference_engine.server.errors import error_body
from fastapi.responses import JSONResponse


async def reset_replicas(router: Any, path: str) -> JSONResponse:
    pool = router.pool

    async def one(replica: Any) -> str | None:
        try:
            r = await router.client.post(replica.url + path, headers=pool.headers, timeout=30.0)
        except httpx.HTTPError as exc:
            return f"{replica.name}: {type(exc).__name__}"
        return None if r.status_code < 300 else f"{replica.name}: HTTP {r.status_code}"

    failed = [f for f in await asyncio.gather(*(one(r) for r in pool.replicas)) if f]
    if failed:
        body = error_body(f"{path} failed on {'; '.join(failed)}", "server_error", None, "replica")
        return JSONResponse(body, 502)
    return JSONResponse({"status": "ok", "replicas": len(pool.replicas)})
