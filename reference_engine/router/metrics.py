"""The router's Prometheus /metrics: per-replica series with a `replica` label and the
routing-time histogram, in one registry per router (no global state).

Per replica, as last read from its /metrics: `vllm:num_requests_running`,
`vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`, `vllm:prefix_cache_hits_total` /
`_queries_total` (vLLM's names, so a scraper that sums over labels, cbbench's telemetry
included, reads the cluster's totals) and `cbbench:router_prefix_cache_hit_rate`; the
router's own: `cbbench:router_requests_routed_total`, `cbbench:router_requests_in_flight`,
`cbbench:router_request_failures_total`, `cbbench:router_requests_retried_total` (requests
that failed there before their first byte and were resent to another replica),
`cbbench:router_breaker_state` (0 closed, 1 open, 2 half-open),
`cbbench:router_breaker_opened_total`, `cbbench:router_replica_up` (with the `url`), and
`cbbench:router_routing_time_seconds` (one policy decision, prefix hashing included). A
field a replica does not export has no sample for it, never a zero.
"""

from __future__ import annotations

from collections.abc import Iterator

from cbbench.reference_engine.router.breaker import STATE_VALUE
from cbbench.reference_engine.router.upstream import ReplicaPool
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
ROUTING_BUCKETS = (5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 5e-3)


class _PoolCollector(Collector):
    def __init__(self, pool: ReplicaPool) -> None:
        self.pool = pool

    def collect(self) -> Iterator[Metric]:
        rs = self.pool.replicas
        label = ["replica"]

        def gauge(name: str, doc: str, attr: str) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=label)
            for r in rs:
                v = getattr(r.stats, attr)
                if v is not None:
                    g.add_metric([r.name], v)
            return g

        def counter(name: str, doc: str, attr: str) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=label)
            for r in rs:
                v = getattr(r.stats, attr)
                if v is not None:
                    c.add_metric([r.name], v)
            return c

        yield gauge(
            "vllm:num_requests_running", "Replica's running requests, last read.", "running"
        )
        yield gauge(
            "vllm:num_requests_waiting", "Replica's waiting requests, last read.", "waiting"
        )
        yield gauge(
            "vllm:kv_cache_usage_perc", "Replica's KV-cache usage (0-1), last read.", "kv_usage"
        )
        yield counter(
            "vllm:prefix_cache_hits", "Replica's prefix-cache hit tokens, last read.", "prefix_hits"
        )
        yield counter(
            "vllm:prefix_cache_queries",
            "Replica's prefix-cache query tokens, last read.",
            "prefix_queries",
        )
        yield gauge(
            "cbbench:router_prefix_cache_hit_rate",
            "Replica's prefix-cache hit rate since it started (hits / queries), last read.",
            "prefix_hit_rate",
        )  # fmt: skip
        routed = CounterMetricFamily(
            "cbbench:router_requests_routed", "Requests routed to the replica.", labels=label
        )
        failed = CounterMetricFamily(
            "cbbench:router_request_failures",
            "Requests that failed at the replica (refused, lost, timed out, 5xx, junk).",
            labels=label,
        )
        retried = CounterMetricFamily(
            "cbbench:router_requests_retried",
            "Requests that failed at the replica before their first byte and were resent.",
            labels=label,
        )
        state = GaugeMetricFamily(
            "cbbench:router_breaker_state",
            "The replica's circuit breaker: 0 closed, 1 open, 2 half-open.",
            labels=label,
        )
        opened = CounterMetricFamily(
            "cbbench:router_breaker_opened",
            "Times the replica's circuit breaker opened.",
            labels=label,
        )
        in_flight = GaugeMetricFamily(
            "cbbench:router_requests_in_flight", "Router's requests at the replica.", labels=label
        )
        up = GaugeMetricFamily(
            "cbbench:router_replica_up", "1 in rotation, 0 out.", labels=["replica", "url"]
        )
        for r in rs:
            routed.add_metric([r.name], r.load.routed)
            failed.add_metric([r.name], r.failed)
            retried.add_metric([r.name], r.retried)
            state.add_metric([r.name], STATE_VALUE[r.breaker.state])
            opened.add_metric([r.name], r.breaker.opened)
            in_flight.add_metric([r.name], r.load.in_flight)
            up.add_metric([r.name, r.url], 1.0 if r.load.healthy else 0.0)
        yield from (routed, failed, retried, state, opened, in_flight, up)


class RouterMetrics:
    def __init__(self, pool: ReplicaPool, policy: str) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_PoolCollector(pool))
        self.routing_time = Histogram(
            "cbbench:router_routing_time_seconds",
            "Time of one routing decision (prefix hashing included).",
            ["policy"],
            registry=self.registry,
            buckets=ROUTING_BUCKETS,
        ).labels(policy)
        self._pd = None  # P/D counters, made on the first P/D request

    def pd_request(self, prefill: str, decode: str, kv_bytes: int) -> None:
        """One request's two hops (router/pd.py)."""
        if self._pd is None:
            from prometheus_client import Counter

            self._pd = Counter("cbbench:router_pd_requests", "Requests by prefill and decode "
                               "worker.", ["prefill", "decode"], registry=self.registry)  # fmt: skip
            self._pd_bytes = Counter("cbbench:router_pd_kv_transfer_bytes", "KV bytes moved "
                                     "from prefill to decode workers.", registry=self.registry)  # fmt: skip
        self._pd.labels(prefill, decode).inc()
        self._pd_bytes.inc(kv_bytes)

    def render(self) -> bytes:
        return generate_latest(self.registry)
