"""CPU decode attention that reads long runs of KV blocks in place (split-KV, torch only).

The plain torch path copies every sequence's blocks into one contiguous tensor before
attention: that copy runs at memcpy speed and is about half of a decode layer on CPU. Here a
sequence's context is split into pieces:

- every run of at least `min_run` consecutive pool blocks (the block manager hands a prompt's
  blocks out together, so a prompt is usually one run) is read in place through a view;
- all other blocks, always including the last (partial) one, are gathered for all sequences
  in one `index_select` and attended in one masked call.

Each piece yields a partial output and its log-sum-exp; the pieces of a sequence merge with
weights exp(lse_p - max lse), as the Triton split-KV decode kernel does. Softmax attention is
invariant to the order of keys, so gathered blocks need not keep their table order.

The plan (which blocks go where) is built on the host once per step and reused by every
layer: it depends only on the block tables and the sequence lengths.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_flash_cpu = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
# A run is read in place when its K bytes pay for one more attention call (~10 us): at
# ~25 GB/s a copy of 256 KiB costs about as much.
MIN_RUN_BYTES = 256 << 10


def available() -> bool:
    """The fused CPU attention op with a mask and a log-sum-exp output (torch >= 2.5)."""
    if _flash_cpu is None:
        return False
    return "attn_mask" in str(_flash_cpu.default._schema)


@dataclass
class SplitPlan:
    """Pieces of one decode batch; `None` from `plan_split` means: gather everything."""

    runs: list[tuple[int, int, int]]  # (sequence, first pool block, number of blocks)
    rest_ids: torch.Tensor  # [B, R] int64 gathered blocks per sequence, padded with block 0
    rest_mask: torch.Tensor  # [B, 1, 1, R * BS] additive float mask: 0 valid, -inf padding
    seg: torch.Tensor  # [B + len(runs)] sequence of each partial (rest rows first)


def plan_split(
    tables: list[list[int]],
    seq_lens: list[int],
    block_size: int,
    block_bytes: int,
    min_run_bytes: int = MIN_RUN_BYTES,
) -> SplitPlan | None:
    """Split each sequence's blocks into in-place runs and gathered rest, or None when too
    few blocks would be read in place to pay for the extra calls. A run qualifies from
    `min_run_bytes` of K per run (and at least 2 blocks); `block_bytes` is one block of K."""
    min_run = max(2, -(-min_run_bytes // block_bytes))
    runs: list[tuple[int, int, int]] = []
    rests: list[list[int]] = []
    valid: list[int] = []
    in_place = total = 0
    for b, (row, length) in enumerate(zip(tables, seq_lens, strict=True)):
        assert length >= 1, "a decode sequence has at least its own token"
        nb = -(-length // block_size)
        ids = row[:nb]
        total += nb
        rest: list[int] = []
        start = 0
        for i in range(1, nb):  # runs among the full blocks ids[:-1]
            if i == nb - 1 or ids[i] != ids[i - 1] + 1:
                n = i - start
                if n >= min_run:
                    runs.append((b, ids[start], n))
                    in_place += n
                else:
                    rest.extend(ids[start:i])
                start = i
        rest.append(ids[-1])  # the last block holds the only padding positions
        rests.append(rest)
        valid.append((len(rest) - 1) * block_size + length - (nb - 1) * block_size)
    if not runs or 4 * in_place < total:  # under a quarter in place: not worth it
        return None
    width = max(len(r) for r in rests)
    rest_ids = torch.tensor([r + [0] * (width - len(r)) for r in rests], dtype=torch.int64)
    positions = torch.arange(width * block_size)
    keep = positions[None, :] < torch.tensor(valid)[:, None]
    mask = torch.zeros(keep.shape).masked_fill_(~keep, float("-inf"))
    seg = torch.tensor(list(range(len(tables))) + [b for b, _, _ in runs])
    return SplitPlan(runs, rest_ids, mask[:, None, None, :], seg)


def split_kv_decode(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: SplitPlan,
    scale: float,
    gather: object,
    gather_bytes: int,
) -> torch.Tensor:
    """query [B, Hkv, G, D] -> [B, Hkv, G, D]. `gather(k_cache, v_cache, ids)` copies blocks
    `ids` of both caches into [len(ids), BS, Hkv, D] buffers (the backend's workspace), at
    most about `gather_bytes` at a time."""
    assert _flash_cpu is not None
    num_seqs, num_kv_heads, _, head_dim = query.shape
    block_size = k_cache.shape[1]
    width = plan.rest_ids.shape[1]
    mask = plan.rest_mask.to(query.dtype)
    # gather a few sequences at a time so the copy is still in cache when attention reads it
    per_seq = 2 * width * k_cache[0].numel() * k_cache.element_size()
    step = max(1, gather_bytes // per_seq)
    outs, lses = [], []
    for s in range(0, num_seqs, step):
        e = min(num_seqs, s + step)
        k, v = gather(k_cache, v_cache, plan.rest_ids[s:e].reshape(-1))  # type: ignore[operator]
        shape = (e - s, width * block_size, num_kv_heads, head_dim)
        o, lse = _flash_cpu(
            query[s:e],
            k.view(shape).transpose(1, 2),
            v.view(shape).transpose(1, 2),
            attn_mask=mask[s:e],
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
