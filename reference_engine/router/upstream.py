"""The replicas behind the router: their URLs, their load as the router knows it, and the
health/stats loop that reads each one's /health and Prometheus /metrics.

A replica is out of rotation while its polls fail (a refused connection, /health other than
200, POLL_FAILURES timeouts in a row; back when a poll succeeds) or while its circuit breaker
is open (router/breaker.py: fed by the answers the app relays; back when a probe request
the pool sends after the cool-down is answered well). Each move out of or back into
rotation is one log line (logger `cbbench.router`). The stats read: running, waiting, KV
usage and prefix-cache hits/queries,
under the names vLLM, SGLang, TGI and cbbench's engine export (the harness's telemetry
adapters list the same names; the engine cannot import them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.router.breaker import BreakerSettings, CircuitBreaker
from cbbench.reference_engine.router.options import POLL_INTERVAL_S, UPSTREAM_TIMEOUT_S
from cbbench.reference_engine.router.policy import ReplicaLoad
from prometheus_client.parser import text_string_to_metric_families

# Sample names per field, first found wins (counters with their _total suffix).
RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs", "tgi_batch_current_size")
WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "tgi_queue_size")
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")
PREFIX_HITS = ("vllm:prefix_cache_hits_total",)
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total",)
PREFIX_HIT_RATE = ("vllm:gpu_prefix_cache_hit_rate", "sglang:cache_hit_rate")

POLL_TIMEOUT_S = 2.0
POLL_FAILURES = 2  # consecutive failed polls (not refused) that take a replica out
SSE_STARTS = (b"data:", b":", b"event:", b"id:", b"retry:")

log = logging.getLogger("cbbench.router")


def junk_reason(status: int, content_type: str, head: bytes, stream: bool) -> str | None:
    """Why an answer's status and first bytes are a replica's failure, not an answer (None:
    they are one). 4xx is the client's: an answer. `head`: the whole body, or a stream's
    first chunk."""
    if status >= 500:
        text = head.decode("utf-8", "replace").strip()[:80] or "(empty body)"
        return f"answered {status}: {text}"
    if status >= 400:
        return None
    if stream and content_type.startswith("text/event-stream"):
        if not head.lstrip().startswith(SSE_STARTS):
            return f"a stream that is not SSE: {head[:40]!r}"
        return None
    if head.lstrip()[:1] == b"{":  # a JSON object (the client parses it; a cheap look here)
        return None
    return f"answered {status} with a body that is not JSON: {head[:40]!r}"


@dataclass
class ReplicaStats:
    """One read of a replica's /metrics (fields it does not export stay None)."""

    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    prefix_hits: float | None = None
    prefix_queries: float | None = None
    prefix_hit_rate: float | None = None  # a gauge (SGLang, older vLLM), else hits/queries


