"""kv-aware: the replica with the lowest KV-cache usage as last read, plus an estimate for
the requests routed there since (the replica's usage per running request at that read, so
a burst between two scrapes does not all land on one replica). Ties and replicas that do
not export KV usage fall back to the fewest outstanding requests."""

from __future__ import annotations

from collections.abc import Sequence

from cbbench.reference_engine.router.policy import (
    NoReplicaAvailable,
    ReplicaLoad,
    RouteRequest,
    RoutingPolicy,
)

# KV share assumed for a request routed since the last read when the replica ran none then.
DEFAULT_REQUEST_KV = 0.01


class KVAware(RoutingPolicy):
    name = "kv-aware"

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaLoad]) -> int:
        best, best_key = -1, (float("inf"), 1 << 62)
        for r in replicas:
            if not r.healthy:
                continue
            kv = r.kv_usage if r.kv_usage is not None else 1.0
            per_request = kv / r.running if r.running else DEFAULT_REQUEST_KV
            key = (kv + r.sent_since_read * per_request, r.outstanding)
            if key < best_key:
                best, best_key = r.index, key
        if best < 0:
            raise NoReplicaAvailable(f"no healthy replica (all {len(replicas)} out of rotation)")
        return best
