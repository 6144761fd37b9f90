"""The price of moving one request's KV between a prefill and a decode worker: a link's
latency plus the bytes over its bandwidth (P/D disaggregation in the simulator and the
planner; docs/disaggregation.md). The bytes are the cost model's `kv_bytes_per_token` (so
--kv-cache-dtype fp8/int8 shrinks them) times the prompt's whole blocks.

Presets (effective one-way rates, not the marketing peaks' sums):
- same-node: NVLink 4 between two H100 SXM GPUs, 450 GB/s each way, ~70 % reached by a
  block-scattered copy (NIXL/UCX over NVLink), ~20 us per transfer set-up.
- cross-node: one 400 Gb/s InfiniBand NDR / RoCE NIC (ConnectX-7) per GPU, 50 GB/s, ~80 %
  reached by RDMA reads, ~50 us (a NIXL read's round trips) per transfer.
- loopback: two `cbbench serve` processes on one CPU host pulling over 127.0.0.1 HTTP;
  measured on the shared 2-core machine the guide's figures come from (docs/disaggregation.md).
`bandwidth_gbps=...,latency_ms=...` (`--kv-link`) gives any other link.
"""

from __future__ import annotations

from dataclasses import dataclass

from cbbench.reference_engine.errors import EngineError


@dataclass(frozen=True)
class KVLink:
    name: str
    bandwidth_bytes_s: float
    latency_s: float

    def transfer_s(self, nbytes: int) -> float:
        return self.latency_s + nbytes / self.bandwidth_bytes_s


LINKS = {
    "same-node": KVLink("same-node", 0.7 * 450e9, 20e-6),
    "cross-node": KVLink("cross-node", 0.8 * 50e9, 50e-6),
    "loopback": KVLink("loopback", 1.0e9, 1.5e-3),
}


def get_link(spec: str) -> KVLink:
    """A preset name, or 'bandwidth_gbps=B,latency_ms=L' (GB/s, ms)."""
    if spec in LINKS:
        return LINKS[spec]
    try:
        kv = dict(part.split("=", 1) for part in spec.split(","))
        link = KVLink(spec, float(kv["bandwidth_gbps"]) * 1e9, float(kv["latency_ms"]) * 1e-3)
    except (ValueError, KeyError):
        raise EngineError(
            f"--kv-link {spec!r}: a preset ({', '.join(LINKS)}) or "
            "bandwidth_gbps=B,latency_ms=L"
        ) from None
    if link.bandwidth_bytes_s <= 0 or link.latency_s < 0:
        raise EngineError(f"--kv-link {spec!r}: bandwidth must be > 0 and latency >= 0")
    return link
