"""Prompt prefixes as chains of hashes at doubling lengths: hash k covers the prompt's first
FIRST x 2**k tokens (or characters), so two prompts share hash k exactly when (up to
collisions) they share that many leading tokens, and only prompts at least that long have it.

Doubling cut points keep the work O(prompt) and the table small, and still tell prompts
apart at any depth: a conversation's next turn (its whole history, then a new message)
shares every level its previous turn reached, a fresh chat that only shares a system prompt
shares the short levels only. Token ids (the simulator, `prompt` as ids over HTTP) start at
FIRST_TOKENS, text (a completion prompt, a chat's messages) at FIRST_CHARS; LEVELS levels.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

FIRST_TOKENS = 16
FIRST_CHARS = 64  # about 16 tokens of English
LEVELS = 12  # the deepest covers 32,768 tokens / 131,072 characters


def token_block_hashes(
    ids: Sequence[int], first: int = FIRST_TOKENS, levels: int = LEVELS
) -> tuple[int, ...]:
    out: list[int] = []
    h, start, end = 0, 0, first
    n = len(ids)
    while end <= n and len(out) < levels:
        h = hash((h, tuple(ids[start:end])))
        out.append(h)
        start, end = end, end * 2
    return tuple(out)


def text_block_hashes(text: str, first: int = FIRST_CHARS, levels: int = LEVELS) -> tuple[int, ...]:
    out: list[int] = []
    h, start, end = 0, 0, first
    n = len(text)
    while end <= n and len(out) < levels:
        h = hash((h, text[start:end]))
        out.append(h)
        start, end = end, end * 2
    return tuple(out)


def body_block_hashes(body: Any) -> tuple[int, ...]:
    """The prefix hashes of a request body (a dict): a completion's prompt (text, token ids,
    or the first of a list of either), a chat's or a Messages request's messages in order
    (Anthropic's `system` first, as chat's system message), a Responses request's `input`
    (text, or its items as messages). Anything else (a body the replica will reject) hashes
    to nothing."""
    if not isinstance(body, dict):
        return ()
    if "input" in body and "messages" not in body and "prompt" not in body:
        if isinstance(body["input"], str):
            return text_block_hashes(body["input"])
        body = {"messages": body["input"]}
    if "messages" in body:
        messages = body["messages"]
        if not isinstance(messages, list):
            return ()
        parts = []
        system = body.get("system")
        if system:
            text = system if isinstance(system, str) else repr(system)
            parts.append(f"system\x1f{text}\x1e")
        for m in messages:
            if isinstance(m, dict):
                content = m.get("content")
                if not isinstance(content, str):
                    content = repr(content)
                parts.append(f"{m.get('role')}\x1f{content}\x1e")
        return text_block_hashes("".join(parts))
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        prompt = prompt[0]  # a batch of prompts: route by the first
    if isinstance(prompt, str):
        return text_block_hashes(prompt)
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt[: FIRST_TOKENS * 2]):
        return token_block_hashes(prompt)
    return ()
