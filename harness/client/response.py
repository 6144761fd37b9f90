"""One response handler behind every transport: the raw asyncio client (`http1.py`), httpx, and
the blocking `http.client` one that Locust users run on.

A transport only moves bytes. It tells a `Response` the status and headers (`head`), hands it
each read of the body with the read's arrival time (`data`), and says when the body ended
(`end`); `Response` does the rest, the same way for all three: SSE parsing, token counting,
HTTP errors (4xx/5xx with the server's message), the non-streaming body, a stream that ended
without `[DONE]`. `failure` maps any transport's exception to an error kind, and `finish`
turns what arrived into the record's timing (TTFT, ITL, TPOT, E2E).

Token counting. A chunk's count comes from `token_ids` (vLLM's `return_token_ids`, the
reference engine), else from a `usage` delta, else one token per non-empty text chunk. Ids
must be non-negative integers (anything else fails the request as a protocol error). When ids
were streamed, that count is exact: it times the request even if `usage.completion_tokens`
disagrees; the record says so in `token_mismatch` and the summary counts such records. Without
ids, `usage` gives TPOT's token count (a chunk may carry several tokens).

Token kinds. Every choice's tokens go to the one stream classifier (`stream_kinds.py`):
reasoning, answer or tool-call arguments; `finish` times TTFO from its first answer token and
reconciles `reasoning_tokens` with usage as above. The common-chunk fast paths count a chunk
only once the classifier says a bare chunk can only be an answer token.

A read that carries k tokens spreads the gap since the previous token evenly over its k tokens,
so the ITL list has one entry per token after the first and its mean equals TPOT (tokens of the
first read after the first one get gap 0: they arrived with it).

Over 400 lines because it is the one handler all three transports share: splitting it would
put back the per-transport copies it replaced.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import operator
import re
import time
from collections.abc import Callable

import httpx
from cbbench.harness.client import cread, fast_events, http1, stamped
from cbbench.harness.client.reply import Reply
from cbbench.harness.client.server_timing import server_times
from cbbench.harness.client.sse import SSEParser
from cbbench.harness.client.stream_kinds import USAGE_REASONING_ABOVE_TOTAL, StreamKinds
from cbbench.harness.client.turns import LoopMarks
from cbbench.harness.results.records import RequestRecord

ERROR_TEXT_LIMIT = 300

try:  # optional accelerator: ~2-4x faster on SSE payloads; the stdlib path stays tested
    import orjson

    _loads: Callable[[bytes], object] = orjson.loads
    JSON_DECODER = "orjson"
except ImportError:  # pragma: no cover - orjson is installed in CI
    orjson = None
    JSON_DECODER = "json"


def _parse_json_std(data: bytes):
    """json.loads for one payload, faster: raw_decode on str skips encoding detection."""
    text = data.decode()
    try:
        obj, end = _RAW_DECODE(text)
    except ValueError:
        return json.loads(text)  # leading whitespace, or the error message json.loads gives
    if end != len(text) and text[end:].strip():
        return json.loads(text)  # trailing garbage: let json.loads raise
    return obj


_RAW_DECODE = json.JSONDecoder().raw_decode


def _dump_json_std(obj) -> bytes:  # compact, as orjson writes it: the same bytes either way
    return json.dumps(obj, separators=(",", ":")).encode()


def _parse_json_fast(data: bytes):
    try:
        return _loads(data)
    except ValueError:  # what orjson refuses and the stdlib takes (lone surrogates), or an error
        return _parse_json_std(data)  # with the stdlib's message


def _dump_json_fast(obj) -> bytes:
    try:
        return orjson.dumps(obj)
    except TypeError:  # e.g. a lone surrogate in a text prompt: the stdlib escapes it
        return _dump_json_std(obj)


parse_json: Callable[[bytes], object] = _parse_json_fast if orjson else _parse_json_std
dump_json: Callable[[object], bytes] = _dump_json_fast if orjson else _dump_json_std


def merged_slack(resp: Response) -> int:
    """How much earlier than its read's stamp the first token may have come (ns): 0 when
    its read was stamped by the kernel and ended with it (the stamp is its own segment's
    arrival); else `stamp - floor`, where the floor is the latest moment it cannot have come
    before: the send, or the worker loop's turn mark before the one preceding the read
    (`turns.py`; a sound floor, not an estimate). The read merged it with a later event
    (TCP: the stamp is the last segment's), or had no kernel stamp (the stamp is when the
    loop got to it): either way it came in [floor, stamp]."""
    if resp.first_merged is None:
        return 0
    floor, t = resp.first_merged
    return max(0, t - floor)


def use_stdlib_json(flag: bool = True) -> None:
    """Encode and decode with the stdlib (tests of the pure path, comparisons)."""
    global parse_json, dump_json, count_common, _decode
    _decode = not flag  # the compiled path's decode too (its framing and split stay)
    pure = flag or orjson is None
    parse_json = _parse_json_std if pure else _parse_json_fast
    dump_json = _dump_json_std if pure else _dump_json_fast
    count_common = None if flag else fast_events.COUNT_COMMON


count_common = fast_events.COUNT_COMMON  # the common chunk's typed decode (msgspec), or None
_scan = cread.SCAN  # the compiled read path (framing, SSE split, common chunks), or None
_count = cread.COUNT  # its common-chunk count over a list of events
_times = cread.TIMES  # finish's token times and gaps in one C call (= spread + the loops)
_first = cread.FIRST  # a common chunk's answer-field text, before the answer began
_last = cread.LAST  # the finish chunk: `first`'s, with a finish reason and a `cbbench` object
_usage_c = cread.USAGE  # the usage chunk: no choices, the usage's token counts
_second = operator.itemgetter(1)
_decode = True  # the compiled path decodes the common chunk (off: use_stdlib_json)


def use_compiled_read(flag: bool = True) -> bool:
    """Read chunked bodies through the compiled path (when built) or not (tests of both
    paths, comparisons); whether it is in use now."""
    global _scan, _count, _times, _first, _last, _usage_c
    compiled = (cread.SCAN, cread.COUNT, cread.TIMES, cread.FIRST, cread.LAST, cread.USAGE)
    _scan, _count, _times, _first, _last, _usage_c = compiled if flag else (None,) * 6
    stamped._recv = cread.RECV if flag else None  # the socket read and its stamp
    return _scan is not None


class RequestFailed(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Response:
    """What one response delivered, whichever transport carried it."""

    __slots__ = (
        "stream",
        "status",
        "chunks",
        "state",
        "parser",
        "body",
        "sends",
        "rec",
        "sent_ns",
        "connect_ns",
        "reused",
        "reply",
        "attempt_ns",
        "kinds",
        "adapter",
        "send_window_ns",
        "first_merged",
        "marks",
        "tail",
        "user_read",
    )

    def __init__(
        self,
        rec: RequestRecord,
        stream: bool,
        collect_server_times: bool,
        reply: Reply | None = None,
        reasoning_parser: str = "auto",
        adapter=None,
    ) -> None:
        self.rec = rec
        self.adapter = adapter  # another API's events as chat chunks (endpoints.py), or None
        self.kinds = StreamKinds(reasoning_parser)  # reasoning / answer / tool-call tokens
        self.reply = reply  # a session turn: keep the text and ids for the next turn
        self.stream = stream
        self.status = 0
        self.chunks: list[tuple[int, int]] = []  # (arrival ns, tokens in that read)
        self.state: dict = {}
        self.parser = SSEParser()
        self.body: list[bytes] = []
        # selftest: (arrival, the server's t_send_ns) per event that carried tokens
        self.sends: list[tuple[int, int]] | None = [] if collect_server_times else None
        self.attempt_ns = time.monotonic_ns()  # the transport starts: connect (if any), send
        self.sent_ns: int | None = None  # when the request was written (after any connect)
        self.connect_ns: int | None = None  # set-up of a connection opened for this request
        self.reused: bool | None = None  # sent on a connection that served a request before
        self.send_window_ns: int | None = None  # the raw client: sent stamp -> write returned
        # (floor, stamp): the first token's read merged it with later bytes (or had no
        # kernel stamp; docs/timing.md "a bound per request"): it came in [floor, stamp]
        self.first_merged: tuple[int, int] | None = None
        self.user_read = False  # this read was stamped in user space (no kernel stamp came)
        self.tail = False  # this read ended inside a later chunk's framing (h1conn.Conn)
        self.marks: LoopMarks | None = None  # the worker loop's turn marks (H1Pool)

    def sent(self, t: int, connect_ns: int | None = None, reused: bool | None = None) -> None:
        """The request was written at `t` (ns); the transport says what the connection cost."""
        self.sent_ns, self.connect_ns, self.reused = t, connect_ns, reused

    def head(self, status: int, header: Callable[[str], str | None]) -> None:
        self.status = status
        scheduler = header("x-cbbench-scheduler")
        if scheduler:
            self.rec.extra["scheduler"] = scheduler
        replica = header("x-cbbench-replica")  # behind cbbench's router: where it ran
        if replica:
            self.rec.extra["replica"] = replica
            if retried := header("x-cbbench-retried-from"):  # failed there first, resent
                self.rec.extra["retried_from"] = retried

    def data(self, raw: bytes, t: int) -> None:
        """Body bytes that arrived at `t` (ns, monotonic clock)."""
        if not (self.stream and self.status < 400):
            self.body.append(raw)
            return
        parser = self.parser
        # every event is ASCII when this read is and no earlier read's bytes are in them
        ascii = not parser.partial and raw.isascii()
        events = parser.feed(raw)
        typed = count_common if self.reply is None else None
        n = 0
        if typed is not None and self.kinds.plain:  # a read's leading common chunks
            n = typed(events, self.sends, t, ascii)
        self._events(events, n, 0, n, t, ascii, None)

    def read_chunked(self, raw: bytes, t: int) -> bool | None:
        """A read of the chunked body, `raw` still framed, through the compiled read path
        (`cread.py`: framing, SSE split and the leading common chunks in one C call): whether
        the body's last chunk came, or None when it took nothing (no compiled path, not its
        case), and the Python path (`chunks.py`, then `data`) reads `raw` as before."""
        if _scan is None or not (self.stream and self.status < 400) or self.parser.partial:
            return None
        decode = _decode and self.reply is None and self.kinds.plain
        got = _scan(raw, decode, self.sends, t)
        if got is None:
            return None
        last, payload, n, ascii = got
        if type(payload) is bytes:  # framed, but not the simple SSE shape: sse.py splits it
            if payload:
                self.data(payload, t)
        else:  # the events after its `n` leading common chunks
            self._events(payload, 0, n, n, t, ascii, _count if _decode else None)
        return last

    def _events(
        self,
        events: list[bytes],
        i: int,
        base: int,
        one_ids: int,
        t: int,
        ascii: bool,
        compiled: Callable | None,
    ) -> None:
        """A read's events from `events[i]` on, after `one_ids` common chunks counted by a
        typed decode; `events` begins `base` events into the read (the compiled path hands
        over only the events after the ones it counted). `compiled`: the compiled count of
        common chunks (`cread.COUNT`), else msgspec's counts them once the answer began."""
        k_read = synced = 0
        # index of the event with the response's first token, in this read
        first_at = 0 if one_ids else -1
        fast = _loads if parse_json is _parse_json_fast else None  # one frame less an event
        state, reply, sends, kinds = self.state, self.reply, self.sends, self.kinds
        typed = count_common if reply is None else None
        plain = kinds.plain  # a bare chunk can only be an answer token (stream_kinds.py)
        # the compiled decode of a common chunk's text (`cread.first`): the classifier's
        # input without orjson and _apply; a session keeps the dict, an adapter rewrites it
        first = _first if _decode and reply is None and self.adapter is None else None
        last = _last if first is not None else None  # the finish chunk, likewise
        usage = _usage_c if first is not None else None  # and the usage chunk
        n_events = len(events)
        while i < n_events:
            data = events[i]
            i += 1
            if data == b"[DONE]":
                state["done"] = True
                continue
            got = first(data) if first is not None and not plain else None
            if got is not None:  # a common chunk before the answer began: what _apply does
                kinds.n += one_ids - synced  # with it (one token id, the classifier told its
                synced = one_ids  # text), without the dict
                state["ids_total"] = state.get("ids_total", 0) + 1
                kinds.tokens(1, *kinds.content(got[0]))
                k_read += 1
                if first_at < 0:
                    first_at = base + i - 1
                if sends is not None and got[1] is not None:
                    sends.append((t, got[1]))
            elif last is not None and (got := last(data)) is not None:
                kinds.n += one_ids - synced  # the finish chunk: what _apply does with it
                synced = one_ids  # (its `cbbench` object, finish reason, one token id, the
                if got[3] is not None:  # classifier told its text), without the dict
                    state["cbbench"] = parse_json(got[3])
                if got[2] is not None:
                    state["finish"] = got[2]
                state["ids_total"] = state.get("ids_total", 0) + 1
                kinds.tokens(1, *kinds.content(got[0]))
                k_read += 1
                if first_at < 0:
                    first_at = base + i - 1
                if sends is not None and got[1] is not None:
                    sends.append((t, got[1]))
            elif usage is not None and (got := usage(data)) is not None:
                kinds.n += one_ids - synced  # the usage chunk: what _apply (_usage) does
                synced = one_ids  # with it; no token
                state["usage_prompt"] = got[0]
                if got[1] is not None:
                    state["usage_out"] = got[1]
            else:
                if fast is not None:
                    try:
                        obj = fast(data)
                    except ValueError:
                        obj = _parse_json_std(data)
                else:
                    obj = parse_json(data)
                if type(obj) is not dict:
                    why = f"SSE data is not a JSON object: {data[:80]!r}"
                    raise RequestFailed("protocol", why)
                if self.adapter is not None:  # another API's event as a chat chunk, or none
                    obj = self.adapter.event(obj, state)  # (its events never pass
                    if obj is None:  # count_common: they have no `choices`)
                        continue
                # the common chunk, one answer token id and nothing else to fold in, counted
                # here; anything else (reasoning, tool calls, usage, finish, errors, several
                # ids, a session) -> _apply
                choices = obj.get("choices")
                if (
                    plain
                    and reply is None
                    and type(choices) is list
                    and choices
                    and not obj.get("usage")
                ):
                    c = choices[0]
                    if type(c) is dict and "cbbench" not in obj and _bare(c.get("delta")):
                        ids = c.get("token_ids")
                        if (
                            type(ids) is list
                            and len(ids) == 1
                            and type(ids[0]) is int
                            and ids[0] >= 0
                            and not c.get("finish_reason")
                            and c.get("prompt_token_ids") is None
                        ):
                            one_ids += 1
                            if first_at < 0:
                                first_at = base + i - 1
                            if sends is not None and "t_send_ns" in obj:
                                sends.append((t, obj["t_send_ns"]))
                            continue
                kinds.n += one_ids - synced  # the classifier counts every token before it
                synced = one_ids
                k = _apply(obj, state, True, kinds, reply)
                k_read += k
                if k and first_at < 0:
                    first_at = base + i - 1
                if k and sends is not None and "t_send_ns" in obj:
                    sends.append((t, obj["t_send_ns"]))
            if kinds.plain and not plain and reply is None and i < n_events:
                m = (  # the answer began: the rest too
                    compiled(events, i, sends, t)
                    if compiled is not None
                    else typed(events[i:], sends, t, ascii)
                    if typed is not None
                    else 0
                )
                if m and first_at < 0:
                    first_at = base + i
                one_ids += m
                i += m
            plain = kinds.plain
        if one_ids:
            state["ids_total"] = state.get("ids_total", 0) + one_ids
            kinds.n += one_ids - synced
            k_read += one_ids
        if k_read:
            if not self.chunks and (
                first_at < base + n_events - 1 or self.parser.pending or self.tail or self.user_read
            ):
                # a later event, or part of one, came in the same read (the kernel's stamp
                # is the last segment's), or the read has no kernel stamp: the first token
                # came after the send and after the loop's mark before last (turns.py)
                marks = self.marks
                floor = max(self.sent_ns or self.attempt_ns, marks.floor_ns if marks else 0)
                self.first_merged = (floor, t)
            self.chunks.append((t, k_read))

    def end(self, t: int) -> None:
        """The body is complete (as the transport saw it); raises RequestFailed if the
        response is an HTTP error, an incomplete stream or an unreadable body."""
        if self.status >= 400:
            text = b"".join(self.body).decode("utf-8", "replace")
            raise RequestFailed(
                f"http_{self.status // 100}xx", f"HTTP {self.status}: {error_message(text)}"
            )
        if self.stream:
            if not self.state.get("done"):
                end = self.adapter.end_event if self.adapter is not None else "[DONE]"
                raise RequestFailed("stream", f"stream ended without {end}")
            return
        obj = json.loads(b"".join(self.body))
        if not isinstance(obj, dict):
            raise RequestFailed("protocol", "response body is not a JSON object")
        if self.adapter is not None:
            obj = self.adapter.body(obj, self.state)
            if obj is None:  # embeddings: no tokens (their `finish` fills the record)
                return
        k = _apply(obj, self.state, False, self.kinds, self.reply)
        state = self.state
        self.chunks.append((t, state.get("ids_total") or state.get("usage_out") or k))


