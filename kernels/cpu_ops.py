"""Row ops of a CPU decode step in C++ (csrc/cpu_ops.cpp, built with the other CPU kernels
by cpu_gemm.load()): RMSNorm, greedy argmax, and rotary embedding fused with the KV-cache
write, fp32; and a temperature draw by inverse CDF (csrc/cpu_sample.cpp).

On `small` (8 rows, 1 thread) F.rms_norm ran as six torch ops, ~65 us a call and 19 calls a
step; torch's argmax over 8 x 32k logits took ~400 us. Each is one call here. Results equal
torch's up to fp32 summation order (argmax: exactly, NaN and ties included).
"""

from __future__ import annotations

import torch
from cbbench.kernels import cpu_gemm


def available() -> bool:
    return cpu_gemm.load() is not None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., H] fp32 -> x / sqrt(mean(x^2) + eps) * weight."""
    mod = cpu_gemm.load()
    assert mod is not None, "cpu_ops: the CPU kernels are not built here"
    return mod.rms_norm(x.reshape(-1, x.shape[-1]).contiguous(), weight, float(eps)).view(x.shape)


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """x [N, V] fp32 -> int64 [N]: as x.argmax(dim=-1) (first maximum, a NaN wins)."""
    mod = cpu_gemm.load()
    assert mod is not None, "cpu_ops: the CPU kernels are not built here"
    return mod.argmax_rows(x.contiguous())


def rope_and_cache(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
) -> torch.Tensor:
    """One layer's fused projection output qkv [T, (Hq + 2 Hkv) * D] -> rotated q [T, Hq, D];
    rotated k and v written into cache slots `slot_mapping` (< 0: padding, skipped). The
    torch path's rotate, two contiguous copies and two index_copy calls in one pass."""
    mod = cpu_gemm.load()
    assert mod is not None, "cpu_ops: the CPU kernels are not built here"
    return mod.rope_and_cache(
        qkv.contiguous(), cos.contiguous(), sin.contiguous(), k_cache, v_cache,
        slot_mapping.to(torch.int64).contiguous(), num_heads, num_kv_heads, head_dim,
    )  # fmt: skip


def sample_rows(x: torch.Tensor, rows: list[int], temps: list[float], u: list[float]) -> list[int]:
    """x [N, V] fp32 logits; per draw a row of x, a temperature > 0 and u in [0, 1) -> per
    draw the first token whose running sum of exp(x / T - max) reaches (1 - u) of the row's
    sum (the torch path's inverse CDF, sums in fp64); -1 for a row with a NaN, a +inf or no
    finite logit (draw those with torch)."""
    mod = cpu_gemm.load()
    assert mod is not None, "cpu_ops: the CPU kernels are not built here"
    return mod.sample_rows(x.contiguous(), rows, temps, u)


def silu_mul(gate_up: torch.Tensor, intermediate: int) -> torch.Tensor:
    """gate_up [..., 2 I] fp32 (gate columns, then up) -> silu(gate) * up [..., I] in one pass
    (torch: a silu, a copy and a mul over strided halves); within a few ulp of torch's."""
    mod = cpu_gemm.load()
    assert mod is not None, "cpu_ops: the CPU kernels are not built here"
    x2 = gate_up.reshape(-1, gate_up.shape[-1]).contiguous()
    return mod.silu_mul(x2, intermediate).view(*gate_up.shape[:-1], intermediate)
