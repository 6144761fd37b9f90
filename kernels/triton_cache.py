"""reshape_and_cache in Triton: scatter new K/V rows into their paged-cache slots.

int8 caches (kernels/kv_quant.py): each (token, head) row is quantized on the write, as
kv_quant.quantize does it (its E8M0 byte e from absmax's fp32 exponent and mantissa bits,
scale = 2**(e - 127), codes = round-half-even(x / scale), exact division by a power of two),
so both backends write the same bytes.

Importing this module imports triton; `triton_backend` does so lazily.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from cbbench.kernels import kv_quant


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cb,
    stride_cs,
    stride_ch,
    block_size,
    num_kv_heads,
    head_dim,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    QUANT: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot >= 0:  # slot < 0: padding, nothing to write
        block = slot // block_size
        offset = slot % block_size
        heads = tl.arange(0, BLOCK_H)
        h = heads[:, None]
        d = tl.arange(0, BLOCK_D)[None, :]
        mask = (h < num_kv_heads) & (d < head_dim)
        k = tl.load(key_ptr + token * stride_kt + h * stride_kh + d, mask=mask, other=0.0)
        v = tl.load(value_ptr + token * stride_vt + h * stride_vh + d, mask=mask, other=0.0)
        dst = block * stride_cb + offset * stride_cs + h * stride_ch + d
        if QUANT:
            row = block * stride_cb + offset * stride_cs + heads * stride_ch
            _store_quantized(k_cache_ptr, dst, row, k, mask, heads < num_kv_heads, head_dim)
            _store_quantized(v_cache_ptr, dst, row, v, mask, heads < num_kv_heads, head_dim)
        else:
            tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
            tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _store_quantized(cache_ptr, dst, row, x, mask, h_mask, head_dim):
    """x [BLOCK_H, BLOCK_D] -> int8 codes at `dst`, each head's E8M0 byte after its codes:
    the smallest e in [1, 254] with absmax <= 127 * 2**(e - 127) (kv_quant.scale_exponent)."""
    x = x.to(tl.float32)
    amax = tl.max(tl.abs(x), 1)
    bits = amax.to(tl.int32, bitcast=True)
    biased = bits >> 23  # amax >= 0: no sign bit
    e = biased - 6 + ((bits & 0x7FFFFF) > 8257536).to(tl.int32)  # 127 = 1.984375 * 2**6
    e = tl.where(biased == 255, 254, e)  # inf: the largest scale
    e = tl.minimum(tl.maximum(e, 1), 254)
    scale = (e << 23).to(tl.float32, bitcast=True)  # 2**(e - 127), exactly
    y = tl.math.div_rn(x, scale[:, None])  # exact: a power of two
    r = tl.floor(y + 0.5)  # round half to even, as torch.round
    tie_odd = ((r - y) == 0.5) & ((r - 2.0 * tl.floor(r * 0.5)) != 0.0)
    r = tl.minimum(tl.maximum(tl.where(tie_odd, r - 1.0, r), -127.0), 127.0)
    tl.store(cache_ptr + dst, r.to(tl.int8), mask=mask)
    tl.store((cache_ptr + row + head_dim).to(tl.pointer_type(tl.uint8)), e.to(tl.uint8),
             mask=h_mask)  # fmt: skip


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """key/value [T, Hkv, D] into k_cache/v_cache [NB, BS, Hkv, D] at slot_mapping [T]."""
    num_tokens, num_kv_heads, head_dim = key.shape
    assert value.shape == key.shape and slot_mapping.shape == (num_tokens,)
    assert k_cache.shape == v_cache.shape and k_cache.stride() == v_cache.stride()
    assert k_cache.shape[2:] == (num_kv_heads, kv_quant.row_width(head_dim, k_cache.dtype))
    assert k_cache.dtype != kv_quant.fp8_dtype(), "fp8 caches: the torch backend only"
    assert kv_quant.SCALE_BYTES == 1 and kv_quant.scale_rule_bits(torch.int8) == (7, 8257536)
    assert key.stride(-1) == 1 and value.stride(-1) == 1 and k_cache.stride(-1) == 1
    if num_tokens == 0:
        return
    _reshape_and_cache_kernel[(num_tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        k_cache.shape[1],
        num_kv_heads,
        head_dim,
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
        QUANT=k_cache.dtype == torch.int8,
    )
