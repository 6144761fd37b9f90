"""The raw client's compiled read path (harness/client/cread.py, csrc/cread.c) against the
Python path it replaces (chunks.py, sse.py, fast_events.py, Response.data): the same record,
state, stamps and failure for any response split into any reads, and a clear fallback where
it cannot be built."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import time

from cbbench.harness.client import cread, fast_events, response
from cbbench.harness.client.api import ClientConfig, OpenAIClient
from cbbench.harness.client.chunks import whole_chunks
from cbbench.harness.client.sse import SSEParser
from cbbench.harness.client.stream_kinds import REASONING_PARSERS, StreamKinds
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.servers.fake_server import _chunk
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from read_paths import HEAD, require_compiled, through_conn
from servers.fake import Behavior, FakeServerConfig, threaded

SERVER = json.dumps(_chunk("text_completion", False, False, 1, True, None))[:-1].encode()


def _chat(**delta) -> dict:
    return {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, **delta}]}


def _ev(obj) -> bytes:
    return obj if isinstance(obj, bytes) else json.dumps(obj).encode()


# events of every kind the handler meets; the common chunk (several spellings) most often
COMMON = st.builds(
    lambda ts, tid, sp: (
        SERVER + b', "t_send_ns": %d}' % ts
        if sp == 0
        else _ev({"choices": [{"token_ids": [tid], "finish_reason": None}], "t_send_ns": ts})
        if sp == 1
        else _ev(_chat(delta={"content": " é"}, token_ids=[tid]))
    ),
    st.integers(0, 2**63 - 1),
    st.integers(0, 50_000),
    st.integers(0, 2),
)
# the shapes `cread.first` decides (a stream's events before its answer began): the text the
# classifier reads from `text` or a delta's `content`, blank, <think>, escaped, twice, ...
FIRST_SHAPES = [
    b'{"choices":[{"token_ids":[4],"text":"  "}],"t_send_ns":3}',
    b'{"choices":[{"token_ids":[4],"text":""}]}',
    b'{"choices":[{"token_ids":[4],"text":"<think>"}]}',
    b'{"choices":[{"token_ids":[4],"text":" <think>x</think> a"}]}',
    b'{"choices":[{"token_ids":[4],"text":"\\u0020a"}]}',
    b'{"choices":[{"token_ids":[4],"text":"\xc2\xa0a"}]}',
    b'{"choices":[{"token_ids":[4],"text":"a","text":"  "}]}',
    b'{"choices":[{"token_ids":[4],"text":7}]}',
    b'{"choices":[{"token_ids":[4],"text":null}]}',
    b'{"choices":[{"token_ids":[4],"delta":{},"text":"a"}]}',
    b'{"choices":[{"token_ids":[4],"delta":null,"text":"a"}]}',
    b'{"choices":[{"token_ids":[4],"delta":{},"message":{"content":"<think>"},"text":"a"}]}',
    b'{"choices":[{"token_ids":[4],"delta":{"role":"assistant"},"text":"a"}]}',
    b'{"choices":[{"token_ids":[4],"delta":{"content":"a","content":" "}}]}',
    b'{"choices":[{"token_ids":[4],"delta":{"content":" </think>"}}]}',
    b'{"choices":[{"token_ids":[4],"delta":{"content":"b","reasoning":null}}]}',
    b'{"choices":[{"token_ids":[4],"delta":{"content":"b"}}],"metrics":{"queue_time_ms":1}}',
    b'{"choices":[{"token_ids":[4],"text":"b"}],"timings":{"prompt_ms":2}}',
]
# the finish chunks `cread.last` decides: a finish reason and/or a `cbbench` object on the
# common chunk (the fake server's own, the chat shape, nested and odd objects, what it refuses)
FAKE_CB = b'{"t_recv_ns": 5, "queue_time_s": 0.001, "scheduler": "fake", "x": 1.5e-3}'
LAST_SHAPES = [
    SERVER.replace(b'"finish_reason": null', b'"finish_reason": "length"')
    + b', "cbbench": '
    + FAKE_CB
    + b', "t_send_ns": 7}',
    b'{"choices":[{"token_ids":[4],"text":" a","finish_reason":"stop"}],"t_send_ns":3}',
    b'{"choices":[{"token_ids":[4],"delta":{"content":"b"},"finish_reason":"length"}]}',
    b'{"choices":[{"token_ids":[4],"text":"a"}],"cbbench":{"k":{"n":[1,{"m":null}]},"s":"\\u00e9"}}',
    b'{"choices":[{"token_ids":[4],"text":"a","finish_reason":null}],"cbbench":{}}',
    b'{"choices":[{"token_ids":[4],"text":"<think>","finish_reason":"stop"}]}',
    b'{"choices":[{"token_ids":[4],"text":" ","finish_reason":"stop"}]}',
    b'{"choices":[{"token_ids":[4],"text":"a","finish_reason":""}],"cbbench":{"q":1}}',
    b'{"choices":[{"token_ids":[4],"text":"a","finish_reason":"st\\u006fp"}]}',
    b'{"choices":[{"token_ids":[4],"text":"a","finish_reason":5}]}',
    b'{"choices":[{"token_ids":[4],"text":"a","finish_reason":"stop","finish_reason":null}]}',
    b'{"choices":[{"token_ids":[4],"text":"a"}],"cbbench":{"a":1},"cbbench":{"b":2}}',
    b'{"choices":[{"token_ids":[4],"text":"a"}],"cbbench":"x"}',
    b'{"choices":[{"token_ids":[4],"text":"a"}],"cbbench":{"a":1,}}',
    b'{"choices":[{"token_ids":[4],"text":"a","finish_reason":"stop"}],"usage":{"x":1}}',
    b'{"choices":[{"token_ids":[4],"text":"a","finish_reason":"stop"}],"metrics":{}}',
    b'{"choices":[{"token_ids":[4],"text":"","finish_reason":"stop"}]}',
    b'{"choices":[{"token_ids":[4,5],"text":"a","finish_reason":"stop"}]}',
]
# the usage chunks `cread.usage` decides (the first four), and what it leaves to Python
USAGE_SHAPES = [
    b'{"id": "fake", "choices": [], "usage": {"prompt_tokens": 16, "completion_tokens": 16}}',
    b'{"choices":[ ],"usage":{"prompt_tokens":null,"total_tokens":3,"x":{"y":[1]}},"t_send_ns":2}',
    b'{"usage":{"completion_tokens":-4},"choices":[]}',
    b'{"choices":[],"usage":{"prompt_tokens":9223372036854775807}}',
    b'{"choices":[],"usage":{}}',
    b'{"choices":[],"usage":null}',
    b'{"choices":[],"usage":{"prompt_tokens":1,"prompt_tokens":2}}',
    b'{"choices":[],"usage":{"prompt_tokens":1.0}}',
    b'{"choices":[],"usage":{"prompt_tokens":"1"}}',
    b'{"choices":[],"usage":{"prompt_tokens":9223372036854775808}}',
    b'{"choices":[],"usage":{"prompt_tokens":1,"prompt_tokens_details":{"cached_tokens":1}}}',
    b'{"choices":[],"usage":{"completion_tokens":3,"completion_tokens_details":null}}',
    b'{"choices":[],"usage":{"prompt_tokens":1},"cbbench":{"q":1}}',
    b'{"choices":[],"usage":{"prompt_tokens":1},"error":"x"}',
    b'{"choices":[],"usage":{"prompt_tokens":1},"metrics":{}}',
    b'{"choices":[],"choices":[],"usage":{"prompt_tokens":1}}',
    b'{"choices":[{"token_ids":[1]}],"usage":{"prompt_tokens":1}}',
    b'{"usage":{"prompt_tokens":1}}',
    b'{"choices":[],"usage":{"prompt_tokens":1}',
    b'{"choices":[],"us\\u0061ge":{"prompt_tokens":1}}',
]
OTHER = st.sampled_from(
    [
        b"[DONE]",
        _ev(_chat(delta={"reasoning": " r"}, token_ids=[3])),
        _ev(_chat(delta={"reasoning_content": " r"}, token_ids=[3])),
        _ev(_chat(delta={"content": "<think> r"}, token_ids=[3])),
        _ev(_chat(delta={"content": " </think> a"}, token_ids=[3])),
        _ev(_chat(delta={"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]})),
        _ev(_chat(delta={"content": " a"})),  # no ids: one token per text chunk
        _ev(
            {
                "choices": [{"token_ids": [1], "finish_reason": "length"}],
                "t_send_ns": 9,
                "usage": {"prompt_tokens": 3, "completion_tokens": 4},
                "cbbench": {"queue_time_s": 0.1},
            }
        ),
        _ev({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}),
        _ev({"choices": [{"token_ids": [1]}, {"token_ids": [2]}]}),
        _ev({"choices": [{"token_ids": [1, 2]}], "t_send_ns": 5}),
        b'{"choices":[{"token_ids":[1],"finish_reason":""}]}',
        b'{"choices":[{"token_ids":[1],"finish_reason":"stop"}],"t_send_ns":4}',
        b'{"choices":[{"token_ids":[1],"prompt_token_ids":[1,2]}]}',
        b'{"choices":[{"token_ids":[1]}],"usage":{"completion_tokens":3}}',
        b'{"choices":[{"token_ids":[1]}],"cbbench":null}',
        b'{"choices":[{"token_ids":[1.0]}]}',
        b'{"choices":[{"token_ids":[1],"delta":{"reasoning":"r"}}]}',
        b'{"choices":[{"token_ids":[1]}],"us\\u0061ge":{"completion_tokens":3}}',
        b'{"choices":[{"token_ids":[1]}],"t_send_ns":1,"t_send_ns":2}',
        b'{"choices":[{"token_ids":[1]}],"id":"\\ud800"}',
        b'{"choices":[{"token_ids":[1]}],"id":"\xed\xa0\x80"}',
        b'{"choices":[{"token_ids":[1]}],"id":"\xf0\x9f\x98\x80"}',
        b'{"choices":[{"token_ids":[18446744073709551615]}]}',
        b'{"choices":[{"token_ids":[-0]}]}',
        b'{"choices":[{"token_ids":[1]}],"x":' + b"[" * 70 + b"]" * 70 + b"}",
        b'{"choices":[{"token_ids":[1]}],"x":1e400}',
        b'{"choices":[{"token_ids":[7],"delta":{"tool_calls":null,"role":"assistant"}}]}',
        b'{"choices":[{"token_ids":[7]}]',
        b'{"error":{"message":"boom"}}',
        b"",
        *FIRST_SHAPES,
        *LAST_SHAPES,
        *USAGE_SHAPES,
    ]
)
EVENT = st.one_of(COMMON, COMMON, COMMON, OTHER)
# how an event is written: `data: x`, `data:x`, CRLF line ends, a comment or another field
# first, split over two data lines
STYLE = st.sampled_from([0, 0, 0, 0, 1, 2, 3, 4, 5])


def _sse(event: bytes, style: int) -> bytes:
    if style == 1:
        return b"data:" + event + b"\n\n"
    if style == 2:
        return b"data: " + event + b"\r\n\r\n"
    if style == 3:
        return b": keep-alive\n\ndata: " + event + b"\n\n"
    if style == 4:
        return b"event: chunk\ndata: " + event + b"\n\n"
    if style == 5 and len(event) > 2:
        return b"data: " + event[:2] + b"\ndata: " + event[2:] + b"\n\n"
    return b"data: " + event + b"\n\n"


SIZES = st.sampled_from([b"%x", b"%x", b"%x", b"%x", b"%X", b"%04x", b"%x;ext=1", b"%x "])


@st.composite
def responses(draw) -> list[bytes]:
    """A chunked SSE response (head included) cut into reads: mostly at chunk boundaries
    (as the server writes and the kernel delivers), sometimes anywhere (a CRLF split too)."""
    events = draw(st.lists(st.tuples(EVENT, STYLE), min_size=1, max_size=8))
    body = b"".join(_sse(e, s) for e, s in events)
    if draw(st.booleans()):
        body += b"data: [DONE]\n\n"
    # chunks: at event ends mostly, or at random offsets
    ends = [i + 2 for i in range(len(body) - 1) if body[i : i + 2] == b"\n\n"]
    cuts = sorted(set(draw(st.lists(st.sampled_from(ends), max_size=8)) if ends else []))
    cuts += draw(st.lists(st.integers(1, max(1, len(body) - 1)), max_size=2))
    cuts = sorted({c for c in cuts if 0 < c < len(body)})
    pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    spell = draw(SIZES)
    wire = [b"%s\r\n%s\r\n" % (spell % len(p), p) for p in pieces if p]
    if draw(st.integers(0, 7)) == 0:  # a last chunk too early: the body ends there
        wire.insert(draw(st.integers(0, len(wire))), b"0\r\n\r\n")
    wire.append(draw(st.sampled_from([b"0\r\n\r\n", b"0\r\n\r\n", b"0\r\nx-t: 1\r\n\r\n", b""])))
    # reads: the head with the first chunks or alone, then runs of whole chunks, and a few
    # cuts anywhere
    reads, cur = [], HEAD
    for w in wire:
        if draw(st.integers(0, 3)) == 0 and cur:
            reads.append(cur)
            cur = b""
        cur += w
    reads.append(cur)
    out = []
    for r in reads:
        if len(r) > 2 and draw(st.integers(0, 5)) == 0:
            k = draw(st.integers(1, len(r) - 1))
            out += [r[:k], r[k:]]
        elif r:
            out.append(r)
    return out


def _outcome(reads: list[bytes], compiled: bool, stdlib: bool = False):
    response.use_compiled_read(compiled)
    response.use_stdlib_json(stdlib)
    try:
        rec = RequestRecord(id="c", index=0, prompt_len=3, output_len=8)
        r = response.Response(rec, True, True)
        r.sent(500)
        ended, exc = through_conn(r, reads)
        if exc is None and ended:
            try:
                r.end(10_000)
            except response.RequestFailed as e:
                exc = e
        if exc is not None:
            response.fail_record(rec, getattr(exc, "kind", "x"), str(exc))
        response.finish(rec, r, 0, 10_000)
        return (
            ended,
            None if exc is None else (type(exc).__name__, str(exc)),
            r.state,
            r.chunks,
            r.sends,
            _kinds(r.kinds),
            r.first_merged,
            r.tail,
            r.parser.pending,
            dataclasses.asdict(rec),
        )
    finally:
        response.use_compiled_read(True)
        response.use_stdlib_json(False)


def _kinds(k: StreamKinds) -> dict:
    return {name: getattr(k, name) for name in StreamKinds.__slots__}


def _same(reads: list[bytes]):
    compiled, python = _outcome(reads, True), _outcome(reads, False)
    assert compiled == python
    assert _outcome(reads, True, stdlib=True) == _outcome(reads, False, stdlib=True)
    return compiled


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(responses())
def test_any_response_in_any_reads_gives_the_same_record_on_both_paths(reads):
    require_compiled()
    _same(reads)


def _reference(data: bytes, decode: bool, t: int):
    """What the Python pieces make of one read (no partial event held)."""
    whole = whole_chunks(data)
    if whole is None:
        return None
    body, last = whole
    events = SSEParser().feed(body)
    sends: list = []
    n = fast_events.count_common(events, sends, t) if decode else 0
    return body, last, events, n, sends


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(EVENT, STYLE), min_size=1, max_size=6), SIZES, st.booleans())
def test_one_read_agrees_with_the_python_pieces(events, spell, end):
    """A read of whole chunks: the same body, end, events, and never more common chunks than
    the typed decode counts (it may refuse more: those go to the Python loop)."""
    require_compiled()
    wire = b"".join(b"%s\r\n%s\r\n" % (spell % len(x), x) for x in (_sse(e, s) for e, s in events))
    wire += b"0\r\n\r\n" if end else b""
    for decode in (True, False):
        sends: list = []
        got = cread.SCAN(wire, decode, sends, 77)
        ref = _reference(wire, decode, 77)
        if got is None:  # it reads only the `%x` spelling; the Python path reads the rest
            assert spell != b"%x" or ref is None
            continue
        assert ref is not None
        body, last, events_ref, n_ref, sends_ref = ref
        g_last, payload, n, ascii = got
        assert (g_last, ascii) == (last, body.isascii())
        if type(payload) is bytes:
            assert payload == body
            assert n == 0
        else:
            assert payload == events_ref[n:] and n <= n_ref and sends == sends_ref[: len(sends)]
            if spell == b"%x" and all(s == 0 for _, s in events) and not decode:
                assert n == 0


# classifier states a stream's next event may meet: fresh, after blank text, inside <think>,
# after field reasoning, after the answer began
BEFORE = [
    [],
    [b'{"choices":[{"token_ids":[1],"text":" "}]}'],
    [b'{"choices":[{"token_ids":[1],"text":"<think> r"}]}'],
    [b'{"choices":[{"token_ids":[1],"delta":{"reasoning":"r"}}]}'],
    [b'{"choices":[{"token_ids":[1],"text":"a"}]}'],
]


@settings(max_examples=300, deadline=None)
@given(EVENT, st.sampled_from(REASONING_PARSERS), st.sampled_from(BEFORE))
def test_first_is_what_apply_does_with_the_event(event, mode, before):
    """`cread.first` takes an event only where what `_events` then does (one token id, the
    classifier told its text) leaves the state, the classifier and the sends exactly as
    orjson + `_apply` would, in every classifier state and mode."""
    require_compiled()
    got = cread.FIRST(event)
    try:
        obj = json.loads(event)
    except ValueError:
        assert got is None
        return
    if got is None:
        return
    text, t_send = got
    assert t_send == obj.get("t_send_ns") and ("t_send_ns" in obj) == (t_send is not None)
    states = []
    for path in ("apply", "first"):
        state: dict = {}
        kinds = StreamKinds(mode)
        for e in before:
            response._apply(json.loads(e), state, True, kinds)
        if path == "apply":
            assert response._apply(obj, state, True, kinds) == 1
        else:
            state["ids_total"] = state.get("ids_total", 0) + 1
            kinds.tokens(1, *kinds.content(text))
        states.append((state, _kinds(kinds)))
    assert states[0] == states[1]


@settings(max_examples=300, deadline=None)
@given(EVENT, st.sampled_from(REASONING_PARSERS), st.sampled_from(BEFORE))
def test_last_is_what_apply_does_with_the_finish_chunk(event, mode, before):
    """`cread.last` takes an event only where what `_events` then does (its `cbbench`
    object and finish reason into the state, one token id, the classifier told its text)
    leaves the state, the classifier and the sends exactly as orjson + `_apply` would."""
    require_compiled()
    got = cread.LAST(event)
    try:
        obj = json.loads(event)
    except ValueError:
        assert got is None
        return
    if got is None:
        return
    text, t_send, reason, cb = got
    assert reason is not None or cb is not None  # the common chunk is the counted paths'
    assert t_send == obj.get("t_send_ns") and ("t_send_ns" in obj) == (t_send is not None)
    states = []
    for path in ("apply", "last"):
        state: dict = {}
        kinds = StreamKinds(mode)
        for e in before:
            response._apply(json.loads(e), state, True, kinds)
        if path == "apply":
            assert response._apply(obj, state, True, kinds) == 1
        else:
            if cb is not None:
                state["cbbench"] = response.parse_json(cb)
            if reason is not None:
                state["finish"] = reason
            state["ids_total"] = state.get("ids_total", 0) + 1
            kinds.tokens(1, *kinds.content(text))
        states.append((state, _kinds(kinds)))
    assert states[0] == states[1]


def test_last_takes_the_finish_chunks_and_refuses_the_rest():
    require_compiled()
    takes = [cread.LAST(e) for e in LAST_SHAPES[:7]]
    assert all(t is not None for t in takes)
    assert takes[0][1:] == (7, "length", FAKE_CB)
    assert takes[1] == (" a", 3, "stop", None)
    for event in LAST_SHAPES[7:] + [SERVER + b"}", SERVER + b', "t_send_ns": 1}']:
        assert cread.LAST(event) is None, event


@settings(max_examples=300, deadline=None)
@given(EVENT, st.sampled_from(BEFORE))
def test_usage_is_what_apply_does_with_the_usage_chunk(event, before):
    """`cread.usage` takes an event only where what `_events` then does (the prompt and
    completion counts into the state, no token) is what orjson + `_apply` do with it."""
    require_compiled()
    got = cread.USAGE(event)
    try:
        obj = json.loads(event)
    except ValueError:
        assert got is None
        return
    if got is None:
        return
    states = []
    for path in ("apply", "usage"):
        state: dict = {"usage_out": 1}  # an earlier usage (vLLM's continuous usage)
        kinds = StreamKinds("auto")
        for e in before:
            response._apply(json.loads(e), state, True, kinds)
        if path == "apply":
            assert response._apply(obj, state, True, kinds) == 0
        else:
            state["usage_prompt"] = got[0]
            if got[1] is not None:
                state["usage_out"] = got[1]
        states.append((state, _kinds(kinds)))
    assert states[0] == states[1]


def test_usage_takes_the_usage_chunks_and_refuses_the_rest():
    require_compiled()
    want = [(16, 16), (None, None), (None, -4), (2**63 - 1, None)]
    assert [cread.USAGE(e) for e in USAGE_SHAPES[:4]] == want
    for event in USAGE_SHAPES[4:]:
        assert cread.USAGE(event) is None, event


def test_first_refuses_what_it_cannot_decide_alone():
    require_compiled()
    take = {
        b'{"choices":[{"token_ids":[4],"text":"a"}],"t_send_ns":-3}': ("a", -3),
        b'{"choices":[{"token_ids":[4],"delta":{"content":"\xc3\xa9"}}]}': ("\u00e9", None),
        b'{"choices":[{"token_ids":[4],"delta":{},"text":" x"}]}': (" x", None),
        b'{"choices":[{"token_ids":[4],"delta":{"content":"b","reasoning":null}}]}': ("b", None),
    }
    for event, want in take.items():
        assert cread.FIRST(event) == want, event
    for event in FIRST_SHAPES[1:2] + FIRST_SHAPES[4:5] + FIRST_SHAPES[6:9] + [
        FIRST_SHAPES[11],
        FIRST_SHAPES[12],
        FIRST_SHAPES[13],
        FIRST_SHAPES[16],
        FIRST_SHAPES[17],
        b'{"choices":[{"token_ids":[4],"text":"a","finish_reason":"stop"}]}',
        b'{"choices":[{"token_ids":[4],"text":"a"}],"cbbench":{}}',
        b'{"choices":[{"token_ids":[4,5],"text":"a"}]}',
        b'{"choices":[{"token_ids":[4],"text":"a"},{"token_ids":[5]}]}',
    ]:
        assert cread.FIRST(event) is None, event


def _times_reference(chunks, t0):
    tt = [(t - t0) / 1e9 for t in response.spread(chunks)]
    return tt, [b - a for a, b in zip(tt, tt[1:], strict=False)]


STAMP = st.one_of(st.integers(0, 2**53 - 1), st.integers(20 * 10**12, 20 * 10**12 + 10**10))


@settings(max_examples=400, deadline=None)
@given(
    STAMP,
    st.lists(
        st.tuples(
            st.one_of(st.integers(0, 10**6), st.integers(0, 2**41)),
            st.one_of(st.integers(1, 3), st.integers(1, 300)),
        ),
        min_size=1,
        max_size=12,
    ),
)
def test_finish_token_times_in_c_are_the_python_floats(t0, steps):
    """finish's C token times and gaps: bit for bit the floats of spread + the list loops
    (int / int, int + float, truncation), or None outside [0, 2**53) where Python decides."""
    require_compiled()
    t, chunks = t0, []
    for dt, k in steps:
        t += dt
        chunks.append((t, k))
    got = cread.TIMES(chunks, t0)
    if t >= 2**53:
        assert got is None
        return
    assert got == _times_reference(chunks, t0)
    later = min(t0 + 5, 2**53 - 1)  # a stamp before t0
    assert cread.TIMES(chunks, later) == _times_reference(chunks, later)


def test_finish_token_times_in_c_refuse_what_python_decides():
    require_compiled()
    for chunks, t0 in (
        ([(5, 0)], 0),  # no tokens in a read
        ([(5, 1), (7, -1)], 0),
        ([(2**53, 1)], 0),
        ([(5, 1)], -1),
        ([(5.0, 1)], 0),
        ([(5, 1, 0)], 0),
        ([(True, 1)], 0),
        ([(5, 2**31)], 0),
    ):
        assert cread.TIMES(chunks, t0) is None, chunks


def test_the_servers_own_stream_takes_the_compiled_path():
    """The fake server's stream (an event a chunk, the common chunk with t_send_ns): every
    body read goes through one C call and the record is the Python path's."""
    require_compiled()
    calls: list = []
    counted: list[int] = []
    scan, count = cread.SCAN, cread.COUNT

    def spy(data, decode, sends, t):
        got = scan(data, decode, sends, t)
        calls.append(got if got is None else (got[0], got[2]))
        return got

    def count_spy(events, start, sends, t):
        counted.append(count(events, start, sends, t))
        return counted[-1]

    async def go(url: str) -> RequestRecord:
        client = OpenAIClient(ClientConfig(base_url=url, model="m", collect_server_times=True))
        try:
            return await client.send(
                RequestRecord(id="c", index=1, prompt_len=3, output_len=24), [1]
            )
        finally:
            await client.aclose()

    records = {}
    with threaded(FakeServerConfig(Behavior())) as srv:
        for compiled in (True, False):
            response._scan, response._count = (spy, count_spy) if compiled else (None, None)
            try:
                records[compiled] = asyncio.run(go(srv.url))
            finally:
                response.use_compiled_read(True)
    assert calls and None not in calls, calls
    # all but the first token (the stream classifier sees it first) and the last (its finish)
    assert sum(n for _, n in calls) + sum(counted) == 22
    assert calls[-1][0] is True  # the body's end came through it too
    a, b = records[True], records[False]
    assert a.ok and b.ok and a.output_tokens_client == b.output_tokens_client == 24
    assert len(a.extra["server_send_ns"]) == len(b.extra["server_send_ns"]) == 24


