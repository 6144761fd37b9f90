"""Async OpenAI-compatible client that fills a RequestRecord, over one of two transports.

`http_client="raw"` (the default, `http1.py`): a small HTTP/1.1 keep-alive client on asyncio
that stamps every read off the socket (the kernel's receive time where the platform gives it,
else `time.monotonic_ns()` as the read is handled) and opens its connections apart from the
requests' timing. `http_client="httpx"`: httpx's AsyncClient, a second opinion. Both hand the
response to `response.Response` (status, errors, SSE, token counting; the same handler the
Locust client uses), and `response.finish` derives the record's latencies. Failures never
raise: they end in `status="error"` with a reason and kind.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass, field

import httpx
from cbbench.harness.client import aio, endpoints, http1, response
from cbbench.harness.client.reply import Reply
from cbbench.harness.client.response import (
    ERROR_TEXT_LIMIT,
    RequestFailed,
    Response,
    error_message,
    fail_record,
    failure,
    finish,
)
from cbbench.harness.results.records import RequestRecord

_timeout = getattr(asyncio, "timeout", None)

__all__ = [
    "ERROR_TEXT_LIMIT",
    "ClientConfig",
    "OpenAIClient",
    "RequestFailed",
    "build_payload",
    "error_message",
    "fail_record",
    "probe_server",
]


SENDS_PER_TURN = 64  # sends per turn of the event loop in a burst (aio.TurnBudget)


@dataclass
class ClientConfig:
    base_url: str
    model: str
    endpoint: str = "completions"  # one of endpoints.ENDPOINTS
    stream: bool = True
    api_key: str | None = None
    timeout_s: float = 600.0
    extensions: bool = True  # ignore_eos, min_tokens, return_token_ids, priority (vLLM accepts)
    extra_body: dict = field(default_factory=dict)
    max_connections: int = 100
    collect_server_times: bool = False  # selftest: keep per-chunk (recv - server t_send_ns)
    http_client: str = "raw"  # "raw" (http1.py, the fast path) | "httpx"
    kernel_timestamps: bool = True  # raw client: the kernel's receive times where available
    session_header: str | None = "x-session-id"  # sent with a session's id on its requests
    reasoning_parser: str = "auto"  # where reasoning is in a stream (stream_kinds.py)
    embeddings_batch: int = 1  # embeddings: inputs per request (client/embeddings.py)

    def __post_init__(self) -> None:
        if self.endpoint == "embeddings":
            self.stream = False  # never streamed

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + endpoints.path(self.endpoint)


def header_value(text: str) -> str:
    """`text` as a header value: itself when plain printable ASCII, else a stable digest (a
    trace's conversation id may hold anything; a header must not)."""
    if text.isascii() and text.isprintable() and text.strip() == text and len(text) <= 200:
        return text
    return "h" + hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()


def build_payload(
    cfg: ClientConfig, prompt: list[int] | str | list[dict], rec: RequestRecord
) -> dict:
    """The request body. A chat prompt is a message list (a session's history) or one text;
    the Responses, Messages and embeddings bodies are their modules' (`endpoints.adapter`)."""
    adapter = endpoints.adapter(cfg.endpoint)
    if adapter is not None:
        body = adapter.payload(cfg, prompt, rec)
        body.update(cfg.extra_body)
        return body
    body: dict = {"model": cfg.model, "max_tokens": rec.output_len, "stream": cfg.stream}
    if cfg.endpoint == "chat":
        is_messages = isinstance(prompt, list) and prompt and isinstance(prompt[0], dict)
        if isinstance(prompt, dict):  # an agent step: {"messages": [...], "tools": [...]}
            body.update(prompt)
        else:
            body["messages"] = prompt if is_messages else [{"role": "user", "content": prompt}]
        # OpenAI's spelling (its reasoning models take no other); max_tokens stays for the
        # servers that read only that one (vLLM and SGLang read either)
        body["max_completion_tokens"] = rec.output_len
    else:
        body["prompt"] = prompt
    if cfg.stream:
        body["stream_options"] = {"include_usage": True}
    if cfg.extensions:
        body.update(ignore_eos=True, min_tokens=rec.output_len, return_token_ids=True)
        if rec.priority:
            body["priority"] = rec.priority
    body.update(cfg.extra_body)
    return body


class OpenAIClient:
    def __init__(self, cfg: ClientConfig, t0_ns: int = 0) -> None:
        self.cfg = cfg
        self.t0_ns = t0_ns
        auth = endpoints.auth_headers(cfg.endpoint, cfg.api_key)
        self.headers = {"content-type": "application/json", **auth}
        self.path = endpoints.path(cfg.endpoint)
        self.adapter = endpoints.adapter(cfg.endpoint)  # Responses, Messages, embeddings
        self._head_start: bytes | None = None  # `encode`: the head before x-request-id
        # a burst of finished requests does its bookkeeping a few per loop turn (aio.py)
        self.turns = aio.TurnBudget(16)
        # and a burst of sends (a closed loop's start: every stream at once) a batch per
        # turn: 4,096 sends in one turn held every socket unread for ~0.3 s of CPU (#57)
        self.send_turns = aio.TurnBudget(SENDS_PER_TURN)
        assert cfg.http_client in ("raw", "httpx"), cfg.http_client
        self.pool = (
            http1.H1Pool(cfg.base_url, cfg.kernel_timestamps) if cfg.http_client == "raw" else None
        )
        n = max(1, cfg.max_connections)
        self.http = (
            None
            if self.pool
            else httpx.AsyncClient(
                headers=auth,
                timeout=httpx.Timeout(cfg.timeout_s),
                limits=httpx.Limits(max_connections=n, max_keepalive_connections=n),
                http1=True,
                http2=False,
                trust_env=False,
            )
        )

    async def aclose(self) -> None:
        if self.pool is not None:
            self.pool.close()
        if self.http is not None:
            await self.http.aclose()

    def _s(self, t_ns: int) -> float:
        return (t_ns - self.t0_ns) / 1e9

    def encode(self, rec: RequestRecord, prompt: list[int] | str | list[dict]) -> bytes:
        """What `send` writes for this request, built from nothing that depends on timing, so
        it can be built ahead (loadgen's look-ahead): the whole HTTP/1.1 request (head and
        body) for the raw client, the body for httpx."""
        body = response.dump_json(build_payload(self.cfg, prompt, rec))
        if self.pool is None:
            return body
        if self._head_start is None:  # the head is the same for every request up to here
            self._head_start = self.pool.head_start("POST", self.path, self.headers)
        rid = rec.id.encode("latin-1")
        if self.cfg.session_header and rec.session_id is not None:  # routers pin a session
            rid += b"\r\n%s: %s" % (
                self.cfg.session_header.encode("latin-1"),
                header_value(rec.session_id).encode("ascii"),
            )
        return b"%sx-request-id: %s\r\ncontent-length: %d\r\n\r\n%s" % (
            self._head_start,
            rid,
            len(body),
            body,
        )

    async def send(
        self,
        rec: RequestRecord,
        prompt: list[int] | str | list[dict] | None,
        reply: Reply | None = None,
        encoded: bytes | None = None,
    ) -> RequestRecord:
        """Send one request and fill `rec` in place (timing, tokens, outcome); with `reply`,
        also keep the response's text and token ids there (a session's next turn needs them).
        `encoded`: the request as `encode` built it ahead (then `prompt` is not used, and
        the caller sets `rec.prompt_tokens_client`)."""
        cfg = self.cfg
        resp = Response(
            rec, cfg.stream, cfg.collect_server_times, reply, cfg.reasoning_parser, self.adapter
        )
        if encoded is None:
            encoded = self.encode(rec, prompt)
            if isinstance(prompt, list) and (not prompt or isinstance(prompt[0], int)):
                rec.prompt_tokens_client = len(prompt)
        if not self.send_turns.take():  # (free unless a burst of sends is under way)
            await self.send_turns.wait()
        try:
            if self.pool is not None:  # the pool keeps the deadline: no timer a request
                await self.pool.send_request(encoded, resp, self.cfg.timeout_s)
                resp.end(time.monotonic_ns())
            elif _timeout is not None:  # 3.11+: no task per request
                async with _timeout(self.cfg.timeout_s):
                    await self._exchange(rec, encoded, resp)
            else:  # pragma: no cover - Python 3.10
                await asyncio.wait_for(self._exchange(rec, encoded, resp), self.cfg.timeout_s)
        except Exception as exc:
            got = bool(resp.chunks or resp.status)
            why = failure(exc, got, self.cfg.base_url, self.cfg.timeout_s)
            if why is None:
                raise
            fail_record(rec, *why)
        end_ns = time.monotonic_ns()
        if not self.turns.take():  # the reads of other streams are not held up by this one's
            await self.turns.wait()
        finish(rec, resp, self.t0_ns, end_ns)
        return rec

    async def _exchange(self, rec: RequestRecord, body: bytes, resp: Response) -> None:
        assert self.http is not None
        headers = {"content-type": "application/json", "x-request-id": rec.id}
        if self.cfg.session_header and rec.session_id is not None:
            headers[self.cfg.session_header] = header_value(rec.session_id)
        req = self.http.build_request("POST", self.cfg.url, content=body, headers=headers)
        resp.sent(time.monotonic_ns())  # httpx connects inside send: set-up not apart
        r = await self.http.send(req, stream=True)
        try:
            resp.head(r.status_code, r.headers.get)
            async for raw in r.aiter_raw():
                resp.data(raw, time.monotonic_ns())
            resp.end(time.monotonic_ns())
        finally:
            await r.aclose()


def probe_server(base_url: str, api_key: str | None = None, timeout_s: float = 10.0) -> dict:
    """GET /v1/models: the model ids and what the server says about itself. Unreachable or
    not OpenAI-compatible -> CbbenchError (one line, exit 2)."""
    from cbbench.harness.errors import CbbenchError

    url = base_url.rstrip("/") + "/v1/models"
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        resp = httpx.get(url, headers=headers, timeout=timeout_s, trust_env=False)
    except httpx.HTTPError as exc:
        raise CbbenchError(
            f"cannot reach server at {base_url} ({type(exc).__name__}: {exc})"
        ) from None
    if resp.status_code == 401:
        raise CbbenchError(f"{url}: HTTP 401 unauthorized (check --api-key)")
    if resp.status_code >= 400:
        raise CbbenchError(f"{url}: HTTP {resp.status_code}: {error_message(resp.text)}")
    try:
        data = resp.json().get("data") or []
        models = [m["id"] for m in data]
    except (ValueError, AttributeError, KeyError, TypeError):
        raise CbbenchError(f"{url}: not an OpenAI-compatible model list") from None
    info: dict = {"models": models}
    if data:
        first = data[0]
        info.update(
            {k: first[k] for k in ("owned_by", "max_model_len", "root", "cbbench") if k in first}
        )
    for h in ("server", "x-cbbench-scheduler"):
        if h in resp.headers:
            info[h] = resp.headers[h]
    return info
