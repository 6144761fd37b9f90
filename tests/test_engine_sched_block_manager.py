"""BlockManager: allocation, ref counts, watermark, prefix caching and LRU eviction."""

from __future__ import annotations

import pytest
from cbbench.reference_engine.core.block_manager import BlockManager
from cbbench.reference_engine.core.outputs import RequestMetrics
from cbbench.reference_engine.core.sequence import Sequence
from cbbench.reference_engine.sampling_params import SamplingParams


def seq(rid: str, tokens: list[int]) -> Sequence:
    return Sequence(rid, list(tokens), SamplingParams(max_tokens=4), RequestMetrics(0.0))


def test_allocate_grow_and_free_returns_every_block():
    bm = BlockManager(num_blocks=8, block_size=4)
    a, b = seq("a", range(10)), seq("b", range(3))
    assert bm.allocate_slots(a, 10)
    assert len(a.block_table) == 3 and bm.num_free_blocks == 5
    assert bm.allocate_slots(a, 12)  # still fits the 3rd block
    assert len(a.block_table) == 3
    assert bm.allocate_slots(a, 13)
    assert len(a.block_table) == 4
    assert bm.allocate_slots(b, 3)
    bm.check_invariants([a, b])
    assert not set(a.block_table) & set(b.block_table)
    assert bm.usage == pytest.approx(5 / 8)
    bm.free(a)
    bm.free(b)
    assert bm.num_free_blocks == 8 and a.block_table == [] and bm.peak_used == 5
    bm.check_invariants([])


def test_allocation_that_does_not_fit_changes_nothing():
    bm = BlockManager(num_blocks=4, block_size=4)
    a, b = seq("a", range(8)), seq("b", range(8))
    assert bm.allocate_slots(a, 8)
    assert not bm.allocate_slots(b, 12)
    assert b.block_table == [] and bm.num_free_blocks == 2
    assert not bm.allocate_slots(b, 8, watermark=1)  # would leave 0 < 1 free
    assert bm.allocate_slots(b, 8)
    assert bm.num_free_blocks == 0


def test_prefix_cache_hits_full_computed_blocks_and_shares_them():
    bm = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    shared = list(range(100, 112))  # 3 full blocks
    a = seq("a", shared + [1, 2])
    assert bm.get_computed_blocks(a) == []
    assert bm.allocate_slots(a, a.num_tokens)
    a.num_computed_tokens = a.num_tokens
    bm.cache_blocks(a)
    assert bm.num_cached_blocks == 3  # the partial 4th block is not cached
    b = seq("b", shared + [9, 9, 9])
    hits = bm.get_computed_blocks(b)
    assert hits == a.block_table[:3]
    assert bm.allocate_slots(b, b.num_tokens, hits)
    assert b.block_table[:3] == a.block_table[:3] and b.block_table[3] != a.block_table[3]
    assert [bm.blocks[i].ref_count for i in hits] == [2, 2, 2]
    bm.check_invariants([a, b])
    # a different first block breaks the chain even if later blocks match
    c = seq("c", [0, 0, 0, 0] + shared[4:] + [5])
    assert bm.get_computed_blocks(c) == []


def test_whole_prompt_hit_leaves_the_last_token_to_compute():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    a = seq("a", range(8))
    bm.allocate_slots(a, 8)
    a.num_computed_tokens = 8
    bm.cache_blocks(a)
    b = seq("b", range(8))
    assert len(bm.get_computed_blocks(b)) == 1  # (8 - 1) // 4: the last token must run


