"""CPU decode attention that reads long runs of KV blocks in place (split-KV, torch only).

The plain torch path copies every sequence's blocks into one contiguous tensor before
attention: that copy runs at memcpy speed and is about half of a decode layer on CPU. Here a
sequence's context is split into pieces:

- every run of at least `min_run` consecutive pool blocks (the block manager hands a prompt's
  blocks out together, so a prompt is usually one run) is read in place through a view;
- all other blocks, always including the last (partial) one, are gathered (sequences grouped
  by how many blocks they gather, a few at a time so the copy stays in cache) and attended
  in one masked call per group.

Each piece yields a partial output and its log-sum-exp; the pieces of a sequence merge with
weights exp(lse_p - max lse), as the Triton split-KV decode kernel does. Softmax attention is
invariant to the order of keys, so gathered blocks need not keep their table order.

The plan (which blocks go where, kernels/kv_layout.py, which the simulator's cost model
counts from too) is built on the host once per step and reused by every layer: it depends
only on the block tables and the sequence lengths.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from cbbench.kernels.kv_layout import GATHER_BYTES, MIN_RUN_BYTES, split_layout

_flash_cpu = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
# MIN_RUN_BYTES (kv_layout): a run is read in place from this many bytes of K (2 blocks
# of `small`): one more attention call costs less than copying it. Measured on a batch
# captured from the engine (`small`, 8 sequences, 164-314 tokens): 64 KiB 0.87 ms, 256 KiB
# 1.04 ms, gather-only 1.38 ms.


def available() -> bool:
    """The fused CPU attention op with a mask and a log-sum-exp output (torch >= 2.5)."""
    if _flash_cpu is None:
        return False
    return "attn_mask" in str(_flash_cpu.default._schema)


@dataclass
class SplitPlan:
    """Pieces of one decode batch; `None` from `plan_split` means: gather everything."""

    runs: list[tuple[int, int, int]]  # (sequence, first pool block, number of blocks)
    rest: list[RestGroup]  # every sequence in exactly one group
    seg: torch.Tensor  # [B + len(runs)] sequence of each partial (groups' rows, then runs)


@dataclass
class RestGroup:
    """Sequences whose gathered blocks are attended in one call, padded to the group's
    widest (sequences are grouped by width, so padding stays small)."""

    seqs: torch.Tensor  # [n] int64 sequence indices
    ids: torch.Tensor  # [n, R] int64 blocks to gather, padded with block 0
    mask: torch.Tensor  # [n, 1, 1, R * BS] additive float mask: 0 valid, -inf padding


def plan_split(
    tables: list[list[int]],
    seq_lens: list[int],
    block_size: int,
    block_bytes: int,
    min_run_bytes: int = MIN_RUN_BYTES,
    gather_bytes: int = GATHER_BYTES,
) -> SplitPlan | None:
    """The layout of `kv_layout.split_layout` (runs read in place, the rest gathered in
    groups of about `gather_bytes` of K+V) as index tensors, or None: gather everything."""
    layout = split_layout(tables, seq_lens, block_size, block_bytes, min_run_bytes, gather_bytes)
    if layout is None:
        return None
    groups: list[RestGroup] = []
    for members in layout.groups:
        width = layout.width(members)
        rests = [layout.rests[i] for i in members]
        ids = torch.tensor([[*r, *[0] * (width - len(r))] for r in rests])
        keep = (
            torch.arange(width * block_size)[None, :]
            < torch.tensor([layout.valid[i] for i in members])[:, None]
        )
        mask = torch.zeros(keep.shape).masked_fill_(~keep, float("-inf"))
        groups.append(RestGroup(torch.tensor(members), ids, mask[:, None, None, :]))
    rows = [int(i) for g in groups for i in g.seqs]
    seg = torch.tensor(rows + [b for b, _, _ in layout.runs])
    return SplitPlan(layout.runs, groups, seg)


def split_kv_decode(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: SplitPlan,
    scale: float,
    gather: object,
) -> torch.Tensor:
    """query [B, Hkv, G, D] -> [B, Hkv, G, D]. `gather(k_cache, v_cache, ids)` copies blocks
    `ids` of both caches into [len(ids), BS, Hkv, D] buffers (the backend's workspace)."""
    assert _flash_cpu is not None
    num_seqs, num_kv_heads, _, head_dim = query.shape
    block_size = k_cache.shape[1]
    outs, lses = [], []
    for g in plan.rest:
        n, width = g.ids.shape
        k, v = gather(k_cache, v_cache, g.ids.view(-1))  # type: ignore[operator]
        shape = (n, width * block_size, num_kv_heads, head_dim)
        o, lse = _flash_cpu(
            query.index_select(0, g.seqs),
            k.view(shape).transpose(1, 2),
            v.view(shape).transpose(1, 2),
            attn_mask=g.mask.to(query.dtype),
            scale=scale,
        )
        outs.append(o)
        lses.append(lse)
    for b, first, n in plan.runs:
        view = (1, n * block_size, num_kv_heads, head_dim)  # -> [1, Hkv, L, D], no copy
        o, lse = _flash_cpu(
            query[b : b + 1],
            k_cache[first : first + n].view(view).transpose(1, 2),
            v_cache[first : first + n].view(view).transpose(1, 2),
            scale=scale,
        )
        outs.append(o)
        lses.append(lse)
    # merge the partials of each sequence: out_b = sum_p exp(lse_p - M_b) out_p / sum_p ...
    out = torch.cat(outs).float()  # [P, Hkv, G, D]
    lse = torch.cat(lses).float().view(out.shape[:-1])  # [P, Hkv, G]
    top = torch.full((num_seqs, *lse.shape[1:]), float("-inf"))
    top.scatter_reduce_(0, plan.seg[:, None, None].expand_as(lse), lse, "amax")
    weight = torch.exp(lse - top[plan.seg])
    denom = torch.zeros_like(top).index_add_(0, plan.seg, weight)
    num = torch.zeros(num_seqs, *out.shape[1:]).index_add_(0, plan.seg, out * weight[..., None])
    return (num / denom[..., None]).to(query.dtype)
