"""The stream classifier (harness/client/stream_kinds.py) and the response handler around it:
reasoning in `reasoning`, `reasoning_content` or inline `<think>` tags is told from the answer
and tool-call tokens on every parsing path (msgspec, orjson, stdlib), TTFO is timed from the
first answer token, and bad input is flagged, never raised. "compiled": each event a chunk read
through the raw client's compiled read path (harness/client/cread.py)."""

from __future__ import annotations

import json

import pytest
from cbbench.harness.client import fast_events, response
from cbbench.harness.client.stream_kinds import StreamKinds
from cbbench.harness.results.records import RequestRecord
from read_paths import feed, require_compiled

PATHS = ("msgspec", "orjson", "stdlib", "compiled")


def _delta(i: int, ids: bool = True, **delta) -> bytes:
    c: dict = {"index": 0, "finish_reason": None, "delta": delta}
    if ids:
        c["token_ids"] = [100 + i]
    return json.dumps({"id": "x", "object": "chat.completion.chunk", "choices": [c]}).encode()


def _usage(out: int, reasoning: int | None) -> bytes:
    usage: dict = {"prompt_tokens": 3, "completion_tokens": out, "total_tokens": out + 3}
    if reasoning is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return json.dumps({"id": "x", "choices": [], "usage": usage}).encode()


def _run(path: str, events: list[bytes], mode: str = "auto", gap_ns: int = 10_000_000):
    """Each event its own read, `gap_ns` apart, the first 50 ms after the send."""
    response.use_stdlib_json(path == "stdlib")
    response.count_common = fast_events.count_common if path == "msgspec" else None
    if path == "compiled":
        require_compiled()
    read = feed if path == "compiled" else response.Response.data
    try:
        rec = RequestRecord(id="c", index=0, prompt_len=3, output_len=64)
        r = response.Response(rec, True, False, None, mode)
        r.status = 200
        r.sent(0)
        t = 50_000_000
        for e in events:
            read(r, b"data: " + e + b"\n\n", t)
            t += gap_ns
        read(r, b"data: [DONE]\n\n", t)
        r.end(t)
        response.finish(rec, r, 0, t)
        return rec
    finally:
        response.use_stdlib_json(False)


def _reasoning_stream(field: str, n_r: int = 32, n_a: int = 32, ids: bool = True) -> list[bytes]:
    ev = [_delta(0, ids, role="assistant", content="")] if not ids else []
    ev += [_delta(i, ids, **{field: f" r{i}"}) for i in range(n_r)]
    ev += [_delta(n_r + i, ids, content=f" a{i}") for i in range(n_a)]
    return [*ev, _usage(n_r + n_a, n_r)]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
@pytest.mark.parametrize("ids", [True, False])
def test_reasoning_fields_time_ttfo_from_the_first_answer_token(path, field, ids):
    rec = _run(path, _reasoning_stream(field, ids=ids))
    first = 0.05 if ids else 0.06  # without ids, the role chunk carries no token
    assert rec.ok and rec.output_tokens_client == 64 and rec.output_tokens_server == 64
    assert rec.ttft_s == pytest.approx(first)
    assert rec.ttfo_s == pytest.approx(first + 0.32)
    assert rec.reasoning_s == pytest.approx(0.32)
    assert rec.reasoning_tokens == 32
    assert rec.tpot_s == pytest.approx(0.01) and rec.answer_tpot_s == pytest.approx(0.01)
    assert rec.stream_flags == [] and rec.token_mismatch is None


@pytest.mark.parametrize("path", PATHS)
def test_think_tags_inline_split_over_chunks(path):
    pieces = ["<think>", " hmm", " so", "</th", "ink>", "\n\nYes", " it", " is"]
    events = [_delta(i, True, content=p) for i, p in enumerate(pieces)]
    rec = _run(path, [*events, _usage(8, None)])
    assert rec.reasoning_tokens == 5  # <think>, hmm, so, </th, ink>
    assert rec.ttfo_s == pytest.approx(0.05 + 0.05)
    assert rec.stream_flags == []
    # --reasoning-parser none: every token is an answer token
    rec = _run(path, [*events, _usage(8, None)], mode="none")
    assert rec.ttfo_s == rec.ttft_s and rec.reasoning_s == 0 and not rec.reasoning_tokens


@pytest.mark.parametrize("path", PATHS)
def test_think_tags_mode_starts_inside_reasoning(path):
    """DeepSeek-R1's template opens <think> in the prompt: the output only closes it."""
    pieces = [" hmm", " so", "</think>", "Yes", " it"]
    events = [*(_delta(i, True, content=p) for i, p in enumerate(pieces)), _usage(5, None)]
    rec = _run(path, events, mode="think-tags")
    assert rec.reasoning_tokens == 3 and rec.ttfo_s == pytest.approx(0.08)
    rec = _run(path, events, mode="auto")  # auto sees no <think>: all answer
    assert rec.reasoning_tokens == 0 and rec.ttfo_s == rec.ttft_s


