"""The one stream classifier: each streamed choice's tokens as reasoning, answer or tool-call
arguments, the same for every API's parser, so TTFT, TTFO and token counts mean the same
everywhere.

Reasoning arrives in `delta.reasoning` (vLLM >= 0.11), `delta.reasoning_content` (older vLLM,
SGLang, DeepSeek's API), or inline in the answer's text between `<think>` and `</think>`
when the server does not split it. The `--reasoning-parser` rule (`REASONING_PARSERS`):
- `auto` (default): the two fields are reasoning; content whose first non-blank text opens
  with `<think>` is reasoning up to `</think>`;
- `think-tags`: the output starts inside reasoning (the chat template opened `<think>`, as
  DeepSeek-R1's does; a leading `<think>` is skipped) and leaves it at `</think>`;
- `none`: every token is an answer token (TTFO = TTFT).
A tag is a token of reasoning; a tag split over chunks is found all the same.

Every kind counts as a token for TTFT and ITL. A chunk of k tokens that holds both the end of
the reasoning and the start of the answer gives k - 1 tokens to reasoning and its last to the
answer (k = 1: the answer's). `answer_at` is the index, among all tokens, of the first one
that is not reasoning: the response handler times TTFO from it.

Bad input is flagged (`flags`, one short name each, kept on the record), never raised: a
stream mixing `reasoning` and `reasoning_content`, reasoning after the answer began, a
`<think>` never closed. A delta carrying both fields with the same text (a server that fills
both for compatibility) is one field, not a mix.

Other APIs' parsers (Responses, Messages) feed `tokens(k, reasoning, answer, tool)` with the
kinds their events name, and `content(text)` for answer text that may hold `<think>` tags.

`plain` is True once a bare content chunk can only be an answer token: the fast paths
(`fast_events`, the one-id chunk in `response.Response.data`) count such chunks without
calling `add`, and send anything with a reasoning field or tool calls here. So a `<think>`
inline in the content after the answer began is not looked for on those paths (a reasoning
field after the answer is: it leaves the fast path).
"""

from __future__ import annotations

REASONING_PARSERS = ("auto", "think-tags", "none")
OPEN, CLOSE = "<think>", "</think>"

MIXED_FIELDS = "mixed_reasoning_fields"
REASONING_AFTER_ANSWER = "reasoning_after_answer"
UNCLOSED_THINK = "unclosed_think"
USAGE_REASONING_ABOVE_TOTAL = "usage_reasoning_above_total"


