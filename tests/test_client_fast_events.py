"""The typed decode of the common SSE chunk (harness/client/fast_events.py, msgspec) counts
exactly what the general path counts: the same tokens, the same server send times, the same
failure, on the server's own chunks and on hostile ones. Each case runs the response handler
with and without msgspec, on orjson and on the stdlib (an install without orjson), and through
the raw client's compiled read path (harness/client/cread.py: each read framed as a chunk)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import pytest
from cbbench.harness.client import fast_events, response
from cbbench.harness.client.api import ClientConfig, OpenAIClient
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.servers.fake_server import MODEL_ID, _chunk
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from read_paths import feed, require_compiled
from servers.fake import Behavior, FakeServerConfig, threaded

PATHS = ("msgspec", "orjson", "msgspec+stdlib", "stdlib", "compiled", "compiled+stdlib")

# the fake server's hot-path chunk, byte for byte as it writes it (a template + t_send_ns)
SERVER = json.dumps(_chunk("text_completion", False, False, 1, True, None))[:-1].encode()


def _common(t_send: int | None = 7, **choice) -> bytes:
    c = {"index": 0, "finish_reason": None, "text": " tok", "token_ids": [10], **choice}
    obj: dict = {"id": "x", "object": "text_completion", "model": MODEL_ID, "choices": [c]}
    if t_send is not None:
        obj["t_send_ns"] = t_send
    return json.dumps(obj).encode()


def _use(path: str) -> None:
    response.use_stdlib_json(path.endswith("stdlib"))
    response.count_common = fast_events.count_common if "msgspec" in path else None
    if path.startswith("compiled"):
        require_compiled()
    response.use_compiled_read(path.startswith("compiled"))


def _reset() -> None:
    response.use_stdlib_json(False)
    response.use_compiled_read(True)


def _outcome(path: str, reads: list[bytes], reply=None):
    """What the handler made of `reads` on one path: state, chunks, sends, the failure."""
    _use(path)
    try:
        r = response.Response(
            RequestRecord(id="c", index=0, prompt_len=1, output_len=1), True, True
        )
        r.status = 200
        err = None
        try:
            for i, raw in enumerate(reads):
                if path.startswith("compiled"):
                    feed(r, raw, 1000 + i)
                else:
                    r.data(raw, 1000 + i)
        except Exception as e:  # noqa: BLE001 - compared across paths, kind and message
            err = (type(e).__name__, getattr(e, "kind", None), str(e))
        return r.state, r.chunks, r.sends, err
    finally:
        _reset()


def _read(*events: bytes) -> bytes:
    return b"".join(b"data: " + e + b"\n\n" for e in events)


def _same_on_all_paths(reads: list[bytes]):
    typed, plain, typed_std, std, compiled, compiled_std = (_outcome(p, reads) for p in PATHS)
    assert typed == plain == compiled
    assert typed_std == std == compiled_std
    return typed


def test_the_servers_common_chunk_takes_the_typed_path():
    events = [SERVER + b', "t_send_ns": %d}' % (10**18 + i) for i in range(16)]
    assert fast_events.count_common(events, sends := [], 5) == 16
    assert sends == [(5, 10**18 + i) for i in range(16)]
    state, chunks, got, err = _same_on_all_paths([_read(*events)])
    assert err is None and state == {"ids_total": 16} and chunks == [(1000, 16)]
    assert got == [(1000, 10**18 + i) for i in range(16)]


def test_a_read_stops_at_its_first_other_event_and_keeps_the_order():
    final = _common(9, finish_reason="stop")
    events = [_common(1), _common(2), final, _common(3), b"[DONE]"]
    assert fast_events.count_common(events, [], 0) == 2
    state, chunks, sends, err = _same_on_all_paths([_read(*events)])
    assert err is None and state["done"] and state["finish"] == "stop"
    assert chunks == [(1000, 4)] and [s for _, s in sends] == [1, 2, 9, 3]


def test_without_t_send_ns_nothing_goes_to_sends():
    state, chunks, sends, err = _same_on_all_paths([_read(_common(None), _common(None))])
    assert err is None and chunks == [(1000, 2)] and sends == []


B = b'{"choices":[{"token_ids":[1]}]'
HOSTILE = [
    # what routes to the general path: finish, usage, cbbench, prompt ids, several / bad ids
    B + b',"usage":{"completion_tokens":3}}',
    B + b',"usage":null,"usage":{"completion_tokens":3}}',
    B + b',"us\\u0061ge":{"completion_tokens":3}}',
    B + b',"cbbench":{"queue_time_s":0.5}}',
    B + b',"c\\u0062bench":null}',
    b'{"choices":[{"token_ids":[1],"finish_re\\u0061son":"length"}]}',
    b'{"choices":[{"token_ids":[1],"finish_reason":""}]}',
    b'{"choices":[{"token_ids":[1],"prompt_token_ids":[1,2,3]}]}',
    b'{"choices":[{"token_ids":[1,2]}]}',
    b'{"choices":[{"token_ids":[1],"token_ids":[1,2]}]}',
    b'{"choices":[{"token_ids":[-1]}]}',
    b'{"choices":[{"token_ids":[true]}]}',
    b'{"choices":[{"token_ids":[1.0]}]}',
    b'{"choices":[{"token_ids":[]}]}',
    b'{"choices":[{"token_ids":"1"}]}',
    b'{"choices":[{"token_ids":[99999999999999999999999]}]}',  # orjson: a float
    b'{"choices":[{"token_ids":[18446744073709551615]}]}',  # 2**64 - 1: still an int
    b'{"choices":[{"token_ids":[18446744073709551616]}]}',
    b'{"choices":[{"token_ids":[-0]}]}',
    b'{"choices":[{"token_ids":[1]}],"choices":[]}',
    b'{"choices":[],"choices":[{"token_ids":[1]}]}',
    b'{"choices":[]}',
    b'{"choices":[1]}',
    b'{"choices":[{"token_ids":[1]},{"token_ids":[1]}]}',
    b'{"choices":[{"token_ids":[1]},7]}',
    b'{"ch\\u006fices":[{"token_ids":[1]}]}',
    b'{"choices":[],"error":{"message":"boom"}}',
    b'{"error":"boom","choices":[{"token_ids":[1]}]}',
    b"[1]",
    b"7",
    b"null",
    # t_send_ns: repeated, null, float, huge
    B + b',"t_send_ns":1,"t_send_ns":2}',
    B + b',"t_send_ns":null}',
    B + b',"t_send_ns":1.5}',
    B + b',"t_send_ns":-5}',
    B + b',"t_send_ns":18446744073709551616}',
    B + b',"t_send_ns":-9223372036854775809}',
    B + b',"t_send_ns":-9223372036854775808}',
    B + b',"t_send_\\u006es":7}',
    # bytes: not UTF-8 in a skipped value, surrogates, NaN, deep nesting, whitespace, junk
    B + b',"id":"\xff"}',
    B + b',"id":"\xed\xa0\x80"}',
    B + b',"id":"\xc0\xaf"}',
    B + b',"id":"\xe2\x82"}',
    B + b',"id":"\xf0\x9f\x98\x80 \xc3\xa9"}',
    B + b',"id":"\\ud800"}',
    B + b',"id":"\\udc00"}',
    B + b',"x":NaN}',
    B + b',"x":1e400}',
    B + b',"x":' + b"[" * 1000 + b"]" * 1000 + b"}",
    B + b',"x":' + b"[" * 1100 + b"]" * 1100 + b"}",
    b" \t" + B + b"}\r\n",
    b"\x0c" + B + b"}",
    B + b"} x",
    B + b",}",
    B + b',"x":"a\x01b"}',
    B + b',"x":01}',
    b'{"choices":[{"token_ids":[1]}]',
]


@pytest.mark.parametrize("event", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_events_give_the_general_paths_answer(event):
    # alone, after two common chunks in the same read, and split across two reads
    _same_on_all_paths([_read(event)])
    _same_on_all_paths([_read(_common(1), _common(2), event, _common(3))])
    whole = _read(_common(1), event, _common(2))
    _same_on_all_paths([whole[:40], whole[40:]])


@pytest.mark.parametrize("bad", [b"\xff", b"\xed\xa0\x80", b"\xc0\xaf", b"\xc3\xa9"])
def test_bytes_of_an_earlier_read_are_checked_for_utf8(bad):
    # the read that ends an event is ASCII, the bytes that are not came in the read before:
    # the per-read ASCII check must not let them through unchecked
    whole = _read(_common(1), B + b',"id":"' + bad + b'"}', _common(2))
    cut = whole.index(bad) + len(bad)
    assert not whole[:cut].isascii() and whole[cut:].isascii()
    state, chunks, _, err = _same_on_all_paths([whole[:cut], whole[cut:]])
    assert (err is None) == (bad == b"\xc3\xa9")


def test_a_stream_end_and_a_finish_reason_stop_the_typed_run():
    final = _common(9, finish_reason="length")
    assert fast_events.count_common([_common(1), final, _common(2)], [], 0) == 1
    assert fast_events.count_common([b"[DONE]", _common(1)], [], 0, ascii=True) == 0
    two = b'{"choices":[{"token_ids":[1]},{"token_ids":[1],"finish_reason":"stop"}]}'
    assert fast_events.count_common([two], [], 0) == 1  # the first choice decides, as below
    _same_on_all_paths([_read(two, final, b"[DONE]")])


def test_a_session_turn_keeps_the_general_path(monkeypatch):
    """With a Reply (a session's next turn needs the text), nothing is counted typed."""
    from cbbench.harness.client.reply import Reply

    monkeypatch.setattr(response, "count_common", fast_events.count_common)
    reply = Reply()
    r = response.Response(
        RequestRecord(id="c", index=0, prompt_len=1, output_len=1), True, False, reply
    )
    r.status = 200
    r.data(_read(_common(1), _common(2)), 5)
    assert (
        r.state["ids_total"] == 2 and reply.full_text == " tok tok" and reply.token_ids == [10, 10]
    )


KEYS = ["choices", "usage", "cbbench", "t_send_ns", "token_ids", "finish_reason",
        "prompt_token_ids", "error", "text", "id"]  # fmt: skip


def _key(name: str, escape: int) -> bytes:
    if escape < len(name):  # one character as a \\u escape: the same key to a JSON reader
        name = name[:escape] + f"\\u{ord(name[escape]):04x}" + name[escape + 1 :]
    return b'"' + name.encode() + b'"'


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.integers(2**62, 2**80),
    st.sampled_from([b"1.0", b"-0", b"NaN", b"1e400", b'"stop"', b'""', b'"\xc3\xa9"', b'"\xff"']),
)


