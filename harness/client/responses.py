"""OpenAI's Responses API (`/v1/responses`) on the client's one fast path.

The request: `input` (the prompt text, or a session's whole conversation as role/content
messages: full input every turn, never `previous_response_id`), `max_output_tokens`, `stream`.

The stream's events, folded as chat chunks (`endpoints.py`) so the stream classifier times
them as every other API's:
- `response.output_text.delta` -> answer text (`delta.content`);
- `response.reasoning_text.delta`, `response.reasoning_summary_text.delta` -> reasoning
  (`delta.reasoning`);
- `response.function_call_arguments.delta` -> tool-call arguments (`delta.tool_calls`);
- `response.completed` / `response.incomplete` -> the end, with `usage` (`input_tokens`,
  `output_tokens`, `output_tokens_details.reasoning_tokens`, `input_tokens_details.
  cached_tokens`) and the finish reason (`length` when cut at `max_output_tokens`);
- `response.failed` and `error` -> the request fails with the server's message;
- every other event (created, in_progress, output_item.*, content_part.*, *.done) carries no
  token. An event whose delta is not a string, or with no `type`, fails the request
  (`protocol`).
One delta event is one token unless it carries `token_ids` (an extension, counted exactly).

Agent steps (`load/agent.py` builds them chat-shaped) in the Responses API's own shapes: an
assistant message's `tool_calls` become `function_call` input items (`call_id`, `name`,
`arguments`) after its text, a `tool` message a `function_call_output` item naming the call,
and `tools` the flat function shape (`{"type": "function", "name", "description",
"parameters"}`).
"""

from __future__ import annotations

from cbbench.harness.client.response import ERROR_TEXT_LIMIT, RequestFailed

END_EVENT = "response.completed"
_TEXT = "response.output_text.delta"
_REASONING = ("response.reasoning_text.delta", "response.reasoning_summary_text.delta")
_TOOL = "response.function_call_arguments.delta"


def input_items(messages: list[dict]) -> list[dict]:
    """A chat message list (with tool calls and results) as Responses input items."""
    items: list[dict] = []
    for m in messages:
        role = m.get("role")
        if role == "tool":
            items.append({"type": "function_call_output", "call_id": m.get("tool_call_id"),
                          "output": m.get("content") or ""})  # fmt: skip
            continue
        if m.get("content") or not m.get("tool_calls"):
            items.append({"role": role, "content": m.get("content") or ""})
        for call in m.get("tool_calls") or []:
            fn = call.get("function") or {}
            items.append({"type": "function_call", "call_id": call.get("id"),
                          "name": fn.get("name"), "arguments": fn.get("arguments") or ""})  # fmt: skip
    return items


def flat_tool(tool: dict) -> dict:
    """A chat tool (`{"type": "function", "function": {...}}`) in the Responses' flat shape."""
    fn = tool.get("function")
    return {"type": tool.get("type", "function"), **fn} if isinstance(fn, dict) else tool


def payload(cfg, prompt, rec) -> dict:
    if isinstance(prompt, dict):  # an agent step: {"messages": [...], "tools": [...]}
        body = payload(cfg, input_items(prompt["messages"]), rec)
        if prompt.get("tools"):
            body["tools"] = [flat_tool(t) for t in prompt["tools"]]
        return body
    body: dict = {
        "model": cfg.model,
        "input": prompt if isinstance(prompt, str | list) else str(prompt),
        "max_output_tokens": rec.output_len,
        "stream": cfg.stream,
    }
    if cfg.extensions:
        body.update(ignore_eos=True, min_tokens=rec.output_len, return_token_ids=True)
        if rec.priority:
            body["priority"] = rec.priority
    return body


def usage(u) -> dict | None:
    """A Responses `usage` in chat's names."""
    if not isinstance(u, dict):
        return None
    out: dict = {
        "prompt_tokens": u.get("input_tokens"),
        "completion_tokens": u.get("output_tokens"),
    }
    details = u.get("output_tokens_details")
    if isinstance(details, dict) and "reasoning_tokens" in details:
        out["completion_tokens_details"] = {"reasoning_tokens": details["reasoning_tokens"]}
    details = u.get("input_tokens_details")
    if isinstance(details, dict) and details.get("cached_tokens") is not None:
        out["prompt_tokens_details"] = {"cached_tokens": details["cached_tokens"]}
    return out


