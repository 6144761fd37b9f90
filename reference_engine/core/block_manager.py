"""Paged KV cache bookkeeping: a pool of fixed-size blocks, per-sequence block tables.

Block ids index the executor's cache tensors `[num_blocks, block_size, kv_heads, head_dim]`;
token at position p of a sequence lives in slot `block_table[p // bs] * bs + p % bs`.

Prefix caching (switchable): once a block is full of computed tokens it gets a chained hash,
hash(parent block's hash, its token ids), and is registered. A later sequence whose leading
blocks have the same chain reuses them (ref count + 1) instead of recomputing. Freed blocks
keep their hash and sit in an LRU free queue; they are evicted only when handed out again.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import repeat

from cbbench.reference_engine.core.sequence import Sequence


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(slots=True)
class KVBlock:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None  # set while registered in the prefix cache
    parent_hash: int | None = None
    token_ids: tuple[int, ...] | None = None  # kept to make a hash hit exact

    def reset(self) -> None:
        self.block_hash = self.parent_hash = self.token_ids = None


class BlockManager:
    def __init__(
        self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False
    ) -> None:
        assert num_blocks >= 1 and block_size >= 1
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        # Blocks are created on first use: ids >= len(self.blocks) are fresh (and free), so a
        # huge simulated pool costs nothing. Fresh blocks are handed out before freed ones.
        self.blocks: list[KVBlock] = []
        # Used-then-freed blocks, popped from the front. Cached blocks are freed to the back
        # (LRU eviction); blocks without cached content go to the front in table order, so
        # they are reused first (keeping cached ones longer) and a new prompt gets a run of
        # consecutive ids that attention can read in place.
        self._free: OrderedDict[int, None] = OrderedDict()
        self._cached: dict[int, int] = {}  # block hash -> block id
        self._hashes: dict[str, list[int]] = {}  # request id -> chain hashes of full blocks
        self._num_registered: dict[str, int] = {}  # request id -> leading blocks registered
        self.peak_used = 0
        self.num_evictions = 0

    # --- pool state -------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.num_blocks - len(self.blocks) + len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return len(self.blocks) - len(self._free)

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def blocks_for(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    # --- prefix cache -----------------------------------------------------------------
    def _chain_hashes(self, seq: Sequence, num_full: int) -> list[int]:
        """Chain hashes of the first `num_full` full blocks of seq.token_ids (memoised: a
        full block's tokens never change)."""
        hashes = self._hashes.setdefault(seq.request_id, [])
        bs = self.block_size
        while len(hashes) < num_full:
            i = len(hashes)
            parent = hashes[-1] if hashes else None
            hashes.append(hash((parent, tuple(seq.token_ids[i * bs : (i + 1) * bs]))))
        return hashes

    def get_computed_blocks(self, seq: Sequence) -> list[int]:
        """Leading cached blocks matching seq's tokens (none unless caching is on and seq has
        no KV yet). The last token is always left to compute, so its logits exist."""
        if not self.enable_prefix_caching or seq.block_table or not self._cached:
            return []
        bs = self.block_size
        max_blocks = (seq.num_tokens - 1) // bs
        hits: list[int] = []
        parent: int | None = None
        for i, h in enumerate(self._chain_hashes(seq, max_blocks)):
            bid = self._cached.get(h)
            if bid is None:
                break
            b = self.blocks[bid]
            if b.parent_hash != parent or b.token_ids != tuple(
                seq.token_ids[i * bs : (i + 1) * bs]
            ):
                break  # a hash collision, not a hit
            hits.append(bid)
            parent = h
        return hits

    def cache_blocks(self, seq: Sequence) -> None:
        """Register seq's blocks that are now full of computed tokens."""
        if not self.enable_prefix_caching:
            return
        num_full = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        start = self._num_registered.get(seq.request_id, 0)
        if num_full <= start:
            return
        hashes = self._chain_hashes(seq, num_full)
        bs = self.block_size
        for i in range(start, num_full):
            b = self.blocks[seq.block_table[i]]
            if b.block_hash is not None or hashes[i] in self._cached:
                continue  # already registered (a hit), or the same content lives elsewhere
            b.block_hash = hashes[i]
            b.parent_hash = hashes[i - 1] if i else None
            b.token_ids = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            self._cached[hashes[i]] = b.block_id
        self._num_registered[seq.request_id] = num_full

    def reset_prefix_cache(self) -> int:
        """Forget every cached block (vLLM's reset_prefix_cache): later sequences find no
        hit. Blocks in use keep their KV, only no newcomer shares them. Returns how many."""
        n = len(self._cached)
        for bid in self._cached.values():
            self.blocks[bid].reset()
        self._cached.clear()
        return n

    # --- allocate / free --------------------------------------------------------------
    def can_allocate(
        self,
        seq: Sequence,
        num_tokens: int,
        computed_blocks: Iterable[int] = (),
        watermark: int = 0,
    ) -> bool:
        computed = list(computed_blocks)
        num_new = self.blocks_for(num_tokens) - len(seq.block_table) - len(computed)
        revived = sum(1 for b in computed if self.blocks[b].ref_count == 0)
        return self.num_free_blocks - revived - max(num_new, 0) >= watermark

    def allocate_slots(
        self,
        seq: Sequence,
        num_tokens: int,
        computed_blocks: Iterable[int] = (),
        watermark: int = 0,
    ) -> bool:
        """Grow seq.block_table to hold `num_tokens` tokens, first adopting `computed_blocks`
        (prefix hits; only onto an empty table). Returns False, changing nothing, when fewer
        than `watermark` blocks would stay free."""
        table = seq.block_table
        if not computed_blocks:  # a running sequence grows (the hot path: inlined)
            num_new = -(-num_tokens // self.block_size) - len(table)
            if num_new <= 0:
                return True  # the common decode case: the last block has room
            blocks = self.blocks
            num_fresh = self.num_blocks - len(blocks)
            if num_fresh + len(self._free) - num_new < watermark:
                return False
            for _ in range(num_new):
                if num_fresh:
                    num_fresh -= 1
                    bid = len(blocks)
                    blocks.append(KVBlock(bid, 1))
                    table.append(bid)
                else:
                    table.append(self._pop_free())
            used = len(blocks) - len(self._free)
            if used > self.peak_used:
                self.peak_used = used
            return True
        computed = list(computed_blocks)
        assert not computed or not seq.block_table
        if not self.can_allocate(seq, num_tokens, computed, watermark):
            return False
        for bid in computed:
            b = self.blocks[bid]
            if b.ref_count == 0:
                del self._free[bid]
            b.ref_count += 1
        seq.block_table.extend(computed)
        for _ in range(self.blocks_for(num_tokens) - len(seq.block_table)):
            seq.block_table.append(self._pop_free())
        self.peak_used = max(self.peak_used, self.num_used_blocks)
        return True

    def grow(self, seqs: list[Sequence], num_tokens: list[int]) -> bool:
        """allocate_slots(seq, n) for each pair, in order, all or nothing: False, changing
        nothing, when the pool cannot give every block (a decode step's block boundaries
        in one call)."""
        bs = self.block_size
        counts = [-(-n // bs) - len(s.block_table) for s, n in zip(seqs, num_tokens, strict=True)]
        total = sum(counts)
        blocks = self.blocks
        start = len(blocks)
        num_fresh = self.num_blocks - start
        if num_fresh + len(self._free) < total:
            return False
        if total <= num_fresh and total == len(seqs):  # one fresh block each: ids in a run
            blocks.extend(map(KVBlock, range(start, start + total), repeat(1)))
            for seq, bid in zip(seqs, range(start, start + total), strict=True):
                seq.block_table.append(bid)
        else:
            for seq, n in zip(seqs, counts, strict=True):
                for _ in range(n):
                    seq.block_table.append(self._pop_free())
        used = len(blocks) - len(self._free)
        if used > self.peak_used:
            self.peak_used = used
        return True

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Speculative rollback: free seq's tail blocks beyond those `num_tokens` tokens need
        (lookahead blocks that held only rejected draft tokens). Such a block was allocated
        fresh for seq and never registered (hashes cover computed, i.e. accepted, tokens)."""
        keep = self.blocks_for(num_tokens)
        while len(seq.block_table) > keep:
            bid = seq.block_table.pop()
            b = self.blocks[bid]
            assert b.ref_count == 1 and b.block_hash is None, (
                f"block {bid}: a lookahead block is shared or cached"
            )
            b.ref_count = 0
            self._free_front([bid])

    def _free_front(self, bids: list[int]) -> None:
        """Put blocks without cached content at the front of the free queue, in this order."""
        for bid in reversed(bids):
            self._free[bid] = None
            self._free.move_to_end(bid, last=False)

    def _pop_free(self) -> int:
        if len(self.blocks) < self.num_blocks:
            fresh = KVBlock(len(self.blocks), ref_count=1)
            self.blocks.append(fresh)
            return fresh.block_id
        bid, _ = self._free.popitem(last=False)
        b = self.blocks[bid]
        assert b.ref_count == 0, f"block {bid} in the free queue with ref_count {b.ref_count}"
        if b.block_hash is not None:  # evict the least recently freed cached block
            if self._cached.get(b.block_hash) == bid:
                del self._cached[b.block_hash]
            self.num_evictions += 1
            b.reset()
        b.ref_count = 1
        return bid

    def free(self, seq: Sequence, finished: bool = True) -> None:
        """Release seq's blocks: cached ones to the back, tail first (the tail is evicted
        first), the others to the front in table order. `finished=False` (preemption) keeps
        its memoised hashes for the recompute."""
        plain: list[int] = []
        for bid in reversed(seq.block_table):
            b = self.blocks[bid]
            b.ref_count -= 1
            assert b.ref_count >= 0, f"block {bid} freed more often than allocated"
            if b.ref_count == 0:
                if b.block_hash is None:
                    plain.append(bid)
                else:
                    self._free[bid] = None
        plain.reverse()
        self._free_front(plain)
        seq.block_table = []
        self._num_registered.pop(seq.request_id, None)
        if finished:
            self._hashes.pop(seq.request_id, None)

    # --- invariants -------------------------------------------------------------------
    def check_invariants(self, seqs: Iterable[Sequence]) -> None:
        """Every block's ref count equals the number of tables holding it; a block is free
        exactly when nobody holds it; no table holds a block twice."""
        owners = [0] * len(self.blocks)
        for seq in seqs:
            assert len(set(seq.block_table)) == len(seq.block_table), (
                f"{seq.request_id} holds a block twice"
            )
            for bid in seq.block_table:
                owners[bid] += 1
        for b in self.blocks:
            assert b.ref_count == owners[b.block_id], (
                f"block {b.block_id}: ref_count {b.ref_count} but {owners[b.block_id]} holders"
            )
            assert (b.ref_count == 0) == (b.block_id in self._free), f"block {b.block_id} free-list"
            if not self.enable_prefix_caching:
                assert b.ref_count <= 1, f"block {b.block_id} shared without prefix caching"
