"""Paged decode attention over an int8 KV cache on the CPU in C++ (csrc/cpu_attention_quant.cpp):
K/V rows read in place through the block table and dequantized as they are read (code x the
row's scale, kernels/kv_quant.py's layout), fp32 accumulation, one call per layer.

Portable: AVX2/FMA intrinsics where the compiler targets them (`-march=native`), plain loops
otherwise; no AVX-512 needed, unlike cpu_gemm's extension. Built on first use as its own
module `cbbench_cpu_kv_kernels` with cpu_gemm's build helper into torch's extension cache
(once per machine; torch's file lock keeps concurrent first builds apart). `load()` returns
the module, or None with one logged reason (not x86-64 Linux, no compiler or ninja, the
build failed); the torch backend then keeps its gather path for int8 caches.
"""

from __future__ import annotations

import threading
from types import ModuleType

import torch
from cbbench.kernels import cpu_gemm, kv_quant

NAME = "cbbench_cpu_kv_kernels"
SOURCES = [cpu_gemm.CSRC / "cpu_attention_quant.cpp"]

_lock = threading.Lock()
_state: dict[str, object] = {}  # "module" or "reason", set once


def load() -> ModuleType | None:
    """The compiled module, or None (the reason is in `unavailable_reason()`)."""
    return cpu_gemm.load_portable(_state, _lock, NAME, SOURCES, 'int8 KV decode kernel', 'torch gather path')


def unavailable_reason() -> str | None:
    load()
    return _state.get("reason")  # type: ignore[return-value]


def available() -> bool:
    return load() is not None


def isa() -> str | None:
    """The code path compiled here: "avx2" or "scalar" (None: not built)."""
    mod = load()
    return None if mod is None else str(mod.isa())


def supports(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """The kernel's case: fp32 query and an int8 cache (codes + kv_quant's scale) on the CPU."""
    return (
        q.device.type == "cpu"
        and q.dtype == torch.float32
        and k_cache.dtype == torch.int8
        and k_cache.shape[-1] == q.shape[-1] + kv_quant.SCALE_BYTES
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
    """q [B, Hq, D] fp32, one query per sequence at position seq_lens[b] - 1; int8 caches
    [NB, BS, Hkv, D + SCALE_BYTES]; block_tables [B, MB]; seq_lens [B] -> fp32 [B, Hq, D]."""
    mod = load()
    assert mod is not None, f"cpu_kv_attention: not built here ({unavailable_reason()})"
    return mod.paged_decode_attention_int8(
        q.contiguous(),
        k_cache.contiguous(),
        v_cache.contiguous(),
        block_tables.to(torch.int32).contiguous(),
        seq_lens.to(torch.int32).contiguous(),
        float(scale),
    )
