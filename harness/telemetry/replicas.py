"""Per-replica sampler: each replica's running, waiting, KV usage and (behind cbbench's
router) requests routed and in flight, over the run.

Two sources: a router's own `/metrics` whose series carry a `replica` label (cbbench route,
`cbbench serve --replicas`: one scrape gives every replica), or one `/metrics` URL per replica
(`--server-metrics-url`, repeated: for routers that export no per-replica series). Behind a
target whose `/metrics` has no `replica` label and without URLs, the sampler says so after its
first scrape and stops. Each tick is one `timeseries.jsonl` sample (`source: "replicas"`,
`replicas: {name: {field: value}}`: nested, so that the run-wide timelines never mix it up
with the server's own `running`). The summary gives each replica's figures and the
imbalance across replicas: max / mean and the coefficient of variation of the time-averaged
load (running + waiting, else the router's in-flight count) and of the requests routed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

import httpx
from cbbench.harness.telemetry.adapters import Adapter, detect
from cbbench.harness.telemetry.prom import Scrape, get_text, parse_metrics

log = logging.getLogger(__name__)

ROUTED = "cbbench:router_requests_routed_total"
IN_FLIGHT = "cbbench:router_requests_in_flight"
FIELDS = ("running", "waiting", "kv_usage", "routed", "in_flight", "load")


def imbalance(values: Sequence[float]) -> dict | None:
    """max / mean and coefficient of variation (population) of one figure per replica."""
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    if mean <= 0:
        return None
    var = sum((v - mean) ** 2 for v in values) / len(values)
    return {"max_over_mean": max(values) / mean, "cv": var**0.5 / mean, "mean": mean}


def pools(names: list[str]) -> list[list[str]]:
    """Replicas that share work: all of them, or behind cbbench's P/D router (prefill workers
    p0, p1, ..., decode workers d0, d1, ...) each role's own: a prefill worker's load against
    a decode worker's is no imbalance (1P:1D read "replica load max/mean 2")."""
    if names and all(len(n) > 1 and n[0] in "pd" and n[1:].isdigit() for n in names):
        by = [[n for n in names if n[0] == role] for role in "pd"]
        return [p for p in by if p]
    return [names]


def _by_replica(scrape: Scrape) -> dict[str, Scrape]:
    """One Scrape per `replica` label value (samples without the label are dropped)."""
    out: dict[str, Scrape] = {}
    for name, rows in scrape.samples.items():
        for labels, value in rows:
            r = labels.get("replica")
            if r is not None:
                sub = out.setdefault(r, Scrape(types=scrape.types))
                sub.samples.setdefault(name, []).append((labels, value))
    return out