def test_a_chunk_ending_reasoning_and_starting_the_answer_splits_its_tokens():
    k = StreamKinds()
    k.add({"delta": {"reasoning": "abc"}}, 3)
    k.add({"delta": {"reasoning": "d", "content": "e"}}, 2)  # 1 reasoning, 1 answer
    assert (k.reasoning, k.answer_at, k.n) == (4, 4, 5) and k.plain
    k = StreamKinds()
    k.add({"delta": {"content": "<think>x</think>y"}}, 3)
    assert (k.reasoning, k.answer_at) == (2, 2)


def test_a_token_of_no_text_keeps_its_fields_kind():
    """A token that decodes to "" (part of a UTF-8 sequence) still counts, as its field's."""
    k = StreamKinds()
    k.add({"delta": {"role": "assistant", "reasoning": ""}}, 1)
    k.add({"delta": {"reasoning": "x", "content": None}}, 1)
    k.add({"delta": {"content": ""}}, 1)  # after reasoning: the answer's first token
    k.add({"delta": {"content": "y", "reasoning": ""}}, 1)
    assert (k.reasoning, k.answer_at, k.flags) == (2, 2, [])
    k = StreamKinds()
    k.add({"delta": {"role": "assistant", "content": ""}}, 1)  # before anything: no kind yet
    k.add({"delta": {"content": "<think>"}}, 1)
    assert (k.reasoning, k.answer_at) == (1, None)
    k = StreamKinds("think-tags")
    k.add({"delta": {"content": "a"}}, 1)
    k.add({"delta": {"content": ""}}, 1)  # inside <think>: reasoning
    k.add({"delta": {"content": "</think>"}}, 1)
    k.add({"delta": {"content": "b"}}, 1)
    assert (k.reasoning, k.answer_at) == (3, 3)


def test_blank_content_after_field_reasoning_is_the_answer_starting():
    """vLLM's deepseek_r1 parser often starts the content with "\n\n" after </think>."""
    k = StreamKinds()
    k.add({"delta": {"reasoning": "hmm"}}, 1)
    k.add({"delta": {"content": "\n\n"}}, 1)
    k.add({"delta": {"content": "Yes"}}, 1)
    assert (k.reasoning, k.answer_at) == (1, 1)
    k = StreamKinds()  # no reasoning yet: blank content decides nothing
    k.add({"delta": {"content": "\n"}}, 1)
    k.add({"delta": {"content": "<think>x"}}, 1)
    assert (k.reasoning, k.answer_at, k.in_think) == (1, None, True)


def test_tool_call_arguments_are_output_not_reasoning():
    k = StreamKinds()
    k.add({"delta": {"reasoning": "plan"}}, 1)
    call = [{"index": 0, "function": {"arguments": '{"q":'}}]
    k.add({"delta": {"tool_calls": call}}, 2)
    assert (k.reasoning, k.tool, k.answer_at) == (1, 2, 1)


@pytest.mark.parametrize("path", PATHS)
def test_bad_input_is_flagged_and_counted_never_raised(path):
    # both fields in one stream
    ev = [_delta(0, reasoning="a"), _delta(1, reasoning_content="b"), _delta(2, content="c")]
    rec = _run(path, ev)
    assert rec.ok and rec.stream_flags == ["mixed_reasoning_fields"] and rec.reasoning_tokens == 2
    # both fields in one delta with the same text (a server filling both): not a mix
    rec = _run(path, [_delta(0, reasoning="a", reasoning_content="a"), _delta(1, content="c")])
    assert rec.stream_flags == [] and rec.reasoning_tokens == 1
    # reasoning after the answer began
    rec = _run(path, [_delta(0, content="c"), _delta(1, reasoning="late"), _delta(2, content="d")])
    assert rec.ok and rec.stream_flags == ["reasoning_after_answer"]
    assert rec.ttfo_s == rec.ttft_s and rec.reasoning_tokens == 1
    # a <think> never closed: no answer, no TTFO
    rec = _run(path, [_delta(i, content=p) for i, p in enumerate(["<think>", "x", "y"])])
    assert rec.ok and rec.stream_flags == ["unclosed_think"]
    assert rec.ttfo_s is None and rec.reasoning_tokens == 3
    # usage reasoning tokens above the total: flagged, the streamed count kept
    ev = [_delta(0, reasoning="a"), _delta(1, content="c"), _usage(2, 9)]
    rec = _run(path, ev)
    assert rec.ok and rec.stream_flags == ["usage_reasoning_above_total"]
    assert rec.reasoning_tokens == 1


