"""session-affinity: every request of a session to one replica, by consistent hashing on the
session id header (`x-session-id` by default; vLLM production-stack's `session` router,
SGLang's `consistent_hashing`). A session's KV stays where its history was computed, whatever
the other sessions do; a replica leaving or joining moves only the sessions hashed to it.

The ring holds `vnodes` points per replica (a stable 64-bit hash, the same in every process);
a session goes to the first healthy replica clockwise of its own hash. Requests without a
session id go to the least-outstanding replica.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Sequence

from cbbench.reference_engine.router.policy import (
    NoReplicaAvailable,
    ReplicaLoad,
    RouteRequest,
    RoutingPolicy,
    least_loaded,
)

VNODES = 64


def stable_hash(text: str) -> int:
    return int.from_bytes(
        hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big"
    )


class SessionAffinity(RoutingPolicy):
    name = "session-affinity"
    reads_engine_stats = False
    needs_session = True

    def __init__(self, vnodes: int = VNODES) -> None:
        assert vnodes >= 1
        self.vnodes = vnodes
        self._points: list[int] = []
        self._owners: list[int] = []
        self._size = -1  # replicas the ring was built for

    def _build(self, n: int) -> None:
        ring = sorted(
            (stable_hash(f"replica-{i}#{v}"), i) for i in range(n) for v in range(self.vnodes)
        )
        self._points = [p for p, _ in ring]
        self._owners = [i for _, i in ring]
        self._size = n

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaLoad]) -> int:
        if request.session_id is None:
            return least_loaded(replicas)
        if len(replicas) != self._size:
            self._build(len(replicas))
        start = bisect.bisect(self._points, stable_hash(request.session_id))
        n = len(self._points)
        for k in range(n):
            i = self._owners[(start + k) % n]
            if replicas[i].healthy:
                return i
        raise NoReplicaAvailable(f"no healthy replica (all {len(replicas)} out of rotation)")