class ReplicaSampler:
    name = "replicas"

    def __init__(
        self,
        router_url: str | None = None,
        replica_urls: Sequence[str] = (),
        interval_s: float = 0.25,
        timeout_s: float | None = None,
    ) -> None:
        assert router_url or replica_urls, "a router URL or replica URLs"
        assert interval_s > 0, "interval must be positive"
        self.router_url, self.replica_urls = router_url, list(replica_urls)
        self.interval_s = interval_s
        self.timeout_s = timeout_s or max(1.0, min(5.0, 2 * interval_s))
        self.unavailable_reason: str | None = None
        self.samples = 0
        self.failures = 0
        self.last_error: str | None = None
        self._adapters: dict[str, Adapter | None] = {}
        self._series: dict[str, dict[str, list[float]]] = {}  # replica -> field -> values
        self._latest: dict = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client: httpx.Client | None = None
        self._t0_ns = 0
        self._sink: Callable[[dict], None] = lambda _s: None

    def start(self, t0_ns: int, sink: Callable[[dict], None]) -> None:
        assert self._thread is None, "a sampler starts once"
        self._t0_ns, self._sink = t0_ns, sink
        self._client = httpx.Client(timeout=self.timeout_s, trust_env=False)
        self._scrape_once()
        if self.router_url and not self.replica_urls and not self._series:
            if self.failures == 0:  # answered, without per-replica series
                self.unavailable_reason = f"{self.router_url} has no per-replica series"
            else:
                self.unavailable_reason = str(self.last_error)
            self._client.close()
            return
        self._thread = threading.Thread(target=self._loop, name="cbbench-replicas", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=2 * self.timeout_s * max(1, len(self.replica_urls)) + 1.0)
        if self._thread.is_alive():
            self._sink = lambda _s: None
        elif self._client is not None:
            self._client.close()

    def latest(self) -> dict:
        with self._lock:
            return dict(self._latest)

    def summary(self) -> dict:
        if self.unavailable_reason is not None:
            return {"available": False, "reason": self.unavailable_reason}
        with self._lock:
            per: dict[str, dict] = {}
            for name, cols in sorted(self._series.items()):
                d: dict = {}
                for f in ("running", "waiting", "kv_usage", "in_flight", "load"):
                    vals = cols.get(f) or []
                    if vals:
                        d[f] = {"mean": sum(vals) / len(vals), "max": max(vals)}
                routed = cols.get("routed") or []
                if routed:
                    d["routed"] = routed[-1] - routed[0] if routed[-1] >= routed[0] else routed[-1]
                per[name] = d
            out: dict = {
                "available": True,
                "source": "router" if not self.replica_urls else "replica urls",
                "url": self.router_url,
                "urls": self.replica_urls or None,
                "interval_s": self.interval_s,
                "samples": self.samples,
                "failures": self.failures,
                "last_error": self.last_error,
                "per_replica": per,
            }
            imb: dict = {}
            for pool in pools(list(per)):  # P/D: prefill and decode workers are not peers
                ps = [per[n] for n in pool]
                loads = [d["load"]["mean"] for d in ps if "load" in d]
                routed_all = [d["routed"] for d in ps if "routed" in d]
                for key, vals in (("load", loads), ("routed", routed_all)):
                    x = imbalance(vals) if len(vals) == len(ps) else None
                    if x is not None and x["max_over_mean"] > imb.get(key, {}).get(
                            "max_over_mean", 0.0):  # fmt: skip
                        imb[key] = x
            out["imbalance"] = imb
            return out

    def _loop(self) -> None:
        next_t = time.monotonic()
        while True:
            next_t = max(next_t + self.interval_s, time.monotonic())
            if self._stop.wait(next_t - time.monotonic()):
                break
            self._scrape_once()
        self._scrape_once()  # the closing scrape: routed counts up to the end of the run

    def _fail(self, url: str, exc: Exception) -> None:
        with self._lock:
            self.failures += 1
            self.last_error = f"{url}: {type(exc).__name__}: {exc}"[:200]
            first = self.failures == 1
        if first and self._thread is not None:
            log.warning("replica metrics: %s (further failures only counted)", self.last_error)

    def _read(self, key: str, scrape: Scrape) -> dict[str, float]:
        if key not in self._adapters:
            self._adapters[key] = detect(scrape)
        adapter = self._adapters[key]
        fields = adapter.read(scrape) if adapter else {}
        out = {k: fields[k] for k in ("running", "waiting", "kv_usage") if k in fields}
        for name, f in ((ROUTED, "routed"), (IN_FLIGHT, "in_flight")):
            v = scrape.value(name)
            if v is not None:
                out[f] = v
        if "running" in out:
            out["load"] = out["running"] + out.get("waiting", 0.0)
        elif "in_flight" in out:
            out["load"] = out["in_flight"]
        return out

    def _scrape_once(self) -> None:
        assert self._client is not None
        start_ns = time.monotonic_ns()
        reads: dict[str, dict[str, float]] = {}
        if self.router_url and not self.replica_urls:
            try:
                subs = _by_replica(parse_metrics(get_text(self._client, self.router_url)))
                reads = {name: self._read(self.router_url, sub) for name, sub in subs.items()}
            except Exception as exc:  # noqa: BLE001 - any bad answer is a counted failure
                self._fail(self.router_url, exc)
        for i, url in enumerate(self.replica_urls):
            try:
                reads[f"r{i}"] = self._read(url, parse_metrics(get_text(self._client, url)))
            except Exception as exc:  # noqa: BLE001
                self._fail(url, exc)
        if not reads:
            return
        t_s = ((start_ns + time.monotonic_ns()) / 2 - self._t0_ns) / 1e9
        with self._lock:
            for name, fields in reads.items():
                cols = self._series.setdefault(name, {})
                for k, v in fields.items():
                    cols.setdefault(k, []).append(v)
            self._latest = {f"{n} load": f["load"] for n, f in reads.items() if "load" in f}
            self.samples += 1
        self._sink({"t_s": t_s, "source": "replicas", "replicas": reads})
