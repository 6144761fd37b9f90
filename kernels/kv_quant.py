"""Quantized KV cache: int8 / fp8 rows with a scale per (token, KV head), packed in place.

`--kv-cache-dtype` names (vLLM's): "auto" (the model dtype), "bf16", "fp8"
(`torch.float8_e4m3fn`) and "int8". A quantized cache keeps the engine's one-tensor layout
`[..., block_size, num_kv_heads, head_dim + 2]`: each (token, head) row is `head_dim` codes
followed by its scale as 2 bytes of fp16, so every path that passes a cache tensor around
(the model, CUDA graphs, the draft proposer, the block manager) is unchanged and a block of
K is still one contiguous slab. `x ~= code * scale`, with `scale = absmax(row) / QMAX`
(127 for int8, 448 for e4m3) rounded to fp16 first, so quantizing with the stored scale and
dequantizing agree exactly.

Why per (token, head) and not per (block, head): the scale is written once with its token
(`reshape_and_cache`), never revised, so a block that fills over many steps needs no
re-quantization of the tokens already in it, and one outlier token cannot coarsen its
neighbours' codes. It costs 2 bytes per (token, head): one (token, head) of K is
`head_dim + 2` bytes against `4 * head_dim` in fp32, i.e. 4D / (D + 2) more tokens per byte:
3.88x fp32 (1.94x bf16) at head_dim 64, 3.94x at 128, 3.56x (1.78x bf16) at 16 (`tiny`).
A per-block scale would reach 4x / 2x, but needs a running absmax and a rewrite of the block
whenever a new token raises it.
"""

from __future__ import annotations

import torch

KV_CACHE_DTYPES = ("auto", "bf16", "fp8", "int8")
SCALE_BYTES = 2  # fp16 scale per (token, head), after the codes
_SCALE_DTYPE = torch.float16
_FP16_MAX = 65504.0
_FP16_TINY = 2.0**-24  # smallest positive fp16 (subnormal)


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


def quantize(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x [..., D] (any float) -> packed [..., D + 2] of `dtype`: codes, then the fp16 scale."""
    assert is_quantized_dtype(dtype), f"{dtype} is not a quantized KV dtype"
    assert x.shape[-1] % 2 == 0, "the fp16 scale needs an even head_dim (2-byte aligned)"
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True)
    scale = (amax / qmax(dtype)).clamp(_FP16_TINY, _FP16_MAX).to(_SCALE_DTYPE)
    y = xf / scale.float()
    if dtype == torch.int8:
        codes = torch.round(y).clamp_(-127, 127).to(torch.int8)
    else:
        codes = y.clamp_(-qmax(dtype), qmax(dtype)).to(dtype)
    out = torch.empty((*x.shape[:-1], x.shape[-1] + SCALE_BYTES), dtype=dtype, device=x.device)
    out[..., : x.shape[-1]] = codes
    out[..., x.shape[-1] :].view(_SCALE_DTYPE).copy_(scale)
    return out


def dequantize(packed: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """packed [..., D + 2] -> [..., D] of `dtype` (code * scale, computed in fp32)."""
    d = packed.shape[-1] - SCALE_BYTES
    scale = packed[..., d:].view(_SCALE_DTYPE).float()
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
    "SCALE_BYTES",
    "cache_head_dim",
    "cache_torch_dtype",
    "dequantize",
    "fp8_dtype",
    "is_quantized",
    "is_quantized_dtype",
    "quantize",
    "qmax",
    "row_bytes",
    "row_width",
    "to_compute",
]
