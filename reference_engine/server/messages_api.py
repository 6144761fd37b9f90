"""Anthropic's Messages API (`/v1/messages`): the request as a chat request, the output as
Messages events and bodies, errors in Anthropic's shape.

The request: `messages` (user / assistant turns, content a string or `text` blocks),
`system` (a system message first), `max_tokens` (required), `stop_sequences`, `temperature`,
`top_p`, `top_k`, and vLLM's extensions (`ignore_eos`, `min_tokens`, `priority`,
`return_token_ids`). The conversation goes through the chat template exactly as
/v1/chat/completions does, so greedy text is the chat endpoint's. Tools are not run.

Streaming (each SSE event named by an `event:` line, as Anthropic's SDK reads them):
`message_start` (usage.input_tokens), `content_block_start`, one `content_block_delta`
(`text_delta`) per engine output (with `token_ids` when asked), `content_block_stop`,
`message_delta` (`stop_reason`: `max_tokens` or `end_turn`; usage.output_tokens),
`message_stop`. Errors: `{"type": "error", "error": {"type": ..., "message": ...}}`, with
Anthropic's error types by status.
"""

from __future__ import annotations

from typing import Any, Literal

from cbbench.reference_engine.server import protocol as P
from cbbench.reference_engine.server.errors import APIError
from cbbench.reference_engine.server.serving import Delta, Generation
from pydantic import Field

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}
STOP_REASONS = {"length": "max_tokens", "stop": "end_turn"}


def error_body(status: int, message: str) -> dict[str, Any]:
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def from_api_error(exc: APIError) -> dict[str, Any]:
    return error_body(exc.status_code, exc.message)


class TextBlock(P._Strict):
    type: Literal["text"]
    text: P.Text


class Message(P._Strict):
    role: Literal["user", "assistant"]
    content: P.Text | list[TextBlock]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(b.text for b in self.content)


class MessagesRequest(P.ChatCompletionRequest):
    messages: list[Message] = Field(..., min_length=1)  # type: ignore[assignment]
    max_tokens: int = Field(..., ge=1)  # required, as Anthropic's API has it
    system: P.Text | list[TextBlock] | None = None
    stop_sequences: list[P.Text] | None = None
    cbbench_send_times: bool = False  # timing check: t_send_ns per delta, t_recv_ns at the end

    def conversation(self) -> list[tuple[str, str]]:
        if self.stop_sequences:
            self.stop = self.stop_sequences
        turns: list[tuple[str, str]] = []
        if self.system:
            text = (
                self.system
                if isinstance(self.system, str)
                else "".join(b.text for b in self.system)
            )
            turns.append(("system", text))
        return turns + [(m.role, m.text()) for m in self.messages]


class MessagesShaper:
    """A Generation's deltas as Messages events, and its whole body."""

    def __init__(self, gen: Generation, model: str, body: MessagesRequest) -> None:
        self.gen = gen
        self.model = model
        self.body = body
        self.id = "msg_" + gen.request_id.split("-", 1)[-1]
        self.stamps: dict[str, int] = {}  # cbbench_send_times: the request's arrival (api_routes)

    def _message(self, done: bool) -> dict[str, Any]:
        gen = self.gen
        m = gen.metrics
        usage = {
            "input_tokens": len(gen.prompt_token_ids),
            "output_tokens": len(gen.token_ids),
            "cache_read_input_tokens": m.num_cached_tokens if m is not None else 0,
        }
        out: dict[str, Any] = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [{"type": "text", "text": gen.text}] if done else [],
            "stop_reason": STOP_REASONS.get(gen.finish_reason or "") if done else None,
            "stop_sequence": None,
            "usage": usage,
        }
        if done:
            out["cbbench"] = {**gen.cbbench_field(), **self.stamps}
        return out

    def start(self) -> list[dict[str, Any]]:
        return [
            {"type": "message_start", "message": self._message(False)},
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ]

    def delta(self, d: Delta) -> dict[str, Any]:
        ev: dict[str, Any] = {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": d.text},
        }
        if self.body.return_token_ids:
            ev["token_ids"] = d.token_ids
        return ev

    def end(self) -> list[dict[str, Any]]:
        reason = STOP_REASONS.get(self.gen.finish_reason or "", "end_turn")
        return [
            {"type": "content_block_stop", "index": 0},
            {
                "type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": None},
                "usage": {"output_tokens": len(self.gen.token_ids)},
                "cbbench": {**self.gen.cbbench_field(), **self.stamps},
            },
            {"type": "message_stop"},
        ]

    def final_body(self) -> dict[str, Any]:
        return self._message(True)
