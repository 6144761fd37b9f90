"""The routing interface: what a policy sees of each replica and of a request, and the
registry of policies.

A policy is pure Python and fast (tests/benchmarks/test_router_bench.py: p99 of one
decision at 64 replicas). The HTTP router (`app`) and the cluster simulator (`cluster_sim`)
keep the same `ReplicaLoad` list up to date and call the same `choose()`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from cbbench.reference_engine.errors import EngineError


class NoReplicaAvailable(EngineError):
    """Every replica is out of rotation."""


@dataclass(slots=True)
class ReplicaLoad:
    """One replica as the router knows it: its own counts (exact) and the replica's stats
    as last read (scraped from /metrics over HTTP; read from the engine in the simulator).
    Change the counts through the methods: they keep `outstanding` up to date, a plain
    field so that a decision over many replicas reads one attribute each."""

    index: int
    name: str
    healthy: bool = True
    in_flight: int = 0  # requests this router sent there that have not ended
    running: int = 0  # last read
    waiting: int = 0  # last read
    kv_usage: float | None = None  # 0-1, last read; None = the replica does not export it
    sent_since_read: int = 0  # requests routed there since the stats were last read
    routed: int = 0  # requests routed there, all time
    # max(in_flight, running + waiting): the router's own count is exact and current, the
    # replica's includes other clients' requests but is as old as the last read
    outstanding: int = 0

    def sent(self) -> None:
        self.in_flight += 1
        self.sent_since_read += 1
        self.routed += 1
        self._update()

    def ended(self) -> None:
        assert self.in_flight > 0, f"{self.name}: more requests ended than were sent"
        self.in_flight -= 1
        self._update()

    def stats_read(self, running: int, waiting: int, kv_usage: float | None) -> None:
        self.running, self.waiting, self.kv_usage = running, waiting, kv_usage
        self.sent_since_read = 0
        self._update()

    def set_counts(self, in_flight: int | None = None, sent_since_read: int | None = None) -> None:
        """Set the router's own counts directly (tests, a fresh start)."""
        if in_flight is not None:
            self.in_flight = in_flight
        if sent_since_read is not None:
            self.sent_since_read = sent_since_read
        self._update()

    def _update(self) -> None:
        self.outstanding = max(self.in_flight, self.running + self.waiting)


@dataclass(slots=True)
class RouteRequest:
    """What a policy may look at: the chained hashes of the prompt's prefix at doubling
    lengths (router/prefix.py; empty when the policy does not need them), and the session id
    header's value (None when absent or not needed)."""

    prefix_hashes: tuple[int, ...] = ()
    session_id: str | None = None


class RoutingPolicy:
    """Pick the replica of one request. `choose` returns an index into `replicas` of a
    healthy one (NoReplicaAvailable when none is) and may remember the choice."""

    name: ClassVar[str] = ""
    needs_prefix: ClassVar[bool] = False  # the caller computes RouteRequest.prefix_hashes
    needs_session: ClassVar[bool] = False  # the caller reads RouteRequest.session_id
    # False: `choose` reads only `outstanding` and `healthy` (which, in the simulator, change
    # only when a request is sent or ends), so a replica may decode behind arrivals routed
    # elsewhere (router/cluster_sim.py, sim/quiet.py)
    reads_engine_stats: ClassVar[bool] = True

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaLoad]) -> int:
        raise NotImplementedError


def healthy_indices(replicas: Sequence[ReplicaLoad]) -> list[int]:
    out = [r.index for r in replicas if r.healthy]
    if not out:
        raise NoReplicaAvailable(f"no healthy replica (all {len(replicas)} out of rotation)")
    return out


def least_loaded(replicas: Sequence[ReplicaLoad]) -> int:
    """The healthy replica with the fewest outstanding requests (lowest index on ties)."""
    best, best_load = -1, 1 << 62
    for r in replicas:
        if r.outstanding < best_load and r.healthy:
            best, best_load = r.index, r.outstanding
    if best < 0:
        raise NoReplicaAvailable(f"no healthy replica (all {len(replicas)} out of rotation)")
    return best
