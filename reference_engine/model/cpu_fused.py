"""One decoder layer of a CPU step with the C++ kernels called directly (fp32 or bf16).

The module path (LlamaDecoderLayer.forward) costs ~14 torch ops, 9 nn.Module calls and
a few dtype / layout checks a layer; on `small` (9 layers, 8 rows, one thread) that host work
was ~2.5 ms of a ~13 ms bf16 decode step. Here a layer is 8-9 calls into the kernel modules:
norm -> qkv -> rope + cache write -> attention -> o_proj + residual -> norm -> gate/up ->
silu * up -> down + residual, the residual adds fused into the projections (bf16: rounded
as torch's add of the rounded projection; fp32: the same add) and, in bf16, silu * up in
one pass. Equal to the module path: bitwise in fp32 (the same kernels and torch ops); in
bf16 too, up to silu's exp (an AVX-512 polynomial within ~1 ulp of torch's, after which
the value is rounded to bf16).

The ModelRunner turns it on (`LlamaDecoderLayer.cpu_fused`) where every piece runs here:
fp32 with the "panels" linears and cpu_ops, bf16 with "bf16-dp" and cpu_bf16_dot, a plain
(unquantized) KV cache, a dense MLP. Decode-only steps read the cache with the C++ paged
attention; prefill chunks go through the attention backend as before.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from cbbench.kernels import AttentionBackend, cpu_bf16_dot, cpu_gemm
from torch import nn

# llama.py imports this module: its LlamaDecoderLayer and AttentionMetadata are `nn.Module`
# and `Any` here (no import cycle)
LlamaDecoderLayer = nn.Module
AttentionMetadata = Any


def bf16_layer(
    layer: LlamaDecoderLayer,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: AttentionMetadata,
    backend: AttentionBackend,
) -> torch.Tensor:
    """x [T, H] bf16 -> the layer's output; cos/sin fp32 contiguous [T, D/2]."""
    dot, ops = cpu_bf16_dot.load(), cpu_gemm.load()
    assert dot is not None and ops is not None
    attn, mlp = layer.self_attn, layer.mlp
    norm1, norm2 = layer.input_layernorm, layer.post_attention_layernorm
    qkv_proj, o_proj = attn.qkv_proj, attn.o_proj
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    h = dot.rms_norm_bf16(x, norm1.weight, norm1.eps)
    qkv = dot.linear_bf16dp(h, qkv_proj.panels, qkv_proj.bias, qkv_proj.out_features)
    args = (meta.slot_mapping, attn.num_heads, attn.num_kv_heads, attn.head_dim)
    if meta.decode_only and getattr(backend, "paged_kernel", False):  # fp32 query wanted
        q = dot.rope_and_cache_bf16(qkv, cos, sin, k_cache, v_cache, *args, True)
        o = ops.paged_decode_attention(
            q, k_cache, v_cache, meta.block_tables, meta.seq_lens, attn.scale
        )  # fp32; the projection rounds it to bf16 as .to(bf16) would
    else:
        q = dot.rope_and_cache_bf16(qkv, cos, sin, k_cache, v_cache, *args, False)
        o = _attention(attn, q, k_cache, v_cache, meta, backend)
    x = dot.linear_bf16dp(o.view(x.shape[0], attn.q_size), o_proj.panels, None, o_proj.out_features, x)
    h = dot.rms_norm_bf16(x, norm2.weight, norm2.eps)
    gate_up, down = mlp.gate_up_proj, mlp.down_proj
    a = dot.silu_mul_bf16(dot.linear_bf16dp(h, gate_up.panels, None, gate_up.out_features))
    return dot.linear_bf16dp(a, down.panels, None, down.out_features, x)


def fp32_layer(
    layer: LlamaDecoderLayer,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: AttentionMetadata,
    backend: AttentionBackend,
) -> torch.Tensor:
    """x [T, H] fp32 -> the layer's output; cos/sin fp32 contiguous [T, D/2]."""
    ops = cpu_gemm.load()
    assert ops is not None
    attn, mlp = layer.self_attn, layer.mlp
    norm1, norm2 = layer.input_layernorm, layer.post_attention_layernorm
    qkv_proj, o_proj = attn.qkv_proj, attn.o_proj
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    h = ops.rms_norm(x, norm1.weight, norm1.eps)
    qkv = ops.linear(h, qkv_proj.panels, qkv_proj.bias, qkv_proj.out_features)
    q = ops.rope_and_cache(
        qkv, cos, sin, k_cache, v_cache, meta.slot_mapping,
        attn.num_heads, attn.num_kv_heads, attn.head_dim,
    )  # fmt: skip
    if meta.decode_only and getattr(backend, "paged_kernel", False):
        o = ops.paged_decode_attention(
            q, k_cache, v_cache, meta.block_tables, meta.seq_lens, attn.scale
        )
    else:
        o = _attention(attn, q, k_cache, v_cache, meta, backend)
    x = ops.linear(o.view(x.shape[0], attn.q_size), o_proj.panels, None, o_proj.out_features).add_(x)
    h = ops.rms_norm(x, norm2.weight, norm2.eps)
    gate, up = ops.linear(h, mlp.gate_up_proj.panels, None, mlp.gate_up_proj.out_features).split(
        mlp.intermediate_size, dim=-1
    )
    a = F.silu(gate).mul_(up)
    return ops.linear(a, mlp.down_proj.panels, None, mlp.down_proj.out_features).add_(x)


def _attention(attn, q, k_cache, v_cache, meta: AttentionMetadata, backend: AttentionBackend):
    """The backend's attention for a step with prefill chunks (or without the C++ kernel)."""
    if meta.decode_only:
        return backend.paged_decode_attention(
            q, k_cache, v_cache, meta.block_tables, meta.seq_lens, attn.scale,
            max_seq_len=meta.max_seq_len,
        )  # fmt: skip
    return backend.paged_attention(
        q, k_cache, v_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc, attn.scale,
        max_query_len=meta.max_query_len, max_seq_len=meta.max_seq_len,
    )  # fmt: skip
