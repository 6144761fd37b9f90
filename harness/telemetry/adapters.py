"""Engine adapters: map each engine's Prometheus names onto cbbench's common fields.

The engine is detected from the names present in a scrape. Every adapter reads the same
common fields; a field an engine does not export stays absent (never zero) and is listed
as unavailable in the run's summary.
"""

from __future__ import annotations

from dataclasses import dataclass

from cbbench.harness.telemetry.prom import Histogram, Scrape

# Per-sample fields of a server sample, in display order.
SERVER_FIELDS = (
    "running",
    "waiting",
    "kv_usage",
    "preemptions_total",
    "prefix_cache_hit_rate",
    "batch_occupancy",
    "kv_reserved_unused_tokens",
)
# Summary-only field: needs a queue-time histogram.
QUEUE_TIME = "queue_time"
# Summary-only speculative decoding fields, present only when the server exposes them:
# accepted / drafted tokens, and tokens emitted per verify step (accepted + the target's own)
SPEC_FIELDS = ("spec_acceptance_rate", "spec_mean_accepted_length")
# Summary-only step timings (cbbench's engine exports them): host time to build a step, and
# the executor's idle time between two steps.
STEP_TIMING_FIELDS = ("scheduler_time", "step_gap")
# Summary-only KV transfer of a disaggregated (P/D) server, over the run's window, when it
# exports them: seconds per transfer and bytes per transfer (histograms; vLLM's NixlConnector
# on the decode side; the reference engine's decode worker its pull seconds).
KV_TRANSFER_FIELDS = ("kv_transfer_time", "kv_transfer_bytes")


@dataclass(frozen=True)
class Adapter:
    """Names of one engine's metrics. Each field lists alternatives, newest name first."""

    engine: str
    prefix: str  # a name starting with this marks the engine
    running: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()
    kv_usage: tuple[str, ...] = ()  # a 0-1 gauge
    preemptions_total: tuple[str, ...] = ()  # a counter
    prefix_cache_hit_rate: tuple[str, ...] = ()  # a 0-1 gauge
    prefix_cache_counters: tuple[str, str] | None = None  # (hits, queries) counters
    batch_occupancy: tuple[str, ...] = ()
    kv_reserved_unused_tokens: tuple[str, ...] = ()
    queue_time_histogram: tuple[str, ...] = ()
    # speculative decoding: (drafts, draft tokens, accepted tokens) counters (vLLM v1), or
    # gauges of the acceptance rate and of the mean accepted length (SGLang, vLLM v0)
    spec_counters: tuple[str, str, str] | None = None
    spec_acceptance_gauge: tuple[str, ...] = ()
    spec_accept_length_gauge: tuple[str, ...] = ()
    scheduler_time_histogram: tuple[str, ...] = ()
    step_gap_histogram: tuple[str, ...] = ()
    kv_transfer_time_histogram: tuple[str, ...] = ()
    kv_transfer_bytes_histogram: tuple[str, ...] = ()

    @property
    def sample_names(self) -> frozenset[str]:
        """Every sample name the per-sample fields read (not the queue-time histogram)."""
        return frozenset(
            (
                *self.running,
                *self.waiting,
                *self.kv_usage,
                *self.preemptions_total,
                *self.prefix_cache_hit_rate,
                *(self.prefix_cache_counters or ()),
                *self.batch_occupancy,
                *self.kv_reserved_unused_tokens,
                *(self.spec_counters or ()),
                *self.spec_acceptance_gauge,
                *self.spec_accept_length_gauge,
            )
        )

    def detects(self, scrape: Scrape) -> bool:
        return any(n.startswith(self.prefix) for n in scrape.names)

    def _first(self, scrape: Scrape, names: tuple[str, ...], how: str) -> float | None:
        for name in names:
            v = scrape.value(name, how)
            if v is not None:
                return v
        return None

    def read(self, scrape: Scrape) -> dict[str, float]:
        """The common fields present in `scrape` (absent fields are left out)."""
        out: dict[str, float | None] = {
            "running": self._first(scrape, self.running, "sum"),
            "waiting": self._first(scrape, self.waiting, "sum"),
            "kv_usage": self._first(scrape, self.kv_usage, "mean"),
            "preemptions_total": self._first(scrape, self.preemptions_total, "sum"),
            "prefix_cache_hit_rate": self.hit_rate(scrape),
            "batch_occupancy": self._first(scrape, self.batch_occupancy, "mean"),
            "kv_reserved_unused_tokens": self._first(scrape, self.kv_reserved_unused_tokens, "sum"),
        }
        return {k: v for k, v in out.items() if v is not None}

    def hit_rate(self, scrape: Scrape, since: Scrape | None = None) -> float | None:
        """Prefix-cache hit rate: the gauge, or hits/queries (over a window if `since`)."""
        gauge = self._first(scrape, self.prefix_cache_hit_rate, "mean")
        if gauge is not None or self.prefix_cache_counters is None:
            return gauge
        hits_name, queries_name = self.prefix_cache_counters
        hits, queries = scrape.value(hits_name), scrape.value(queries_name)
        if hits is None or queries is None:
            return None
        if since is not None:
            hits -= since.value(hits_name) or 0.0
            queries -= since.value(queries_name) or 0.0
        return hits / queries if queries > 0 else None

    def spec(self, scrape: Scrape, since: Scrape | None = None) -> dict[str, float]:
        """Speculative decoding over the window since `since` (counters), or the gauges as
        scraped; fields the server does not expose, or with nothing drafted, are left out."""
        out: dict[str, float] = {}
        if self.spec_counters is not None and all(scrape.has(n) for n in self.spec_counters):
            drafts, drafted, accepted = (scrape.value(n) or 0.0 for n in self.spec_counters)
            if since is not None:
                d0, t0, a0 = (since.value(n) or 0.0 for n in self.spec_counters)
                drafts, drafted, accepted = drafts - d0, drafted - t0, accepted - a0
            if drafted > 0 and drafts > 0:
                out["spec_acceptance_rate"] = accepted / drafted
                out["spec_mean_accepted_length"] = 1 + accepted / drafts
            return out
        rate = self._first(scrape, self.spec_acceptance_gauge, "mean")
        length = self._first(scrape, self.spec_accept_length_gauge, "mean")
        if rate is not None:
            out["spec_acceptance_rate"] = rate
        if length is not None:
            out["spec_mean_accepted_length"] = length
        return out

    def queue_histogram(self, scrape: Scrape) -> Histogram | None:
        return self.histogram(scrape, self.queue_time_histogram)

    def step_histogram(self, scrape: Scrape, field: str) -> Histogram | None:
        """`field` is one of STEP_TIMING_FIELDS or KV_TRANSFER_FIELDS."""
        return self.histogram(scrape, getattr(self, f"{field}_histogram"))

    @staticmethod
    def histogram(scrape: Scrape, names: tuple[str, ...]) -> Histogram | None:
        for name in names:
            h = scrape.histogram(name)
            if h is not None:
                return h
        return None


