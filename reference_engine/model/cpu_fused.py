"""One decoder layer of a CPU step with the C++ kernels called directly (fp32 or bf16).

The module path (LlamaDecoderLayer.forward) costs ~14 torch ops, 9 nn.Module calls and
a few dtype / layout checks a layer; on `small` (9 layers, 8 rows, one thread) that host work
was ~2.5 ms of a ~13 ms bf16 decode step. Here a layer is 8-9 calls into the kernel modules:
norm -> qkv -> rope + cache write -> attention -> o_proj + residual -> norm -> gate/up ->
silu * up -> down + residual, the residual adds fused into the projections (bf16: rounded
as torch's add of the rounded projection; fp32: the same add) and silu * up in one pass.
Equal to the module path: bitwise in fp32 (the same kernels: its LlamaMLP takes the C++
silu * up too); in bf16 too, up to silu's exp (an AVX-512 polynomial within ~1 ulp of
torch's, after which the value is rounded to bf16).

The ModelRunner turns it on (`LlamaDecoderLayer.cpu_fused`) where every piece runs here:
fp32 with the "panels" linears and cpu_ops, bf16 with "bf16-dp" and cpu_bf16_dot, a plain
(unquantized) KV cache, a dense MLP. Decode-only steps read the cache with the C++ paged
attention; prefill chunks go through the attention backend as before.
"""

from __future__ import annotations

import weakref
from typing import Any, NamedTuple

import torch
from cbbench.kernels import AttentionBackend, cpu_bf16_dot, cpu_gemm
from torch import nn

# llama.py imports this module: its LlamaDecoderLayer and AttentionMetadata are `nn.Module`
# and `Any` here (no import cycle)
LlamaDecoderLayer = nn.Module
AttentionMetadata = Any


class LayerPlan(NamedTuple):
    """What a fused layer reads from its modules, read once (nn.Module.__getattr__ costs ~1 us
    a lookup; a layer needs 19 of them)."""

    norm1: torch.Tensor
    eps1: float
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    qkv_out: int
    o: torch.Tensor
    o_out: int
    norm2: torch.Tensor
    eps2: float
    gate_up: torch.Tensor
    gate_up_out: int
    inter: int
    down: torch.Tensor
    down_out: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    q_size: int
    scale: float


def layer_plan(layer: LlamaDecoderLayer) -> LayerPlan:
    attn, mlp = layer.self_attn, layer.mlp
    n1, n2 = layer.input_layernorm, layer.post_attention_layernorm
    qkv, o, gu, down = attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj
    return LayerPlan(
        n1.weight, n1.eps, qkv.panels, qkv.bias, qkv.out_features, o.panels, o.out_features,
        n2.weight, n2.eps, gu.panels, gu.out_features, mlp.intermediate_size, down.panels,
        down.out_features, attn.num_heads, attn.num_kv_heads, attn.head_dim, attn.q_size,
        attn.scale,
    )  # fmt: skip


class _Stack:
    """The plans of a model's layers, and per-layer (K, V) views of the last KV cache seen."""

    __slots__ = ("mode", "plans", "kv_key", "kv")

    def __init__(self, layers: nn.ModuleList) -> None:
        self.mode = layers[0].cpu_fused
        self.plans = [layer_plan(layer) for layer in layers]
        self.kv_key: tuple | None = None
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] = []


_STACKS: weakref.WeakKeyDictionary[nn.ModuleList, _Stack] = weakref.WeakKeyDictionary()


def forget(layers: nn.ModuleList) -> None:
    """Drop the cached plans (after the layers' weights were replaced, e.g. moved to huge
    pages): the next `forward_layers` reads the modules again."""
    _STACKS.pop(layers, None)


