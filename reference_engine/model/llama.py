"""A Llama-family decoder (Llama 2/3, Mistral, Qwen2) over a flattened varlen batch.

All sequences of a step run as ONE forward over `T` tokens (vLLM v1 style): the token ids and
positions of every scheduled chunk are concatenated, K/V go into the paged cache through the
slot mapping, and attention reads each sequence's context back through its block table.

Q/K/V and gate/up projections are fused (one matmul each); `hf_weight_slices` maps each HF
checkpoint tensor name onto its rows of a fused parameter, for the loader and for saving.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from cbbench.kernels import AttentionBackend, cpu_bf16_dot, cpu_ops
from cbbench.reference_engine.model import cpu_fused
from cbbench.reference_engine.model.config import ModelConfig
from cbbench.reference_engine.model.rope import RotaryEmbedding
from torch import nn


@dataclass
class AttentionMetadata:
    """One step's batch layout; tensors live on the model's device."""

    slot_mapping: torch.Tensor  # [T] int64: cache slot of each token's K/V
    block_tables: torch.Tensor  # [B, max_blocks] int32
    seq_lens: torch.Tensor  # [B] int32: context length after this step
    query_start_loc: torch.Tensor  # [B + 1] int32: cumsum of query lengths
    decode_only: bool  # every sequence has exactly one query token
    max_query_len: int  # host copies of the maxima: backends need not read tensors back
    max_seq_len: int


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        # on CPU through kernels/cpu_ops (fp32) or cpu_bf16_dot (bf16): the ModelRunner sets it
        self.cpu_kernel = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.cpu_kernel and x.device.type == "cpu":
            if x.dtype == torch.float32:
                return cpu_ops.rms_norm(x, self.weight, self.eps)
            if x.dtype == torch.bfloat16 and self.weight.dtype == torch.bfloat16:
                return cpu_bf16_dot.rms_norm(x, self.weight, self.eps)  # the formula below
        if x.dtype == torch.float32:  # one fused op, bitwise equal to the formula below
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        dtype = x.dtype  # HF's rounding for half types: normalise in fp32, round, then scale
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dtype)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        assert cfg.head_dim is not None
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim**-0.5
        self.qkv_proj = nn.Linear(
            cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.attention_bias
        )
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)
        self.cpu_kernel = False  # fp32 / bf16 on CPU: rope + cache write in one C++ call

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        t = x.shape[0]
        qkv = self.qkv_proj(x)
        k_cache, v_cache = kv_cache[0], kv_cache[1]
        fused = self.cpu_kernel and qkv.device.type == "cpu" and qkv.dtype == k_cache.dtype
        if fused and qkv.dtype in (torch.float32, torch.bfloat16):
            rope_and_cache = (cpu_ops if qkv.dtype == torch.float32 else cpu_bf16_dot).rope_and_cache
            q = rope_and_cache(
                qkv, cos, sin, k_cache, v_cache, meta.slot_mapping,
                self.num_heads, self.num_kv_heads, self.head_dim,
            )  # fmt: skip
        else:
            # q and k are adjacent columns: rotate them in one go
            qk = qkv[:, : self.q_size + self.kv_size].view(t, -1, self.head_dim)
            q, k = RotaryEmbedding.apply(qk, cos, sin).split([self.num_heads, self.num_kv_heads], 1)
            q, k = q.contiguous(), k.contiguous()
            v = qkv[:, self.q_size + self.kv_size :].reshape(t, self.num_kv_heads, self.head_dim)
            backend.reshape_and_cache(k, v, k_cache, v_cache, meta.slot_mapping)
        if meta.decode_only:
            o = backend.paged_decode_attention(
                q,
                k_cache,
                v_cache,
                meta.block_tables,
                meta.seq_lens,
                self.scale,
                max_seq_len=meta.max_seq_len,
            )
        else:
            o = backend.paged_attention(
                q,
                k_cache,
                v_cache,
                meta.block_tables,
                meta.seq_lens,
                meta.query_start_loc,
                self.scale,
                max_query_len=meta.max_query_len,
                max_seq_len=meta.max_seq_len,
            )
        return self.o_proj(o.reshape(t, self.q_size))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig, intermediate_size: int | None = None) -> None:
        super().__init__()
        inter = self.intermediate_size = intermediate_size or cfg.intermediate_size
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * inter, bias=False)
        self.down_proj = nn.Linear(inter, cfg.hidden_size, bias=False)
        self.cpu_kernel = False  # fp32 on CPU: silu * up in one C++ pass (the ModelRunner sets it)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if self.cpu_kernel and gate_up.device.type == "cpu" and gate_up.dtype == torch.float32:
            a = cpu_ops.silu_mul(gate_up, self.intermediate_size)
            return self.down_proj(a)
        gate, up = gate_up.split(self.intermediate_size, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(cfg)
        self.mlp = LlamaMLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # "float32" / "bfloat16": the whole layer through cpu_fused's direct kernel calls (set
        # by the ModelRunner where its kernels run every piece on the CPU)
        self.cpu_fused: str | None = None

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        if self.cpu_fused is not None and x.device.type == "cpu":
            fused = cpu_fused.fp32_layer if self.cpu_fused == "float32" else cpu_fused.bf16_layer
            return fused(self, x, cos, sin, kv_cache, meta, backend)
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv_cache, meta, backend)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """`forward` -> hidden states [T, hidden]; `compute_logits` on the rows that sample."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        assert cfg.head_dim is not None
        self.config = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary_emb: RotaryEmbedding | None = None  # built by init_rope on the final device

    def init_rope(self, device: str | torch.device) -> None:
        cfg = self.config
        assert cfg.head_dim is not None
        self.rotary_emb = RotaryEmbedding(
            cfg.head_dim, cfg.rope_theta, cfg.max_position_embeddings, cfg.rope_scaling, device
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        max_position: int,
        kv_caches: torch.Tensor,
        meta: AttentionMetadata,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        """input_ids, positions [T]; kv_caches [layers, 2, NB, BS, Hkv, D]."""
        assert self.rotary_emb is not None, "call init_rope(device) first"
        cos, sin = self.rotary_emb.cos_sin(positions, max_position)
        x = self.model.embed_tokens(input_ids)
        layers = self.model.layers
        if getattr(layers[0], "cpu_fused", None) is not None and x.device.type == "cpu":
            cos, sin = cos.float().contiguous(), sin.float().contiguous()  # once, not per layer
            x = cpu_fused.forward_layers(layers, x, cos, sin, kv_caches, meta, backend)
            return self.model.norm(x)
        for i, layer in enumerate(layers):
            x = layer(x, cos, sin, kv_caches[i], meta, backend)
        return self.model.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def hf_weight_slices(self) -> dict[str, tuple[torch.Tensor, int, int]]:
        """HF tensor name -> (parameter, first row, end row) it occupies."""
        cfg = self.config
        q, kv = self.model.layers[0].self_attn.q_size, self.model.layers[0].self_attn.kv_size
        out: dict[str, tuple[torch.Tensor, int, int]] = {}

        def whole(name: str, p: torch.Tensor) -> None:
            out[name] = (p, 0, p.shape[0])

        whole("model.embed_tokens.weight", self.model.embed_tokens.weight)
        whole("model.norm.weight", self.model.norm.weight)
        if not cfg.tie_word_embeddings:
            whole("lm_head.weight", self.lm_head.weight)
        for i, layer in enumerate(self.model.layers):
            pre = f"model.layers.{i}."
            attn = layer.self_attn
            kinds = ["weight", "bias"] if cfg.attention_bias else ["weight"]
            for kind in kinds:
                p = getattr(attn.qkv_proj, kind)
                out[pre + f"self_attn.q_proj.{kind}"] = (p, 0, q)
                out[pre + f"self_attn.k_proj.{kind}"] = (p, q, q + kv)
                out[pre + f"self_attn.v_proj.{kind}"] = (p, q + kv, q + 2 * kv)
            whole(pre + "self_attn.o_proj.weight", attn.o_proj.weight)
            out.update(self.mlp_weight_slices(pre, layer.mlp))
            whole(pre + "input_layernorm.weight", layer.input_layernorm.weight)
            whole(pre + "post_attention_layernorm.weight", layer.post_attention_layernorm.weight)
        return out

    def mlp_weight_slices(
        self, pre: str, mlp: nn.Module
    ) -> dict[str, tuple[torch.Tensor, int, int]]:
        """HF names of one layer's MLP (`pre` = "model.layers.{i}."); MoE models override."""
        return dense_mlp_slices(pre + "mlp.", mlp)


def dense_mlp_slices(pre: str, mlp: nn.Module) -> dict[str, tuple[torch.Tensor, int, int]]:
    """A gate/up/down MLP under `pre` ("model.layers.{i}.mlp.", or a shared expert's)."""
    assert isinstance(mlp, LlamaMLP)
    gate_up, inter = mlp.gate_up_proj.weight, mlp.intermediate_size
    return {
        pre + "gate_proj.weight": (gate_up, 0, inter),
        pre + "up_proj.weight": (gate_up, inter, 2 * inter),
        pre + "down_proj.weight": (mlp.down_proj.weight, 0, mlp.down_proj.weight.shape[0]),
    }
