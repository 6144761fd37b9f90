"""Blocking OpenAI-compatible streaming client for Locust users (gevent-friendly).

Locust runs users as greenlets on gevent's monkey-patched sockets, so the load generator's
asyncio client cannot run there. This client keeps one keep-alive `http.client` connection
per user (a Locust user has one request in flight) and reuses everything else from
`cbbench.harness.client.OpenAIClient`: the request body, the SSE parser and token counting
(`_consume` / `_apply`), ITL spreading and the record's derived latencies (`_finish`), error
kinds. Every read off the socket (`read1`: what one chunk delivered) is timestamped with
`time.monotonic_ns()` on arrival, as the async client does.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import time
from urllib.parse import urlsplit

from cbbench.harness.client import (
    ClientConfig,
    OpenAIClient,
    RequestFailed,
    build_payload,
    error_message,
    fail_record,
)
from cbbench.harness.records import RequestRecord
from cbbench.harness.sse import SSEParser

READ_SIZE = 65536


class SyncOpenAIClient(OpenAIClient):
    """One connection, one request at a time; `send` fills a RequestRecord and never raises
    for request failures (they end in `status="error"` with a kind, as in the async client)."""

    def __init__(self, cfg: ClientConfig, t0_ns: int = 0) -> None:
        super().__init__(ClientConfig(**{**cfg.__dict__, "http_client": "raw"}), t0_ns)
        u = urlsplit(cfg.base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {cfg.base_url!r}")
        self._https = u.scheme == "https"
        self._host = u.hostname
        self._port = u.port or (443 if self._https else 80)
        self._prefix = u.path.rstrip("/")
        self._conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            timeout = self.cfg.timeout_s
            if self._https:
                ctx = ssl.create_default_context()
                self._conn = http.client.HTTPSConnection(
                    self._host, self._port, timeout=timeout, context=ctx
                )
            else:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
            self._conn.connect()
            # http.client sends the head and the body in two writes: without TCP_NODELAY the
            # body waits for the server's delayed ACK (~40 ms) on a kept-alive connection.
            self._conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self._conn

    def send_sync(self, rec: RequestRecord, prompt: list[int] | str) -> RequestRecord:
        """Send one request and fill `rec` in place (timing, tokens, outcome)."""
        chunks: list[tuple[int, int]] = []  # (arrival ns, tokens in chunk)
        state: dict = {}
        body = json.dumps(build_payload(self.cfg, prompt, rec)).encode()
        if isinstance(prompt, list):
            rec.prompt_tokens_client = len(prompt)
        try:
            self._exchange_sync(rec, body, chunks, state)
        except RequestFailed as exc:
            self.close()
            fail_record(rec, exc.kind, str(exc))
        except (ConnectionRefusedError, socket.gaierror) as exc:
            self.close()
            fail_record(rec, "connection", f"cannot connect to {self.cfg.base_url}: {exc}")
        except TimeoutError as exc:  # socket.timeout is an alias of it (3.10+)
            self.close()
            fail_record(rec, "timeout", f"{type(exc).__name__}: {exc or 'timed out'}")
        except (http.client.HTTPException, OSError) as exc:
            self.close()
            kind = "stream" if chunks or state.get("status") else "connection"
            fail_record(rec, kind, f"{type(exc).__name__}: {exc or 'connection closed'}")
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            self.close()
            fail_record(rec, "protocol", f"unexpected response: {type(exc).__name__}: {exc}")
        self._finish(rec, chunks, state)
        return rec

    def _exchange_sync(self, rec: RequestRecord, body: bytes, chunks: list, state: dict) -> None:
        headers = {**self.headers, "x-request-id": rec.id}
        deadline = time.monotonic() + self.cfg.timeout_s
        for attempt in (0, 1):  # a kept-alive connection the server closed: reconnect once
            conn = self._connection()
            rec.sent_s = self._s(time.monotonic_ns())
            try:
                conn.request("POST", self._prefix + self.path, body, headers)
                resp = conn.getresponse()
                break
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()
                if attempt:
                    raise
        state["status"] = resp.status
        scheduler = resp.getheader("x-cbbench-scheduler")
        if scheduler:
            rec.extra["scheduler"] = scheduler
        if resp.status >= 400:
            text = resp.read().decode("utf-8", "replace")
            raise RequestFailed(
                f"http_{resp.status // 100}xx", f"HTTP {resp.status}: {error_message(text)}"
            )
        if not self.cfg.stream:
            raw = resp.read()
            t = time.monotonic_ns()
            k = self._apply(json.loads(raw), state)
            chunks.append((t, state.get("ids_total") or state.get("usage_out") or k))
            return
        parser = SSEParser()
        while True:
            data = resp.read1(READ_SIZE)
            t = time.monotonic_ns()
            if not data:
                break
            self._consume(data, t, parser, chunks, state, None)
            if time.monotonic() > deadline:
                raise RequestFailed(
                    "timeout", f"no complete response within {self.cfg.timeout_s:g} s"
                )
        if resp.will_close:
            self.close()
        if not state.get("done"):
            raise RequestFailed("stream", "stream ended without [DONE]")
