"""A scripted OpenAI-compatible streaming server on raw asyncio, for tests and `cbbench selftest`.

It generates no text worth reading: it follows a known token schedule (TTFT, gap per chunk,
tokens per chunk) and can misbehave on purpose (HTTP errors, a reset mid-stream, a hang, short
outputs). Every chunk carries `t_send_ns`, the server's `time.monotonic_ns()` just before the
write; CLOCK_MONOTONIC is system-wide on Linux, so a client in another process can measure its
own timing error against it.

Behaviour is chosen per request by the integer suffix of its `x-request-id` header (the
cbbench client sends `cbb-<index>`): `rules[index]` if present, else `default`.

Run standalone: `python -m cbbench.harness.fake_server --config '{"default": {...}}'
[--procs N]`; it prints `PORT <n>` once it listens on 127.0.0.1 (N processes share the port
through SO_REUSEPORT, so the server is not what limits a client measurement).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

from cbbench.harness.launcher import parse_ready_line, ready_line

MODEL_ID = "fake-model"
SCHEDULER = "fake"


@dataclass
class Behavior:
    ttft_s: float = 0.0  # request received -> first chunk
    itl_s: float = 0.0  # gap between chunks
    tokens_per_chunk: int = 1
    status: int = 200  # != 200: answer with this HTTP status and an OpenAI-style error body
    reset_after_tokens: int | None = None  # abort the TCP connection after this many tokens
    error_after_tokens: int | None = None  # an SSE error event (then [DONE]) after this many
    hang_s: float = 0.0  # wait this long before answering at all
    short_by: int = 0  # generate this many tokens fewer than max_tokens (finish_reason "stop")
    queue_time_s: float | None = 0.001  # reported in the final chunk's `cbbench` object


@dataclass
class FakeServerConfig:
    default: Behavior = field(default_factory=Behavior)
    rules: dict[int, Behavior] = field(default_factory=dict)
    drop_reused: int = 0  # close the first N requests that come on a kept-alive connection

    def behavior(self, index: int | None) -> Behavior:
        return self.rules.get(index, self.default) if index is not None else self.default

    def to_json(self) -> str:
        return json.dumps(
            {
                "default": asdict(self.default),
                "rules": {k: asdict(v) for k, v in self.rules.items()},
            }
        )

    @classmethod
    def from_json(cls, text: str) -> FakeServerConfig:
        d = json.loads(text) if text else {}
        return cls(
            default=Behavior(**d.get("default", {})),
            rules={int(k): Behavior(**v) for k, v in d.get("rules", {}).items()},
            drop_reused=int(d.get("drop_reused", 0)),
        )


def _request_index(headers: dict[str, str]) -> int | None:
    rid = headers.get("x-request-id", "")
    tail = rid.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else None


def _prompt_len(body: dict) -> int:
    if "messages" in body:
        return sum(len(str(m.get("content", "")).split()) for m in body["messages"])
    prompt = body.get("prompt", "")
    if isinstance(prompt, list):
        return len(prompt)
    return len(str(prompt).split())


class FakeServer:
    """The asyncio server; `serve_in_thread` or `python -m` to run it."""

    def __init__(self, config: FakeServerConfig | None = None) -> None:
        self.config = config or FakeServerConfig()
        self.requests_seen = 0
        self.connections = 0
        self.dropped = 0
        self._templates: dict[tuple, bytes] = {}
        self._server: asyncio.base_events.Server | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 0, reuse_port: bool = False) -> int:
        self._server = await asyncio.start_server(
            self._handle, host, port, backlog=4096, reuse_port=reuse_port or None
        )
        return self._server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                n = int(headers.get("content-length", "0"))
                body = await reader.readexactly(n) if n else b""
                served += 1
                if served > 1 and self.dropped < self.config.drop_reused:
                    self.dropped += 1  # as if its keep-alive timeout fired just now
                    writer.transport.abort()
                    return
                if not await self._route(method, path, headers, body, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def _route(self, method, path, headers, body, writer) -> bool:
        if method == "GET" and path == "/v1/models":
            data = {"object": "list", "data": [{"id": MODEL_ID, "object": "model"}]}
            return await self._json(writer, 200, data)
        if method == "GET" and path == "/health":
            return await self._json(writer, 200, {})
        if method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            self.requests_seen += 1
            try:
                req = json.loads(body)
            except ValueError:
                return await self._error(writer, 400, "invalid JSON body")
            b = self.config.behavior(_request_index(headers))
            if b.hang_s:
                await asyncio.sleep(b.hang_s)
            if b.status != 200:
                return await self._error(writer, b.status, f"scripted failure {b.status}")
            return await self._generate(writer, req, b, chat=path.endswith("chat/completions"))
        return await self._error(writer, 404, f"no route {method} {path}")

    async def _json(self, writer, status: int, obj: dict, extra: str = "") -> bool:
        payload = json.dumps(obj).encode()
        writer.write(
            f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n{extra}"
            f"content-length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        await writer.drain()
        return True

    async def _error(self, writer, status: int, msg: str) -> bool:
        err = {"error": {"message": msg, "type": "fake_error", "code": status}}
        return await self._json(writer, status, err)

    async def _generate(self, writer, req: dict, b: Behavior, chat: bool) -> bool:
        t_recv_ns = time.monotonic_ns()
        t_recv = t_recv_ns / 1e9
        max_tokens = int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)
        n_out = max(1, max_tokens - b.short_by)
        prompt_tokens = _prompt_len(req)
        want_ids = bool(req.get("return_token_ids"))
        kind = "chat.completion" if chat else "text_completion"
        final_extra = {
            "cbbench": {
                "t_recv_ns": t_recv_ns,  # the server's log: when the request came
                "queue_time_s": b.queue_time_s,
                "scheduler": SCHEDULER,
                "num_preemptions": 0,
                "num_cached_tokens": 0,
            }
        }
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": n_out,
            "total_tokens": prompt_tokens + n_out,
        }
        finish = "length" if n_out == max_tokens else "stop"
        if not req.get("stream"):
            await _sleep_until(
                t_recv + b.ttft_s + b.itl_s * max(0, -(-n_out // b.tokens_per_chunk) - 1)
            )
            text = " tok" * n_out
            choice: dict = {"index": 0, "finish_reason": finish}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            if want_ids:
                choice["token_ids"] = [10 + i % 500 for i in range(n_out)]
            obj = {"id": "fake", "object": kind, "model": MODEL_ID, "choices": [choice]}
            obj.update(usage=usage, t_send_ns=time.monotonic_ns(), **final_extra)
            return await self._json(writer, 200, obj, f"x-cbbench-scheduler: {SCHEDULER}\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\nx-cbbench-scheduler: "
            + SCHEDULER.encode()
            + b"\r\n\r\n"
        )
        kind = "chat.completion.chunk" if chat else "text_completion"
        sent = 0
        chunk_no = 0
        while sent < n_out:
            k = min(b.tokens_per_chunk, n_out - sent)
            if b.reset_after_tokens is not None and sent + k > b.reset_after_tokens:
                writer.transport.abort()
                return False
            if b.error_after_tokens is not None and sent + k > b.error_after_tokens:
                err = {"error": {"message": "scripted error event", "code": "fake"}}
                _write_event(writer, json.dumps(err))
                break
            await _sleep_until(t_recv + b.ttft_s + b.itl_s * chunk_no)
            last = sent + k == n_out
            if not last:  # the hot path: a cached body, only the send time is filled in
                key = (chat, chunk_no == 0, k, want_ids)
                head = self._templates.get(key)
                if head is None:
                    obj = _chunk(kind, chat, chunk_no == 0, k, want_ids, None)
                    head = self._templates[key] = json.dumps(obj)[:-1].encode() + b', "t_send_ns": '
                payload = b"data: %s%d}\n\n" % (head, time.monotonic_ns())
                writer.write(b"%x\r\n%s\r\n" % (len(payload), payload))
            else:
                obj = _chunk(kind, chat, chunk_no == 0, k, want_ids, finish)
                obj.update(final_extra, t_send_ns=time.monotonic_ns())
                _write_event(writer, json.dumps(obj))
            sent += k
            chunk_no += 1
            await writer.drain()
            if not b.itl_s:
                await asyncio.sleep(0)  # let the other streams interleave, as a real server would
        if (req.get("stream_options") or {}).get("include_usage"):
            obj = {"id": "fake", "object": kind, "model": MODEL_ID, "choices": [], "usage": usage}
            _write_event(writer, json.dumps(obj))
        _write_event(writer, "[DONE]")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


def _chunk(kind: str, chat: bool, first: bool, k: int, want_ids: bool, finish) -> dict:
    text = " tok" * k
    choice: dict = {"index": 0, "finish_reason": finish}
    if chat:
        choice["delta"] = {"role": "assistant", "content": text} if first else {"content": text}
    else:
        choice["text"] = text
    if want_ids:
        choice["token_ids"] = [10 + i for i in range(k)]
    return {"id": "fake", "object": kind, "model": MODEL_ID, "choices": [choice]}


def _write_event(writer: asyncio.StreamWriter, data: str) -> None:
    payload = b"data: " + data.encode() + b"\n\n"
    writer.write(b"%x\r\n%s\r\n" % (len(payload), payload))


async def _sleep_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


class ThreadedServer:
    """A FakeServer on its own event loop in a daemon thread; `url`, then `stop()`."""

    def __init__(self, config: FakeServerConfig | None = None) -> None:
        self.server = FakeServer(config)
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.port = 0

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.port = self.loop.run_until_complete(self.server.start())
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True, name="fake-server")
        self.thread.start()
        assert ready.wait(10), "fake server did not start"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        async def close() -> None:
            assert self.server._server is not None
            self.server._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--config", default="", help="FakeServerConfig as JSON")
    p.add_argument(
        "--procs", type=int, default=1, help="server processes on one port (SO_REUSEPORT)"
    )
    args = p.parse_args(argv)
    children: list[subprocess.Popen] = []

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        server = FakeServer(FakeServerConfig.from_json(args.config))
        port = await server.start(port=args.port, reuse_port=args.procs > 1 or args.port > 0)
        for _ in range(args.procs - 1):
            cmd = [sys.executable, "-m", "cbbench.harness.fake_server", "--port", str(port)]
            child = subprocess.Popen(
                [*cmd, "--config", args.config], stdout=subprocess.PIPE, text=True
            )
            children.append(child)
            assert child.stdout is not None and parse_ready_line(child.stdout.readline())
        print(ready_line("cbbench fake-server", f"http://127.0.0.1:{port}"), flush=True)
        await stop.wait()

    try:
        asyncio.run(serve())
    finally:
        for child in children:
            child.terminate()
            child.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
