"""prefix-affinity: send a request to the replica that served the longest matching prompt
prefix (so its KV blocks are likely still in that replica's prefix cache), unless that
replica is overloaded; otherwise, and for prompts never seen, the least-outstanding replica.

The prefix is the chain of hashes of `prefix` (doubling lengths); the table maps each hash
to the replica that last received it (bounded: the first seen go first), the idea of
SGLang's cache-aware router without its radix tree. Overloaded (SGLang's two thresholds):
outstanding > `balance_rel` x (min + 1) and > min + `balance_abs`, min over the healthy
replicas.
"""

from __future__ import annotations

from collections.abc import Sequence

from cbbench.reference_engine.router.policy import (
    NoReplicaAvailable,
    ReplicaLoad,
    RouteRequest,
    RoutingPolicy,
)

BALANCE_ABS = 4
BALANCE_REL = 1.5
MAX_ENTRIES = 1 << 20


class PrefixAffinity(RoutingPolicy):
    name = "prefix-affinity"
    reads_engine_stats = False
    needs_prefix = True

    def __init__(
        self,
        balance_abs: int = BALANCE_ABS,
        balance_rel: float = BALANCE_REL,
        max_entries: int = MAX_ENTRIES,
    ) -> None:
        assert balance_abs >= 0 and balance_rel >= 1.0 and max_entries >= 1
        self.balance_abs, self.balance_rel, self.max_entries = balance_abs, balance_rel, max_entries
        self.owner: dict[int, int] = {}  # block hash -> replica index (insertion = age order)
        self.matched = 0  # decisions that followed a cached prefix
        self.capped = 0  # decisions where the prefix's replica was overloaded

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaLoad]) -> int:
        best, min_load = -1, 1 << 62
        for r in replicas:
            if r.outstanding < min_load and r.healthy:
                best, min_load = r.index, r.outstanding
        if best < 0:
            raise NoReplicaAvailable(f"no healthy replica (all {len(replicas)} out of rotation)")
        hashes = request.prefix_hashes
        owner = self.owner
        chosen = best
        for h in reversed(hashes):  # the longest prefix first
            i = owner.get(h)
            if i is None or i >= len(replicas) or not replicas[i].healthy:
                continue
            load = replicas[i].outstanding
            if load > self.balance_rel * (min_load + 1) and load > min_load + self.balance_abs:
                self.capped += 1
            else:
                chosen = i
                self.matched += 1
            break
        for h in hashes:
            owner[h] = chosen  # a known hash keeps its age: the first seen go first
        if len(owner) > self.max_entries:
            for h in list(owner)[: len(owner) - self.max_entries // 2]:
                del owner[h]
        return chosen
