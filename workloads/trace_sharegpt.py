"""ShareGPT conversations (a JSON array, or JSONL with one conversation per line), streamed.

The load generator sends each request's real text (`RequestSpec.text`), as text prompts.

Each item is `{"id": ..., "conversations": [{"from": "human"|"gpt", "value": text}, ...]}`. The
first human turn is the prompt; the next gpt turn after it sets the output length. Lengths are
counted with a `tokenizers` tokenizer.json when one is given, else estimated as
ceil(characters / 4) (about 4 characters per token for English text with BPE tokenizers).
Items without such a pair, or with an empty turn, are skipped and counted.

With `sessions`, every human message that gets a reply is one turn of the conversation's
session, sent with its real text (`RequestSpec.text`); the reply's length sets the turn's
output length, while the history resent is the server's own replies. A conversation with no
usable pair is skipped as above.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from cbbench.workloads.errors import WorkloadError
from cbbench.workloads.trace_mooncake import json_lines
from cbbench.workloads.tracefile import TraceRow, display_name, open_text

CHARS_PER_TOKEN = 4
CHUNK_CHARS = 1 << 20
HUMAN_ROLES = ("human", "user")
MODEL_ROLES = ("gpt", "chatgpt", "assistant", "model", "bard")


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def token_counter(tokenizer: str | Path | None) -> Callable[[str], int]:
    if tokenizer is None:
        return estimate_tokens
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(tokenizer))
    except Exception as exc:  # the Rust side raises plain Exception for missing/bad files
        raise WorkloadError(f"{tokenizer}: cannot load tokenizer: {exc}") from None
    return lambda text: len(tok.encode(text, add_special_tokens=False).ids)


def iter_json_array(f: IO[str], name: str) -> Iterator[tuple[str, object]]:
    """("file:line", item) for each item of a top-level JSON array, reading in chunks."""
    decoder = json.JSONDecoder()
    buf, pos, line, eof, first = "", 0, 1, False, True

    def fill() -> bool:
        nonlocal buf, pos
        chunk = f.read(CHUNK_CHARS)
        buf, pos = buf[pos:] + chunk, 0
        return not chunk

    def skip_space() -> None:
        nonlocal pos, line, eof
        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n":
                line += buf[pos] == "\n"
                pos += 1
            if pos < len(buf) or eof:
                return
            eof = fill()

    skip_space()
    if pos >= len(buf) or buf[pos] != "[":
        raise WorkloadError(f"{name}:{line}: expected a JSON array of conversations")
    pos += 1
    while True:
        skip_space()
        if pos < len(buf) and buf[pos] == "]":
            return
        if not first:
            if pos >= len(buf) or buf[pos] != ",":
                raise WorkloadError(f"{name}:{line}: expected ',' or ']' between items")
            pos += 1
            skip_space()
        first = False
        try:
            item, end = decoder.raw_decode(buf, pos)
            if end == len(buf) and not eof:
                raise json.JSONDecodeError("item may continue", buf, end)
        except json.JSONDecodeError as exc:
            if eof:
                raise WorkloadError(f"{name}:{line}: not valid JSON: {exc.msg}") from None
            eof = fill()
            first = True  # the ',' is consumed; retry the same item with more text
            continue
        yield f"{name}:{line}", item
        line += buf.count("\n", pos, end)
        pos = end


def _pair(item: object, where: str) -> tuple[str, str] | None:
    if not isinstance(item, dict) or not isinstance(item.get("conversations"), list):
        raise WorkloadError(f"{where}: missing column 'conversations'")
    prompt = None
    for turn in item["conversations"]:
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            raise WorkloadError(f"{where}: each turn needs 'from' and a text 'value'")
        role = turn.get("from")
        if prompt is None and role in HUMAN_ROLES:
            prompt = turn["value"]
        elif prompt is not None and role in MODEL_ROLES:
            return prompt, turn["value"]
    return None


def _pairs(item: dict, where: str) -> list[tuple[str, str]]:
    """Every (human message, the reply that follows it) of a conversation, in order."""
    out, prompt = [], None
    for turn in item["conversations"]:
        role = turn.get("from")
        if role in HUMAN_ROLES:
            prompt = turn["value"]
        elif prompt is not None and role in MODEL_ROLES:
            out.append((prompt, turn["value"]))
            prompt = None
    return out


def _session_rows(
    item: dict, where: str, count: Callable[[str], int], skipped: Counter
) -> Iterator[TraceRow]:
    session = str(item.get("id", where))
    turn = 0
    for prompt, reply in _pairs(item, where):
        prompt_len, output_len = count(prompt), count(reply)
        if prompt_len == 0 or output_len == 0:
            skipped["empty_turn"] += 1
            continue
        turn += 1
        yield TraceRow(None, prompt_len, output_len, session_id=session, turn=turn, text=prompt)


def read_sharegpt(
    path: str | Path,
    skipped: Counter,
    tokenizer: str | Path | None = None,
    sessions: bool = False,
) -> Iterator[TraceRow]:
    count = token_counter(tokenizer)
    name = display_name(path)
    if str(path).removesuffix(".gz").endswith(".jsonl"):
        items = json_lines(path)
    else:
        items = _array_items(path, name)
    for where, item in items:
        if sessions:
            if _pair(item, where) is None:
                skipped["no_reply"] += 1
                continue
            yield from _session_rows(item, where, count, skipped)  # type: ignore[arg-type]
            continue
        pair = _pair(item, where)
        if pair is None:
            skipped["no_reply"] += 1
            continue
        prompt_len, output_len = count(pair[0]), count(pair[1])
        if prompt_len == 0 or output_len == 0:
            skipped["empty_turn"] += 1
            continue
        session = item.get("id")  # type: ignore[union-attr]
        yield TraceRow(
            arrival_s=None,
            prompt_len=prompt_len,
            output_len=output_len,
            session_id=None if session is None else str(session),
            turn=1,
            text=pair[0],  # sent as it is: a real prompt, not generated text of its length
        )


def _array_items(path: str | Path, name: str) -> Iterator[tuple[str, object]]:
    with open_text(path) as f:
        yield from iter_json_array(f, name)
