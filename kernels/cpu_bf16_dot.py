"""bf16 in, bf16 out with AVX512-BF16 (csrc/cpu_bf16_dot.cpp): the projection of a bf16
decode step (`vdpbf16ps`, weights packed once into 16-output panels of k pairs), HF's
half-type RMSNorm in one pass, and the rotary embedding fused with the bf16 KV-cache write
(cpu_ops' fp32 kernels' bf16 twins); for the fused decode layer (reference_engine/model/
cpu_fused.py) also silu * up in one pass and the residual add inside the projection. Built on first use as its own module
`cbbench_cpu_bf16dp_kernels` through cpu_gemm's portable build helper; `isa()` is
"avx512bf16" where the compiler targets it (-march=native on such a CPU), else "scalar" (plain
loops, correct but slow: the engine then keeps oneDNN). `load()` returns None with a logged
reason where nothing builds.

On `small` (B 8, one thread, Zen 4) oneDNN's bf16 linears took ~9 ms of a ~16 ms decode step
against a ~5 ms floor to stream 108 MB of bf16 weights; the fp32-FMA bf16 kernel
(cpu_linear_bf16) was compute-bound at 8 rows. One vdpbf16ps does 32 multiply-adds.
"""

from __future__ import annotations

import threading
from types import ModuleType

import torch
from cbbench.kernels import cpu_gemm

NAME = "cbbench_cpu_bf16dp_kernels"
SOURCES = [cpu_gemm.CSRC / "cpu_bf16_dot.cpp"]
PANEL = 16  # outputs per panel, as in the C++ source
GROUP = 3  # panels per micro-kernel call (kNP)

_lock = threading.Lock()
_state: dict[str, object] = {}  # "module" or "reason", set once


def load() -> ModuleType | None:
    """The compiled module, or None (the reason is in `unavailable_reason()`)."""
    return cpu_gemm.load_portable(_state, _lock, NAME, SOURCES, "bf16 dot kernel", "oneDNN")


def unavailable_reason() -> str | None:
    load()
    return _state.get("reason")  # type: ignore[return-value]


def isa() -> str | None:
    """The code path built: "avx512bf16" or "scalar" (None: not built)."""
    mod = load()
    return None if mod is None else str(mod.isa())


def fast() -> bool:
    """Built with vdpbf16ps here."""
    return isa() == "avx512bf16"


def pack(weight: torch.Tensor) -> torch.Tensor:
    """W [N, K] (rounded to bf16) -> panels [ceil(N/16), ceil(K/2), 16, 2] bf16, zero past N
    and K: panel p, pair j, lane o = (W[16p + o, 2j], W[16p + o, 2j + 1])."""
    assert weight.dim() == 2, f"pack: weight must be [N, K], got {tuple(weight.shape)}"
    n, k = weight.shape
    p, k2 = -(-n // PANEL), -(-k // 2)
    w = torch.zeros(p * PANEL, k2 * 2, dtype=torch.bfloat16)
    w[:n, :k] = weight.detach().to(torch.bfloat16)
    return w.view(p, PANEL, k2, 2).permute(0, 2, 1, 3).contiguous()


def pack_grouped(weight: torch.Tensor) -> torch.Tensor:
    """W [N, K] -> [ceil(N/48), ceil(K/2), 3, 16, 2] bf16: `pack`'s panels in groups of the
    micro-kernel's three, a k pair of the three side by side, so the kernel reads the weight
    as one stream (zero panels pad the last group)."""
    panels = pack(weight)
    p, k2 = panels.shape[:2]
    g = -(-p // GROUP)
    padded = torch.zeros(g * GROUP, k2, PANEL, 2, dtype=torch.bfloat16)
    padded[:p] = panels
    return padded.view(g, GROUP, k2, PANEL, 2).permute(0, 2, 1, 3, 4).contiguous()


def unpack(panels: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """panels (`pack` or `pack_grouped`) -> W [out_features, in_features] bf16 (exact)."""
    if panels.dim() == 5:
        g, k2 = panels.shape[:2]
        panels = panels.permute(0, 2, 1, 3, 4).reshape(g * GROUP, k2, PANEL, 2)
    p, k2, _, _ = panels.shape
    w = panels.permute(0, 2, 1, 3).reshape(p * PANEL, k2 * 2)
    return w[:out_features, :in_features]


def linear(
    x: torch.Tensor,
    panels: torch.Tensor,
    bias: torch.Tensor | None,
    out_features: int,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [..., K] bf16 @ W^T (+ bias fp32) -> bf16 [..., out_features], fp32 accumulation;
    `residual` (bf16, the output's shape): + residual, bitwise `residual + linear(x)`."""
    if residual is not None:
        x2 = x.reshape(-1, x.shape[-1]).to(torch.bfloat16).contiguous()
        r2 = residual.reshape(x2.shape[0], out_features).contiguous()
        y = _module().linear_bf16dp(x2, panels, bias, out_features, r2)
        return y.view(*x.shape[:-1], out_features)
    mod = _state.get("module") or load()
    assert mod is not None, f"cpu_bf16_dot: not built here ({unavailable_reason()})"
    if x.dim() == 2 and x.dtype == torch.bfloat16 and x.is_contiguous():  # a step's rows
        return mod.linear_bf16dp(x, panels, bias, out_features)
    x2 = x.reshape(-1, x.shape[-1])
    if x2.dtype != torch.bfloat16 or not x2.is_contiguous():
        x2 = x2.to(torch.bfloat16).contiguous()
    y = mod.linear_bf16dp(x2, panels, bias, out_features)
    return y.view(*x.shape[:-1], out_features)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [..., 2I] bf16 -> F.silu(gate) * up [..., I] bf16 in one pass (silu in fp32 with
    an AVX-512 exp within ~1 ulp of torch's, rounded to bf16 as torch rounds it)."""
    g2 = gate_up.reshape(-1, gate_up.shape[-1]).contiguous()
    return _module().silu_mul_bf16(g2).view(*gate_up.shape[:-1], gate_up.shape[-1] // 2)


def _module() -> ModuleType:
    mod = load()
    assert mod is not None, f"cpu_bf16_dot: not built here ({unavailable_reason()})"
    return mod


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., H] bf16, weight [H] bf16 -> weight * bf16(x * rsqrt(mean(x^2) + eps))."""
    mod = load()
    assert mod is not None, f"cpu_bf16_dot: not built here ({unavailable_reason()})"
    y = mod.rms_norm_bf16(x.reshape(-1, x.shape[-1]).contiguous(), weight, float(eps))
    return y.view(x.shape)


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
    """cpu_ops.rope_and_cache for bf16 qkv and caches (fp32 cos/sin): rotated q [T, Hq, D]
    bf16, rotated k and v written into slots `slot_mapping` (< 0: skipped); equal to
    RotaryEmbedding.apply + reshape_and_cache in bf16."""
    mod = load()
    assert mod is not None, f"cpu_bf16_dot: not built here ({unavailable_reason()})"
    return mod.rope_and_cache_bf16(
        qkv.contiguous(), cos.float().contiguous(), sin.float().contiguous(), k_cache, v_cache,
        slot_mapping.to(torch.int64).contiguous(), num_heads, num_kv_heads, head_dim,
    )  # fmt: skip
