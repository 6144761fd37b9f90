"""The KV transfer's Prometheus series (prefill/decode roles, server/disagg.py):
`cbbench:kv_transfer_bytes_total{direction="sent"|"received"}`, the decode side's pull time
`cbbench:kv_transfer_seconds` and the prefill side's staged payloads
`cbbench:kv_transfer_staged_bytes` (what waits for a pull: back to 0 once pulled or expired)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

TRANSFER_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class KVTransferMetrics:
    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        m = model_name
        nbytes = Counter("cbbench:kv_transfer_bytes", "KV payload bytes shipped or pulled.",
                         ["model_name", "direction"], registry=registry)  # fmt: skip
        self.sent_bytes = nbytes.labels(m, "sent")
        self.received_bytes = nbytes.labels(m, "received")
        self.seconds = Histogram("cbbench:kv_transfer_seconds", "One KV pull, request to last "
                                 "byte (decode side).", ["model_name"], registry=registry,
                                 buckets=TRANSFER_BUCKETS).labels(m)  # fmt: skip
        self.staged = Gauge("cbbench:kv_transfer_staged_bytes", "KV payloads staged for a "
                            "pull (prefill side).", ["model_name"], registry=registry,
                            multiprocess_mode="livemostrecent").labels(m)  # fmt: skip

    def received(self, nbytes: int, seconds: float) -> None:
        self.received_bytes.inc(nbytes)
        self.seconds.observe(seconds)
