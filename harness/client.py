"""Async OpenAI-compatible client (httpx, HTTP/1.1 keep-alive) that fills a RequestRecord.

One `send` = one request: every raw read off the socket is timestamped with
`time.monotonic_ns()` and fed to the incremental SSE parser. A chunk's token count comes from
`token_ids` (vLLM's `return_token_ids`, the reference engine), else from a `usage` delta,
else one token per non-empty text chunk. A chunk that carries k tokens spreads the gap since
the previous token evenly over its k tokens, so the ITL list has one entry per token after the
first and its mean equals TPOT (tokens of the first chunk after the first one get gap 0: they
arrived with it). Failures never raise: they end in `status="error"` with a reason and kind.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import httpx
from cbbench.harness import http1
from cbbench.harness.records import RequestRecord
from cbbench.harness.sessions import Reply
from cbbench.harness.sse import SSEParser

ERROR_TEXT_LIMIT = 300
_RAW_DECODE = json.JSONDecoder().raw_decode


def _parse_json(data: bytes):
    """json.loads for one SSE payload, ~3x faster: raw_decode on str skips encoding detection."""
    text = data.decode()
    try:
        obj, end = _RAW_DECODE(text)
    except ValueError:
        return json.loads(text)  # leading whitespace, or the error message json.loads gives
    if end != len(text) and text[end:].strip():
        return json.loads(text)  # trailing garbage: let json.loads raise
    return obj


@dataclass
class ClientConfig:
    base_url: str
    model: str
    endpoint: str = "completions"  # "completions" | "chat"
    stream: bool = True
    api_key: str | None = None
    timeout_s: float = 600.0
    extensions: bool = True  # ignore_eos, min_tokens, return_token_ids, priority (vLLM accepts)
    extra_body: dict = field(default_factory=dict)
    max_connections: int = 100
    collect_server_times: bool = False  # selftest: keep per-chunk (recv - server t_send_ns)
    http_client: str = "raw"  # "raw" (http1.py, the fast path) | "httpx"

    @property
    def url(self) -> str:
        path = "/v1/chat/completions" if self.endpoint == "chat" else "/v1/completions"
        return self.base_url.rstrip("/") + path


class RequestFailed(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def build_payload(
    cfg: ClientConfig, prompt: list[int] | str | list[dict], rec: RequestRecord
) -> dict:
    """The request body. A chat prompt is a message list (a session's history) or one text."""
    body: dict = {"model": cfg.model, "max_tokens": rec.output_len, "stream": cfg.stream}
    if cfg.endpoint == "chat":
        is_messages = isinstance(prompt, list) and prompt and isinstance(prompt[0], dict)
        body["messages"] = prompt if is_messages else [{"role": "user", "content": prompt}]
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
        headers = {"authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
        self.headers = {"content-type": "application/json", **headers}
        self.path = "/v1/chat/completions" if cfg.endpoint == "chat" else "/v1/completions"
        assert cfg.http_client in ("raw", "httpx"), cfg.http_client
        self.pool = http1.H1Pool(cfg.base_url) if cfg.http_client == "raw" else None
        n = max(1, cfg.max_connections)
        self.http = (
            None
            if self.pool
            else httpx.AsyncClient(
                headers=headers,
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

    async def send(
        self, rec: RequestRecord, prompt: list[int] | str | list[dict], reply: Reply | None = None
    ) -> RequestRecord:
        """Send one request and fill `rec` in place (timing, tokens, outcome); with `reply`,
        also keep the response's text and token ids there (a session's next turn needs them)."""
        chunks: list[tuple[int, int]] = []  # (arrival ns, tokens in chunk)
        state: dict = {}
        if reply is not None:
            state["reply"] = reply
        body = json.dumps(build_payload(self.cfg, prompt, rec)).encode()
        if isinstance(prompt, list) and (not prompt or isinstance(prompt[0], int)):
            rec.prompt_tokens_client = len(prompt)
        exchange = self._exchange_raw if self.pool is not None else self._exchange
        try:
            await asyncio.wait_for(exchange(rec, body, chunks, state), self.cfg.timeout_s)
        except RequestFailed as exc:
            fail_record(rec, exc.kind, str(exc))
        except http1.ConnectFailed as exc:
            fail_record(rec, "connection", str(exc))
        except http1.ConnectionLost as exc:
            fail_record(rec, "stream" if exc.got_response else "connection", str(exc))
        except http1.BadResponse as exc:
            fail_record(rec, "protocol", str(exc))
        except asyncio.TimeoutError:
            fail_record(rec, "timeout", f"no complete response within {self.cfg.timeout_s:g} s")
        except httpx.TimeoutException as exc:
            fail_record(rec, "timeout", f"{type(exc).__name__}: {exc}")
        except httpx.ConnectError as exc:
            fail_record(rec, "connection", f"cannot connect to {self.cfg.base_url}: {exc}")
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
            kind = "stream" if chunks or state.get("status") else "connection"
            fail_record(rec, kind, f"{type(exc).__name__}: {exc or 'connection closed'}")
        except httpx.HTTPError as exc:
            fail_record(rec, "http", f"{type(exc).__name__}: {exc}")
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            fail_record(rec, "protocol", f"unexpected response: {type(exc).__name__}: {exc}")
        except OSError as exc:  # after asyncio.TimeoutError, which is an OSError on 3.11+
            fail_record(rec, "connection", f"{type(exc).__name__}: {exc}")
        self._finish(rec, chunks, state)
        return rec

    async def _exchange(self, rec: RequestRecord, body: bytes, chunks: list, state: dict) -> None:
        headers = {"content-type": "application/json", "x-request-id": rec.id}
        req = self.http.build_request("POST", self.cfg.url, content=body, headers=headers)
        rec.sent_s = self._s(time.monotonic_ns())
        resp = await self.http.send(req, stream=True)
        try:
            state["status"] = resp.status_code
            scheduler = resp.headers.get("x-cbbench-scheduler")
            if scheduler:
                rec.extra["scheduler"] = scheduler
            if resp.status_code >= 400:
                text = (await resp.aread()).decode("utf-8", "replace")
                raise RequestFailed(
                    f"http_{resp.status_code // 100}xx",
                    f"HTTP {resp.status_code}: {error_message(text)}",
                )
            if self.cfg.stream:
                await self._read_stream(resp, chunks, state)
            else:
                raw = await resp.aread()
                t = time.monotonic_ns()
                k = self._apply(json.loads(raw), state)
                chunks.append((t, state.get("ids_total") or state.get("usage_out") or k))
        finally:
            await resp.aclose()

    async def _exchange_raw(
        self, rec: RequestRecord, body: bytes, chunks: list, state: dict
    ) -> None:
        assert self.pool is not None
        parser = SSEParser()
        sends = state.setdefault("server_send_ns", []) if self.cfg.collect_server_times else None
        raw_body: list[bytes] = []
        stream = self.cfg.stream

        def on_data(data: bytes, t: int, status: int) -> None:
            if stream and status < 400:
                self._consume(data, t, parser, chunks, state, sends)
            else:
                raw_body.append(data)

        headers = {**self.headers, "x-request-id": rec.id}
        rec.sent_s = self._s(time.monotonic_ns())
        proto = await self.pool.request("POST", self.path, headers, body, on_data)
        state["status"] = proto.status
        scheduler = proto.headers.get("x-cbbench-scheduler")
        if scheduler:
            rec.extra["scheduler"] = scheduler
        await self.pool.finish(proto)
        if proto.status >= 400:
            text = b"".join(raw_body).decode("utf-8", "replace")
            raise RequestFailed(
                f"http_{proto.status // 100}xx", f"HTTP {proto.status}: {error_message(text)}"
            )
        if stream:
            if not state.get("done"):
                raise RequestFailed("stream", "stream ended without [DONE]")
        else:
            t = time.monotonic_ns()
            k = self._apply(json.loads(b"".join(raw_body)), state)
            chunks.append((t, state.get("ids_total") or state.get("usage_out") or k))

    def _consume(
        self, raw: bytes, t: int, parser: SSEParser, chunks: list, state: dict, sends
    ) -> None:
        for data in parser.feed(raw):
            if data == b"[DONE]":
                state["done"] = True
                continue
            obj = _parse_json(data)
            k = self._apply(obj, state)
            if k:
                chunks.append((t, k))
                if sends is not None and "t_send_ns" in obj:
                    sends.append(t - obj["t_send_ns"])

    async def _read_stream(self, resp: httpx.Response, chunks: list, state: dict) -> None:
        parser = SSEParser()
        sends = state.setdefault("server_send_ns", []) if self.cfg.collect_server_times else None
        async for raw in resp.aiter_raw():
            self._consume(raw, time.monotonic_ns(), parser, chunks, state, sends)
        if not state.get("done"):
            raise RequestFailed("stream", "stream ended without [DONE]")

    def _apply(self, obj: dict, state: dict) -> int:
        """Fold one response object into `state`; return the tokens it carries."""
        if "error" in obj and not obj.get("choices"):
            err = obj["error"]
            msg = err.get("message", err) if isinstance(err, dict) else err
            raise RequestFailed("server_error", f"error in stream: {str(msg)[:ERROR_TEXT_LIMIT]}")
        if "cbbench" in obj:
            state["cbbench"] = obj["cbbench"]
        usage = obj.get("usage")
        k_usage = None
        if usage:
            state["usage_prompt"] = usage.get("prompt_tokens")
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and details.get("cached_tokens") is not None:
                state["cached_tokens"] = details["cached_tokens"]  # vLLM's prefix-cache hits
            out = usage.get("completion_tokens")
            if out is not None:
                if "usage_out" in state:  # per-chunk usage (vLLM continuous_usage_stats)
                    k_usage = out - state["usage_out"]
                state["usage_out"] = out
        choices = obj.get("choices") or ()
        if not choices:
            return 0
        c = choices[0]
        if "reply" in state:
            state["reply"].add_choice(c)
        if c.get("finish_reason"):
            state["finish"] = c["finish_reason"]
        if "prompt_token_ids" in c and c["prompt_token_ids"] is not None:
            state["prompt_ids"] = len(c["prompt_token_ids"])
        ids = c.get("token_ids")
        if ids is not None:
            state["ids_total"] = state.get("ids_total", 0) + len(ids)
            return len(ids)
        if k_usage is not None and self.cfg.stream:
            return k_usage
        text = c.get("text")
        if text is None:
            msg = c.get("delta") or c.get("message") or {}
            text = msg.get("content") or msg.get("reasoning_content")
        return 1 if text else 0

    def _finish(self, rec: RequestRecord, chunks: list, state: dict) -> None:
        rec.end_s = self._s(time.monotonic_ns())
        rec.finish_reason = state.get("finish")
        rec.prompt_tokens_server = state.get("usage_prompt") or state.get("prompt_ids")
        rec.output_tokens_server = state.get("usage_out")
        if "cbbench" in state:
            info = dict(state["cbbench"])
            rec.server_queue_s = info.pop("queue_time_s", None)
            rec.extra.update(info)
        if "cached_tokens" in state:
            rec.extra.setdefault("num_cached_tokens", state["cached_tokens"])
        if "server_send_ns" in state:
            rec.extra["recv_minus_send_s"] = [d / 1e9 for d in state["server_send_ns"]]
        rec.output_tokens_client = sum(k for _, k in chunks) if chunks else 0
        if chunks:
            times = _spread(chunks)
            rec.token_times_s = [self._s(t) for t in times]
            rec.first_token_s = rec.token_times_s[0]
            rec.last_token_s = rec.token_times_s[-1]
        if not rec.ok or rec.sent_s is None or not chunks:
            if rec.ok:
                fail_record(rec, "empty", "response carried no output tokens")
            return
        rec.e2e_s = rec.last_token_s - rec.sent_s
        if self.cfg.stream:
            rec.ttft_s = rec.first_token_s - rec.sent_s
            rec.itl_s = [
                b - a for a, b in zip(rec.token_times_s, rec.token_times_s[1:], strict=False)
            ]
            n = rec.output_tokens_server or rec.output_tokens_client
            if n > 1:
                rec.tpot_s = (rec.e2e_s - rec.ttft_s) / (n - 1)
        else:
            rec.token_times_s = []


def _spread(chunks: list[tuple[int, int]]) -> list[int]:
    """Token arrival times (ns): a chunk of k tokens spreads the gap since the last token."""
    t_first, k_first = chunks[0]
    times = [t_first] * k_first
    prev = t_first
    for t, k in chunks[1:]:
        if k == 1:
            times.append(t)
        else:
            gap = (t - prev) / k
            times.extend(int(prev + gap * (j + 1)) for j in range(k))
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
    return text.strip()[:ERROR_TEXT_LIMIT] or "(empty body)"


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
