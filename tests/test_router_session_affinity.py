"""session-affinity: consistent hashing on the session id header. Over HTTP through the router
to two recording replicas, every request of a session reaches one replica (round-robin splits
them); the policy alone: a replica going out of rotation moves only its own sessions."""

from __future__ import annotations

import io

from cbbench.harness.load.runner import BenchConfig, run_bench
from cbbench.reference_engine.router.policy import ReplicaLoad, RouteRequest
from cbbench.reference_engine.router.registry import make_policy
from cbbench.reference_engine.router.serve import RouterOptions, RouterThread
from cbbench.reference_engine.server.runner import ThreadedServer
from cbbench.workloads.loader import build_from_spec
from rich.console import Console

from tests.recording_server import recording_app

SPEC = {  # 8 chats x 3 turns
    "prompt": {"dist": "constant", "value": 20},
    "output": {"dist": "constant", "value": 3},
    "session": {"turns": 3, "think_ms": 5, "message": 10},
}


def _replicas_of_sessions(policy: str, tmp_path) -> dict[str, set[int]]:
    logs: list[list[dict]] = [[], []]
    wl = build_from_spec(SPEC, "chats", "spec", seed=0, num_requests=24)
    with (
        ThreadedServer(recording_app(logs[0])) as u1,
        ThreadedServer(recording_app(logs[1])) as u2,
        RouterThread(RouterOptions([u1, u2], policy=policy, port=0)) as url,
    ):
        cfg = BenchConfig(
            base_url=url, workload=wl, endpoint="chat", out_dir=tmp_path / policy,
            live=False, concurrency=1,
        )  # fmt: skip
        res = run_bench(cfg, console=Console(file=io.StringIO()))
    assert res.summary["counts"]["completed"] == 24
    where: dict[str, set[int]] = {}
    for i, log in enumerate(logs):
        for e in log:
            first = e["body"]["messages"][0]["content"]  # a session's own first message
            where.setdefault(first, set()).add(i)
    assert sum(len(log) for log in logs) == 24
    return where


def test_session_affinity_keeps_each_session_on_one_replica(tmp_path):
    pinned = _replicas_of_sessions("session-affinity", tmp_path)
    assert len(pinned) == 8
    assert all(len(r) == 1 for r in pinned.values()), pinned
    assert {i for r in pinned.values() for i in r} == {0, 1}  # both replicas serve sessions
    split = _replicas_of_sessions("round-robin", tmp_path)
    assert any(len(r) == 2 for r in split.values()), split


def test_session_affinity_moves_only_the_sessions_of_a_replica_gone():
    p = make_policy("session-affinity")
    rs = [ReplicaLoad(i, f"r{i}") for i in range(4)]
    ids = [f"s{k}" for k in range(200)]
    before = {s: p.choose(RouteRequest((), s), rs) for s in ids}
    assert len(set(before.values())) == 4
    assert all(p.choose(RouteRequest((), s), rs) == before[s] for s in ids)  # stable
    rs[2].healthy = False
    after = {s: p.choose(RouteRequest((), s), rs) for s in ids}
    assert all(after[s] == before[s] for s in ids if before[s] != 2)
    assert all(after[s] != 2 for s in ids)
    rs[0].set_counts(in_flight=5)
    assert p.choose(RouteRequest(), rs) == 1  # no session id: the least loaded


def test_flush_cache_through_the_router_reaches_every_replica():
    from cbbench.harness.load.cache import flush_prefix_cache

    logs: list[list[dict]] = [[], []]
    with (
        ThreadedServer(recording_app(logs[0])) as u1,
        ThreadedServer(recording_app(logs[1])) as u2,
        RouterThread(RouterOptions([u1, u2], policy="session-affinity", port=0)) as url,
    ):
        assert flush_prefix_cache(url, None) == "/reset_prefix_cache"
    assert [[e.get("reset") for e in log] for log in logs] == [[True], [True]]