def _bare(delta) -> bool:
    """A chat delta (or a completion's absent one) with no reasoning and no tool calls."""
    return delta is None or (
        type(delta) is dict
        and delta.get("reasoning") is None
        and delta.get("reasoning_content") is None
        and not delta.get("tool_calls")
    )


def _apply(
    obj: dict, state: dict, stream: bool, kinds: StreamKinds, reply: Reply | None = None
) -> int:
    """Fold one response object into `state` and `kinds`; return the tokens it carries."""
    get = obj.get
    choices = get("choices")
    if not choices and "error" in obj:
        err = obj["error"]
        msg = err.get("message", err) if isinstance(err, dict) else err
        raise RequestFailed("server_error", f"error in stream: {str(msg)[:ERROR_TEXT_LIMIT]}")
    if "cbbench" in obj:
        state["cbbench"] = obj["cbbench"]
    if "metrics" in obj:  # vLLM's per-request times (server_timing.py)
        state["metrics"] = obj["metrics"]
    if "timings" in obj:  # llama.cpp's
        state["timings"] = obj["timings"]
    usage = get("usage")
    k_usage = _usage(usage, state) if usage else None
    if not choices:
        return 0
    c = choices[0]
    if reply is not None:
        reply.add_choice(c)
    cget = c.get
    finish = cget("finish_reason")
    if finish:
        state["finish"] = finish
    prompt_ids = cget("prompt_token_ids")
    if prompt_ids is not None:
        state["prompt_ids"] = len(prompt_ids)
    ids = cget("token_ids")
    if ids is not None:
        if type(ids) is not list or not (
            type(ids[0]) is int and ids[0] >= 0 if len(ids) == 1 else _valid_ids(ids)
        ):
            raise RequestFailed(
                "protocol", f"token_ids must be non-negative integers, got {str(ids)[:80]}"
            )
        n = len(ids)
        state["ids_total"] = state.get("ids_total", 0) + n
    elif k_usage is not None and stream:
        n = k_usage
    else:
        n = 1 if kinds.carries(c) else 0
    kinds.add(c, n)
    return n


