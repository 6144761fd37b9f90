"""A second, independent reasoning server for the tests: not cbbench's fake server (no token
ids, asyncio streams, its own pacing and JSON), so the client's TTFT / TTFO / TPOT and token
counts are checked against a server cbbench did not write for itself.

Every streamed chat request gets `--reasoning` reasoning tokens then `--answer` answer tokens,
the first `--first-ms` after the request arrived and the rest `--gap-ms` apart (from the
first's send), as vLLM's parsers stream them: `delta.reasoning` (vLLM >= 0.11),
`delta.reasoning_content` (older vLLM, SGLang), or `think-tags` inline in `delta.content`.
usage carries `completion_tokens_details.reasoning_tokens`. Its log, one JSON line per request
on stdout after `PORT <n>`: `{"id", "recv_ns", "send_ns": [...]}` (CLOCK_MONOTONIC).

Run: `python tests/reasoning_server.py --field reasoning`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time


def _delta(field: str, i: int, n_r: int) -> dict:
    if i >= n_r:
        return {"content": f" a{i}"}
    if field == "think-tags":
        return {
            "content": ("<think>" if i == 0 else "")
            + f" r{i}"
            + ("</think>" if i == n_r - 1 else "")
        }
    return {field: f" r{i}", "content": None}


async def _serve(args) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                hdrs = {
                    k.strip().lower(): v.strip()
                    for k, _, v in (x.partition(":") for x in lines[1:] if x)
                }
                body = await reader.readexactly(int(hdrs.get("content-length", 0)))
                recv = time.monotonic_ns()
                if method == "GET":
                    payload = json.dumps(
                        {"object": "list", "data": [{"id": "mini", "object": "model"}]}
                    ).encode()
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                        % (len(payload), payload)
                    )
                    await writer.drain()
                    continue
                if path != "/v1/chat/completions":  # e.g. /tokenize: not served here
                    payload = b'{"error": {"message": "not found", "code": 404}}'
                    writer.write(
                        b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\n"
                        b"content-length: %d\r\n\r\n%s" % (len(payload), payload)
                    )
                    await writer.drain()
                    continue
                req = json.loads(body)
                n_r, n_a = args.reasoning, args.answer
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                )
                sends = []
                t_first = recv / 1e9 + args.first_ms / 1e3
                for i in range(n_r + n_a):
                    due = t_first if i == 0 else sends[0] / 1e9 + i * args.gap_ms / 1e3
                    delay = due - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    choice = {
                        "index": 0,
                        "delta": _delta(args.field, i, n_r),
                        "logprobs": None,
                        "finish_reason": "length" if i == n_r + n_a - 1 else None,
                    }
                    if i == 0:
                        choice["delta"]["role"] = "assistant"
                    ev = {
                        "id": "chatcmpl-mini",
                        "object": "chat.completion.chunk",
                        "created": 0,
                        "model": req.get("model"),
                        "choices": [choice],
                    }
                    data = b"data: " + json.dumps(ev).encode() + b"\n\n"
                    sends.append(time.monotonic_ns())
                    writer.write(b"%x\r\n%s\r\n" % (len(data), data))
                    await writer.drain()
                usage = {
                    "prompt_tokens": 5,
                    "completion_tokens": n_r + n_a,
                    "total_tokens": n_r + n_a + 5,
                    "completion_tokens_details": {"reasoning_tokens": n_r},
                }
                tail = (
                    b"data: "
                    + json.dumps({"id": "chatcmpl-mini", "choices": [], "usage": usage}).encode()
                    + b"\n\ndata: [DONE]\n\n"
                )
                writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(tail), tail))
                await writer.drain()
                rid = hdrs.get("x-request-id", "")
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
    p.add_argument(
        "--field", default="reasoning", choices=("reasoning", "reasoning_content", "think-tags")
    )
    p.add_argument("--reasoning", type=int, default=32)
    p.add_argument("--answer", type=int, default=32)
    p.add_argument("--first-ms", type=float, default=50.0)
    p.add_argument("--gap-ms", type=float, default=10.0)
    asyncio.run(_serve(p.parse_args()))  # until SIGTERM


if __name__ == "__main__":
    main()
