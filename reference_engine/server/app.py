"""The OpenAI-compatible HTTP app: /v1/completions, /v1/chat/completions, /v1/models,
/health, /metrics. Routes validate and tokenize; AsyncEngine runs the engine; Generation
turns outputs into text; this module wraps them in OpenAI shapes (SSE when streaming).

Over 400 lines because every route shares its parsing, error mapping and SSE framing here;
the engine-facing parts already live in serving.py and async_engine.py.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.kv_transfer.connector import LoopbackConnector
from cbbench.reference_engine.model.tokenizer import Tokenizer, encode_chat
from cbbench.reference_engine.sampling_params import SamplingParams
from cbbench.reference_engine.server import protocol as P
from cbbench.reference_engine.server.async_engine import AsyncEngine, RequestStream
from cbbench.reference_engine.server.body import BodyParser, validation_message
from cbbench.reference_engine.server.disagg import KVHop, add_kv_routes, kv_hop, stage_export
from cbbench.reference_engine.server.errors import (
    APIError,
    QueueFull,
    ShuttingDown,
    bad_request,
    error_body,
    model_not_found,
    truncate,
)
from cbbench.reference_engine.server.guard import GuardMiddleware
from cbbench.reference_engine.server.metrics import CONTENT_TYPE, ServerMetrics
from cbbench.reference_engine.server.reasoning import ReasoningOptions, ReasoningSplit
from cbbench.reference_engine.server.reasoning import budget as reasoning_budget
from cbbench.reference_engine.server.serving import Generation, ResponseShaper
from cbbench.reference_engine.server.tokenize import add_tokenize_route
from cbbench.reference_engine.server.tools import check_tool_messages, render_messages
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024


@dataclass
class ServerState:
    engine: AsyncEngine
    tokenizer: Tokenizer
    model_name: str
    scheduler: str
    max_model_len: int
    vocab_size: int
    metrics: ServerMetrics
    created: int
    body_parser: BodyParser
    reasoning: ReasoningOptions = ReasoningOptions()
    role: str = "both"  # --role (prefill/decode disaggregation, server/disagg.py)
    kv: LoopbackConnector = field(default_factory=LoopbackConnector)


def create_app(
    engine: AsyncEngine,
    tokenizer: Tokenizer,
    *,
    model_name: str,
    scheduler: str,
    max_model_len: int,
    vocab_size: int,
    metrics: ServerMetrics,
    api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    engine_info: dict | None = None,
    body_parser: BodyParser | None = None,
    reasoning: ReasoningOptions | None = None,
) -> ASGIApp:
    """The app serves an already-started AsyncEngine; whoever started it shuts it down (and
    closes `body_parser`, whose worker process parses big bodies)."""
    app = FastAPI(title="cbbench reference engine", version="0.1.0")
    state = ServerState(
        engine,
        tokenizer,
        model_name,
        scheduler,
        max_model_len,
        vocab_size,
        metrics,
        int(time.time()),
        body_parser or BodyParser(max_model_len),
        reasoning or ReasoningOptions(),
    )
    state.role = (engine_info or {}).get("role", "both")
    app.state.cbbench = state
    add_kv_routes(app, state.kv, metrics)
    _install_error_handlers(app)
    _document_errors(app)

    # Routes read their own bodies (BodyParser: big ones off the event loop); the OpenAPI
    # document still describes them (_document_errors adds the schemas).
    @app.post("/v1/completions", **_body_doc(P.CompletionRequest))
    async def completions(request: Request) -> Response:
        body = await _parse(state, request, P.CompletionRequest)
        if isinstance(body.prompt, str):
            prompt_ids = await _encode(tokenizer, body.prompt)
        else:
            prompt_ids = list(body.prompt)
        return await _generate(state, request, body, prompt_ids, chat=False)

    @app.post("/v1/chat/completions", **_body_doc(P.ChatCompletionRequest))
    async def chat_completions(request: Request) -> Response:
        body = await _parse(state, request, P.ChatCompletionRequest)
        check_tool_messages(body.messages)
        messages = render_messages(body)
        try:  # the model's own chat template when it has one, else the built-in one
            prompt_ids = await _encode_chat(tokenizer, messages)
        except EngineError as exc:  # the model's template refused the messages
            raise bad_request(str(exc), "messages") from None
        return await _generate(state, request, body, prompt_ids, chat=True)

    @app.post("/reset_prefix_cache")  # vLLM's name
    @app.post("/flush_cache")  # SGLang's
    async def reset_prefix_cache() -> dict[str, Any]:
        """Drop every cached prefix block; requests sent after it find none."""
        engine.reset_prefix_cache()
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {
            "id": model_name,
            "object": "model",
            "created": state.created,
            "owned_by": "cbbench",
            # vLLM's `root`: the checkpoint served (preset or folder, as given), whatever
            # --served-model-name calls it; report and gate compare models by it
            "root": ((engine_info or {}).get("config") or {}).get("model") or model_name,
            "max_model_len": max_model_len,
        }
        if engine_info:
            card["cbbench"] = engine_info  # scheduler, device, attention backend, KV pool
        return {"object": "list", "data": [card]}

    @app.get("/health")
    async def health() -> Response:
        if not engine.accepting:
            return JSONResponse(error_body("engine not running", "server_error"), 503)
        return Response(status_code=200)

    add_tokenize_route(app, state, _parse)  # vLLM's /tokenize (exact text prompt lengths)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    from cbbench.reference_engine.server import api_routes

    api_routes.add_routes(app, state, sys.modules[__name__])  # responses, messages, embeddings
    return GuardMiddleware(app, scheduler, max_body_bytes, api_key)


# Text longer than this is tokenized in a thread (the tokenizers release the GIL, or run
# Python bytecode that yields it), so /health keeps answering.
ENCODE_IN_THREAD_CHARS = 16 * 1024

_REQUEST_MODELS = (P.CompletionRequest, P.ChatCompletionRequest)


async def _parse(state: ServerState, request: Request, model: type[Any]) -> Any:
    raw = await request.body()
    return await state.body_parser.parse(raw, request.headers.get("content-type"), model)


async def _encode(tokenizer: Tokenizer, text: str) -> list[int]:
    if len(text) < ENCODE_IN_THREAD_CHARS:
        return tokenizer.encode(text)
    return await asyncio.to_thread(tokenizer.encode, text)


async def _encode_chat(tokenizer: Tokenizer, messages: list[tuple[str, str]]) -> list[int]:
    if sum(len(c) for _, c in messages) < ENCODE_IN_THREAD_CHARS:
        return encode_chat(tokenizer, messages)
    return await asyncio.to_thread(encode_chat, tokenizer, messages)


def _body_doc(model: type[Any]) -> dict[str, Any]:
    """Route keywords documenting a JSON body of `model` and the 400 it may get."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {
        "openapi_extra": {
            "requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}
        },
        "responses": {
            400: {
                "description": "Invalid request",
                "content": {"application/json": {"schema": P.ERROR_SCHEMA}},
            }
        },
    }


