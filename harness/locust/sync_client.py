"""Blocking OpenAI-compatible streaming client for Locust users (gevent-friendly).

Locust runs users as greenlets on gevent's monkey-patched sockets, so the load generator's
asyncio client cannot run there. This client keeps one keep-alive `http.client` connection
per user (a Locust user has one request in flight) and shares everything else with the async
client: the request body (`client.build_payload`), the response handler (`response.Response`:
status, errors, SSE, token counting), error kinds (`response.failure`) and the record's
derived latencies (`response.finish`). Every read off the socket (`read1`: what one chunk
delivered) is stamped with `time.monotonic_ns()` when it returns: user-space stamps (the
socket is gevent's, read by `http.client`; see docs/timing.md for why kernel stamps are not
used here).
"""

from __future__ import annotations

import http.client
import socket
import ssl
import time
from urllib.parse import urlsplit

from cbbench.harness.client import endpoints, response
from cbbench.harness.client.api import ClientConfig, build_payload, header_value
from cbbench.harness.client.reply import Reply
from cbbench.harness.client.response import RequestFailed, Response, fail_record, failure, finish
from cbbench.harness.results.records import RequestRecord

READ_SIZE = 65536


class SyncOpenAIClient:
    """One connection, one request at a time; `send_sync` fills a RequestRecord and never
    raises for request failures (they end in `status="error"` with a kind, as in the async
    client)."""

    def __init__(self, cfg: ClientConfig, t0_ns: int = 0) -> None:
        self.cfg = cfg
        self.t0_ns = t0_ns
        auth = endpoints.auth_headers(cfg.endpoint, cfg.api_key)
        self.headers = {"content-type": "application/json", **auth}
        self.path = endpoints.path(cfg.endpoint)
        self.adapter = endpoints.adapter(cfg.endpoint)  # Responses, Messages, embeddings
        u = urlsplit(cfg.base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {cfg.base_url!r}")
        self._https = u.scheme == "https"
        self._host = u.hostname
        self._port = u.port or (443 if self._https else 80)
        self._prefix = u.path.rstrip("/")
        self._conn: http.client.HTTPConnection | None = None
        self._served = 0  # requests the current connection has carried

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connection(self) -> tuple[http.client.HTTPConnection, int | None]:
        """The kept-alive connection, or a new one and its set-up time (ns)."""
        if self._conn is not None:
            return self._conn, None
        t = time.monotonic_ns()
        timeout = self.cfg.timeout_s
        if self._https:
            ctx = ssl.create_default_context()
            conn = http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=ctx)
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        conn.connect()
        # http.client sends the head and the body in two writes: without TCP_NODELAY the
        # body waits for the server's delayed ACK (~40 ms) on a kept-alive connection.
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._conn, self._served = conn, 0
        return conn, time.monotonic_ns() - t

    def send_sync(
        self, rec: RequestRecord, prompt: list[int] | str | list[dict], reply: Reply | None = None
    ) -> RequestRecord:
        """Send one request and fill `rec` in place (timing, tokens, outcome); with `reply`,
        also keep the response's text and token ids there (a session's next turn needs them)."""
        cfg = self.cfg
        resp = Response(
            rec, cfg.stream, cfg.collect_server_times, reply, cfg.reasoning_parser, self.adapter
        )
        body = response.dump_json(build_payload(self.cfg, prompt, rec))
        if isinstance(prompt, list) and (not prompt or isinstance(prompt[0], int)):
            rec.prompt_tokens_client = len(prompt)
        try:
            self._exchange_sync(rec, body, resp)
        except Exception as exc:
            self.close()
            why = failure(
                exc, bool(resp.chunks or resp.status), self.cfg.base_url, self.cfg.timeout_s
            )
            if why is None:
                raise
            fail_record(rec, *why)
        finish(rec, resp, self.t0_ns, time.monotonic_ns())
        return rec

    def _exchange_sync(self, rec: RequestRecord, body: bytes, resp: Response) -> None:
        headers = {**self.headers, "x-request-id": rec.id}
        if self.cfg.session_header and rec.session_id is not None:  # routers pin a session
            headers[self.cfg.session_header] = header_value(rec.session_id)
        deadline = time.monotonic() + self.cfg.timeout_s
        for attempt in (0, 1):  # a kept-alive connection the server closed: reconnect once
            try:
                conn, connect_ns = self._connection()
                reused = self._served > 0
                resp.sent(time.monotonic_ns(), connect_ns, reused)
                conn.request("POST", self._prefix + self.path, body, headers)
                self._served += 1
                r = conn.getresponse()
                break
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()
                if attempt or not reused:
                    raise
        resp.head(r.status, r.getheader)
        if r.status >= 400 or not self.cfg.stream:
            data = r.read()
            resp.data(data, time.monotonic_ns())
        else:
            while True:
                data = r.read1(READ_SIZE)
                t = time.monotonic_ns()
                if not data:
                    break
                resp.data(data, t)
                if time.monotonic() > deadline:
                    raise RequestFailed(
                        "timeout", f"no complete response within {self.cfg.timeout_s:g} s"
                    )
        if r.will_close:
            self.close()
        resp.end(time.monotonic_ns())