def forward_layers(
    layers: nn.ModuleList,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    kv_caches: torch.Tensor,
    meta: AttentionMetadata,
    backend: AttentionBackend,
) -> torch.Tensor:
    """Every layer of the stack, one fused call each (`cpu_fused` set alike on all of them);
    the same calls, in the same order, as calling each layer."""
    st = _STACKS.get(layers)
    if st is None or st.mode != layers[0].cpu_fused:
        st = _STACKS[layers] = _Stack(layers)
    key = (kv_caches.data_ptr(), kv_caches.shape, kv_caches.stride())  # views keep it alive
    if st.kv_key != key:
        st.kv = [(c[0], c[1]) for c in kv_caches.unbind(0)]
        st.kv_key = key
    decode = meta.decode_only and getattr(backend, "paged_kernel", False)
    if st.mode == "float32":
        ops = cpu_gemm.load()
        assert ops is not None
        for plan, (k, v) in zip(st.plans, st.kv, strict=True):
            x = _fp32(ops, plan, x, cos, sin, k, v, meta, backend, decode)
    else:
        dot = cpu_bf16_dot.load()
        ops = cpu_gemm.load()
        assert dot is not None and ops is not None
        for plan, (k, v) in zip(st.plans, st.kv, strict=True):
            x = _bf16(dot, ops, plan, x, cos, sin, k, v, meta, backend, decode)
    return x


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
    decode = meta.decode_only and getattr(backend, "paged_kernel", False)
    plan = layer_plan(layer)
    return _bf16(dot, ops, plan, x, cos, sin, kv_cache[0], kv_cache[1], meta, backend, decode)


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
    decode = meta.decode_only and getattr(backend, "paged_kernel", False)
    plan = layer_plan(layer)
    return _fp32(ops, plan, x, cos, sin, kv_cache[0], kv_cache[1], meta, backend, decode)


def _bf16(dot, ops, p: LayerPlan, x, cos, sin, k_cache, v_cache, meta, backend, decode: bool):
    h = dot.rms_norm_bf16(x, p.norm1, p.eps1)
    qkv = dot.linear_bf16dp(h, p.qkv, p.qkv_bias, p.qkv_out)
    args = (meta.slot_mapping, p.num_heads, p.num_kv_heads, p.head_dim)
    if decode:  # the C++ paged kernel wants an fp32 query
        q = dot.rope_and_cache_bf16(qkv, cos, sin, k_cache, v_cache, *args, True)
        o = ops.paged_decode_attention(q, k_cache, v_cache, meta.block_tables, meta.seq_lens, p.scale)
        # fp32; the projection rounds it to bf16 as .to(bf16) would
    else:
        q = dot.rope_and_cache_bf16(qkv, cos, sin, k_cache, v_cache, *args, False)
        o = _attention(p.scale, q, k_cache, v_cache, meta, backend)
    x = dot.linear_bf16dp(o.view(x.shape[0], p.q_size), p.o, None, p.o_out, x)
    h = dot.rms_norm_bf16(x, p.norm2, p.eps2)
    a = dot.silu_mul_bf16(dot.linear_bf16dp(h, p.gate_up, None, p.gate_up_out))
    return dot.linear_bf16dp(a, p.down, None, p.down_out, x)


def _fp32(ops, p: LayerPlan, x, cos, sin, k_cache, v_cache, meta, backend, decode: bool):
    h = ops.rms_norm(x, p.norm1, p.eps1)
    qkv = ops.linear(h, p.qkv, p.qkv_bias, p.qkv_out)
    q = ops.rope_and_cache(
        qkv, cos, sin, k_cache, v_cache, meta.slot_mapping, p.num_heads, p.num_kv_heads, p.head_dim
    )
    if decode:
        o = ops.paged_decode_attention(q, k_cache, v_cache, meta.block_tables, meta.seq_lens, p.scale)
    else:
        o = _attention(p.scale, q, k_cache, v_cache, meta, backend)
    x = ops.linear(o.view(x.shape[0], p.q_size), p.o, None, p.o_out, x)  # + the residual
    h = ops.rms_norm(x, p.norm2, p.eps2)
    a = ops.silu_mul(ops.linear(h, p.gate_up, None, p.gate_up_out), p.inter)
    return ops.linear(a, p.down, None, p.down_out, x)


def _attention(scale: float, q, k_cache, v_cache, meta: AttentionMetadata, backend: AttentionBackend):
    """The backend's attention for a step with prefill chunks (or without the C++ kernel)."""
    if meta.decode_only:
        return backend.paged_decode_attention(
            q, k_cache, v_cache, meta.block_tables, meta.seq_lens, scale,
            max_seq_len=meta.max_seq_len,
        )  # fmt: skip
    return backend.paged_attention(
        q, k_cache, v_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc, scale,
        max_query_len=meta.max_query_len, max_seq_len=meta.max_seq_len,
    )  # fmt: skip
