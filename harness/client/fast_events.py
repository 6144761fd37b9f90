"""The common SSE chunk, recognised by one typed decode (msgspec) instead of a dict and checks.

Almost every event of a token-id stream is the same shape: one choice with one non-negative
token id, no finish reason, no usage, no `cbbench` block, no prompt ids (and, from the
selftest's server, a `t_send_ns`). `Response.data` counts such a chunk without `_apply`; this
module lets it do so with one `msgspec.json.Decoder` call into a `Struct` that holds only the
fields that decide it, so the chunk's other keys (id, object, model, text, ...) are skipped,
not built into a dict. An optional accelerator (`pip install cbbench[fast]`): without msgspec,
or with `CBBENCH_NO_MSGSPEC=1`, `COUNT_COMMON` is None and the response handler runs its
orjson/stdlib path alone.

Exact by construction: `count_common` only takes a run of events from the start of a read,
and stops at the first event the schema does not accept (a decode or validation error of any
kind, non-UTF-8 bytes, a `cbbench` key); that event and all after it go through the general
path, in order. It accepts an event only where the general path would count it as the common
chunk with the same token and the same `t_send_ns`:

- the schema needs `choices` a non-empty array of objects whose `token_ids` is `[n]`, n an
  integer in [0, 2**63) (not a bool, not a float: orjson reads larger ones as floats),
  `finish_reason` a string or null or absent (the first choice's must be null or absent:
  checked after the decode), `prompt_token_ids` null or absent, and `usage` null or absent;
  `t_send_ns` an integer or absent;
- a chat `delta` may carry no `reasoning`, `reasoning_content` or `tool_calls` other than
  null: such a chunk goes to the stream classifier (`stream_kinds.py`), and the response
  handler calls `count_common` only while a bare chunk can only be an answer token;
- msgspec unescapes keys (`"us\\u0061ge"` is `usage`), and with a repeated key the last one
  wins, as in orjson and the stdlib, while every occurrence must validate;
- msgspec skips unknown values without checking their UTF-8, so bytes that are not ASCII are
  decoded (strictly, as the stdlib would) before it sees them;
- what msgspec rejects and the others take (NaN, lone surrogate escapes, deep nesting) just
  falls back: stricter is safe, laxer is not.

tests/test_client_fast_events.py checks this against the general path on hostile events.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from cbbench.harness.envflags import env_flag

try:
    import msgspec
except ImportError:  # pragma: no cover - msgspec is installed in CI (the test extra)
    msgspec = None

TYPED_DECODER = "msgspec" if msgspec is not None else None

if msgspec is not None:
    from msgspec import UNSET, Meta, Raw, UnsetType

    # orjson reads an integer outside [-2**63, 2**64) as a float (the general path then fails
    # the id, or keeps a float t_send_ns): numbers outside int64 (msgspec's bounds) fall back
    _Id = Annotated[int, Meta(ge=0, le=2**63 - 1)]
    _Ns = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]

    class _Delta(msgspec.Struct):  # an answer token's delta: no reasoning, no tool calls
        reasoning: None = None
        reasoning_content: None = None
        tool_calls: None = None

    class _Choice(msgspec.Struct):
        token_ids: tuple[_Id]  # exactly one id
        # a string is decoded, then refused in `count_common`: a stream's last chunk (a finish
        # reason) would otherwise cost a validation error (an exception and its message)
        finish_reason: str | None = None
        prompt_token_ids: None = None
        delta: _Delta | None = None

    class _Chunk(msgspec.Struct):
        choices: Annotated[tuple[_Choice, ...], Meta(min_length=1)]
        usage: None = None
        cbbench: Raw | UnsetType = UNSET  # present -> the general path (it is kept there)
        t_send_ns: _Ns | UnsetType = UNSET

    _decode = msgspec.json.Decoder(_Chunk).decode

    def count_common(
        events: list[bytes], sends: list[tuple[int, int]] | None, t: int, ascii: bool = False
    ) -> int:
        """How many events from the start of `events` are the common chunk (one token each);
        their `t_send_ns`, where present, go to `sends` as (t, t_send_ns). `ascii`: the
        caller saw that every event is ASCII (one check a read instead of one an event)."""
        n = 0
        add = sends.append if sends is not None else None
        for data in events:
            if not ascii and not data.isascii():
                try:
                    data.decode()
                except UnicodeDecodeError:
                    break
            if data == b"[DONE]":  # the stream's end: refused without an exception
                break
            try:
                chunk = _decode(data)
            except Exception:  # noqa: BLE001 - anything it refuses, the general path decides
                break
            if chunk.cbbench is not UNSET or chunk.choices[0].finish_reason is not None:
                break
            n += 1
            if add is not None and chunk.t_send_ns is not UNSET:
                add((t, chunk.t_send_ns))
        return n

    COUNT_COMMON: Callable[[list[bytes], list | None, int], int] | None = (
        None if env_flag("CBBENCH_NO_MSGSPEC") else count_common
    )
else:  # pragma: no cover
    COUNT_COMMON = None
