"""Multi-turn sessions on the client side: grouping a worker's jobs into conversations, and the
history each turn resends.

A session's turn k+1 is built from everything before it: the earlier user messages and the
server's ACTUAL replies, then the new message. Three shapes, by what the endpoint takes:
- "ids" (completions with token-id prompts): the previous prompt's ids + the reply's token ids
  (vLLM's `return_token_ids`, the reference engine) + the new message's ids. Without token ids
  in the reply, its text is encoded with `--tokenizer`, else the reply is left out of the
  history and the turn is marked (`extra["history_gap"]`).
- "text" (completions with text prompts): previous prompt text + reply text + "\\n" + new text.
- "chat": the message list, `user` and `assistant` alternating, then the new user message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cbbench.harness.client.endpoints import is_conversational
from cbbench.harness.client.reply import Reply

if TYPE_CHECKING:
    from cbbench.harness.load.prompts import PromptBuilder
    from cbbench.harness.results.records import RequestRecord

Prompt = list[int] | str | list[dict[str, str]]
HISTORY_MODES = ("ids", "text", "chat")
CAP_UNITS = ("sessions", "requests")  # what a concurrency slot counts while sessions run
TEXT_SEPARATOR = "\n"


def group_sessions(jobs: Iterable[Any]) -> list[list[Any]]:
    """Jobs -> units: a session's turns (ordered by turn), or one job on its own. Units keep
    the order of their first job; a job without a session_id is a unit of one. A turn number
    seen again under the same id (a trace that repeats a conversation id) starts a new unit."""
    units: list[list[Any]] = []
    by_id: dict[str, tuple[list[Any], set]] = {}
    for job in jobs:
        sid = job.session_id
        if sid is None:
            units.append([job])
            continue
        unit, turns = by_id.get(sid, (None, set()))
        if unit is None or (job.turn is not None and job.turn in turns):
            unit, turns = [], set()
            by_id[sid] = (unit, turns)
            units.append(unit)
        unit.append(job)
        turns.add(job.turn)
    for unit in units:
        unit.sort(key=lambda j: (j.turn if j.turn is not None else 0, j.index))
    return units


@dataclass
class History:
    """One session's conversation so far, in the shape its endpoint takes."""

    mode: str
    encode: Callable[[str], list[int]] | None = None  # local tokenizer, for replies without ids
    ids: list[int] = field(default_factory=list)
    text: str = ""
    messages: list[dict[str, str]] = field(default_factory=list)
    tokens: int = 0  # history length in tokens (exact for ids, else the server's count)
    gap: bool = False  # a reply could not be added (no ids, no tokenizer)

    def __post_init__(self) -> None:
        assert self.mode in HISTORY_MODES, self.mode

    def prompt(self, message: list[int] | str) -> Prompt:
        """The whole prompt for a new message: history first."""
        if self.mode == "ids":
            assert isinstance(message, list)
            return self.ids + message
        assert isinstance(message, str)
        if self.mode == "text":
            return self.text + message
        return [*self.messages, {"role": "user", "content": message}]

    def add(self, prompt: Prompt, reply: Reply, prompt_tokens: int | None, out_tokens: int) -> None:
        """After a turn ended: its prompt and the server's reply become the history."""
        if self.mode == "ids":
            assert isinstance(prompt, list)
            ids = reply.token_ids
            if ids is None and self.encode is not None:
                ids = self.encode(reply.full_text)
            if ids is None:
                self.gap = True
                ids = []
            self.ids = list(prompt) + list(ids)
            self.tokens = len(self.ids)
            return
        if self.mode == "text":
            assert isinstance(prompt, str)
            self.text = prompt + reply.full_text + TEXT_SEPARATOR
        else:
            assert isinstance(prompt, list)
            self.messages = [*prompt, {"role": "assistant", "content": reply.full_text}]
        self.tokens = (prompt_tokens or 0) + out_tokens


def history_mode(endpoint: str, text_prompts: bool, has_text: bool) -> str:
    """The shape a session's history takes: chat messages, text, or token ids."""
    if is_conversational(endpoint):  # chat, Responses, Messages: the whole conversation
        return "chat"
    return "text" if text_prompts or has_text else "ids"


def turn_message(prompts: PromptBuilder, mode: str, req: Any, index: int) -> list[int] | str:
    """A turn's new message (`req`: a workload request or a job): its own text, or generated
    ids/text of its length, seeded by `index`. Prefix ids shape the first turn only (a shared
    system prompt); a later turn's ids name its whole prompt, history included, which the
    history already supplies."""
    if req.text is not None:
        return req.text
    prefix = req.prefix_ids if (req.turn or 1) <= 1 else ()
    if mode == "ids":
        return prompts.token_ids(index, req.prompt_len, prefix)
    return prompts.text(index, req.prompt_len, prefix)


class Conversation:
    """One session as a client runs it, turn after turn (`cbbench bench` and the Locust user
    alike): each turn's whole prompt and record fields from the history, then the history
    from the server's reply."""

    def __init__(self, mode: str, prompts: PromptBuilder) -> None:
        tok = prompts.tokenizer
        encode = (lambda t: tok.encode(t, add_special_tokens=False).ids) if tok else None
        self.history = History(mode, encode)
        self.prompts = prompts

    def prompt(self, rec: RequestRecord, req: Any, index: int | None = None) -> Prompt:
        """The turn's prompt (history first); sets the record's history fields."""
        rec.history_len = self.history.tokens
        if self.history.gap:
            rec.extra["history_gap"] = True
        message = turn_message(
            self.prompts, self.history.mode, req, req.index if index is None else index
        )
        return self.history.prompt(message)

    def reply(self, rec: RequestRecord, prompt: Prompt, reply: Reply) -> bool:
        """The turn ended: its prompt and reply become the history. False: it failed, which
        ends the session (there is no reply to build on)."""
        if not rec.ok:
            return False
        out = rec.output_tokens_server or rec.output_tokens_client or 0
        self.history.add(prompt, reply, rec.prompt_tokens_server, out)
        return True
