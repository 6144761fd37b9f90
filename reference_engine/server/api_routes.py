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

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.sampling_params import SamplingParams
from cbbench.reference_engine.server import embeddings_api as E
from cbbench.reference_engine.server import messages_api as M
from cbbench.reference_engine.server import responses_api as R
from cbbench.reference_engine.server.async_engine import RequestStream
from cbbench.reference_engine.server.errors import (
    APIError,
    QueueFull,
    ShuttingDown,
    bad_request,
    model_not_found,
)
from cbbench.reference_engine.server.guard import arrival_ns
from cbbench.reference_engine.server.serving import Generation
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

API_MODELS = (R.ResponsesRequest, M.MessagesRequest, E.EmbeddingsRequest)


def add_routes(app: FastAPI, state: Any, chat: Any) -> None:
    """Add the two routes to `app`; `chat` is the app module (`app.py`), whose steps they share
    (passed in, not imported: app.py registers these routes)."""
    A = chat

    @app.post("/v1/responses", **A._body_doc(R.ResponsesRequest))
    async def responses(request: Request) -> Response:
        t_recv = arrival_ns(request.scope)  # at the app's door (guard.py)
        body = await A._parse(state, request, R.ResponsesRequest)
        return await _run(A, state, request, body, R.ResponsesShaper, t_recv, named=False)

    @app.post("/v1/messages", **_messages_doc(A._body_doc(M.MessagesRequest)))
    async def messages(request: Request) -> Response:
        t_recv = arrival_ns(request.scope)  # at the app's door (guard.py)
        try:
            body = await A._parse(state, request, M.MessagesRequest)
            return await _run(A, state, request, body, M.MessagesShaper, t_recv, named=True)
        except APIError as exc:
            return JSONResponse(M.from_api_error(exc), exc.status_code)

    @app.post("/v1/embeddings", **A._body_doc(E.EmbeddingsRequest))
    async def embeddings(request: Request) -> Response:
        body = await A._parse(state, request, E.EmbeddingsRequest)
        return await _embed(A, state, request, body)

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


def _messages_doc(doc: dict[str, Any]) -> dict[str, Any]:
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
    A: Any, state: Any, request: Request, body: Any, shaper_cls: Any, t_recv: int, named: bool
) -> Response:
    try:
        prompt_ids = await A._encode_chat(state.tokenizer, body.conversation())
    except EngineError as exc:  # the model's template refused the messages
        raise bad_request(str(exc), "messages" if named else "input") from None
    params = A._sampling_params(state, body, prompt_ids, chat=True)
    request_id = f"{'msg' if named else 'resp'}-{uuid.uuid4().hex}"
    reasoning = _reasoning(A, state, body, params.max_tokens)
    stream, gen = await A._admit(state, request_id, prompt_ids, params, body, reasoning)
    shaper = shaper_cls(gen, state.model_name, body)
    if body.cbbench_send_times:  # the route's arrival; each delta's send below
        shaper.stamps = {"t_recv_ns": t_recv}
    if body.stream:
        return StreamingResponse(
            _events(stream, gen, shaper, named),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache"},
        )
    return await A._collect(stream, gen, shaper, request)


def _reasoning(A: Any, state: Any, body: Any, max_tokens: int) -> Any:
    """--reasoning-parser: the chat endpoint's split, capped by Messages'
    `thinking.budget_tokens`."""
    split = A._reasoning(state, body, max_tokens)
    cap = body.thinking_budget() if hasattr(body, "thinking_budget") else None
    if split is not None and cap is not None:
        split.budget = min(split.budget, cap)
    return split


async def _embed(A: Any, state: Any, request: Request, body: E.EmbeddingsRequest) -> Response:
    """One engine request per input, all at once (the scheduler batches them)."""
    if body.model is not None and body.model != state.model_name:
        raise model_not_found(body.model, state.model_name)
    if body.dimensions is not None:
        raise bad_request("dimensions: this model's embeddings have one size", "dimensions")
    prompts = []
    for i, x in enumerate(body.inputs()):
        ids = await A._encode(state.tokenizer, x) if isinstance(x, str) else list(x)
        if not ids:
            raise bad_request(f"input[{i}] is empty", "input")
        if any(not 0 <= t < state.vocab_size for t in ids):
            raise bad_request(f"input[{i}]: a token id is outside the vocabulary", "input")
        if len(ids) >= state.max_model_len:
            raise bad_request(
                f"input[{i}] has {len(ids)} tokens; the model's context is {state.max_model_len}",
                "input",
                "context_length_exceeded",
            )
        prompts.append(ids)
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, embed=True)
    base = f"embd-{uuid.uuid4().hex}"
    streams: list[RequestStream] = []
    try:
        for i, ids in enumerate(prompts):
            rid = f"{base}-{i}"
            streams.append(await state.engine.add_request(rid, ids, params, body.priority))
        vectors = await asyncio.gather(*(_vector(s) for s in streams))
    except QueueFull as exc:
        raise APIError(429, str(exc), "rate_limit_error", None, "queue_full") from None
    except ShuttingDown as exc:
        raise APIError(503, str(exc), "server_error", None, "shutting_down") from None
    except EngineError as exc:
        raise bad_request(str(exc)) from None
    finally:
        for s in streams:
            s.close()
    if any(v is None for v in vectors):
        raise bad_request("this engine computes no hidden states (a simulated executor)")
    n = sum(len(p) for p in prompts)
    fmt = body.encoding_format
    return JSONResponse(E.body(vectors, state.model_name, n, fmt))  # type: ignore[arg-type]


async def _vector(stream: RequestStream) -> list[float] | None:
    vec = None
    async for out in stream:
        vec = out.embedding if out.embedding is not None else vec
        if out.finished:
            break
    return vec


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
                for ev in shaper.events(delta):  # two where a reasoning split falls inside
                    if shaper.body.cbbench_send_times:
                        ev["t_send_ns"] = time.monotonic_ns()
                    yield _frame(ev, named)
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
