"""An independent server for the Responses, Messages and embeddings APIs, for the client's
tests: not cbbench's (asyncio streams, its own pacing and JSON, no token ids), so the client's
TTFT / TTFO / TPOT and token counts are checked against a server cbbench did not write.

`--api responses` streams `--reasoning` reasoning tokens (`response.reasoning_text.delta`)
then `--answer` answer tokens (`response.output_text.delta`), with the Responses API's other
events between them, and `response.completed` with usage (`output_tokens_details.
reasoning_tokens`). `--api messages` streams the same as Anthropic's `thinking_delta` /
`text_delta` content blocks between `message_start` and `message_delta` + `message_stop`
(and checks the `anthropic-version` header). The first token `--first-ms` after the request
arrived, the rest `--gap-ms` apart (from the first's send). `--api embeddings` answers each
input with a 16-float vector after `--first-ms`. A request whose model is `bad` gets the API's
own 400 error body; `--malformed` sends a delta whose text is not a string mid-stream.

Its log, one JSON line per request on stdout after `PORT <n>`:
`{"id", "recv_ns", "send_ns": [...]}` (CLOCK_MONOTONIC; embeddings: the body's send).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time


def _events(api: str, model: str, i: int, n_r: int, n: int, malformed: bool) -> list[dict]:
    """The events that carry token i (with the structural events around it)."""
    reasoning = i < n_r
    text = f" r{i}" if reasoning else f" a{i}"
    if malformed and i == n // 2:
        text = 42
    out: list[dict] = []
    if api == "responses":
        if i == 0:
            head = {"id": "resp_1", "object": "response", "status": "in_progress", "model": model}
            out += [
                {"type": "response.created", "response": head},
                {"type": "response.in_progress", "response": head},
            ]
        if i == 0 and n_r:
            out.append({"type": "response.output_item.added", "item": {"type": "reasoning"}})
        if i == n_r:
            out += [
                {"type": "response.output_item.added", "item": {"type": "message"}},
                {"type": "response.content_part.added", "part": {"type": "output_text"}},
            ]
        kind = "response.reasoning_text.delta" if reasoning else "response.output_text.delta"
        out.append({"type": kind, "item_id": "x", "output_index": 0, "delta": text})
        return out
    if i == 0:
        usage = {"input_tokens": 5, "output_tokens": 1}
        msg = {"id": "msg_1", "type": "message", "role": "assistant", "content": [],
               "model": model, "stop_reason": None, "usage": usage}  # fmt: skip
        out.append({"type": "message_start", "message": msg})
    if i == 0 or i == n_r:
        block = {"type": "thinking", "thinking": ""} if reasoning else {"type": "text", "text": ""}
        if i == n_r and n_r:
            out.append({"type": "content_block_stop", "index": 0})
        out.append({"type": "content_block_start", "index": int(i > 0), "content_block": block})
        out.append({"type": "ping"})
    delta = {"type": "thinking_delta", "thinking": text} if reasoning else {
        "type": "text_delta", "text": text}  # fmt: skip
    out.append({"type": "content_block_delta", "index": int(i >= n_r and n_r > 0), "delta": delta})
    return out


def _tail(api: str, n_r: int, n: int) -> list[dict]:
    if api == "responses":
        usage = {"input_tokens": 5, "input_tokens_details": {"cached_tokens": 0},
                 "output_tokens": n, "output_tokens_details": {"reasoning_tokens": n_r},
                 "total_tokens": n + 5}  # fmt: skip
        resp = {"id": "resp_1", "object": "response", "status": "incomplete",
                "incomplete_details": {"reason": "max_output_tokens"}, "usage": usage}  # fmt: skip
        return [{"type": "response.output_text.done", "text": "..."},
                {"type": "response.completed", "response": resp}]  # fmt: skip
    return [
        {"type": "content_block_stop", "index": 1},
        {"type": "message_delta", "delta": {"stop_reason": "max_tokens"},
         "usage": {"output_tokens": n}},
        {"type": "message_stop"},
    ]  # fmt: skip


def _sse(api: str, evs: list[dict]) -> bytes:
    if api == "messages":  # Anthropic names each event
        return b"".join(
            b"event: %s\ndata: %s\n\n" % (e["type"].encode(), json.dumps(e).encode()) for e in evs
        )
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in evs)


def _error(api: str, status: int, msg: str) -> dict:
    if api == "messages":
        return {"type": "error", "error": {"type": "invalid_request_error", "message": msg}}
    return {"error": {"message": msg, "type": "invalid_request_error", "param": "model",
                      "code": None}}  # fmt: skip


async def _serve(args) -> None:
    api = args.api

    async def reply(writer, status: int, obj: dict) -> None:
        payload = json.dumps(obj).encode()
        writer.write(
            b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (status, len(payload), payload)
        )
        await writer.drain()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method = lines[0].split(" ", 1)[0]
                hdrs = {
                    k.strip().lower(): v.strip()
                    for k, _, v in (x.partition(":") for x in lines[1:] if x)
                }
                body = await reader.readexactly(int(hdrs.get("content-length", 0)))
                recv = time.monotonic_ns()
                rid = hdrs.get("x-request-id", "")
                if method == "GET":
                    await reply(writer, 200, {"object": "list", "data": [{"id": "mini"}]})
                    continue
                req = json.loads(body)
                if req.get("model") == "bad" or (
                    api == "messages" and "anthropic-version" not in hdrs
                ):
                    await reply(writer, 400, _error(api, 400, "model 'bad' does not exist"))
                    continue
                if api == "embeddings":
                    await asyncio.sleep(
                        max(0.0, recv / 1e9 + args.first_ms / 1e3 - time.monotonic())
                    )
                    inputs = req["input"] if isinstance(req["input"], list) else [req["input"]]
                    data = [
                        {"object": "embedding", "index": k, "embedding": [0.25] * 16}
                        for k in range(len(inputs))
                    ]
                    n_in = sum(len(x) if isinstance(x, list) else len(x.split()) for x in inputs)
                    send = time.monotonic_ns()
                    await reply(writer, 200, {"object": "list", "data": data, "model": "mini",
                        "usage": {"prompt_tokens": n_in, "total_tokens": n_in}})  # fmt: skip
                    print(json.dumps({"id": rid, "recv_ns": recv, "send_ns": [send]}), flush=True)
                    continue
                n_r, n = args.reasoning, args.reasoning + args.answer
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n"
                )
                sends: list[int] = []
                t_first = recv / 1e9 + args.first_ms / 1e3
                for i in range(n):
                    due = t_first if i == 0 else sends[0] / 1e9 + i * args.gap_ms / 1e3
                    delay = due - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    data = _sse(api, _events(api, req["model"], i, n_r, n, args.malformed))
                    sends.append(time.monotonic_ns())
                    writer.write(b"%x\r\n%s\r\n" % (len(data), data))
                    await writer.drain()
                tail = _sse(api, _tail(api, n_r, n))
                writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(tail), tail))
                await writer.drain()
                print(json.dumps({"id": rid, "recv_ns": recv, "send_ns": sends}), flush=True)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--api", required=True, choices=("responses", "messages", "embeddings"))
    p.add_argument("--reasoning", type=int, default=32)
    p.add_argument("--answer", type=int, default=32)
    p.add_argument("--first-ms", type=float, default=50.0)
    p.add_argument("--gap-ms", type=float, default=10.0)
    p.add_argument("--malformed", action="store_true")
    asyncio.run(_serve(p.parse_args()))  # until SIGTERM


if __name__ == "__main__":
    main()
