"""The oracle: paged attention written as plainly as possible, for tests only.

Per sequence and per query token: look each cached position up through the block table
(block = pos // block_size, offset = pos % block_size), then dense softmax attention in fp32.
Deliberately shares no code with the backends it checks.
"""

from __future__ import annotations

import math

import torch


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """The first `num_tokens` positions of one sequence from a paged cache: [num_tokens, Hkv, D]."""
    block_size = cache.shape[1]
    rows = []
    for pos in range(num_tokens):
        block = int(block_table[pos // block_size])
        rows.append(cache[block, pos % block_size])
    return torch.stack(rows)


def ref_reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    block_size = k_cache.shape[1]
    for t in range(key.shape[0]):
        slot = int(slot_mapping[t])
        if slot < 0:
            continue
        k_cache[slot // block_size, slot % block_size] = key[t]
        v_cache[slot // block_size, slot % block_size] = value[t]


def ref_paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Varlen causal attention over the paged cache; returns fp32 [T, Hq, D]."""
    num_q_heads = q.shape[1]
    num_kv_heads = k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    out = torch.zeros(q.shape, dtype=torch.float32)
    for b in range(block_tables.shape[0]):
        start, end = int(query_start_loc[b]), int(query_start_loc[b + 1])
        seq_len = int(seq_lens[b])
        qlen = end - start
        if qlen == 0:
            continue
        k = gather_kv(k_cache, block_tables[b], seq_len).float()
        v = gather_kv(v_cache, block_tables[b], seq_len).float()
        for i in range(qlen):
            pos = seq_len - qlen + i  # this query's absolute position
            for h in range(num_q_heads):
                kv_head = h // group
                scores = (k[: pos + 1, kv_head] @ q[start + i, h].float()) * scale
                probs = torch.softmax(scores, dim=0)
                out[start + i, h] = probs @ v[: pos + 1, kv_head]
    return out


def ref_paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query per sequence at position seq_lens[b] - 1; returns fp32 [B, Hq, D]."""
    query_start_loc = torch.arange(q.shape[0] + 1, dtype=torch.int32)
    return ref_paged_attention(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale)


def make_paged_case(
    seq_lens: list[int],
    query_lens: list[int],
    block_size: int,
    num_kv_heads: int,
    group: int,
    head_dim: int = 16,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    num_blocks: int | None = None,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """Random inputs for paged attention: a cache pool with every sequence's blocks drawn
    shuffled (non-contiguous) from it, tables padded with a spare column, varlen queries.

    With `num_blocks` past what the sequences need, the pool is allocated but only the used
    blocks are written: a pool of 2**31+ elements costs only the pages touched.
    """
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-s // block_size) for s in seq_lens]
    need = sum(blocks_per_seq)
    pool = num_blocks if num_blocks is not None else 2 * need + 3
    assert pool >= need
    shape = (pool, block_size, num_kv_heads, head_dim)
    k_cache = torch.empty(shape, dtype=dtype, device=device)
    v_cache = torch.empty(shape, dtype=dtype, device=device)
    if num_blocks is None:
        ids = torch.randperm(pool, generator=gen)[:need]
        k_cache.copy_(torch.randn(shape, generator=gen))
        v_cache.copy_(torch.randn(shape, generator=gen))
    else:  # huge pool: use blocks spread up to its very end, write only those
        spread = (pool - 1) // (4 * need)
        assert spread >= 1, "an explicit num_blocks must be > 4x the blocks needed"
        candidates = pool - 1 - torch.arange(4 * need) * spread
        ids = candidates[torch.randperm(4 * need, generator=gen)[:need]]
        if not bool((ids == pool - 1).any()):
            ids[0] = pool - 1  # reach the largest offset
        row = (len(ids), block_size, num_kv_heads, head_dim)
        k_cache[ids.to(device)] = torch.randn(row, generator=gen).to(dtype).to(device)
        v_cache[ids.to(device)] = torch.randn(row, generator=gen).to(dtype).to(device)
    tables = torch.zeros((len(seq_lens), max(blocks_per_seq) + 1), dtype=torch.int32)
    used = 0
    for b, n in enumerate(blocks_per_seq):
        tables[b, :n] = ids[used : used + n]
        used += n
    num_q_heads = num_kv_heads * group
    q = torch.randn(sum(query_lens), num_q_heads, head_dim, generator=gen)
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    return {
        "q": q.to(dtype).to(device),
        "k_cache": k_cache,
        "v_cache": v_cache,
        "block_tables": tables.to(device),
        "seq_lens": torch.tensor(seq_lens, dtype=torch.int32, device=device),
        "query_start_loc": torch.tensor(starts, dtype=torch.int32, device=device),
    }


def engine_block_tables(
    seq_lens: list[int], prompt_lens: list[int], block_size: int, first_block: int = 1
) -> tuple[torch.Tensor, int]:
    """Block tables laid out as a fresh block manager lays them out: each prompt's blocks
    consecutive (allocated together), then decode blocks one at a time, round-robin between
    sequences. Returns the int32 tables (a spare padding column) and the next unused id."""
    need = [-(-s // block_size) for s in seq_lens]
    prompt = [min(n, -(-p // block_size)) for n, p in zip(need, prompt_lens, strict=True)]
    tables: list[list[int]] = []
    nxt = first_block
    for n in prompt:
        tables.append(list(range(nxt, nxt + n)))
        nxt += n
    while any(len(t) < n for t, n in zip(tables, need, strict=True)):
        for t, n in zip(tables, need, strict=True):
            if len(t) < n:
                t.append(nxt)
                nxt += 1
    width = max(need) + 1
    return torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32), nxt


# --- quantized caches (kernels/kv_quant.py's layout), written out plainly -------------------
_E_MIN, _E_MAX = 1, 254  # E8M0 bytes written: 2**-126 .. 2**127


def ref_scale_byte(amax: float, top: float) -> int:
    """The smallest e in [1, 254] with amax <= top * 2**(e - 127), by search in float64
    (a first guess from log2, then stepped until exact): 254 for an inf row."""
    if amax == math.inf:
        return _E_MAX
    e = _E_MIN if amax == 0.0 else math.ceil(math.log2(amax / top)) + 127
    e = min(max(e, _E_MIN), _E_MAX)
    while e < _E_MAX and amax > math.ldexp(top, e - 127):
        e += 1
    while e > _E_MIN and amax <= math.ldexp(top, e - 128):
        e -= 1
    return e


def ref_quantize_row(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One (token, head) row x [D] -> [D + 1] of `dtype`: codes round_half_even(x / s)
    (int8) or x / s cast (fp8), then the byte e of s = 2**(e - 127), the smallest power of
    two with absmax / s <= 127 (448 for e4m3); absmax 0 gives e = 1 and zero codes."""
    top = 127.0 if dtype == torch.int8 else float(torch.finfo(dtype).max)
    e = ref_scale_byte(float(x.float().abs().max()), top)
    row = torch.empty(x.shape[0] + 1, dtype=dtype)
    y = x.double() / math.ldexp(1.0, e - 127)
    if dtype == torch.int8:
        row[: x.shape[0]] = torch.round(y).clamp(-127, 127).to(torch.int8)
    else:
        row[: x.shape[0]] = y.clamp(-top, top).float().to(dtype)
    row[x.shape[0] :] = torch.tensor([e], dtype=torch.uint8).view(dtype)
    return row


def ref_dequantize_row(row: torch.Tensor) -> torch.Tensor:
    """[D + 1] packed row -> fp32 [D]: codes times 2**(e - 127)."""
    d = row.shape[0] - 1
    e = int(row[d:].contiguous().view(torch.uint8)[0])
    return (row[:d].double() * math.ldexp(1.0, e - 127)).float()


def ref_quantize_cache(cache: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A float cache [NB, BS, Hkv, D] -> packed [NB, BS, Hkv, D + 1], row by row."""
    nb, bs, h, d = cache.shape
    out = torch.empty((nb, bs, h, d + 1), dtype=dtype)
    for i in range(nb):
        for j in range(bs):
            for k in range(h):
                out[i, j, k] = ref_quantize_row(cache[i, j, k], dtype)
    return out


def ref_dequantize_cache(cache: torch.Tensor) -> torch.Tensor:
    """A packed cache [NB, BS, Hkv, D + 1] -> fp32 [NB, BS, Hkv, D], row by row."""
    nb, bs, h, w = cache.shape
    out = torch.empty((nb, bs, h, w - 1), dtype=torch.float32)
    for i in range(nb):
        for j in range(bs):
            for k in range(h):
                out[i, j, k] = ref_dequantize_row(cache[i, j, k])
    return out
