"""Prompt prefixes as chains of block hashes: hash k covers blocks 0..k, so two prompts
share hash k exactly when (up to collisions) they share their first k + 1 blocks.

Token ids (the simulator, `prompt` as ids over HTTP) are cut in blocks of `block_tokens`;
text (a completion prompt, a chat's messages) in blocks of `block_chars`. Only whole
blocks count, at most `max_blocks` of them, so hashing costs O(max_blocks) per request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

BLOCK_TOKENS = 16
BLOCK_CHARS = 64  # about 16 tokens of English
MAX_BLOCKS = 32


def token_block_hashes(
    ids: Sequence[int], block_tokens: int = BLOCK_TOKENS, max_blocks: int = MAX_BLOCKS
) -> tuple[int, ...]:
    out: list[int] = []
    h = 0
    n = min(len(ids) // block_tokens, max_blocks)
    for k in range(n):
        h = hash((h, tuple(ids[k * block_tokens : (k + 1) * block_tokens])))
        out.append(h)
    return tuple(out)


def text_block_hashes(
    text: str, block_chars: int = BLOCK_CHARS, max_blocks: int = MAX_BLOCKS
) -> tuple[int, ...]:
    out: list[int] = []
    h = 0
    n = min(len(text) // block_chars, max_blocks)
    for k in range(n):
        h = hash((h, text[k * block_chars : (k + 1) * block_chars]))
        out.append(h)
    return tuple(out)


def body_block_hashes(body: Any) -> tuple[int, ...]:
    """The prefix hashes of an OpenAI request body (a dict): a completion's prompt (text,
    token ids, or the first of a list of either), or a chat's messages in order. Anything
    else (a body the replica will reject) hashes to nothing."""
    if not isinstance(body, dict):
        return ()
    if "messages" in body:
        messages = body["messages"]
        if not isinstance(messages, list):
            return ()
        parts = []
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
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt[: BLOCK_TOKENS * 2]):
        return token_block_hashes(prompt)
    return ()
