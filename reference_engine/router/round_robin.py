"""round-robin: each request to the next healthy replica in turn, blind to load."""

from __future__ import annotations

from collections.abc import Sequence

from cbbench.reference_engine.router.policy import (
    NoReplicaAvailable,
    ReplicaLoad,
    RouteRequest,
    RoutingPolicy,
)


class RoundRobin(RoutingPolicy):
    name = "round-robin"
    reads_engine_stats = False

    def __init__(self) -> None:
        self._next = 0

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaLoad]) -> int:
        n = len(replicas)
        for k in range(n):
            i = (self._next + k) % n
            if replicas[i].healthy:
                self._next = i + 1
                return i
        raise NoReplicaAvailable(f"no healthy replica (all {n} out of rotation)")