def _env(extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "CBBENCH_NO_CREAD"}
    return {**env, **extra}


def _child(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        env=_env(env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_failed_build_falls_back_with_one_line_and_the_same_results(tmp_path):
    code = (
        "from cbbench.harness.client import cread, response as r\n"
        "print(cread.SCAN, r._scan is None, cread.reason())"
    )
    env = {"CBBENCH_KERNEL_DIR": str(tmp_path), "CC": "false"}
    first = _child(code, env)
    assert first.returncode == 0, first.stderr
    notes = [ln for ln in first.stderr.splitlines() if ln.startswith(cread.PREFIX)]
    assert len(notes) == 1 and "did not build" in notes[0] and "Python path" in notes[0]
    assert first.stdout.startswith("None True build failed")
    again = _child(code, env)  # remembered: no second attempt, no second note
    assert cread.PREFIX not in again.stderr and "build failed before" in again.stdout
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    odd = _child(code, {"CBBENCH_KERNEL_DIR": str(blocked)})  # a cache it cannot write
    assert odd.returncode == 0 and odd.stdout.startswith("None True unavailable"), odd.stdout
    assert [ln for ln in odd.stderr.splitlines() if ln.startswith(cread.PREFIX)], odd.stderr
    off = _child(code, {"CBBENCH_NO_CREAD": "1"})
    assert off.stdout.startswith("None True off"), off.stdout
    # `python -m ... cread` retries (and fails again, exit 1, one line saying why)
    retry = subprocess.run(
        [sys.executable, "-m", "cbbench.harness.client.cread"],
        env=_env(env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert retry.returncode == 1 and "build failed" in retry.stdout


def test_a_fresh_build_in_an_empty_folder_is_used(tmp_path):
    require_compiled()
    code = "from cbbench.harness.client import cread; print(cread.SCAN is not None)"
    t0 = time.monotonic()
    out = _child(code, {"CBBENCH_KERNEL_DIR": str(tmp_path)})
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr
    assert list((tmp_path / "client").glob("_cbbench_cread-*.so")), "no module in the cache"
    assert time.monotonic() - t0 < 60
