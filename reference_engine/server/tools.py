"""Tool calling in chat requests: the checks a tool-calling history must pass, and how the
`tools` list, an assistant's `tool_calls` and `tool` results become prompt text.

The reference engine's models do not call tools (random or small weights); it still renders
everything an agent sends, so a growing agent context costs what it would on a real server:
the tools list after the system prompt (as chat templates put it), each call as
`<tool_call>{"name": ..., "arguments": ...}</tool_call>` after the assistant's text.
"""

from __future__ import annotations

import json

from cbbench.reference_engine.server import protocol as P
from cbbench.reference_engine.server.errors import bad_request


def check_tool_messages(messages: list[P.ChatMessage]) -> None:
    """A `tool` message must name (`tool_call_id`) a call an earlier assistant message made:
    a 400 naming the message otherwise."""
    calls: set[str] = set()
    for i, m in enumerate(messages):
        if m.tool_calls:
            calls.update(c.id for c in m.tool_calls)
        if m.role != "tool":
            continue
        if m.tool_call_id is None:
            raise bad_request(
                f"messages.{i}: a tool message needs the tool_call_id of the call it answers",
                f"messages.{i}.tool_call_id",
            )
        if m.tool_call_id not in calls:
            raise bad_request(
                f"messages.{i}: tool_call_id {m.tool_call_id[:64]!r} answers no earlier "
                "assistant tool call",
                f"messages.{i}.tool_call_id",
            )


def render_messages(body: P.ChatCompletionRequest) -> list[tuple[str, str]]:
    """(role, text) pairs for the chat template, tools and tool calls included."""
    out: list[tuple[str, str]] = []
    for m in body.messages:
        text = m.text()
        for c in m.tool_calls or ():
            call = {"name": c.function.name, "arguments": c.function.arguments}
            text += f"<tool_call>{json.dumps(call)}</tool_call>"
        out.append((m.role, text))
    if body.tools:
        tools = "\n\n# Tools\n" + json.dumps(body.tools, separators=(",", ":"))
        if out and out[0][0] == "system":
            out[0] = ("system", out[0][1] + tools)
        else:
            out.insert(0, ("system", tools.lstrip()))
    return out
