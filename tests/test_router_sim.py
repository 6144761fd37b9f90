"""The routing policies over simulated replicas (router/cluster_sim.py): one replica is the
single-engine replay, every request runs once on one replica, policies balance as they
should, and prefix-affinity beats round-robin on prefix-cache hits for multi-turn chat."""

from __future__ import annotations

import pytest
from cbbench.reference_engine.config.options import SIM_DEFAULTS, build_engine_config
from cbbench.reference_engine.router.cluster_sim import imbalance, simulate_cluster
from cbbench.reference_engine.router.registry import POLICY_NAMES, make_policy
from cbbench.reference_engine.sim.simulate import simulate
from cbbench.workloads import with_arrivals
from cbbench.workloads.loader import build_from_spec
from cbbench.workloads.spec import RequestSpec

SESSIONS = {  # 16 chats x 4 turns: a long first message, short later ones
    "prompt": {"dist": "constant", "value": 400},
    "output": {"dist": "constant", "value": 16},
    "session": {
        "turns": {"dist": "constant", "value": 4},
        "think_ms": {"dist": "constant", "value": 20},
        "message": {"dist": "constant", "value": 20},
    },
}


def config(**kw):
    return build_engine_config(
        {"enable_prefix_caching": True, **kw}, SIM_DEFAULTS, scheduler="continuous"
    )


def test_one_replica_is_the_single_engine_replay():
    reqs = [RequestSpec(i, 50 + 7 * i, 10 + i % 13, arrival_s=0.01 * i) for i in range(40)]
    one = simulate_cluster(reqs, config(), 1, make_policy("round-robin"))
    ref = simulate(reqs, config())
    assert [r.ttft_s for r in one.requests] == pytest.approx([r.ttft_s for r in ref.requests])
    assert [r.e2e_s for r in one.requests] == pytest.approx([r.e2e_s for r in ref.requests])
    assert one.replicas[0].steps == len(ref.steps)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_every_request_runs_once_on_one_replica(policy):
    reqs = [RequestSpec(i, 64 + (i * 37) % 300, 5 + (i * 11) % 60, arrival_s=0.002 * i)
            for i in range(300)]  # fmt: skip
    res = simulate_cluster(reqs, config(), 4, make_policy(policy))
    assert [r.index for r in res.requests] == list(range(300))
    assert all(r.num_tokens == r.output_len and r.finished_s is not None for r in res.requests)
    per = [sum(r.replica == i for r in res.requests) for i in range(4)]
    assert per == [t.requests for t in res.replicas] and sum(per) == 300
    assert min(per) > 0  # no replica left idle by any policy at this load
    s = res.summary()
    assert s["requests_per_replica"]["mean"] == 75
    if policy == "round-robin":
        assert per == [75, 75, 75, 75] and s["requests_per_replica"]["cv"] == 0
    assert len(res.routing_time_s) == 300


def test_least_outstanding_balances_better_than_round_robin_on_skewed_work():
    # every 4th request is 30x longer: round-robin gives them all to replica 0
    reqs = [RequestSpec(i, 32, 600 if i % 4 == 0 else 20, arrival_s=0.004 * i)
            for i in range(200)]  # fmt: skip
    rr = simulate_cluster(reqs, config(), 4, make_policy("round-robin")).summary()
    lo = simulate_cluster(reqs, config(), 4, make_policy("least-outstanding")).summary()
    assert lo["outstanding_per_replica"]["cv"] < rr["outstanding_per_replica"]["cv"]
    assert lo["e2e_s"]["p99"] < rr["e2e_s"]["p99"]


def test_prefix_affinity_hits_the_cache_more_than_round_robin_on_sessions():
    wl = build_from_spec(SESSIONS, "sessions", "spec", seed=0, num_requests=64)
    wl = with_arrivals(wl, "poisson", rate=20.0, seed=0)
    hit = {}
    for policy in ("round-robin", "prefix-affinity"):
        res = simulate_cluster(
            wl.requests, config(), 4, make_policy(policy),
            prefix_block_size=wl.prefix_block_size, seed=wl.seed,
        )  # fmt: skip
        hit[policy] = res.summary()["prefix_cache_hit_rate_later_turns"]
    assert hit["prefix-affinity"] > 0.9  # every later turn finds its history
    assert hit["round-robin"] < hit["prefix-affinity"] - 0.3


def test_imbalance():
    assert imbalance([1, 1, 1, 1]) == {"mean": 1, "max": 1, "max_over_mean": 1, "cv": 0}
    d = imbalance([4, 0, 0, 0])
    assert d["max_over_mean"] == 4 and d["cv"] == pytest.approx(3**0.5)
    assert imbalance([0, 0])["cv"] is None