@pytest.mark.parametrize("path", PATHS)
def test_usage_reasoning_count_reconciled_like_the_output_count(path):
    # no ids, several tokens a chunk: the server's usage details give the count
    ev = [_delta(0, False, reasoning="a b c"), _delta(1, False, content="d e"), _usage(5, 3)]
    rec = _run(path, ev)
    assert rec.reasoning_tokens == 3 and rec.token_mismatch is None
    # streamed ids are exact: they win, and the disagreement is noted
    ev = [_delta(0, reasoning="a"), _delta(1, content="d"), _usage(2, 0)]
    rec = _run(path, ev)
    assert rec.reasoning_tokens == 1 and "reasoning_tokens 0 != 1" in rec.token_mismatch


def test_non_streaming_message_reasoning_and_usage():
    body = {
        "choices": [
            {"index": 0, "finish_reason": "length",
             "message": {"role": "assistant", "reasoning": "hmm", "content": "yes"}}
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 40, "total_tokens": 43,
                  "completion_tokens_details": {"reasoning_tokens": 30}},
    }  # fmt: skip
    rec = RequestRecord(id="c", index=0, prompt_len=3, output_len=40)
    r = response.Response(rec, False, False)
    r.status = 200
    r.sent(0)
    r.data(json.dumps(body).encode(), 1)
    r.end(10)
    response.finish(rec, r, 0, 10)
    assert rec.ok and rec.reasoning_tokens == 30 and rec.output_tokens_server == 40
    assert rec.ttfo_s is None and rec.ttft_s is None  # no stream: no first-token times


def test_the_typed_fast_path_takes_over_once_the_answer_began():
    """Reasoning chunks go to the classifier; from the first answer token on, the rest of the
    same read is counted by msgspec's typed decode (fast_events.py), as plain streams are."""
    counted: list[int] = []

    def spy(events, sends, t, ascii=False):
        n = fast_events.count_common(events, sends, t, ascii)
        counted.append(n)
        return n

    ev = [_delta(0, reasoning="r"), _delta(1, reasoning="r"), _delta(2, content="a")]
    ev += [_delta(3 + i, content=" b") for i in range(13)]
    response.count_common = spy
    try:
        rec = RequestRecord(id="c", index=0, prompt_len=3, output_len=16)
        r = response.Response(rec, True, False)
        r.status = 200
        r.sent(0)
        r.data(b"".join(b"data: " + e + b"\n\n" for e in ev), 10)  # one read
        r.data(b"data: " + _delta(16, content=" c") + b"\n\ndata: [DONE]\n\n", 20)
        r.end(20)
        response.finish(rec, r, 0, 20)
    finally:
        response.count_common = fast_events.COUNT_COMMON
    assert counted == [13, 1]  # the read's tail after the answer began, then the next read
    assert rec.reasoning_tokens == 2 and rec.output_tokens_client == 17
    assert r.kinds.n == 17 and r.kinds.answer_at == 2 and r.chunks == [(10, 16), (20, 1)]


def test_other_apis_feed_kinds_directly():
    """A Responses- or Messages-style parser says the kind itself; the counting is shared."""
    k = StreamKinds()
    k.tokens(3, reasoning=True, answer=False)  # e.g. response.reasoning_text.delta
    r, a = k.content("Hello")  # e.g. response.output_text.delta
    k.tokens(2, r, a)
    k.tokens(1, False, False, tool=True)  # function-call arguments
    assert (k.reasoning, k.answer_at, k.tool, k.n) == (3, 3, 1, 6)
    k = StreamKinds()
    r, a = k.content("<think>plan</think>Yes")
    k.tokens(4, r, a)
    assert (k.reasoning, k.answer_at) == (3, 3)


@pytest.mark.parametrize("path", PATHS)
def test_a_plain_answer_that_begins_with_blank_text_has_ttfo_equal_ttft(path):
    """Blank leading tokens wait to see whether a <think> follows; when none does they were
    the answer's (a tiny random model often starts with whitespace): TTFO = TTFT."""
    pieces = ["\n", " ", "Yes", " it", " is"]
    rec = _run(path, [*[_delta(i, True, content=p) for i, p in enumerate(pieces)],
                      _usage(5, None)])  # fmt: skip
    assert rec.reasoning_tokens == 0
    assert rec.ttfo_s == pytest.approx(rec.ttft_s) == pytest.approx(0.05)
    # before a <think>, the same blank text is neither: TTFO after the reasoning
    pieces = ["\n", "<think>", " hmm", "</think>", "Yes"]
    rec = _run(path, [*[_delta(i, True, content=p) for i, p in enumerate(pieces)],
                      _usage(5, None)])  # fmt: skip
    assert rec.reasoning_tokens == 3 and rec.ttfo_s == pytest.approx(0.05 + 0.04)