def parse_stats(text: str) -> ReplicaStats:
    """Sum each sample name over its label sets (KV usage: the mean)."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            sums[s.name] = sums.get(s.name, 0.0) + float(s.value)
            counts[s.name] = counts.get(s.name, 0) + 1

    def first(names: Sequence[str], mean: bool = False) -> float | None:
        for n in names:
            if n in sums:
                return sums[n] / counts[n] if mean else sums[n]
        return None

    st = ReplicaStats(
        first(RUNNING),
        first(WAITING),
        first(KV_USAGE, mean=True),
        first(PREFIX_HITS),
        first(PREFIX_QUERIES),
        first(PREFIX_HIT_RATE, mean=True),
    )
    if st.prefix_hit_rate is None and st.prefix_queries:
        st.prefix_hit_rate = (st.prefix_hits or 0.0) / st.prefix_queries
    return st


@dataclass
class Replica:
    url: str  # base URL, no /v1
    load: ReplicaLoad
    stats: ReplicaStats = field(default_factory=ReplicaStats)
    down_reason: str | None = None  # why it is out of rotation
    failed: int = 0  # requests that failed at this replica
    retried: int = 0  # requests resent to another replica after failing at this one
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)
    poll_down: str | None = None  # why its polls say it is out
    models: list[dict] = field(default_factory=list)  # its /v1/models cards, last read
    read_at: float | None = None  # monotonic time of the last good poll
    poll_failures: int = 0  # consecutive failed polls

    @property
    def name(self) -> str:
        return self.load.name

    def describe(self) -> dict:
        return {
            "name": self.name,
            "url": self.url,
            "healthy": self.load.healthy,
            "in_flight": self.load.in_flight,
            "routed": self.load.routed,
            "failed": self.failed,
            "retried": self.retried,
            "breaker": self.breaker.state,
            **({"error": self.down_reason} if self.down_reason else {}),
        }


def check_url(url: str) -> str:
    u = url.strip().rstrip("/")
    if u.endswith("/v1"):
        u = u[:-3]
    if not u.startswith(("http://", "https://")) or len(u.split("//", 1)[1]) == 0:
        raise EngineError(f"--replica {url!r}: expected a base URL like http://HOST:PORT")
    return u


class ReplicaPool:
    """The replicas and the loop that polls them. All state changes on the event loop."""

    def __init__(
        self,
        urls: Sequence[str],
        api_key: str | None = None,
        poll_interval_s: float = POLL_INTERVAL_S,
        breaker: BreakerSettings | None = None,
        probe_timeout_s: float = UPSTREAM_TIMEOUT_S,
        names: Sequence[str] | None = None,
    ) -> None:
        """`names`: one per URL (default r0, r1, ...; P/D pools: p0.., d0..)."""
        if not urls:
            raise EngineError("the router needs at least one --replica URL")
        clean = [check_url(u) for u in urls]
        dup = sorted({u for u in clean if clean.count(u) > 1})
        if dup:
            raise EngineError(f"--replica given twice: {', '.join(dup)}")
        assert poll_interval_s > 0
        settings = breaker or BreakerSettings()
        self.replicas = [
            Replica(u, ReplicaLoad(i, names[i] if names else f"r{i}"),
                    breaker=CircuitBreaker(settings))  # fmt: skip
            for i, u in enumerate(clean)
        ]
        self.probe_timeout_s = probe_timeout_s
        self._probes: set[asyncio.Task] = set()
        self._started = False  # log moves once the first poll set the starting rotation
        self.loads = [r.load for r in self.replicas]
        self.headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.poll_interval_s = poll_interval_s
        self._task: asyncio.Task | None = None
        self._client: httpx.AsyncClient | None = None

    def mark_down(self, replica: Replica, reason: str) -> None:
        """Its polls (or a refused connection) say it is out."""
        replica.poll_down = reason
        self._rotate(replica)

    def mark_up(self, replica: Replica) -> None:
        replica.poll_down = None
        self._rotate(replica)

    def answered(self, replica: Replica, failure: str | None, hard: bool = False) -> None:
        """One answer's outcome for the breaker (`failure`: why it was not an answer)."""
        if failure is None:
            replica.breaker.success()
        else:
            replica.failed += 1
            replica.breaker.failure(failure, hard)
        self._rotate(replica)

    def _rotate(self, replica: Replica) -> None:
        b = replica.breaker
        reason = replica.poll_down
        if reason is None and not b.allows:
            reason = f"circuit {b.state}: {b.reason}"
        was = replica.load.healthy
        replica.load.healthy = reason is None
        replica.down_reason = reason
        if self._started and was != replica.load.healthy:
            if reason is None:
                log.warning("router: %s (%s) back in rotation", replica.name, replica.url)
            else:
                log.warning(
                    "router: %s (%s) out of rotation: %s", replica.name, replica.url, reason
                )

    async def probe(self, replica: Replica) -> None:
        """The half-open breaker's probe: one streamed 1-token completion of the pool's own."""
        assert self._client is not None
        model = next((str(c["id"]) for c in replica.models if c.get("id")), None)
        body: dict = {"prompt": "ping", "max_tokens": 1, "stream": True}
        if model is not None:
            body["model"] = model
        try:
            r = await self._client.post(
                replica.url + "/v1/completions",
                json=body,
                headers=self.headers,
                timeout=self.probe_timeout_s,
            )
            ctype = r.headers.get("content-type", "")
            failure = junk_reason(r.status_code, ctype, r.content, True)
            if failure is None and r.status_code < 400 and b"[DONE]" not in r.content:
                failure = f"a stream without [DONE]: {r.content[-40:]!r}"
        except httpx.HTTPError as exc:
            failure = f"probe failed: {type(exc).__name__}: {exc}"[:200]
        self.answered(replica, failure)

    @property
    def healthy(self) -> list[Replica]:
        return [r for r in self.replicas if r.load.healthy]

    async def poll(self, replica: Replica) -> None:
        """One read of /health and /metrics (and /v1/models until it has the cards)."""
        assert self._client is not None
        try:
            h = await self._client.get(replica.url + "/health")
            if h.status_code != 200:
                self.mark_down(replica, f"/health answered {h.status_code}")
                return
            m = await self._client.get(replica.url + "/metrics")
            if m.status_code == 200:
                replica.stats = parse_stats(m.text)
                st = replica.stats
                replica.load.stats_read(int(st.running or 0), int(st.waiting or 0), st.kv_usage)
            if not replica.models:
                r = await self._client.get(replica.url + "/v1/models", headers=self.headers)
                if r.status_code == 200:
                    replica.models = list(r.json().get("data") or [])
        except (httpx.HTTPError, ValueError) as exc:
            replica.poll_failures += 1
            # refused: nobody listens; a slow answer (a busy host) counts only when repeated
            if isinstance(exc, httpx.ConnectError) or replica.poll_failures >= POLL_FAILURES:
                self.mark_down(replica, f"poll failed: {type(exc).__name__}: {exc}"[:200])
            return
        replica.poll_failures = 0
        replica.read_at = time.monotonic()
        self.mark_up(replica)

    async def start(self) -> None:
        """First poll of every replica (so a dead URL starts out of rotation), then the loop."""
        self._client = httpx.AsyncClient(timeout=POLL_TIMEOUT_S)
        await asyncio.gather(*(self.poll(r) for r in self.replicas))
        self._started = True
        self._task = asyncio.ensure_future(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval_s)
            await asyncio.gather(*(self.poll(r) for r in self.replicas))
            for r in self.replicas:
                if r.breaker.probe_due():  # now half-open: one probe at a time
                    task = asyncio.ensure_future(self.probe(r))
                    self._probes.add(task)
                    task.add_done_callback(self._probes.discard)

    async def stop(self) -> None:
        for task in [self._task, *self._probes]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._client is not None:
            await self._client.aclose()
