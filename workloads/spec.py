"""The unit every layer agrees on: one request of a workload, before it is sent.

Sessions: requests sharing a `session_id` are the turns of one conversation. For them
`prompt_len` is the NEW message's length: the load generator prepends the whole history (earlier
messages and the server's actual replies), and sends turn k+1 `think_s` after turn k's reply
ended. A session starts at its first turn's `arrival_s`; later turns' `arrival_s` is
informational (the trace's own time).

Agent sessions (workloads/agent.py) are sessions whose turns carry an `AgentStep`: turn 1's new
message is the task (after a system prompt and the `tools` list), every later turn's is the
`tool` result answering the previous step's call, and `think_s` is the tool's latency.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from pathlib import PurePath

from cbbench.workloads.graph import GraphCall


@dataclass(frozen=True)
class ToolCall:
    """One tool call an agent step's reply makes (OpenAI chat `tool_calls` item)."""

    id: str  # the call id the `tool` message answering it names
    name: str
    arguments: str  # JSON text


@dataclass(frozen=True)
class AgentStep:
    """What makes a session turn an agent step (the load generator builds the messages)."""

    tools: str  # the session's `tools` list as JSON text, sent on every request
    system_len: int  # system prompt tokens (its text comes from `prefix_ids`, shared)
    call: ToolCall | None  # the call this step's reply makes; None: the final answer
    answers: str | None = None  # the call id this step's new message (a tool result) answers


@dataclass(frozen=True)
class RequestSpec:
    index: int  # position in the workload, 0..n-1; stable across load levels
    prompt_len: int  # prompt tokens
    output_len: int  # tokens to generate (sent as max_tokens, with ignore_eos where accepted)
    arrival_s: float | None = None  # seconds from the start of the run; None = closed loop
    priority: int = 0  # lower value = served earlier (vLLM's convention)
    prefix_ids: tuple[int, ...] = ()  # hash ids of leading prompt blocks; equal ids = shared prefix
    session_id: str | None = None  # requests with one id form a conversation (multi-turn)
    turn: int | None = None  # 1, 2, ... within the session; turn k+1 waits for turn k's reply
    think_s: float | None = None  # pause after the previous turn's reply before this turn
    text: str | None = None  # the message's real text (ShareGPT); None = generated of prompt_len
    agent: AgentStep | None = None  # agent sessions: tools, the step's call, the call answered
    graph: GraphCall | None = None  # agent graphs: predecessors, recorded messages, live turns


@dataclass(frozen=True)
class Workload:
    name: str  # preset name, trace path or spec file it came from
    seed: int
    requests: tuple[RequestSpec, ...]
    prefix_block_size: int = 512  # tokens per prefix id in `prefix_ids`
    source: dict = field(default_factory=dict)  # the spec as given, for run.json

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def short_name(self) -> str:
        """A file's base name (`azure_llm_2023_conv.csv`), else the name: what runs are called
        by default (a trace's full path made `_work_shared_traces_azure_llm_2023_conv.csv`)."""
        return PurePath(self.name).name if PurePath(self.name).suffix else self.name

    @property
    def prompt_seed(self) -> int:
        """The seed prompt ids are drawn from (workloads/tokens.py): the seed mixed with the
        workload's name (a file's base name, not its folder), so that two workloads at one
        seed send different prompts and a server's prefix cache, warm from one run, gives
        the next workload no hits it would not get alone."""
        return (self.seed << 32) | zlib.crc32(self.short_name.encode("utf-8"))

    @property
    def open_loop(self) -> bool:
        return any(r.arrival_s is not None for r in self.requests)
