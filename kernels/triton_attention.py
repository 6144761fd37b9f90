"""Paged attention in Triton: split-KV decode with a log-sum-exp merge, and varlen causal
prefill / chunked prefill over the paged cache.

Both kernels gather K/V token by token through the block table (any block size, including 1)
with int64 offsets. Products run on `tl.dot` in the cache dtype for fp16/bf16 (fp32
accumulation, probabilities rounded to the cache dtype for P @ V, as flash attention does),
and in IEEE fp32 for fp32 caches. With DOT_F32 (fp32 caches, and bf16 on CPU, because the
Triton interpreter's bf16 `tl.dot` is wrong) operands are upcast to fp32 first; fp16 runs the
native path under the interpreter too, so both paths are tested on CPU.
int8 caches (kernels/kv_quant.py: codes + a one-byte E8M0 exponent e per token and head at
the row's end, scale 2**(e - 127)) are dequantized as they are loaded (`_load_kv`: the scale
is e shifted into fp32's exponent field, exactly exp2(e - 127)) and attended in IEEE fp32.
Importing this module imports triton; `triton_backend` does so lazily.

Over 400 lines because the decode, merge and prefill kernels and their launchers share
their helpers and are checked together; splitting them would split one contract.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from cbbench.kernels import kv_quant

# Running-max start: finite, so fully masked tiles never make NaN. A jit function may read a
# global only when it is a constexpr.
NEG_INIT = tl.constexpr(-1.0e30)


@triton.jit
def _load_kv(cache_ptr, row, d, n_mask, kv_mask, head_dim, QUANT: tl.constexpr,
             DOT_F32: tl.constexpr):  # fmt: skip
    """Rows `row` [N] of a cache, [N, BLOCK_D]: int8 codes times 2**(e - 127), e their row's
    E8M0 byte (after the codes), in fp32, else as stored (fp32 upcast under DOT_F32)."""
    x = tl.load(cache_ptr + row[:, None] + d[None, :], mask=kv_mask, other=0.0)
    if QUANT:
        e_ptr = (cache_ptr + row + head_dim).to(tl.pointer_type(tl.uint8))
        e = tl.load(e_ptr, mask=n_mask, other=127).to(tl.int32)
        scale = (e << 23).to(tl.float32, bitcast=True)  # exp2(e - 127), exactly
        x = x.to(tl.float32) * scale[:, None]
    elif DOT_F32:
        x = x.to(tl.float32)
    return x


@triton.jit
def _decode_split_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    part_out_ptr,
    part_lse_ptr,
    scale,
    stride_qb,
    stride_qh,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_bt,
    block_size,
    head_dim,
    num_q_heads,
    num_splits,
    tokens_per_split,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_F32: tl.constexpr,
    QUANT: tl.constexpr,
):
    """One program: one sequence, one KV head (all its GROUP query heads), one KV split."""
    b = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    start = split * tokens_per_split
    end = tl.minimum(seq_len, start + tokens_per_split)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    heads = kv_head * GROUP + g
    g_mask = g < GROUP
    d_mask = d < head_dim
    q = tl.load(
        q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
        mask=g_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    if DOT_F32 or QUANT:
        q = q.to(tl.float32)
    else:
        q = q.to(k_cache_ptr.dtype.element_ty)

    m = tl.zeros([BLOCK_G], dtype=tl.float32) + NEG_INIT
    l_sum = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        n_mask = pos < end
        block = tl.load(block_tables_ptr + b * stride_bt + pos // block_size, mask=n_mask, other=0)
        row = block.to(tl.int64) * stride_cb + (pos % block_size) * stride_cs + kv_head * stride_ch
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = _load_kv(k_cache_ptr, row, d, n_mask, kv_mask, head_dim, QUANT, DOT_F32)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l_sum = l_sum * alpha + tl.sum(p, 1)
        v = _load_kv(v_cache_ptr, row, d, n_mask, kv_mask, head_dim, QUANT, DOT_F32)
        if DOT_F32 or QUANT:
            pv = tl.dot(p, v, input_precision=DOT_PRECISION)
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m = m_new

    has = l_sum > 0.0  # an empty split (start >= seq_len) contributes weight exp(-inf) = 0
    lse = tl.where(has, m + tl.log(tl.where(has, l_sum, 1.0)), float("-inf"))
    out = acc / tl.where(has, l_sum, 1.0)[:, None]
    part = (b * num_q_heads + heads) * num_splits + split  # [BLOCK_G] rows of [B, Hq, S]
    tl.store(part_lse_ptr + part, lse, mask=g_mask)
    tl.store(
        part_out_ptr + part[:, None] * head_dim + d[None, :],
        out,
        mask=g_mask[:, None] & d_mask[None, :],
    )


@triton.jit
def _decode_merge_kernel(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    stride_ob,
    stride_oh,
    head_dim,
    num_q_heads,
    num_splits,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Combine the splits of one (sequence, query head): weights exp(lse_s - max lse)."""
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    s_mask = s < num_splits
    d_mask = d < head_dim
    rows = (b * num_q_heads + h) * num_splits + s
    lse = tl.load(part_lse_ptr + rows, mask=s_mask, other=float("-inf"))
    w = tl.exp(lse - tl.max(lse, 0))  # split 0 is never empty, so the max is finite
    o = tl.load(
        part_out_ptr + rows[:, None] * head_dim + d[None, :],
        mask=s_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    out = tl.sum(w[:, None] * o, 0) / tl.sum(w, 0)
    tl.store(
        out_ptr + b * stride_ob + h * stride_oh + d,
        out.to(out_ptr.dtype.element_ty),
        mask=d_mask,
    )


@triton.jit
def _prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    scale,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_bt,
    block_size,
    head_dim,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_F32: tl.constexpr,
    QUANT: tl.constexpr,
):
    """One program: BLOCK_M queries of one sequence and one query head. Query i of a sequence
    with qlen queries sits at position seq_len - qlen + i and sees keys 0..that position."""
    b = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    tile = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + b)
    qlen = tl.load(query_start_loc_ptr + b + 1) - q_start
    if tile * BLOCK_M < qlen:
        seq_len = tl.load(seq_lens_ptr + b)
        ctx_len = seq_len - qlen  # tokens cached before this chunk
        kv_head = head // GROUP
        i = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        d = tl.arange(0, BLOCK_D)
        i_mask = i < qlen
        d_mask = d < head_dim
        q_pos = ctx_len + i
        tokens = (q_start + i).to(tl.int64)
        q = tl.load(
            q_ptr + tokens[:, None] * stride_qt + head * stride_qh + d[None, :],
            mask=i_mask[:, None] & d_mask[None, :],
            other=0.0,
        )
        if DOT_F32 or QUANT:
            q = q.to(tl.float32)
        else:
            q = q.to(k_cache_ptr.dtype.element_ty)

        m = tl.zeros([BLOCK_M], dtype=tl.float32) + NEG_INIT
        l_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        end = tl.minimum(seq_len, ctx_len + (tile + 1) * BLOCK_M)  # past the tile's last key
        for n0 in range(0, end, BLOCK_N):
            pos = n0 + tl.arange(0, BLOCK_N)
            n_mask = pos < end
            block = tl.load(
                block_tables_ptr + b * stride_bt + pos // block_size, mask=n_mask, other=0
            )
            row = (
                block.to(tl.int64) * stride_cb
                + (pos % block_size) * stride_cs
                + kv_head * stride_ch
            )
            kv_mask = n_mask[:, None] & d_mask[None, :]
            k = _load_kv(k_cache_ptr, row, d, n_mask, kv_mask, head_dim, QUANT, DOT_F32)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale
            visible = n_mask[None, :] & (pos[None, :] <= q_pos[:, None])
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(s - m_new[:, None])
            l_sum = l_sum * alpha + tl.sum(p, 1)
            v = _load_kv(v_cache_ptr, row, d, n_mask, kv_mask, head_dim, QUANT, DOT_F32)
            if DOT_F32 or QUANT:
                pv = tl.dot(p, v, input_precision=DOT_PRECISION)
            else:
                pv = tl.dot(p.to(v.dtype), v)
            acc = acc * alpha[:, None] + pv
            m = m_new

        out = acc / tl.where(l_sum > 0.0, l_sum, 1.0)[:, None]
        tl.store(
            out_ptr + tokens[:, None] * stride_ot + head * stride_oh + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=i_mask[:, None] & d_mask[None, :],
        )


