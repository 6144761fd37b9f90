"""The recording server (`recording_server.py`) speaking the Responses and Messages APIs too:
every request logged (arrival and end on its own clock, headers, body), and `max_output_tokens`
/ `max_tokens` words streamed back in the API's own events, with its usage."""

from __future__ import annotations

import json
import threading
import time

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from tests.recording_server import recording_app


def _sse(ev: dict) -> str:
    return f"event: {ev['type']}\ndata: {json.dumps(ev)}\n\n"


def recording_api_app(log: list[dict]) -> FastAPI:
    app = recording_app(log)
    lock = threading.Lock()

    async def record(request: Request) -> tuple[dict, dict]:
        body = json.loads(await request.body())
        entry = {"t_in": time.monotonic(), "headers": dict(request.headers), "body": body}
        with lock:
            log.append(entry)
        return body, entry

    @app.post("/v1/responses")
    async def responses(request: Request) -> StreamingResponse:
        body, entry = await record(request)
        n = body["max_output_tokens"]

        async def stream():
            yield _sse({"type": "response.created", "response": {"status": "in_progress"}})
            for i in range(n):
                yield _sse({"type": "response.output_text.delta", "delta": f"w{i} "})
            usage = {"input_tokens": 100, "output_tokens": n,
                     "output_tokens_details": {"reasoning_tokens": 0}}  # fmt: skip
            done = {"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"},
                    "output": [], "usage": usage}  # fmt: skip
            yield _sse({"type": "response.completed", "response": done})
            entry["t_out"] = time.monotonic()

        return StreamingResponse(stream(), media_type="text/event-stream")

    @app.post("/v1/messages")
    async def messages(request: Request) -> StreamingResponse:
        body, entry = await record(request)
        n = body["max_tokens"]

        async def stream():
            msg = {"type": "message", "role": "assistant", "content": [],
                   "usage": {"input_tokens": 100, "output_tokens": 0}}  # fmt: skip
            yield _sse({"type": "message_start", "message": msg})
            start = {"type": "text", "text": ""}
            yield _sse({"type": "content_block_start", "index": 0, "content_block": start})
            for i in range(n):
                delta = {"type": "text_delta", "text": f"w{i} "}
                yield _sse({"type": "content_block_delta", "index": 0, "delta": delta})
            yield _sse({"type": "content_block_stop", "index": 0})
            yield _sse({"type": "message_delta", "delta": {"stop_reason": "max_tokens"},
                        "usage": {"output_tokens": n}})  # fmt: skip
            yield _sse({"type": "message_stop"})
            entry["t_out"] = time.monotonic()

        return StreamingResponse(stream(), media_type="text/event-stream")

    return app
