"""Anthropic's Messages API (`/v1/messages`): the request as a chat request, the output as
Messages events and bodies, errors in Anthropic's shape.

The request: `messages` (user / assistant turns, content a string or `text` blocks),
`system` (a system message first), `max_tokens` (required), `stop_sequences`, `temperature`,
`top_p`, `top_k`, and vLLM's extensions (`ignore_eos`, `min_tokens`, `priority`,
`return_token_ids`). The conversation goes through the chat template exactly as
/v1/chat/completions does, so greedy text is the chat endpoint's. Tools are not run: an
agent's earlier turns (`tool_use` / `tool_result` blocks, `tools` with `input_schema`) are
rendered as chat's `tool_calls`, `tool` messages and tools (`tools.py`).

Streaming (each SSE event named by an `event:` line, as Anthropic's SDK reads them):
`message_start` (usage.input_tokens), `content_block_start`, one `content_block_delta`
(`text_delta`) per engine output (with `token_ids` when asked), `content_block_stop`,
`message_delta` (`stop_reason`: `max_tokens` or `end_turn`; usage.output_tokens),
`message_stop`. Errors: `{"type": "error", "error": {"type": ..., "message": ...}}`, with
Anthropic's error types by status.

Thinking (`cbbench serve --reasoning-parser`, the chat endpoint's split rule in
`reasoning.py`): the output's reasoning part streams as a `thinking` content block first
(`content_block_start` type thinking, one `thinking_delta` per engine output or part of one,
`content_block_stop`), then the text block at index 1; a body holds a thinking block then the
text block. `thinking: {"type": "disabled"}` turns reasoning off for the request (chat's
`enable_thinking: false`); `{"type": "enabled", "budget_tokens": N}` caps the rule's budget
at N tokens. The Messages API has no reasoning-token count in its usage (output_tokens counts
both): a client counts the thinking block's tokens, from the deltas' `token_ids` in a stream
and, in a body asked with `return_token_ids`, from each content block's own `token_ids` (the
thinking block's, then the text block's: the output's ids split where the answer starts).
With `--reasoning-field content` the reasoning stays inline (`<think>`) in the text.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from cbbench.reference_engine.server import protocol as P
from cbbench.reference_engine.server.errors import APIError
from cbbench.reference_engine.server.serving import Delta, Generation
from cbbench.reference_engine.server.tools import check_tool_messages, render_messages
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


class ToolUseBlock(P._Strict):  # an earlier turn's tool call (the client ran it)
    type: Literal["tool_use"]
    id: P.Text = Field(..., min_length=1, max_length=256)
    name: P.Text = Field(..., max_length=256)
    input: dict[str, Any]


class ToolResultBlock(P._Strict):  # its result
    type: Literal["tool_result"]
    tool_use_id: P.Text = Field(..., min_length=1, max_length=256)
    content: P.Text | list[TextBlock] = ""
    is_error: bool = False

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(
            b.text for b in self.content
        )  # fmt: skip


Block = TextBlock | ToolUseBlock | ToolResultBlock


class Message(P._Strict):
    role: Literal["user", "assistant"]
    content: P.Text | list[Block]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))

    def chat(self) -> list[P.ChatMessage]:
        """This message as chat messages: its tool results as `tool` messages (first), its
        text, and its tool uses as the assistant's `tool_calls`."""
        blocks = [] if isinstance(self.content, str) else self.content
        out = [P.ChatMessage(role="tool", tool_call_id=b.tool_use_id, content=b.text())
               for b in blocks if isinstance(b, ToolResultBlock)]  # fmt: skip
        calls = [
            P.ToolCallItem(id=b.id, function=P.ToolCallFunction(
                name=b.name, arguments=json.dumps(b.input)))
            for b in blocks if isinstance(b, ToolUseBlock)
        ]  # fmt: skip
        text = self.text()
        if text or calls or not out:
            out.append(P.ChatMessage(role=self.role, content=text, tool_calls=calls or None))
        return out


def chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic tool (`input_schema`) in chat's shape (the prompt renders as chat's)."""
    if "input_schema" not in tool:
        return tool
    fn = {"name": tool.get("name"), "description": tool.get("description"),
          "parameters": tool["input_schema"]}  # fmt: skip
    return {"type": "function", "function": {k: v for k, v in fn.items() if v is not None}}


class Thinking(P._Strict):
    type: Literal["enabled", "disabled"]
    budget_tokens: int | None = Field(None, ge=1)


class MessagesRequest(P.ChatCompletionRequest):
    messages: list[Message] = Field(..., min_length=1)  # type: ignore[assignment]
    max_tokens: int = Field(..., ge=1)  # required, as Anthropic's API has it
    system: P.Text | list[TextBlock] | None = None
    stop_sequences: list[P.Text] | None = None
    thinking: Thinking | None = None
    cbbench_send_times: bool = False  # timing check: t_send_ns per delta, t_recv_ns at the end

    def conversation(self) -> list[tuple[str, str]]:
        if self.stop_sequences:
            self.stop = self.stop_sequences
        if self.thinking is not None and self.thinking.type == "disabled":
            self.chat_template_kwargs = {**(self.chat_template_kwargs or {}),
                                         "enable_thinking": False}  # fmt: skip
        msgs: list[P.ChatMessage] = []
        if self.system:
            text = (
                self.system
                if isinstance(self.system, str)
                else "".join(b.text for b in self.system)
            )
            msgs.append(P.ChatMessage(role="system", content=text))
        for m in self.messages:
            msgs += m.chat()
        self.messages = msgs  # type: ignore[assignment]  # rendered as chat's
        self.tools = [chat_tool(t) for t in self.tools] if self.tools else None
        check_tool_messages(msgs)
        return render_messages(self)

    def thinking_budget(self) -> int | None:
        """`thinking.budget_tokens`: at most this many reasoning tokens (None: the rule's)."""
        t = self.thinking
        return t.budget_tokens if t is not None and t.type == "enabled" else None


class MessagesShaper:
    """A Generation's deltas as Messages events, and its whole body: the thinking block
    (index 0, when the split has one) then the text block; `block` is the one streamed."""

    def __init__(self, gen: Generation, model: str, body: MessagesRequest) -> None:
        self.gen = gen
        self.model = model
        self.body = body
        self.id = "msg_" + gen.request_id.split("-", 1)[-1]
        self.thinks = gen.reasoning is not None and gen.reasoning.separate
        self.block = "thinking" if self.thinks else "text"
        self.stamps: dict[str, int] = {}  # cbbench_send_times: the request's arrival (api_routes)

    def _texts(self) -> tuple[str, str]:
        """(thinking, answer) text so far; `--reasoning-field content`: inline, all answer."""
        r = self.gen.reasoning
        if r is None:
            return "", self.gen.text
        m = r.message()
        return (m[r.where] or "") if self.thinks else "", m["content"] or ""

    def _message(self, done: bool) -> dict[str, Any]:
        gen = self.gen
        m = gen.metrics
        usage = {
            "input_tokens": len(gen.prompt_token_ids),
            "output_tokens": len(gen.token_ids),
            "cache_read_input_tokens": m.num_cached_tokens if m is not None else 0,
        }
        think, answer = self._texts()
        content: list[dict[str, Any]] = [{"type": "text", "text": answer}]
        if self.thinks:
            content.insert(0, {"type": "thinking", "thinking": think, "signature": ""})
        if done and self.body.return_token_ids:  # each block its own ids, as a stream's deltas
            r = gen.reasoning.reasoning_tokens if self.thinks and gen.reasoning else 0
            ids = [gen.token_ids[:r], gen.token_ids[r:]] if self.thinks else [gen.token_ids]
            for block, block_ids in zip(content, ids, strict=True):
                block["token_ids"] = list(block_ids)
        out: dict[str, Any] = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content if done else [],
            "stop_reason": STOP_REASONS.get(gen.finish_reason or "") if done else None,
            "stop_sequence": None,
            "usage": usage,
        }
        if done:
            out["cbbench"] = {**gen.cbbench_field(), **self.stamps}
        return out

    def _start_block(self) -> dict[str, Any]:
        block: dict[str, Any] = {"type": "text", "text": ""}
        if self.block == "thinking":
            block = {"type": "thinking", "thinking": "", "signature": ""}
        return {"type": "content_block_start", "index": self._index(), "content_block": block}

    def _index(self) -> int:
        return 1 if self.thinks and self.block == "text" else 0

    def _switch(self) -> list[dict[str, Any]]:
        """Close the thinking block, open the text block."""
        stop = {"type": "content_block_stop", "index": 0}
        self.block = "text"
        return [stop, self._start_block()]

    def start(self) -> list[dict[str, Any]]:
        return [{"type": "message_start", "message": self._message(False)}, self._start_block()]

    def events(self, d: Delta) -> list[dict[str, Any]]:
        """The events of one delta: one, or (reasoning split) one per kind it holds, the
        thinking block closed and the text block opened where the answer starts."""
        if d.parts is None:
            return [self.delta(d)]
        if not self.thinks:  # inline: the parts' text carries the <think> tags
            return [self.delta(Delta("".join(t for _, t, _ in d.parts), d.token_ids, None))]
        out: list[dict[str, Any]] = []
        at = 0
        for key, text, k in d.parts:
            if key == "content" and self.block == "thinking":
                out += self._switch()
            out.append(self.delta(Delta(text, d.token_ids[at : at + k], None)))
            at += k
        return out

    def delta(self, d: Delta) -> dict[str, Any]:
        if self.block == "thinking":
            delta = {"type": "thinking_delta", "thinking": d.text}
        else:
            delta = {"type": "text_delta", "text": d.text}
        ev: dict[str, Any] = {"type": "content_block_delta", "index": self._index(), "delta": delta}
        if self.body.return_token_ids:
            ev["token_ids"] = d.token_ids
        return ev

    def end(self) -> list[dict[str, Any]]:
        reason = STOP_REASONS.get(self.gen.finish_reason or "", "end_turn")
        blocks = self._switch() if self.block == "thinking" else []  # ended while thinking
        return [
            *blocks,
            {"type": "content_block_stop", "index": self._index()},
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