def _dot_precision(dtype: torch.dtype) -> str:
    """tf32 only applies to fp32 operands; int8 caches attend dequantized in IEEE fp32."""
    return "ieee" if dtype in (torch.float32, torch.int8) else "tf32"


def _dot_f32(cache: torch.Tensor) -> bool:
    """fp32 caches, and bf16 off CUDA (the interpreter's bf16 tl.dot is wrong)."""
    return cache.dtype == torch.float32 or (cache.dtype == torch.bfloat16 and not cache.is_cuda)


def _check(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> int:
    """Validate shapes/strides; return the GQA group size Hq // Hkv."""
    assert k_cache.dim() == 4 and k_cache.shape == v_cache.shape, "cache is [NB, BS, Hkv, D]"
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    assert k_cache.dtype in (q.dtype, torch.int8), "a cache of the query's dtype, or int8"
    assert q.shape[-1] == kv_quant.cache_head_dim(k_cache) and q.stride(-1) == 1
    assert q.shape[1] % k_cache.shape[2] == 0, "GQA needs Hq % Hkv == 0"
    return q.shape[1] // k_cache.shape[2]


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, device: torch.device):
    """Split the context so that about two programs per SM run, each over >= 256 tokens."""
    if device.type == "cuda":
        target = 2 * torch.cuda.get_device_properties(device).multi_processor_count
    else:
        target = 4  # the interpreter: few programs, but still exercise the merge
    by_occupancy = -(-target // (num_seqs * num_kv_heads))
    by_length = -(-max_seq_len // 256)
    return max(1, min(by_occupancy, by_length, 64))


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
    block_n: int = 64,
    num_warps: int = 4,
) -> torch.Tensor:
    """q [B, Hq, D] (one query per sequence at position seq_lens[b] - 1) -> [B, Hq, D]."""
    group = _check(q, k_cache, v_cache)
    num_seqs, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    out = torch.empty_like(q)
    if num_seqs == 0:
        return out
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max())
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, num_kv_heads, max_seq_len, q.device)
    tokens_per_split = triton.cdiv(triton.cdiv(max_seq_len, num_splits), block_n) * block_n
    num_splits = triton.cdiv(max_seq_len, tokens_per_split)
    part_out = torch.empty(
        (num_seqs, num_q_heads, num_splits, head_dim), dtype=torch.float32, device=q.device
    )
    part_lse = torch.empty(
        (num_seqs, num_q_heads, num_splits), dtype=torch.float32, device=q.device
    )
    block_d = max(16, triton.next_power_of_2(head_dim))  # tl.dot needs K >= 16
    _decode_split_kernel[(num_seqs, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        part_out,
        part_lse,
        scale,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        block_size,
        head_dim,
        num_q_heads,
        num_splits,
        tokens_per_split,
        GROUP=group,
        BLOCK_G=max(16, triton.next_power_of_2(group)),  # tl.dot needs M >= 16
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        DOT_PRECISION=_dot_precision(k_cache.dtype),
        DOT_F32=_dot_f32(k_cache),
        QUANT=k_cache.dtype == torch.int8,
        num_warps=num_warps,
    )
    _decode_merge_kernel[(num_seqs, num_q_heads)](
        part_out,
        part_lse,
        out,
        out.stride(0),
        out.stride(1),
        head_dim,
        num_q_heads,
        num_splits,
        BLOCK_S=max(2, triton.next_power_of_2(num_splits)),
        BLOCK_D=block_d,
    )
    return out


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    max_query_len: int | None = None,
    block_m: int = 64,
    block_n: int = 64,
    num_warps: int = 4,
) -> torch.Tensor:
    """Varlen causal attention over the paged cache: q [T, Hq, D] -> [T, Hq, D]."""
    group = _check(q, k_cache, v_cache)
    num_tokens, num_q_heads, head_dim = q.shape
    num_seqs = block_tables.shape[0]
    out = torch.empty_like(q)
    if num_tokens == 0:
        return out
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    grid = (num_seqs, num_q_heads, triton.cdiv(max_query_len, block_m))
    _prefill_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        block_tables,
        seq_lens,
        query_start_loc,
        scale,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        k_cache.shape[1],
        head_dim,
        GROUP=group,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        DOT_PRECISION=_dot_precision(k_cache.dtype),
        DOT_F32=_dot_f32(k_cache),
        QUANT=k_cache.dtype == torch.int8,
        num_warps=num_warps,
    )
    return out
