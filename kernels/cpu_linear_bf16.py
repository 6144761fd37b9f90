"""A projection with bf16 weights on CPUs without a native bf16 matmul, in C++
(csrc/cpu_linear_bf16.cpp): y = x @ W^T (+ bias), x fp32, W bf16 packed once into 8-output
panels, fp32 accumulation and output. Decode streams every weight each step, so bf16's half
bytes make it faster than fp32 where torch's own bf16 matmul (no AVX512-BF16/AMX) is ~30x
slower. The same kernel runs int8 weight-only projections (`pack_int8` / `linear_int8`:
symmetric int8 codes per output row with one fp32 scale, a quarter of fp32's bytes), the
engine's `--quantization int8`; torch's `_weight_int8pack_mm` measured 10-50x slower than
fp32 here with fp32 inputs.

Portable: AVX-512 (two panels per zmm) or AVX2/FMA intrinsics where the compiler targets
them (`-march=native`), plain loops otherwise; no AVX-512 needed. Built on first use as its own module `cbbench_cpu_bf16_kernels`
with cpu_gemm's build helper into torch's extension cache (once per machine; torch's file lock
keeps concurrent first builds apart). `load()` returns the module, or None with one logged
reason (not x86-64 Linux, no compiler or ninja, the build failed).

Any row count runs the kernel: for prefill-sized M (64..512 rows of small's 512 -> 1536) it
measured within ~15% of torch's fp32 matmul, and faster than unpacking the panels to fp32 and
calling that matmul (the unpacking alone ~0.9 ms there), so there is no large-M fallback.
"""

from __future__ import annotations

import threading
from types import ModuleType

import torch
from cbbench.kernels import cpu_gemm

NAME = "cbbench_cpu_bf16_kernels"
SOURCES = [cpu_gemm.CSRC / "cpu_linear_bf16.cpp"]
PANEL = 8  # outputs per panel, as in the C++ source

_lock = threading.Lock()
_state: dict[str, object] = {}  # "module" or "reason", set once


def load() -> ModuleType | None:
    """The compiled module, or None (the reason is in `unavailable_reason()`)."""
    return cpu_gemm.load_portable(_state, _lock, NAME, SOURCES, 'bf16 linear kernel', "torch's bf16 matmul")


def unavailable_reason() -> str | None:
    load()
    return _state.get("reason")  # type: ignore[return-value]


def available() -> bool:
    return load() is not None


def isa() -> str | None:
    """The code path compiled here: "avx512", "avx2" or "scalar" (None: not built)."""
    mod = load()
    return None if mod is None else str(mod.isa())


def pack(weight: torch.Tensor) -> torch.Tensor:
    """W [N, K] (any float dtype; rounded to bf16) -> panels [ceil(N/8), K, 8] bf16, the rows
    past N zero."""
    assert weight.dim() == 2, f"pack: weight must be [N, K], got {tuple(weight.shape)}"
    n, k = weight.shape
    p = -(-n // PANEL)
    w = torch.zeros(p * PANEL, k, dtype=torch.bfloat16)
    w[:n] = weight.detach().to(torch.bfloat16)
    return w.view(p, PANEL, k).transpose(1, 2).contiguous()


def unpack(panels: torch.Tensor, out_features: int) -> torch.Tensor:
    """panels [P, K, 8] -> W [out_features, K] in fp32 (exact; for checks)."""
    p, k, _ = panels.shape
    return panels.transpose(1, 2).reshape(p * PANEL, k)[:out_features].float()


def linear(
    x: torch.Tensor, panels: torch.Tensor, bias: torch.Tensor | None, out_features: int
) -> torch.Tensor:
    """x [..., K] (any float dtype, computed in fp32) @ W^T (+ bias fp32) -> fp32
    [..., out_features]."""
    x2 = x.reshape(-1, x.shape[-1])
    if x2.dtype != torch.float32 or not x2.is_contiguous():
        x2 = x2.to(torch.float32).contiguous()
    mod = load()
    assert mod is not None, f"cpu_linear_bf16: not built here ({unavailable_reason()})"
    y = mod.linear_bf16(x2, panels, bias, out_features)
    return y.view(*x.shape[:-1], out_features)


def pack_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W [N, K] -> (panels [ceil(N/8), K, 8] int8, scales [N] fp32): per output row, symmetric
    codes round(w / s) with s = max |w| / 127 (an all-zero row gets s = 1), the rows past N
    zero. |dequantized - w| <= s / 2."""
    assert weight.dim() == 2, f"pack_int8: weight must be [N, K], got {tuple(weight.shape)}"
    w = weight.detach().float()
    n, k = w.shape
    absmax = w.abs().amax(dim=1)
    scales = torch.where(absmax > 0, absmax / 127.0, torch.ones_like(absmax)).contiguous()
    codes = torch.round(w / scales[:, None]).clamp_(-127, 127).to(torch.int8)
    p = -(-n // PANEL)
    padded = torch.zeros(p * PANEL, k, dtype=torch.int8)
    padded[:n] = codes
    return padded.view(p, PANEL, k).transpose(1, 2).contiguous(), scales


def unpack_int8(panels: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(panels, scales) -> the dequantized W [N, K] in fp32 (for checks)."""
    p, k, _ = panels.shape
    codes = panels.transpose(1, 2).reshape(p * PANEL, k)[: scales.numel()]
    return codes.float() * scales[:, None]


def linear_int8(
    x: torch.Tensor, panels: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x [..., K] (any float dtype, computed in fp32) @ dequantized W^T (+ bias fp32) -> fp32
    [..., N]."""
    x2 = x.reshape(-1, x.shape[-1])
    if x2.dtype != torch.float32 or not x2.is_contiguous():
        x2 = x2.to(torch.float32).contiguous()
    mod = load()
    assert mod is not None, f"cpu_linear_bf16: not built here ({unavailable_reason()})"
    n = scales.numel()
    return mod.linear_int8(x2, panels, scales, bias, n).view(*x.shape[:-1], n)
