"""A recording OpenAI-compatible chat server for tests: a real HTTP app that logs every request
it receives (arrival and end times on its own clock, headers, body) and streams `max_tokens`
words back with usage."""

from __future__ import annotations

import asyncio
import json
import threading
import time

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse


def recording_app(log: list[dict], token_delay_s: float = 0.0, serial: bool = False) -> FastAPI:
    """`token_delay_s`: a pause before each streamed word (calls that take time overlap);
    `serial`: one answer at a time (the others wait for it before their first word)."""
    app = FastAPI()
    lock = threading.Lock()
    one_at_a_time = asyncio.Lock()

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response("", media_type="text/plain")

    @app.post("/reset_prefix_cache")
    async def reset() -> dict:
        with lock:
            log.append({"t_in": time.monotonic(), "reset": True, "headers": {}, "body": {}})
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": "rec", "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> StreamingResponse:
        body = json.loads(await request.body())
        entry = {"t_in": time.monotonic(), "headers": dict(request.headers), "body": body}
        with lock:
            log.append(entry)
        n = body["max_tokens"]

        async def stream():
            if serial:
                await one_at_a_time.acquire()
            try:
                async for part in words():
                    yield part
            finally:
                if serial:
                    one_at_a_time.release()

        async def words():
            for i in range(n):
                if token_delay_s:
                    await asyncio.sleep(token_delay_s)
                chunk = {"choices": [{"index": 0, "delta": {"content": f"w{i} "}}]}
                yield f"data: {json.dumps(chunk)}\n\n"
            end = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
            yield f"data: {json.dumps(end)}\n\n"
            usage = {"prompt_tokens": 100, "completion_tokens": n, "total_tokens": 100 + n}
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"
            entry["t_out"] = time.monotonic()

        return StreamingResponse(stream(), media_type="text/event-stream")

    return app