def _value(depth: int):
    def enc(v) -> bytes:
        return v if isinstance(v, bytes) else json.dumps(v).encode()

    leaf = SCALARS.map(enc)
    if depth == 0:
        return leaf
    inner = _value(depth - 1)
    arr = st.lists(inner, max_size=3).map(lambda xs: b"[" + b",".join(xs) + b"]")
    obj = st.lists(st.tuples(st.sampled_from(KEYS), st.integers(0, 12), inner), max_size=4).map(
        lambda kv: b"{" + b",".join(_key(k, e) + b":" + v for k, e, v in kv) + b"}"
    )
    return st.one_of(leaf, arr, obj)


EVENTS = st.one_of(_value(4), _value(4).map(lambda v: b'{"choices":[' + v + b"]}"))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(EVENTS, min_size=1, max_size=3))
def test_generated_events_agree_with_the_general_path(events):
    _same_on_all_paths([_read(*events)])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 200), st.integers(0, 3), st.binary(max_size=3))))
def test_mutated_server_chunks_agree_with_the_general_path(edits):
    """The server's own chunk with bytes deleted, replaced or inserted at random."""
    event = bytearray(SERVER + b', "t_send_ns": 123}')
    for pos, cut, new in edits:
        pos %= len(event) + 1
        event[pos : pos + cut] = new
    if b"\n" in event or b"\r" in event:  # a line break is the SSE parser's, not the JSON's
        event = event.replace(b"\n", b" ").replace(b"\r", b" ")
    _same_on_all_paths([_read(_common(1), bytes(event), _common(2))])


def _send(url: str) -> RequestRecord:
    async def go() -> RequestRecord:
        cfg = ClientConfig(base_url=url, model="m", collect_server_times=True)
        client = OpenAIClient(cfg, time.monotonic_ns())
        rec = RequestRecord(id="cbb-1", index=1, prompt_len=3, output_len=12)
        try:
            return await client.send(rec, [1, 2, 3])
        finally:
            await client.aclose()

    return asyncio.run(go())


@pytest.mark.parametrize("path", PATHS)
def test_a_real_stream_gives_the_same_record_on_each_path(path):
    _use(path)
    try:
        with threaded(FakeServerConfig(Behavior())) as srv:
            r = _send(srv.url)
    finally:
        _reset()
    assert r.ok, r.error
    assert r.output_tokens_client == r.output_tokens_server == 12
    assert len(r.token_times_s) == 12 and r.prompt_tokens_server == 3
    assert len(r.extra["server_send_ns"]) == 12  # every chunk's t_send_ns, typed or not


def test_cbbench_no_msgspec_turns_it_off():
    code = "from cbbench.harness.client import response as r; print(r.count_common)"
    env = {**os.environ, "CBBENCH_NO_MSGSPEC": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "None", out.stderr
