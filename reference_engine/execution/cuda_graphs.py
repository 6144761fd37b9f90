"""CUDA graphs for pure-decode steps, one per batch-size bucket (as vLLM's cudagraph mode).

A decode step of `n` sequences is padded to the smallest bucket >= n (`capture_sizes`): the
`bucket - n` dummy rows take token 0 at position 0, write their K/V into a reserved scratch
block (one block past the engine's pool, never handed out by the BlockManager) and attend to
that one slot only (seq_len 1); their hidden states are dropped. Every input lives in a static
buffer sized for the largest bucket, so a graph captured once per bucket replays with new
contents. Prefill, chunked-prefill and spec-verify steps (not decode-only) and batches above
the largest captured bucket run eagerly, unpadded.

On CUDA (`use_cuda_graphs=True`) each bucket's forward is captured with torch.cuda.graph at
start-up, smallest first, all graphs sharing one memory pool (they never run at once), until
`memory_budget_bytes` of graph memory is spent: larger buckets then run eagerly. The host
maxima the kernels take (`max_seq_len`, `max_position`) are fixed at the captured bound
`max_blocks_per_seq * block_size`; the attention kernels mask by `seq_lens`, so a shorter
sequence reads only its own tokens.

Elsewhere (`use_cuda_graphs=False`, the CPU) the same padded static-buffer path runs eagerly
with the batch's own maxima: this is what the CPU tests check (padded == unpadded tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from cbbench.reference_engine.model.llama import AttentionMetadata


def capture_sizes(max_num_seqs: int) -> list[int]:
    """Batch-size buckets up to max_num_seqs: 1, 2, 4, 8, multiples of 8 to 64, multiples of
    16 beyond, and max_num_seqs itself (so every batch the scheduler can build has one)."""
    assert max_num_seqs >= 1, max_num_seqs
    sizes = [1, 2, 4, 8, *range(16, 65, 8), *range(80, max_num_seqs + 1, 16)]
    out = [s for s in sizes if s <= max_num_seqs]
    if out[-1] != max_num_seqs:
        out.append(max_num_seqs)
    return out


def bucket_for(n: int, sizes: list[int]) -> int | None:
    """The smallest bucket holding n sequences; None when n exceeds them all."""
    assert n >= 1, n
    return next((s for s in sizes if s >= n), None)


@dataclass
class StaticBuffers:
    """Inputs and output of the largest bucket; a bucket's graph uses the leading rows."""

    input_ids: torch.Tensor  # [S] int64
    positions: torch.Tensor  # [S] int64
    slot_mapping: torch.Tensor  # [S] int64
    block_tables: torch.Tensor  # [S, max_blocks_per_seq] int32
    seq_lens: torch.Tensor  # [S] int32
    query_start_loc: torch.Tensor  # [S + 1] int32: arange (one query token per row)
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)  # bucket -> its output


