"""Anthropic's Messages API (`/v1/messages`) on the client's one fast path.

The request: `messages` (the prompt as one user message, or a session's whole conversation),
`max_tokens`, `stream`; headers `x-api-key` (from `--api-key`) and `anthropic-version`
(`endpoints.auth_headers`).

The stream's events, folded as chat chunks (`endpoints.py`):
- `message_start` -> `usage.input_tokens` (and `cache_read_input_tokens`);
- `content_block_delta` with `text_delta` -> answer text, `thinking_delta` -> reasoning,
  `input_json_delta` -> tool-call arguments (`signature_delta` carries no token);
- `message_delta` -> `stop_reason` (`max_tokens` -> `length`, `end_turn` / `stop_sequence`
  -> `stop`, `tool_use` -> `tool_calls`) and `usage.output_tokens` (cumulative);
- `message_stop` -> the end; `error` -> the request fails with the server's message;
- `ping`, `content_block_start` / `_stop` carry no token. A delta of an unknown type, or
  whose text is not a string, fails the request (`protocol`).
The Messages API reports no reasoning-token count: thinking tokens are counted, in a stream
from its thinking deltas (one token each, or their `token_ids`), in a whole message from its
thinking blocks' `token_ids` (the reference engine's `return_token_ids`, the stream's own
ids), passed on as `completion_tokens_details.reasoning_tokens`. A body with thinking text
and no ids leaves the count unknown (None), as chat's does without usage details.

Agent steps (`load/agent.py` builds them chat-shaped) in the Messages API's own shapes: the
`system` message becomes the `system` field, an assistant message's `tool_calls` become
`tool_use` content blocks (`id`, `name`, `input`: the arguments parsed) after its text, `tool`
messages `tool_result` blocks (naming the call) of one user message, and `tools` Anthropic's
shape (`{"name", "description", "input_schema"}`).
"""

from __future__ import annotations

import json

from cbbench.harness.client.response import ERROR_TEXT_LIMIT, RequestFailed

END_EVENT = "message_stop"
STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
}
_DELTAS = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json"}


def _input(arguments: str) -> dict:
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {"arguments": arguments}  # not JSON: sent as a string, not lost
    return value if isinstance(value, dict) else {"arguments": value}


def agent_messages(messages: list[dict]) -> tuple[str | None, list[dict]]:
    """A chat message list (with tool calls and results) as (system, Messages messages)."""
    system = [m.get("content") or "" for m in messages if m.get("role") == "system"]
    out: list[dict] = []
    for m in messages:
        role = m.get("role")
        if role == "system":
            continue
        if role == "tool":
            block = {"type": "tool_result", "tool_use_id": m.get("tool_call_id"),
                     "content": m.get("content") or ""}  # fmt: skip
            if out and out[-1]["role"] == "user" and isinstance(out[-1]["content"], list):
                out[-1]["content"].append(block)  # results of one turn: one user message
            else:
                out.append({"role": "user", "content": [block]})
            continue
        if role == "assistant" and m.get("tool_calls"):
            blocks = [{"type": "text", "text": m["content"]}] if m.get("content") else []
            for call in m["tool_calls"]:
                fn = call.get("function") or {}
                blocks.append({"type": "tool_use", "id": call.get("id"), "name": fn.get("name"),
                               "input": _input(fn.get("arguments") or "")})  # fmt: skip
            out.append({"role": "assistant", "content": blocks})
            continue
        out.append({"role": role, "content": m.get("content") or ""})
    return ("\n\n".join(system) if system else None), out


def anthropic_tool(tool: dict) -> dict:
    """A chat tool (`{"type": "function", "function": {...}}`) in Anthropic's shape."""
    fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
    out = {"name": fn.get("name"), "input_schema": fn.get("parameters") or {"type": "object"}}
    if fn.get("description"):
        out["description"] = fn["description"]
    return out


def payload(cfg, prompt, rec) -> dict:
    if isinstance(prompt, dict):  # an agent step: {"messages": [...], "tools": [...]}
        system, messages = agent_messages(prompt["messages"])
        body = payload(cfg, messages, rec)
        if system is not None:
            body["system"] = system
        if prompt.get("tools"):
            body["tools"] = [anthropic_tool(t) for t in prompt["tools"]]
        return body
    is_messages = isinstance(prompt, list) and prompt and isinstance(prompt[0], dict)
    body: dict = {
        "model": cfg.model,
        "max_tokens": rec.output_len,
        "messages": prompt if is_messages else [{"role": "user", "content": prompt}],
        "stream": cfg.stream,
    }
    if cfg.extensions:
        body.update(ignore_eos=True, min_tokens=rec.output_len, return_token_ids=True)
        if rec.priority:
            body["priority"] = rec.priority
    return body