class StreamKinds:
    """One response's token kinds, fed choice by choice (`add`) in arrival order."""

    __slots__ = (
        "mode",
        "n",
        "reasoning",
        "tool",
        "answer_at",
        "in_think",
        "settled",
        "field",
        "tail",
        "flags",
        "plain",
        "saw_reasoning_text",
        "blank_at",
    )

    def __init__(self, mode: str = "auto") -> None:
        assert mode in REASONING_PARSERS, mode
        self.mode = mode
        self.n = 0  # tokens so far, every kind
        self.reasoning = 0  # of which reasoning
        self.tool = 0  # of which tool-call arguments
        # index of the first token that is not reasoning (none: the first token)
        self.answer_at: int | None = 0 if mode == "none" else None
        self.in_think = mode == "think-tags"  # inside inline <think> ... </think>
        self.settled = mode != "auto"  # auto: the first non-blank content decided on <think>
        self.field: str | None = None  # the reasoning field this stream uses
        self.tail = ""  # the end of the reasoning text so far: a split </think> is found
        self.flags: list[str] = []
        self.plain = mode == "none"
        self.saw_reasoning_text = False
        self.blank_at: int | None = None  # the first token of blank text before anything

    def flag(self, name: str) -> None:
        if name not in self.flags:
            self.flags.append(name)

    def carries(self, choice: dict) -> bool:
        """Whether a choice carries any text of any kind (the one-token-per-chunk rule)."""
        msg = choice.get("delta") or choice.get("message")
        if type(msg) is not dict:
            return bool(choice.get("text"))
        return bool(
            msg.get("content")
            or msg.get("reasoning")
            or msg.get("reasoning_content")
            or msg.get("tool_calls")
        )

    def add(self, choice: dict, k: int) -> None:
        """Fold one choice that carried `k` tokens."""
        msg = choice.get("delta") or choice.get("message")
        if type(msg) is not dict:
            text, reasoning, tools = choice.get("text"), None, None
        else:
            text, tools = msg.get("content"), msg.get("tool_calls")
            reasoning = self._field(msg.get("reasoning"), msg.get("reasoning_content"))
        has_t = bool(tools)
        # a token whose text is empty (a partial UTF-8 sequence) keeps the kind of its field
        has_r = bool(reasoning) or (reasoning is not None and not text and not has_t)
        has_a = False
        if text and isinstance(text, str):
            if self.mode == "none":
                has_a = True
            else:
                r_text, has_a = self._inline(text)
                has_r = has_r or r_text
        elif text == "" and reasoning is None and not has_t and self.mode != "none":
            # a token of no text in the content: inside <think> reasoning; after reasoning
            # (or once content has begun) the answer's; before anything, neither yet
            if self.in_think:
                has_r = True
            elif self.settled or self.field is not None or self.reasoning:
                has_a = True
        self.tokens(k, has_r, has_a, has_t)

    def content(self, text: str) -> tuple[bool, bool]:
        """(reasoning in it, answer in it) for a piece of answer-field text, `<think>` tags
        and `--reasoning-parser` applied: for APIs whose text is not a chat choice."""
        if self.mode == "none":
            return False, bool(text)
        return self._inline(text) if text else (False, False)

    def tokens(self, k: int, reasoning: bool, answer: bool, tool: bool = False) -> None:
        """`k` tokens that arrived together, of the kinds given (an API's parser says which:
        e.g. a reasoning event, a text delta, a function-call arguments delta)."""
        has_r, has_a, has_t = reasoning, answer, tool
        if has_r:
            self.saw_reasoning_text = True
        if self.mode == "none":
            has_a, has_r = has_a or has_r or has_t, False
        n = self.n
        self.n += k
        if k <= 0:
            return
        if has_r and not (has_a or has_t):
            if self.answer_at is not None:
                self.flag(REASONING_AFTER_ANSWER)
            self.reasoning += k
            return
        if not (has_a or has_t):
            if self.blank_at is None and not (self.reasoning or has_r or self.field):
                self.blank_at = n  # blank text before anything: the answer's, if no <think>
            return
        rk = 0
        if has_r:
            if self.answer_at is not None:
                self.flag(REASONING_AFTER_ANSWER)
            rk = k - 1
            self.reasoning += rk
        if self.answer_at is None:
            self.answer_at = n + rk
            if not (self.reasoning or self.saw_reasoning_text) and self.blank_at is not None:
                self.answer_at = self.blank_at  # a plain answer that began with blank text
        if has_t:
            self.tool += k - rk
        self.plain = not self.in_think

    def _field(self, r1, r2) -> str | None:
        """The reasoning text of a delta's `reasoning` / `reasoning_content` fields."""
        r1 = r1 if isinstance(r1, str) else None
        r2 = r2 if isinstance(r2, str) else None
        if r1 and r2:
            if r1 != r2:
                self.flag(MIXED_FIELDS)
            which = self.field or "reasoning"
        elif r1:
            which = "reasoning"
        elif r2:
            which = "reasoning_content"
        else:  # "" (a token of no text) keeps the field's kind; absent or null: no reasoning
            return None if r1 is None and r2 is None else ""
        if self.field is None:
            self.field = which
        elif self.field != which and not (r1 and r2):
            self.flag(MIXED_FIELDS)
        return r1 or r2 or ""

    def _inline(self, text: str) -> tuple[bool, bool]:
        """(reasoning text in it, answer text in it) for one piece of content."""
        if not self.settled:
            head = text.lstrip()
            if not head and self.field is None and not self.reasoning:
                return False, False  # blank text before anything: neither kind yet
            self.settled = True  # (blank content after field reasoning: the answer began)
            if not head.startswith(OPEN):
                return False, True
            self.in_think = True
            text = head[len(OPEN) :]
            if not text:
                return True, False
        elif not self.in_think:
            if OPEN in text and self.answer_at is not None:
                self.flag(REASONING_AFTER_ANSWER)
            return False, True
        buf = self.tail + text
        i = buf.find(CLOSE)
        if i < 0:
            self.tail = buf[-(len(CLOSE) - 1) :]
            return True, False
        self.in_think = False
        self.tail = ""
        return True, bool(buf[i + len(CLOSE) :])

    def finish(self) -> None:
        """The response ended: flag what was left open."""
        if self.in_think and self.saw_reasoning_text and self.mode != "none":
            self.flag(UNCLOSED_THINK)