class DecodeGraphs:
    def __init__(
        self,
        model: Any,  # LlamaForCausalLM
        backend: Any,  # AttentionBackend
        kv_cache: torch.Tensor,
        *,
        sizes: list[int],
        block_size: int,
        max_blocks_per_seq: int,
        scratch_block: int,
        use_cuda_graphs: bool,
        memory_budget_bytes: int = 2 * 2**30,
    ) -> None:
        assert sizes == sorted(sizes) and sizes[0] >= 1, sizes
        assert 0 <= scratch_block < kv_cache.shape[2], "the scratch block must be in the cache"
        self.model, self.backend, self.kv_cache = model, backend, kv_cache
        self.sizes = sizes
        self.block_size = block_size
        self.max_blocks_per_seq = max_blocks_per_seq
        self.scratch_block = scratch_block
        self.use_cuda_graphs = use_cuda_graphs
        self.memory_budget_bytes = memory_budget_bytes
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.graph_memory_bytes = 0
        self.replays = 0  # decode steps served by the padded path (graph or eager)
        dev = kv_cache.device
        s = sizes[-1]
        self.buf = StaticBuffers(
            input_ids=torch.zeros(s, dtype=torch.int64, device=dev),
            positions=torch.zeros(s, dtype=torch.int64, device=dev),
            slot_mapping=torch.full(
                (s,), scratch_block * block_size, dtype=torch.int64, device=dev
            ),
            block_tables=torch.full(
                (s, max_blocks_per_seq), scratch_block, dtype=torch.int32, device=dev
            ),
            seq_lens=torch.ones(s, dtype=torch.int32, device=dev),
            query_start_loc=torch.arange(s + 1, dtype=torch.int32, device=dev),
        )
        # graphs take the captured bound as the host maxima (fixed in them); the eager padded
        # path takes the batch's own unless `bound_maxima` (same launches as the graphs)
        self.max_seq_len_bound = max_blocks_per_seq * block_size
        self.bound_maxima = use_cuda_graphs

    # --- which steps take the padded path ----------------------------------------------
    def bucket(self, batch: Any) -> int | None:
        """The bucket a Batch runs in, or None to run it eagerly as it is."""
        meta: AttentionMetadata = batch.meta
        if not meta.decode_only or meta.block_tables.shape[1] > self.max_blocks_per_seq:
            return None
        size = bucket_for(batch.input_ids.shape[0], self.sizes)
        if size is None or (self.use_cuda_graphs and size not in self.graphs):
            return None
        return size

    # --- padding -------------------------------------------------------------------------
    def _fill(self, batch: Any, size: int) -> None:
        """Copy the batch into the static buffers' first `size` rows, dummies after it."""
        b, n = self.buf, batch.input_ids.shape[0]
        meta: AttentionMetadata = batch.meta
        w = meta.block_tables.shape[1]
        b.input_ids[:n].copy_(batch.input_ids, non_blocking=True)
        b.positions[:n].copy_(batch.positions, non_blocking=True)
        b.slot_mapping[:n].copy_(meta.slot_mapping, non_blocking=True)
        b.seq_lens[:n].copy_(meta.seq_lens, non_blocking=True)
        b.block_tables[:n, :w].copy_(meta.block_tables, non_blocking=True)
        b.block_tables[:n, w:].fill_(self.scratch_block)
        # dummy rows: token 0 at position 0 into the scratch block's first slot
        b.input_ids[n:size].zero_()
        b.positions[n:size].zero_()
        b.slot_mapping[n:size].fill_(self.scratch_block * self.block_size)
        b.seq_lens[n:size].fill_(1)
        b.block_tables[n:size].fill_(self.scratch_block)

    def _meta(self, size: int, max_seq_len: int) -> AttentionMetadata:
        b = self.buf
        return AttentionMetadata(
            slot_mapping=b.slot_mapping[:size],
            block_tables=b.block_tables[:size],
            seq_lens=b.seq_lens[:size],
            query_start_loc=b.query_start_loc[: size + 1],
            decode_only=True,
            max_query_len=1,
            max_seq_len=max_seq_len,
        )

    def _forward(self, size: int, max_seq_len: int, max_position: int) -> torch.Tensor:
        b = self.buf
        return self.model(
            b.input_ids[:size],
            b.positions[:size],
            max_position,
            self.kv_cache,
            self._meta(size, max_seq_len),
            self.backend,
        )

    def run(self, batch: Any, size: int) -> torch.Tensor:
        """Hidden states [n, H] of a decode batch run padded to `size` (from `bucket`)."""
        n = batch.input_ids.shape[0]
        assert n <= size, (n, size)
        self._fill(batch, size)
        self.replays += 1
        if self.use_cuda_graphs:
            self.graphs[size].replay()
            return self.buf.hidden[size][:n]
        if self.bound_maxima:
            return self._forward(size, self.max_seq_len_bound, self.max_seq_len_bound - 1)[:n]
        return self._forward(size, batch.meta.max_seq_len, batch.max_position)[:n]

    # --- capture (CUDA) ------------------------------------------------------------------
    def capture(self) -> list[int]:
        """Capture one graph per bucket, smallest first, in one shared pool, within the
        memory budget; returns the captured sizes."""
        assert self.use_cuda_graphs and self.kv_cache.device.type == "cuda"
        pool = torch.cuda.graph_pool_handle()
        bound, max_pos = self.max_seq_len_bound, self.max_seq_len_bound - 1
        with torch.inference_mode():
            for size in self.sizes:
                self._fill_dummy(size)
                self._forward(size, bound, max_pos)  # warm-up: kernels compiled, rope grown
                torch.cuda.synchronize()
                before = torch.cuda.memory_reserved()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    out = self._forward(size, bound, max_pos)
                torch.cuda.synchronize()
                self.graph_memory_bytes += torch.cuda.memory_reserved() - before
                self.graphs[size] = graph
                self.buf.hidden[size] = out
                if self.graph_memory_bytes > self.memory_budget_bytes:
                    break  # larger buckets run eagerly
        return sorted(self.graphs)

    def _fill_dummy(self, size: int) -> None:
        b = self.buf
        b.input_ids[:size].zero_()
        b.positions[:size].zero_()
        b.slot_mapping[:size].fill_(self.scratch_block * self.block_size)
        b.seq_lens[:size].fill_(1)
        b.block_tables[:size].fill_(self.scratch_block)
