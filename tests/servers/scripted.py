"""A misbehaving HTTP server on 127.0.0.1 that answers every POST with given raw bytes.

`scripted(response)` starts it in a thread; `response` is the exact bytes written after the
request is read (status line, headers, body, however broken), then the connection is closed
cleanly (FIN) unless `keep_open`. `GET /v1/models` answers a one-model list so a whole bench
run can target it. For the client's regression tests: huge events, streams without
`[DONE]`, token counts that disagree with `usage`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator


def sse(*events: dict | str, done: bool = True) -> bytes:
    """A chunked `text/event-stream` body of the given events (dicts are JSON-encoded)."""
    out = []
    for e in events:
        data = e if isinstance(e, str) else json.dumps(e)
        payload = b"data: " + data.encode() + b"\n\n"
        out.append(b"%x\r\n%s\r\n" % (len(payload), payload))
    if done:
        payload = b"data: [DONE]\n\n"
        out.append(b"%x\r\n%s\r\n" % (len(payload), payload))
    return b"".join(out)


def stream_response(body: bytes, terminate: bool = True) -> bytes:
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    return head + body + (b"0\r\n\r\n" if terminate else b"")


class ScriptedServer:
    def __init__(self, response: bytes, keep_open: bool = False) -> None:
        self.response = response
        self.keep_open = keep_open
        self.requests = 0
        self.loop = asyncio.new_event_loop()
        self.port = 0
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            srv = self.loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
            self._server = srv
            self.port = srv.sockets[0].getsockname()[1]
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True, name="scripted-server")
        self.thread.start()
        assert ready.wait(10), "scripted server did not start"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                n = 0
                for line in lines[1:]:
                    k, _, v = line.partition(":")
                    if k.strip().lower() == "content-length":
                        n = int(v)
                if n:
                    await reader.readexactly(n)
                if lines[0].startswith("GET /v1/models"):
                    body = json.dumps({"object": "list", "data": [{"id": "m"}]}).encode()
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                        b"content-length: %d\r\n\r\n%s" % (len(body), body)
                    )
                    await writer.drain()
                    continue
                self.requests += 1
                writer.write(self.response)
                await writer.drain()
                if not self.keep_open:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self._server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@contextlib.contextmanager
def scripted(response: bytes, keep_open: bool = False) -> Iterator[ScriptedServer]:
    server = ScriptedServer(response, keep_open)
    try:
        yield server
    finally:
        server.stop()
