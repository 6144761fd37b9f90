"""A scripted OpenAI-compatible streaming server on raw asyncio, for tests and `cbbench selftest`.

It generates no text worth reading: it follows a known token schedule (TTFT, gap per chunk,
tokens per chunk) and can misbehave on purpose (HTTP errors, a reset mid-stream, a hang, short
outputs). Its log, written into the stream (CLOCK_MONOTONIC, which is system-wide on Linux, so
a client in another process can grade its own timing against it):
- every chunk carries `t_send_ns`: `time.monotonic_ns()` read right before that chunk's
  `send` call (on loopback the bytes reach the client's socket inside that call);
- the last chunk's `cbbench` object carries `t_recv_ns`, when the request arrived: the
  kernel's receive time of the read that completed the request (`SO_TIMESTAMPNS`,
  `fake_conn.py`), so the server's own event-loop lag is not taken for the client's upload
  time, and `t_recv_stamp`: `kernel`, or `user` where the kernel gave no stamp (then it is
  the time the server's loop handled that read; one warning says why).
- the last chunk's `cbbench` object also carries `t_first_written_ns`, read right after the
  first chunk's `send` returned (absent when that chunk was not sent whole at once, or it
  was the last): the first token reached the client's socket in [t_send_ns,
  t_first_written_ns], so a client's error can be graded without the server's own
  preemption between its stamp and its send (tests/test_client_stall_bound.py).
The schedule: the first chunk is due at t_recv + ttft, chunk k at (first chunk sent) + k * itl:
a server late with its first chunk (its loop busy with a burst of requests) keeps its token
gap after it, as a decoding server does. One timer per
process writes every stream's due chunks (`Pacer`), no task or sleep per chunk, so a Python
process carries many hundreds of paced streams.

Behaviour is chosen per request by the integer suffix of its `x-request-id` header (the
cbbench client sends `cbb-<index>`): `rules[index]` if present, else `default`.

Run standalone: `python -m cbbench.harness.servers.fake_server --config '{"default": {...}}'
[--procs N]`; it prints `PORT <n>` once it listens on 127.0.0.1 (N processes share the port
through SO_REUSEPORT, so the server is not what limits a client measurement).

Over 400 lines because the schedule, the pacer and the misbehaviours all act on one stream's
state, and selftest's timing grades depend on reading them together.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import signal
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

from cbbench.harness.client import aio
from cbbench.harness.client.h1conn import SO_TIMESTAMPNS, kernel_timestamps_supported
from cbbench.harness.servers.fake_conn import HIGH_WATER, Pacer, ServerConn
from cbbench.harness.servers.fake_load import LoadModel, LoadState
from cbbench.harness.servers.launcher import ServerHandle, ready_line, start_server
from cbbench.reference_engine.server.lifeline import die_with_launcher

MODEL_ID = "fake-model"
SCHEDULER = "fake"
_log = logging.getLogger("cbbench")


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
    # a reasoning model: the first `reasoning_tokens` of each output are reasoning, streamed
    # in `reasoning_field`: "reasoning" (vLLM >= 0.11), "reasoning_content", or "think-tags"
    # (inline in the content, `<think>` opening the first, `</think>` closing the last);
    # usage.completion_tokens_details.reasoning_tokens says how many
    reasoning_tokens: int = 0
    reasoning_field: str = "reasoning"


@dataclass
class FakeServerConfig:
    default: Behavior = field(default_factory=Behavior)
    rules: dict[int, Behavior] = field(default_factory=dict)
    drop_reused: int = 0  # close the first N requests that come on a kept-alive connection
    load: LoadModel = field(default_factory=LoadModel)  # capacity, noise, warm-up (fake_load)

    def behavior(self, index: int | None) -> Behavior:
        return self.rules.get(index, self.default) if index is not None else self.default

    def to_json(self) -> str:
        return json.dumps(
            {
                "default": asdict(self.default),
                "rules": {k: asdict(v) for k, v in self.rules.items()},
                "drop_reused": self.drop_reused,
                "load": asdict(self.load),
            }
        )

    @classmethod
    def from_json(cls, text: str) -> FakeServerConfig:
        d = json.loads(text) if text else {}
        return cls(
            default=Behavior(**d.get("default", {})),
            rules={int(k): Behavior(**v) for k, v in d.get("rules", {}).items()},
            drop_reused=int(d.get("drop_reused", 0)),
            load=LoadModel(**d.get("load", {})),
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
    """The asyncio server; `serve_in_thread` or `python -m` to run it.

    `kernel_timestamps=True` stamps each request's arrival with the kernel's receive time
    where the platform allows (one warning and user-space stamps otherwise); False stamps in
    user space on purpose."""

    def __init__(self, config: FakeServerConfig | None = None, kernel_timestamps: bool = True):
        self.config = config or FakeServerConfig()
        self.requests_seen = 0
        self.connections = 0
        self.dropped = 0
        self.held_back = 0  # times a stream waited for its client to read (chunks then late)
        self._templates: dict[tuple, bytes] = {}
        self._listener: socket.socket | None = None
        self._conns: set[ServerConn] = set()
        self._pacer: Pacer | None = None
        self.load = LoadState(self.config.load)
        self.cache_resets = 0
        why = kernel_timestamps_supported() if kernel_timestamps else None
        if why:
            _log.warning(
                "fake server: kernel receive timestamps unavailable (%s); "
                "request arrivals are stamped in user space",
                why,
            )
        self.kernel = kernel_timestamps and why is None

    async def start(self, host: str = "127.0.0.1", port: int = 0, reuse_port: bool = False) -> int:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if self.kernel:  # turns the kernel's receive stamping on before the first request
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        sock.bind((host, port))
        sock.listen(4096)
        sock.setblocking(False)
        self._listener = sock
        self._pacer = Pacer(loop)
        loop.add_reader(sock.fileno(), self._accept, loop)
        return sock.getsockname()[1]

    def _accept(self, loop: asyncio.AbstractEventLoop) -> None:
        assert self._listener is not None
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors and the like: try again on the next wake-up
                return
            conn = ServerConn(sock, loop, self.kernel)
            self._conns.add(conn)
            task = loop.create_task(self._handle(conn))
            task.add_done_callback(lambda _t, c=conn: self._conns.discard(c))

    def close(self) -> None:
        """Stop listening and drop every connection."""
        if self._listener is not None:
            asyncio.get_running_loop().remove_reader(self._listener.fileno())
            self._listener.close()
            self._listener = None
        for conn in list(self._conns):
            conn.abort()

    async def _handle(self, conn: ServerConn) -> None:
        self.connections += 1
        served = 0
        try:
            while True:
                head = await conn.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                n = int(headers.get("content-length", "0"))
                body = await conn.readexactly(n) if n else b""
                arrived = (conn.rx_ns, conn.rx_kernel)  # the read that completed the request
                served += 1
                if served > 1 and self.dropped < self.config.drop_reused:
                    self.dropped += 1  # as if its keep-alive timeout fired just now
                    conn.abort()
                    return
                if not await self._route(method, path, headers, body, conn, arrived):
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            conn.close()

    async def _route(self, method, path, headers, body, conn, arrived) -> bool:
        if method == "GET" and path == "/v1/models":
            data = {"object": "list", "data": [{"id": MODEL_ID, "object": "model"}]}
            return await self._json(conn, 200, data)
        if method == "GET" and path == "/health":
            return await self._json(conn, 200, {})
        if method == "POST" and path == "/reset_prefix_cache":  # vLLM's name
            self.cache_resets += 1
            self.load.reset()
            return await self._json(conn, 200, {})
        if method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            self.requests_seen += 1
            try:
                req = json.loads(body)
            except ValueError:
                return await self._error(conn, 400, "invalid JSON body")
            index = _request_index(headers)
            b = self.config.behavior(index)
            if self.config.load.active:  # capacity, noise, warm-up: this request's timing
                max_tokens = int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)
                chunks = -(-max(1, max_tokens - b.short_by) // b.tokens_per_chunk)
                ttft, itl = self.load.plan(index, arrived[0] / 1e9, b.ttft_s, b.itl_s, chunks)
                b = dataclasses.replace(b, ttft_s=ttft, itl_s=itl)
            if b.hang_s:
                await asyncio.sleep(b.hang_s)
            if b.status != 200:
                return await self._error(conn, b.status, f"scripted failure {b.status}")
            chat = path.endswith("chat/completions")
            return await self._generate(conn, req, b, chat, arrived)
        return await self._error(conn, 404, f"no route {method} {path}")

    async def _json(self, conn: ServerConn, status: int, obj: dict, extra: str = "") -> bool:
        payload = json.dumps(obj).encode()
        conn.write(
            f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n{extra}"
            f"content-length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        await conn.drain()
        return True

    async def _error(self, conn: ServerConn, status: int, msg: str) -> bool:
        err = {"error": {"message": msg, "type": "fake_error", "code": status}}
        return await self._json(conn, status, err)

    async def _generate(
        self, conn: ServerConn, req: dict, b: Behavior, chat: bool, arrived: tuple[int, bool]
    ) -> bool:
        t_recv_ns, kernel = arrived
        t_recv = t_recv_ns / 1e9
        max_tokens = int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)
        n_out = max(1, max_tokens - b.short_by)
        prompt_tokens = _prompt_len(req)
        want_ids = bool(req.get("return_token_ids"))
        kind = "chat.completion" if chat else "text_completion"
        final_extra = {
            "cbbench": {
                "t_recv_ns": t_recv_ns,  # the server's log: when the request came
                "t_recv_stamp": "kernel" if kernel else "user",
                "queue_time_s": b.queue_time_s,
                "scheduler": SCHEDULER,
                "num_preemptions": 0,
                "num_cached_tokens": 0,
            }
        }
        usage: dict = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": n_out,
            "total_tokens": prompt_tokens + n_out,
        }
        if b.reasoning_tokens:
            usage["completion_tokens_details"] = {
                "reasoning_tokens": min(b.reasoning_tokens, n_out)
            }
        finish = "length" if n_out == max_tokens else "stop"
        if not req.get("stream"):
            await _sleep_until(
                t_recv + b.ttft_s + b.itl_s * max(0, -(-n_out // b.tokens_per_chunk) - 1)
            )
            choice: dict = {"index": 0, "finish_reason": finish}
            parts = _parts(b, chat, 0, n_out)
            if chat:
                choice["message"] = {"role": "assistant", **parts}
            else:
                choice.update(parts)
            if want_ids:
                choice["token_ids"] = [10 + i % 500 for i in range(n_out)]
            obj = {"id": "fake", "object": kind, "model": MODEL_ID, "choices": [choice]}
            obj.update(usage=usage, t_send_ns=time.monotonic_ns(), **final_extra)
            return await self._json(conn, 200, obj, f"x-cbbench-scheduler: {SCHEDULER}\r\n")
        conn.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\nx-cbbench-scheduler: "
            + SCHEDULER.encode()
            + b"\r\n\r\n"
        )
        tail = []
        if (req.get("stream_options") or {}).get("include_usage"):
            obj = {"id": "fake", "object": "chat.completion.chunk" if chat else kind}
            obj.update(model=MODEL_ID, choices=[], usage=usage)
            tail.append(_event(json.dumps(obj)))
        stream = _Stream(self, conn, b, t_recv, n_out, chat, want_ids, finish, final_extra, tail)
        assert self._pacer is not None
        return await stream.run(self._pacer)


class _Stream:
    """One streamed response, written chunk by chunk by the `Pacer` (no task of its own)."""

    def __init__(self, server, conn, b, t_recv, n_out, chat, want_ids, finish, final_extra, tail):
        self.server, self.conn, self.b = server, conn, b
        self.t_recv, self.n_out, self.chat, self.want_ids = t_recv, n_out, chat, want_ids
        self.finish, self.final_extra, self.tail = finish, final_extra, tail
        self.kind = "chat.completion.chunk" if chat else "text_completion"
        self.sent = 0
        self.chunk_no = 0
        self.t_first = 0.0  # when the first chunk was sent (monotonic s)
        self.done: asyncio.Future | None = None
        self.pacer: Pacer | None = None

    async def run(self, pacer: Pacer) -> bool:
        self.pacer = pacer
        self.done = asyncio.get_running_loop().create_future()
        due = self._next()
        if due is not None:
            pacer.add(due, self)
        return await self.done

    def _end(self, keep_alive: bool) -> None:
        assert self.done is not None
        if not self.done.done():
            self.done.set_result(keep_alive)

    def _next(self) -> float | None:
        """Before chunk `chunk_no`: a scripted reset or error happens now (right after the
        previous chunk); else the time the chunk is due."""
        b, conn = self.b, self.conn
        k = min(b.tokens_per_chunk, self.n_out - self.sent)
        if b.reset_after_tokens is not None and self.sent + k > b.reset_after_tokens:
            conn.abort()
            self._end(False)
            return None
        if b.error_after_tokens is not None and self.sent + k > b.error_after_tokens:
            err = {"error": {"message": "scripted error event", "code": "fake"}}
            conn.write(_event(json.dumps(err)) + b"".join(self.tail) + _DONE)
            self._end(True)
            return None
        if self.chunk_no == 0:
            return self.t_recv + b.ttft_s
        return self.t_first + b.itl_s * self.chunk_no

    def step(self) -> float | None:
        """Write the chunk that is due; the next one's due time, or None (ended, or waiting
        for the socket to drain: then `on_drained` puts it back)."""
        conn, b = self.conn, self.b
        if conn.closed:
            self._end(False)
            return None
        if conn.pending > HIGH_WATER:  # the client reads slower than we write: wait for it
            pacer = self.pacer
            assert pacer is not None
            self.server.held_back += 1
            conn.on_drained = lambda: pacer.add(0.0, self)
            return None
        k = min(b.tokens_per_chunk, self.n_out - self.sent)
        first = self.chunk_no == 0
        if self.sent + k < self.n_out:  # the hot path: a cached body, only the send time filled in
            parts = _parts(b, self.chat, self.sent, k)
            key = (self.chat, first, k, self.want_ids, *parts.items())
            templates = self.server._templates
            head = templates.get(key)
            if head is None:
                obj = _chunk(self.kind, self.chat, first, k, self.want_ids, None, parts)
                head = templates[key] = json.dumps(obj)[:-1].encode() + b', "t_send_ns": '
            now = time.monotonic_ns()
            if first:  # the later chunks' gaps run from this very stamp, so none is early
                self.t_first = now / 1e9
            payload = b"data: %s%d}\n\n" % (head, now)
            conn.write(b"%x\r\n%s\r\n" % (len(payload), payload))
            if first and not conn.pending:  # its bytes were in the client's socket by now
                self.final_extra["cbbench"]["t_first_written_ns"] = time.monotonic_ns()
            self.sent += k
            self.chunk_no += 1
            return self._next()
        parts = _parts(b, self.chat, self.sent, k)
        obj = _chunk(self.kind, self.chat, first, k, self.want_ids, self.finish, parts)
        now = time.monotonic_ns()
        if first:
            self.t_first = now / 1e9
        obj.update(self.final_extra, t_send_ns=now)
        conn.write(_event(json.dumps(obj)) + b"".join(self.tail) + _DONE)
        self.sent += k
        self._end(True)
        return None


_DONE = b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"  # the [DONE] event, then the last (empty) chunk


def _parts(b: Behavior, chat: bool, sent: int, k: int) -> dict[str, str]:
    """The text fields of the `k` tokens after the first `sent`: reasoning, then answer."""
    n_r = b.reasoning_tokens
    r = max(0, min(k, n_r - sent))
    answer = " tok" * (k - r)
    key = "content" if chat else "text"
    if not r:
        return {key: answer}
    if b.reasoning_field == "think-tags" or not chat:
        opened = "<think>" if sent == 0 else ""
        closed = "</think>" if sent + r == n_r else ""
        return {key: opened + " tok" * r + closed + answer}
    return {b.reasoning_field: " tok" * r, **({key: answer} if answer else {})}


def _chunk(
    kind: str,
    chat: bool,
    first: bool,
    k: int,
    want_ids: bool,
    finish,
    parts: dict[str, str] | None = None,
) -> dict:
    choice: dict = {"index": 0, "finish_reason": finish}
    if parts is None:
        parts = {"content" if chat else "text": " tok" * k}
    if chat:
        choice["delta"] = {"role": "assistant", **parts} if first else dict(parts)
    else:
        choice.update(parts)
    if want_ids:
        choice["token_ids"] = [10 + i for i in range(k)]
    return {"id": "fake", "object": kind, "model": MODEL_ID, "choices": [choice]}


def _event(data: str) -> bytes:
    """One SSE event as one HTTP chunk."""
    payload = b"data: " + data.encode() + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(payload), payload)


async def _sleep_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


class ThreadedServer:
    """A FakeServer on its own event loop in a daemon thread; `url`, then `stop()`."""

    def __init__(self, config: FakeServerConfig | None = None, kernel_timestamps: bool = True):
        self.server = FakeServer(config, kernel_timestamps)
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
            self.server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def main(argv: list[str] | None = None) -> int:
    die_with_launcher()  # started by the launcher: go when it goes
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--config", default="", help="FakeServerConfig as JSON")
    p.add_argument(
        "--procs", type=int, default=1, help="server processes on one port (SO_REUSEPORT)"
    )
    p.add_argument(
        "--user-timestamps",
        action="store_true",
        help="stamp request arrivals in user space (default: the kernel's receive time)",
    )
    args = p.parse_args(argv)
    children: list[ServerHandle] = []

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        server = FakeServer(FakeServerConfig.from_json(args.config), not args.user_timestamps)
        port = await server.start(port=args.port, reuse_port=args.procs > 1 or args.port > 0)
        for _ in range(args.procs - 1):
            cmd = [sys.executable, "-m", "cbbench.harness.servers.fake_server", "--port", str(port)]
            cmd += ["--user-timestamps"] if args.user_timestamps else []
            # the one launcher: a bounded wait, and the child dies with this process
            children.append(start_server([*cmd, "--config", args.config], 60.0, "fake child"))
        print(ready_line("cbbench fake-server", f"http://127.0.0.1:{port}"), flush=True)
        await stop.wait()

    try:
        aio.run(serve())
    finally:
        for child in children:
            child.stop(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
