"""POST /tokenize, in vLLM's request and response shape, so a client can make text prompts of
an exact token length (and count a chat prompt as the server builds it) on this server as on
vLLM.

    {"model": ..., "prompt": "text", "add_special_tokens": true}            -> the text's ids
    {"model": ..., "messages": [...], "add_generation_prompt": true}        -> the chat prompt's
    <- {"count": n, "max_model_len": m, "tokens": [ids], "token_strs": null}

The chat form counts exactly what /v1/chat/completions sends to the engine (the model's
template, else the built-in one, with the assistant's header: a generation prompt).
"""

from __future__ import annotations

from typing import Any

from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.model.tokenizer import encode_chat
from cbbench.reference_engine.server import protocol as P
from cbbench.reference_engine.server.errors import bad_request, model_not_found
from fastapi import Request
from pydantic import Field


class TokenizeRequest(P._Strict):
    model: P.Text | None = None
    prompt: P.Text | None = None
    messages: list[P.ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: bool | None = None  # vLLM's defaults: True for a prompt, False for chat
    add_generation_prompt: bool = True  # always: the chat route sends the assistant header


def add_tokenize_route(app, state, parse) -> None:
    """Register /tokenize on `app`; `parse(state, request, model)` reads a body as the other
    routes do (one error shape for bad bodies)."""

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        body: TokenizeRequest = await parse(state, request, TokenizeRequest)
        if body.model is not None and body.model != state.model_name:
            raise model_not_found(body.model, state.model_name)
        if (body.prompt is None) == (body.messages is None):
            raise bad_request("give exactly one of prompt or messages", "prompt")
        tok = state.tokenizer
        if body.messages is not None:
            try:
                ids = encode_chat(tok, [(m.role, m.text()) for m in body.messages])
            except EngineError as exc:  # the model's template refused the messages
                raise bad_request(str(exc), "messages") from None
        else:
            special = True if body.add_special_tokens is None else body.add_special_tokens
            ids = tok.encode(body.prompt, add_special_tokens=special)
        return {
            "count": len(ids),
            "max_model_len": state.max_model_len,
            "tokens": ids,
            "token_strs": None,
        }
