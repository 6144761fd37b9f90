"""Quantized KV cache: int8 / fp8 rows with a one-byte E8M0 scale per (token, KV head).

`--kv-cache-dtype` names (vLLM's): "auto" (the model dtype), "bf16", "fp8"
(`torch.float8_e4m3fn`) and "int8". A quantized cache keeps the engine's one-tensor layout
`[..., block_size, num_kv_heads, head_dim + 1]`: each (token, head) row is `head_dim` codes
followed by ONE byte, the scale's exponent `e` (uint8, the E8M0 shared-scale format of the
OCP Microscaling spec, as MXINT8 / MXFP8 use it): `scale = 2 ** (e - 127)`, and
`x ~= code * scale`. Every path that passes a cache tensor around (the model, CUDA graphs,
the draft proposer, the block manager) is unchanged and a block of K is one contiguous slab.

The rule (every implementation follows it bit for bit: the oracle in kernels/reference.py,
the Triton write, the C++ kernels):
- `scale` is the smallest power of two with `absmax(row) / scale <= QMAX` (127 for int8,
  448 for e4m3), `e` clamped to [E_MIN, E_MAX] = [1, 254]: 2**-126 (the smallest normal
  fp32, so `e << 23` read as fp32 bits is the scale exactly) up to 2**127 (255 is E8M0's NaN,
  never written). An all-zero row, and any row with absmax below 127 * 2**-126, gets E_MIN
  (zero codes for a zero row); a row with an inf gets E_MAX (codes saturate at +-QMAX). A
  finite fp32 row never reaches E_MAX (its absmax < 2**128 needs e <= 249).
- codes: `round_half_even(x / scale)` for int8 (no clamp needed: |x| / scale <= 127), the
  e4m3 cast of `x / scale` for fp8. Dividing by a power of two is exact, so every backend's
  codes agree exactly.
- dequantize: `code * scale` in fp32; the scale is built as fp32 bits `e << 23` (an
  exponent, no multiply-add, no table).
- error per element: int8 at most scale / 2, and scale < 2 * absmax / 127, so at most
  absmax / 127 (an fp16 scale `absmax / 127` gave absmax / 254: E8M0 costs up to one bit);
  e4m3 at most 2**-4 * absmax (3 mantissa bits).

Why per (token, head) and not per (block, head): the scale is written once with its token
(`reshape_and_cache`), never revised, so a block that fills over many steps needs no
re-quantization of the tokens already in it, and one outlier token cannot coarsen its
neighbours' codes. Why one byte: one (token, head) of K is `head_dim + 1` bytes against
`4 * head_dim` in fp32, i.e. 4D / (D + 1) more tokens per byte: 3.76x fp32 (1.88x bf16) at
head_dim 16 (`tiny`), 3.94x (1.97x) at 64, 3.97x (1.98x) at 128; an fp16 scale gave
4D / (D + 2), only 1.78x bf16 at head_dim 16.
"""

from __future__ import annotations

import math

import torch

KV_CACHE_DTYPES = ("auto", "bf16", "fp8", "int8")
SCALE_BYTES = 1  # one uint8 E8M0 exponent per (token, head), after the codes
E8M0_BIAS = 127  # scale = 2 ** (e - E8M0_BIAS)
E_MIN = 1  # 2**-126: the smallest normal fp32 (e = 0, 2**-127, would be subnormal)
E_MAX = 254  # 2**127 (e = 255 is E8M0's NaN)

def fp8_dtype() -> torch.dtype | None:
    """torch.float8_e4m3fn where this torch has it, else None."""
    return getattr(torch, "float8_e4m3fn", None)


