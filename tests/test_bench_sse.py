from cbbench.harness.client.sse import SSEParser
from hypothesis import given, settings
from hypothesis import strategies as st


def test_events_split_anywhere_and_several_per_read():
    p = SSEParser()
    assert p.feed(b'data: {"a"') == []
    assert p.feed(b": 1}\n") == []
    assert p.feed(b"\ndata: x\n\ndata: [DO") == [b'{"a": 1}', b"x"]
    assert p.feed(b"NE]\n\n") == [b"[DONE]"]
    assert p.pending == b""


def test_crlf_split_between_cr_and_lf():
    p = SSEParser()
    assert p.feed(b"data: a\r\n\r") == []
    assert p.feed(b"\ndata: b\r\n\r\n") == [b"a", b"b"]


def test_comments_other_fields_and_multiline_data():
    p = SSEParser()
    out = p.feed(b": keep-alive\n\nevent: msg\nid: 3\ndata: one\ndata:two\n\n")
    assert out == [b"one\ntwo"]


def test_a_read_of_whole_one_line_events_and_what_leaves_that_path():
    p = SSEParser()
    assert p.feed(b"data: {}\n\ndata:  x\n\ndata: \n\n") == [b"{}", b" x", b""]
    mixed = b"data: a\n\n: ping\n\ndata: b\ndata: c\n\nid: 4\ndata: d\n\ndata:e\n\n"
    assert p.feed(mixed) == [b"a", b"b\nc", b"d", b"e"]
    assert p.feed(b"data: f\n\ndata: g") == [b"f"] and p.feed(b"\n\n") == [b"g"]


def test_truncated_stream_leaves_pending_bytes():
    p = SSEParser()
    assert p.feed(b"data: x\n\ndata: half") == [b"x"]
    assert p.pending == b"data: half"


@settings(max_examples=150, deadline=None)
@given(
    payloads=st.lists(
        st.binary(min_size=1, max_size=40).filter(lambda b: b"\n" not in b and b"\r" not in b),
        max_size=12,
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=10),
    crlf=st.booleans(),
)
def test_any_split_gives_the_same_events(payloads, cuts, crlf):
    nl = b"\r\n" if crlf else b"\n"
    stream = b"".join(b"data: " + x + nl + nl for x in payloads)
    bounds = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    p = SSEParser()
    out = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        out += p.feed(stream[a:b])
    assert out == payloads