VLLM = Adapter(
    engine="vllm",
    prefix="vllm:",
    running=("vllm:num_requests_running",),
    waiting=("vllm:num_requests_waiting",),
    kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    preemptions_total=("vllm:num_preemptions_total",),
    prefix_cache_hit_rate=("vllm:gpu_prefix_cache_hit_rate",),  # older vLLM: a gauge
    prefix_cache_counters=("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
    # vLLM 0.6 called the queue-time histogram `time_in_queue_requests`.
    queue_time_histogram=("vllm:request_queue_time_seconds", "vllm:time_in_queue_requests"),
    spec_counters=(
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
    ),
    spec_acceptance_gauge=("vllm:spec_decode_draft_acceptance_rate",),  # vLLM v0
    # NixlConnector's stats (vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py,
    # vLLM 0.32): one observation per transfer
    kv_transfer_time_histogram=("vllm:nixl_xfer_time_seconds",),
    kv_transfer_bytes_histogram=("vllm:nixl_bytes_transferred",),
)

# cbbench's reference engine exports vLLM's names plus its own batching gauges.
CBBENCH = Adapter(
    engine="cbbench",
    prefix="cbbench:",
    running=VLLM.running,
    waiting=VLLM.waiting,
    kv_usage=VLLM.kv_usage,
    preemptions_total=VLLM.preemptions_total,
    prefix_cache_hit_rate=VLLM.prefix_cache_hit_rate,
    prefix_cache_counters=VLLM.prefix_cache_counters,
    batch_occupancy=("cbbench:batch_occupancy",),
    kv_reserved_unused_tokens=("cbbench:kv_reserved_unused_tokens",),
    queue_time_histogram=VLLM.queue_time_histogram,
    spec_counters=VLLM.spec_counters,
    scheduler_time_histogram=("cbbench:scheduler_time_seconds",),
    step_gap_histogram=("cbbench:engine_step_gap_seconds",),
    kv_transfer_time_histogram=("cbbench:kv_transfer_seconds", *VLLM.kv_transfer_time_histogram),
    kv_transfer_bytes_histogram=VLLM.kv_transfer_bytes_histogram,
)

# SGLang's `num_retracted_reqs` is a gauge of requests retracted right now, not a count of
# preemptions, so preemptions stay unavailable for SGLang.
SGLANG = Adapter(
    engine="sglang",
    prefix="sglang:",
    running=("sglang:num_running_reqs",),
    waiting=("sglang:num_queue_reqs",),
    kv_usage=("sglang:token_usage",),
    prefix_cache_hit_rate=("sglang:cache_hit_rate",),
    queue_time_histogram=("sglang:queue_time_seconds",),
    spec_acceptance_gauge=("sglang:spec_accept_rate",),
    spec_accept_length_gauge=("sglang:spec_accept_length",),
)

# TGI exports batch size and queue size but no KV-cache or prefix-cache gauge.
TGI = Adapter(
    engine="tgi",
    prefix="tgi_",
    running=("tgi_batch_current_size",),
    waiting=("tgi_queue_size",),
    queue_time_histogram=("tgi_request_queue_duration",),
)

# Detection order: cbbench before vLLM (cbbench also exports vllm: names).
ADAPTERS: tuple[Adapter, ...] = (CBBENCH, VLLM, SGLANG, TGI)


def detect(scrape: Scrape) -> Adapter | None:
    """The adapter whose names appear in `scrape`; None for an engine no adapter knows."""
    for adapter in ADAPTERS:
        if adapter.detects(scrape):
            return adapter
    return None
