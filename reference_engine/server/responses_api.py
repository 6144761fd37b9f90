"""OpenAI's Responses API (`/v1/responses`): the request as a chat request, the output as
Responses events and bodies.

The request: `input` (a string, or role/content messages whose content is a string or
`input_text` / `output_text` parts), `instructions` (a system message first),
`max_output_tokens`, and the sampling fields chat takes (with vLLM's extensions: `ignore_eos`,
`min_tokens`, `priority`, `return_token_ids`). The conversation goes through the chat
template exactly as /v1/chat/completions does, so greedy text is the chat endpoint's. The
server keeps no state: `previous_response_id` and `store` are refused (400). Tools are not
run: an agent's earlier turns (`function_call` / `function_call_output` items, flat `tools`)
are rendered as chat's `tool_calls`, `tool` messages and tools (`tools.py`).

Streaming: `response.created`, `response.in_progress`, `response.output_item.added`,
`response.content_part.added`, one `response.output_text.delta` per engine output (with
`token_ids` when asked), then the `.done` events and `response.completed` (status
`incomplete`, reason `max_output_tokens`, when cut at the limit) with usage in the Responses
names (`input_tokens`, `output_tokens`, `output_tokens_details.reasoning_tokens`).

Reasoning (`cbbench serve --reasoning-parser`, the chat endpoint's split rule in
`reasoning.py`; `reasoning: {"effort": ...}` is chat's `reasoning_effort`): the output's
reasoning part is a `reasoning` output item first (`response.output_item.added`,
`response.content_part.added` with a `reasoning_text` part, one
`response.reasoning_text.delta` per engine output or part of one, the `.done` events), then
the message item at output index 1; a body holds both items, and usage counts the reasoning
tokens. With `--reasoning-field content` the reasoning stays inline (`<think>`) in the text.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from cbbench.reference_engine.server import protocol as P
from cbbench.reference_engine.server.errors import bad_request
from cbbench.reference_engine.server.serving import Delta, Generation
from cbbench.reference_engine.server.tools import check_tool_messages, render_messages
from pydantic import Field


class InputPart(P._Strict):
    type: Literal["input_text", "output_text", "text"]
    text: P.Text


class InputMessage(P._Strict):
    type: Literal["message"] | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: P.Text | list[InputPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class FunctionCall(P._Strict):  # an earlier turn's tool call (the client ran it)
    type: Literal["function_call"]
    call_id: P.Text = Field(..., min_length=1, max_length=256)
    name: P.Text = Field(..., max_length=256)
    arguments: P.Text
    id: P.Text | None = None
    status: P.Text | None = None


class FunctionCallOutput(P._Strict):  # its result
    type: Literal["function_call_output"]
    call_id: P.Text = Field(..., min_length=1, max_length=256)
    output: P.Text
    id: P.Text | None = None
    status: P.Text | None = None


def chat_messages(items: list[InputMessage | FunctionCall | FunctionCallOutput]) -> list:
    """Input items as chat messages: a `function_call` joins the assistant message before it
    (or starts one), a `function_call_output` is a `tool` message naming the call."""
    roles = {"developer": "system"}
    out: list[P.ChatMessage] = []
    for it in items:
        if isinstance(it, InputMessage):
            out.append(P.ChatMessage(role=roles.get(it.role, it.role), content=it.text()))
        elif isinstance(it, FunctionCall):
            fn = P.ToolCallFunction(name=it.name, arguments=it.arguments)
            if not out or out[-1].role != "assistant":
                out.append(P.ChatMessage(role="assistant", tool_calls=[]))
            out[-1].tool_calls = [*(out[-1].tool_calls or []),
                                  P.ToolCallItem(id=it.call_id, function=fn)]  # fmt: skip
        else:
            out.append(P.ChatMessage(role="tool", tool_call_id=it.call_id, content=it.output))
    return out


def chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A flat Responses tool in chat's shape (so the prompt renders as chat's does)."""
    if tool.get("type") != "function" or "function" in tool:
        return tool
    return {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}