def _document_errors(app: FastAPI) -> None:
    """The OpenAPI document says what the server does: invalid requests are 400 with the
    OpenAI error body (FastAPI would document its own 422), and the request schemas of the
    routes that parse their own bodies."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in _REQUEST_MODELS:
                doc = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(doc.pop("$defs", {}))
                components[model.__name__] = doc
            for operations in schema["paths"].values():
                for op in operations.values():
                    if op.get("responses", {}).pop("422", None) is not None:
                        op["responses"]["400"] = {
                            "description": "Invalid request",
                            "content": {"application/json": {"schema": P.ERROR_SCHEMA}},
                        }
            for name in ("HTTPValidationError", "ValidationError"):
                schema.get("components", {}).get("schemas", {}).pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        if first.get("type") == "json_invalid":
            message = f"invalid JSON: {first.get('ctx', {}).get('error', 'decode error')}"
            return JSONResponse(error_body(message, "invalid_request_error"), 400)
        if first.get("type") == "model_attributes_type" and len(first.get("loc", ())) <= 1:
            message = "the request body must be a JSON object (Content-Type: application/json)"
            return JSONResponse(error_body(message, "invalid_request_error"), 400)
        return JSONResponse(validation_message(list(errors)).error().body(), 400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # OpenAI's shape: a string code or null, never the status as an int
        type_ = "invalid_request_error" if exc.status_code < 500 else "server_error"
        detail = str(exc.detail)
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"Invalid URL ({request.method} {request.url.path})"
        body = error_body(truncate(detail), type_, None, None)
        return JSONResponse(body, exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def internal_error(_: Request, exc: Exception) -> JSONResponse:
        message = f"internal error: {type(exc).__name__}"
        return JSONResponse(error_body(message, "server_error"), 500)


# --- one generation request -------------------------------------------------------------
def _sampling_params(
    state: ServerState, body: P.SamplingFields, prompt_ids: list[int], chat: bool
) -> SamplingParams:
    if body.model is not None and body.model != state.model_name:
        raise model_not_found(body.model, state.model_name)
    if not prompt_ids:
        raise bad_request("prompt is empty", "prompt")
    bad = [t for t in prompt_ids if not 0 <= t < state.vocab_size]
    if bad:
        raise bad_request(
            f"prompt token id {bad[0]} is outside the vocabulary [0, {state.vocab_size})",
            "prompt",
        )
    room = state.max_model_len - len(prompt_ids)
    if room < 1:
        raise bad_request(
            f"prompt has {len(prompt_ids)} tokens; the model's context is {state.max_model_len}",
            "prompt" if not chat else "messages",
            "context_length_exceeded",
        )
    max_tokens = body.max_tokens
    if chat and isinstance(body, P.ChatCompletionRequest) and body.max_completion_tokens:
        max_tokens = body.max_completion_tokens
    if max_tokens is None:
        max_tokens = room if chat else min(room, P.DEFAULT_COMPLETION_MAX_TOKENS)
    if max_tokens > room:
        raise bad_request(
            f"max_tokens={max_tokens} plus the prompt's {len(prompt_ids)} tokens exceeds the "
            f"model's context of {state.max_model_len}",
            "max_tokens",
            "context_length_exceeded",
        )
    if len(body.stop_strings()) > P.MAX_STOP_STRINGS or any(
        len(s) > P.MAX_STOP_CHARS for s in body.stop_strings()
    ):
        raise bad_request(
            f"stop: at most {P.MAX_STOP_STRINGS} strings of at most {P.MAX_STOP_CHARS} characters",
            "stop",
        )
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            min_tokens=body.min_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=-1 if body.top_k == 0 else body.top_k,
            seed=body.seed,
            ignore_eos=body.ignore_eos,
            logprobs=_logprobs(body),
        )
    except EngineError as exc:
        raise bad_request(str(exc)) from None


def _logprobs(body: P.SamplingFields) -> int | None:
    """The top-k alternatives asked per output token, None for no logprobs; an unsupported
    combination is a 400 that names it."""
    if isinstance(body, P.ChatCompletionRequest):
        if body.top_logprobs is not None and not body.logprobs:
            raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
        return (body.top_logprobs or 0) if body.logprobs else None
    assert isinstance(body, P.CompletionRequest)
    if body.echo and body.logprobs is not None:
        raise bad_request(
            "echo with logprobs is not supported: prompt logprobs are not computed", "echo"
        )
    return body.logprobs


async def _admit(
    state: ServerState,
    request_id: str,
    prompt_ids: list[int],
    params: SamplingParams,
    body: P.SamplingFields,
    reasoning: ReasoningSplit | None,
    hop: KVHop | None = None,
) -> tuple[RequestStream, Generation]:
    """Hand a request to the engine (its refusals as the API's errors) and start its
    Generation: every generating route (chat, completions, responses, messages) goes here."""
    try:
        kv = hop.kv if hop is not None else {}
        stream = await state.engine.add_request(request_id, prompt_ids, params, body.priority, **kv)
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
        reasoning=reasoning,
        hop=hop,
    )
    return stream, gen


async def _generate(
    state: ServerState, request: Request, body: P.SamplingFields, prompt_ids: list[int], chat: bool
) -> Response:
    params = _sampling_params(state, body, prompt_ids, chat)
    request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    reasoning = _reasoning(state, body, params.max_tokens) if chat else None
    hop = await kv_hop(state.role, state.kv, body.kv_transfer_params, body.stream, state.metrics)
    stream, gen = await _admit(state, request_id, prompt_ids, params, body, reasoning, hop)
    echo = ""
    if isinstance(body, P.CompletionRequest) and body.echo:
        echo = body.prompt if isinstance(body.prompt, str) else state.tokenizer.decode(prompt_ids)
    shaper = ResponseShaper(
        gen, state.model_name, body, chat, state.tokenizer.token_text, echo=echo
    )
    if body.stream:
        return StreamingResponse(
            _sse(stream, gen, shaper),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache"},
        )
    kv = (state.kv, state.metrics) if hop.exports else None
    return await _collect(stream, gen, shaper, request, kv)


def _reasoning(
    state: ServerState, body: P.SamplingFields, max_tokens: int
) -> ReasoningSplit | None:
    """--reasoning-parser: this chat request's split (None without the flag); a template
    kwarg `enable_thinking` that is not a boolean is a 400 naming it."""
    opts = state.reasoning
    if opts.parser is None:
        return None
    assert isinstance(body, P.ChatCompletionRequest)
    thinking = (body.chat_template_kwargs or {}).get("enable_thinking", True)
    if not isinstance(thinking, bool):
        raise bad_request(
            "chat_template_kwargs.enable_thinking must be true or false",
            "chat_template_kwargs",
        )
    n = reasoning_budget(opts, max_tokens, body.reasoning_effort, thinking)
    return ReasoningSplit(n, opts.field)


async def _run_to_end(stream: RequestStream, gen: Generation) -> None:
    async for out in stream:
        gen.on_output(out)
        if gen.finished:
            stream.close()  # a stop string ended it early: abort in the engine
            break


async def _collect(
    stream: RequestStream,
    gen: Generation,
    shaper: ResponseShaper,
    request: Request,
    kv: tuple[LoopbackConnector, ServerMetrics] | None = None,
) -> Response:
    """Non-streaming: wait for the end, aborting the request if the client goes away."""
    work = asyncio.ensure_future(_run_to_end(stream, gen))
    watch = asyncio.ensure_future(_until_disconnected(request))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not work.done():
            work.cancel()
            stream.close()
    if not work.done() or work.cancelled():
        # Nobody is listening. `work` may still be unwinding from cancel(): it is not done
        # yet, so asking for its exception would raise InvalidStateError.
        work.add_done_callback(_retrieve)
        return Response(status_code=499)
    exc = work.exception()
    if isinstance(exc, ShuttingDown):
        raise APIError(503, str(exc), "server_error", None, "shutting_down")
    if exc is not None:
        raise exc
    info = gen.cbbench_field()
    headers = {}
    if info["queue_time_s"] is not None:
        headers["x-cbbench-queue-time-s"] = f"{info['queue_time_s']:.6f}"
    body = shaper.final_body()
    if kv is not None:  # a prefill hop: its KV staged for the decode worker's pull
        body["kv_transfer_params"] = stage_export(kv[0], gen.kv_transfer, gen.metrics, kv[1])
    return JSONResponse(body, headers=headers)


def _retrieve(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: asyncio logs nothing for an aborted request


async def _until_disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _sse(
    stream: RequestStream, gen: Generation, shaper: ResponseShaper
) -> AsyncIterator[str]:
    try:
        async for out in stream:
            delta = gen.on_output(out)
            if gen.finished and not out.finished:
                stream.close()
            for chunk in shaper.chunks(delta):  # two where a reasoning split falls inside
                yield _event(chunk)
            if gen.finished:
                break
        if shaper.include_usage:
            yield _event(shaper.usage_chunk())
    except ShuttingDown as exc:
        yield _event(error_body(str(exc), "server_error", None, "shutting_down"))
    finally:
        stream.close()
    yield "data: [DONE]\n\n"


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"
