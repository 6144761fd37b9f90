"""The routing policies by name: `make_policy("prefix-affinity")`; one file each."""

from __future__ import annotations

from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.router.kv_aware import KVAware
from cbbench.reference_engine.router.least_outstanding import LeastOutstanding
from cbbench.reference_engine.router.policy import RoutingPolicy
from cbbench.reference_engine.router.prefix_affinity import PrefixAffinity
from cbbench.reference_engine.router.round_robin import RoundRobin
from cbbench.reference_engine.router.session_affinity import SessionAffinity

POLICY_CLASSES: dict[str, type[RoutingPolicy]] = {
    c.name: c for c in (RoundRobin, LeastOutstanding, KVAware, PrefixAffinity, SessionAffinity)
}
POLICY_NAMES = tuple(POLICY_CLASSES)


def make_policy(name: str) -> RoutingPolicy:
    if name not in POLICY_CLASSES:
        raise EngineError(f"unknown routing policy {name!r} (choose: {', '.join(POLICY_NAMES)})")
    return POLICY_CLASSES[name]()
