"""The routing policies on hand-built replica loads, and prompt-prefix hashing."""

from __future__ import annotations

import pytest
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.router.policy import NoReplicaAvailable, ReplicaLoad, RouteRequest
from cbbench.reference_engine.router.prefix import (
    body_block_hashes,
    text_block_hashes,
    token_block_hashes,
)
from cbbench.reference_engine.router.prefix_affinity import PrefixAffinity
from cbbench.reference_engine.router.registry import POLICY_NAMES, make_policy


def loads(n: int) -> list[ReplicaLoad]:
    return [ReplicaLoad(i, f"r{i}") for i in range(n)]


def test_registry_names_and_unknown_policy():
    assert POLICY_NAMES == (
        "round-robin", "least-outstanding", "kv-aware", "prefix-affinity", "session-affinity"
    )  # fmt: skip
    for name in POLICY_NAMES:
        assert make_policy(name).name == name
    with pytest.raises(EngineError, match="unknown routing policy 'random'.*round-robin"):
        make_policy("random")


def test_round_robin_cycles_and_skips_unhealthy():
    p, rs = make_policy("round-robin"), loads(3)
    assert [p.choose(RouteRequest(), rs) for _ in range(4)] == [0, 1, 2, 0]
    rs[1].healthy = False
    assert [p.choose(RouteRequest(), rs) for _ in range(4)] == [2, 0, 2, 0]
    for r in rs:
        r.healthy = False
    with pytest.raises(NoReplicaAvailable, match="no healthy replica"):
        p.choose(RouteRequest(), rs)


def test_least_outstanding_counts_own_in_flight_and_scraped_load():
    p, rs = make_policy("least-outstanding"), loads(3)
    rs[0].set_counts(in_flight=3)
    rs[1].stats_read(running=1, waiting=1, kv_usage=None)  # others' traffic, scraped
    rs[2].set_counts(in_flight=2)
    assert p.choose(RouteRequest(), rs) == 1
    rs[1].set_counts(in_flight=5)  # the router's own count is larger than the stale scrape
    assert rs[1].outstanding == 5
    assert p.choose(RouteRequest(), rs) == 2
    rs[2].healthy = False
    assert p.choose(RouteRequest(), rs) == 0


def test_kv_aware_lowest_usage_with_sent_since_read_estimate():
    p, rs = make_policy("kv-aware"), loads(3)
    rs[0].stats_read(running=4, waiting=0, kv_usage=0.40)
    rs[1].stats_read(running=2, waiting=0, kv_usage=0.20)
    rs[2].stats_read(running=1, waiting=0, kv_usage=None)  # does not export it: last
    assert p.choose(RouteRequest(), rs) == 1
    rs[1].set_counts(sent_since_read=3)  # each ~0.10 (0.20 over 2 running): estimate 0.50 > 0.40
    assert p.choose(RouteRequest(), rs) == 0
    rs[1].stats_read(running=5, waiting=0, kv_usage=0.30)
    assert rs[1].sent_since_read == 0
    assert p.choose(RouteRequest(), rs) == 1


def test_prefix_affinity_follows_the_longest_prefix_within_the_load_cap():
    p, rs = PrefixAffinity(balance_abs=2, balance_rel=1.5), loads(3)
    a = token_block_hashes(list(range(64)))  # levels 16, 32, 64
    b = token_block_hashes([7] * 64)
    first = p.choose(RouteRequest(a), rs)
    assert first == 0  # never seen: least loaded, lowest index
    rs[0].set_counts(in_flight=1)
    assert p.choose(RouteRequest(b), rs) == 1  # another prefix: least loaded
    rs[1].set_counts(in_flight=1)
    # a later turn: a's blocks plus more -> the replica that holds a's prefix
    a_longer = token_block_hashes(list(range(64)) + [99] * 32)
    assert a_longer[:4] == a
    assert p.choose(RouteRequest(a_longer), rs) == 0
    assert p.matched == 1
    rs[0].set_counts(in_flight=5)  # 5 > 1.5 x (0 + 1) and 5 > 0 + 2: overloaded
    assert p.choose(RouteRequest(a), rs) == 2
    assert p.capped == 1
    rs[0].set_counts(in_flight=0)
    assert p.choose(RouteRequest(a), rs) == 2  # the table now points at the new holder
    rs[2].healthy = False
    assert p.choose(RouteRequest(a), rs) == 0  # its holder is out of rotation


def test_prefix_affinity_table_is_bounded():
    p, rs = PrefixAffinity(max_entries=100), loads(2)
    for k in range(200):
        p.choose(RouteRequest(token_block_hashes([k] * 32)), rs)
    assert len(p.owner) <= 100


def test_prefix_hashes_at_doubling_lengths():
    x = token_block_hashes(list(range(40)))  # levels 16, 32
    y = token_block_hashes(list(range(32)) + [0] * 8)
    z = token_block_hashes([1] + list(range(1, 40)))
    assert len(x) == 2 and x == y  # tokens past the last whole level are not hashed
    assert z[0] != x[0] and z[1] != x[1]  # a different first token changes the whole chain
    w = token_block_hashes(list(range(63)) + [5])  # differs at token 63: levels 16, 32 shared
    assert w[:2] == x and len(w) == 3 and w[2] != token_block_hashes(list(range(64)))[2]
    assert len(token_block_hashes(list(range(16 * 2**11)))) == 12  # 16 ... 32,768 tokens
    assert len(token_block_hashes(list(range(10**6)))) == 12  # at most LEVELS
    t = text_block_hashes("a" * 64 + "b" * 64)
    assert text_block_hashes("a" * 64 + "c" * 64)[0] == t[0] != t[1]


def test_body_hashes_of_completions_and_chats():
    text = "You are a helpful assistant. " * 10
    assert body_block_hashes({"prompt": text}) == text_block_hashes(text)
    assert body_block_hashes({"prompt": [text, "other"]}) == text_block_hashes(text)
    assert body_block_hashes({"prompt": list(range(50))}) == token_block_hashes(list(range(50)))
    turn1 = {"messages": [{"role": "system", "content": text}, {"role": "user", "content": "hi"}]}
    turn2 = {"messages": [*turn1["messages"], {"role": "assistant", "content": "hello " * 20}]}
    h1, h2 = body_block_hashes(turn1), body_block_hashes(turn2)
    assert h1 and h2[: len(h1) - 1] == h1[:-1]  # the history's whole blocks are shared
    assert body_block_hashes({"prompt": 3}) == () and body_block_hashes([1, 2]) == ()
