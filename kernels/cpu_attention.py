"""Paged decode attention on the CPU in C++ (csrc/cpu_attention.cpp, built with the panels
kernel by cpu_gemm.load()): K/V read in place through the block table, one call per layer.

It replaces the torch path's gather + fused-SDPA calls (torch_split_kv): on `small` (8
sequences, ~150 tokens of context) those were 81 SDPA calls a step, ~180 us each, about a
third of the decode step. fp32 and bf16 caches (a bf16 row is widened to fp32 in registers:
half the bytes streamed); the query, scores and output are fp32 inside, the result is cast
to the query's dtype. The torch path stays the fallback and the independent reference in
the tests.
"""

from __future__ import annotations

import torch
from cbbench.kernels import cpu_gemm

_DTYPES = (torch.float32, torch.bfloat16)


def available() -> bool:
    """The compiled CPU kernels loaded here (AVX-512 x86-64 Linux with a compiler)."""
    return cpu_gemm.load() is not None


def supports(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """The kernel's case: an fp32 or bf16 query and cache on the CPU (a bf16 cache under an
    fp32 model too)."""
    return (
        q.device.type == "cpu"
        and q.dtype in _DTYPES
        and k_cache.dtype in _DTYPES
        and available()
    )


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """q [B, Hq, D], one query per sequence at position seq_lens[b] - 1; caches
    [NB, BS, Hkv, D]; block_tables [B, MB]; seq_lens [B] -> [B, Hq, D]."""
    mod = cpu_gemm.load()
    assert mod is not None, "cpu_attention: the CPU kernels are not built here"
    out = mod.paged_decode_attention(
        q.float().contiguous(),
        k_cache.contiguous(),
        v_cache.contiguous(),
        block_tables.to(torch.int32).contiguous(),
        seq_lens.to(torch.int32).contiguous(),
        float(scale),
    )
    return out.to(q.dtype)


def supports_prefill(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """The prefill kernel's case: the decode kernel's, with head_dim a multiple of 16."""
    return supports(q, k_cache) and q.shape[-1] % 16 == 0


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    min_qlen: int = 2,
) -> torch.Tensor:
    """Causal attention (csrc/cpu_prefill_attention.cpp) of every sequence with at least
    `min_qlen` queries: q [T, Hq, D] fp32 or bf16, sequence b's queries
    q[query_start_loc[b]:query_start_loc[b + 1]] at the last positions of its seq_lens[b];
    their rows of `out` (q's shape and dtype, contiguous) are written, the others kept."""
    mod = cpu_gemm.load()
    assert mod is not None, "cpu_attention: the CPU kernels are not built here"
    mod.paged_prefill_attention(
        q.contiguous(),
        k_cache.contiguous(),
        v_cache.contiguous(),
        block_tables.to(torch.int32).contiguous(),
        seq_lens.to(torch.int32).contiguous(),
        query_start_loc.to(torch.int32).contiguous(),
        float(scale),
        out,
        int(min_qlen),
    )
    return out
