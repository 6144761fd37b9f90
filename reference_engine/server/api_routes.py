"""The Responses (`/v1/responses`) and Anthropic Messages (`/v1/messages`) routes, beside the
chat route in `app.py` and sharing its steps: the body parsed by the app's BodyParser into the
API's schema (a chat request underneath), the conversation through the same chat template,
the same sampling checks, the same engine, `Generation` for text and stop strings, and the
same non-streaming wait; only the shapes differ (`responses_api.py`, `messages_api.py`).
Prometheus metrics are the engine's, so every endpoint's requests count the same.

Errors: Responses uses OpenAI's error body (the app's handlers); Messages answers every error
of its own route in Anthropic's shape (`messages_api.error_body`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.server import app as A
from cbbench.reference_engine.server import messages_api as M
from cbbench.reference_engine.server import responses_api as R
from cbbench.reference_engine.server.async_engine import RequestStream
from cbbench.reference_engine.server.errors import APIError, QueueFull, ShuttingDown, bad_request
from cbbench.reference_engine.server.serving import Generation
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

API_MODELS = (R.ResponsesRequest, M.MessagesRequest)


def add_routes(app: FastAPI, state: A.ServerState) -> None:
    @app.post("/v1/responses", **A._body_doc(R.ResponsesRequest))
    async def responses(request: Request) -> Response:
        body = await A._parse(state, request, R.ResponsesRequest)
        return await _run(state, request, body, R.ResponsesShaper, "resp", named=False)

    @app.post("/v1/messages", **_messages_doc())
    async def messages(request: Request) -> Response:
        try:
            body = await A._parse(state, request, M.MessagesRequest)
            return await _run(state, request, body, M.MessagesShaper, "msg", named=True)
        except APIError as exc:
            return JSONResponse(M.from_api_error(exc), exc.status_code)

    _document(app)


def _document(app: FastAPI) -> None:
    """The OpenAPI document gains the two request schemas (the app adds chat's and
    completions')."""
    base = app.openapi

    def openapi() -> dict[str, Any]:
        schema = base()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in API_MODELS:
            if model.__name__ not in components:
                doc = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(doc.pop("$defs", {}))
                components[model.__name__] = doc
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def _messages_doc() -> dict[str, Any]:
    doc = A._body_doc(M.MessagesRequest)
    doc["responses"][400]["content"]["application/json"]["schema"] = {
        "type": "object",
        "required": ["type", "error"],
        "properties": {
            "type": {"const": "error"},
            "error": {
                "type": "object",
                "required": ["type", "message"],
                "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
            },
        },
    }
    return doc


async def _run(
    state: A.ServerState, request: Request, body: Any, shaper_cls: Any, prefix: str, named: bool
) -> Response:
    try:
        prompt_ids = await A._encode_chat(state.tokenizer, body.conversation())
    except EngineError as exc:  # the model's template refused the messages
        raise bad_request(str(exc), "messages" if named else "input") from None
    params = A._sampling_params(state, body, prompt_ids, chat=True)
    request_id = f"{prefix}-{uuid.uuid4().hex}"
    try:
        stream = await state.engine.add_request(request_id, prompt_ids, params, body.priority)
    except QueueFull as exc:
        raise APIError(429, str(exc), "rate_limit_error", None, "queue_full") from None
    except ShuttingDown as exc:
        raise APIError(503, str(exc), "server_error", None, "shutting_down") from None
    except EngineError as exc:
        raise bad_request(str(exc)) from None
    gen = Generation(
        request_id,
        prompt_ids,
        state.tokenizer.new_detokenizer(),
        stop=body.stop_strings(),
        min_tokens=body.min_tokens,
        scheduler=state.scheduler,
    )
    shaper = shaper_cls(gen, state.model_name, body)
    if body.stream:
        return StreamingResponse(
            _events(stream, gen, shaper, named),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache"},
        )
    return await A._collect(stream, gen, shaper, request)


def _frame(ev: dict[str, Any], named: bool) -> str:
    data = json.dumps(ev, separators=(",", ":"))
    return f"event: {ev['type']}\ndata: {data}\n\n" if named else f"data: {data}\n\n"


async def _events(
    stream: RequestStream, gen: Generation, shaper: Any, named: bool
) -> AsyncIterator[str]:
    try:
        for ev in shaper.start():
            yield _frame(ev, named)
        async for out in stream:
            delta = gen.on_output(out)
            if gen.finished and not out.finished:
                stream.close()
            if delta.text or shaper.body.return_token_ids:
                yield _frame(shaper.delta(delta), named)
            if gen.finished:
                break
        for ev in shaper.end():
            yield _frame(ev, named)
    except ShuttingDown as exc:
        if named:
            yield _frame(M.error_body(503, str(exc)), True)
        else:
            yield _frame({"type": "error", "code": "shutting_down", "message": str(exc)}, False)
    finally:
        stream.close()