def test_freed_cached_blocks_are_revived_then_evicted_lru():
    bm = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    a = seq("a", [1, 2, 3, 4])
    bm.allocate_slots(a, 4)
    a.num_computed_tokens = 4
    bm.cache_blocks(a)
    cached = list(a.block_table)
    bm.free(a)
    assert bm.num_free_blocks == 4 and bm.num_cached_blocks == 2
    # revive: a free cached block is reused without counting as a new allocation
    b = seq("b", [1, 2, 3, 4, 5])
    hits = bm.get_computed_blocks(b)
    assert hits == cached
    assert bm.allocate_slots(b, 5, hits)
    assert bm.num_free_blocks == 1 and bm.num_evictions == 0
    bm.free(b)
    # fill the pool with unrelated tokens: cached blocks are evicted, the tail block first
    c = seq("c", [9] * 6)
    assert bm.allocate_slots(c, 6)  # 3 of 4 blocks: one cached block must go
    assert bm.num_evictions == 1
    assert bm.get_computed_blocks(seq("d", [1, 2, 3, 4, 5])) == cached[:1]  # tail went first
    e = seq("e", [7, 7])
    assert bm.allocate_slots(e, 2)
    assert bm.num_evictions == 2 and bm.num_cached_blocks == 0
    bm.check_invariants([c, e])


def test_no_prefix_sharing_when_caching_is_off():
    bm = BlockManager(num_blocks=8, block_size=2, enable_prefix_caching=False)
    a = seq("a", [1, 2, 3, 4])
    bm.allocate_slots(a, 4)
    a.num_computed_tokens = 4
    bm.cache_blocks(a)
    assert bm.num_cached_blocks == 0
    assert bm.get_computed_blocks(seq("b", [1, 2, 3, 4, 5])) == []


def test_invariant_check_catches_a_block_owned_twice():
    bm = BlockManager(num_blocks=4, block_size=2)
    a, b = seq("a", [1, 2]), seq("b", [3, 4])
    bm.allocate_slots(a, 2)
    b.block_table = list(a.block_table)  # corrupt: b claims a's block
    with pytest.raises(AssertionError):
        bm.check_invariants([a, b])


def test_freed_blocks_come_back_in_table_order_so_a_prompt_gets_a_run():
    """A finished request's blocks are reused first and in its table's order: the next
    prompt gets consecutive ids (its KV read in place by attention), not a reversed list."""
    bm = BlockManager(num_blocks=6, block_size=2)
    a, b = seq("a", range(8)), seq("b", range(4))
    assert bm.allocate_slots(a, 8) and bm.allocate_slots(b, 4)
    assert a.block_table == [0, 1, 2, 3]
    bm.free(a)
    c = seq("c", range(8))
    assert bm.allocate_slots(c, 8)
    assert c.block_table == [0, 1, 2, 3]
    bm.check_invariants([b, c])


def test_plain_blocks_are_reused_before_cached_ones():
    bm = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    a = seq("a", [1, 2, 3, 4, 5])  # 2 full blocks (cached once computed) + 1 partial
    assert bm.allocate_slots(a, 5)
    a.num_computed_tokens = 5
    bm.cache_blocks(a)
    partial = a.block_table[2]
    bm.free(a)
    b = seq("b", [9, 9])
    assert bm.allocate_slots(b, 2)
    assert b.block_table == [3]  # the never-used block first
    d = seq("d", [8, 8])
    assert bm.allocate_slots(d, 2)
    assert d.block_table == [partial]  # then the uncached one: both cached blocks survive
    assert bm.num_cached_blocks == 2 and bm.num_evictions == 0
    bm.check_invariants([b, d])


def test_reset_prefix_cache_forgets_every_block_and_keeps_running_kv():
    bm = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    shared = list(range(100, 112))
    a, done = seq("a", shared + [1]), seq("done", list(range(200, 208)) + [3])
    for s in (a, done):
        assert bm.allocate_slots(s, s.num_tokens)
        s.num_computed_tokens = s.num_tokens
        bm.cache_blocks(s)
    bm.free(done)  # its blocks stay cached in the free queue
    assert bm.num_cached_blocks == 5
    assert bm.reset_prefix_cache() == 5
    assert bm.num_cached_blocks == 0
    assert bm.get_computed_blocks(seq("b", shared + [2])) == []  # no hit after the reset
    assert len(a.block_table) == 4  # the running sequence keeps its KV
    bm.check_invariants([a])
    bm.free(a)
    assert bm.num_free_blocks == 16
    bm.check_invariants([])