class Reasoning(P._Strict):
    effort: Literal["minimal", "low", "medium", "high"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None  # accepted; none is written


class ResponsesRequest(P.ChatCompletionRequest):
    messages: list[P.ChatMessage] = Field(default_factory=list)  # built from `input`
    input: P.Text | list[InputMessage | FunctionCall | FunctionCallOutput] = Field(
        ..., min_length=1
    )
    instructions: P.Text | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    previous_response_id: P.Text | None = None
    store: bool = False
    reasoning: Reasoning | None = None
    cbbench_send_times: bool = False  # timing check: t_send_ns per delta, t_recv_ns at the end

    def conversation(self) -> list[tuple[str, str]]:
        """The (role, text) list the chat template renders; `max_tokens` from
        `max_output_tokens`."""
        if self.previous_response_id is not None:
            raise bad_request(
                "previous_response_id: this server keeps no responses; send the whole "
                "conversation in `input`",
                "previous_response_id",
            )
        if self.store:
            raise bad_request("store: this server keeps no responses", "store")
        self.max_tokens = self.max_output_tokens
        if self.reasoning is not None and self.reasoning.effort is not None:
            self.reasoning_effort = self.reasoning.effort
        head = [P.ChatMessage(role="system", content=self.instructions)]
        if isinstance(self.input, str):
            items = [P.ChatMessage(role="user", content=self.input)]
        else:
            items = chat_messages(self.input)
        self.messages = head + items if self.instructions else items
        self.tools = [chat_tool(t) for t in self.tools] if self.tools else None
        check_tool_messages(self.messages)
        return render_messages(self)


def _usage(gen: Generation) -> dict[str, Any]:
    m = gen.metrics
    n_in, n_out = len(gen.prompt_token_ids), len(gen.token_ids)
    return {
        "input_tokens": n_in,
        "input_tokens_details": {"cached_tokens": m.num_cached_tokens if m is not None else 0},
        "output_tokens": n_out,
        "output_tokens_details": {
            "reasoning_tokens": gen.reasoning.reasoning_tokens if gen.reasoning else 0
        },
        "total_tokens": n_in + n_out,
    }


def _thinks(gen: Generation) -> bool:
    """Whether the output's reasoning goes in a reasoning item (not inline in the text)."""
    return gen.reasoning is not None and gen.reasoning.separate


class ResponsesShaper:
    """A Generation's deltas as Responses events, and its whole body. Output items in order:
    the reasoning item (when the split has one) then the message item; `open` is the one
    being streamed."""

    def __init__(self, gen: Generation, model: str, body: ResponsesRequest) -> None:
        self.gen = gen
        self.model = model
        self.body = body
        self.created = int(time.time())
        hex_id = gen.request_id.split("-", 1)[-1]
        self.item_id = "msg_" + hex_id
        self.rs_id = "rs_" + hex_id
        self.msg_index = 1 if _thinks(gen) else 0
        self.open: str | None = None  # "reasoning" | "message" | None (none yet, or closed)
        self.seq = 0
        self.stamps: dict[str, int] = {}  # cbbench_send_times: the request's arrival (api_routes)

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        self.seq += 1
        return {"type": kind, "sequence_number": self.seq - 1, **fields}

    def response(self, done: bool) -> dict[str, Any]:
        gen = self.gen
        status = "in_progress"
        if done:
            status = "incomplete" if gen.finish_reason == "length" else "completed"
        output = [self._item(done)]
        if _thinks(gen):
            output.insert(0, self._reasoning_item(done))
        out: dict[str, Any] = {
            "id": gen.request_id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.model,
            "output": output if done else [],
            "incomplete_details": (
                {"reason": "max_output_tokens"} if status == "incomplete" else None
            ),
            "instructions": self.body.instructions,
            "max_output_tokens": self.body.max_output_tokens,
            "parallel_tool_calls": False,
            "temperature": self.body.temperature,
            "top_p": self.body.top_p,
            "tool_choice": "none",
            "tools": [],
            "usage": _usage(gen) if done else None,
            "error": None,
        }
        if self.body.reasoning is not None:
            out["reasoning"] = {"effort": self.body.reasoning.effort, "summary": None}
        if done:
            out["cbbench"] = {**gen.cbbench_field(), **self.stamps}
        return out

    def _texts(self) -> tuple[str, str]:
        """(reasoning, answer) text so far; `--reasoning-field content`: inline, all answer."""
        r = self.gen.reasoning
        if r is None:
            return "", self.gen.text
        m = r.message()
        return (m[r.where] or "") if _thinks(self.gen) else "", m["content"] or ""

    def _part(self, text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": []}

    def _item(self, done: bool) -> dict[str, Any]:
        return {
            "id": self.item_id,
            "type": "message",
            "status": "completed" if done else "in_progress",
            "role": "assistant",
            "content": [self._part(self._texts()[1])] if done else [],
        }

    def _reasoning_item(self, done: bool) -> dict[str, Any]:
        content = [{"type": "reasoning_text", "text": self._texts()[0]}] if done else []
        return {
            "id": self.rs_id,
            "type": "reasoning",
            "status": "completed" if done else "in_progress",
            "summary": [],
            "content": content,
        }

    def _open(self, kind: str) -> list[dict[str, Any]]:
        self.open = kind
        if kind == "reasoning":
            at = {"item_id": self.rs_id, "output_index": 0, "content_index": 0}
            part = {"type": "reasoning_text", "text": ""}
            item = self._reasoning_item(False)
        else:
            at = {"item_id": self.item_id, "output_index": self.msg_index, "content_index": 0}
            part, item = self._part(""), self._item(False)
        return [
            self._event("response.output_item.added", output_index=at["output_index"], item=item),
            self._event("response.content_part.added", **at, part=part),
        ]

    def _close(self) -> list[dict[str, Any]]:
        kind, self.open = self.open, None
        think, answer = self._texts()
        if kind == "reasoning":
            at = {"item_id": self.rs_id, "output_index": 0, "content_index": 0}
            part = {"type": "reasoning_text", "text": think}
            return [
                self._event("response.reasoning_text.done", **at, text=think),
                self._event("response.content_part.done", **at, part=part),
                self._event("response.output_item.done", output_index=0,
                            item=self._reasoning_item(True)),
            ]  # fmt: skip
        at = {"item_id": self.item_id, "output_index": self.msg_index, "content_index": 0}
        return [
            self._event("response.output_text.done", **at, text=answer, logprobs=[]),
            self._event("response.content_part.done", **at, part=self._part(answer)),
            self._event("response.output_item.done", output_index=self.msg_index,
                        item=self._item(True)),
        ]  # fmt: skip

    def start(self) -> list[dict[str, Any]]:
        return [
            self._event("response.created", response=self.response(False)),
            self._event("response.in_progress", response=self.response(False)),
            *self._open("reasoning" if _thinks(self.gen) else "message"),
        ]

    def events(self, d: Delta) -> list[dict[str, Any]]:
        """The events of one delta: one, or (reasoning split) one per kind it holds, the
        reasoning item closed and the message item opened where the answer starts."""
        if d.parts is None:
            return [self.delta(d)]
        if not _thinks(self.gen):  # inline: the parts' text carries the <think> tags
            return [self.delta(Delta("".join(t for _, t, _ in d.parts), d.token_ids, None))]
        out, at = [], 0
        for key, text, k in d.parts:
            part = Delta(text, d.token_ids[at : at + k], None)
            at += k
            if key == "content" and self.open == "reasoning":
                out += self._close() + self._open("message")
            out.append(self.delta(part, reasoning=key != "content"))
        return out

    def delta(self, d: Delta, reasoning: bool = False) -> dict[str, Any]:
        if reasoning:
            ev = self._event(
                "response.reasoning_text.delta",
                item_id=self.rs_id,
                output_index=0,
                content_index=0,
                delta=d.text,
            )
        else:
            ev = self._event(
                "response.output_text.delta",
                item_id=self.item_id,
                output_index=self.msg_index,
                content_index=0,
                delta=d.text,
                logprobs=[],
            )
        if self.body.return_token_ids:
            ev["token_ids"] = d.token_ids
        return ev

    def end(self) -> list[dict[str, Any]]:
        ended_in = self.open
        out = self._close()
        if ended_in == "reasoning":  # the output ended inside its reasoning: an empty answer
            out += self._open("message") + self._close()
        return [*out, self._event("response.completed", response=self.response(True))]

    def final_body(self) -> dict[str, Any]:
        return self.response(True)