def usage(u, state: dict) -> dict | None:
    """An Anthropic `usage` in chat's names (input tokens kept from `message_start`)."""
    if not isinstance(u, dict):
        return None
    prompt = u.get("input_tokens")
    if prompt is None:
        prompt = state.get("usage_prompt")
    out: dict = {"prompt_tokens": prompt}
    if "output_tokens" in u:
        out["completion_tokens"] = u["output_tokens"]
    if u.get("cache_read_input_tokens") is not None:
        out["prompt_tokens_details"] = {"cached_tokens": u["cache_read_input_tokens"]}
    return out


def _failed(ev: dict) -> RequestFailed:
    err = ev.get("error", ev)
    msg = err.get("message", err) if isinstance(err, dict) else err
    return RequestFailed("server_error", f"error in stream: {str(msg)[:ERROR_TEXT_LIMIT]}")


def event(ev: dict, state: dict) -> dict | None:
    """One stream event -> a chat chunk to fold (None: it carries nothing)."""
    kind = ev.get("type")
    if kind == "content_block_delta":
        delta = ev.get("delta")
        dkind = delta.get("type") if isinstance(delta, dict) else None
        if dkind == "signature_delta":
            return None
        key = _DELTAS.get(dkind)
        if key is None or not isinstance(delta.get(key), str):
            raise RequestFailed("protocol", f"content_block_delta: bad delta {str(delta)[:80]}")
        text = delta[key]
        if key == "text":
            d: dict = {"content": text}
        elif key == "thinking":
            d = {"reasoning": text}
        else:
            d = {"tool_calls": [{"index": 0, "function": {"arguments": text}}]}
        choice: dict = {"index": 0, "delta": d}
        if "token_ids" in ev:
            choice["token_ids"] = ev["token_ids"]
        out: dict = {"choices": [choice]}
        if "t_send_ns" in ev:  # the reference engine's timing check (cbbench_send_times)
            out["t_send_ns"] = ev["t_send_ns"]
        return out
    if kind == "message_start":
        msg = ev.get("message")
        if not isinstance(msg, dict):
            raise RequestFailed("protocol", "message_start without a message")
        u = msg.get("usage")
        if isinstance(u, dict):  # its output_tokens is a start value: only the input here
            return {"usage": usage({k: v for k, v in u.items() if k != "output_tokens"}, state)}
        return None
    if kind == "message_delta":
        delta = ev.get("delta") if isinstance(ev.get("delta"), dict) else {}
        reason = delta.get("stop_reason")
        chunk: dict = {"choices": [{"index": 0, "delta": {}}]}
        if reason:
            chunk["choices"][0]["finish_reason"] = STOP_REASONS.get(reason, str(reason))
        u = usage(ev.get("usage"), state)
        if u is not None:
            chunk["usage"] = u
        if "cbbench" in ev:  # the reference engine's per-request report (queue time)
            chunk["cbbench"] = ev["cbbench"]
        return chunk
    if kind == END_EVENT:
        state["done"] = True
        return None
    if kind == "error":
        raise _failed(ev)
    if not isinstance(kind, str):
        raise RequestFailed("protocol", f"Messages event without a type: {str(ev)[:80]}")
    return None  # ping, content_block_start / _stop, and events added later


def body(obj: dict, state: dict) -> dict:
    """A whole (non-streamed) message -> a chat completion to fold."""
    if obj.get("type") == "error":
        raise _failed(obj)
    blocks = obj.get("content")
    if not isinstance(blocks, list):
        raise RequestFailed("protocol", "Messages body without a content list")
    text, thinking, calls = [], [], []
    ids: list | None = None  # every block's token_ids, in order (all blocks must carry them)
    n_thinking = 0
    for b in blocks:
        if not isinstance(b, dict):
            raise RequestFailed("protocol", "Messages content block is not an object")
        block_ids = b.get("token_ids")
        if isinstance(block_ids, list) and (ids is not None or b is blocks[0]):
            ids = [*(ids or []), *block_ids]
            n_thinking += len(block_ids) if b.get("type") == "thinking" else 0
        else:
            ids = None
        if b.get("type") == "text":
            text.append(b.get("text") or "")
        elif b.get("type") == "thinking":
            thinking.append(b.get("thinking") or "")
        elif b.get("type") == "tool_use":
            calls.append(
                {"index": len(calls), "function": {"arguments": json.dumps(b.get("input"))}}
            )
    msg: dict = {"role": "assistant", "content": "".join(text) or None}
    if thinking:
        msg["reasoning"] = "".join(thinking)
    if calls:
        msg["tool_calls"] = calls
    reason = obj.get("stop_reason")
    finish = STOP_REASONS.get(reason, reason) if reason else None
    choice: dict = {"index": 0, "message": msg, "finish_reason": finish}
    if ids is not None:
        choice["token_ids"] = ids  # validated where every API's ids are (`response._apply`)
    out: dict = {"choices": [choice]}
    u = usage(obj.get("usage"), state)
    if ids is not None and thinking:  # counted as a stream's thinking deltas are
        u = {**(u or {}), "completion_tokens_details": {"reasoning_tokens": n_thinking}}
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
