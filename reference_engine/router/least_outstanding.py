"""least-outstanding: the replica with the fewest requests running + waiting, counting the
router's own in-flight requests there (exact between two reads of the replica's stats)."""

from __future__ import annotations

from collections.abc import Sequence

from cbbench.reference_engine.router.policy import (
    ReplicaLoad,
    RouteRequest,
    RoutingPolicy,
    least_loaded,
)


class LeastOutstanding(RoutingPolicy):
    name = "least-outstanding"
    reads_engine_stats = False

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaLoad]) -> int:
        return least_loaded(replicas)