def _finish(resp: dict) -> str:
    if resp.get("status") == "incomplete":
        why = (resp.get("incomplete_details") or {}).get("reason")
        return "length" if why in (None, "max_output_tokens") else str(why)
    items = resp.get("output")
    if isinstance(items, list) and any(
        isinstance(i, dict) and i.get("type") == "function_call" for i in items
    ):
        return "tool_calls"
    return "stop"


def _chunk(delta: dict, ev: dict) -> dict:
    choice: dict = {"index": 0, "delta": delta}
    if "token_ids" in ev:
        choice["token_ids"] = ev["token_ids"]
    chunk: dict = {"choices": [choice]}
    if "t_send_ns" in ev:  # the reference engine's timing check (cbbench_send_times)
        chunk["t_send_ns"] = ev["t_send_ns"]
    return chunk


def _failed(ev: dict) -> RequestFailed:
    err = ev.get("error") or (ev.get("response") or {}).get("error") or ev
    msg = err.get("message", err) if isinstance(err, dict) else err
    return RequestFailed("server_error", f"error in stream: {str(msg)[:ERROR_TEXT_LIMIT]}")


def event(ev: dict, state: dict) -> dict | None:
    """One stream event -> a chat chunk to fold (None: it carries nothing)."""
    kind = ev.get("type")
    if not isinstance(kind, str):
        raise RequestFailed("protocol", f"Responses event without a type: {str(ev)[:80]}")
    if kind in (_TEXT, _TOOL) or kind in _REASONING:
        text = ev.get("delta")
        if not isinstance(text, str):
            raise RequestFailed("protocol", f"{kind}: delta is not a string")
        if kind == _TEXT:
            return _chunk({"content": text}, ev)
        if kind == _TOOL:
            call = {"index": 0, "function": {"arguments": text}}
            return _chunk({"tool_calls": [call]}, ev)
        return _chunk({"reasoning": text}, ev)
    if kind in ("response.completed", "response.incomplete"):
        resp = ev.get("response")
        if not isinstance(resp, dict):
            raise RequestFailed("protocol", f"{kind}: no response object")
        state["done"] = True
        chunk: dict = {"choices": [{"index": 0, "delta": {}, "finish_reason": _finish(resp)}]}
        u = usage(resp.get("usage"))
        if u is not None:
            chunk["usage"] = u
        if "cbbench" in resp:  # the reference engine's per-request report (queue time)
            chunk["cbbench"] = resp["cbbench"]
        return chunk
    if kind in ("response.failed", "error"):
        raise _failed(ev)
    return None


def body(obj: dict, state: dict) -> dict:
    """A whole (non-streamed) response -> a chat completion to fold."""
    if obj.get("status") == "failed" or obj.get("error"):
        raise _failed(obj)
    items = obj.get("output")
    if not isinstance(items, list):
        raise RequestFailed("protocol", "Responses body without an output list")
    text, reasoning, calls = [], [], []
    for item in items:
        if not isinstance(item, dict):
            raise RequestFailed("protocol", "Responses output item is not an object")
        kind = item.get("type")
        if kind == "message":
            text += [p.get("text") or "" for p in item.get("content") or [] if isinstance(p, dict)]
        elif kind == "reasoning":
            parts = (item.get("content") or []) + (item.get("summary") or [])
            reasoning += [p.get("text") or "" for p in parts if isinstance(p, dict)]
        elif kind == "function_call":
            calls.append({"index": len(calls), "function": {"arguments": item.get("arguments")}})
    msg: dict = {"role": "assistant", "content": "".join(text) or None}
    if reasoning:
        msg["reasoning"] = "".join(reasoning)
    if calls:
        msg["tool_calls"] = calls
    out: dict = {"choices": [{"index": 0, "message": msg, "finish_reason": _finish(obj)}]}
    u = usage(obj.get("usage"))
    if u is not None:
        out["usage"] = u
    if "cbbench" in obj:
        out["cbbench"] = obj["cbbench"]
    return out


class _Adapter:
    end_event = END_EVENT
    payload = staticmethod(payload)
    event = staticmethod(event)
    body = staticmethod(body)
    finish = None


ADAPTER = _Adapter()
