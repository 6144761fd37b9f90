"""Agent sessions on the client side: the chat messages of each step, as the OpenAI chat API
defines a tool-calling loop.

Request 1: a `system` message (the tool set's shared system prompt), the `user` task, and the
`tools` list. After each reply the history gains the `assistant` message with its
`tool_calls` (the call comes from the workload: a model with random weights does not call
tools; its text, if any, is kept as the message's content), the tool runs (the load generator
waits `think_s`, outside every latency), and the next request adds the `tool` message with the
result, naming the call's id. The `tools` list goes with every request. A failed step ends the
session (there is no reply to build on). `--endpoint responses` and `messages` send the same
steps in their APIs' own shapes (`client/responses.py`, `client/messages.py`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from cbbench.harness.client.reply import Reply
from cbbench.harness.errors import CbbenchError

if TYPE_CHECKING:
    from cbbench.harness.load.prompts import PromptBuilder
    from cbbench.harness.results.records import RequestRecord

AgentPrompt = dict[str, Any]  # {"messages": [...], "tools": [...]}: merged into the chat body


AGENT_ENDPOINTS = ("chat", "responses", "messages")  # the last two convert the chat shapes


def check_agent_endpoint(endpoint: str, has_agent: bool) -> None:
    if has_agent and endpoint not in AGENT_ENDPOINTS:
        raise CbbenchError(
            f"--endpoint {endpoint}: agent sessions need --endpoint chat, responses or "
            "messages (an API with tools and tool calls)"
        )


def tool_call_item(call: Any) -> dict:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


class AgentConversation:
    """One agent session as the client runs it (same interface as sessions.Conversation)."""

    def __init__(self, prompts: PromptBuilder) -> None:
        self.prompts = prompts
        self.messages: list[dict] = []
        self.tools: list[dict] | None = None
        self.tokens = 0  # history length in tokens (the server's count of the last prompt)
        self._call: Any = None  # the call the step in flight makes (from the workload)

    def prompt(self, rec: RequestRecord, req: Any, index: int | None = None) -> AgentPrompt:
        step = req.agent
        assert step is not None, "an agent conversation got a request without its step"
        i = req.index if index is None else index
        rec.history_len = self.tokens
        if self.tools is None:
            self.tools = json.loads(step.tools) if step.tools else []
        if (req.turn or 1) <= 1:
            prefix = tuple(req.prefix_ids)  # the shared part: the system prompt, else the task's
            if step.system_len:
                system = self.prompts.text(i, step.system_len, prefix)
                self.messages, prefix = [{"role": "system", "content": system}], ()
            new = {"role": "user", "content": self.prompts.text(i, req.prompt_len, prefix)}
        else:
            assert step.answers is not None, f"agent step {i} answers no tool call"
            new = {
                "role": "tool",
                "tool_call_id": step.answers,
                "content": self.prompts.text(i, req.prompt_len),
            }
        self._call = step.call
        rec.extra["agent_step"] = "call" if step.call is not None else "answer"
        out: AgentPrompt = {"messages": [*self.messages, new]}
        if self.tools:
            out["tools"] = self.tools
        return out

    def reply(self, rec: RequestRecord, prompt: AgentPrompt, reply: Reply) -> bool:
        if not rec.ok:
            return False
        msg: dict[str, Any] = {"role": "assistant", "content": reply.full_text or None}
        if self._call is not None:
            msg["tool_calls"] = [tool_call_item(self._call)]
        self.messages = [*prompt["messages"], msg]
        out = rec.output_tokens_server or rec.output_tokens_client or 0
        self.tokens = (rec.prompt_tokens_server or 0) + out
        return True
