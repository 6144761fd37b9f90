"""Per-token logprobs in OpenAI's two response shapes.

Completions (legacy): `{"tokens": [...], "token_logprobs": [...], "top_logprobs": [{token:
logprob}, ...], "text_offset": [...]}`; the top dict holds the k most likely tokens and the
sampled one, as vLLM returns. Chat: `{"content": [{"token", "logprob", "bytes",
"top_logprobs": [{"token", "logprob", "bytes"}, ...]}], "refusal": null}`. Token strings are
each id decoded alone; a byte-level token that is part of a multi-byte character decodes to
U+FFFD, and `bytes` says so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cbbench.reference_engine.core.outputs import TokenLogprob

TokenText = Callable[[int], str]


def completion_logprobs(
    entries: list[TokenLogprob], token_text: TokenText, offset: int
) -> tuple[dict[str, Any], int]:
    """The `logprobs` of a completion choice; `offset` = where the first token's text starts
    in the choice's text. Returns it with the offset after the last token."""
    tokens, offsets, tops = [], [], []
    for e in entries:
        text = token_text(e.token_id)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        top = {token_text(t): lp for t, lp in e.top}
        top.setdefault(text, e.logprob)
        tops.append(top)
    body = {
        "tokens": tokens,
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": tops,
        "text_offset": offsets,
    }
    return body, offset


def _chat_entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}


def chat_logprobs(entries: list[TokenLogprob], token_text: TokenText) -> dict[str, Any]:
    content = []
    for e in entries:
        item = _chat_entry(token_text(e.token_id), e.logprob)
        item["top_logprobs"] = [_chat_entry(token_text(t), lp) for t, lp in e.top]
        content.append(item)
    return {"content": content, "refusal": None}
