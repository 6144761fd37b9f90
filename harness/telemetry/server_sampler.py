"""Server sampler: scrape a Prometheus `/metrics` URL at a fixed interval in its own thread.

Each scrape becomes one `timeseries.jsonl` sample (`source: "server"`) with the common fields
the detected engine exports; unknown engines keep their raw series. The first and the
closing scrape bound the measured window for counter and histogram deltas (preemptions,
queue time, prefix-cache hit rate). A dead or slow endpoint only costs failed scrapes, which
are counted and reported; the run never stalls on it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import httpx
from cbbench.harness.telemetry.adapters import (
    KV_TRANSFER_FIELDS,
    QUEUE_TIME,
    SERVER_FIELDS,
    SPEC_FIELDS,
    STEP_TIMING_FIELDS,
    Adapter,
    detect,
)
from cbbench.harness.telemetry.prom import Scrape, get_text, only_samples, parse_metrics
from cbbench.harness.telemetry.queue_time import estimate, histogram_delta

log = logging.getLogger(__name__)

# Gauges summarised as mean/max over the samples (samples are evenly spaced in time).
GAUGE_FIELDS = ("running", "waiting", "kv_usage", "batch_occupancy", "kv_reserved_unused_tokens")
SUMMARY_FIELDS = (
    *GAUGE_FIELDS,
    "preemptions",
    "prefix_cache_hit_rate",
    QUEUE_TIME,
    *STEP_TIMING_FIELDS,
)


class ServerMetricsSampler:
    name = "server"

    def __init__(self, url: str, interval_s: float = 0.25, timeout_s: float | None = None):
        assert interval_s > 0, "interval must be positive"
        self.url = url
        self.interval_s = interval_s
        self.timeout_s = timeout_s or max(1.0, min(5.0, 2 * interval_s))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client: httpx.Client | None = None
        self._t0_ns = 0
        self._sink: Callable[[dict], None] = lambda _s: None
        self.adapter: Adapter | None = None
        self._first: Scrape | None = None  # parsed in full
        self._last_text: str | None = None
        self._values: dict[str, list[float]] = {f: [] for f in SERVER_FIELDS}
        self._spec_gauges: dict[str, list[float]] = {f: [] for f in SPEC_FIELDS}
        self._latest: dict = {}
        self.samples = 0
        self.failures = 0
        self.cpu_s: float | None = None
        self.last_error: str | None = None

    # -- Sampler protocol -------------------------------------------------------------
    def start(self, t0_ns: int, sink: Callable[[dict], None]) -> None:
        assert self._thread is None, "a sampler starts once"
        self._t0_ns, self._sink = t0_ns, sink
        self._client = httpx.Client(timeout=self.timeout_s, trust_env=False)
        # the window's first scrape, before start() returns: the load starts after it, so
        # counters and histograms over the window hold every request of the run
        self._scrape_once()
        self._thread = threading.Thread(target=self._loop, name="cbbench-server-metrics")
        self._thread.daemon = True
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=2 * self.timeout_s + 1.0)
        if self._thread.is_alive():  # a scrape outlived its timeout: drop what it brings
            self._sink = lambda _s: None
        elif self._client is not None:
            self._client.close()

    def latest(self) -> dict:
        with self._lock:
            return dict(self._latest)

    def summary(self) -> dict:
        with self._lock:
            out: dict = {
                "engine": self.adapter.engine if self.adapter else None,
                "url": self.url,
                "interval_s": self.interval_s,
                "samples": self.samples,
                "failures": self.failures,
                "last_error": self.last_error,
                "cpu_s": self.cpu_s,
            }
            for f in GAUGE_FIELDS:
                vals = self._values[f]
                if vals:
                    out[f] = {"mean": sum(vals) / len(vals), "max": max(vals)}
            if self.adapter and self._first and self._last_text is not None:
                try:
                    last = parse_metrics(self._last_text)
                    self._window_fields(self.adapter, self._first, last, out)
                except (ValueError, KeyError) as exc:  # a malformed histogram, say
                    out["last_error"] = f"summary: {type(exc).__name__}: {exc}"
            out["unavailable"] = [f for f in SUMMARY_FIELDS if f not in out]
            return out

    # -- internals --------------------------------------------------------------------
    def _window_fields(self, adapter: Adapter, first: Scrape, last: Scrape, out: dict) -> None:
        p0 = adapter.read(first).get("preemptions_total")
        p1 = adapter.read(last).get("preemptions_total")
        if p0 is not None and p1 is not None:
            out["preemptions"] = p1 - p0 if p1 >= p0 else p1  # p1 < p0: counter reset
        gauge = self._values["prefix_cache_hit_rate"]
        counters = adapter.prefix_cache_counters
        if counters is not None and all(last.has(n) for n in counters):
            # None when nothing was looked up in the window: exported, but undefined
            out["prefix_cache_hit_rate"] = adapter.hit_rate(last, since=first)
        elif gauge:
            out["prefix_cache_hit_rate"] = sum(gauge) / len(gauge)  # a gauge: its run mean
        # speculative decoding, when exposed: counters over the window, else gauges' run mean
        if adapter.spec_counters is not None and all(last.has(n) for n in adapter.spec_counters):
            out.update(adapter.spec(last, since=first))
        else:
            for k, vals in self._spec_gauges.items():
                if vals:
                    out[k] = sum(vals) / len(vals)
        h1 = adapter.queue_histogram(last)
        if h1 is not None:
            out[QUEUE_TIME] = estimate(histogram_delta(adapter.queue_histogram(first), h1))
        for field in (*STEP_TIMING_FIELDS, *KV_TRANSFER_FIELDS):
            h1 = adapter.step_histogram(last, field)
            if h1 is not None:
                out[field] = estimate(histogram_delta(adapter.step_histogram(first, field), h1))

    def _loop(self) -> None:
        next_t = time.monotonic()
        while True:
            next_t = max(next_t + self.interval_s, time.monotonic())
            if self._stop.wait(next_t - time.monotonic()):
                break
            self._scrape_once()
        self._scrape_once()  # closing scrape: the window ends when the run ends
        self.cpu_s = time.thread_time()  # this thread's CPU: what sampling cost the client

    def _scrape_once(self) -> None:
        assert self._client is not None
        start_ns = time.monotonic_ns()
        try:
            text = get_text(self._client, self.url)
            t_s = ((start_ns + time.monotonic_ns()) / 2 - self._t0_ns) / 1e9
            adapter = self.adapter
            if adapter is not None and self._first is not None:
                scrape = parse_metrics(only_samples(text, adapter.sample_names))
            else:
                scrape = parse_metrics(text)  # full: detection and the window's first scrape
        except Exception as exc:  # noqa: BLE001 - any bad answer is a counted failure
            status = getattr(getattr(exc, "response", None), "status_code", None)
            if status is not None:  # httpx's text is two lines with a link: the status says it
                self._fail(f"HTTP {status} (the server exports no Prometheus metrics here)")
            else:  # one line, whatever the exception's text
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                self._fail(f"{type(exc).__name__}: {first}" if first else type(exc).__name__)
            return
        with self._lock:
            if self.adapter is None:
                self.adapter = detect(scrape)
            if self._first is None and self.adapter is not None:
                self._first = scrape
            self._last_text = text  # parsed in full once, when the summary needs it
            fields = self.adapter.read(scrape) if self.adapter else {}
            for k, v in fields.items():
                self._values[k].append(v)
            if self.adapter is not None and self.adapter.spec_counters is None:
                for k, v in self.adapter.spec(scrape).items():  # gauges (SGLang)
                    self._spec_gauges[k].append(v)
            self._latest = dict(fields)
            self.samples += 1
        sample: dict = {"t_s": t_s, "source": "server", **fields}
        if self.adapter is None:
            sample["raw"] = scrape.raw()
        self._sink(sample)

    def _fail(self, reason: str) -> None:
        with self._lock:
            self.failures += 1
            self.last_error = reason
            first = self.failures == 1
        if first:
            log.warning(
                "server metrics: %s: %s (further failures are only counted)", self.url, reason
            )