def cache_torch_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The storage dtype of a `kv_cache_dtype` cache; ValueError (one line) when unknown or
    when this torch lacks fp8."""
    if kv_cache_dtype == "auto":
        return model_dtype
    if kv_cache_dtype == "bf16":
        return torch.bfloat16
    if kv_cache_dtype == "int8":
        return torch.int8
    if kv_cache_dtype == "fp8":
        fp8 = fp8_dtype()
        if fp8 is None:
            raise ValueError(
                f"--kv-cache-dtype fp8 needs torch.float8_e4m3fn, which torch {torch.__version__}"
                " lacks; use int8 or upgrade torch"
            )
        return fp8
    raise ValueError(f"unknown kv cache dtype {kv_cache_dtype!r}; choose from {KV_CACHE_DTYPES}")


def is_quantized_dtype(dtype: torch.dtype) -> bool:
    return dtype == torch.int8 or (fp8_dtype() is not None and dtype == fp8_dtype())


def is_quantized(cache: torch.Tensor) -> bool:
    """A packed int8/fp8 cache (codes + scale per row), as opposed to a plain float one."""
    return is_quantized_dtype(cache.dtype)


def row_width(head_dim: int, dtype: torch.dtype) -> int:
    """Elements of one (token, head) row in a cache of `dtype`: the last dimension."""
    return head_dim + SCALE_BYTES if is_quantized_dtype(dtype) else head_dim


def row_bytes(head_dim: int, dtype: torch.dtype) -> int:
    """Bytes of one (token, head) of K (or of V) in a cache of `dtype`."""
    return row_width(head_dim, dtype) * torch.empty(0, dtype=dtype).element_size()


def cache_head_dim(cache: torch.Tensor) -> int:
    """head_dim of a cache `[..., Hkv, last]` (a quantized row carries its scale)."""
    last = cache.shape[-1]
    return last - SCALE_BYTES if is_quantized(cache) else last


def qmax(dtype: torch.dtype) -> float:
    """The largest code: 127 for int8, 448 for e4m3."""
    return 127.0 if dtype == torch.int8 else float(torch.finfo(dtype).max)


def scale_rule_bits(dtype: torch.dtype) -> tuple[int, int]:
    """QMAX = (1 + t / 2**23) * 2**(p - 1): returns (p, t), the exponent and mantissa bits
    the scale rule compares against (int8: p 7, t 63/64 * 2**23; e4m3: p 9, t 0.75 * 2**23)."""
    m, p = math.frexp(qmax(dtype))
    return p, int((2 * m - 1) * 2**23)


def scale_exponent(amax: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The E8M0 byte (uint8) of rows with absmax `amax` (>= 0): the smallest e in
    [E_MIN, E_MAX] with amax <= QMAX * 2**(e - 127), from amax's fp32 bits. amax =
    1.f * 2**(E - 127) fits QMAX = (1 + t / 2**23) * 2**(p - 1) at e = E + 1 - p when
    f's bits <= t, else at one more."""
    p, t = scale_rule_bits(dtype)
    bits = amax.float().contiguous().view(torch.int32)
    biased = bits >> 23  # amax >= 0: no sign bit
    e = biased + (1 - p) + ((bits & 0x7FFFFF) > t).to(torch.int32)
    e = torch.where(biased == 255, E_MAX, e)  # inf (or NaN): the largest scale
    return e.clamp_(E_MIN, E_MAX).to(torch.uint8)


def exponent_scale(e: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes (uint8, any shape) -> fp32 scales 2**(e - 127), exactly: e as fp32's
    exponent field (e >= 1, so never subnormal)."""
    return (e.to(torch.int32) << 23).view(torch.float32)


def quantize(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x [..., D] (any float) -> packed [..., D + 1] of `dtype`: codes, then the E8M0 byte."""
    assert is_quantized_dtype(dtype), f"{dtype} is not a quantized KV dtype"
    xf = x.float()
    e = scale_exponent(xf.abs().amax(dim=-1, keepdim=True), dtype)
    y = xf / exponent_scale(e)  # exact: a power of two
    if dtype == torch.int8:
        codes = torch.round(y).clamp_(-127, 127).to(torch.int8)
    else:
        codes = y.clamp_(-qmax(dtype), qmax(dtype)).to(dtype)
    out = torch.empty((*x.shape[:-1], x.shape[-1] + SCALE_BYTES), dtype=dtype, device=x.device)
    out[..., : x.shape[-1]] = codes
    out[..., x.shape[-1] :].view(torch.uint8).copy_(e)
    return out


def dequantize(packed: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """packed [..., D + 1] -> [..., D] of `dtype` (code * 2**(e - 127), computed in fp32)."""
    d = packed.shape[-1] - SCALE_BYTES
    scale = exponent_scale(packed[..., d:].view(torch.uint8))
    if dtype == torch.float32:  # one pass over the big tensor: cast, then scale in place
        return packed[..., :d].float().mul_(scale)
    return (packed[..., :d].float() * scale).to(dtype)


def to_compute(cache_part: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Gathered cache rows in the attention's dtype: dequantized, or cast (a bf16 cache)."""
    if is_quantized(cache_part):
        return dequantize(cache_part, dtype)
    return cache_part.to(dtype)


__all__ = [
    "KV_CACHE_DTYPES",
    "E8M0_BIAS",
    "E_MAX",
    "E_MIN",
    "SCALE_BYTES",
    "cache_head_dim",
    "cache_torch_dtype",
    "dequantize",
    "exponent_scale",
    "fp8_dtype",
    "is_quantized",
    "is_quantized_dtype",
    "quantize",
    "qmax",
    "row_bytes",
    "row_width",
    "scale_exponent",
    "scale_rule_bits",
    "to_compute",
]