def _usage(usage: dict, state: dict) -> int | None:
    """Fold a `usage` object; the tokens it adds when usage comes with every chunk (vLLM's
    continuous_usage_stats), else None."""
    state["usage_prompt"] = usage.get("prompt_tokens")
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and details.get("cached_tokens") is not None:
        state["cached_tokens"] = details["cached_tokens"]  # vLLM's prefix-cache hits
    details = usage.get("completion_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("reasoning_tokens"), int):
        state["usage_reasoning"] = details["reasoning_tokens"]
    out = usage.get("completion_tokens")
    if out is None:
        return None
    k = out - state["usage_out"] if "usage_out" in state else None
    state["usage_out"] = out
    return k


def _valid_ids(ids: list) -> bool:
    return all(type(i) is int for i in ids) and (not ids or min(ids) >= 0)


def failure(exc: BaseException, got_response: bool, base_url: str, timeout_s: float):
    """(error kind, message) for an exception any transport raised; None: not ours, re-raise.
    `got_response`: some of the response had arrived (a failure then is a stream failure)."""
    if isinstance(exc, RequestFailed):
        return exc.kind, str(exc)
    if isinstance(exc, http1.ConnectFailed):
        return "connection", str(exc)
    if isinstance(exc, http1.ConnectionLost):
        return ("stream" if exc.got_response else "connection"), str(exc)
    if isinstance(exc, http1.BadResponse):
        return "protocol", str(exc)
    if isinstance(exc, asyncio.TimeoutError):
        return "timeout", f"no complete response within {timeout_s:g} s"
    if isinstance(exc, httpx.TimeoutException):
        return "timeout", f"{type(exc).__name__}: {exc}"
    if isinstance(exc, httpx.ConnectError | ConnectionRefusedError):
        return "connection", f"cannot connect to {base_url}: {exc}"
    if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
        kind = "stream" if got_response else "connection"
        return kind, f"{type(exc).__name__}: {exc or 'connection closed'}"
    if isinstance(exc, httpx.HTTPError):
        return "http", f"{type(exc).__name__}: {exc}"
    if isinstance(exc, ValueError | KeyError | TypeError | IndexError):
        return "protocol", f"unexpected response: {type(exc).__name__}: {exc}"
    if isinstance(exc, http.client.HTTPException | OSError):
        kind = "stream" if got_response else "connection"
        return kind, f"{type(exc).__name__}: {exc or 'connection closed'}"
    return None


def finish(rec: RequestRecord, resp: Response, t0_ns: int, end_ns: int) -> None:
    """Fill `rec`'s counts and derived latencies from what arrived (ok or failed)."""

    def s(t_ns: int) -> float:
        return (t_ns - t0_ns) / 1e9

    state, chunks = resp.state, resp.chunks
    if resp.sent_ns is not None:
        rec.sent_s = s(resp.sent_ns)
        rec.connect_s = None if resp.connect_ns is None else resp.connect_ns / 1e9
        rec.conn_reused = resp.reused
    else:  # never sent (no connection could be made): when the attempt began
        rec.sent_s = s(resp.attempt_ns)
    rec.end_s = s(end_ns)
    rec.finish_reason = state.get("finish")
    rec.prompt_tokens_server = state.get("usage_prompt") or state.get("prompt_ids")
    rec.output_tokens_server = state.get("usage_out")
    if "cbbench" in state and isinstance(state["cbbench"], dict):
        info = dict(state["cbbench"])
        rec.server_queue_s = info.pop("queue_time_s", None)
        info.pop("prefill_time_s", None), info.pop("decode_time_s", None)
        rec.extra.update(info)
    times = server_times(state)
    if times is not None:
        rec.extra["server_timing"] = times
        if rec.server_queue_s is None:
            rec.server_queue_s = times["queue_s"]
    if "cached_tokens" in state:
        rec.extra.setdefault("num_cached_tokens", state["cached_tokens"])
    if resp.sends is not None:  # the server's clock is ours (CLOCK_MONOTONIC, one host)
        rec.extra["recv_minus_send_s"] = [(t - ts) / 1e9 for t, ts in resp.sends]
        rec.extra["server_send_ns"] = [ts for _, ts in resp.sends]
        rec.extra["sent_ns"] = resp.sent_ns
    n_streamed = sum(map(_second, chunks)) if chunks else 0
    rec.output_tokens_client = n_streamed
    exact = "ids_total" in state  # the stream carried token ids: its count is exact
    if exact and rec.output_tokens_server is not None and rec.output_tokens_server != n_streamed:
        rec.token_mismatch = (
            f"usage.completion_tokens {rec.output_tokens_server} != {n_streamed} streamed "
            "token_ids (timing uses the streamed count)"
        )
    _reasoning(rec, resp, exact)
    if resp.send_window_ns is not None:  # a bound on this request's TTFT error (kernel stamps)
        rec.extra["stamp_bound_s"] = (resp.send_window_ns + merged_slack(resp)) / 1e9
    if resp.adapter is not None and resp.adapter.finish is not None:
        resp.adapter.finish(rec, resp)
        return
    itl = None
    if chunks:
        got = _times(chunks, t0_ns) if _times is not None else None
        if got is not None:  # the same floats as the lines below, from C
            rec.token_times_s, itl = got
        else:
            rec.token_times_s = [(t - t0_ns) / 1e9 for t in spread(chunks)]
        rec.first_token_s = rec.token_times_s[0]
        rec.last_token_s = rec.token_times_s[-1]
    if not rec.ok or rec.sent_s is None or not chunks:
        if rec.ok:
            fail_record(rec, "empty", "response carried no output tokens")
        return
    rec.e2e_s = rec.last_token_s - rec.sent_s
    if resp.stream:
        rec.ttft_s = rec.first_token_s - rec.sent_s
        tt = rec.token_times_s
        rec.itl_s = itl if itl is not None else list(map(operator.sub, tt[1:], tt))
        n = n_streamed if exact else (rec.output_tokens_server or n_streamed)
        if n > 1:
            rec.tpot_s = (rec.e2e_s - rec.ttft_s) / (n - 1)
        answer_at = resp.kinds.answer_at
        if answer_at is not None and answer_at < len(tt):
            rec.ttfo_s = tt[answer_at] - rec.sent_s
        elif not rec.reasoning_tokens:  # nothing was reasoning: the first token answered
            rec.ttfo_s = rec.ttft_s
        if rec.ttfo_s is not None:
            rec.reasoning_s = rec.ttfo_s - rec.ttft_s
            n_answer = n - (rec.reasoning_tokens or 0 if resp.kinds.mode != "none" else 0)
            if n_answer > 1:
                rec.answer_tpot_s = (rec.e2e_s - rec.ttfo_s) / (n_answer - 1)
    else:
        rec.token_times_s = []


def _reasoning(rec: RequestRecord, resp: Response, exact: bool) -> None:
    """`reasoning_tokens` and `stream_flags`, reconciled as the output count is: the server's
    usage details unless token ids were streamed (then the streamed count is exact and a
    disagreement is noted in `token_mismatch`); usage above the total is flagged, not used."""
    kinds, state = resp.kinds, resp.state
    if rec.ok:  # a stream cut short is an error already, not an unclosed <think>
        kinds.finish()
    counted = kinds.reasoning if resp.stream else None
    if not resp.stream and not kinds.saw_reasoning_text:
        counted = 0
    usage = state.get("usage_reasoning")
    total = rec.output_tokens_server
    if usage is not None and (usage < 0 or (total is not None and usage > total)):
        kinds.flag(USAGE_REASONING_ABOVE_TOTAL)
        usage = None
    if kinds.mode == "none":  # no classification: the server's word only
        counted = None
    elif usage is not None and exact and resp.stream and usage != counted:
        note = f"usage reasoning_tokens {usage} != {counted} streamed (timing uses the streamed)"
        rec.token_mismatch = f"{rec.token_mismatch}; {note}" if rec.token_mismatch else note
        usage = None
    rec.reasoning_tokens = counted if usage is None else usage
    if kinds.tool:
        rec.extra["tool_call_tokens"] = kinds.tool
    rec.stream_flags = list(kinds.flags)


def spread(chunks: list[tuple[int, int]]) -> list[int]:
    """Token arrival times (ns): a read of k tokens spreads the gap since the last token."""
    t_first, k_first = chunks[0]
    times = [t_first] * k_first
    prev = t_first
    for t, k in chunks[1:]:
        if k == 1:
            times.append(t)
        else:
            gap = (t - prev) / k
            times.extend([int(prev + gap * (j + 1)) for j in range(k)])
        prev = t
    return times


def fail_record(rec: RequestRecord, kind: str, message: str) -> None:
    if rec.status == "error":  # keep the first reason
        return
    rec.status = "error"
    rec.error_kind = kind
    rec.error = message[:ERROR_TEXT_LIMIT]


def error_message(text: str) -> str:
    try:
        err = json.loads(text).get("error")
        msg = err.get("message") if isinstance(err, dict) else err
        if msg:
            return str(msg)[:ERROR_TEXT_LIMIT]
    except (ValueError, AttributeError):
        pass
    if _HTML.match(text):  # a web server's or proxy's error page, not an API's error
        head = _TITLE.search(text) or _H1.search(text)
        words = " ".join(_TAGS.sub(" ", head.group(1) if head else "").split())
        return f"an HTML page{f' ({words[:80]!r})' if words else ''}: not an OpenAI-compatible API"
    return " ".join(text.split())[:ERROR_TEXT_LIMIT] or "(empty body)"


_HTML = re.compile(r"\s*(<!doctype html|<html|<head|<body|<\?xml)", re.IGNORECASE)
_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)
_H1 = re.compile(r"<h1[^>]*>(.*?)</h1>", re.IGNORECASE | re.DOTALL)
_TAGS = re.compile(r"<[^>]+>")
